"""A training run's workdir: the claim on it (one run per workdir, its identity in run.json) and its CSV logs,
which a resumed run reads back up to the restored step and rewrites whole."""

from __future__ import annotations

import contextlib
import csv
from collections.abc import Iterator, Sequence
from pathlib import Path

from rmjax.parallel.distributed import is_main
from rmjax.runs.atomic import fresh_file
from rmjax.runs.claims import Claim, Output, claim_all
from rmjax.runs.results import dump_json


def workdir_output(workdir: Path, identity: dict, overwrite: bool, beside: Sequence[str | Path] = ()) -> Output:
    """The workdir holds one run (its identity in run.json, written as soon as it is claimed: `start_workdir`):
    continue it, or refuse another's (unless --overwrite, which deletes the files the run wrote there,
    WORKDIR_FILES, and refuses a workdir holding anything else). `beside`: the run's other outputs (an export
    folder, a head file), which may lie inside the workdir and are claimed on their own."""
    return Output(workdir, identity, overwrite=overwrite, meta=workdir / RUN_FILE, folder=WORKDIR_FILES,
                  flag="--workdir", beside=tuple(beside))


def start_workdir(workdir: Path, identity: dict, decision: Claim) -> None:
    """Record the run's identity in a claimed workdir (unless its finished run is reused)."""
    if not decision.reuse and is_main():
        workdir.mkdir(parents=True, exist_ok=True)
        dump_json({"identity": identity}, workdir / RUN_FILE)


def forget_unsaved_run(workdir: Path) -> None:
    """A run stopped before its first checkpoint (a model whose features are not finite) saved nothing to resume:
    its run.json claimed the workdir for its inputs, and the corrected rerun was refused as another run's. It goes,
    with the empty checkpoints folder and a workdir left empty. A run with a checkpoint keeps its claim (resumable)."""
    checkpoints = workdir / "checkpoints"
    if (workdir / "summary.json").exists() or (checkpoints.is_dir() and any(checkpoints.iterdir())):
        return
    with contextlib.suppress(OSError):
        for name in (RUN_FILE, "train_log.csv", "eval_log.csv", "train_log.csv.tmp", "eval_log.csv.tmp"):
            (workdir / name).unlink(missing_ok=True)
        if checkpoints.is_dir():
            checkpoints.rmdir()
        workdir.rmdir()  # only an empty one


@contextlib.contextmanager
def claim_workdir(workdir: Path, identity: dict, overwrite: bool, beside: Sequence[str | Path] = ()) -> Iterator:
    """Claim a training workdir on its own (`workdir_output`, `start_workdir`)."""
    with claim_all([workdir_output(workdir, identity, overwrite, beside)]) as (decision,):
        start_workdir(workdir, identity, decision)
        yield decision


RUN_FILE = "run.json"
# What a run writes in its workdir (rmjax.runs.folder_files.store_files): run.json, the logs and summary.json and their
# temp files (`write_log`; rmjax.runs.atomic.atomic_write_text), and orbax's checkpoints folder, whole.
WORKDIR_FILES = (RUN_FILE, "summary.json", "train_log.csv", "eval_log.csv", "train_log.csv.tmp", "eval_log.csv.tmp",
                 f".{RUN_FILE}.*.tmp", ".summary.json.*.tmp", "checkpoints/")


def read_log(path: Path, upto: int) -> list[dict]:
    """Rows of a previous run up to the restored step (later rows are replayed, not duplicated)."""
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        rows = [{k: (int(v) if k == "step" else float(v)) for k, v in r.items()} for r in csv.DictReader(f)]
    return [r for r in rows if r["step"] <= upto]


def write_log(path: Path, rows: list[dict]) -> None:
    """The log whole, through a temp file: a crash leaves the previous one."""
    tmp = fresh_file(path.with_name(path.name + ".tmp"))  # a link planted there is removed, not written through
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    tmp.replace(path)
