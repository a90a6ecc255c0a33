"""Shared-prefix K/V: computed once per prompt, placed over the mesh, reused by every candidate.

Every step is a compiled call (rmjax.compiled) that declares where everything lives: weights by their declared
logical axes, the prefix cache with K/V heads over `model`, candidate rows and their rewards over `data`.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rmjax import nn
from rmjax.compiled import PARAMS, REPLICATED, ROWS, Cache, Compiled, compiled, declared_params
from rmjax.config import ModelConfig
from rmjax.heads import require_pattern
from rmjax.model import Model
from rmjax.parallel import batching
from rmjax.parallel.distributed import replicated, to_host

PREFIX_BUCKET = 32  # prefixes are left-padded to a multiple of this: one compilation for all prompts


def prefill_prefix(model: Model, prefix: tuple[int, ...] | list[int]) -> nn.KVCache:
    """KV cache of one prefix (batch 1), left-padded to a bucket so prompts share a compilation."""
    require_pattern(model.config.head, prefix, model.source)
    width = batching.bucket(len(prefix), PREFIX_BUCKET)
    ids, mask = replicated(batching.pad_rows([prefix], width, side="left"), model.mesh)
    return prefill_call(model.config, model.mesh, width)(declared_params(model), ids, mask)


def prefill_call(cfg: ModelConfig, mesh, width: int) -> Compiled:
    """The compiled prefill of one left-padded prefix [1, width] (ids, mask) -> its KV cache."""
    return compiled(_prefill, cfg, mesh, (PARAMS, REPLICATED, REPLICATED), Cache(1, width))


def extend_prefix(model: Model, cache: nn.KVCache, continuations: np.ndarray) -> nn.KVCache:
    """Caches of a batch-1 prefix followed by each row of `continuations` [R, d] (the beam's partial responses):
    one forward of R x d new positions against the shared prefix, no prefix recomputed; [R] rows, width + d."""
    rows, new = continuations.shape
    call = extend_call(model.config, model.mesh, rows, cache.k.shape[2], new)
    return call(declared_params(model), cache, replicated(np.asarray(continuations, np.int32), model.mesh))


def extend_call(cfg: ModelConfig, mesh, rows: int, width: int, new: int) -> Compiled:
    """The compiled extension of a batch-1 cache [1, width] by `rows` continuations of `new` tokens each."""
    return compiled(_extend, cfg, mesh, (PARAMS, Cache(1, width), REPLICATED), Cache(rows, width + new))


def append_kv(model: Model, cache: nn.KVCache, kv: nn.KVCache, length: int) -> nn.KVCache:
    """A batch-1 prefix cache followed by the first `length` positions of `kv`, the K/V of a batch-1 forward
    after it (GCG's gradient forward: the same cache extend_prefix computes, without a forward of its own)."""
    return append_call(model.config, model.mesh, cache.k.shape[2], length)(cache, kv)


def append_call(cfg: ModelConfig, mesh, width: int, length: int) -> Compiled:
    """The compiled append of `length` positions of a forward's K/V to a batch-1 cache [1, width]."""
    return compiled(_append, cfg, mesh, (Cache(1, width), None), Cache(1, width + length), length=length)


def cache_row(model: Model, cache: nn.KVCache, row: int) -> nn.KVCache:
    """Row `row` of a batched cache as a batch-1 cache, placed where the batch scorer expects it."""
    return row_call(model.config, model.mesh, cache.k.shape[1], cache.k.shape[2])(cache, jnp.int32(row))


def row_call(cfg: ModelConfig, mesh, rows: int, width: int) -> Compiled:
    """The compiled pick of one row of a [rows, width] cache, as a batch-1 cache."""
    return compiled(_row, cfg, mesh, (Cache(rows, width), REPLICATED), Cache(1, width))


def _prefill(cfg: ModelConfig, params, ids, mask) -> nn.KVCache:
    return nn.module(params, cfg).prefill(ids, mask)


def _extend(cfg: ModelConfig, params, cache: nn.KVCache, continuations) -> nn.KVCache:
    return cache.append(nn.module(params, cfg)(ids=continuations, cache=cache).kv)


def _append(cfg: ModelConfig, cache: nn.KVCache, kv: nn.KVCache, *, length: int) -> nn.KVCache:
    return cache.append(kv.head(length))


def _row(cfg: ModelConfig, cache: nn.KVCache, row) -> nn.KVCache:
    return cache.row(row)


def rewards_of_batch(params: nnx.State, cfg: ModelConfig, cache: nn.KVCache, responses: jax.Array,
                     suffix: jax.Array, column: int = 0) -> jax.Array:
    """Reward output `column` of prefix + response + suffix for one batch of responses [B, N]: [B] float32."""
    tail = jnp.broadcast_to(suffix, (responses.shape[0], suffix.shape[0]))
    out = nn.module(params, cfg).rewards_after(cache, jnp.concatenate([responses, tail], axis=1))
    return out[:, column]


def _score_batch(cfg: ModelConfig, params, cache: nn.KVCache, responses, suffix, first=None, *, column: int,
                 log_probs: bool = False):
    if not log_probs:
        return rewards_of_batch(params, cfg, cache, responses, suffix, column)
    model = nn.module(params, cfg)
    tail = jnp.broadcast_to(suffix, (responses.shape[0], suffix.shape[0]))
    ids = jnp.concatenate([responses, tail], axis=1)
    hidden = model(ids=ids, cache=cache).hidden
    rewards = model.reward_head(model.read(hidden, jnp.ones(ids.shape, bool), ids, cache), cache.gate_input)[:, column]
    later = _picked_log_probs(model, hidden[:, : responses.shape[1]], responses)  # tokens 1.. of each response
    return rewards, first[responses[:, 0]] + later.sum(axis=1)


def _picked_log_probs(model, hidden: jax.Array, ids: jax.Array) -> jax.Array:
    """Log-probability of each token ids[:, j + 1] read off the LM head at position j of `hidden` [B, T, H]:
    [B, T - 1] float32."""
    logits = model.lm_logits(hidden[:, :-1]).astype(jnp.float32)
    return jnp.take_along_axis(logits, ids[:, 1:, None], axis=-1)[..., 0] - jax.nn.logsumexp(logits, axis=-1)


def score_variants(model: Model, extended: nn.KVCache, suffix: np.ndarray, current: np.ndarray,
                   variants: np.ndarray | list, rows: int, log_probs: bool = False, longest: int | None = None,
                   firsts: np.ndarray | None = None, read_offset: int = 0) -> np.ndarray | tuple[np.ndarray, ...]:
    """Rewards of responses [W, N] that each equal `current` [N] up to their first changed position (GCG's
    candidates): `extended`, the cache of prefix + current (extend_prefix, or append_kv after GCG's gradient),
    serves every variant's unchanged head, so a variant runs only from its first change on (+ suffix). The
    tails are packed end to end into rows as wide as the longest and the shortest tail together (nn.Segments
    keeps them apart), about `rows` rows per call (a multiple of 8): the positions run are the tails', with
    little padding.
    [W] float32. With `log_probs` (a model whose backbone ties its LM head: the same forward serves both), also
    each variant's log-probabilities of its tokens after its first change, read off the LM head at its tail's
    positions: a list of W float32 arrays (issue 25's fluency term; the first changed token's own log-probability
    is the cache's, which the caller has).

    A NaN/Inf tail makes every tail of its row NaN: the mask gives its keys weight 0, but 0 x NaN is NaN in the
    weights x values product. So each non-finite result that shared its row is scored again alone, and no
    variant's score depends on which variants shared its row (a NaN is rare: the second pass costs little).

    Variants may differ in length from current and from each other (whole turns, rmjax.search.turns: a list of
    rows, each at most `longest` tokens, which sets the rows' width): each runs from its first change (or
    `firsts`, no later) to its own end, then the suffix; the reward is read `read_offset` positions before the
    span's last (plain whole turns end with an end of turn the RM does not read)."""
    if not len(variants):
        return (np.zeros(0, np.float32), []) if log_probs else np.zeros(0, np.float32)
    n, tail = len(current), len(suffix)
    variants = [np.asarray(v) for v in variants]
    first = first_changes(current, variants) if firsts is None else np.asarray(firsts)
    read = read_points(variants, suffix, read_offset, nn.read_pad_id(model.config))
    runs = Runs(np.where(read >= 0, np.minimum(first, read), first), first, read)  # a read before a change runs too
    spans = np.asarray([len(v) - f + tail for v, f in zip(variants, runs.start, strict=True)])
    span = max(n, longest or 0, max(len(v) for v in variants))
    width = (span + tail) + (1 + tail)
    # whole turns of every length up to `longest` run against one cache width (free slots after current's turn,
    # masked), and current's length is an argument: a search that changes its response's length compiles once
    prompt_slots = extended.k.shape[2] - n
    extended = extended.with_free_slots(span - n) if span > n else extended
    packed = pack(spans, width)
    out, picked = _score_packed(model, extended, suffix, current, variants, runs, packed, rows, log_probs, width,
                                prompt_slots)
    shared = np.zeros(len(variants), bool)
    for members in packed:
        shared[members] = len(members) > 1
    finite = np.isfinite(out) & np.asarray([np.isfinite(p).all() for p in picked])
    again = np.flatnonzero(shared & ~finite)
    if len(again):
        alone = _score_packed(model, extended, suffix, current, variants, runs, [[int(i)] for i in again], rows,
                              log_probs, width, prompt_slots)
        out[again] = alone[0][again]
        for i in again:
            picked[i] = alone[1][i]
    return (out, picked) if log_probs else out


class Runs(NamedTuple):
    """Per variant (score_variants): the position its tail runs from, its first change, and where the reward
    head reads it (-1: the prompt's read point)."""

    start: np.ndarray
    change: np.ndarray
    read: np.ndarray


def read_points(variants: list[np.ndarray], suffix: np.ndarray, read_offset: int, pad_id: int | None) -> np.ndarray:
    """Where the head reads each variant + suffix (its last `read_offset` tokens unread): positions from the
    variant's start, before trailing `pad_id`s (read_position)."""
    tail = len(suffix)
    if pad_id is None:
        return np.asarray([len(v) + tail - 1 - read_offset for v in variants], np.int64)
    return np.asarray([read_position(np.concatenate([v, suffix])[: len(v) + tail - read_offset], pad_id)
                       for v in variants], np.int64)


def _score_packed(model: Model, extended: nn.KVCache, suffix: np.ndarray, current: np.ndarray,
                  variants: list[np.ndarray], runs: Runs, packed: list[list[int]], rows: int,
                  log_probs: bool, width: int, prompt_slots: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """score_variants' forward of the variants' tails placed as `packed` says (the variants in each row; the cache
    holds `prompt_slots` slots before current's first token): their
    rewards [W] and each one's log-probabilities after its first change (empty without `log_probs`), zero and empty
    for variants in no row."""
    first = runs.start
    n, tail = len(current), len(suffix)
    slots = width // (1 + tail)  # the most tails a row can hold
    calls = -(-len(packed) // rows)
    per_call = batching.round_up(batching.bucket(-(-len(packed) // calls), 8), model.mesh)
    cache_width = extended.k.shape[2]
    ids, rel, segment, cache_end = (np.zeros((calls * per_call, width), np.int32) for _ in range(4))
    segment[:] = -1
    last, owner = np.zeros((calls * per_call, slots), np.int32), np.full((calls * per_call, slots), -1)
    stops = np.zeros((calls * per_call, slots), np.int32)
    for r, members in enumerate(packed):
        at = 0
        for slot, i in enumerate(members):
            own = len(variants[i])
            span = slice(at, at + own - first[i] + tail)
            ids[r, span] = np.concatenate([variants[i][first[i] :], suffix])
            rel[r, span] = np.arange(first[i], own + tail)  # positions after the prompt
            segment[r, span], cache_end[r, span] = slot, prompt_slots + first[i]
            last[r, slot] = at + runs.read[i] - first[i] if runs.read[i] >= 0 else -1
            owner[r, slot], stops[r, slot] = i, span.stop - 1 - tail  # the span's last response token
            at = span.stop
    scorer = variants_scorer(model.config, model.mesh, cache_width, per_call, slots, model.output_column, log_probs)
    params, length = declared_params(model), replicated(np.int32(n), model.mesh)

    def each():
        for start in range(0, calls * per_call, per_call):
            part = slice(start, start + per_call)
            placed = (batching.place(a[part], model.mesh) for a in (ids, rel, segment, cache_end, last))
            yield start, owner[part], scorer(params, extended, *placed, length)

    pending = batching.dispatched(each(), model.mesh, lambda entry: entry[2])
    out, tails = np.zeros(len(variants), np.float32), [np.zeros(0, np.float32) for _ in variants]
    for start, who, result in pending:
        scores, picked = (result, None) if not log_probs else (to_host(result[0]), to_host(result[1]))
        out[who[who >= 0]] = to_host(scores)[who >= 0]
        for r, slot in zip(*np.nonzero(who >= 0), strict=True):
            i, stop = who[r, slot], stops[start + r, slot]
            if picked is not None:  # token j + 1 read at position j, from the first changed token on
                tails[i] = picked[r, stop - (len(variants[i]) - runs.change[i]) + 2 : stop + 1].astype(np.float32)
    return out, tails


def first_changes(current: np.ndarray, variants: list[np.ndarray]) -> np.ndarray:
    """Each variant's first position that differs from `current` (score_variants runs it from there on: its length
    − first + len(suffix) positions); an unchanged variant reruns its last token. Variants of other lengths (whole
    turns) differ where they first differ, or where the shorter ends."""
    current = np.asarray(current)
    out = np.zeros(len(variants), np.int64)
    for i, v in enumerate(variants):
        v = np.asarray(v)
        common = min(len(v), len(current))
        diff = np.flatnonzero(v[:common] != current[:common])
        out[i] = diff[0] if len(diff) else (common if len(v) != len(current) else len(current) - 1)
    return out


def variants_scorer(cfg: ModelConfig, mesh, cache_width: int, rows: int, slots: int, column: int = 0,
                    log_probs: bool = False) -> Compiled:
    """The compiled scorer of packed variant tails (score_variants): `rows` rows of `slots` tails after a cache of
    prefix + the current n-token response (+ free slots) [1, cache_width]; ids, positions, segments, cache ends
    and each tail's last position as [rows, width] / [rows, slots] rows over `data`, then n []."""
    out = (ROWS(2), ROWS(2)) if log_probs else ROWS(2)
    return compiled(_score_variants, cfg, mesh, (PARAMS, Cache(1, cache_width), *[ROWS(2)] * 5, REPLICATED), out,
                    rows=rows, slots=slots, column=column, log_probs=log_probs)


def pack(lengths: np.ndarray, width: int) -> list[list[int]]:
    """Items of `lengths` (each <= width) into as few rows of `width` as first-fit decreasing finds: the
    indices in each row, longest first."""
    rows, room = [], []
    for i in np.argsort(-np.asarray(lengths), kind="stable"):
        fit = next((r for r, free in enumerate(room) if free >= lengths[i]), None)
        if fit is None:
            rows.append([])
            room.append(width)
            fit = len(rows) - 1
        rows[fit].append(int(i))
        room[fit] -= int(lengths[i])
    return rows


def _score_variants(cfg: ModelConfig, params, cache: nn.KVCache, ids, rel, segment, cache_end, last, n, *,
                    rows: int, slots: int, column: int, log_probs: bool = False):
    model = nn.module(params, cfg)
    positions = cache.next_positions[:, None] - n + rel  # the response starts after the prompt (n: current's length)
    hidden = model(ids=ids, mask=segment >= 0, positions=positions, cache=cache,
                   segments=nn.Segments(segment, cache_end)).hidden
    ends = at_or_prompt(hidden, last, cache)  # [rows, slots, hidden]
    rewards = model.reward_head(ends.reshape(rows * slots, -1), cache.gate_input)[:, column].reshape(rows, slots)
    if not log_probs:
        return rewards
    picked = _picked_log_probs(model, hidden, ids)
    return rewards, jnp.pad(picked, ((0, 0), (1, 0)))  # [rows, width]: column j + 1 holds token j + 1's


def batch_scorer(cfg: ModelConfig, mesh, cache_width: int, column: int = 0, log_probs: bool = False) -> Compiled:
    """The compiled sweep step: (params, prefix cache [1, cache_width], responses [B, N], suffix [S]) -> [B]
    rewards of output `column`, the responses' rows over `data`. With `log_probs` it also takes the first token's
    log-probabilities [V] and gives each response's summed log-probabilities [B] off the LM head."""
    if log_probs:
        return compiled(_score_batch, cfg, mesh, (PARAMS, Cache(1, cache_width), ROWS(2), REPLICATED, REPLICATED),
                        (ROWS(1), ROWS(1)), column=column, log_probs=True)
    return compiled(_score_batch, cfg, mesh, (PARAMS, Cache(1, cache_width), ROWS(2), REPLICATED), ROWS(1),
                    column=column)


def _score_turns(cfg: ModelConfig, params, cache: nn.KVCache, rows, read, first=None, *, column: int):
    """Whole turns (score_responses with `lengths`): rows [B, T] of response + suffix + padding, the reward read
    at `read` [B], the suffix's last position (causal: the padding after it changes nothing before it); with
    `first`, the log-probability of each row's token at each position [B, T] (the caller weighs the response's
    tokens and the end of turn after them; what follows is not the prior's term)."""
    model = nn.module(params, cfg)
    hidden = model(ids=rows, cache=cache).hidden
    rewards = model.reward_head(at_or_prompt(hidden, read, cache), cache.gate_input)[:, column]
    if first is None:
        return rewards
    picked = _picked_log_probs(model, hidden, rows)  # column t: token t + 1
    return rewards, jnp.concatenate([first[rows[:, :1]], picked], axis=1)


def turns_scorer(cfg: ModelConfig, mesh, cache_width: int, column: int, log_probs: bool) -> Compiled:
    """The compiled scorer of whole turns (score_responses with `lengths`): (params, prefix cache, rows [B, T],
    read [B](, first [V])) -> rewards [B] (, each position's log-probability [B, T])."""
    if log_probs:
        return compiled(_score_turns, cfg, mesh, (PARAMS, Cache(1, cache_width), ROWS(2), ROWS(1), REPLICATED),
                        (ROWS(1), ROWS(2)), column=column)
    return compiled(_score_turns, cfg, mesh, (PARAMS, Cache(1, cache_width), ROWS(2), ROWS(1)), ROWS(1),
                    column=column)


def turn_rows(responses: np.ndarray, lengths: np.ndarray, suffix: np.ndarray, end: int, pad_id: int | None = None
              ) -> tuple[np.ndarray, np.ndarray]:
    """Each response's first `lengths` tokens followed by the suffix (which starts with the end of turn `end`), or,
    with no suffix (plain), by `end` alone, which only the log-probs read: rows [W, N + max(S, 1)], right-padded
    with 0, and the position to read each reward at [W] (the suffix's last; plain: the response's last; before
    trailing `pad_id`s, as `read_position`; -1: the prompt's read point)."""
    responses, suffix = np.asarray(responses, np.int32), np.asarray(suffix, np.int32)
    n, tail = responses.shape[1], len(suffix)
    after = suffix if tail else np.asarray([end], np.int32)
    rows = np.zeros((len(responses), n + len(after)), np.int32)
    read = np.zeros(len(responses), np.int32)
    for i, length in enumerate(np.asarray(lengths).tolist()):
        rows[i, :length] = responses[i, :length]
        rows[i, length : length + len(after)] = after
        read[i] = read_position(rows[i, : length + tail], pad_id)
    return rows, read


def read_position(ids: np.ndarray, pad_id: int | None) -> int:
    """Where the reward head reads `ids` (the tokens after a cached prompt; nn.read_index on the host): the last
    whose id is not `pad_id`, -1 where none is (it reads the prompt's read point)."""
    ids = np.asarray(ids)
    readable = np.flatnonzero(ids != pad_id) if pad_id is not None else np.arange(len(ids))
    return int(readable[-1]) if len(readable) else -1


def at_or_prompt(hidden: jax.Array, at: jax.Array, cache: nn.KVCache) -> jax.Array:
    """hidden [B, T, H] at positions `at` [B] (or [B, K] -> [B, K, H]); the cached prompt's read point where -1."""
    rows = jnp.arange(hidden.shape[0]).reshape((-1,) + (1,) * (at.ndim - 1))
    picked = hidden[rows, jnp.maximum(at, 0)]
    if cache.read_hidden is None:
        return picked
    prompt = cache.read_hidden.reshape((1,) * at.ndim + (-1,)).astype(picked.dtype)
    return jnp.where((at < 0)[..., None], prompt, picked)


def score_responses(model: Model, cache: nn.KVCache, suffix, responses: np.ndarray, batch_size: int,
                    first: jax.Array | None = None, lengths: np.ndarray | None = None, end: int | None = None
                    ) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Rewards of equal-length responses [W, N] after a cached prefix: [W] float32 (host loop). With `first` (the
    prefix's next-token log-probabilities [V], a model whose backbone ties its LM head: the same forward serves
    both), also each response's summed log-probabilities [W] float32 (issue 25's fluency term); of whole turns
    (`lengths`), each position's log-probability [W, N + max(S, 1)] instead (turn_rows' rows; the caller weighs
    the tokens and the end of turn).

    Every batch has the same shape (the last is padded), so one compilation serves all calls with
    this batch size; fewer responses than a batch run in the next power of two rows (a beam level's 32 partials
    are not padded to 256). Batches are dispatched before any result is copied to the host.
    """
    batch_size = min(batching.round_up(batch_size, model.mesh),
                     batching.rows_for(len(responses), batching.data_shards(model.mesh)))
    log_probs = first is not None
    if lengths is not None:
        return _score_turn_batches(model, cache, suffix, responses, lengths, batch_size, first, end)
    scorer = batch_scorer(model.config, model.mesh, cache.k.shape[2], model.output_column, log_probs)
    params, extra = declared_params(model), (replicated(first, model.mesh),) if log_probs else ()
    out = batching.in_batches(lambda rows: scorer(params, cache, rows, suffix, *extra), responses, batch_size,
                              model.mesh, outputs=2 if log_probs else 1)
    return out if log_probs else out[0]


def _score_turn_batches(model: Model, cache: nn.KVCache, suffix, responses: np.ndarray, lengths: np.ndarray,
                        batch_size: int, first: jax.Array | None, end: int | None):
    """score_responses of whole turns of `lengths` tokens (each response's first L of its N slots)."""
    suffix = np.asarray(to_host(suffix) if isinstance(suffix, jax.Array) else suffix, np.int32)
    rows, read = turn_rows(responses, lengths, suffix, end, nn.read_pad_id(model.config))
    log_probs = first is not None
    scorer = turns_scorer(model.config, model.mesh, cache.k.shape[2], model.output_column, log_probs)
    params, extra = declared_params(model), (replicated(first, model.mesh),) if log_probs else ()

    def each():
        for start in range(0, len(rows), batch_size):
            part = slice(start, start + batch_size)
            padded, _ = batching.pad_rows(rows[part], rows.shape[1], num_rows=batch_size)
            at = np.full(batch_size, rows.shape[1] - 1, np.int32)
            at[: len(read[part])] = read[part]
            out = scorer(params, cache, batching.place(padded, model.mesh), batching.place(at, model.mesh), *extra)
            yield len(read[part]), out if log_probs else (out,)

    pending = batching.dispatched(each(), model.mesh, lambda entry: entry[1])
    if not pending:
        return (np.zeros(0, np.float32), np.zeros((0, rows.shape[1]), np.float32)) if log_probs \
            else np.zeros(0, np.float32)
    out = tuple(np.concatenate([to_host(r[k])[:n] for n, r in pending]).astype(np.float32)
                for k in range(2 if log_probs else 1))
    return out if log_probs else out[0]
