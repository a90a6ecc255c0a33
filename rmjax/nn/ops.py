"""Pure numerics shared by every family: RMSNorm, RoPE, attention, gated MLP, soft caps, sampling.

Each function takes plain arrays and static options; which option a model uses comes from
its ModelConfig. Softmax, RoPE angles and norms are computed in float32 whatever the
parameter dtype.
"""

from __future__ import annotations

import functools

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


def rms_norm_scale(x: jax.Array, weight: jax.Array, eps: float, plus_one: bool) -> jax.Array:
    """The factor rms_norm multiplies x by, in f32: the norm linearized with its scale frozen at x (what a
    write u to the residual adds to the normed output, u * factor: direct attribution)."""
    h = x.astype(jnp.float32)
    inv = jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + eps)
    return inv * ((1.0 + weight.astype(jnp.float32)) if plus_one else weight.astype(jnp.float32))


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
    masks: tuple[jax.Array, ...],
    scale: float,
    cap: float | None,
) -> jax.Array:
    """Grouped-query attention over several key blocks joined by one softmax.

    q: [B, T, Hkv, G, D]. Each key/value block is [B, S_i, Hkv, D], or [S_i, Hkv, D] for a block
    shared by the whole batch (a prefix cache: broadcast by einsum, never copied per row).
    masks[i]: [B, T, S_i] boolean. The blocks are merged by their log-sum-exp (no concatenated
    score matrix): out = sum_i P_i V_i / sum_i rowsum(P_i) with P_i = exp(S_i - global max).
    Returns [B, T, Hkv, G, D].
    """
    # Head-major layout [Hkv, B, T, G, *]: every product is a plain batched matmul over kv heads
    # with rows (B, T, G) contiguous, so the large score/probability tensors are never transposed.
    qh = jnp.transpose(q, (2, 0, 1, 3, 4))
    scores, vs = [], []
    for k, v, m in zip(keys, values, masks, strict=True):
        if k.ndim == 3:  # shared by the batch: [S, Hkv, D] -> [Hkv, S, D]
            k, v = jnp.transpose(k, (1, 0, 2)), jnp.transpose(v, (1, 0, 2))
            s = jnp.einsum("kbtgd,ksd->kbtgs", qh, k, preferred_element_type=jnp.float32)
        else:
            s = jnp.einsum("kbtgd,bskd->kbtgs", qh, k, preferred_element_type=jnp.float32)
        s = softcap(s * scale, cap)
        scores.append(jnp.where(m[None, :, :, None, :], s, MASK_VALUE))
        vs.append(v)
    peak = functools.reduce(jnp.maximum, [jnp.max(s, axis=-1, keepdims=True) for s in scores])
    out, denom = 0.0, 0.0
    for s, v in zip(scores, vs, strict=True):
        p = jnp.exp(s - peak)
        denom = denom + jnp.sum(p, axis=-1, keepdims=True)
        spec = "kbtgs,ksd->kbtgd" if v.ndim == 3 else "kbtgs,bskd->kbtgd"
        out = out + jnp.einsum(spec, p.astype(q.dtype), v, preferred_element_type=jnp.float32)
    out = out / denom
    return jnp.transpose(out, (1, 2, 0, 3, 4)).astype(q.dtype)


def gated_mlp(
    x: jax.Array, gate: jax.Array, up: jax.Array, down: jax.Array, activation: str
) -> jax.Array:
    g = x @ gate
    if activation == "silu":
        act = jax.nn.silu(g)
    else:  # gelu_tanh: Gemma's gelu_pytorch_tanh; gelu: transformers' exact (erf) GELU
        act = jax.nn.gelu(g, approximate=activation == "gelu_tanh")
    return (act * (x @ up)) @ down


def weight_precision(w: jax.Array) -> jax.lax.Precision:
    """The precision of a product computed in float32 from the weight `w`: the weight's own. Every compiled call runs
    at "highest" (rmjax.compiled), right for float32 weights; a bf16 weight cast up (an LM head's float32 logits)
    runs at the backend's default, as fast as before and no less exact than the bf16 weight itself."""
    return jax.lax.Precision.HIGHEST if w.dtype == jnp.float32 else jax.lax.Precision.DEFAULT


@jax.custom_vjp
def one_hot_rows(one_hot: jax.Array, table: jax.Array, ids: jax.Array) -> jax.Array:
    """one_hot(ids) @ table, computed as the gather it equals (the same rows as the ids path, on every
    backend and dtype); its gradient w.r.t. the (float32) one-hot is the usual g @ table.T."""
    return jnp.take(table, ids, axis=0)


def _one_hot_rows_forward(one_hot, table, ids):
    return jnp.take(table, ids, axis=0), table


def _one_hot_rows_backward(table, g):
    # f32 accumulation without an f32 copy of a bf16 table ([V, H]: gigabytes for a 256k vocabulary)
    return (jnp.einsum("nh,vh->nv", g, table, preferred_element_type=jnp.float32, precision=weight_precision(table)),
            None, None)


one_hot_rows.defvjp(_one_hot_rows_forward, _one_hot_rows_backward)


def sample_categorical(key: jax.Array, logits: jax.Array, block: int = 512) -> jax.Array:
    """One index per row of `logits` [R, V] drawn from softmax(logits), like jax.random.categorical, in two
    draws: a block of `block` indices by the blocks' total probability, then an index within it. Gumbel noise for
    V/block + block entries instead of V: for 64 rows of a 262,144-token vocabulary the noise alone takes longer
    on a CPU than the LM head that made the logits (0.28 s against 0.15 s). Entries at -inf are never drawn."""
    rows, vocab = logits.shape
    blocks = -(-vocab // block)
    grouped = jnp.pad(logits, ((0, 0), (0, blocks * block - vocab)), constant_values=-jnp.inf)
    grouped = grouped.reshape(rows, blocks, block)
    which_key, within_key = jax.random.split(key)
    chosen = jax.random.categorical(which_key, jax.nn.logsumexp(grouped, axis=-1), axis=-1)
    inside = jnp.take_along_axis(grouped, chosen[:, None, None], axis=1)[:, 0]
    return chosen * block + jax.random.categorical(within_key, inside, axis=-1)
