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

from rmjax import batching, nn
from rmjax.config import ModelConfig
from rmjax.distributed import replicated, to_host
from rmjax.heads import require_pattern
from rmjax.loading import Model
from rmjax.sharding import batch_sharding

PREFIX_BUCKET = 32  # prefixes are left-padded to a multiple of this: one compilation for all prompts


def prefill_prefix(model: Model, prefix: tuple[int, ...] | list[int]) -> nn.KVCache:
    """KV cache of one prefix (batch 1), left-padded to a bucket so prompts share a compilation."""
    require_pattern(model.config.head, prefix, model.source)
    width = batching.bucket(len(prefix), PREFIX_BUCKET)
    ids, mask = replicated(batching.pad_rows([prefix], width, side="left"), model.mesh)
    return _prefill(model.config, model.mesh, width)(_declared(model), ids, mask)


def extend_prefix(model: Model, cache: nn.KVCache, continuations: np.ndarray) -> nn.KVCache:
    """Caches of a batch-1 prefix followed by each row of `continuations` [R, d] (rmjax.beam's partial responses):
    one forward of R x d new positions against the shared prefix, no prefix recomputed; [R] rows, width + d."""
    rows, new = continuations.shape
    extend = _extend(model.config, model.mesh, cache.k.shape[2], rows, new)
    return extend(_declared(model), cache, replicated(np.asarray(continuations, np.int32), model.mesh))


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


@functools.lru_cache(maxsize=32)
def _extend(cfg: ModelConfig, mesh: jax.sharding.Mesh | None, width: int, rows: int, new: int):
    def extend(params, cache, continuations):
        kv = nn.module(params, cfg)(ids=continuations, cache=cache).kv

        def joined(old, fresh, axis):  # the shared prefix repeated per row, then each row's new positions
            shape = list(old.shape)
            shape[axis] = rows
            return jnp.concatenate([jnp.broadcast_to(old, shape), fresh], axis=axis + 1)

        gate = None if cache.gate_input is None else jnp.broadcast_to(cache.gate_input, (rows, cfg.hidden_size))
        return nn.KVCache(k=joined(cache.k, kv.k, 1), v=joined(cache.v, kv.v, 1),
                          positions=joined(cache.positions, kv.positions, 0), valid=joined(cache.valid, kv.valid, 0),
                          gate_input=gate)

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


def score_variants(model: Model, cache: nn.KVCache, suffix: np.ndarray, current: np.ndarray, variants: np.ndarray,
                   rows: int) -> np.ndarray:
    """Rewards of responses [W, N] that each equal `current` [N] up to their first changed position (GCG's
    candidates): one cache of prefix + current serves every variant's unchanged head, so a variant runs only
    from its first change on (+ suffix). Variants are sorted by that position and run `rows` at a time, each
    batch as wide as its longest tail (at most N compilations). [W] float32."""
    n, tail = len(current), len(suffix)
    if not len(variants):
        return np.zeros(0, np.float32)
    rows = batching.round_up(rows, model.mesh)
    extended = extend_prefix(model, cache, np.asarray(current)[None])
    changed = variants != np.asarray(current)[None]
    first = np.where(changed.any(1), changed.argmax(1), n - 1)  # an unchanged variant reruns its last token
    order = np.argsort(-first, kind="stable")
    params, pending = _declared(model), []
    for start in range(0, len(order), rows):
        part = order[start : start + rows]
        width = n - int(first[part].min()) + tail
        heads = np.full(rows, first[part[0]], np.int32)
        ids, mask = np.zeros((rows, width), np.int32), np.zeros((rows, width), bool)
        for r in range(rows):  # rows past the part repeat its first variant (a fixed batch shape)
            i = part[min(r, len(part) - 1)]
            heads[r], k = first[i], n - first[i]
            ids[r, :k], mask[r, :k] = variants[i, first[i] :], True
            ids[r, width - tail :], mask[r, width - tail :] = suffix, True  # after the gap: positions skip it
        scorer = _variant_scorer(model.config, model.mesh, extended.k.shape[2], n, width, rows, model.output_column)
        pending.append((part, scorer(params, extended, *(batching.place(a, model.mesh) for a in (heads, ids, mask)))))
    out = np.zeros(len(variants), np.float32)
    for part, scores in pending:
        out[part] = to_host(scores)[: len(part)]
    return out


@functools.lru_cache(maxsize=64)
def _variant_scorer(cfg: ModelConfig, mesh: jax.sharding.Mesh | None, cache_width: int, n: int, width: int,
                    rows: int, column: int):
    def score(params, cache, heads, ids, mask):
        # Row r sees the prompt and current[:heads[r]] of the cache; its own tokens take over from there.
        keep = jnp.arange(cache_width)[None, :] < cache_width - n + heads[:, None]
        rowwise = nn.KVCache(k=cache.k, v=cache.v, positions=cache.positions, valid=cache.valid & keep,
                             gate_input=cache.gate_input)
        return nn.module(params, cfg).rewards_after(rowwise, ids, mask)[:, column]

    if mesh is None:
        return jax.jit(score)
    data = batch_sharding(mesh, 1)
    return _under_mesh(jax.jit(
        score, in_shardings=(nn.shardings(cfg, mesh), nn.KVCache.shardings(cfg, mesh, 1, cache_width), data,
                             batch_sharding(mesh, 2), batch_sharding(mesh, 2)),
        out_shardings=data), mesh)


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
