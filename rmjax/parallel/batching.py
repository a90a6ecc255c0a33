"""The one way rows reach a device: batch sizes rounded up to the `data` axis, token rows padded left
or right into fixed shapes (one compilation per shape), batches placed with rows over `data`.

Used by the sweep, text scoring, GCG, log-probs and training.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

import jax
import numpy as np

from rmjax.parallel.distributed import global_array, to_host
from rmjax.parallel.sharding import batch_sharding

T = TypeVar("T")


def data_shards(mesh: jax.sharding.Mesh | None) -> int:
    return mesh.shape["data"] if mesh is not None else 1


def model_shards(mesh: jax.sharding.Mesh | None) -> int:
    return mesh.shape["model"] if mesh is not None else 1


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


MIN_DECODE_ROWS = 8


def decode_rows(count: int, batch_size: int, mesh: jax.sharding.Mesh | None) -> int:
    """Rows of a decoding loop's batch for `count` items (at most the batch size): a power of two, at least
    MIN_DECODE_ROWS. Each row count compiled a program of its own (a search's sampler 4 to 6, its completion check
    6; helper-165), and padding a small count costs less than a compile: the sampler's 8-token call took 460 ms at
    8 rows against 337 at 1, its compile 1.35 s (`python bench/decode_rows.py`, SmolLM2-135M, 2-core CPU); a
    search meets counts under 8 a few times, near its budget's end."""
    return min(round_up(batch_size, mesh), rows_for(max(count, MIN_DECODE_ROWS), data_shards(mesh)))


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


CPU_IN_FLIGHT = 4  # batches a multi-device CPU mesh may have dispatched and unread (`dispatched`)


def dispatched(batches: Iterable[T], mesh: jax.sharding.Mesh | None, result: Callable[[T], object] = lambda e: e
               ) -> list[T]:
    """Every batch of `batches` (an iterator whose each step dispatches one: device work returned unread, with the
    caller's bookkeeping; `result(entry)` picks its device outputs), dispatched before any is read, so the host
    never waits between them. On a CPU mesh of several devices at most CPU_IN_FLIGHT wait unread: XLA:CPU (jax
    0.10.2) hangs, then aborts the process, when ~30 or more multi-device programs wait at once (a 4-device score
    of 400 batches; 128 calls of a plain 4-device jit); at 5 in flight 1,000 ran."""
    bounded = mesh is not None and mesh.devices.size > 1 and mesh.devices.flat[0].platform == "cpu"
    pending = []
    for entry in batches:
        pending.append(entry)
        if bounded and len(pending) > CPU_IN_FLIGHT:
            jax.block_until_ready(result(pending[-1 - CPU_IN_FLIGHT]))
    return pending


def in_batches(call: Callable, rows: np.ndarray, batch_size: int, mesh: jax.sharding.Mesh | None, outputs: int = 1
               ) -> tuple[np.ndarray, ...]:
    """`call(batch)` on token rows [W, N] `batch_size` rows at a time (the last padded, so one compilation serves
    all), placed over `data` and `dispatched`. The call gives `outputs` arrays (one array when 1) whose first axis is
    the batch: each concatenated over the batches to W rows, float32."""
    def each():
        for start in range(0, len(rows), batch_size):
            part = rows[start : start + batch_size]
            padded, _ = pad_rows(part, rows.shape[1], num_rows=batch_size)
            result = call(place(padded, mesh))
            yield len(part), result if outputs > 1 else (result,)

    pending = dispatched(each(), mesh, lambda entry: entry[1])
    if not pending:
        return tuple(np.zeros(0, np.float32) for _ in range(outputs))
    return tuple(np.concatenate([to_host(r[k])[:n] for n, r in pending]).astype(np.float32) for k in range(outputs))


def place(array: np.ndarray, mesh: jax.sharding.Mesh | None):
    """Rows over the mesh's `data` axis (as is without a mesh)."""
    if mesh is None:
        return array
    return global_array(array, batch_sharding(mesh, np.ndim(array)))
