"""The model's parameters as nnx state, and what every consumer reads from the declarations.

`params` throughout rmjax is the `nnx.State` of a `Transformer` (a pytree: jit, grad and orbax take it
as is); `module(params, cfg)` rebuilds the module around it (inside jit: free at run time). Paths
are dotted ('layers.q', 'score.kernel', 'head.gate0') and name the same weights as the module.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from rmjax.config import ModelConfig
from rmjax.nn.transformer import Transformer
from rmjax.parallel import sharding


@dataclasses.dataclass(frozen=True)
class Declaration:
    """One weight as its module declares it."""

    path: str
    shape: tuple[int, ...]
    axes: tuple[str | None, ...]
    float32: bool  # kept in float32 whatever the backbone dtype

    def dtype(self, backbone_dtype) -> Any:
        return jnp.float32 if self.float32 else backbone_dtype

    @property
    def size(self) -> int:
        return math.prod(self.shape)


def _dotted(path: tuple) -> str:
    return ".".join(str(p) for p in path)


def abstract(cfg: ModelConfig, dtype=jnp.float32) -> Transformer:
    """The module with ShapeDtypeStruct leaves (no memory): what loaders fill and the zoo counts."""
    return nnx.eval_shape(lambda: Transformer(cfg, dtype))


@functools.lru_cache(maxsize=64)
def graphdef(cfg: ModelConfig) -> nnx.GraphDef:
    return nnx.graphdef(abstract(cfg))


@functools.lru_cache(maxsize=64)
def _declarations(cfg: ModelConfig) -> tuple[Declaration, ...]:
    out = []
    for path, var in nnx.to_flat_state(nnx.state(abstract(cfg))):
        meta = var.get_metadata()
        out.append(Declaration(_dotted(path), tuple(var.shape), tuple(meta["axes"]), bool(meta["float32"])))
    return tuple(out)


def declarations(cfg: ModelConfig) -> dict[str, Declaration]:
    """Every weight of `cfg`'s model by dotted path, read from the modules' declarations."""
    return {d.path: d for d in _declarations(cfg)}


def module(params: nnx.State, cfg: ModelConfig) -> Transformer:
    """The Transformer with `params` as its weights (new variables: updating the module, e.g. by an
    optimizer, never changes `params`, whose identity fingerprints rely on)."""
    return nnx.merge(graphdef(cfg), params, copy=True)


def flat(params: nnx.State) -> dict[str, jax.Array]:
    """{dotted path: array} of every weight."""
    return {_dotted(path): var[...] for path, var in nnx.to_flat_state(params)}


def from_flat(cfg: ModelConfig, arrays: Mapping[str, Any]) -> nnx.State:
    """nnx state of `cfg`'s model from {dotted path: array}; every declared weight must be given."""
    decl = nnx.to_flat_state(nnx.state(abstract(cfg)))
    missing = [_dotted(p) for p, _ in decl if _dotted(p) not in arrays]
    extra = set(arrays) - {_dotted(p) for p, _ in decl}
    if missing or extra:
        raise ValueError(f"weights do not match the model: missing {missing}, unexpected {sorted(extra)}")
    return nnx.from_flat_state([(p, var.replace(value=arrays[_dotted(p)])) for p, var in decl])


def replace(params: nnx.State, cfg: ModelConfig, **changes: Any) -> nnx.State:
    """A new state with some weights replaced, e.g. replace(params, cfg, **{'score.kernel': w})."""
    return from_flat(cfg, {**flat(params), **changes})


def get(params: nnx.State, path: str) -> jax.Array:
    node = params
    for part in path.split("."):
        node = node[part]
    return node[...]


@functools.lru_cache(maxsize=32)
def shardings(cfg: ModelConfig, mesh: jax.sharding.Mesh) -> nnx.State:
    """NamedSharding of every weight on `mesh`, from its declared logical axes (a state-shaped tree, for
    jit's in_shardings); the same placement the loader gives."""
    return from_flat(cfg, {d.path: sharding.named_sharding(d.axes, d.shape, mesh) for d in _declarations(cfg)})
