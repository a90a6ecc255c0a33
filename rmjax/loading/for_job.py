"""How a job loads its model: every check that can run before the weights are read runs first (a checkpoint folder's
config and tokenizer come without them), so a mistake costs no load; then the model, on the job's mesh.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import jax

from rmjax.loading import config_and_tokenizer, fingerprint, load, peek
from rmjax.model import Model, check_output_column
from rmjax.runs.options import RunOptions
from rmjax.text.chat import with_system_prompt


def check_template(tokenizer, template: str) -> None:
    """The chat template as `template` uses it: one that jinja cannot compile, or a missing one with
    template=chat, is a one-line error (before the weights load where the tokenizer comes without them)."""
    from rmjax.text.chat import check_template as check

    if template != "plain":
        check(tokenizer, template)


def check_model_template(spec: str, template: str) -> None:
    """`check_template` for a checkpoint folder's tokenizer, before any weight is read (no-op for GGUF and
    builtin models, whose tokenizer comes with the weights)."""
    peeked = peek(spec) if template != "plain" else None
    if peeked is not None and peeked[1] is not None:
        check_template(peeked[1], template)


def job_config_and_tokenizer(options: RunOptions, spec: str | None = None):
    """(config, tokenizer) of `spec` (default options.model) as the job will load it, without its weights: the
    tokenizer renders the job's --system_prompt, so a prompt's length checked before loading is the loaded one's."""
    config, tokenizer = config_and_tokenizer(spec or options.model)
    return config, with_system_prompt(tokenizer, options.system_prompt)


def job_fingerprint(options: RunOptions, spec: str | None = None) -> dict:
    """The fingerprint of `spec` (default options.model) as the job will load it (`load_for_job`): with its
    --system_prompt, as the loaded model's `model_fingerprint` then is. Computed without loading."""
    return fingerprint(spec or options.model, system_prompt=options.system_prompt)


def load_for_job(options: RunOptions, spec: str | None = None, before_weights: Callable | None = None) -> Model:
    """Load `spec` (default options.model) with options.dtype on options.mesh; `before_weights(config, tokenizer,
    mesh)` runs first when the config can be read without the weights (checkpoint folders), else right after
    loading. The chat template is checked at the same point, options.output_column once the model is there."""
    spec = spec or options.model
    peeked = peek(spec) if before_weights is not None or options.template != "plain" else None
    early = peeked is not None and peeked[1] is not None  # a checkpoint folder: checked before its weights
    if early:
        peeked = (peeked[0], with_system_prompt(peeked[1], options.system_prompt))
        check_template(peeked[1], options.template)
        if before_weights is not None:
            before_weights(*peeked, options.mesh)
    model = load(spec, dtype=options.dtype, mesh=options.mesh)
    if options.system_prompt is not None:  # the same files' tokenizer (model_fingerprint adds the system prompt)
        model.tokenizer = with_system_prompt(model.tokenizer, options.system_prompt)
        model.stamp(model.fingerprint)
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
