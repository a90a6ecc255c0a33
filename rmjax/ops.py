"""Pure numerics shared by every family: RMSNorm, RoPE, attention, gated MLP, soft caps.

Each function takes plain arrays and static options; which option a model uses comes from
its ModelConfig. Softmax, RoPE angles and norms are computed in float32 whatever the
parameter dtype.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from rmjax.config import RopeConfig

# A finite "minus infinity": rows whose keys are all masked (left padding) stay finite.
MASK_VALUE = -1e30


def rms_norm(x: jax.Array, weight: jax.Array, eps: float, plus_one: bool) -> jax.Array:
    """RMSNorm. Gemma multiplies by (1 + w) in f32; Llama casts back to x.dtype, then scales by w."""
    h = x.astype(jnp.float32)
    h = h * jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + eps)
    if plus_one:
        return (h * (1.0 + weight.astype(jnp.float32))).astype(x.dtype)
    return weight * h.astype(x.dtype)


def softcap(x: jax.Array, cap: float | None) -> jax.Array:
    return x if cap is None else jnp.tanh(x / cap) * cap


def rope_inv_freq(rope: RopeConfig, head_dim: int) -> np.ndarray:
    """Inverse frequencies (float32, numpy: computed once per config at trace time)."""
    exponents = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / head_dim
    inv_freq = (1.0 / (rope.theta**exponents)).astype(np.float32)
    if rope.kind == "linear":
        return (inv_freq / rope.factor).astype(np.float32)
    if rope.kind == "llama3":
        low_wavelen = rope.original_max_position / rope.low_freq_factor
        high_wavelen = rope.original_max_position / rope.high_freq_factor
        wavelen = 2 * np.pi / inv_freq
        scaled = np.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
        smooth = (rope.original_max_position / wavelen - rope.low_freq_factor) / (
            rope.high_freq_factor - rope.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return np.where(medium, smoothed, scaled).astype(np.float32)
    return inv_freq


def rope_angles(positions: jax.Array, rope: RopeConfig, head_dim: int) -> tuple[jax.Array, jax.Array]:
    """cos and sin of shape positions.shape + (head_dim,), half-split layout, float32."""
    freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(rope_inv_freq(rope, head_dim))
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x: [batch, seq, heads, head_dim]; cos/sin: [batch, seq, head_dim]."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    cos = cos[:, :, None, :].astype(x.dtype)
    sin = sin[:, :, None, :].astype(x.dtype)
    return x * cos + rotated * sin


def attention_mask(
    q_pos: jax.Array,
    k_pos: jax.Array,
    k_valid: jax.Array,
    window: int | None,
) -> jax.Array:
    """Boolean [batch, q, k]: causal by position, keys that exist, within the sliding window."""
    allowed = (k_pos[:, None, :] <= q_pos[:, :, None]) & k_valid[:, None, :]
    if window is not None:
        allowed &= k_pos[:, None, :] > q_pos[:, :, None] - window
    return allowed


def attention(
    q: jax.Array,
    keys: tuple[jax.Array, ...],
    values: tuple[jax.Array, ...],
    mask: jax.Array,
    scale: float,
    cap: float | None,
) -> jax.Array:
    """Grouped-query attention over several key blocks joined by one softmax.

    q: [B, T, Hkv, G, D]. Each key/value block is [B, S_i, Hkv, D], or [S_i, Hkv, D] for a block
    shared by the whole batch (a prefix cache: broadcast by einsum, never copied per row).
    mask: [B, T, sum(S_i)] boolean. Returns [B, T, Hkv, G, D].
    """
    scores = []
    for k in keys:
        spec = "btkgd,skd->bkgts" if k.ndim == 3 else "btkgd,bskd->bkgts"
        scores.append(jnp.einsum(spec, q, k, preferred_element_type=jnp.float32))
    s = jnp.concatenate(scores, axis=-1) * scale
    s = softcap(s, cap)
    s = jnp.where(mask[:, None, None, :, :], s, MASK_VALUE)
    probs = jax.nn.softmax(s, axis=-1).astype(q.dtype)
    out, start = 0.0, 0
    for v in values:
        width = v.shape[-3]
        p = probs[..., start : start + width]
        spec = "bkgts,skd->btkgd" if v.ndim == 3 else "bkgts,bskd->btkgd"
        out = out + jnp.einsum(spec, p, v, preferred_element_type=jnp.float32)
        start += width
    return out.astype(q.dtype)


def gated_mlp(
    x: jax.Array, gate: jax.Array, up: jax.Array, down: jax.Array, activation: str
) -> jax.Array:
    g = x @ gate
    act = jax.nn.silu(g) if activation == "silu" else jax.nn.gelu(g, approximate=True)
    return (act * (x @ up)) @ down
