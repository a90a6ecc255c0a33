"""What every model-running job shares, and the one way a job claims its output and loads its model.

A job (`run_sweep`, `run_beam`, `run_gcg`, `run_score`, `run_logprobs`, `run_inspect`) takes one frozen spec: its
own settings and a `RunOptions`. It computes its identity from the model's fingerprint without loading it, claims
the output once (`claim_job`), returns when a finished result of the same inputs is there, and only then loads the
model (`load_for_job`), with every check that can run before the weights are read done first (a checkpoint
folder's config and tokenizer come without them), so a mistake costs no load.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import jax

from rmjax.config import ModelConfig
from rmjax.errors import UsageError
from rmjax.model import Model
from rmjax.runs import jobs


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """The settings every model-running job takes (the shared flags of experiments.common)."""

    model: str  # a checkpoint folder, a .gguf file or a builtin name (GCG: several, comma-separated)
    out: str  # the result file (inspect: its folder)
    dtype: str = "float32"
    mesh: jax.sharding.Mesh | None = None  # None: one device
    template: str = "auto"  # auto, chat or plain (rmjax.text.chat.split_chat)
    output_column: int = 0  # which reward-head output the job reads
    overwrite: bool = False  # replace a result of other inputs (else refused); recompute a finished one
    allow_nonfinite: bool = False  # write NaN/Inf instead of stopping (counted in .meta.json)


@contextlib.contextmanager
def claim_job(options: RunOptions, identity: dict, *, out: str | Path | None = None,
              owned: Sequence[str | Path] = (), store: str | Path | None = None) -> Iterator[jobs.Job]:
    """Claim `out` (default options.out) for `identity` with options.overwrite (rmjax.runs.jobs.job) for the
    block, saying so when a finished result of the same inputs is reused."""
    with jobs.job(out or options.out, identity, overwrite=options.overwrite, owned=owned, store=store) as job:
        if job.reuse:
            print(f"{options.out} is already complete for these inputs (same model content, prompts and settings): "
                  "reusing it; pass --overwrite to recompute.", file=sys.stderr)
        yield job


def check_output_column(cfg: ModelConfig, column: int, source: str) -> int:
    """`column` when the model has that reward output, else a UsageError naming the range."""
    if not 0 <= column < cfg.num_outputs:
        raise UsageError(f"--output_column={column}: {source} has {cfg.num_outputs} reward outputs "
                         f"(0..{cfg.num_outputs - 1}).")
    return column


def check_in_vocabulary(ids: Sequence[int] | None, vocab_size: int) -> None:
    """UsageError naming the ids at or past `vocab_size` (the model's config: checked before its weights load)."""
    outside = [t for t in ids or [] if t >= vocab_size]
    if outside:
        raise UsageError(f"--token_ids: {outside[:5]} are outside the vocabulary [0, {vocab_size}).")


def check_template(tokenizer, template: str) -> None:
    """The chat template as `template` uses it: one that jinja cannot compile, or a missing one with
    template=chat, is a one-line error (before the weights load where the tokenizer comes without them)."""
    from rmjax.text.chat import check_template as check

    if template != "plain":
        check(tokenizer, template)


def check_model_template(spec: str, template: str) -> None:
    """`check_template` for a checkpoint folder's tokenizer, before any weight is read (no-op for GGUF and
    builtin models, whose tokenizer comes with the weights)."""
    from rmjax.loading import peek

    peeked = peek(spec) if template != "plain" else None
    if peeked is not None and peeked[1] is not None:
        check_template(peeked[1], template)


def load_for_job(options: RunOptions, spec: str | None = None, before_weights: Callable | None = None) -> Model:
    """Load `spec` (default options.model) with options.dtype on options.mesh; `before_weights(config, tokenizer,
    mesh)` runs first when the config can be read without the weights (checkpoint folders), else right after
    loading. The chat template is checked at the same point, options.output_column once the model is there."""
    from rmjax.loading import load, peek

    spec = spec or options.model
    peeked = peek(spec) if before_weights is not None or options.template != "plain" else None
    early = peeked is not None and peeked[1] is not None  # a checkpoint folder: checked before its weights
    if early:
        check_template(peeked[1], options.template)
        if before_weights is not None:
            before_weights(*peeked, options.mesh)
    model = load(spec, dtype=options.dtype, mesh=options.mesh)
    if not early:
        check_template(model.tokenizer, options.template)
        if before_weights is not None:
            before_weights(model.config, model.tokenizer, options.mesh)
    if options.output_column:
        model.output_column = check_output_column(model.config, options.output_column, model.source)
    if model.weight_bytes:
        print(f"process {jax.process_index()}: loaded {model.source} in {model.load_seconds:.1f} s, read "
              f"{model.weight_bytes_read / 2**20:.1f} of {model.weight_bytes / 2**20:.1f} MiB of weights "
              "(its devices' shards)", file=sys.stderr)
    return model
