"""What every model-running job shares, and the one way a job claims its output.

A job (`run_sweep`, `run_beam`, `run_gcg`, `run_score`, `run_logprobs`, `run_inspect`) takes one frozen spec: its
own settings and a `RunOptions`. It computes its identity from the model's fingerprint without loading it, claims
the output once (`claim_job`), returns when a finished result of the same inputs is there, and only then loads the
model (rmjax.loading.for_job.load_for_job).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import jax

from rmjax.errors import UsageError
from rmjax.runs import jobs, results


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """The settings every model-running job takes (the shared flags of experiments.common)."""

    model: str  # a checkpoint folder, a .gguf file or a builtin name (GCG: several, comma-separated)
    out: str  # the result file (inspect: its folder)
    dtype: str = "float32"
    mesh: jax.sharding.Mesh | None = None  # None: one device
    template: str = "auto"  # auto, chat or plain (rmjax.text.chat.split_chat)
    output_column: int = 0  # which reward-head output the job reads
    output_column_given: bool = False  # --output_column on the command line (a classifier's column 0 needs it)
    overwrite: bool = False  # replace a result of other inputs (else refused); recompute a finished one
    allow_nonfinite: bool = False  # write NaN/Inf instead of stopping (counted in .meta.json)
    inputs: tuple[tuple[str, str], ...] = ()  # (flag, path) of the files the command line names (a model file, a
    # prompts YAML, a texts file): no output of the job may be one of them
    system_prompt: str | None = None  # the system message of every conversation (None: the template's own)

    @property
    def column_chosen(self) -> bool:
        """Whether the reward column was chosen (given, or other than 0), not the default taken."""
        return self.output_column_given or self.output_column != 0

    def __post_init__(self):
        if self.system_prompt is not None and self.template == "plain":
            raise UsageError("--system_prompt needs a chat template, and --template=plain has no system turn: drop "
                             "one of them.")


def model_inputs(**models: str | None) -> dict[str, str]:
    """Models a job reads besides --model (flag name -> spec: lm, judge, a disagreement's sides) that are folders or
    files here, as `claim_job` inputs: no output may be one or sit inside one (a hub id or a builtin name is no
    path). A flag naming several models gives each as flag=spec."""
    return {f"--{flag}={spec}": spec for flag, spec in models.items() for spec in (spec or "").split(",")
            if spec and Path(spec).exists()}


@contextlib.contextmanager
def claim_job(options: RunOptions, identity: dict, *, out: str | Path | None = None,
              owned: Sequence[str | Path] = (), store: str | Path | None = None,
              inputs: Mapping[str, str | Path | None] | None = None,
              reread: Mapping[str, str | Path | None] | None = None) -> Iterator[jobs.Job]:
    """Claim `out` (default options.out) for `identity` with options.overwrite (rmjax.runs.jobs.job) for the
    block, saying so when a finished result of the same inputs is reused. `inputs` (flag -> path): the files the
    job reads (an earlier result, a word list), which no output may be; `reread`: those it reads again after the
    claim (rmjax.runs.jobs.job)."""
    read = {f"{flag}={path}": path for flag, path in options.inputs} | dict(inputs or {})
    # a result a folder job writes inside --out (inspect's reward_lens.csv) is named as in that folder
    flag = "--out" if out is None or Path(out) == Path(options.out) else f"--out={options.out}"
    with jobs.job(out or options.out, identity, overwrite=options.overwrite, owned=owned, store=store,
                  inputs=read, reread=reread, flag=flag) as job:
        if job.reuse:
            jobs.refuse_nonfinite_reuse(job.out, options.allow_nonfinite)
            note = results.reused_note(results.read_meta(job.out))
            print(f"{options.out}: {note}: a finished result of the same inputs (model content, prompts and "
                  "settings); pass --overwrite to recompute.", file=sys.stderr)
        yield job

