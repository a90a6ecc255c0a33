"""What a job wrote in a folder it owns (a chunk store, a training workdir, an export), told from everything else
there: the only files --overwrite and a finished run's clean-up delete (rmjax.runs.claims)."""

from __future__ import annotations

import contextlib
import fnmatch
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from rmjax.errors import OutputExistsError

# What a chunk store (rmjax.runs.chunks) holds that its job wrote: the chunks, their temp files, the manifest and
# its temp file (rmjax.runs.atomic.atomic_write_text). Anything else in the folder is not the job's to delete.
# Every folder a job writes declares its files so (fnmatch names; one ending in "/" a folder the job writes whole):
# rmjax.train.workdir.WORKDIR_FILES, rmjax.train.rm.EXPORT_FILES.
STORE_FILES = ("chunk-*.npy", "tmp-chunk-*.npy", "manifest.json", ".manifest.json.*.tmp", "interrupted.json",
               ".interrupted.json.*.tmp")


def _holds_any(entry: Path, others: Sequence[Path]) -> bool:
    """Whether `entry` is one of `others` or a folder above one."""
    return any(entry == other or entry in other.parents for other in others)


def _written(entry: Path, patterns: Sequence[str]) -> bool:
    """Whether `entry` is one of `patterns` (a file, or a folder for a pattern ending in "/"; never a link)."""
    if entry.is_symlink():
        return False
    return any(fnmatch.fnmatchcase(entry.name, pattern.rstrip("/"))
               and (entry.is_dir() if pattern.endswith("/") else entry.is_file()) for pattern in patterns)


def store_files(store: Path, patterns: Sequence[str] = STORE_FILES,
                beside: Sequence[str | Path] = ()) -> tuple[list[Path], list[Path]]:
    """(the entries of folder `store` its job wrote, by `patterns`; everything else in it), each sorted; both empty
    without the folder, and a file (or link) in the folder's place is foreign itself. `beside`: the run's other
    outputs, claimed on their own (an export inside a training workdir): an entry that is one, or holds one, is
    neither (left to its own claim)."""
    if not store.is_dir() or store.is_symlink():
        return [], ([store] if store.exists() or store.is_symlink() else [])
    others = [Path(os.path.realpath(p)) for p in beside]
    own, foreign = [], []
    for entry in sorted(store.iterdir()):
        if _holds_any(Path(os.path.realpath(entry)), others):
            continue
        (own if _written(entry, patterns) else foreign).append(entry)
    return own, foreign


def clear_store(store: Path, patterns: Sequence[str] = STORE_FILES, beside: Sequence[str | Path] = ()) -> None:
    """Delete what the job wrote in its folder (`store_files`), then the folder once empty (anything else stays,
    named)."""
    own, foreign = store_files(store, patterns, beside)
    remove(own)
    if foreign:
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        print(f"note: kept {store}: it holds {foreign[0].name}{more}, which no rmjax job wrote.", file=sys.stderr,
              flush=True)
        return
    with contextlib.suppress(FileNotFoundError):
        if not any(store.iterdir()):  # what `beside` names stays
            store.rmdir()


def foreign_refusal(what: str, foreign: Path, flag: str) -> OutputExistsError:
    """The one refusal of an --overwrite that would delete a file no rmjax job wrote."""
    return OutputExistsError(f"--overwrite would delete {what}, but it also holds {foreign}, which no rmjax job "
                             f"wrote; move it elsewhere, or choose another {flag}.")


def remove(paths: Sequence[Path], store: Path | None = None) -> None:
    """Delete `paths` (files; folders an rmjax job wrote whole, e.g. orbax's checkpoints) and then, with `store`,
    the chunk store's own files (`clear_store`)."""
    for p in paths:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()
    if store is not None:
        clear_store(store)
