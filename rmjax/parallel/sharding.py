"""Device meshes and the rules that place logical axes on them.

A mesh has named axes `data` (candidates / batch) and `model` (heads, MLP, vocab). Changing
the parallelism strategy is an edit of RULES, not of the model code.
"""

from __future__ import annotations

import math

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rmjax.parallel.mesh_spec import parse_mesh_spec

# Logical axis -> mesh axis (None: replicated).
RULES: dict[str, str | None] = {
    "batch": "data",
    "vocab": "model",
    "heads": "model",
    "kv_heads": "model",
    "mlp": "model",
    "embed": None,
    "head_dim": None,
    "layers": None,
    "labels": None,
}


def make_mesh(spec: str | dict[str, int] = "data:-1,model:1", devices=None) -> Mesh:
    """A ('data', 'model') mesh over `devices` (default: all devices)."""
    sizes = parse_mesh_spec(spec) if isinstance(spec, str) else dict(spec)
    devices = list(jax.devices() if devices is None else devices)
    known = math.prod(s for s in sizes.values() if s != -1)
    for name, size in sizes.items():
        if size == -1:
            sizes[name] = max(1, len(devices) // known)
    if sizes["data"] * sizes["model"] != len(devices):
        raise ValueError(mesh_mismatch(sizes["data"], sizes["model"], len(devices)))
    grid = np.asarray(devices).reshape(sizes["data"], sizes["model"])
    return Mesh(grid, ("data", "model"))


def mesh_mismatch(data: int, model: int, devices: int) -> str:
    """Why a data x model mesh does not fit `devices`: a mesh uses every device, so data x model must equal
    their number; with a valid shape to use instead (the same model size where it divides them)."""
    shape = f"data:{devices // model},model:{model}" if model <= devices and devices % model == 0 else \
        f"data:{devices},model:1"
    return (f"mesh data:{data} x model:{model} needs {data * model} devices, {devices} available: a mesh must use "
            f"every device (data x model = {devices}), e.g. --mesh={shape}")


def spec_for(axes: tuple[str | None, ...], shape: tuple[int, ...], mesh: Mesh) -> PartitionSpec:
    """PartitionSpec from logical axes; a dimension the mesh axis does not divide stays replicated."""
    parts = []
    for axis, dim in zip(axes, shape, strict=False):
        mesh_axis = RULES.get(axis) if axis else None
        if mesh_axis is not None and dim % mesh.shape[mesh_axis] != 0:
            mesh_axis = None
        parts.append(mesh_axis)
    return PartitionSpec(*parts)


def named_sharding(
    axes: tuple[str | None, ...], shape: tuple[int, ...], mesh: Mesh
) -> NamedSharding:
    return NamedSharding(mesh, spec_for(axes, shape, mesh))


def fsdp_spec(spec: PartitionSpec, shape: tuple[int, ...], mesh: Mesh) -> PartitionSpec:
    """The FSDP rule (ZeRO-3) for a trained weight or its optimizer state: its largest dimension that no mesh axis
    holds and `data` divides goes over `data` too, so each chip keeps 1/data of it; XLA gathers a layer's weights
    where they are used and reduce-scatters their gradients. A weight no such dimension has stays as it was."""
    data = mesh.shape["data"]
    parts = list(spec) + [None] * (len(shape) - len(spec))
    if data == 1 or "data" in parts:
        return PartitionSpec(*parts)
    free = [i for i, (part, dim) in enumerate(zip(parts, shape, strict=True)) if part is None and dim % data == 0]
    if free:
        parts[max(free, key=lambda i: shape[i])] = "data"
    return PartitionSpec(*parts)


def shard_over_data(tree, mesh: Mesh | None):
    """`tree` with every mesh-placed array resharded by `fsdp_spec` (scalars and unplaced leaves as they are)."""
    if mesh is None:
        return tree

    def reshard(x):
        if not isinstance(x, jax.Array) or not isinstance(x.sharding, NamedSharding) or x.ndim == 0:
            return x
        new = NamedSharding(mesh, fsdp_spec(x.sharding.spec, x.shape, mesh))
        # unchanged (nothing `data` divides): the array itself, not a new one sharing its buffers (deleting the
        # loaded original would delete it: rmjax.train.loop._give_up)
        return x if new.is_equivalent_to(x.sharding, x.ndim) else jax.device_put(x, new)

    return jax.tree.map(reshard, tree)


def place(array, axes: tuple[str | None, ...], mesh: Mesh | None) -> jax.Array:
    """Put a host (or lazily read) array on the mesh, each device receiving only its own slice.

    JAX asks only for this process's devices' slices, but once per device for a partly replicated sharding (a
    `model`-sharded weight on data:D,model:M: D times each slice), so slices are read once each here, keyed by
    their index: with a lazily read checkpoint a process reads each byte it needs once.
    """
    if mesh is None:
        return jax.numpy.asarray(np.asarray(array))
    sharding = named_sharding(axes, array.shape, mesh)
    read: dict[tuple, np.ndarray] = {}

    def slice_of(index: tuple) -> np.ndarray:
        key = tuple((i.start, i.stop, i.step) if isinstance(i, slice) else i for i in index)
        if key not in read:
            read[key] = np.asarray(array[index])
        return read[key]

    return jax.make_array_from_callback(array.shape, sharding, slice_of)


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
    """Shard the leading (batch) dimension over `data`."""
    return NamedSharding(mesh, PartitionSpec("data", *([None] * (ndim - 1))))
