"""The one shape of every job (sweep, beam, gcg, score, logprobs, inspect): claim the output once → compute →
process 0 writes the result files and, last, their .meta.json. A job's `run_<job>(spec)` claims before the model
loads (rmjax.runs.options.claim_job, then rmjax.loading.for_job) and hands its `Job` to the library function that
computes and writes; called directly with a loaded model, that function claims for itself (`claimed`). Either way
an output is claimed once.

A result whose .meta.json is there is complete (rmjax.runs.claims reuses it for the same identity);
training keeps a workdir of checkpoints instead (rmjax.train.workdir.claim_workdir) but writes the same way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from rmjax.errors import InputFileError, NonFiniteError
from rmjax.parallel.distributed import every_process, is_main
from rmjax.runs import atomic, finiteness, results
from rmjax.runs.claims import Claim, claim, holds_progress, record_interrupted, record_writing, records_only
from rmjax.runs.folder_files import remove
from rmjax.runs.identities import require_claimed
from rmjax.runs.paths import companion_path, real_path, refuse_folder_name


@dataclasses.dataclass
class Job:
    out: Path
    identity: dict
    claimed: Claim
    started: float
    owned: tuple[Path, ...] = ()
    store: Path | None = None  # the run's saved progress (chunks), where an interrupted finish records its writes
    claimed_at: float = dataclasses.field(default_factory=time.time)  # wall clock: a killed run's temps are older
    reread: dict[str, tuple] = dataclasses.field(default_factory=dict)  # input files read again (`_contents`)

    @property
    def kind(self) -> str:
        """What .meta.json calls the job: its identity's name for it, so the two never differ."""
        return self.identity["job"]

    @property
    def reuse(self) -> bool:
        """A finished result of the same inputs is there: nothing to compute."""
        return self.claimed.reuse

    def finish(self, write: Callable[[Path], Path | None], *, allow_nonfinite: bool | None = False,
               **meta: Any) -> Path:
        """Process 0 runs `write(out)` (the result files; returns the result's path) and then writes
        .meta.json with kind, identity and seconds (unless `meta` gives them) and `meta`. A NaN/Inf number in
        any of them stops the job unless `allow_nonfinite` (the job's --allow_nonfinite: rmjax.runs.finiteness;
        None: the job has no such flag, so the refusal does not name it)."""
        path = self.out
        _refuse_rewritten(self.reread)
        if is_main():
            with finiteness.nonfinite_allowed(bool(allow_nonfinite), has_flag=allow_nonfinite is not None):
                # a link planted at an output's name goes first (never part of a result, and a write resolving the
                # name, as a figure's does, would follow it to its target)
                remove([p for p in self.claimed.remove if p.is_symlink()])
                old = {p: _file_id(p) for p in self.claimed.remove}  # the result this one replaces (claim_all)
                record_writing(self.store, self.identity, self.out, self.owned)  # a SIGKILL has no except
                try:
                    path = Path(write(self.out) or self.out)
                except BaseException:  # its rerun resumes over what it wrote, not refuses it as a stranger's
                    record_interrupted(self.store, self.identity, self.out, self.owned)
                    raise
                meta.setdefault("seconds", time.perf_counter() - self.started)
                # the old result's files this one did not write over go (else its record would count an old figure
                # as the new result's); its .meta.json is replaced by the new record
                record = results.meta_path(path)
                remove([p for p, was in old.items() if p != record and was is not None and _file_id(p) == was])
                results.write_meta(path, files=self.owned, kind=self.kind, identity=self.identity, **meta)
                # what a killed earlier run of this output left mid-write (it holds no lock: this run holds it)
                remove([t for p in dict.fromkeys([path, record, *self.owned])
                        for t in atomic.stale_temps(p, before=self.claimed_at)])
        return path


def _contents(reread: Mapping[str, str | Path | None] | None) -> dict[str, tuple[str, str | None]]:
    """The files a job reads again after its claim (GCG's --vocab_file and --init_from), by name: (path, sha1 of
    what it holds now; None where it is missing, which the job names)."""
    return {flag: (str(path), _digest(path)) for flag, path in (reread or {}).items() if path}


def _digest(path: str | Path) -> str | None:
    try:
        return results.file_sha1(path)  # as the identity holds these inputs (rmjax.search.gcg_job.gcg_identity)
    except OSError:
        return None


def _refuse_rewritten(read: dict[str, tuple[str, str | None]]) -> None:
    """A file the job reads again after its claim, written since with other content (a --vocab_file saved with
    other words): its identity holds the content as claimed, a later read may have taken the new one; nothing is
    written. The same content saved again is no change. Every process reads the files, and all refuse where any
    saw a change: a save landing between two processes' reads stopped one alone, and the others waited at their
    next collective."""
    if not read:  # the same on every process (the job's flags): no collective
        return
    named = list(read.items())
    mine = next((i for i, (_, (path, digest)) in enumerate(named) if _digest(path) != digest), -1)
    seen = [i for i in every_process(mine) if i >= 0]
    if seen:
        flag, (path, _) = named[min(seen)]
        raise InputFileError(f"{flag}={path} was written with other content during this run, which reads it again "
                             "after it starts: its result could hold two versions of it, so nothing was written; "
                             "rerun once the file is final.")


def _file_id(path: Path) -> tuple[int, int, int] | None:
    """What tells a file from the one written over it (atomic.replacing renames a new inode into place)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def model_meta(model) -> dict:
    """What .meta.json records about the model a job ran."""
    from rmjax.text.chat import system_prompt_of, template_head

    return {"model": model.source, "dtype": model.dtype, "output_column": model.output_column,
            "mesh": dict(model.mesh.shape) if model.mesh is not None else None, "load_seconds": model.load_seconds,
            "system_prompt": system_prompt_of(model.tokenizer),  # None: the chat template's own (its head below)
            "chat_template_head": template_head(model.tokenizer),  # what precedes the user turn, as rendered
            "training": getattr(model, "training", None)}  # its recorded recipe: the analyses' in-sample notes


@contextlib.contextmanager
def job(out: str | Path, identity: dict, *, overwrite: bool = False, owned: Sequence[str | Path] = (),
        store: str | Path | None = None, inputs: Mapping[str, str | Path | None] | None = None,
        reread: Mapping[str, str | Path | None] | None = None, flag: str = "--out") -> Iterator[Job]:
    """Claim `out` for `identity` (reuse, resume, refuse or overwrite: rmjax.runs.claims.claim) for the block;
    `inputs` (flag -> path): the files the job reads, which no output may be; `reread`: those it reads again after
    the claim, whose content must be as claimed when the result is written; `flag`: how messages name `out`
    (rmjax.runs.paths.named)."""
    refuse_folder_name(out, flag)
    out = real_path(out)  # written where the claim locked it (a symlinked --out: its target)
    with claim(out, identity, overwrite=overwrite, owned=owned, store=store, inputs=inputs, flag=flag,
               defer_removal=True) as decision:
        # after the claim (--overwrite cleared one): none, or only a record of the files a run may replace
        new_store = store is not None and (not os.path.lexists(store) or not holds_progress(Path(store)))
        if overwrite and store is not None and decision.remove and is_main():
            # the old result this run replaces, recorded in its progress: a rerun of these inputs without
            # --overwrite, after a stop, resumes over it (where the old result is another kind of output's, as a
            # disagreement's map-only run over its search, nothing else says the files are this run's to replace)
            record_interrupted(Path(store), identity, out, [p for p in decision.remove if not p.is_symlink()])
        try:
            yield Job(out, identity, decision, time.perf_counter(), tuple(map(companion_path, owned)),
                      None if store is None else Path(store), reread=_contents(reread))
        except BaseException:
            if new_store and is_main():
                _remove_if_unused(Path(store))
            raise


def _remove_if_unused(store: Path) -> None:
    """A store this run made and stopped before saving anything in (a check after the load refused it): its manifest
    pinned the refused flags, so the corrected rerun was refused as another run's progress (a fault hunt). A record
    of the files a run of these inputs may replace stays (claims.record_interrupted): it pins nothing."""
    if not store.is_dir() or store.is_symlink():
        return
    rest = [p for p in store.iterdir() if p.name != "manifest.json"]
    if not records_only(rest):
        return  # saved progress: its rerun continues it
    (store / "manifest.json").unlink(missing_ok=True)
    if not rest:
        store.rmdir()


def refuse_nonfinite_reuse(out: Path, allowed: bool) -> None:
    """A finished result that records NaN/Inf values (written with --allow_nonfinite: the job's own count, or
    `nonfinite_written`, what the writers counted in its files) is reused only by a run that allows them too, as its
    stored chunks are resumed (rmjax.runs.chunks): a rerun without the flag exited 0 on it."""
    meta = results.read_meta(out)
    meta = meta if isinstance(meta, dict) else {}
    summary = meta.get("summary") if isinstance(meta.get("summary"), dict) else {}
    recorded = meta.get("nonfinite") or summary.get("nonfinite") or meta.get("nonfinite_written")
    if recorded and not allowed:
        raise NonFiniteError(f"{out} is a finished result of these inputs that holds non-finite values (written with "
                             f"--allow_nonfinite: {json.dumps(recorded)[:120]}); pass --allow_nonfinite to reuse it, "
                             "or --overwrite to recompute it.")


@contextlib.contextmanager
def claimed(given: Job | None, out: str | Path, identity: dict, *, allow_nonfinite: bool,
            **claim_options: Any) -> Iterator[Job]:
    """The job a library function writes through: `given`, claimed by its caller before the model loaded (whose
    identity, computed from the fingerprint without loading, must be the loaded model's `identity`), or else
    its own claim of `out` (`job(out, identity, **claim_options)`). A result with NaN/Inf is reused only
    `allow_nonfinite`, as a job's claim reuses it (rmjax.runs.options.claim_job)."""
    if given is None:
        with job(out, identity, **claim_options) as own:
            if own.reuse:
                refuse_nonfinite_reuse(own.out, allow_nonfinite)
            yield own
        return
    _refuse_rewritten(given.reread)  # an input saved again since the claim: its identity differs for that reason
    require_claimed(given.identity, identity, given.out)
    yield given
