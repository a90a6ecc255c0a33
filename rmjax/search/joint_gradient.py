"""The joint gradient of a reward model that is its own prior (rmjax.search.objective): one forward and backward
gives d(sign·R + λ·F's log-prob)/d one_hot and the prior's log-probs at every position of the turn."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from rmjax import nn
from rmjax.compiled import PARAMS, REPLICATED, Cache, Compiled, compiled, declared_params
from rmjax.config import ModelConfig
from rmjax.nn import ops
from rmjax.parallel.distributed import replicated
from rmjax.scoring import prior as prior_lib
from rmjax.scoring.prefix import append_kv
from rmjax.search import turns
from rmjax.search.gcg import Target

FILLER = 0  # the id after a shorter turn's suffix: masked, so any id serves


def _joint_of_one_hot(cfg: ModelConfig, params, cache: nn.KVCache, one_hot, seq, n, first, weights, fluency, *,
                      column: int, fluent: bool, tail: int, read_offset: int = 0):
    """weights · (R, F's log-prob term) of prefix + one_hot(seq) through a reward model that is its own prior: seq
    [T] holds the turn's n ids (its last the end of turn: turns.fluency_weights, `fluency` [T], zero past them),
    the suffix's `tail`, then filler up to the longest turn (masked padding, never read), so that every length
    compiles one program. One forward gives the reward and the
    prior's log-probs at every position. Aux: the forward's K/V and those log-probs [T, V]; without `fluent`
    (λ = 0) J reads only R, and the log-probs are the prior's proposals."""
    model = nn.module(params, cfg)
    # the filler is padding (zero rows, never a key): a filler token whose row is not finite in the forward made the
    # turn's own values NaN too (attention weight 0 x NaN value; helper-163)
    real = (jnp.arange(seq.shape[0]) < n + tail)[None]
    out = model(embeds=ops.one_hot_rows(one_hot, model.embed.embedding[...], seq)[None], mask=real, cache=cache)
    read = model.read(out.hidden, (jnp.arange(seq.shape[0]) < n + tail - read_offset)[None], seq[None], cache)
    value = weights[0] * model.reward_head(read, cache.gate_input)[0, column]
    every = prior_lib.every_log_probs_of_hidden(model, out.hidden[0], first)
    if not fluent:
        return value, (out.kv, jax.lax.stop_gradient(every))
    return value + weights[1] * jnp.sum(fluency * jnp.sum(one_hot * every, axis=-1)), (out.kv, every)


def _joint_gradient(cfg: ModelConfig, params, cache: nn.KVCache, seq, n, first, weights, fluency, *, column: int,
                    fluent: bool, tail: int, read_offset: int = 0):
    one_hot = jax.nn.one_hot(seq, first.shape[0], dtype=jnp.float32)
    return jax.grad(_joint_of_one_hot, argnums=3, has_aux=True)(cfg, params, cache, one_hot, seq, n, first, weights,
                                                                 fluency, column=column, fluent=fluent, tail=tail,
                                                                 read_offset=read_offset)


def joint_gradient_call(cfg: ModelConfig, mesh, cache_width: int, column: int, fluent: bool, tail: int,
                        read_offset: int = 0) -> Compiled:
    """The compiled joint gradient: (params, prefix cache [1, cache_width], seq [T] (turn, suffix, filler), n [],
    first [V], weights [2], fluency [T]) -> (d weights·(R, F's log-prob) / d one_hot(seq) [T, V], (the forward's
    K/V, log-probs [T, V]))."""
    return compiled(_joint_gradient, cfg, mesh, (PARAMS, Cache(1, cache_width), *[REPLICATED] * 5),
                    (REPLICATED, (None, REPLICATED)), column=column, fluent=fluent, tail=tail,
                    read_offset=read_offset)


def joint_gradient_on_device(target: Target, first: jax.Array, ids: np.ndarray, sign: float, lam: float,
                             fluent: bool, read_offset: int = 0, longest: int | None = None
                             ) -> tuple[jax.Array, nn.KVCache, jax.Array]:
    """d (sign·R + λ·F's log-prob) / d one_hot(ids) [N, V] (λ only with `fluent`), the RM cache of prefix + ids and
    the prior's log-probs at every position [N, V], from one forward and backward of the RM (its own prior). A
    search whose turns are at most `longest` ids runs each length in one program."""
    m = target.model
    ids = np.asarray(ids, np.int32)
    n, suffix = len(ids), np.asarray(target.suffix, np.int32)
    seq = np.full(max(n, longest or 0) + len(suffix), FILLER, np.int32)
    seq[:n], seq[n : n + len(suffix)] = ids, suffix
    fluency = np.zeros(len(seq), np.float32)
    fluency[:n] = turns.fluency_weights([n - 1], n)[0]
    call = joint_gradient_call(m.config, m.mesh, target.cache.k.shape[2], m.output_column, fluent, len(suffix),
                               read_offset)
    weights = replicated(np.asarray([sign, lam], np.float32), m.mesh)
    grad, (kv, every) = call(declared_params(m), target.cache, *(replicated(a, m.mesh) for a in (
        seq, np.int32(n), first, weights, fluency)))
    if len(seq) > n:
        grad, every = grad[:n], every[:n]
    return grad, append_kv(m, target.cache, kv, n), every
