"""How every entry point starts and ends: flags parsed strictly, user errors as one line.

A bad flag value, an unexpected positional argument or any rmjax user error (`RmjaxError`) prints
one line `error: …` on stderr and exits with status 2, before any traceback; internal errors keep
their traceback (status 1).
"""

from __future__ import annotations

import errno
import signal
import sys
from collections.abc import Callable

from absl import app, flags

from rmjax.errors import RmjaxError, one_line


def flag_error(argv: list[str]) -> str | None:
    """Why a job would refuse this command line before it starts (None: it would not); `argv[0]` is the program."""
    for word in argv[1:]:  # a byte that is not UTF-8 reaches Python as a lone surrogate: a tokenizer TypeError later
        try:
            word.encode("utf-8")
        except UnicodeEncodeError as bad:
            raw = word.encode("utf-8", "surrogateescape")
            shown = raw.decode("utf-8", "backslashreplace")
            return (f"{shown[:60]}: {word[bad.start:].encode('utf-8', 'surrogateescape')[:1]!r} is not UTF-8 text; "
                    "give it in UTF-8 (a terminal or script in another encoding, e.g. Latin-1, passes other bytes)")
    try:
        rest = flags.FLAGS(argv)
    except flags.Error as error:
        return one_line(error)
    if len(rest) > 1:
        return f"unexpected argument {rest[1]!r}; every setting is a --flag"
    return None


def _parse_flags(argv: list[str]) -> list[str]:
    error = flag_error(argv)
    if error:
        print(f"error: {error} (see --help)", file=sys.stderr)
        sys.exit(2)
    return [argv[0]]


_DISK_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG}
_ACCESS_ERRORS = {errno.EACCES, errno.EPERM, errno.ELOOP}


def run(main: Callable[[list[str]], None]) -> None:
    """absl's app.run with one-line user errors (status 2) and tracebacks kept for internal errors."""

    def guarded(argv):
        try:
            return main(argv)
        except (RmjaxError, app.UsageError) as error:
            print(f"error: {one_line(error)}", file=sys.stderr, flush=True)
            sys.exit(2)
        except KeyboardInterrupt:  # Ctrl-C: one line, not a traceback; saved progress is kept
            print("\ninterrupted: rerun the same command to continue (a job that saves progress resumes from it; "
                  "a result is reused only when its record proves it whole).", file=sys.stderr, flush=True)
            sys.exit(130)
        except OSError as error:  # the machine's, not the code's: a full or read-only disk, a quota
            if error.errno in _DISK_ERRORS:
                print(f"error: cannot write {error.filename or 'an output'}: {error.strerror}; free space or choose "
                      "another --out, then rerun the same command (finished chunks are kept).", file=sys.stderr,
                      flush=True)
                sys.exit(2)
            if error.errno in _ACCESS_ERRORS and error.filename:  # a file the run was given, as the user made it
                print(f"error: cannot read or write {error.filename}: {error.strerror}; fix its permissions (or "
                      "give another path), then rerun the same command.", file=sys.stderr, flush=True)
                sys.exit(2)
            if error.errno == errno.ENAMETOOLONG:  # a path flag's name past the file system's limit (255 bytes)
                named = str(error.filename or "a path")
                shown = named if len(named) <= 120 else f"{named[:60]}…{named[-40:]} ({len(named)} characters)"
                print(f"error: {shown}: {error.strerror}; give a shorter path (a file or folder name is at most 255 "
                      "bytes on most file systems).", file=sys.stderr, flush=True)
                sys.exit(2)
            raise

    from rmjax.parallel.distributed import quiet_absent_tpu  # (JAX: imported once a job runs, not to parse flags)

    quiet_absent_tpu()  # before JAX starts its backends
    from experiments import interrupted_while_starting

    if signal.getsignal(signal.SIGINT) is interrupted_while_starting:  # from here, `guarded` says what was kept
        signal.signal(signal.SIGINT, signal.default_int_handler)
    app.run(guarded, flags_parser=_parse_flags)


if __name__ == "__main__":
    from experiments import not_a_job

    not_a_job(__spec__.name)
