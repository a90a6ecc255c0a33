"""Score arbitrary response strings for a prompt (EloEverything items, dictionary words, GCG text).

Each response is placed in the chat template and the whole conversation re-tokenized, as the
published pipeline did (so the template's whitespace trimming and any multi-token
re-tokenization apply). Rows whose ids start with the shared prefix reuse its KV cache and run
only the remainder; rows that tokenize differently across the boundary run the full sequence.
"""

from __future__ import annotations

import collections
import dataclasses
from pathlib import Path

import numpy as np

from rmjax.errors import PromptTooLongError
from rmjax.loading import fingerprint
from rmjax.loading.for_job import load_for_job
from rmjax.loading.identity import hash_json, model_fingerprint
from rmjax.model import Model, require_reward_model
from rmjax.parallel import batching
from rmjax.parallel.distributed import to_host
from rmjax.runs import jobs, results
from rmjax.runs.options import RunOptions, claim_job
from rmjax.runs.progress import Progress
from rmjax.scoring import calls, finite
from rmjax.scoring.prefix import prefill_prefix
from rmjax.text.chat import Conversations
from rmjax.text.prompts import check_prompt_names

LENGTH_BUCKET = 4  # remainders are right-padded to a multiple of this (few compilations)


def _bucket(n: int) -> int:
    return batching.bucket(n, LENGTH_BUCKET)


class TextScorer(Conversations):
    """Scores response strings for one prompt against its cached prefix."""

    def __init__(self, model: Model, prompt: str, template: str = "auto", add_special_tokens: bool = False):
        super().__init__(model.tokenizer, prompt, template, add_special_tokens, model.config.max_position_embeddings)
        self.model = model
        self.cache = prefill_prefix(model, self.prefix)

    def score(self, responses: list[str], batch_size: int = 256) -> np.ndarray:
        """Reward of each response: [N] float32."""
        require_reward_model(self.model.config, self.model.source, "text scoring")
        model, cache = self.model, self.cache

        def reward(ids, mask, cached: bool):
            out = calls.rewards_after(model, cache, ids, mask) if cached else calls.rewards(model, ids, mask)
            return out[:, model.output_column]

        return self._run(responses, batch_size, reward, 1)[:, 0]

    def features(self, responses: list[str], batch_size: int = 256) -> np.ndarray:
        """Final hidden state at the last token of each conversation: [N, hidden] float32 (for head training)."""
        model, cache = self.model, self.cache

        def hidden(ids, mask, cached: bool):
            return calls.last_hidden_after(model, cache, ids, mask) if cached else calls.last_hidden(model, ids, mask)

        return self._run(responses, batch_size, hidden, model.config.hidden_size)

    def _run(self, responses: list[str], batch_size: int, compute, width_out: int) -> np.ndarray:
        """compute(ids, mask, cached) -> [B, width_out] over batches grouped by length and cache use."""
        model, p = self.model, len(self.prefix)
        max_pos = model.config.max_position_embeddings
        out = np.zeros((len(responses), width_out), np.float32)
        cached, full = collections.defaultdict(list), collections.defaultdict(list)
        for i, ids in enumerate(self.token_ids(responses)):
            if len(ids) > max_pos:
                raise PromptTooLongError(f"response {responses[i][:40]!r} makes {len(ids)} tokens, more than the "
                                         f"model's context of {max_pos} (max_position_embeddings).")
            if len(ids) > p and ids[:p] == self.prefix:
                cached[_bucket(len(ids) - p)].append((i, ids[p:]))
            else:
                full[_bucket(len(ids))].append((i, ids))
        batch_size = batching.round_up(batch_size, model.mesh)
        # Long passes (training features, EloEverything items) report rate and ETA.
        progress = Progress(len(responses), "score texts", unit="texts") if len(responses) >= 2000 else None
        for groups, with_cache in ((cached, True), (full, False)):
            for width, rows in sorted(groups.items()):
                for start in range(0, len(rows), batch_size):
                    part = rows[start : start + batch_size]
                    # a short last batch pads only to the next power of two (few shapes, little waste)
                    n_rows = min(batch_size, batching.round_up(1 << (len(part) - 1).bit_length(), model.mesh))
                    ids, mask = batching.pad_rows([seq for _, seq in part], width, num_rows=n_rows)
                    ids, mask = batching.place(ids, model.mesh), batching.place(mask, model.mesh)
                    values = to_host(compute(ids, mask, with_cache)).reshape(n_rows, width_out)
                    out[[i for i, _ in part]] = values[: len(part)]
                    if progress is not None:
                        progress.update(len(part))
        return out


def score_texts(model: Model, prompts: dict[str, str], texts: list[str], template: str = "auto",
                batch_size: int = 256, add_special_tokens: bool = False,
                allow_nonfinite: bool = False) -> dict[str, np.ndarray]:
    """{prompt name: reward of each text as the assistant response}; NaN/Inf stop it unless allowed."""
    return _scored(model, prompts, texts, template, batch_size, add_special_tokens, allow_nonfinite)[0]


def _scored(model: Model, prompts: dict[str, str], texts: list[str], template: str, batch_size: int,
            add_special_tokens: bool, allow_nonfinite: bool) -> tuple[dict[str, np.ndarray], dict | None]:
    """(scores, the non-finite record for .meta.json or None)."""
    scorers = {name: TextScorer(model, text, template, add_special_tokens) for name, text in prompts.items()}
    scores = {name: sc.score(texts, batch_size) for name, sc in scorers.items()}
    names = list(scores)
    record = finite.check(np.stack([scores[n] for n in names], axis=1), what="rewards", columns=names,
                          allow=allow_nonfinite, row=lambda i: f"text {texts[i]!r}",
                          explain=lambda i, j: finite.diagnose(model, scorers[names[j]].token_ids([texts[i]])[0]))
    return scores, record


def text_scores_identity(model_fingerprint: dict, *, dtype: str, output_column: int, prompts: dict[str, str],
                         texts: list[str], template: str = "auto") -> dict:
    return {"job": "score", "model": model_fingerprint, "dtype": dtype, "output_column": int(output_column),
            "prompts": dict(prompts), "texts": hash_json(list(texts)), "n_texts": len(texts), "template": template}


@dataclasses.dataclass(frozen=True)
class ScoreSpec:
    """A text-scoring job as one value: the responses scored after each prompt, `batch_size` per forward pass."""

    options: RunOptions
    prompts: dict[str, str]
    texts: tuple[str, ...]
    batch_size: int = 256


def run_score(spec: ScoreSpec) -> Path:
    """The score job: identity (without loading the model) → claim options.out once → unless a finished result of
    the same inputs is there, load and score → the CSV and its .meta.json. Returns the CSV's path."""
    o, texts = spec.options, list(spec.texts)
    check_prompt_names(spec.prompts, results.NON_VALUE_COLUMNS)
    identity = text_scores_identity(fingerprint(o.model), dtype=o.dtype, prompts=spec.prompts, texts=texts,
                                    output_column=o.output_column, template=o.template)
    with claim_job(o, identity) as job:
        if not job.reuse:
            write_text_scores(load_for_job(o), spec.prompts, texts, o.out, o.template, spec.batch_size,
                              allow_nonfinite=o.allow_nonfinite, job=job)
    return Path(o.out)


def write_text_scores(model: Model, prompts: dict[str, str], texts: list[str], out: str | Path,
                      template: str = "auto", batch_size: int = 256, overwrite: bool = False,
                      allow_nonfinite: bool = False, job: jobs.Job | None = None) -> Path:
    """`text, <one column per prompt>` CSV + .meta.json (reused when a finished one has the same identity);
    `out` is claimed here unless `job` is its claim already (`run_score`)."""
    check_prompt_names(prompts, results.NON_VALUE_COLUMNS)
    identity = text_scores_identity(model_fingerprint(model), dtype=model.dtype, prompts=prompts, texts=texts,
                                    output_column=model.output_column, template=template)
    with jobs.claimed(job, out, identity, overwrite=overwrite) as job:
        if job.reuse:
            return Path(out)
        scores, nonfinite = _scored(model, prompts, texts, template, batch_size, False, allow_nonfinite)
        return job.finish(lambda path: results.write_table(path, {"text": texts}, scores), **jobs.model_meta(model),
                          allow_nonfinite=allow_nonfinite, prompts=prompts, n_texts=len(texts), nonfinite=nonfinite)
