"""Next-token log-probs of a causal LM after a prompt: the papers' base-model analysis."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rmjax import model as M
from rmjax.errors import UsageError
from rmjax.loading.identity import model_fingerprint
from rmjax.model import Model
from rmjax.parallel import batching
from rmjax.runs import jobs, results
from rmjax.scoring import finite
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
    lp = np.asarray(M.next_token_log_probs(model.params, model.config, ids, mask))
    return dict(zip(prompts, lp, strict=False))


def logprobs_identity(model_fingerprint: dict, *, dtype: str, prompts: dict[str, str], template: str = "auto") -> dict:
    return {"job": "logprobs", "model": model_fingerprint, "dtype": dtype, "prompts": dict(prompts),
            "template": template}


def write_logprobs(model: Model, prompts: dict[str, str], out: str | Path, template: str = "auto",
                   overwrite: bool = False, allow_nonfinite: bool = False) -> Path:
    """CSV in the score-table schema (one log-prob column per prompt) plus .meta.json."""
    check_prompt_names(prompts, results.NON_VALUE_COLUMNS)
    identity = logprobs_identity(model_fingerprint(model), dtype=model.dtype, prompts=prompts, template=template)
    with jobs.job(out, identity, "next_token_logprobs", overwrite=overwrite) as job:
        if job.reuse:
            return Path(out)
        lps = next_token_logprobs(model, prompts, template)
        ids, names, decoded = chat.token_table(model.tokenizer, model.config.vocab_size)
        rows = [chat.split_chat(model.tokenizer, t, template).prefix for t in prompts.values()]
        nonfinite = finite.check(np.stack(list(lps.values()), axis=1), what="log-probs", columns=list(lps),
                                 allow=allow_nonfinite, row=lambda i: f"token {i} ({decoded[i]!r})",
                                 explain=lambda i, j: finite.diagnose(model, rows[j]))
        return job.finish(lambda path: results.write_scores_csv(path, ids, names, decoded, lps),
                          **jobs.model_meta(model), prompts=prompts, template=template, n_tokens=int(len(ids)),
                          nonfinite=nonfinite)
