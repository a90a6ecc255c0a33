"""Greedy Coordinate Gradient over an N-token response, maximizing or minimizing a reward.

Objective: the mean reward of `prefix + response + suffix` over one or more (reward model,
prompt) targets. The loss is `-sign * reward` (sign +1 optimal, -1 pessimal) and both the
gradient and the candidate selection minimize that same loss (the reference fork used the
maximizing gradient for pessimal search). The prefix K/V of every target is computed once and
reused for gradients and candidate evaluation.

This module is the loop: the targets, the gradient, the evaluation and `gcg()`. The config and
memory plan are in gcg_config, the swaps and the candidate filter in gcg_swaps, the start in
gcg_start, and the job (identity, writing) in gcg_job.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from rmjax import heads, nn
from rmjax.compiled import PARAMS, REPLICATED, Cache, Compiled, compiled, declared_params
from rmjax.errors import NonFiniteError
from rmjax.model import Model, require_reward_model
from rmjax.nn import ops
from rmjax.parallel.distributed import is_main, replicated, to_host
from rmjax.runs.progress import Progress, duration
from rmjax.scoring import finite
from rmjax.scoring.prefix import append_kv, extend_prefix, prefill_prefix, score_responses, score_variants
from rmjax.search.gcg_config import GCGConfig, check_context
from rmjax.search.gcg_start import banned_tokens, start_sequences
from rmjax.search.gcg_swaps import (
    RetokenizationCheck,
    describe_filter,
    filter_advice,
    filter_candidates,
    removed_by_filter,
    sample_candidates,
    swap_scores,
)
from rmjax.text import chat
from rmjax.text.chat import Conversations


@dataclasses.dataclass(frozen=True, eq=False)
class Target:
    """One (reward model, prompt) term of the objective, whole when `make_target` builds it: the prompt's ids
    before and after the response, the K/V of the prefix, and the suffix once more as a device array (replicated
    over the model's mesh) for the jitted scorers; the host tuple serves the packed variants, the context check
    and the re-tokenization filter. Compared and hashed by identity (a model and device arrays have no value
    equality)."""

    model: Model
    prompt: str
    prefix: tuple[int, ...]
    suffix: tuple[int, ...]
    cache: nn.KVCache
    suffix_ids: jax.Array


@dataclasses.dataclass
class GCGResult:
    best_ids: list[int]
    best_text: str
    best_reward: float
    history: list[dict]
    buffer: list[tuple[float, list[int]]]
    seconds: float
    nonfinite_candidates: int = 0  # dropped with allow_nonfinite
    nonfinite_swaps: int = 0  # (position, token) gradient entries NaN/Inf, never proposed (allow_nonfinite)


def make_target(model: Model, prompt: str, template: str = "auto", prefix=None, suffix=None) -> Target:
    if prefix is None:
        split = chat.split_chat(model.tokenizer, prompt, template, model.config.max_position_embeddings)
        prefix, suffix = split.prefix, split.suffix
    require_reward_model(model.config, model.source, "GCG")
    prefix, suffix = tuple(prefix), tuple(suffix or ())
    return Target(model, prompt, prefix, suffix, cache=prefill_prefix(model, prefix),
                  suffix_ids=replicated(jnp.asarray(suffix, jnp.int32), model.mesh))


def one_hot_forward(model, cache: nn.KVCache, one_hot, ids, suffix):
    """The forward of the cached prefix + (one_hot @ E) + suffix, differentiable in the one-hot matrix [N, V]
    (one_hot(ids)): its final-normed hidden states [1, N + S, H] and K/V."""
    table = model.embed.embedding[...]
    embeds = jnp.concatenate([ops.one_hot_rows(one_hot, table, ids), jnp.take(table, suffix, axis=0)])
    return model(embeds=embeds[None], cache=cache)


def read_of_turn(model, cache: nn.KVCache, hidden, ids, suffix, read_offset: int = 0):
    """The hidden state [1, H] the reward head reads after the cached prefix, of ids + suffix ([1, N + S, H]):
    `read_offset` tokens before the end, and before trailing pad ids (nn.read_index; the prompt's where none)."""
    seq = jnp.concatenate([ids, suffix])[None]
    mask = (jnp.arange(seq.shape[1]) < seq.shape[1] - read_offset)[None]
    return model.read(hidden, mask, seq, cache)


def _reward_of_one_hot(cfg, params, cache, one_hot, ids, suffix, *, column, read_offset=0):
    """Reward of prefix + (one_hot @ E) + suffix, differentiable in the one-hot; and, as aux, the K/V of that
    forward (the cache GCG's candidates are scored against)."""
    model = nn.module(params, cfg)
    out = one_hot_forward(model, cache, one_hot, ids, suffix)
    read = read_of_turn(model, cache, out.hidden, ids, suffix, read_offset)
    return model.reward_head(read, cache.gate_input)[0, column], out.kv


def _grad_one_hot(cfg, params, cache, ids, suffix, *, column, read_offset=0):
    """d reward / d one_hot(ids) [N, V], and the K/V of the forward (aux)."""
    one_hot = jax.nn.one_hot(ids, cfg.vocab_size, dtype=jnp.float32)
    return jax.grad(_reward_of_one_hot, argnums=3, has_aux=True)(cfg, params, cache, one_hot, ids, suffix,
                                                                  column=column, read_offset=read_offset)


def gradient_call(cfg, mesh, cache_width: int, column: int = 0, read_offset: int = 0) -> Compiled:
    """The compiled GCG gradient after a prefix cache [1, cache_width]: (params, cache, ids [N], suffix [S]) ->
    (d reward / d one_hot(ids) [N, V], the forward's K/V)."""
    return compiled(_grad_one_hot, cfg, mesh, (PARAMS, Cache(1, cache_width), REPLICATED, REPLICATED),
                    (REPLICATED, None), column=column, read_offset=read_offset)


def reward_gradient(target: Target, ids: np.ndarray) -> np.ndarray:
    """d reward / d one_hot(ids): [N, V] float32 (on the host; the search keeps it on the device)."""
    return to_host(reward_gradient_on_device(target, ids)[0])


def reward_gradient_on_device(target: Target, ids: np.ndarray, read_offset: int = 0
                              ) -> tuple[jax.Array, nn.KVCache]:
    """The gradient, and the cache of prefix + ids that its forward computed on the way (prefix.append_kv); the
    reward read `read_offset` positions before the last (a plain whole turn's end, which the RM does not read)."""
    m = target.model
    ids = np.asarray(ids, np.int32)
    call = gradient_call(m.config, m.mesh, target.cache.k.shape[2], m.output_column, read_offset)
    grad, kv = call(declared_params(m), target.cache, replicated(ids, m.mesh), target.suffix_ids)
    return grad, append_kv(m, target.cache, kv, len(ids))


PROGRESS_BATCHES = 64  # evaluation batches a step runs before it reports progress (slices this many at a time)


def evaluate(targets: list[Target], candidates: np.ndarray, batch_size: int = 256,
             current: np.ndarray | None = None, extended: list[nn.KVCache] | None = None) -> np.ndarray:
    """Mean reward over targets of each candidate response [W, N] -> [W]. With `current` (the sequence the
    candidates were made from), each runs only from its first change on (prefix.score_variants), against
    `extended` (per target, the cache of its prefix + current; computed here when not given)."""
    total = np.zeros(len(candidates), np.float64)
    for i, t in enumerate(targets):
        if current is None:
            total += score_responses(t.model, t.cache, t.suffix_ids, candidates, batch_size)
            continue
        cache = extend_prefix(t.model, t.cache, np.asarray(current)[None]) if extended is None else extended[i]
        total += score_variants(t.model, cache, np.asarray(t.suffix, np.int32), current, candidates, batch_size)
    return (total / len(targets)).astype(np.float32)


def gcg(targets: list[Target], cfg: GCGConfig, log: Callable[[str], None] | None = None) -> GCGResult:
    """Search an N-token response maximizing (optimal) or minimizing (pessimal) the mean reward. The history
    holds per step the best so far, the `candidates` evaluated, and how they were filtered: `sampled`, minus
    `repeats`, `revisits` (--forbid_revisits) and `retokenize_failed`, after `retries` (buffer entries tried
    before one gave a candidate). A step left with under a quarter of --search_width logs a warning."""
    search = _begin(targets, cfg, log)
    history, best_step = [], 0
    for step in range(cfg.steps):
        cands, counts, attempt = search.step(step)
        best_loss = search.buffer[0][0]
        if history and best_loss < min(h["loss"] for h in history) - 1e-9:
            best_step = step
        history.append(search.report(step, cands, counts, attempt))
        if cfg.patience is not None and step - best_step >= cfg.patience:
            break
    sign = search.sign
    best_loss, best_ids = search.buffer[0]
    return GCGResult(best_ids, _decode(search.lead, best_ids), -sign * best_loss, history,
                     [(-sign * loss, ids) for loss, ids in search.buffer], time.perf_counter() - search.start,
                     search.dropped, search.skipped_swaps)


@dataclasses.dataclass
class _Search:
    """One gcg() run: what every step reads, and what the steps update: the buffer (the best sequences, lowest
    loss first), every sequence evaluated so far (`seen`, the history --forbid_revisits keeps) and the counts of
    candidates dropped for a NaN/Inf reward and of swaps of allowed tokens never proposed for a NaN/Inf gradient
    entry, summed over the gradients computed (--allow_nonfinite)."""

    targets: list[Target]
    cfg: GCGConfig
    log: Callable[[str], None] | None
    sign: float  # +1 optimal, -1 pessimal: the loss is -sign * reward
    start: float  # time.perf_counter() when the search began
    vocab: int  # the smallest of the targets' vocabularies
    allowed: int  # how many tokens may be searched
    banned: jax.Array  # [vocab] bool, on the device
    embed: jax.Array | None  # [vocab, hidden] float32, for --embed_reg
    key: jax.Array
    checks: list[RetokenizationCheck]
    eval_batch: int
    buffer: list[tuple[float, list[int]]] = dataclasses.field(default_factory=list)
    seen: set[tuple[int, ...]] = dataclasses.field(default_factory=set)
    dropped: int = 0
    skipped_swaps: int = 0
    first_step_seconds: float = 0.0  # when step 1 ended: it paid the compiles, which the ETA leaves out

    @property
    def lead(self) -> Model:
        return self.targets[0].model

    def losses(self, cands: np.ndarray, current: np.ndarray | None = None, extended=None,
               step: int | None = None) -> np.ndarray:
        """-sign * reward; NaN/Inf stop the search (or, when allowed, mark the candidate to drop). A step of more
        than PROGRESS_BATCHES batches runs in slices of that many with a progress line (rate, ETA): a huge
        --search_width ran for hours with nothing on screen until its step ended."""
        rows = self.eval_batch * PROGRESS_BATCHES
        if step is None or len(cands) <= rows:
            rewards = evaluate(self.targets, cands, self.eval_batch, current, extended)
        else:
            progress = Progress(len(cands), f"gcg {self.cfg.direction} step {step + 1}", every=30.0)
            parts = []
            for start in range(0, len(cands), rows):
                parts.append(evaluate(self.targets, cands[start : start + rows], self.eval_batch, current, extended))
                if is_main():
                    progress.update(len(parts[-1]))
            rewards = np.concatenate(parts)
        bad = ~np.isfinite(rewards)
        if bad.any() and not self.cfg.allow_nonfinite:
            finite.check(rewards[:, None], what="rewards", columns=["GCG objective"], allow=False,
                         row=lambda i: f"response ids {cands[i].tolist()} ({_decode(self.lead, cands[i].tolist())!r})",
                         explain=lambda i, j: explain_nonfinite(self.targets, cands[i]))
        self.dropped += int(bad.sum())
        return np.where(bad, np.nan, -self.sign * rewards)

    def step(self, step: int) -> tuple[np.ndarray, dict[str, int], int]:
        """One step: propose candidates, evaluate those left by the filter, keep the best in the buffer. Returns
        the candidates evaluated, the filter's counts and the retries."""
        cands, counts, attempt, current, extended = self._propose(step)
        if len(cands):
            losses = self.losses(cands, current, list(extended), step)
            held = {tuple(ids) for _, ids in self.buffer}  # without the history a sequence can come back: keep it once
            for loss, ids in zip(losses, cands, strict=True):
                if np.isfinite(loss) and tuple(ids.tolist()) not in held:
                    self.buffer.append((float(loss), ids.tolist()))
                    held.add(tuple(ids.tolist()))
            self.buffer = sorted(self.buffer, key=lambda x: x[0])[: self.cfg.buffer_size]
        return cands, counts, attempt

    def _propose(self, step: int):
        """Candidates sampled from the gradient at the best sequence and filtered; with the sequence they came
        from, its caches (per target, from the gradient's forward) and the retries. When every top-k neighbour of
        the best sequence has been visited, search from the next buffer entries, swapping more positions at a
        time (the history forbids going back): retries."""
        cfg = self.cfg
        tries = min(len(self.buffer), 4)
        for attempt in range(tries):
            current = np.asarray(self.buffer[attempt][1])
            grads, extended = zip(*(reward_gradient_on_device(t, current) for t in self.targets), strict=True)
            grad = _mean_on_device([g[:, :self.vocab] for g in grads]) * -self.sign
            # a NaN/Inf entry stops the search, or (allowed) is never proposed (swap_scores) and counted
            self.skipped_swaps += finite.gradient_swaps_skipped(
                grad, self.banned, allow=cfg.allow_nonfinite, tokenizer=self.lead.tokenizer,
                what=f"the reward's gradient for response ids {current.tolist()}",
                explain=lambda ids=current: explain_nonfinite(self.targets, ids))
            # never a banned swap, nor one with no gradient
            score = swap_scores(grad, self.banned, jnp.asarray(current), self.embed, cfg.embed_reg)
            step_cfg = dataclasses.replace(cfg, n_replace=min(cfg.num_tokens, cfg.n_replace + attempt))
            step_key = jax.random.fold_in(self.key, step * 4 + attempt)
            cands, counts = filter_candidates(sample_candidates(current, score, step_cfg, step_key), self.checks,
                                              cfg, self.seen)
            if len(cands):
                break
            if self.log and attempt + 1 < tries:
                self.log(f"[gcg {cfg.direction}] step {step + 1}: no candidate left from buffer entry {attempt + 1} "
                         f"with n_replace={step_cfg.n_replace} ({describe_filter(counts)}); retrying from buffer "
                         f"entry {attempt + 2} with n_replace={min(cfg.num_tokens, cfg.n_replace + attempt + 1)}")
        return cands, counts, attempt, current, extended

    def time_left(self, step: int, seconds: float) -> str:
        """`, 1m05s left` at the mean pace of the steps after the first (which compiled), from step 2 on; `at most`
        under --patience, which may stop the search sooner."""
        left = self.cfg.steps - step - 1
        if step == 0 or left == 0:
            return ""
        bound = "at most " if self.cfg.patience is not None else ""
        return f", {bound}{duration((seconds - self.first_step_seconds) / step * left)} left"

    def report(self, step: int, cands: np.ndarray, counts: dict[str, int], attempt: int) -> dict:
        """The history's record of a step (the best so far, the filter's counts), logged; a warning when under a
        quarter of --search_width was left to evaluate."""
        cfg = self.cfg
        best_loss, best_ids = self.buffer[0]
        record = {"step": step + 1, "loss": best_loss, "reward": -self.sign * best_loss, "ids": best_ids,
                  "text": _decode(self.lead, best_ids), "candidates": len(cands), "retries": attempt,
                  **{k: v for k, v in counts.items() if k != "left"}, "seconds": time.perf_counter() - self.start}
        retried = f" after {attempt} retr{'y' if attempt == 1 else 'ies'}" if attempt else ""
        if step == 0:
            self.first_step_seconds = record["seconds"]
        if self.log:
            self.log(f"[gcg {cfg.direction}] step {step + 1}/{cfg.steps} reward {record['reward']:.4f} "
                     f"{record['text']!r} ({describe_filter(counts)}{';' + retried if retried else ''}; "
                     f"{record['seconds']:.1f} s{self.time_left(step, record['seconds'])})")
        if 4 * len(cands) < cfg.search_width and is_main():
            logging.warning("GCG step %d: only %d of --search_width=%d candidates left to evaluate%s (%d sampled, %s). "
                            "%s", step + 1, len(cands), cfg.search_width, retried, counts["sampled"],
                            removed_by_filter(counts), filter_advice(counts, cfg, self.allowed))
        return record


def _begin(targets: list[Target], cfg: GCGConfig, log: Callable[[str], None] | None) -> _Search:
    """Check the targets' context and the candidate set, and evaluate the start into the buffer."""
    sign = 1.0 if cfg.direction == "optimal" else -1.0
    start = time.perf_counter()
    lead = targets[0].model
    for t in targets:  # past the context every reward is meaningless
        check_context(cfg, t.prompt, len(t.prefix), len(t.suffix), t.model.config.max_position_embeddings)
    vocab = min(t.model.config.vocab_size for t in targets)
    banned = banned_tokens(lead.tokenizer, vocab, cfg)
    for t in targets:
        heads.check_search_keeps_gate(t.model.config.head, t.prefix, lambda i: i < vocab and not banned[i],
                                      cfg.num_tokens, lead.tokenizer, t.suffix)
    banned_on_device = jnp.asarray(banned)
    embed = nn.get(lead.params, "embed.embedding")[:vocab].astype(jnp.float32) if cfg.embed_reg > 0 else None
    key = jax.random.key(cfg.seed)
    checks = _retokenization_checks(targets, cfg)
    inits = start_sequences(lead.tokenizer, cfg, banned, checks)
    # Candidates' tails run packed about two to a row (prefix.score_variants): search_width / 2 rows per call.
    eval_batch = min(cfg.eval_batch_size, max(1, cfg.search_width // 2))
    search = _Search(targets, cfg, log, sign=sign, start=start, vocab=vocab, allowed=int((~banned).sum()),
                     banned=banned_on_device, embed=embed, key=key, checks=checks, eval_batch=eval_batch)
    init_losses = search.losses(np.asarray(inits))
    if np.isnan(init_losses).all():
        raise NonFiniteError("every initial response has a NaN/Inf reward; nothing to search from. Check the model "
                             "for NaN (it is not the search's doing).")
    buffer = sorted((float(loss), list(ids)) for loss, ids in zip(init_losses, inits, strict=True) if np.isfinite(loss))
    search.buffer = buffer[: cfg.buffer_size]
    search.seen = {tuple(ids) for ids in inits}
    return search


def _retokenization_checks(targets: list[Target], cfg: GCGConfig) -> list[RetokenizationCheck]:
    """One check per target (every prompt and model: templates differ), when the filter is on."""
    if not cfg.retokenize_filter:
        return []
    return [RetokenizationCheck(Conversations(t.model.tokenizer, t.prompt, cfg.template), t.prefix, t.suffix)
            for t in targets if t.model.tokenizer is not None]


def _mean_on_device(grads: list[jax.Array]) -> jax.Array:
    """The mean of the targets' gradients where the first one lives (models may sit on different devices)."""
    if len(grads) == 1:
        return grads[0]
    return sum(jax.device_put(g, grads[0].sharding) for g in grads) / len(grads)


def explain_nonfinite(targets: list[Target], ids: np.ndarray) -> str:
    """Where the first target whose reward of `ids` is non-finite turns NaN (see rmjax.scoring.finite)."""
    for t in targets:
        if not np.isfinite(evaluate([t], np.asarray([ids]), 1)).all():
            return f" (model {t.model.source}, prompt {t.prompt[:40]!r})" + finite.diagnose(
                t.model, [*t.prefix, *np.asarray(ids).tolist(), *t.suffix])
    params = [p for t in targets for p in finite.nonfinite_parameters(t.model.params)]
    return f"; non-finite parameters: {'; '.join(dict.fromkeys(params))}" if params else ""


def _decode(model: Model, ids: list[int]) -> str:
    return model.tokenizer.decode(ids) if model.tokenizer is not None else " ".join(map(str, ids))
