"""Advisory locks (`fcntl.flock` on `PATH.lock`) so two runs never write one output or conversion.

A lock is not re-entrant: a job claims its output once (rmjax.runs.jobs), so taking a lock this process
already holds is a conflict like any other (LockedError, at once: waiting for ourselves would never end).
The lock file records who holds it, and is removed when released; a waiter that wins the lock on a file
that was removed meanwhile retries on the new one, so two processes never both believe they hold it.

A lock file is never followed: `PATH` is resolved (a symlinked output and its target share one lock, beside
the real file), but `PATH.lock` itself is opened with O_NOFOLLOW, and anything there that is not a plain
file with one name (a symlink, a directory, a FIFO, a hard link to another file) is refused in one line.
Otherwise a planted link would make the job truncate, overwrite and then delete the file it points to.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from rmjax.errors import LockedError

_mine: set[Path] = set()  # the locks this process holds (only to refuse taking one twice)
_OPEN_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # NONBLOCK: a FIFO never hangs


class _Busy(Exception):
    """Another process holds the lock (its holder, as the lock file says)."""


def lock_path(path: str | Path) -> Path:
    """`PATH.lock` beside the real `path` (its symlinks resolved); the lock file's own name is never resolved."""
    real = Path(os.path.realpath(path))
    return real.with_name(real.name + ".lock")


def _unsafe(lock: Path, what: str) -> LockedError:
    return LockedError(f"{lock} {what}, not a lock file rmjax made: rmjax never writes through it (that would "
                       f"change or delete another file); remove it (`rm {lock}`) and run again.")


def _refuse_unless_plain(lock: Path, st: os.stat_result) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise _unsafe(lock, "is not a regular file")
    if st.st_nlink > 1:
        raise _unsafe(lock, f"is a hard link ({st.st_nlink} names for one file)")


def _open(lock: Path) -> int:
    """A descriptor of the lock file, created if absent, never through a link."""
    try:
        fd = os.open(lock, _OPEN_FLAGS, 0o644)
    except OSError as error:
        if os.path.islink(lock):  # O_NOFOLLOW's ELOOP
            raise _unsafe(lock, f"is a symbolic link (to {os.readlink(lock)})") from None
        if error.errno in (errno.EISDIR, errno.ENXIO, errno.ELOOP):  # a directory, a socket, a looping parent
            raise _unsafe(lock, "is not a regular file") from None
        raise
    try:
        _refuse_unless_plain(lock, os.fstat(fd))
    except LockedError:
        os.close(fd)
        raise
    return fd


def _refuse_unless_lock(lock: Path, fd: int) -> None:
    """A file already at the lock's name is taken over (truncated, then removed on release) only when it is empty or
    an rmjax lock record (a killed run's): anything else is a file of someone's, e.g. `Gemfile.lock` beside the
    target of a link planted at an output's or companion's name."""
    head = os.pread(fd, 4097, 0)
    if not head:
        return
    try:
        info = json.loads(head.decode())
    except (ValueError, UnicodeDecodeError):
        info = None
    if not (isinstance(info, dict) and set(info) == {"pid", "host", "since"}):
        raise LockedError(f"{lock} is a file rmjax did not make (not a lock record): rmjax would truncate and then "
                          "delete it. Move it away if it is not needed, or choose another output.")


def _holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        return ""
    if not isinstance(info, dict) or not info:
        return ""
    return f" (pid {info.get('pid')} on {info.get('host')} since {info.get('since')})"


def _same_file(fd: int, lock: Path) -> bool:
    """Whether the name `lock` (not what it may point to: lstat) is still the file open as `fd`."""
    try:
        named = os.lstat(lock)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def _acquire(lock: Path, wait: bool) -> int:
    while True:
        fd = _open(lock)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise _Busy(holder) from None
        if not _same_file(fd, lock):
            os.close(fd)  # the holder removed the file as we got it (or it was swapped): lock the new one
            continue
        try:
            _refuse_unless_plain(lock, os.fstat(fd))  # a hard link added while we waited
            _refuse_unless_lock(lock, fd)
        except LockedError:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        info = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%H:%M:%S")}
        os.pwrite(fd, json.dumps(info).encode(), 0)
        return fd


@contextlib.contextmanager
def hold(path: str | Path, wait: bool = False, what: str | None = None) -> Iterator[Path]:
    """Hold the lock of `path` (`path.lock`). wait=False: LockedError when another process holds it;
    wait=True: block until it is free (saying so once on stderr)."""
    lock = lock_path(path)
    what = what or str(path)
    if lock in _mine:
        raise LockedError(f"this process already holds {lock} on {what}; an output is claimed once.")
    lock.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = _acquire(lock, False)
    except _Busy as busy:
        if not wait:
            raise LockedError(f"another run holds {lock}{busy} on {what}; wait for it to finish or choose "
                              "another output.") from None
        print(f"waiting: another process holds {lock}{busy} ({what})", file=sys.stderr, flush=True)
        fd = _acquire(lock, True)
    _mine.add(lock)
    try:
        yield lock
    finally:
        _mine.discard(lock)
        try:
            if _same_file(fd, lock):  # never another file swapped in under the name (unlink would not follow it)
                os.unlink(lock)  # before closing: a waiter that gets the old file sees it is gone and retries
        finally:
            os.close(fd)
