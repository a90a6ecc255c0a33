"""Jitted entry points over the nnx Transformer: `params` (its nnx state) and a static config in,
arrays out. Scoring, prefix caching, log-probs and per-layer reads are all the one forward
(rmjax.nn.Transformer.__call__); these wrappers only jit and pick outputs.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from rmjax import nn
from rmjax.config import ModelConfig
from rmjax.errors import UsageError
from rmjax.nn import Forward, KVCache, at_last, last_token_index, module
from rmjax.nn.transformer import positions_from_mask

__all__ = [
    "Forward", "KVCache", "extend_cache", "forward", "last_hidden", "last_hidden_after", "last_token_index", "logits",
    "next_token_log_probs", "positions_from_mask", "prefill", "rewards", "rewards_after", "trace",
]

Params = nnx.State


def forward(params: Params, cfg: ModelConfig, **inputs) -> Forward:
    """The forward with named outputs (hidden, kv, residuals); see Transformer.__call__."""
    return module(params, cfg)(**inputs)


def extend_cache(cache: KVCache, new: KVCache) -> KVCache:
    """Append a forward's K/V to a cache (for incremental decoding; the sweep never copies)."""
    return KVCache(
        k=jnp.concatenate([cache.k, new.k], axis=2),
        v=jnp.concatenate([cache.v, new.v], axis=2),
        positions=jnp.concatenate([cache.positions, new.positions], axis=-1),
        valid=jnp.concatenate([cache.valid, new.valid], axis=-1),
        gate_input=cache.gate_input,
    )


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
def last_hidden(params: Params, cfg: ModelConfig, ids: jax.Array, mask: jax.Array) -> jax.Array:
    return at_last(forward(params, cfg, ids=ids, mask=mask).hidden, mask)


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


@dataclasses.dataclass
class Model:
    """A loaded model: static config, parameters (possibly sharded), tokenizer."""

    config: ModelConfig
    params: nnx.State  # the nnx state of `module` (rmjax.nn.Transformer)
    tokenizer: Any
    source: str
    dtype: str = "float32"
    mesh: jax.sharding.Mesh | None = None
    load_seconds: float = 0.0
    raw_config: dict = dataclasses.field(default_factory=dict)  # config.json as read (for saving)
    weight_bytes: int = 0  # the parameters' size in the loaded dtype
    weight_bytes_read: int = 0  # what this process read from disk for its own devices' shards
    fingerprint: dict | None = None  # {"weights", "tokenizer"} content digests (rmjax.loading.identity)
    fingerprint_of: tuple[int, int] | None = None  # id() of the params and tokenizer it describes
    output_column: int = 0  # which head output jobs read (a run option: --output_column), not architecture

    def __post_init__(self):
        if self.fingerprint is not None and self.fingerprint_of is None:
            self.fingerprint_of = (id(self.params), id(self.tokenizer))

    def stamp(self, fingerprint: dict | None) -> Model:
        """Record the fingerprint of the current params and tokenizer (after loading or placing them)."""
        self.fingerprint, self.fingerprint_of = fingerprint, (id(self.params), id(self.tokenizer))
        return self

    @property
    def module(self) -> nn.Transformer:
        """The model as an nnx module sharing these params (nnx.display, nnx.state, per-layer calls)."""
        return nn.module(self.params, self.config)

    @property
    def chat_template(self) -> str | None:
        return getattr(self.tokenizer, "chat_template", None) if self.tokenizer is not None else None


def require_reward_model(cfg: ModelConfig, source: str, job: str = "scoring") -> None:
    """The one refusal of a causal LM where a reward head is needed (before or after the weights load)."""
    if not cfg.is_reward_model:
        raise UsageError(f"{source} has no score head ({cfg.architecture}); {job} needs a reward model "
                         "(*ForSequenceClassification). For a causal LM use experiments.logprobs.")
