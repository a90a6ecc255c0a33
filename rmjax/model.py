"""Parameters and the one forward pass that serves scoring, prefix caching, log-probs and GCG.

Parameters are registered dataclasses (pytrees); layer weights are stacked on a leading
`layers` axis so the decoder runs as one `lax.scan` (compile time independent of depth).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from rmjax import heads, ops
from rmjax.config import ModelConfig, embedding_scale

# Logical axis names of every parameter; rmjax.sharding maps them onto mesh axes.
LAYER_AXES = {
    "attn_norm": ("layers", "embed"),
    "q": ("layers", "embed", "heads", "head_dim"),
    "k": ("layers", "embed", "kv_heads", "head_dim"),
    "v": ("layers", "embed", "kv_heads", "head_dim"),
    "o": ("layers", "heads", "head_dim", "embed"),
    "q_norm": ("layers", "head_dim"),
    "k_norm": ("layers", "head_dim"),
    "post_attn_norm": ("layers", "embed"),
    "mlp_norm": ("layers", "embed"),
    "gate": ("layers", "embed", "mlp"),
    "up": ("layers", "embed", "mlp"),
    "down": ("layers", "mlp", "embed"),
    "post_mlp_norm": ("layers", "embed"),
}
MODEL_AXES = {
    "embed": ("vocab", "embed"),
    "final_norm": ("embed",),
    "lm_head": ("embed", "vocab"),
    "score": ("embed", "labels"),
}


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class LayerParams:
    """Decoder-layer weights stacked over layers; optional fields are None where unused."""

    attn_norm: jax.Array
    q: jax.Array
    k: jax.Array
    v: jax.Array
    o: jax.Array
    mlp_norm: jax.Array
    gate: jax.Array
    up: jax.Array
    down: jax.Array
    q_norm: jax.Array | None = None
    k_norm: jax.Array | None = None
    post_attn_norm: jax.Array | None = None
    post_mlp_norm: jax.Array | None = None


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Params:
    embed: jax.Array
    layers: LayerParams
    final_norm: jax.Array
    lm_head: jax.Array | None = None  # None when tied to `embed`
    score: jax.Array | None = None  # [hidden, num_labels], reward models only
    head: dict[str, jax.Array] | None = None  # gate of a custom head (rmjax.heads), float32


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class KVCache:
    """Keys/values of a prefix: k, v [layers, batch, seq, kv_heads, head_dim] (post-RoPE).

    A batch of 1 is shared by every row of a later forward (broadcast, not copied).
    """

    k: jax.Array
    v: jax.Array
    positions: jax.Array  # [batch, seq] int32
    valid: jax.Array  # [batch, seq] bool
    gate_input: jax.Array | None = None  # [batch, hidden] f32: prompt-gated heads' input (ArmoRM, QRM)

    @property
    def next_positions(self) -> jax.Array:
        """[batch] position of the token that follows each cached row."""
        return jnp.max(jnp.where(self.valid, self.positions, -1), axis=-1) + 1


def param_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Shape of every parameter of `cfg`, keyed by dotted path ('layers.q', 'embed', ...)."""
    n, h, d = cfg.num_layers, cfg.hidden_size, cfg.head_dim
    shapes = {
        "embed": (cfg.vocab_size, h),
        "final_norm": (h,),
        "layers.attn_norm": (n, h),
        "layers.q": (n, h, cfg.num_heads, d),
        "layers.k": (n, h, cfg.num_kv_heads, d),
        "layers.v": (n, h, cfg.num_kv_heads, d),
        "layers.o": (n, cfg.num_heads, d, h),
        "layers.mlp_norm": (n, h),
        "layers.gate": (n, h, cfg.intermediate_size),
        "layers.up": (n, h, cfg.intermediate_size),
        "layers.down": (n, cfg.intermediate_size, h),
    }
    if cfg.qk_norm:
        shapes["layers.q_norm"] = shapes["layers.k_norm"] = (n, d)
    if cfg.sandwich_norms:
        shapes["layers.post_attn_norm"] = shapes["layers.post_mlp_norm"] = (n, h)
    if not cfg.tie_embeddings and not cfg.is_reward_model:
        shapes["lm_head"] = (h, cfg.vocab_size)
    if cfg.is_reward_model:
        shapes["score"] = (h, cfg.num_labels)
    if cfg.head is not None:
        shapes.update(heads.head_shapes(cfg.head, h))
    return shapes


def kept_in_float32(path: str) -> bool:
    """Reward heads stay float32 whatever the backbone dtype (bf16 scores collapse into ties)."""
    return path == "score" or path.startswith("head.")


def logical_axes(path: str) -> tuple[str, ...]:
    group, _, name = path.rpartition(".")
    if group == "head":  # small gate weights: replicated
        return (None, None)
    return LAYER_AXES[name] if group == "layers" else MODEL_AXES[name]


def params_from_flat(flat: dict[str, Any]) -> Params:
    """Build Params from {'layers.q': array, 'embed': array, ...}."""
    layer_fields = {k.split(".", 1)[1]: v for k, v in flat.items() if k.startswith("layers.")}
    head = {k.split(".", 1)[1]: v for k, v in flat.items() if k.startswith("head.")} or None
    top = {k: v for k, v in flat.items() if "." not in k}
    return Params(layers=LayerParams(**layer_fields), head=head, **top)


def params_to_flat(params: Params) -> dict[str, jax.Array]:
    flat = {}
    for field in dataclasses.fields(params):
        value = getattr(params, field.name)
        if isinstance(value, LayerParams):
            for lf in dataclasses.fields(value):
                if getattr(value, lf.name) is not None:
                    flat[f"layers.{lf.name}"] = getattr(value, lf.name)
        elif isinstance(value, dict):
            flat.update({f"{field.name}.{k}": v for k, v in value.items()})
        elif value is not None:
            flat[field.name] = value
    return flat


def embed_tokens(params: Params, cfg: ModelConfig, ids: jax.Array) -> jax.Array:
    return jnp.take(params.embed, ids, axis=0)


def positions_from_mask(mask: jax.Array, offset: jax.Array | int = 0) -> jax.Array:
    """Position of each token counting only real tokens, so left padding does not shift RoPE."""
    offset = jnp.asarray(offset, jnp.int32)
    if offset.ndim == 1:
        offset = offset[:, None]
    return jnp.maximum(jnp.cumsum(mask.astype(jnp.int32), axis=-1) - 1, 0) + offset


def forward(
    params: Params,
    cfg: ModelConfig,
    *,
    ids: jax.Array | None = None,
    embeds: jax.Array | None = None,
    mask: jax.Array | None = None,
    positions: jax.Array | None = None,
    cache: KVCache | None = None,
    residuals: bool = False,
) -> tuple[jax.Array, KVCache] | tuple[jax.Array, KVCache, jax.Array]:
    """Decoder forward. Returns final-normed hidden states [B, T, H] and the new tokens' K/V; with
    `residuals`, also the residual stream after each layer [L, B, T, H] (nothing is kept when off).

    `embeds` are raw embedding rows (e.g. one_hot @ params.embed for GCG gradients): the
    Gemma embedding scale is applied here for both ids and embeds, so
    forward(ids=x) == forward(embeds=params.embed[x]). (transformers' inputs_embeds expects the
    scale already applied.) With `cache`, the new tokens attend to the cached prefix too.
    """
    x = embed_tokens(params, cfg, ids) if embeds is None else embeds.astype(params.embed.dtype)
    if cfg.scale_embeddings:
        x = x * jnp.asarray(embedding_scale(cfg), dtype=params.embed.dtype)
    batch, length = x.shape[:2]
    if mask is None:
        mask = jnp.ones((batch, length), bool)
    mask = mask.astype(bool)
    if positions is None:
        offset = 0 if cache is None else cache.next_positions
        positions = positions_from_mask(mask, offset)

    # Key blocks: the cached prefix (if any), then the new tokens.
    if cache is not None:
        c_pos = jnp.broadcast_to(cache.positions, (batch, cache.positions.shape[-1]))
        c_valid = jnp.broadcast_to(cache.valid, (batch, cache.valid.shape[-1]))
    # One mask per key block (cached prefix, new tokens), global and sliding-window variants.
    blocks = [(positions, mask)] if cache is None else [(c_pos, c_valid), (positions, mask)]
    global_masks = tuple(ops.attention_mask(positions, kp, kv, None) for kp, kv in blocks)
    local_masks = (
        tuple(ops.attention_mask(positions, kp, kv, cfg.sliding_window) for kp, kv in blocks)
        if cfg.has_local_layers
        else global_masks
    )
    rope_g = ops.rope_angles(positions, cfg.rope_global, cfg.head_dim)
    rope_l = ops.rope_angles(positions, cfg.rope_local, cfg.head_dim) if cfg.has_local_layers else rope_g

    def layer(h, xs):
        lp, is_local, ck, cv = xs
        cos = jnp.where(is_local, rope_l[0], rope_g[0])
        sin = jnp.where(is_local, rope_l[1], rope_g[1])
        m = tuple(jnp.where(is_local, lm, gm) for lm, gm in zip(local_masks, global_masks, strict=True))
        h, k, v = _decoder_layer(lp, cfg, h, cos, sin, m, ck, cv)
        return h, (k, v, h if residuals else None)

    is_local = jnp.asarray(cfg.local_layers)
    ck = cv = None
    if cache is not None:
        ck, cv = cache.k, cache.v
    x, (new_k, new_v, stream) = jax.lax.scan(layer, x, (params.layers, is_local, ck, cv))
    hidden = ops.rms_norm(x, params.final_norm, cfg.norm_eps, cfg.norm_plus_one)
    kv = KVCache(k=new_k, v=new_v, positions=positions, valid=mask)
    return (hidden, kv, stream) if residuals else (hidden, kv)


def _decoder_layer(lp: LayerParams, cfg: ModelConfig, x, cos, sin, mask, cache_k, cache_v):
    norm = lambda t, w: ops.rms_norm(t, w, cfg.norm_eps, cfg.norm_plus_one)  # noqa: E731
    b, t = x.shape[:2]
    h = norm(x, lp.attn_norm)
    q = jnp.einsum("bth,hnd->btnd", h, lp.q)
    k = jnp.einsum("bth,hnd->btnd", h, lp.k)
    v = jnp.einsum("bth,hnd->btnd", h, lp.v)
    if cfg.qk_norm:
        q, k = norm(q, lp.q_norm), norm(k, lp.k_norm)
    q, k = ops.apply_rope(q, cos, sin), ops.apply_rope(k, cos, sin)
    groups = cfg.num_heads // cfg.num_kv_heads
    q = q.reshape(b, t, cfg.num_kv_heads, groups, cfg.head_dim)
    keys, values = (k,), (v,)
    if cache_k is not None:
        shared = cache_k.shape[0] == 1 and b != 1
        keys = (cache_k[0] if shared else cache_k, k)
        values = (cache_v[0] if shared else cache_v, v)
    a = ops.attention(q, keys, values, mask, cfg.query_scale, cfg.attn_softcap)
    a = jnp.einsum("btnd,ndh->bth", a.reshape(b, t, cfg.num_heads, cfg.head_dim), lp.o)
    if cfg.sandwich_norms:
        a = norm(a, lp.post_attn_norm)
    x = x + a
    h = norm(x, lp.mlp_norm)
    h = ops.gated_mlp(h, lp.gate, lp.up, lp.down, cfg.activation)
    if cfg.sandwich_norms:
        h = norm(h, lp.post_mlp_norm)
    return x + h, k, v


def last_token_index(mask: jax.Array) -> jax.Array:
    """Index of the rightmost real token of each row (works for left and right padding)."""
    idx = jnp.arange(mask.shape[-1])
    return jnp.argmax(jnp.where(mask.astype(bool), idx, -1), axis=-1)


def reward_head(params: Params, cfg: ModelConfig, hidden: jax.Array, gate_input: jax.Array | None = None) -> jax.Array:
    """[B, num_outputs] float32 from last-token hidden states [B, H].

    `gate_input` is what a prompt-gated head reads (hidden state at the prompt end, [B or 1, H]).
    """
    scores = score_head(params.score, hidden)
    if cfg.head is None:
        return scores
    gate = hidden if not cfg.head.pattern else jnp.broadcast_to(gate_input, hidden.shape)
    return heads.apply(params.head, cfg.head, scores, gate)


def score_head(score: jax.Array, hidden: jax.Array) -> jax.Array:
    """Score head in float32 (bf16 scores collapse 256k candidates into ties). [..., labels]."""
    return jnp.einsum(
        "...h,hl->...l",
        hidden.astype(jnp.float32),
        score.astype(jnp.float32),
        precision=jax.lax.Precision.HIGHEST,
    )


def lm_logits(params: Params, cfg: ModelConfig, hidden: jax.Array) -> jax.Array:
    """Next-token logits in float32 with the final soft cap (Gemma 2)."""
    h = hidden.astype(jnp.float32)
    if params.lm_head is not None:
        logits = h @ params.lm_head.astype(jnp.float32)
    else:
        logits = jnp.einsum("...h,vh->...v", h, params.embed.astype(jnp.float32))
    return ops.softcap(logits, cfg.final_softcap)


def lm_log_probs(params: Params, cfg: ModelConfig, hidden: jax.Array) -> jax.Array:
    return jax.nn.log_softmax(lm_logits(params, cfg, hidden), axis=-1)


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
    hidden, _ = forward(params, cfg, ids=ids, mask=mask)
    return _rewards_at_last(params, cfg, ids, mask, hidden)


def _rewards_at_last(params: Params, cfg: ModelConfig, ids: jax.Array, mask: jax.Array, hidden: jax.Array) -> jax.Array:
    """Head outputs at each row's last real token, a prompt-gated head reading its pattern in `ids`."""
    last = hidden[jnp.arange(hidden.shape[0]), last_token_index(mask)]
    gate = heads.gate_input(cfg.head, ids, mask, hidden) if cfg.head is not None and cfg.head.pattern else None
    return reward_head(params, cfg, last, gate)


@functools.partial(jax.jit, static_argnames=("cfg",))
def logits(params: Params, cfg: ModelConfig, ids: jax.Array, mask: jax.Array) -> jax.Array:
    """LM logits at every position: [B, T, vocab] float32."""
    hidden, _ = forward(params, cfg, ids=ids, mask=mask)
    return lm_logits(params, cfg, hidden)


@functools.partial(jax.jit, static_argnames=("cfg",))
def prefill(params: Params, cfg: ModelConfig, ids: jax.Array, mask: jax.Array | None = None) -> KVCache:
    """K/V of a prefix, computed once and reused by every continuation (with a gated head's input)."""
    hidden, cache = forward(params, cfg, ids=ids, mask=mask)
    if cfg.head is not None and cfg.head.pattern:
        valid = jnp.ones(ids.shape, bool) if mask is None else mask
        cache = dataclasses.replace(cache, gate_input=heads.gate_input(cfg.head, ids, valid, hidden))
    return cache


@functools.partial(jax.jit, static_argnames=("cfg",))
def last_hidden_after(
    params: Params, cfg: ModelConfig, cache: KVCache, ids: jax.Array, mask: jax.Array | None = None
) -> jax.Array:
    """Final-normed hidden state at each row's last real new token after the cached prefix: [B, H]."""
    if mask is None:
        mask = jnp.ones(ids.shape, bool)
    hidden, _ = forward(params, cfg, ids=ids, mask=mask, cache=cache)
    return hidden[jnp.arange(hidden.shape[0]), last_token_index(mask)]


@functools.partial(jax.jit, static_argnames=("cfg",))
def last_hidden(params: Params, cfg: ModelConfig, ids: jax.Array, mask: jax.Array) -> jax.Array:
    hidden, _ = forward(params, cfg, ids=ids, mask=mask)
    return hidden[jnp.arange(hidden.shape[0]), last_token_index(mask)]


@functools.partial(jax.jit, static_argnames=("cfg",))
def rewards_after(
    params: Params, cfg: ModelConfig, cache: KVCache, ids: jax.Array, mask: jax.Array | None = None
) -> jax.Array:
    """Head outputs for `cache` prefix + `ids`, at each row's last real new token."""
    return reward_head(params, cfg, last_hidden_after(params, cfg, cache, ids, mask), cache.gate_input)


@functools.partial(jax.jit, static_argnames=("cfg",))
def trace(params: Params, cfg: ModelConfig, ids: jax.Array, mask: jax.Array) -> dict[str, jax.Array]:
    """Every stage of one full forward, for per-layer reads and for finding where a NaN starts:
    embeddings [B, T, H] (scaled, as the first layer sees them), residual after each layer
    [L, B, T, H], final-normed hidden [B, T, H] and, at the last token, the reward head's outputs
    [B, num_outputs] (a causal LM: the next-token log-probs [B, vocab])."""
    embeds = embed_tokens(params, cfg, ids)
    hidden, _, stream = forward(params, cfg, embeds=embeds, mask=mask, residuals=True)
    if cfg.scale_embeddings:
        embeds = embeds * jnp.asarray(embedding_scale(cfg), dtype=params.embed.dtype)
    out = {"embeddings": embeds, "layers": stream, "hidden": hidden}
    if cfg.is_reward_model:
        out["head"] = _rewards_at_last(params, cfg, ids, mask, hidden)
    else:
        out["head"] = lm_log_probs(params, cfg, hidden[jnp.arange(hidden.shape[0]), last_token_index(mask)])
    return out


@functools.partial(jax.jit, static_argnames=("cfg",))
def next_token_log_probs(params: Params, cfg: ModelConfig, ids: jax.Array, mask: jax.Array) -> jax.Array:
    """Log-probs of the token after each row's last real token: [B, vocab] float32."""
    hidden, _ = forward(params, cfg, ids=ids, mask=mask)
    last = hidden[jnp.arange(hidden.shape[0]), last_token_index(mask)]
    return lm_log_probs(params, cfg, last)
