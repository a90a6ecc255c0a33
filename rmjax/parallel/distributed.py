"""Multi-process (multi-host) JAX: initialization from flags or environment, global arrays, host copies.

Every process runs the same program over one global mesh; inputs are built as global arrays from
host data each process holds in full (each device receives only its slice), results are
all-gathered back to every host, and only process 0 writes files.
"""

from __future__ import annotations

import os
import re

import jax
import numpy as np
from jax.experimental import multihost_utils

from rmjax.errors import UsageError
from rmjax.parallel.processes import check_processes


def quiet_absent_tpu() -> None:
    """With libtpu installed (jax[tpu], which planning for TPU slices needs) on a machine with no TPU, libtpu's
    start-up writes complaints about TPU_WORKER_HOSTNAMES / TPU_ACCELERATOR_TYPE to stderr on every run: give it
    values that mean one host, before it starts. With no chip to share, processes need not take turns at libtpu's
    lockfile either (two plans at once, or tests). Only where no TPU chip is attached: a TPU VM's settings stand."""
    try:  # jax's own probe of attached TPU chips (private: under another jax, leave the environment alone)
        from jax._src import hardware_utils

        chips = hardware_utils.num_available_tpu_chips_and_device_id()[0]
    except (ImportError, AttributeError):
        return
    if chips == 0:
        os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
        os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-1")
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


def initialize(coordinator: str | None = None, num_processes: int | None = None,
               process_id: int | None = None) -> bool:
    """jax.distributed.initialize from arguments or RMJAX_COORDINATOR / RMJAX_NUM_PROCESSES /
    RMJAX_PROCESS_ID; coordinator "auto" lets JAX find its peers (TPU pods). Returns True when
    distributed initialization ran. A process count or id without a coordinator, or an id outside
    [0, num_processes), is a UsageError: it would otherwise run single-process and write alone."""
    coordinator = coordinator or os.environ.get("RMJAX_COORDINATOR", "").strip() or None
    num_processes = _env_int("RMJAX_NUM_PROCESSES") if num_processes is None else num_processes
    process_id = _env_int("RMJAX_PROCESS_ID") if process_id is None else process_id
    check_processes(coordinator, num_processes, process_id)
    if not coordinator:
        return False
    if coordinator == "auto":  # TPU pods / SLURM: JAX discovers the coordinator and process ids
        arguments = {}
    else:
        if jax.config.jax_platforms in (None, "", "cpu") or os.environ.get("JAX_PLATFORMS", "") == "cpu":
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
        arguments = dict(coordinator_address=coordinator, num_processes=num_processes, process_id=process_id)
    try:
        jax.distributed.initialize(**arguments)
    except ValueError as error:  # e.g. no process count, outside a cluster JAX can read it from
        fix = ("run it where JAX can find its peers (a TPU pod, SLURM) or give --coordinator=HOST:PORT"
               if coordinator == "auto" else "give --num_processes and --process_id (or $RMJAX_NUM_PROCESSES / "
               "$RMJAX_PROCESS_ID)")
        raise UsageError(f"--coordinator={coordinator}: jax.distributed cannot start ({error}); {fix} on every "
                         "process.") from None
    return True


def _env_int(name: str) -> int | None:
    """$name as a non-negative integer; None when unset or empty."""
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    if not re.fullmatch(r"[0-9]+", text):
        raise UsageError(f"${name}={text!r} is not a non-negative integer; set it to one or unset it.")
    return int(text)


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


def every_process(value: int) -> list[int]:
    """`value` as each process holds it, in process order (one collective every process must reach)."""
    if jax.process_count() == 1:
        return [value]
    return [int(v) for v in np.asarray(multihost_utils.process_allgather(np.int32(value)))]


def barrier(name: str) -> None:
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)
