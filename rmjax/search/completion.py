"""The completion check of a search's written responses: a prior LM continues each response greedily (argmax) until
its most likely next token ends the turn, at most `max_new` tokens, and the reward model scores the completed text
as `experiments.score` would (rmjax.scoring.texts.score_texts).

The prompt's prefix (all but its last token) is prefilled once and shared by every row; the rows, the prefix's last
token + response, are left-padded into one [rows, width] batch after it (positions count only real tokens, so the
padding shifts no RoPE and is masked as a key) and prefilled into a cache of prefix + width + max_new slots; each step
writes one new position into the next slot (a `lax.while_loop`: one compiled step, stopped as soon as every row has
ended; a row that ended keeps stepping, its further tokens ignored). Prefilling the prompt per row cost the
disagreement job most of its completion time (42 prompt tokens against a response's 4).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rmjax import nn
from rmjax.compiled import PARAMS, REPLICATED, ROWS, Cache, compiled, declared_params
from rmjax.config import ModelConfig
from rmjax.errors import PromptTooLongError, UsageError
from rmjax.loading.for_job import job_config_and_tokenizer
from rmjax.model import Model
from rmjax.parallel import batching
from rmjax.parallel.distributed import replicated, to_host
from rmjax.scoring.prefix import prefill_prefix
from rmjax.scoring.prior import require_lm_head
from rmjax.scoring.texts import score_texts
from rmjax.search import turns
from rmjax.text.chat import split_chat

WIDTH_BUCKET = 16  # rows are left-padded to a multiple of this: few compilations
BATCH_SIZE = 64  # responses continued in one call (check_written's; a plan counts the same: rmjax.plan.calls)
SCORED_BATCH_SIZE = 256  # completed texts the RM scores in one call
MAX_NEW = 32  # the completion check's greedy tokens at most (every job's)


@dataclasses.dataclass
class Completions:
    """Each written response, completed by the prior's greedy continuation and scored by the reward model."""

    ends_turn: np.ndarray  # [W] bool: the prior's most likely next token after the response is the end of turn
    completed_ids: list[list[int]]  # response + greedy continuation (end of turn not included); the response if it ends
    completed_text: list[str]  # decoded; each starts with the response's own decoded text
    completed_reward: np.ndarray  # [W] float64: the RM's reward of completed_text as a response to the prompt


def _argmax(logits):
    """The most likely token; a NaN logit is no evidence of that (jnp.argmax would pick it): read as −inf."""
    return jnp.argmax(jnp.where(jnp.isnan(logits), -jnp.inf, logits), axis=-1).astype(jnp.int32)


def _greedy(cfg: ModelConfig, params, prefix: nn.KVCache, ids, mask, end_id, *, max_new: int):
    """The argmax next token after each left-padded row [B, T] (read after the one-row `prefix` cache) and after
    each of its greedy continuations: [B, max_new] int32, filled with `end_id` past the step at which every row had
    predicted it."""
    model = nn.module(params, cfg)
    rows, width = ids.shape
    out = model(ids=ids, mask=mask, cache=prefix)
    first = _argmax(model.lm_logits(out.hidden[:, -1]))
    cache = prefix.append(out.kv).with_free_slots(max_new)
    width += prefix.positions.shape[1]
    preds = jnp.full((rows, max_new), end_id, jnp.int32).at[:, 0].set(first)
    done = (first == end_id) | ~mask.any(axis=1)  # all-padding rows never hold the loop

    def running(state):
        step, _, _, done = state
        return (step < max_new) & ~jnp.all(done)

    def step_once(state):
        step, cache, preds, done = state
        new = model(ids=preds[:, step - 1, None], cache=cache)
        cache = cache.write(new.kv, width + step - 1)  # the fed token's slot
        token = _argmax(model.lm_logits(new.hidden[:, -1]))
        token = jnp.where(done, end_id, token)  # a row that ended stays ended
        return step + 1, cache, preds.at[:, step].set(token), done | (token == end_id)

    return jax.lax.while_loop(running, step_once, (jnp.int32(1), cache, preds, done))[2]


def greedy_call(cfg: ModelConfig, mesh, prefix_width: int, max_new: int):
    """The compiled `_greedy` after a one-row prefix cache of `prefix_width` positions (what a plan lowers too)."""
    return compiled(_greedy, cfg, mesh, (PARAMS, Cache(1, prefix_width), ROWS(2), ROWS(2), REPLICATED), ROWS(2),
                    max_new=max_new)


def greedy_continuations(prior: Model, prefix: Sequence[int], end_id: int, responses: list[list[int]],
                         max_new: int = MAX_NEW, batch_size: int = BATCH_SIZE) -> tuple[np.ndarray, list[list[int]]]:
    """ends_turn [W] bool (the prior's argmax after prefix + response is `end_id`) and the tokens the prior adds to
    each response greedily before its argmax is `end_id`, at most `max_new` (empty when it ends). Batches of up to
    `batch_size` rows, each prefilled once and decoded into its KV cache's free slots in one compiled call."""
    require_lm_head(prior)
    if max_new < 1:
        raise UsageError(f"max_new must be at least 1, not {max_new}.")
    prefix, responses = [int(t) for t in prefix], [[int(t) for t in r] for r in responses]
    context = prior.config.max_position_embeddings
    for i, response in enumerate(responses):
        if len(prefix) + len(response) + max_new > context:
            raise PromptTooLongError(f"response {i} needs {len(prefix) + len(response) + max_new} positions (prefix "
                                     f"{len(prefix)} + response {len(response)} + {max_new} new tokens) but the "
                                     f"prior's context is {context} (max_position_embeddings).")
    if len(prefix) < 2:
        raise UsageError(f"the completion check continues a response after the prompt's template prefix, which is "
                         f"{len(prefix)} token{'' if len(prefix) == 1 else 's'} here; give a chat or plain template.")
    batch_size = batching.round_up(batch_size, prior.mesh)
    params, end = declared_params(prior), replicated(np.int32(end_id), prior.mesh)
    shared = prefill_prefix(prior, prefix[:-1])

    def each():
        for start in range(0, len(responses), batch_size):
            part = [prefix[-1:] + r for r in responses[start : start + batch_size]]
            rows = batching.decode_rows(len(part), batch_size, prior.mesh)
            width = batching.bucket(max(len(r) for r in part), WIDTH_BUCKET)
            ids, mask = batching.pad_rows(part, width, side="left", num_rows=rows)
            call = greedy_call(prior.config, prior.mesh, shared.positions.shape[1], max_new)
            yield len(part), call(params, shared, batching.place(ids, prior.mesh), batching.place(mask, prior.mesh),
                                  end)

    pending = batching.dispatched(each(), prior.mesh, lambda entry: entry[1])
    preds = np.concatenate([to_host(p)[:n] for n, p in pending]) if pending else np.zeros((0, max_new), np.int32)
    ends = preds == end_id
    stops = np.where(ends.any(axis=1), ends.argmax(axis=1), max_new)
    return ends[:, 0].copy(), [row[:stop].tolist() for row, stop in zip(preds, stops, strict=True)]


def complete_responses(rm: Model, prior: Model, prompt: str, responses: list[list[int]], template: str = "auto",
                       max_new: int = MAX_NEW, batch_size: int = BATCH_SIZE,
                       allow_nonfinite: bool = False) -> Completions:
    """Each response completed by the prior's greedy continuation up to the end of the turn (the first token of the
    template's text after the response, e.g. `<|im_end|>`), and the RM's reward of the completed text for `prompt`
    (score_texts: what experiments.score writes; a NaN/Inf reward raises NonFiniteError unless `allow_nonfinite`,
    the job's --allow_nonfinite)."""
    split = split_chat(prior.tokenizer, prompt, template)
    end = turns.end_of_turn(split.suffix, prior.tokenizer, prior.source)  # plain: the newline before `User:`
    ends, added = greedy_continuations(prior, split.prefix, end, responses, max_new, batch_size)
    decode = rm.tokenizer.decode
    ids, texts = [], []
    for response, more in zip(responses, added, strict=True):
        response = [int(t) for t in response]
        text = decode(response)
        whole = decode(response + more) if more else text
        ids.append(response + more)
        texts.append(whole if whole.startswith(text) else text + decode(more))
    rewards = score_texts(rm, {"completed": prompt}, texts, template, SCORED_BATCH_SIZE,
                          allow_nonfinite=allow_nonfinite)["completed"] if texts else np.zeros(0)
    return Completions(ends, ids, texts, np.asarray(rewards, np.float64))


def check_completion_room(tokenizer, config: ModelConfig, prompts, template: str, response_tokens: int,
                          who: str, fix: str, max_new: int = MAX_NEW) -> None:
    """Before any weight loads: each prompt's templated prefix, a response of `response_tokens` and the `max_new`
    tokens the completion check may add fit the prior's context (`config`, `tokenizer`: as the job loads it).
    greedy_continuations refuses it only once the search has run, and a rerun resumes into the same refusal."""
    context = config.max_position_embeddings
    for prompt in prompts:
        prefix = len(split_chat(tokenizer, prompt, template).prefix)
        need = prefix + response_tokens + max_new
        if need > context:
            raise PromptTooLongError(
                f"prompt {prompt[:40]!r}: the completion check of the written rows needs {need} of {who}'s {context} "
                f"positions (max_position_embeddings): its templated prompt {prefix}, the response {response_tokens} "
                f"and up to {max_new} tokens it adds; {fix}.")


def check_completion_before_loading(options, model: str, lm: str | None, prompts, template: str,
                                    response_tokens: int, fix: str) -> None:
    """check_completion_room for the prior completion_prior will pick: --lm, else the RM `model` where its backbone
    ties its embeddings (otherwise the check is skipped, and so is this), read as the job loads it."""
    spec = lm or model
    config, tokenizer = job_config_and_tokenizer(options, spec)
    if tokenizer is None or (lm is None and config.is_reward_model and not config.tie_embeddings):
        return
    who = f"the prior --lm={lm}" if lm else f"{model} (its own prior)"
    check_completion_room(tokenizer, config, prompts, template, response_tokens, who, fix)


def require_prior_config(cfg: ModelConfig, source: str, flag: str, given: bool = True) -> None:
    """A model named by `flag` (--lm, --judge) must give next-token log-probs: refused in one line before it
    loads when it is a reward model whose backbone's untied LM head was dropped. Not `given`: `source` is the
    flag's default (the RM), which the line says rather than name a flag the user never gave."""
    if cfg.is_reward_model and not cfg.tie_embeddings:
        named = f"{flag}={source}" if given else f"{source}, the default {flag} (not given),"
        raise UsageError(f"{named} has no LM head (a reward model whose backbone's untied LM head was dropped); "
                         f"give {flag}=a causal LM{' with the same tokenizer' if flag == '--lm' else ''}.")


def same_tokenizer(rm: Model, lm: Model) -> None:
    """The prior reads the RM's token ids: another vocabulary is refused in one line."""
    if lm is not rm:
        require_same_vocabulary(rm.tokenizer, rm.source, lm.tokenizer, lm.source)


def require_same_vocabulary(rm_tokenizer, rm_source: str, lm_tokenizer, lm_source: str) -> None:
    """`same_tokenizer` from the two tokenizers alone, so a job refuses --lm before any weight loads."""
    if rm_tokenizer.get_vocab() != lm_tokenizer.get_vocab():
        raise UsageError(f"--lm={lm_source} has another tokenizer than {rm_source} ({len(lm_tokenizer)} vs "
                         f"{len(rm_tokenizer)} tokens, or other ids): the prior must read the RM's token ids; give "
                         "an LM of the RM's family and tokenizer.")


def completion_prior(rm: Model, lm: Model | None) -> tuple[Model | None, str | None]:
    """The LM that completes a job's written responses: --lm, else the RM's own backbone when it ties its
    embeddings (its LM head is the embedding table); else none, and why (the job records that it skipped)."""
    if lm is not None:
        same_tokenizer(rm, lm)
        return lm, None
    try:
        require_lm_head(rm)
    except UsageError as e:
        return None, f"skipped: {e}"
    return rm, None


COMPLETION_VALUES = ("reward", "completed_reward", "truncation_gain")


def check_written(rm: Model, prior: Model, prompts: dict[str, str], responses: list[list[int]], rewards: np.ndarray,
                  signs: np.ndarray, template: str = "auto", max_new: int = MAX_NEW, allow_nonfinite: bool = False
                  ) -> dict[str, list]:
    """The completion check of a job's written rows (beam, exhaustive, GCG): for each response [W] and prompt (the
    rewards [W, prompts] the job wrote, the direction's sign [W]), ends_turn, completed_text, completed_reward and
    the truncation gain sign · (reward − completed_reward) in the RM's reward units; each distinct response is
    completed once per prompt. Columns of W × prompts rows (row-major: a response's prompts together), `row` the
    response's index."""
    rewards, signs = np.asarray(rewards, np.float64).reshape(len(responses), len(prompts)), np.asarray(signs)
    distinct = sorted({tuple(int(t) for t in r) for r in responses})
    table: dict[str, list] = {k: [] for k in ("row", "prompt", "ends_turn", "completed_text", *COMPLETION_VALUES)}
    done = {name: complete_responses(rm, prior, text, [list(d) for d in distinct], template, max_new,
                                     allow_nonfinite=allow_nonfinite)
            for name, text in prompts.items()} if distinct else {}
    at = {d: i for i, d in enumerate(distinct)}
    for i, response in enumerate(responses):
        j = at[tuple(int(t) for t in response)]
        for p, name in enumerate(prompts):
            got = done[name]
            table["row"].append(i)
            table["prompt"].append(name)
            table["ends_turn"].append(int(got.ends_turn[j]))
            table["completed_text"].append(got.completed_text[j])
            table["reward"].append(float(rewards[i, p]))
            table["completed_reward"].append(float(got.completed_reward[j]))
            table["truncation_gain"].append(float(signs[i] * (rewards[i, p] - got.completed_reward[j])))
    return table


def gains_summary(table: dict[str, list], groups: list[str]) -> dict:
    """Per group (one label per row of `table`, e.g. the direction): rows, the median truncation gain (reward
    units) and the share of responses that end where the prior would end the turn."""
    out = {}
    for group in sorted(set(groups)):
        mine = [i for i, g in enumerate(groups) if g == group]
        gains = np.asarray([table["truncation_gain"][i] for i in mine], np.float64)
        finite = gains[np.isfinite(gains)]  # NaN/Inf only with --allow_nonfinite: counted, not averaged
        out[group] = {"rows": len(mine), "nonfinite": int(len(gains) - len(finite)),
                      "median_truncation_gain": float(np.median(finite)) if len(finite) else None,
                      "ends_turn": float(np.mean([table["ends_turn"][i] for i in mine]))}
    return out
