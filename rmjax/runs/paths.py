"""Output paths checked before any work: a name the file system takes, a folder that can be written, and where a
link on the way makes two names one output (rmjax.runs.claims)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from rmjax.errors import UsageError


def refuse_empty_out(out: str | Path | None) -> None:
    """An empty --out names the working folder (`audit --out=` began writing its files there; `analyze --out=` wrote
    23 tables there), and one of spaces a folder named so."""
    if out is not None and not str(out).strip():
        raise UsageError("--out is empty; give the file or folder to write.")


def named(flag: str, path: str | Path) -> str:
    """How a message names an output: `--out=PATH`, or where `flag` is itself `--out=DIR` (a file a folder job
    writes in the folder it was given: inspect's reward_lens.csv) `DIR/name (in --out=DIR)`, never a flag value
    nobody typed."""
    return f"{path} (in {flag})" if "=" in flag else f"{flag}={path}"


def flag_name(flag: str) -> str:
    """The flag alone (`--out`), of a `flag` that may name its value too (`named`)."""
    return flag.split("=", 1)[0]


def refuse_folder_name(out: str | Path, flag: str = "--out") -> None:
    """A file output given with a trailing separator (`--out=dir/`): Path() drops it but open() does not, so the
    run wrote a file `dir` and its .meta.json, then failed reading it back as `dir/` (a traceback)."""
    if str(out).endswith(("/", os.sep)):
        name = str(out).rstrip("/" + os.sep) or "."
        raise UsageError(f"{flag}={out} ends in a separator, as a folder does, and this output is a file; give a "
                         f"file path such as {flag}={name}/result.csv or {flag}={name}.")


def check_writable(path: str | Path, flag: str = "--out", folder: bool = False) -> Path:
    """Fail now, not after the work, when `path` cannot be written."""
    path = Path(path)
    if path.name.endswith(".lock"):  # X.lock is the lock of output X: a result there was taken for a foreign file
        raise UsageError(f"{named(flag, path)}: rmjax names its lock files so (X.lock locks the output X), and a "
                         "result there would block X's runs; give a name not ending in .lock.")
    if not folder and path.is_dir():
        fix = "move it away" if "=" in flag else f"give a file path such as {path / 'result'}"
        raise UsageError(f"{named(flag, path)} is a directory; {fix}.")
    if folder and path.exists() and not path.is_dir():
        raise UsageError(f"{named(flag, path)} is a file; give a folder.")
    parent = path if folder else path.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=parent, prefix=".rmjax-write-test-"):
            pass
    except OSError as error:
        raise UsageError(f"{named(flag, path)}: cannot write in {parent} ({error.strerror or error}).") from None
    if not folder:
        _check_name_length(path, parent, flag)
    return path


# What the names written beside a result add to its own at most: `.meta.json`, a companion's suffix
# (`.completions.csv`), and a temp file's dot, process id and `.tmp` (atomic.replacing).
_DERIVED_NAME_CHARS = 48


def _check_name_length(path: Path, parent: Path, flag: str) -> None:
    """A name the file system takes, whose record and temp files beside it it would refuse after the work."""
    try:
        limit = os.pathconf(parent, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    longest = len(os.fsencode(path.name)) + _DERIVED_NAME_CHARS
    if longest > limit:
        raise UsageError(f"{named(flag, path)}: its name is {len(os.fsencode(path.name))} bytes, and the files written "
                         f"beside it (its .meta.json, temp files) would pass this file system's limit of {limit} "
                         f"bytes a name; give a name of at most {limit - _DERIVED_NAME_CHARS} bytes.")


def companion_path(path: str | Path) -> Path:
    """A companion's path (a figure, a steps CSV beside the result) with its folder's links resolved but not its
    own name's: a link planted at a companion's name is a file no run wrote (refused, and --overwrite removes the
    link), never the file it points to, which is nothing of this run's."""
    path = Path(os.path.abspath(path))
    return Path(os.path.realpath(path.parent)) / path.name


def real_path(path: str | Path) -> Path:
    """`path` as given, or its target where a symlink is on the way: a symlink and its target are one output
    (one lock, one .meta.json), and writing replaces the target's content, not the link."""
    path = Path(path)
    real = Path(os.path.realpath(path))
    return real if real != Path(os.path.abspath(path)) else path
