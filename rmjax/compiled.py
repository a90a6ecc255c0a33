"""The one way a model call is compiled: (config, mesh, function, logical axes in and out) -> a cached jitted call
that runs under the mesh with the declared shardings.

Every compiled path goes through `compiled` (the sweep's scorer, prefill and cache extension, GCG's gradient and
evaluation, lens, attribution, patching, log-probs, text scoring, the training step), so

- weights enter where the loader put them (`PARAMS`: each weight's declared logical axes), caches with their K/V
  heads over `model` (`Cache`), rows over `data` (`ROWS`), everything else as declared (`Axes`);
- the call is traced with the mesh set, so the activations' constraints (`nn.layers.constrain`) apply on every
  path, not only on those that remembered to set it;
- one compilation serves every call with the same config, mesh, function, shapes and static arguments;
- every product runs at its weights' own precision (`MATMUL_PRECISION`), on every backend;
- an ahead-of-time plan (`Compiled.lower` on abstract arguments) lowers exactly what a job runs.

A function takes the config first, then its arrays, then static keywords: `fn(cfg, *arrays, **static)`.
"""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rmjax import nn
from rmjax.config import ModelConfig
from rmjax.parallel.sharding import RULES


class Axes(tuple):
    """Logical axes of one array (rmjax.parallel.sharding.RULES places them); `Axes()` is replicated. The caller
    makes a sharded dimension a multiple of its mesh axis (rmjax.parallel.batching.round_up)."""

    def __new__(cls, *names: str | None) -> Axes:
        return super().__new__(cls, names)


REPLICATED = Axes()

# JAX's default lets a float32 product round its inputs: to TF32 on an H200 (rewards of a 1B Llama off by 6e-3 SD
# against float64, 300x transformers' float32) and to one bfloat16 pass on a TPU, so `--dtype=float32` would not be
# float32 there. "highest" leaves bfloat16 operands' products as they were (same error and speed on an H200, the same
# TPU kernel); a bf16 weight read in float32 (an LM head) keeps the default (nn.ops.weight_precision). BUILD_NOTES ->
# Model and numerics -> On a GPU.
MATMUL_PRECISION = "highest"


def ROWS(ndim: int) -> Axes:  # noqa: N802 - reads as a constant at the call sites
    """Rows (the leading dimension) over `data`, the rest whole."""
    return Axes("batch", *([None] * (ndim - 1)))


def rows_of(n: int, ndim: int, mesh: Mesh | None) -> Axes:
    """`ROWS(ndim)` when the mesh's `data` axis divides the `n` rows, else replicated."""
    return ROWS(ndim) if mesh is None or n % mesh.shape["data"] == 0 else REPLICATED


class _Params:
    """The model's weights, each where its declaration puts it (rmjax.nn.shardings)."""

    def __repr__(self) -> str:
        return "PARAMS"


PARAMS = _Params()


@dataclasses.dataclass(frozen=True)
class Cache:
    """A KV cache of `batch` rows x `length` positions (rmjax.nn.KVCache.AXES)."""

    batch: int
    length: int


def _resolve(spec: Any, cfg: ModelConfig, mesh: Mesh) -> Any:
    """A spec tree -> the sharding tree jit takes (None stays None: jit infers it from the argument)."""
    if spec is None:
        return None
    if spec is PARAMS:
        return nn.shardings(cfg, mesh)
    if isinstance(spec, jax.sharding.Sharding):  # given as it is (a state's own shardings: rmjax.train.step)
        return spec
    if isinstance(spec, nnx.State):
        return jax.tree.map(lambda s: _resolve(s, cfg, mesh), spec)
    if isinstance(spec, Cache):
        return nn.KVCache.shardings(cfg, mesh, spec.batch, spec.length)
    if isinstance(spec, Axes):
        return NamedSharding(mesh, PartitionSpec(*(RULES.get(a) if a else None for a in spec)))
    if isinstance(spec, dict):
        return {k: _resolve(v, cfg, mesh) for k, v in spec.items()}
    if isinstance(spec, tuple | list):
        return type(spec)(_resolve(v, cfg, mesh) for v in spec)
    raise TypeError(f"not an axes spec: {spec!r}")


def _frozen(spec: Any) -> Any:
    """A hashable form of a spec tree (the cache key)."""
    if isinstance(spec, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in spec.items()))
    if isinstance(spec, list) or (isinstance(spec, tuple) and not isinstance(spec, Axes)):
        return tuple(_frozen(v) for v in spec)
    if isinstance(spec, nnx.State):
        return jax.tree.structure(spec), tuple(jax.tree.leaves(spec))
    return spec


@dataclasses.dataclass(frozen=True, eq=False)
class Compiled:
    """A jitted model call and the mesh it runs under (None: one device, no shardings declared)."""

    name: str
    jitted: Any
    mesh: Mesh | None
    in_axes: tuple
    out_axes: Any
    example: list = dataclasses.field(default_factory=list)  # the first call's arguments, abstract (for lower)

    def __call__(self, *args: Any) -> Any:
        if not self.example:
            self.example.append(jax.tree.map(_abstract, args))
        return self._under_mesh(self.jitted, args)

    def lower(self, *args: Any) -> jax.stages.Lowered:
        """Lowered for these (possibly abstract: jax.ShapeDtypeStruct) arguments, under the mesh."""
        return self._under_mesh(self.jitted.lower, args)

    def trace(self, *args: Any) -> jax.stages.Traced:
        """Traced (its jaxpr) for these arguments, under the mesh."""
        return self._under_mesh(self.jitted.trace, args)

    def _under_mesh(self, stage: Callable, args: tuple) -> Any:
        if self.mesh is None:
            return stage(*args)
        with jax.set_mesh(self.mesh):
            return stage(*args)


def _abstract(x: Any) -> Any:
    if not hasattr(x, "shape"):
        return x
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding if isinstance(x, jax.Array) else None)


def keep_compilations(folder: Path, min_seconds: float = 0.5) -> bool:
    """XLA's persistent compilation cache in `folder` (programs that took at least `min_seconds` to compile), so
    a job compiles each program once per machine, not once per process: on 2 CPU cores a frontier job on Gemma 3
    spends over a minute compiling its samplers, scorers and gradients. Left alone where a cache is already set
    (JAX_COMPILATION_CACHE_DIR), and off in a CPU process with several devices, where a program with collectives
    loaded back from the cache hangs in its first collective (jax 0.10.2, see tests/cli.py). Whether it is on."""
    if jax.config.jax_compilation_cache_dir is not None:
        return False
    if jax.default_backend() == "cpu" and jax.device_count() > 1:
        return False
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_seconds))
    return True


_CACHE: dict[tuple, Compiled] = {}
_CACHE_SIZE = 256


def release_near_map_limit(fraction: float = 0.5) -> bool:
    """Drop every compiled executable (jax's caches) when this process holds more than `fraction` of the
    kernel's memory-map limit (vm.max_map_count, 65,530 by default). XLA:CPU maps each executable's code in many
    small regions (about 17 for a tiny program, more for a larger one), and at the limit the next compile or
    persistent-cache load segfaults instead of raising: a test worker of the full suite reached it. The jitted
    calls stay (`made` still lists them) and compile again when next called, with the same results. Linux only
    (elsewhere a no-op); whether it released."""
    try:
        limit = int(Path("/proc/sys/vm/max_map_count").read_text())
        with open("/proc/self/maps", "rb") as maps:
            used = maps.read().count(b"\n")
    except (OSError, ValueError):
        return False
    if used <= fraction * limit:
        return False
    jax.clear_caches()
    gc.collect()
    return True


def compiled(fn: Callable[..., Any], cfg: ModelConfig, mesh: Mesh | None, in_axes: tuple, out_axes: Any = None,
             donate: tuple[int, ...] = (), **static: Any) -> Compiled:
    """`fn(cfg, *args, **static)` jitted with `in_axes` (one spec per positional argument) and `out_axes` (a spec
    tree matching the result, or None) resolved on `mesh`; cached by everything that changes the program. Static
    values must be hashable (ints, strings, configs, graph definitions). `donate`: positions of arguments whose
    buffers the call may reuse for its results (the caller drops them: a training step's moving state)."""
    key = (fn, cfg, mesh, _frozen(tuple(in_axes)), _frozen(out_axes), donate, tuple(sorted(static.items())))
    found = _CACHE.get(key)
    if found is not None:
        return found

    def body(*args: Any) -> Any:
        with jax.default_matmul_precision(MATMUL_PRECISION):
            return fn(cfg, *args, **static)

    body.__name__ = body.__qualname__ = getattr(fn, "__name__", "model_call")
    if mesh is None:
        jitted = jax.jit(body, donate_argnums=donate)
    else:
        jitted = jax.jit(body, in_shardings=_resolve(tuple(in_axes), cfg, mesh),
                         out_shardings=_resolve(out_axes, cfg, mesh), donate_argnums=donate)
    if len(_CACHE) >= _CACHE_SIZE:
        _CACHE.pop(next(iter(_CACHE)))  # the oldest: a long session's shapes come and go
    release_near_map_limit()  # a miss is followed by a compile, which costs far more than counting the maps
    made = _CACHE[key] = Compiled(body.__name__, jitted, mesh, tuple(in_axes), out_axes)
    return made


def made(name: str | None = None, mesh: Mesh | None = None) -> list[Compiled]:
    """The compiled calls this process holds (oldest first); those of the function called `name`, on `mesh`."""
    return [c for c in _CACHE.values() if (name is None or c.name == name) and (mesh is None or c.mesh == mesh)]


def declared_params(model) -> Any:
    """The model's params where `PARAMS` declares them (a no-op for a loaded model; a model whose weights were
    placed by hand, e.g. replicated, is moved once here instead of failing jit's sharding check)."""
    if model.mesh is None:
        return model.params
    return jax.device_put(model.params, nn.shardings(model.config, model.mesh))
