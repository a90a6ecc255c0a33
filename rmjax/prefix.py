"""Shared-prefix K/V: computed once per prompt, replicated over the mesh, reused by every candidate."""

from __future__ import annotations

import jax
import numpy as np

from rmjax import model as M
from rmjax.distributed import global_array
from rmjax.heads import require_pattern
from rmjax.loading import Model

PREFIX_BUCKET = 32  # prefixes are left-padded to a multiple of this: one compilation for all prompts


def replicated(tree, mesh):
    """Host arrays -> global arrays replicated over the mesh (no-op without a mesh)."""
    if mesh is None:
        return tree
    full = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    return jax.tree.map(lambda x: global_array(np.asarray(x), full), tree)


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
