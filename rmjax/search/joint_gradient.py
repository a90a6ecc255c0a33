"""The joint gradient of a reward model that is its own prior (rmjax.search.objective): one forward and backward
gives d(sign·R + λ·F's log-prob)/d one_hot and the prior's log-probs at every position of the turn."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from rmjax import nn
from rmjax.compiled import PARAMS, REPLICATED, Cache, Compiled, compiled, declared_params
from rmjax.config import ModelConfig
from rmjax.parallel.distributed import replicated
from rmjax.scoring import prior as prior_lib
from rmjax.scoring.prefix import append_kv
from rmjax.search import turns
from rmjax.search.gcg import Target, one_hot_forward, read_of_turn


def _joint_of_one_hot(cfg: ModelConfig, params, cache: nn.KVCache, one_hot, ids, suffix, first, weights, *,
                      column: int, fluent: bool, read_offset: int = 0):
    """weights · (R, F's log-prob term) of prefix + one_hot(ids) + suffix through a reward model that is its own
    prior (ids: a turn form, its last the end of turn: turns.fluency_weights): one forward gives the reward at its
    end and the prior's log-probs at the turn's positions (causal: the suffix after them does not change them).
    Aux: the forward's K/V and those log-probs [N, V]; without `fluent` (λ = 0) J reads only R, and the log-probs
    are the prior's proposals."""
    model = nn.module(params, cfg)
    out = one_hot_forward(model, cache, one_hot, ids, suffix)
    read = read_of_turn(model, cache, out.hidden, ids, suffix, read_offset)
    value = weights[0] * model.reward_head(read, cache.gate_input)[0, column]
    every = prior_lib.every_log_probs_of_hidden(model, out.hidden[0, : ids.shape[0]], first)
    if not fluent:
        return value, (out.kv, jax.lax.stop_gradient(every))
    fluency = turns.fluency_weights([ids.shape[0] - 1], ids.shape[0])[0].astype(np.float32)
    return value + weights[1] * jnp.sum(fluency * jnp.sum(one_hot * every, axis=-1)), (out.kv, every)


def _joint_gradient(cfg: ModelConfig, params, cache: nn.KVCache, ids, suffix, first, weights, *, column: int,
                    fluent: bool, read_offset: int = 0):
    one_hot = jax.nn.one_hot(ids, first.shape[0], dtype=jnp.float32)
    return jax.grad(_joint_of_one_hot, argnums=3, has_aux=True)(cfg, params, cache, one_hot, ids, suffix, first,
                                                                 weights, column=column, fluent=fluent,
                                                                 read_offset=read_offset)


def joint_gradient_call(cfg: ModelConfig, mesh, cache_width: int, column: int, fluent: bool, read_offset: int = 0
                        ) -> Compiled:
    """The compiled joint gradient: (params, prefix cache [1, cache_width], ids [N], suffix [S], first [V],
    weights [2]) -> (d weights·(R, F's log-prob) / d one_hot(ids) [N, V], (the forward's K/V, log-probs [N, V]))."""
    return compiled(_joint_gradient, cfg, mesh, (PARAMS, Cache(1, cache_width), *[REPLICATED] * 4),
                    (REPLICATED, (None, REPLICATED)), column=column, fluent=fluent, read_offset=read_offset)


def joint_gradient_on_device(target: Target, first: jax.Array, ids: np.ndarray, sign: float, lam: float,
                             fluent: bool, read_offset: int = 0) -> tuple[jax.Array, nn.KVCache, jax.Array]:
    """d (sign·R + λ·F's log-prob) / d one_hot(ids) [N, V] (λ only with `fluent`), the RM cache of prefix + ids and
    the prior's log-probs at every position [N, V], from one forward and backward of the RM (its own prior)."""
    m = target.model
    ids = np.asarray(ids, np.int32)
    call = joint_gradient_call(m.config, m.mesh, target.cache.k.shape[2], m.output_column, fluent, read_offset)
    weights = replicated(np.asarray([sign, lam], np.float32), m.mesh)
    grad, (kv, every) = call(declared_params(m), target.cache, replicated(ids, m.mesh), target.suffix_ids,
                             replicated(first, m.mesh), weights)
    return grad, append_kv(m, target.cache, kv, len(ids)), every
