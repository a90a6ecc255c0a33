"""The one shape of every job (sweep, score, logprobs, gcg): claim the output → compute → process 0
writes the result files and, last, their .meta.json. Library functions compute and return arrays or
results; a job function wraps one of them in `job(...)` and hands its writer to `Job.finish`.

A result whose .meta.json is there is complete (rmjax.runs.claims reuses it for the same identity);
training keeps a workdir of checkpoints instead (rmjax.train.loop.claim_workdir) but writes the same way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from rmjax.parallel.distributed import is_main
from rmjax.runs import results
from rmjax.runs.claims import Claim, claim, real_path


@dataclasses.dataclass
class Job:
    out: Path
    identity: dict
    kind: str
    claimed: Claim
    started: float
    owned: tuple[Path, ...] = ()

    @property
    def reuse(self) -> bool:
        """A finished result of the same inputs is there: nothing to compute."""
        return self.claimed.reuse

    def finish(self, write: Callable[[Path], Path | None], **meta: Any) -> Path:
        """Process 0 runs `write(out)` (the result files; returns the result's path) and then writes
        .meta.json with kind, identity and seconds (unless `meta` gives them) and `meta`."""
        path = self.out
        if is_main():
            path = Path(write(self.out) or self.out)
            meta.setdefault("seconds", time.perf_counter() - self.started)
            results.write_meta(path, files=self.owned, kind=self.kind, identity=self.identity, **meta)
        return path


def model_meta(model) -> dict:
    """What .meta.json records about the model a job ran."""
    return {"model": model.source, "dtype": model.dtype, "output_column": model.output_column,
            "mesh": dict(model.mesh.shape) if model.mesh is not None else None, "load_seconds": model.load_seconds}


@contextlib.contextmanager
def job(out: str | Path, identity: dict, kind: str, *, overwrite: bool = False, owned: Sequence[str | Path] = (),
        store: str | Path | None = None) -> Iterator[Job]:
    """Claim `out` for `identity` (reuse, resume, refuse or overwrite: rmjax.runs.claims.claim) for the block."""
    out = real_path(out)  # written where the claim locked it (a symlinked --out: its target)
    with claim(out, identity, overwrite=overwrite, owned=owned, store=store) as decision:
        yield Job(out, identity, kind, decision, time.perf_counter(), tuple(map(real_path, owned)))
