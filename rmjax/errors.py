"""Errors that name the problem and the fix.

Every `RmjaxError` is a user error: the entry points print its message as one line and exit with
status 2. Anything else is an internal error and keeps its traceback.
"""

from __future__ import annotations

from pathlib import Path


class RmjaxError(Exception):
    """Base class of rmjax's user-facing errors."""


class UsageError(RmjaxError, ValueError):
    """A flag, prompt or argument value is outside what the job accepts."""


class MissingFileError(RmjaxError, FileNotFoundError):
    """An input file or folder the job needs does not exist."""


class InputFileError(RmjaxError):
    """An input file exists but cannot be read as what it should be (truncated, corrupt, wrong format)."""


class UnsupportedModelError(RmjaxError):
    """The checkpoint's architecture or a config option is outside what rmjax implements."""


class CheckpointError(RmjaxError):
    """A checkpoint folder or file is incomplete or inconsistent."""


class TokenizerMismatchError(RmjaxError):
    """The tokenizer does not fit the model's embedding table."""


class PromptTooLongError(RmjaxError):
    """A prompt does not fit in the model's context."""


class OutputExistsError(RmjaxError):
    """The output path holds a result of another run and --overwrite was not given."""


class ResumeMismatchError(RmjaxError):
    """Saved progress (a chunk store, a training workdir) belongs to a run with other inputs."""


class LockedError(RmjaxError):
    """Another process holds the lock on this output."""


class NonFiniteError(RmjaxError):
    """A score, reward, gradient or loss is NaN or infinite."""


def require_file(path: str | Path, what: str) -> Path:
    """`path` when it is a regular file (through links), else one line naming `what` (`--texts_file=x`): missing, a
    folder, or something else, such as the pipe of a shell's `<(…)`, which a job may read more than once (a second
    read of a pipe finds it empty; its first answer was "not found")."""
    path = Path(path)
    if path.is_file():
        return path
    if not path.exists():
        raise MissingFileError(f"{what} not found.")
    if path.is_dir():
        raise InputFileError(f"{what} is a folder; give the file itself.")
    raise InputFileError(f"{what} is not a regular file (a pipe, such as the shell's <(…), or a device), which the "
                         "job may read more than once; write it to a file and give that.")


def one_line(error: BaseException) -> str:
    """The message of `error` on one line (what the entry points print for a user error)."""
    return " ".join(str(error).split()) or type(error).__name__
