"""Files written whole or not at all, and files read without following what was planted at their name: the one way
rmjax writes a result, a record or a temp file, and reads a JSON state file (a FIFO or device there is never read).
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path


def fresh_file(path: Path) -> Path:
    """`path` created anew as an empty file of ours: whatever was planted at its name (a link to another file, which
    writing would follow; a FIFO) is removed first, never followed. For the temp files a job writes under names
    that can be foreseen (`.<name>.<pid>.tmp`, a chunk's `tmp-…`): a link there would make the job overwrite its
    target."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # the name itself (a link is removed, not followed); a folder there raises
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666))
    return path


def read_json(path: Path, most: int = 256 << 20):
    """The JSON value in `path` when it is a regular file (through links) of at most `most` bytes; None when it is
    absent, not JSON, or not such a file: a FIFO or a device there (`/dev/zero`) would block the read or fill
    memory, so it is never read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > most:
            return None
        try:
            return json.loads(f.read(most + 1).decode("utf-8"))
        except (OSError, ValueError, RecursionError):
            return None


@contextlib.contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A temp file beside `path` that replaces it when the block ends, and is removed when the block fails
    (a full disk leaves neither a partial result nor a stray .tmp). The temp file is made anew (`fresh_file`)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fresh_file(tmp)
        yield tmp
        tmp.replace(path)
    except BaseException as error:
        tmp.unlink(missing_ok=True)
        if isinstance(error, OSError) and error.filename in (None, str(tmp), tmp):
            error.filename = str(path)  # the one-line disk error names the output (not a temp file, not nothing)
        raise


def stale_temps(path: Path, before: float) -> list[Path]:
    """The temp files `replacing` leaves beside `path` when its process is killed (SIGKILL: no `except` runs):
    `.<name>.<pid>.tmp` of a process other than this one, last written before `before` (wall clock: the rerun's
    claim; a live writer's temp, where a shared filesystem's lock does not span hosts, is newer). The rerun, holding
    the output's lock, removes them once its result is written (a killed run's full-size temp CSV stayed beside the
    resumed result)."""
    mine = f".{path.name}.{os.getpid()}.tmp"
    found = []
    for tmp in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        pid = tmp.name[len(path.name) + 2:-len(".tmp")]
        if not (pid.isdigit() and pid.isascii() and tmp.name != mine and (tmp.is_file() or tmp.is_symlink())):
            continue
        with contextlib.suppress(FileNotFoundError):
            if tmp.lstat().st_mtime < before:
                found.append(tmp)
    return sorted(found)


def atomic_write_text(path: str | Path, text: str) -> Path:
    path = Path(path)
    with replacing(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return path


def save_figure(fig, path: str | Path, **savefig) -> Path:
    """A matplotlib figure written whole or not at all (a full disk leaves no cut image behind a good name)."""
    path = Path(path)
    with replacing(path) as tmp:
        fig.savefig(tmp, format=path.suffix.lstrip(".") or "png", **savefig)
    return path
