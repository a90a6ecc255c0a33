"""A resumable store of completed result chunks beside an output file.

Each chunk (rows [start, stop) of the candidate list, all prompts) is written atomically
(temp file + rename), so a crash loses at most the chunk in flight and never leaves a partial
one. The manifest pins the run's identity (`rmjax.runs.claims`: model content, tokenizer, template,
every setting that changes a score) and the chunk size; resuming with another identity is refused
rather than mixing results of two runs, and a resume keeps the saved chunk size.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from rmjax.errors import ResumeMismatchError
from rmjax.parallel.distributed import barrier, is_main
from rmjax.runs.claims import canonical, mismatch_message, real_path
from rmjax.runs.results import atomic_write_text


def store_dir(out: str | Path) -> Path:
    out = real_path(out)
    return out.with_name(out.name + ".chunks")


class ChunkStore:
    def __init__(self, out: str | Path, identity: dict, chunk_size: int, create: bool = True):
        self.dir = store_dir(out)
        self.identity = canonical(identity)
        self.chunk_size = chunk_size
        manifest = self.dir / "manifest.json"
        if manifest.is_file():
            saved = json.loads(manifest.read_text())
            if saved.get("identity") != self.identity:
                raise ResumeMismatchError(mismatch_message(f"saved progress {self.dir}", saved.get("identity") or {},
                                                           self.identity))
            self.chunk_size = int(saved["chunk_size"])  # chunks already on disk fix the layout
        elif create:
            self.dir.mkdir(parents=True, exist_ok=True)
            atomic_write_text(manifest, json.dumps({"identity": self.identity, "chunk_size": chunk_size}, indent=2,
                                                   sort_keys=True))

    def _path(self, start: int | str) -> Path:
        """A chunk by its first row (the sweep) or by a name (the beam: depth, partial, first candidate)."""
        return self.dir / (f"chunk-{start:010d}.npy" if isinstance(start, int) else f"chunk-{start}.npy")

    def has(self, start: int | str) -> bool:
        return self._path(start).is_file()

    def names(self) -> set[str]:
        """The names of the complete chunks (one directory listing)."""
        return {p.name[len("chunk-"):-len(".npy")] for p in self.dir.glob("chunk-*.npy")}

    def write(self, start: int | str, scores: np.ndarray) -> None:
        path = self._path(start)
        tmp = path.with_name("tmp-" + path.name)  # not matched by chunk-*.npy
        np.save(tmp, scores)
        tmp.replace(path)

    def read(self, start: int | str, shape: tuple[int, int], check: Callable[[np.ndarray, str], object]) -> np.ndarray:
        """A stored chunk, held to what a freshly computed one must pass in *this* run: its shape and float32 dtype,
        then `check(scores, what)`, the job's own test of a fresh chunk (finiteness under this run's
        --allow_nonfinite). The run that stored it may have had other such settings (they are not part of the
        identity), so nothing read back is trusted as is."""
        path = self._path(start)
        try:
            scores = np.load(path)
        except (OSError, ValueError) as error:
            raise ResumeMismatchError(f"{path} is unreadable ({error}); delete it to recompute that chunk.") from None
        if scores.shape != shape or scores.dtype != np.float32:
            raise ResumeMismatchError(f"{path} holds {scores.dtype} scores of shape {scores.shape} where float32 of "
                                      f"{shape} are expected; delete it to recompute that chunk.")
        check(scores, f"scores saved in {path}")
        return scores

    def load(self, name: int | str) -> np.ndarray:
        """A stored array as it was written (the caller checks its shape against what it expects)."""
        path = self._path(name)
        try:
            return np.load(path)
        except (OSError, ValueError) as error:
            raise ResumeMismatchError(f"{path} is unreadable ({error}); delete it to recompute it.") from None

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def open_store(out: str | Path, identity: dict, chunk_size: int) -> ChunkStore:
    """The chunk store of a resumable job (sweep, beam): process 0 owns the files; the others open the same
    store once it exists (shared disk)."""
    store = ChunkStore(out, identity, chunk_size) if is_main() else None
    barrier("rmjax-sweep-store")
    if store is None:
        store = ChunkStore(out, identity, chunk_size, create=False)
    if store.chunk_size != chunk_size and is_main():
        print(f"resuming {store.dir} with its chunk size {store.chunk_size}", file=sys.stderr)
    return store
