"""A resumable store of completed result chunks beside an output file.

Each chunk (rows [start, stop) of the candidate list, all prompts) is written atomically
(temp file + rename), so a crash loses at most the chunk in flight and never leaves a partial
one. A manifest pins the run's identity; resuming with different settings is refused rather
than mixing results of two runs.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np

from rmjax.errors import RmjaxError


class ResumeMismatchError(RmjaxError):
    """An existing chunk store belongs to a run with different settings."""


def fingerprint(values: np.ndarray) -> str:
    return hashlib.sha1(np.ascontiguousarray(values).tobytes()).hexdigest()


class ChunkStore:
    def __init__(self, out: str | Path, identity: dict, create: bool = True):
        out = Path(out)
        self.dir = out.with_name(out.name + ".chunks")
        self.identity = json.loads(json.dumps(identity, sort_keys=True, default=str))
        manifest = self.dir / "manifest.json"
        if manifest.is_file():
            existing = json.loads(manifest.read_text())
            if existing != self.identity:
                diff = sorted(k for k in set(existing) | set(self.identity) if existing.get(k) != self.identity.get(k))
                raise ResumeMismatchError(
                    f"{self.dir} holds chunks of a run with different {', '.join(diff)}. Resume with the "
                    f"same settings, or delete {self.dir} (or choose another --out) to start over."
                )
        elif create:
            self.dir.mkdir(parents=True, exist_ok=True)
            tmp = manifest.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.identity, indent=2, sort_keys=True))
            tmp.replace(manifest)

    def _path(self, start: int) -> Path:
        return self.dir / f"chunk-{start:010d}.npy"

    def has(self, start: int) -> bool:
        return self._path(start).is_file()

    def write(self, start: int, scores: np.ndarray) -> None:
        path = self._path(start)
        tmp = path.with_name("tmp-" + path.name)  # not matched by chunk-*.npy
        np.save(tmp, scores)
        tmp.replace(path)

    def read(self, start: int) -> np.ndarray:
        return np.load(self._path(start))

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
