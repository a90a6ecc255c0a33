"""Shared-prefix K/V: computed once per prompt, placed over the mesh, reused by every candidate.

The two jitted steps declare where everything lives: weights by their declared logical axes, the
prefix cache with K/V heads over `model`, candidate rows and their rewards over `data`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from rmjax import nn
from rmjax.config import ModelConfig
from rmjax.heads import require_pattern
from rmjax.model import Model
from rmjax.parallel import batching
from rmjax.parallel.distributed import replicated, to_host
from rmjax.parallel.sharding import batch_sharding

PREFIX_BUCKET = 32  # prefixes are left-padded to a multiple of this: one compilation for all prompts


def prefill_prefix(model: Model, prefix: tuple[int, ...] | list[int]) -> nn.KVCache:
    """KV cache of one prefix (batch 1), left-padded to a bucket so prompts share a compilation."""
    require_pattern(model.config.head, prefix, model.source)
    width = batching.bucket(len(prefix), PREFIX_BUCKET)
    ids, mask = replicated(batching.pad_rows([prefix], width, side="left"), model.mesh)
    return _prefill(model.config, model.mesh, width)(_declared(model), ids, mask)


def extend_prefix(model: Model, cache: nn.KVCache, continuations: np.ndarray) -> nn.KVCache:
    """Caches of a batch-1 prefix followed by each row of `continuations` [R, d] (the beam's partial responses):
    one forward of R x d new positions against the shared prefix, no prefix recomputed; [R] rows, width + d."""
    rows, new = continuations.shape
    extend = _extend(model.config, model.mesh, cache.k.shape[2], rows, new)
    return extend(_declared(model), cache, replicated(np.asarray(continuations, np.int32), model.mesh))


def append_kv(model: Model, cache: nn.KVCache, kv: nn.KVCache, length: int) -> nn.KVCache:
    """A batch-1 prefix cache followed by the first `length` positions of `kv`, the K/V of a batch-1 forward
    after it (GCG's gradient forward: the same cache extend_prefix computes, without a forward of its own)."""
    return _append(model.config, model.mesh, cache.k.shape[2], length)(cache, kv)


def cache_row(model: Model, cache: nn.KVCache, row: int) -> nn.KVCache:
    """Row `row` of a batched cache as a batch-1 cache, placed where the batch scorer expects it."""
    return _take_row(model.config, model.mesh, cache.k.shape[1], cache.k.shape[2])(cache, jnp.int32(row))


def _declared(model: Model) -> nnx.State:
    """The params where the jitted calls declare them (a no-op for a loaded model; a model whose weights were
    placed by hand, e.g. replicated, is moved once here instead of failing jit's sharding check)."""
    if model.mesh is None:
        return model.params
    return jax.device_put(model.params, nn.shardings(model.config, model.mesh))


@functools.lru_cache(maxsize=32)
def _prefill(cfg: ModelConfig, mesh: jax.sharding.Mesh | None, width: int):
    def prefill(params, ids, mask):
        return nn.module(params, cfg).prefill(ids, mask)

    if mesh is None:
        return jax.jit(prefill)
    rows = NamedSharding(mesh, PartitionSpec())
    return _under_mesh(jax.jit(prefill, in_shardings=(nn.shardings(cfg, mesh), rows, rows),
                               out_shardings=nn.KVCache.shardings(cfg, mesh, 1, width)), mesh)


def _joined(cfg: ModelConfig, cache: nn.KVCache, kv: nn.KVCache, rows: int) -> nn.KVCache:
    """A batch-1 cache repeated over `rows`, each row followed by its new positions in `kv` ([rows])."""
    def joined(old, fresh, axis):
        shape = list(old.shape)
        shape[axis] = rows
        return jnp.concatenate([jnp.broadcast_to(old, shape), fresh], axis=axis + 1)

    gate = None if cache.gate_input is None else jnp.broadcast_to(cache.gate_input, (rows, cfg.hidden_size))
    return nn.KVCache(k=joined(cache.k, kv.k, 1), v=joined(cache.v, kv.v, 1),
                      positions=joined(cache.positions, kv.positions, 0), valid=joined(cache.valid, kv.valid, 0),
                      gate_input=gate)


@functools.lru_cache(maxsize=32)
def _append(cfg: ModelConfig, mesh: jax.sharding.Mesh | None, width: int, length: int):
    def append(cache, kv):
        head = nn.KVCache(k=kv.k[:, :, :length], v=kv.v[:, :, :length], positions=kv.positions[:, :length],
                          valid=kv.valid[:, :length])
        return _joined(cfg, cache, head, 1)

    if mesh is None:
        return jax.jit(append)
    return jax.jit(append, in_shardings=(nn.KVCache.shardings(cfg, mesh, 1, width), None),
                   out_shardings=nn.KVCache.shardings(cfg, mesh, 1, width + length))


@functools.lru_cache(maxsize=32)
def _extend(cfg: ModelConfig, mesh: jax.sharding.Mesh | None, width: int, rows: int, new: int):
    def extend(params, cache, continuations):
        return _joined(cfg, cache, nn.module(params, cfg)(ids=continuations, cache=cache).kv, rows)

    if mesh is None:
        return jax.jit(extend)
    return _under_mesh(jax.jit(
        extend, in_shardings=(nn.shardings(cfg, mesh), nn.KVCache.shardings(cfg, mesh, 1, width),
                              NamedSharding(mesh, PartitionSpec())),
        out_shardings=nn.KVCache.shardings(cfg, mesh, rows, width + new)), mesh)


@functools.lru_cache(maxsize=32)
def _take_row(cfg: ModelConfig, mesh: jax.sharding.Mesh | None, rows: int, width: int):
    def take(cache, row):
        def pick(x, axis):
            return None if x is None else jax.lax.dynamic_slice_in_dim(x, row, 1, axis)

        return nn.KVCache(k=pick(cache.k, 1), v=pick(cache.v, 1), positions=pick(cache.positions, 0),
                          valid=pick(cache.valid, 0), gate_input=pick(cache.gate_input, 0))

    if mesh is None:
        return jax.jit(take)
    return jax.jit(take, out_shardings=nn.KVCache.shardings(cfg, mesh, 1, width))


def rewards_of_batch(params: nnx.State, cfg: ModelConfig, cache: nn.KVCache, responses: jax.Array,
                     suffix: jax.Array, column: int = 0) -> jax.Array:
    """Reward output `column` of prefix + response + suffix for one batch of responses [B, N]: [B] float32."""
    tail = jnp.broadcast_to(suffix, (responses.shape[0], suffix.shape[0]))
    out = nn.module(params, cfg).rewards_after(cache, jnp.concatenate([responses, tail], axis=1))
    return out[:, column]


@functools.lru_cache(maxsize=32)
def _batch_scorer(cfg: ModelConfig, mesh: jax.sharding.Mesh | None, prefix_width: int, column: int):
    def score(params, cache, responses, suffix):
        return rewards_of_batch(params, cfg, cache, responses, suffix, column)

    if mesh is None:
        return jax.jit(score)
    return _under_mesh(jax.jit(
        score,
        in_shardings=(nn.shardings(cfg, mesh), nn.KVCache.shardings(cfg, mesh, 1, prefix_width),
                      batch_sharding(mesh, 2), NamedSharding(mesh, PartitionSpec())),
        out_shardings=batch_sharding(mesh, 1),
    ), mesh)


def score_variants(model: Model, extended: nn.KVCache, suffix: np.ndarray, current: np.ndarray,
                   variants: np.ndarray, rows: int) -> np.ndarray:
    """Rewards of responses [W, N] that each equal `current` [N] up to their first changed position (GCG's
    candidates): `extended`, the cache of prefix + current (extend_prefix, or append_kv after GCG's gradient),
    serves every variant's unchanged head, so a variant runs only from its first change on (+ suffix). The
    tails are packed end to end into rows as wide as the longest and the shortest tail together (nn.Segments
    keeps them apart), about `rows` rows per call (a multiple of 8): the positions run are the tails', with
    little padding.
    [W] float32."""
    n, tail = len(current), len(suffix)
    if not len(variants):
        return np.zeros(0, np.float32)
    changed = variants != np.asarray(current)[None]
    first = np.where(changed.any(1), changed.argmax(1), n - 1)  # an unchanged variant reruns its last token
    width = (n + tail) + (1 + tail)
    slots = width // (1 + tail)  # the most tails a row can hold
    packed = pack(n - first + tail, width)
    calls = -(-len(packed) // rows)
    per_call = batching.round_up(batching.bucket(-(-len(packed) // calls), 8), model.mesh)
    cache_width = extended.k.shape[2]
    ids, rel, segment, cache_end = (np.zeros((calls * per_call, width), np.int32) for _ in range(4))
    segment[:] = -1
    last, owner = np.zeros((calls * per_call, slots), np.int32), np.full((calls * per_call, slots), -1)
    for r, members in enumerate(packed):
        at = 0
        for slot, i in enumerate(members):
            span = slice(at, at + n - first[i] + tail)
            ids[r, span] = np.concatenate([variants[i, first[i] :], suffix])
            rel[r, span] = np.arange(first[i], n + tail)  # positions after the prompt
            segment[r, span], cache_end[r, span] = slot, cache_width - n + first[i]
            last[r, slot], owner[r, slot] = span.stop - 1, i
            at = span.stop
    scorer = _variant_scorer(model.config, model.mesh, cache_width, n, width, per_call, slots, model.output_column)
    params, pending = _declared(model), []
    for start in range(0, calls * per_call, per_call):
        part = slice(start, start + per_call)
        placed = (batching.place(a[part], model.mesh) for a in (ids, rel, segment, cache_end, last))
        pending.append((owner[part], scorer(params, extended, *placed)))
    out = np.zeros(len(variants), np.float32)
    for who, scores in pending:
        out[who[who >= 0]] = to_host(scores)[who >= 0]
    return out


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


@functools.lru_cache(maxsize=64)
def _variant_scorer(cfg: ModelConfig, mesh: jax.sharding.Mesh | None, cache_width: int, n: int, width: int,
                    rows: int, slots: int, column: int):
    def score(params, cache, ids, rel, segment, cache_end, last):
        model = nn.module(params, cfg)
        positions = cache.next_positions[:, None] - n + rel  # the response starts after the prompt
        hidden = model(ids=ids, mask=segment >= 0, positions=positions, cache=cache,
                       segments=nn.Segments(segment, cache_end)).hidden
        ends = hidden[jnp.arange(rows)[:, None], last]  # [rows, slots, hidden]
        return model.reward_head(ends.reshape(rows * slots, -1), cache.gate_input)[:, column].reshape(rows, slots)

    if mesh is None:
        return jax.jit(score)
    rows_of = batch_sharding(mesh, 2)
    return _under_mesh(jax.jit(
        score, in_shardings=(nn.shardings(cfg, mesh), nn.KVCache.shardings(cfg, mesh, 1, cache_width),
                             *([rows_of] * 5)),
        out_shardings=rows_of), mesh)


def _under_mesh(fn, mesh: jax.sharding.Mesh):
    """Trace and run `fn` with `mesh` set, so activations get their sharding constraints (nn.layers.constrain)."""
    @functools.wraps(fn)
    def call(*args):
        with jax.set_mesh(mesh):
            return fn(*args)

    return call


def score_responses(model: Model, cache: nn.KVCache, suffix, responses: np.ndarray, batch_size: int) -> np.ndarray:
    """Rewards of equal-length responses [W, N] after a cached prefix: [W] float32 (host loop).

    Every batch has the same shape (the last is padded), so one compilation serves all calls with
    this batch size; batches are dispatched before any result is copied to the host.
    """
    batch_size = batching.round_up(batch_size, model.mesh)
    scorer = _batch_scorer(model.config, model.mesh, cache.k.shape[2], model.output_column)
    params = _declared(model)
    pending = []
    for start in range(0, len(responses), batch_size):
        part = responses[start : start + batch_size]
        padded, _ = batching.pad_rows(part, responses.shape[1], num_rows=batch_size)
        scores = scorer(params, cache, batching.place(padded, model.mesh), suffix)
        pending.append((len(part), scores))
    if not pending:
        return np.zeros(0, np.float32)
    return np.concatenate([to_host(scores)[:n] for n, scores in pending]).astype(np.float32)
