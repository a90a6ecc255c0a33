"""The training step and the held-out rewards as compiled calls (rmjax.compiled): the module and optimizer travel as
their nnx state (the graph definition is static), the data as arguments, so one compilation serves a whole run and
the step is traced under the model's mesh like every other model call. Only what a step changes comes back out.

Two objectives: `head` pairs read rows of a frozen-backbone feature matrix; the others run token sequences.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from rmjax.compiled import REPLICATED, ROWS, compiled
from rmjax.config import ModelConfig
from rmjax.train.rm import bradley_terry_loss


def feature_pair_rewards(m: nnx.Module, data: tuple, idx: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Rewards of chosen and rejected for pairs `idx`: data = (features [F, H], chosen rows [P], rejected rows [P])."""
    matrix, chosen, rejected = data
    return m.score(matrix[chosen[idx]])[:, 0], m.score(matrix[rejected[idx]])[:, 0]


def sequence_pair_rewards(m: nnx.Module, data: tuple, idx: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The same from token sequences: data = (ids [2, P, T], mask [2, P, T]), side 0 chosen, side 1 rejected."""
    ids, mask = data
    return m.rewards(ids[0][idx], mask[0][idx])[:, 0], m.rewards(ids[1][idx], mask[1][idx])[:, 0]


def _step(cfg: ModelConfig, moving: nnx.State, frozen: nnx.State, data: tuple, idx: jax.Array, label: jax.Array, *,
          graphdef: nnx.GraphDef, wrt: Any, pair_rewards: Callable) -> tuple[jax.Array, nnx.State]:
    module, optimizer = nnx.merge(graphdef, moving, frozen)

    def loss_fn(m):
        return bradley_terry_loss(*pair_rewards(m, data, idx), label)

    loss, grads = nnx.value_and_grad(loss_fn, argnums=nnx.DiffState(0, wrt))(module)
    optimizer.update(module, grads)
    return loss, nnx.state((module, optimizer), _moving(wrt))


def _moving(wrt: Any) -> Any:
    """What a step changes: the trained weights and the optimizer's state."""
    return nnx.Any(wrt, nnx.OptState)


class Steps:
    """A run's training steps. The module and optimizer are split once: what moves (trained weights, optimizer state)
    goes into each step and comes back, its old buffers donated; the frozen rest only goes in. A step that returned
    the whole model copied every frozen weight each time (120 ms a head-only step for SmolLM2-135M on 2 cores,
    BUILD_NOTES).
    The module and optimizer are stale between `write_back`s (their moving buffers are donated)."""

    def __init__(self, cfg: ModelConfig, mesh, module: nnx.Module, optimizer: nnx.Optimizer, wrt: Any,
                 pair_rewards: Callable, data: tuple, copy: bool = True, moving_shardings: nnx.State | None = None):
        self._parts = (module, optimizer)
        graphdef, moving, self.frozen = nnx.split(self._parts, _moving(wrt), ...)
        # the module shares its arrays with the loaded model: the steps donate copies (`copy=False`: the arrays
        # themselves, where the model is the run's alone: train_reward_model(consume=True), or abstract, for a plan)
        self.moving = jax.tree.map(jnp.copy, moving) if copy else moving
        self.data = data
        # sharded over `data` (FSDP), the moving state must come back as it went in: its shardings are pinned
        self.call = compiled(_step, cfg, mesh, (None, None, None, ROWS(1), ROWS(1)), (REPLICATED, moving_shardings),
                             donate=(0,), graphdef=graphdef, wrt=wrt, pair_rewards=pair_rewards)

    def __call__(self, idx: jax.Array, label: jax.Array) -> jax.Array:
        """One optimizer step on pairs `idx` (rows over the data); the loss."""
        loss, self.moving = self.call(self.moving, self.frozen, self.data, idx, label)
        return loss

    def write_back(self) -> None:
        """The module and optimizer as the steps so far left them (before evaluating or saving them)."""
        nnx.update(self._parts, self.moving)


def _pair_rewards(cfg: ModelConfig, state: nnx.State, data: tuple, idx: jax.Array, *, graphdef: nnx.GraphDef,
                  pair_rewards: Callable) -> tuple[jax.Array, jax.Array]:
    return pair_rewards(nnx.merge(graphdef, state), data, idx)


def pair_rewards_of(cfg: ModelConfig, mesh, module: nnx.Module, pair_rewards: Callable, data: tuple,
                    idx: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Rewards of chosen and rejected for pairs `idx` under the module as it is now (held-out evaluation)."""
    graphdef, state = nnx.split(module)
    return pair_rewards_call(cfg, mesh, graphdef, pair_rewards)(state, data, jnp.asarray(idx))


def pair_rewards_call(cfg: ModelConfig, mesh, graphdef: nnx.GraphDef, pair_rewards: Callable):
    """The compiled evaluation of `pair_rewards_of` (state, data, idx), for the module `graphdef` splits (what a
    plan lowers too)."""
    return compiled(_pair_rewards, cfg, mesh, (None, None, REPLICATED), REPLICATED, graphdef=graphdef,
                    pair_rewards=pair_rewards)
