"""The forward's calls jitted over `(params, config)`, for tests that hold a params tree and a config (not a loaded
Model, and sometimes a changed config): the library's own calls go through rmjax.compiled."""

from __future__ import annotations

import functools

import jax
from flax import nnx

from rmjax.config import ModelConfig
from rmjax.nn import Forward, KVCache, at_last, module

__all__ = ["extend_cache", "forward", "last_hidden_after", "logits", "module", "next_token_log_probs",
           "prefill", "rewards", "rewards_after", "trace"]

Params = nnx.State


def forward(params: Params, cfg: ModelConfig, **inputs) -> Forward:
    """The forward with named outputs (hidden, kv, residuals); see Transformer.__call__."""
    return module(params, cfg)(**inputs)


def extend_cache(cache: KVCache, new: KVCache) -> KVCache:
    """Append a forward's K/V to a cache (incremental decoding)."""
    return cache.append(new)


@functools.partial(jax.jit, static_argnames=("cfg",))
def rewards(params: Params, cfg: ModelConfig, ids: jax.Array, mask: jax.Array) -> jax.Array:
    """All head outputs at each row's last real token: [B, num_outputs] float32."""
    return module(params, cfg).rewards(ids, mask)


@functools.partial(jax.jit, static_argnames=("cfg",))
def logits(params: Params, cfg: ModelConfig, ids: jax.Array, mask: jax.Array) -> jax.Array:
    """LM logits at every position: [B, T, vocab] float32."""
    m = module(params, cfg)
    return m.lm_logits(m(ids=ids, mask=mask).hidden)


@functools.partial(jax.jit, static_argnames=("cfg",))
def prefill(params: Params, cfg: ModelConfig, ids: jax.Array, mask: jax.Array | None = None) -> KVCache:
    """K/V of a prefix, computed once and reused by every continuation (with a gated head's input)."""
    return module(params, cfg).prefill(ids, mask)


@functools.partial(jax.jit, static_argnames=("cfg",))
def last_hidden_after(params: Params, cfg: ModelConfig, cache: KVCache, ids: jax.Array,
                      mask: jax.Array | None = None) -> jax.Array:
    """Final-normed hidden state at each row's last real new token after the cached prefix: [B, H]."""
    return module(params, cfg).last_hidden_after(cache, ids, mask)


@functools.partial(jax.jit, static_argnames=("cfg",))
def rewards_after(params: Params, cfg: ModelConfig, cache: KVCache, ids: jax.Array,
                  mask: jax.Array | None = None) -> jax.Array:
    """Head outputs for `cache` prefix + `ids`, at each row's last real new token."""
    return module(params, cfg).rewards_after(cache, ids, mask)


@functools.partial(jax.jit, static_argnames=("cfg",))
def trace(params: Params, cfg: ModelConfig, ids: jax.Array, mask: jax.Array) -> dict[str, jax.Array]:
    """Every stage of one forward (Transformer.trace): embeddings, residual after each layer, hidden, head."""
    return module(params, cfg).trace(ids, mask)


@functools.partial(jax.jit, static_argnames=("cfg",))
def next_token_log_probs(params: Params, cfg: ModelConfig, ids: jax.Array, mask: jax.Array) -> jax.Array:
    """Log-probs of the token after each row's last real token: [B, vocab] float32."""
    m = module(params, cfg)
    return jax.nn.log_softmax(m.lm_logits(at_last(m(ids=ids, mask=mask).hidden, mask)), axis=-1)


