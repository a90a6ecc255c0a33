"""The one way rows reach a device: batch sizes rounded up to the `data` axis, token rows padded left
or right into fixed shapes (one compilation per shape), batches placed with rows over `data`.

Used by the sweep, text scoring, GCG, log-probs and training.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np

from rmjax.parallel.distributed import global_array
from rmjax.parallel.sharding import batch_sharding


def data_shards(mesh: jax.sharding.Mesh | None) -> int:
    return mesh.shape["data"] if mesh is not None else 1


def bucket(n: int, multiple: int) -> int:
    """The smallest multiple of `multiple` that is >= n (and >= multiple): sizes that share one compilation."""
    return max(multiple, -(-n // multiple) * multiple)


def round_up(batch_size: int, mesh: jax.sharding.Mesh | None) -> int:
    """The batch size as a multiple of the data-axis size (every device gets equal rows)."""
    return bucket(batch_size, data_shards(mesh))


def rows_for(count: int, data: int) -> int:
    """The fewest rows a batch needs for `count` items: the next power of two, a multiple of the `data` shards
    (a picked batch larger than this only pads)."""
    return bucket(1 << max(0, count - 1).bit_length(), data)


def pad_rows(rows: Sequence[Sequence[int]], width: int | None = None, *, side: str = "right", pad_id: int = 0,
             num_rows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Token rows -> (ids int32 [num_rows, width], mask bool): each row's tokens at the `side` end, `pad_id`
    elsewhere; rows past len(rows) are all padding (a fixed batch shape). Defaults: the widest row, len(rows)."""
    width = max((len(r) for r in rows), default=0) if width is None else width
    num_rows = len(rows) if num_rows is None else num_rows
    ids = np.full((num_rows, width), pad_id, np.int32)
    mask = np.zeros((num_rows, width), bool)
    for i, row in enumerate(rows):
        n = len(row)
        if n > width:
            raise ValueError(f"row {i} has {n} tokens, more than the batch width {width}")
        cols = slice(width - n, width) if side == "left" else slice(0, n)
        ids[i, cols], mask[i, cols] = row, True
    return ids, mask


CPU_IN_FLIGHT = 4  # batches a multi-device CPU mesh may have dispatched and unread (`bound_in_flight`)


def bound_in_flight(pending: list, mesh: jax.sharding.Mesh | None, result=lambda entry: entry) -> None:
    """Called after each batch is dispatched (`pending`: the batches so far, `result(entry)` a batch's outputs): on a
    CPU mesh of several devices, wait for the batch CPU_IN_FLIGHT before the last. XLA:CPU (jax 0.10.2) hangs, then
    aborts the process, when ~30 or more multi-device programs wait at once (a 4-device score of 400 batches; 128
    calls of a plain 4-device jit); at 5 in flight 1,000 ran. Elsewhere every batch is dispatched before any is
    read."""
    if (len(pending) > CPU_IN_FLIGHT and mesh is not None and mesh.devices.size > 1
            and mesh.devices.flat[0].platform == "cpu"):
        jax.block_until_ready(result(pending[-1 - CPU_IN_FLIGHT]))


def place(array: np.ndarray, mesh: jax.sharding.Mesh | None):
    """Rows over the mesh's `data` axis (as is without a mesh)."""
    if mesh is None:
        return array
    return global_array(array, batch_sharding(mesh, np.ndim(array)))
