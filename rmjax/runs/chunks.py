"""A resumable store of completed result chunks beside an output file.

Each chunk (rows [start, stop) of the candidate list, all prompts) is written to a temp file, proven on disk
(synced, its size and its bytes read back: `np.save` does not raise on a short write, e.g. a full disk) and only
then renamed into place, so a crash or a full disk loses at most the chunk in flight and never leaves a partial
one under a chunk's name. The manifest pins the run's identity (`rmjax.runs.claims`: model content, tokenizer,
template, every setting that changes a score), the chunk size and the batch size; resuming with another identity
is refused rather than mixing results of two runs, and a resume keeps the saved chunk and batch sizes (another
batch size is another compiled program, whose float rounding differs: one run's scores share one). The identity
compares as `canonical` sorts it, blind to order, while a chunk's columns are the prompts in the order given: the
manifest also records each mapping's key order (`key_order`), and a resume in another order is refused.
"""

from __future__ import annotations

import errno
import io
import json
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from rmjax.errors import ResumeMismatchError
from rmjax.parallel.distributed import barrier, is_main
from rmjax.runs.atomic import atomic_write_text, fresh_file, read_json
from rmjax.runs.folder_files import clear_store
from rmjax.runs.identities import canonical, key_order, mismatch_message
from rmjax.runs.paths import real_path


def store_dir(out: str | Path) -> Path:
    out = real_path(out)
    return out.with_name(out.name + ".chunks")


def _manifest(directory: Path) -> dict | None:
    saved = read_json(directory / "manifest.json")  # a FIFO or device there is never read (it would hang)
    return saved if isinstance(saved, dict) else None


def _plain(path: Path) -> bool:
    """Whether `path` is a regular file of its own (not a link, FIFO or device): only such a file is a chunk; a
    link would read another file, a FIFO would block the read."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def saved_batch_size(out: str | Path) -> int | None:
    """The batch size the progress saved beside `out` was scored with; None without progress or without a
    recorded one (a store from before batch sizes were recorded adopts the run's)."""
    return _positive_int((_manifest(store_dir(out)) or {}).get("batch_size"))


def _positive_int(saved: object) -> int | None:
    """A size a manifest records: an int of at least 1 (JSON true, 0 or text is none)."""
    return saved if isinstance(saved, int) and not isinstance(saved, bool) and saved >= 1 else None


def resume_batch_size(out: str | Path, batch_size: int) -> int:
    """The batch size a job runs with: that of the saved progress beside `out` when there is some (its chunks were
    scored with it; said on stderr when `batch_size`, 0 for the memory plan's pick, asks otherwise), else
    `batch_size`. Called before the memory plan, so a saved batch size that does not fit here is refused there."""
    saved = saved_batch_size(out)
    if saved is None:
        return batch_size
    if saved != batch_size and is_main():
        print(_kept_batch_note(store_dir(out), saved, batch_size), file=sys.stderr, flush=True)
    return saved


def _kept_batch_note(directory: Path, saved: int, asked: int | None) -> str:
    # with --batch_size=0 the memory plan is not asked on a resume (its pick may be the same size)
    asked_for = f"not --batch_size={asked}" if asked else "kept on a resume (the memory plan is not asked)"
    return (f"resuming {directory} with its batch size {saved}, {asked_for}: its saved scores were computed in "
            f"batches of {saved} (another batch size rounds differently); pass --overwrite to start over with another.")


def _order_mismatch(directory: Path, saved: dict, now: dict) -> ResumeMismatchError:
    path = next(p for p in sorted(set(saved) | set(now)) if saved.get(p) != now.get(p))
    return ResumeMismatchError(
        f"saved progress {directory} holds {path} in the order {', '.join(saved.get(path) or [])}, not "
        f"{', '.join(now.get(path) or [])} (its chunks' columns are in that order). Rerun with them in that order to "
        "continue it, pass --overwrite to discard it, or choose another --out.")


class ChunkStore:
    """The saved chunks of one run. `batch_size` (None: a job without one) is recorded in a new manifest; an
    existing manifest's chunk and batch sizes are kept (`self.chunk_size`, `self.batch_size`) where they are positive
    integers: a bad chunk size is refused, a bad batch size leaves the run's (as `resume_batch_size` reads it)."""

    def __init__(self, out: str | Path, identity: dict, chunk_size: int, create: bool = True,
                 batch_size: int | None = None):
        self.dir = store_dir(out)
        self.identity, order = canonical(identity), key_order(identity)
        self.chunk_size, self.batch_size = chunk_size, batch_size
        manifest = self.dir / "manifest.json"
        if manifest.is_file():
            saved = _manifest(self.dir)
            if saved is None:
                raise ResumeMismatchError(f"{manifest} is unreadable; delete {self.dir} to start over (pass "
                                          "--overwrite).")
            if saved.get("identity") != self.identity:
                raise ResumeMismatchError(mismatch_message(f"saved progress {self.dir}", saved.get("identity") or {},
                                                           self.identity))
            if isinstance(saved.get("key_order"), dict) and saved["key_order"] != order:
                raise _order_mismatch(self.dir, saved["key_order"], order)
            if _positive_int(saved.get("chunk_size")) is None:
                raise ResumeMismatchError(f"{manifest} records no valid chunk size (a positive integer); delete "
                                          f"{self.dir} to start over (pass --overwrite).")
            self.chunk_size = saved["chunk_size"]  # chunks already on disk fix the layout
            if _positive_int(saved.get("batch_size")) is not None:  # and the rounding of their scores (the size
                self.batch_size = saved["batch_size"]  # resume_batch_size gave the memory plan: the same one)
        elif create:
            self.dir.mkdir(parents=True, exist_ok=True)
            atomic_write_text(manifest, json.dumps({"identity": self.identity, "key_order": order,
                                                    "chunk_size": chunk_size, "batch_size": batch_size},
                                                   indent=2, sort_keys=True))

    def _path(self, start: int | str) -> Path:
        """A chunk by its first row (the sweep) or by a name (the beam: depth, partial, first candidate)."""
        return self.dir / (f"chunk-{start:010d}.npy" if isinstance(start, int) else f"chunk-{start}.npy")

    def has(self, start: int | str) -> bool:
        return _plain(self._path(start))

    def names(self) -> set[str]:
        """The names of the complete chunks (one directory listing)."""
        return {p.name[len("chunk-"):-len(".npy")] for p in self.dir.glob("chunk-*.npy") if _plain(p)}

    def damaged(self, name: int | str, why: str) -> ResumeMismatchError:
        """The one refusal of a stored chunk that cannot be used: it names the file to delete (only that one:
        the rerun recomputes it and keeps the others)."""
        path = self._path(name)
        return ResumeMismatchError(f"{path} {why}; delete {path} and rerun to recompute that chunk (the other "
                                   "saved chunks are kept).")

    def write(self, start: int | str, scores: np.ndarray) -> None:
        """Store a chunk under its name only once its bytes are proven on disk; a short or failed write removes
        the temp file and raises OSError (ENOSPC: the entry points' one-line disk error)."""
        path = self._path(start)
        tmp = path.with_name("tmp-" + path.name)  # not matched by chunk-*.npy
        buffer = io.BytesIO()
        np.save(buffer, np.asarray(scores), allow_pickle=False)
        data = buffer.getvalue()
        try:
            try:
                with open(fresh_file(tmp), "wb") as f:  # a link planted at the temp name is removed, not followed
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                size = tmp.stat().st_size
                if size != len(data):
                    raise OSError(errno.ENOSPC, f"only {size} of its {len(data)} bytes reached the disk (full?)")
                if tmp.read_bytes() != data:
                    raise OSError(errno.ENOSPC, "the bytes read back differ from those written (full?)")
            except OSError as error:  # named after the chunk (the temp file is gone)
                raise OSError(error.errno, f"{error.strerror or error}; the chunk was not saved", str(path)) from None
            tmp.replace(path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def read(self, start: int | str, shape: tuple[int, int], check: Callable[[np.ndarray, str], object]) -> np.ndarray:
        """A stored chunk, held to what a freshly computed one must pass in *this* run: its shape and float32 dtype,
        then `check(scores, what)`, the job's own test of a fresh chunk (finiteness under this run's
        --allow_nonfinite). The run that stored it may have had other such settings (they are not part of the
        identity), so nothing read back is trusted as is."""
        scores = self.load(start)
        if scores.shape != shape or scores.dtype != np.float32:
            raise self.damaged(start, f"holds {scores.dtype} scores of shape {scores.shape} where float32 of {shape} "
                                      "are expected")
        check(scores, f"scores saved in {self._path(start)}")
        return scores

    def load(self, name: int | str) -> np.ndarray:
        """A stored array as it was written (the caller checks its shape against what it expects, refusing a
        wrong one with `damaged`)."""
        path = self._path(name)
        if not _plain(path):
            raise self.damaged(name, "is not a regular file (a link, a FIFO or a device)")
        try:  # mapped first: a header promising more data than the file holds is refused, not allocated
            return np.array(np.load(path, mmap_mode="r", allow_pickle=False))
        except (OSError, ValueError, EOFError) as error:
            raise self.damaged(name, f"is unreadable ({' '.join(str(error).split())})") from None

    def remove(self) -> None:
        """The store's own files and then its folder (rmjax.runs.folder_files.clear_store: nothing it did not write)."""
        clear_store(self.dir)


def open_store(out: str | Path, identity: dict, chunk_size: int, batch_size: int | None = None) -> ChunkStore:
    """The chunk store of a resumable job (sweep, beam, frontier): process 0 owns the files; the others open the
    same store once it exists (shared disk). Score with its `chunk_size` and `batch_size`: a resume keeps the
    saved ones (said on stderr)."""
    store = ChunkStore(out, identity, chunk_size, batch_size=batch_size) if is_main() else None
    barrier("rmjax-sweep-store")
    if store is None:
        store = ChunkStore(out, identity, chunk_size, create=False, batch_size=batch_size)
    if store.chunk_size != chunk_size and is_main():
        print(f"resuming {store.dir} with its chunk size {store.chunk_size}", file=sys.stderr)
    if store.batch_size != batch_size and is_main():
        print(_kept_batch_note(store.dir, store.batch_size, batch_size), file=sys.stderr)
    return store
