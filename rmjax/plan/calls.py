"""The compiled calls a job makes, with abstract arguments placed on a mesh: what `rmjax.plan` compiles.

Each job's calls come from the builders the job itself runs (rmjax.scoring.prefix, rmjax.train.step), so a plan
lowers the same functions with the same shardings; only the arrays are abstract (shape, dtype, sharding: no
weights are read).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rmjax import nn
from rmjax.compiled import Compiled
from rmjax.config import ModelConfig
from rmjax.loading.hf import numpy_dtype
from rmjax.parallel import batching, sharding
from rmjax.scoring.prefix import PREFIX_BUCKET, batch_scorer, prefill_call
from rmjax.train.step import Steps, feature_pair_rewards, sequence_pair_rewards


@dataclasses.dataclass(frozen=True)
class Call:
    """One compiled call of a job: the call, its abstract arguments, how often the job makes it."""

    name: str
    call: Compiled
    args: tuple
    count: int
    weights: Any = None  # the argument that holds the model's weights (its per-chip bytes), if any
    cache: Any = None  # the argument that holds a KV cache, if any


def abstract_params(cfg: ModelConfig, dtype: str, mesh: Mesh) -> nnx.State:
    """The weights as the loader would place them on `mesh`: shape, dtype and declared sharding, no values."""
    shapes = nnx.state(nn.abstract(cfg, jnp.dtype(numpy_dtype(dtype))))
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), shapes,
                        nn.shardings(cfg, mesh))


def _array(shape: tuple[int, ...], dtype, mesh: Mesh, *spec: str | None) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, PartitionSpec(*spec)))


def _outputs(call: Compiled, args: tuple) -> Any:
    """The abstract results of `call` (shape, dtype, sharding), to feed the calls that take them."""
    return jax.tree.map(lambda o: jax.ShapeDtypeStruct(o.shape, o.dtype, sharding=o.sharding),
                        call.lower(*args).out_info)


def sweep_calls(cfg: ModelConfig, dtype: str, mesh: Mesh, *, prompts: int, prefix_tokens: int, suffix_tokens: int,
                candidates: int, batch_size: int, column: int = 0) -> list[Call]:
    """A one-token sweep: per prompt one prefill of the bucketed prefix, then the candidates in batches of
    `batch_size` (rounded up to the data axis), each batch scored after the shared cache."""
    params = abstract_params(cfg, dtype, mesh)
    width = batching.bucket(prefix_tokens, PREFIX_BUCKET)
    prefill = prefill_call(cfg, mesh, width)
    prefill_args = (params, _array((1, width), jnp.int32, mesh), _array((1, width), jnp.bool_, mesh))
    cache = _outputs(prefill, prefill_args)
    batch = batching.round_up(batch_size, mesh)
    scorer = batch_scorer(cfg, mesh, width, column)
    score_args = (params, cache, _array((batch, 1), jnp.int32, mesh, "data"),
                  _array((suffix_tokens,), jnp.int32, mesh))
    return [Call("prefill", prefill, prefill_args, prompts, params),
            Call("score_batch", scorer, score_args, prompts * math.ceil(candidates / batch), params, cache)]


def train_calls(cfg: ModelConfig, dtype: str, mesh: Mesh, *, trainable: str, last_k: int, steps: int,
                batch_size: int, pairs: int, responses: int, sequence_tokens: int) -> list[Call]:
    """One training step of `trainable` (rmjax.train.loop: a head-only run reads a feature matrix of
    `responses` rows, the others token sequences of `sequence_tokens`), made `steps` times."""
    from rmjax.train.loop import TrainConfig, make_optimizer, trainable_part

    train_cfg = TrainConfig(trainable=trainable, last_k=last_k, steps=steps, batch_size=batch_size)

    class Shapes:  # what trainable_part reads of a Model
        config = cfg
        module = None

    filters = []

    def parts():
        Shapes.module = nn.Transformer(cfg, jnp.dtype(numpy_dtype(dtype)))
        module, wrt = trainable_part(Shapes, train_cfg)
        filters.append(wrt)
        return module, nnx.Optimizer(module, make_optimizer(train_cfg), wrt=wrt)

    module, optimizer = nnx.eval_shape(parts)
    wrt = filters[0]
    if trainable == "head":
        data = (_array((responses, cfg.hidden_size), jnp.float32, mesh), _array((pairs,), jnp.int32, mesh),
                _array((pairs,), jnp.int32, mesh))
        pair_rewards = feature_pair_rewards
    else:
        data = (_array((2, pairs, sequence_tokens), jnp.int32, mesh),
                _array((2, pairs, sequence_tokens), jnp.bool_, mesh))
        pair_rewards = sequence_pair_rewards
    runner = Steps(cfg, mesh, module, optimizer, wrt, pair_rewards, data, copy=False)
    rows = _array((batching.round_up(batch_size, mesh),), jnp.int32, mesh, "data")
    label = _array(rows.shape, jnp.float32, mesh, "data")
    args = (_placed(runner.moving, mesh), _placed(runner.frozen, mesh), data, rows, label)
    return [Call("train_step", runner.call, args, steps, _placed(nnx.state(module, nnx.Param), mesh))]


def _placed(state: nnx.State, mesh: Mesh) -> nnx.State:
    """Abstract variables with the sharding their declared axes give (an optimizer's moments inherit their
    weight's axes; counts are replicated)."""
    def place(var):
        value = var.get_value()
        axes = var.get_metadata().get("axes") or ()
        spec = sharding.named_sharding(tuple(axes), value.shape, mesh) if axes else NamedSharding(mesh, PartitionSpec())
        return var.replace(value=jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=spec))

    return jax.tree.map(place, state, is_leaf=lambda x: isinstance(x, nnx.Variable))
