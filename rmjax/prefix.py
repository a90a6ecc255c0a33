"""Shared-prefix K/V: computed once per prompt, replicated over the mesh, reused by every candidate."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from rmjax import model as M
from rmjax.distributed import global_array, replicated, to_host
from rmjax.heads import require_pattern
from rmjax.loading import Model

PREFIX_BUCKET = 32  # prefixes are left-padded to a multiple of this: one compilation for all prompts


def prefill_prefix(model: Model, prefix: tuple[int, ...] | list[int]) -> M.KVCache:
    """KV cache of one prefix (batch 1), left-padded to a bucket so prompts share a compilation."""
    require_pattern(model.config.head, prefix, model.source)
    n = len(prefix)
    width = -(-n // PREFIX_BUCKET) * PREFIX_BUCKET
    ids = np.zeros((1, width), np.int32)
    mask = np.zeros((1, width), bool)
    ids[0, width - n :], mask[0, width - n :] = prefix, True
    ids, mask = replicated((ids, mask), model.mesh)
    return M.prefill(model.params, model.config, ids, mask)


def shard_batch(model: Model, array: np.ndarray):
    """Rows over the mesh's `data` axis (no-op without a mesh)."""
    if model.mesh is None:
        return array
    from rmjax.sharding import batch_sharding

    return global_array(array, batch_sharding(model.mesh, np.ndim(array)))


def effective_batch_size(model: Model, batch_size: int) -> int:
    """Round up to a multiple of the data-axis size so every device gets equal rows."""
    data = model.mesh.shape["data"] if model.mesh is not None else 1
    return max(data, -(-batch_size // data) * data)


@functools.partial(jax.jit, static_argnames=("cfg",))
def response_scores(params: M.Params, cfg, cache: M.KVCache, responses: jax.Array, suffix: jax.Array) -> jax.Array:
    """Reward of prefix + response + suffix for a batch of responses [B, N]: [B] float32."""
    tail = jnp.broadcast_to(suffix, (responses.shape[0], suffix.shape[0]))
    return M.rewards_after(params, cfg, cache, jnp.concatenate([responses, tail], axis=1))[:, cfg.reward_index]


def score_responses(model: Model, cache: M.KVCache, suffix, responses: np.ndarray, batch_size: int) -> np.ndarray:
    """Rewards of equal-length responses [W, N] after a cached prefix: [W] float32.

    Every batch has the same shape (the last is zero-padded), so one compilation serves all
    calls with this batch size; batches are dispatched before any result is copied to the host.
    """
    batch_size = effective_batch_size(model, batch_size)
    pending = []
    for start in range(0, len(responses), batch_size):
        part = responses[start : start + batch_size]
        padded = np.zeros((batch_size, responses.shape[1]), np.int32)
        padded[: len(part)] = part
        scores = response_scores(model.params, model.config, cache, shard_batch(model, padded), suffix)
        pending.append((len(part), scores))
    if not pending:
        return np.zeros(0, np.float32)
    return np.concatenate([to_host(scores)[:n] for n, scores in pending]).astype(np.float32)
