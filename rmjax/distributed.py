"""Multi-process (multi-host) JAX: initialization from flags or environment, global arrays, host copies.

Every process runs the same program over one global mesh; inputs are built as global arrays from
host data each process holds in full (each device receives only its slice), results are
all-gathered back to every host, and only process 0 writes files.
"""

from __future__ import annotations

import os

import jax
import numpy as np
from jax.experimental import multihost_utils


def initialize(coordinator: str | None = None, num_processes: int | None = None,
               process_id: int | None = None) -> bool:
    """jax.distributed.initialize from arguments or RMJAX_COORDINATOR / RMJAX_NUM_PROCESSES /
    RMJAX_PROCESS_ID; coordinator "auto" lets JAX find its peers (TPU pods). Returns True when
    distributed initialization ran."""
    coordinator = coordinator or os.environ.get("RMJAX_COORDINATOR")
    num_processes = num_processes or int(os.environ.get("RMJAX_NUM_PROCESSES", "0") or 0) or None
    if process_id is None and os.environ.get("RMJAX_PROCESS_ID"):
        process_id = int(os.environ["RMJAX_PROCESS_ID"])
    if not coordinator:
        return False
    if coordinator == "auto":  # TPU pods / SLURM: JAX discovers the coordinator and process ids
        jax.distributed.initialize()
        return True
    if jax.config.jax_platforms in (None, "", "cpu") or os.environ.get("JAX_PLATFORMS", "") == "cpu":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes, process_id=process_id)
    return True


def is_main() -> bool:
    return jax.process_index() == 0


def global_array(host: np.ndarray, sharding: jax.sharding.Sharding) -> jax.Array:
    """A global array from host data every process holds in full; each device gets its slice."""
    host = np.asarray(host)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def replicated(tree, mesh):
    """Host arrays -> global arrays replicated over the mesh (no-op without a mesh)."""
    if mesh is None:
        return tree
    full = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    return jax.tree.map(lambda x: global_array(np.asarray(x), full), tree)


def to_host(x: jax.Array) -> np.ndarray:
    """The full value on every host (all-gathered when the array spans several processes)."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)


def barrier(name: str) -> None:
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)
