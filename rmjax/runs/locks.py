"""Advisory locks (`fcntl.flock` on `PATH.lock`) so two runs never write one output or conversion.

A lock is not re-entrant: a job claims its output once (rmjax.runs.jobs), so taking a lock this process
already holds is a conflict like any other (LockedError, at once: waiting for ourselves would never end).
The lock file records who holds it, and is removed when released; a waiter that wins the lock on a file
that was removed meanwhile retries on the new one, so two processes never both believe they hold it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from rmjax.errors import LockedError

_mine: set[Path] = set()  # the locks this process holds (only to refuse taking one twice)


def lock_path(path: str | Path) -> Path:
    path = Path(path)
    return path.with_name(path.name + ".lock")


def _holder(lock: Path) -> str:
    try:
        info = json.loads(lock.read_text() or "{}")
    except (OSError, ValueError):
        return ""
    if not info:
        return ""
    return f" (pid {info.get('pid')} on {info.get('host')} since {info.get('since')})"


def _acquire(lock: Path, wait: bool, what: str) -> object:
    while True:
        f = open(lock, "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            f.close()
            if not wait:
                raise LockedError(
                    f"another run holds {lock}{_holder(lock)} on {what}; wait for it to finish or choose "
                    "another output."
                ) from None
            continue
        try:
            same = os.fstat(f.fileno()).st_ino == os.stat(lock).st_ino
        except FileNotFoundError:
            same = False
        if same:
            f.seek(0)
            f.truncate()
            json.dump({"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%H:%M:%S")}, f)
            f.flush()
            return f
        f.close()  # the holder removed the file as we got it: lock the new one


@contextlib.contextmanager
def hold(path: str | Path, wait: bool = False, what: str | None = None) -> Iterator[Path]:
    """Hold the lock of `path` (`path.lock`). wait=False: LockedError when another process holds it;
    wait=True: block until it is free (saying so once on stderr)."""
    lock = lock_path(path).resolve()
    what = what or str(path)
    if lock in _mine:
        raise LockedError(f"this process already holds {lock} on {what}; an output is claimed once.")
    lock.parent.mkdir(parents=True, exist_ok=True)
    if wait:
        try:
            f = _acquire(lock, False, what)
        except LockedError:
            print(f"waiting: another process holds {lock}{_holder(lock)} ({what})", file=sys.stderr, flush=True)
            f = _acquire(lock, True, what)
    else:
        f = _acquire(lock, False, what)
    _mine.add(lock)
    try:
        yield lock
    finally:
        _mine.discard(lock)
        with contextlib.suppress(FileNotFoundError):
            lock.unlink()  # before closing: a waiter that gets the old file sees it is gone and retries
        f.close()
