"""Next-token log-probs of a causal LM after a prompt: the papers' base-model analysis."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from rmjax.errors import UsageError
from rmjax.loading import config_of
from rmjax.loading.for_job import job_config_and_tokenizer, job_fingerprint, load_for_job
from rmjax.loading.identity import model_fingerprint
from rmjax.model import Model
from rmjax.parallel import batching
from rmjax.parallel.distributed import to_host
from rmjax.runs import jobs, results
from rmjax.runs.options import RunOptions, claim_job
from rmjax.scoring import calls, finite
from rmjax.text import chat
from rmjax.text.prompts import check_prompt_names


def next_token_logprobs(model: Model, prompts: dict[str, str], template: str = "auto") -> dict[str, np.ndarray]:
    """{prompt name: log-probs over the vocabulary} in one batched forward pass."""
    if model.config.is_reward_model:
        raise UsageError(f"{model.source} is a reward model; log-probs need a causal LM (*ForCausalLM).")
    rows = [
        list(chat.split_chat(model.tokenizer, text, template, model.config.max_position_embeddings, 0).prefix)
        for text in prompts.values()
    ]
    ids, mask = batching.pad_rows(rows, side="left", pad_id=model.config.pad_token_id or 0)
    lp = to_host(calls.next_token_log_probs(model, ids, mask))
    return dict(zip(prompts, lp, strict=False))


def logprobs_identity(model_fingerprint: dict, *, dtype: str, prompts: dict[str, str], template: str = "auto") -> dict:
    return {"job": "logprobs", "model": model_fingerprint, "dtype": dtype, "prompts": dict(prompts),
            "template": template}


@dataclasses.dataclass(frozen=True)
class LogprobsSpec:
    """A log-prob job as one value: a causal LM (options.model; it has no reward outputs) after each prompt."""

    options: RunOptions
    prompts: dict[str, str]


def run_logprobs(spec: LogprobsSpec) -> Path:
    """The logprobs job: identity (without loading the model) → claim options.out once → unless a finished result
    of the same inputs is there, load and compute → the CSV and its .meta.json. Returns the CSV's path."""
    o = spec.options
    check_prompt_names(spec.prompts, results.NON_VALUE_COLUMNS)
    if config_of(o.model).is_reward_model:  # from its config, before any weight loads
        raise UsageError(f"{o.model} is a reward model; log-probs need a causal LM (*ForCausalLM).")
    config, tokenizer = job_config_and_tokenizer(o)  # each prompt's room in the context, before the weights
    for text in spec.prompts.values():  # the prefix alone is read (no response: the plan's rule too)
        chat.split_chat(tokenizer, text, o.template, config.max_position_embeddings, 0)
    identity = logprobs_identity(job_fingerprint(o), dtype=o.dtype, prompts=spec.prompts, template=o.template)
    with claim_job(o, identity) as job:
        if not job.reuse:
            write_logprobs(load_for_job(o), spec.prompts, o.out, o.template, allow_nonfinite=o.allow_nonfinite,
                           job=job)
    return Path(o.out)


def write_logprobs(model: Model, prompts: dict[str, str], out: str | Path, template: str = "auto",
                   overwrite: bool = False, allow_nonfinite: bool = False, job: jobs.Job | None = None) -> Path:
    """CSV in the score-table schema (one log-prob column per prompt) plus .meta.json; `out` is claimed here
    unless `job` is its claim already (`run_logprobs`)."""
    check_prompt_names(prompts, results.NON_VALUE_COLUMNS)
    identity = logprobs_identity(model_fingerprint(model), dtype=model.dtype, prompts=prompts, template=template)
    with jobs.claimed(job, out, identity, allow_nonfinite=allow_nonfinite, overwrite=overwrite) as job:
        if job.reuse:
            return Path(out)
        lps = next_token_logprobs(model, prompts, template)
        ids, names, decoded = chat.token_table(model.tokenizer, model.config.vocab_size)
        # ids past the tokenizer (an embedding table padded beyond it) are no token: written as '', one ranked as a
        # response and every analysis read them as one shared string. Left out, as the sweep leaves them, and counted
        tokens = min(len(model.tokenizer), model.config.vocab_size)
        ids, names, decoded = ids[:tokens], names[:tokens], decoded[:tokens]
        lps = {name: values[:tokens] for name, values in lps.items()}
        rows = [chat.split_chat(model.tokenizer, t, template).prefix for t in prompts.values()]
        nonfinite = finite.check(np.stack(list(lps.values()), axis=1), what="log-probs", columns=list(lps),
                                 allow=allow_nonfinite, row=lambda i: f"token {i} ({decoded[i]!r})",
                                 explain=lambda i, j: finite.diagnose(model, rows[j]))
        return job.finish(lambda path: results.write_scores_csv(path, ids, names, decoded, lps),
                          **jobs.model_meta(model), allow_nonfinite=allow_nonfinite, prompts=prompts, template=template,
                          n_tokens=int(len(ids)), ids_past_the_tokenizer=int(model.config.vocab_size - tokens),
                          nonfinite=nonfinite)
