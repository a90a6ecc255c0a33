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

from rmjax import heads
from rmjax.errors import UsageError
from rmjax.loading.for_job import job_config_and_tokenizer, job_fingerprint, load_for_job
from rmjax.loading.identity import hash_json, model_fingerprint
from rmjax.model import Model, require_reward_model
from rmjax.parallel import batching
from rmjax.parallel.distributed import is_main, to_host
from rmjax.runs import jobs, results
from rmjax.runs.options import RunOptions, claim_job
from rmjax.runs.progress import Progress
from rmjax.scoring import calls, finite
from rmjax.scoring.context import prepare_prompt, score_tokens
from rmjax.scoring.prefix import prefill_prefix
from rmjax.text import chat
from rmjax.text.chat import Conversations
from rmjax.text.prompts import check_prompt_names

CACHED_PROMPT_ROWS = 16  # score_conversations: a prompt with this many responses gets its prefix cached
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
        p, head = len(self.prefix), self.model.config.head
        cached, full = collections.defaultdict(list), collections.defaultdict(list)
        for i, ids in enumerate(self.token_ids(responses)):
            _check_length(self.model, ids, responses[i])
            if len(ids) > p and ids[:p] == self.prefix and not heads.moves_gate(head, self.prefix, ids[p:]):
                cached[_bucket(len(ids) - p)].append((i, ids[p:]))
            else:
                full[_bucket(len(ids))].append((i, ids))
        return _batched(self.model, ((cached, True), (full, False)), compute, len(responses), width_out,
                        batch_size, _progress(len(responses)))


def _check_length(model: Model, ids: list[int], response: str) -> None:
    chat.check_response_fits(response, len(ids), model.config.max_position_embeddings)


def _progress(n: int) -> Progress | None:
    """Long passes (training features, EloEverything items, the audit's batteries) report rate and ETA."""
    return Progress(n, "score texts", unit="texts") if n >= 2000 else None


def _batched(model: Model, groups, compute, n: int, width_out: int, batch_size: int,
             progress: Progress | None = None) -> np.ndarray:
    """[n, width_out]: compute(ids, mask, cached) over each (rows by padded width, cached) group of `groups`, rows
    being (output index, ids), in batches of `batch_size` rows; `progress` counts the rows done."""
    out = np.zeros((n, width_out), np.float32)
    batch_size = batching.round_up(batch_size, model.mesh)

    def each():
        for by_width, with_cache in groups:
            for part in _cut(by_width, batch_size):
                width = _bucket(max(len(seq) for _, seq in part))
                # a short last batch pads only to the next power of two (few shapes, little waste)
                n_rows = min(batch_size, batching.round_up(1 << (len(part) - 1).bit_length(), model.mesh))
                ids, mask = batching.pad_rows([seq for _, seq in part], width, num_rows=n_rows)
                ids, mask = batching.place(ids, model.mesh), batching.place(mask, model.mesh)
                yield [i for i, _ in part], compute(ids, mask, with_cache)

    for index, values in batching.dispatched(each(), model.mesh, lambda entry: entry[1]):
        out[index] = to_host(values).reshape(-1, width_out)[: len(index)]
        if progress is not None:
            progress.update(len(index))
    return out


def _cut(by_width: dict, batch_size: int, alone: int = 16):
    """Rows shortest first in batches of up to `batch_size`, each padded to its longest row; a batch ends where the
    width grows once it holds `alone` rows. A width's few rows join the next width's batch: one short batch and one
    compilation fewer. For the default audit, 52 shapes -> 38 (SmolLM2), 51 -> 41 (Gemma 3) at the same padded
    tokens (+1.2%, -0.0%); pooling every width (16 shapes) padded 11% and 16% more."""
    part, width = [], None
    for w in sorted(by_width):
        for row in by_width[w]:
            if part and (len(part) == batch_size or (w != width and len(part) >= alone)):
                yield part
                part = []
            part.append(row)
            width = w
    if part:
        yield part


def conversation_groups(prompts: list[str], responses: list[str]
                        ) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Each distinct (prompt, response) once, by prompt in first-seen order, split as score_conversations scores
    them: (prompts with CACHED_PROMPT_ROWS responses or more, scored after their cached prefix; the rest, whole).
    One rule for the job and its plan (rmjax.plan.spec)."""
    by_prompt: dict[str, list[str]] = {}
    for prompt, response in dict.fromkeys(zip(prompts, responses, strict=True)):
        by_prompt.setdefault(prompt, []).append(response)
    cached = {p: rs for p, rs in by_prompt.items() if len(rs) >= CACHED_PROMPT_ROWS}  # rows enough to pay a prefill
    return cached, {p: rs for p, rs in by_prompt.items() if p not in cached}


def score_conversations(model: Model, prompts: list[str], responses: list[str], template: str = "auto",
                        batch_size: int = 256, allow_nonfinite: bool = False, has_flag: bool = True) -> np.ndarray:
    """Reward of each (prompt, response) row, [N] float32, each distinct conversation scored once (the audit's name
    axes share all theirs: 18% of identity): a prompt with CACHED_PROMPT_ROWS responses or more scores them against
    its cached prefix (TextScorer); the rest (the audit's identity-in-prompt and sycophancy items: many prompts, a
    few responses each) run whole, batched across prompts. NaN/Inf stop it unless allowed; `has_flag`: the refusal
    names --allow_nonfinite (the audit, which refuses that flag, passes False)."""
    require_reward_model(model.config, model.source, "conversation scoring")
    if len(prompts) != len(responses):
        raise ValueError(f"{len(prompts)} prompts for {len(responses)} responses.")
    cached, rest = conversation_groups(prompts, responses)
    distinct = list(dict.fromkeys(zip(prompts, responses, strict=True)))  # rows' order: a refusal names the first
    at = {pair: k for k, pair in enumerate(distinct)}
    full, out = collections.defaultdict(list), np.zeros(len(distinct), np.float32)
    progress = _progress(len(distinct))
    for prompt, texts in cached.items():
        out[[at[prompt, r] for r in texts]] = TextScorer(model, prompt, template).score(texts, batch_size)
        if progress is not None:
            progress.update(len(texts))
    for prompt, texts in rest.items():
        conversations = Conversations(model.tokenizer, prompt, template, False, model.config.max_position_embeddings)
        for response, ids in zip(texts, conversations.token_ids(texts), strict=True):
            _check_length(model, ids, response)
            full[_bucket(len(ids))].append((at[prompt, response], ids))

    def reward(ids, mask, cached: bool):
        return calls.rewards(model, ids, mask)[:, model.output_column]

    whole = _batched(model, ((full, False),), reward, len(distinct), 1, batch_size, progress)[:, 0]
    scored_whole = [i for rows in full.values() for i, _ in rows]
    out[scored_whole] = whole[scored_whole]
    finite.check(out[:, None], what="rewards", columns=["reward"], allow=allow_nonfinite, has_flag=has_flag,
                 row=lambda i: f"prompt {distinct[i][0]!r}, response {distinct[i][1]!r}")
    return out[[at[pair] for pair in zip(prompts, responses, strict=True)]]


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
                         texts: list[str], template: str = "auto", z_sample: int = 0) -> dict:
    """What a score CSV depends on; `z_sample` too, since its .meta.json records the z scale drawn from it."""
    return {"job": "score", "model": model_fingerprint, "dtype": dtype, "output_column": int(output_column),
            "prompts": dict(prompts), "texts": hash_json(list(texts)), "n_texts": len(texts), "template": template,
            "z_sample": int(z_sample)}


@dataclasses.dataclass(frozen=True)
class ScoreSpec:
    """A text-scoring job as one value: the responses scored after each prompt, `batch_size` per forward pass;
    options.out None writes nothing (an ad-hoc look); `z_sample` single tokens (0: none) give each prompt's scale
    for z-scores (finite.sampled_yardstick, the frontier's)."""

    options: RunOptions
    prompts: dict[str, str]
    texts: tuple[str, ...]
    batch_size: int = 256
    z_sample: int = 2048


@dataclasses.dataclass
class Scored:
    """What `run_score` found: {prompt: reward of each text}, {prompt: (mean, SD) of the single-token sample} or
    None, and the CSV written (None without --out)."""

    scores: dict[str, np.ndarray]
    scale: dict[str, finite.Scale] | None
    out: Path | None


def check_z_sample(z_sample: int) -> None:
    """An SD needs two tokens: refused by the job and from its flags alone (where a launch reads its line)."""
    if z_sample == 1 or z_sample < 0:
        raise UsageError(f"--z_sample={z_sample}: give 0 (no z-scores) or at least 2 tokens (an SD needs 2).")


def refuse_repeated_texts(texts: list[str] | tuple[str, ...]) -> None:
    """A written table's rows are keyed by their text: two alike would be one response twice (refused by the job
    with --out, and from --texts alone where a launch reads its line)."""
    texts = list(texts)
    repeated = [t for t, n in collections.Counter(texts).items() if n > 1]
    if repeated:
        raise UsageError(f"the response {repeated[0]!r} is given {texts.count(repeated[0])} times"
                         f"{f' ({len(repeated)} responses repeat)' if len(repeated) > 1 else ''}; give each once.")


def run_score(spec: ScoreSpec) -> Scored:
    """The score job: identity (without loading the model) → with options.out, claim it once → unless a finished
    result of the same inputs is there, load and score → the CSV and its .meta.json (recording the z scale).
    Without options.out nothing is claimed or written."""
    o, texts = spec.options, list(spec.texts)
    check_prompt_names(spec.prompts, results.NON_VALUE_COLUMNS)
    check_z_sample(spec.z_sample)
    config, tokenizer = job_config_and_tokenizer(o)  # the kind of model and each prompt's room, before the weights
    require_reward_model(config, o.model, "text scoring", o.output_column, o.column_chosen)
    for text in spec.prompts.values():  # a response past the context too (as scoring would, after loading)
        Conversations(tokenizer, text, o.template, False, config.max_position_embeddings).check_fit(
            texts, config.max_position_embeddings, "; score a shorter response (or leave it out)")
    if o.out is None:
        model = load_for_job(o)
        scores, _ = _scored(model, spec.prompts, texts, o.template, spec.batch_size, False, o.allow_nonfinite)
        return Scored(scores, z_scale(model, spec.prompts, spec.z_sample, o.template, spec.batch_size,
                                      o.allow_nonfinite), None)
    refuse_repeated_texts(texts)
    identity = text_scores_identity(job_fingerprint(o), dtype=o.dtype, prompts=spec.prompts, texts=texts,
                                    output_column=o.output_column, template=o.template, z_sample=spec.z_sample)
    with claim_job(o, identity) as job:
        if not job.reuse:
            write_text_scores(load_for_job(o), spec.prompts, texts, o.out, o.template, spec.batch_size,
                              allow_nonfinite=o.allow_nonfinite, job=job, z_sample=spec.z_sample)
    if not is_main():
        return Scored({}, None, Path(o.out))
    table = results.read_scores_csv(o.out)
    recorded = (results.read_meta(o.out) or {}).get("z_scale")
    scale = {name: tuple(v) for name, v in recorded.items()} if recorded else None
    return Scored({name: table[name].to_numpy(np.float64) for name in spec.prompts}, scale, Path(o.out))


def z_scale(model: Model, prompts: dict[str, str], z_sample: int, template: str = "auto", batch_size: int = 256,
            allow_nonfinite: bool = False) -> dict[str, finite.Scale] | None:
    """{prompt: (mean, SD)} of the rewards of `z_sample` single tokens (finite.sampled_yardstick); None for 0."""
    if not z_sample:
        return None
    vocab = min(model.config.vocab_size, len(model.tokenizer))
    out = {}
    for name, text in prompts.items():
        ctx = prepare_prompt(model, name, text, template)
        out[name] = finite.sampled_yardstick(
            vocab, z_sample, lambda tokens, ctx=ctx: score_tokens(model, ctx, tokens, batch_size),
            allow=allow_nonfinite,
            fix="raise --z_sample (an RM that scores every token alike gives z-scores no scale), or pass "
                "--z_sample=0")
    return out


def write_text_scores(model: Model, prompts: dict[str, str], texts: list[str], out: str | Path,
                      template: str = "auto", batch_size: int = 256, overwrite: bool = False,
                      allow_nonfinite: bool = False, job: jobs.Job | None = None, z_sample: int = 0) -> Path:
    """`text, <one column per prompt>` CSV + .meta.json (reused when a finished one has the same identity; with
    `z_sample`, its z_scale: each prompt's (mean, SD) of single-token rewards); `out` is claimed here unless `job`
    is its claim already (`run_score`)."""
    check_prompt_names(prompts, results.NON_VALUE_COLUMNS)
    identity = text_scores_identity(model_fingerprint(model), dtype=model.dtype, prompts=prompts, texts=texts,
                                    output_column=model.output_column, template=template, z_sample=z_sample)
    with jobs.claimed(job, out, identity, allow_nonfinite=allow_nonfinite, overwrite=overwrite) as job:
        if job.reuse:
            return Path(out)
        scores, nonfinite = _scored(model, prompts, texts, template, batch_size, False, allow_nonfinite)
        scale = z_scale(model, prompts, z_sample, template, batch_size, allow_nonfinite)  # after: texts' NaN first
        return job.finish(lambda path: results.write_table(path, {"text": texts}, scores), **jobs.model_meta(model),
                          allow_nonfinite=allow_nonfinite, prompts=prompts, n_texts=len(texts), nonfinite=nonfinite,
                          **({"z_scale": scale, "z_sampled": {name: s.record() for name, s in scale.items()}}
                             if scale else {}))
