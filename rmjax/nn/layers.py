"""Flax NNX modules of the backbone: embeddings, the stacked decoder, norms and linear heads.

Each weight is declared once, by `weight`, with its shape, logical axes and float32-ness as
`nnx.Param` metadata; the loader, the memory plan, the zoo, placement and HF export read those
declarations (rmjax.nn.state). The numerics are the pure functions of rmjax.nn.ops.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import nnx

from rmjax.config import ModelConfig, embedding_scale
from rmjax.nn import ops
from rmjax.parallel import sharding

Axes = tuple[str | None, ...]
ACTIVATION = ("batch", None, "embed")  # [B, T, H]: rows over `data`


def weight(shape: tuple[int, ...], axes: Axes, dtype, *, float32: bool = False) -> nnx.Param:
    """The one declaration of a parameter. `axes` are logical (rmjax.parallel.sharding.RULES places them);
    `float32` weights keep float32 whatever the backbone dtype (reward heads: bf16 scores tie).

    Values start at zero: a model is built abstractly (nnx.eval_shape) and filled by a loader.
    """
    if len(axes) != len(shape):
        raise ValueError(f"weight of shape {shape} declared with axes {axes}")
    dtype = jnp.float32 if float32 else dtype
    # `axes`, not flax's `out_sharding`: flax would resolve names itself (with its own rules) whenever a
    # mesh is set; rmjax places weights by rmjax.parallel.sharding.RULES, in one place.
    return nnx.Param(jnp.zeros(shape, dtype), axes=tuple(axes), float32=float32)


def constrain(x: jax.Array, axes: Axes) -> jax.Array:
    """Pin an activation's layout (logical axes placed by rmjax.parallel.sharding.RULES) when traced under a mesh
    (`jax.set_mesh`), where GSPMD would otherwise guess it from the weights; a no-op without one."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or not {"data", "model"} <= set(mesh.axis_names):
        return x
    return jax.lax.with_sharding_constraint(x, sharding.spec_for(axes, x.shape, mesh))


class Embedder(nnx.Module):
    """Token embedding table [vocab, embed]; Gemma scales rows by sqrt(hidden) in the weight dtype."""

    def __init__(self, cfg: ModelConfig, dtype):
        self.embedding = weight((cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"), dtype)
        self.scale = embedding_scale(cfg) if cfg.scale_embeddings else None

    def __call__(self, ids: jax.Array) -> jax.Array:
        """Raw (unscaled) rows."""
        return jnp.take(self.embedding[...], ids, axis=0)

    def scaled(self, rows: jax.Array) -> jax.Array:
        """Rows as the first layer sees them (the scale cast to the weight dtype, as transformers does)."""
        dtype = self.embedding.dtype
        rows = rows.astype(dtype)
        return rows if self.scale is None else rows * jnp.asarray(self.scale, dtype)

    def attend(self, hidden: jax.Array) -> jax.Array:
        """Tied LM head: hidden [..., H] -> logits [..., vocab] in float32."""
        table = self.embedding[...]
        return jnp.einsum("...h,vh->...v", hidden.astype(jnp.float32), table.astype(jnp.float32),
                          precision=ops.weight_precision(table))


class RMSNorm(nnx.Module):
    def __init__(self, cfg: ModelConfig, dtype):
        self.scale = weight((cfg.hidden_size,), ("embed",), dtype)
        self.eps, self.plus_one = cfg.norm_eps, cfg.norm_plus_one

    def __call__(self, x: jax.Array) -> jax.Array:
        return ops.rms_norm(x, self.scale[...], self.eps, self.plus_one)


class Linear(nnx.Module):
    """A bias-free projection [in, out] computed in float32 (LM head; the reward score head, float32
    weights at full matmul precision: bf16 or TF32 scores collapse 256k candidates into ties)."""

    def __init__(self, shape: tuple[int, int], axes: Axes, dtype, *, float32: bool = False):
        self.kernel = weight(shape, axes, dtype, float32=float32)

    def __call__(self, x: jax.Array) -> jax.Array:
        kernel = self.kernel[...]
        return jnp.einsum("...h,hl->...l", x.astype(jnp.float32), kernel.astype(jnp.float32),
                          precision=ops.weight_precision(kernel))


def layer_weights(cfg: ModelConfig) -> dict[str, tuple[tuple[int, ...], Axes]]:
    """(shape, logical axes) of one decoder layer's weights; the stack adds a leading `layers` axis."""
    h, d, m = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    table = {
        "attn_norm": ((h,), ("embed",)),
        "q": ((h, cfg.num_heads, d), ("embed", "heads", "head_dim")),
        "k": ((h, cfg.num_kv_heads, d), ("embed", "kv_heads", "head_dim")),
        "v": ((h, cfg.num_kv_heads, d), ("embed", "kv_heads", "head_dim")),
        "o": ((cfg.num_heads, d, h), ("heads", "head_dim", "embed")),
        "mlp_norm": ((h,), ("embed",)),
        "gate": ((h, m), ("embed", "mlp")),
        "up": ((h, m), ("embed", "mlp")),
        "down": ((m, h), ("mlp", "embed")),
    }
    if cfg.qk_norm:
        table["q_norm"] = table["k_norm"] = ((d,), ("head_dim",))
    if cfg.sandwich_norms:
        table["post_attn_norm"] = table["post_mlp_norm"] = ((h,), ("embed",))
    return table


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class AttentionInputs:
    """What every layer shares: RoPE cos/sin and masks per key block (cached prefix, new tokens),
    in a global and a sliding-window variant."""

    rope_global: tuple[jax.Array, jax.Array]
    rope_local: tuple[jax.Array, jax.Array]
    masks_global: tuple[jax.Array, ...]
    masks_local: tuple[jax.Array, ...]


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Patch:
    """Activation patching, one edit per row: row b takes the donor's value of `component` (one of
    COMPONENTS: a layer's residual output, its attention write or its MLP write) at layer `layer[b]`, at
    the positions where `where[b]`; donors [L, 1 or B, T, H] (one donor run shared by every row, or one per
    row). The embeddings are patched by the caller, before the stack."""

    layer: jax.Array  # [B] int32
    component: jax.Array  # [B] int32, index into COMPONENTS
    where: jax.Array  # [B, T] bool
    residual: jax.Array
    attention: jax.Array
    mlp: jax.Array

    COMPONENTS = ("residual", "attention", "mlp")

    def at_layer(self, index: jax.Array, donors: tuple[jax.Array, jax.Array, jax.Array]):
        """edit(kind, value) for layer `index` (inside the scan), given that layer's donor values."""
        def edit(kind: str, value: jax.Array) -> jax.Array:
            rows = (self.layer == index) & (self.component == Patch.COMPONENTS.index(kind))
            take = rows[:, None, None] & self.where[:, :, None]
            return jnp.where(take, donors[Patch.COMPONENTS.index(kind)].astype(value.dtype), value)

        return edit


class DecoderStack(nnx.Module):
    """Decoder layers stacked on a leading `layers` axis and run as one `lax.scan` (compile time flat
    in depth). `local_layers` marks the layers (of this stack) that use the sliding window."""

    def __init__(self, cfg: ModelConfig, dtype, local_layers: tuple[bool, ...] | None = None):
        self.local_layers = tuple(cfg.local_layers if local_layers is None else local_layers)
        n = len(self.local_layers)
        for name, (shape, axes) in layer_weights(cfg).items():
            setattr(self, name, weight((n, *shape), ("layers", *axes), dtype))
        self.cfg = cfg
        self.remat = False  # training's --remat: each layer's activations recomputed in the backward pass
        self.fsdp = False  # training's --fsdp: weights split over `data` too, gathered a layer at a time in the loop

    def stacked(self) -> dict[str, jax.Array]:
        return {name: getattr(self, name)[...] for name in layer_weights(self.cfg)}

    def __call__(self, x: jax.Array, inputs: AttentionInputs, cache_k: jax.Array | None = None,
                 cache_v: jax.Array | None = None, residuals: bool = False, patch: Patch | None = None,
                 span: tuple[int, int] | None = None):
        """x [B, T, H] -> (x, new K, new V [L, B, T, Hkv, D], per-layer reads or None). The reads, when asked:
        (residual after each layer, attention write, MLP write), each [L, B, T, H] (what the layer added to
        the residual stream: after Gemma's post-norms). `span` (start, stop): only those layers (the cache's
        L is theirs), each read from the stacked weights in the loop; a slice of the stack taken before the loop
        is a copy of those weights (XLA's CPU compile of a forked forward: 1.5 models' weights of temp). For
        frozen weights: a gradient through the span would save each layer's as a stacked residual."""
        cfg = self.cfg
        if span is not None and patch is not None:
            raise NotImplementedError("activation patching runs over the whole stack.")
        if span is not None and not 0 <= span[0] < span[1] <= len(self.local_layers):
            raise ValueError(f"span {span} is not a range of this stack's {len(self.local_layers)} layers.")

        axes = {name: a for name, (_, a) in layer_weights(cfg).items()}

        def body(h, xs):
            lw, is_local, ck, cv, index, donors = xs
            if self.fsdp:  # each layer's weights as declared (over `model`), gathered inside the loop, not the whole
                # stack before it. Not otherwise: a gradient's backward pass would save the constrained weights,
                # a copy of every layer's (GCG's gradient of SmolLM2-135M: 433 MiB of temp, 28 without)
                lw = {name: constrain(w, axes[name]) for name, w in lw.items()}
            cos = jnp.where(is_local, inputs.rope_local[0], inputs.rope_global[0])
            sin = jnp.where(is_local, inputs.rope_local[1], inputs.rope_global[1])
            masks = tuple(jnp.where(is_local, lm, gm)
                          for lm, gm in zip(inputs.masks_local, inputs.masks_global, strict=True))
            edit = None if patch is None else patch.at_layer(index, donors)
            h, k, v, writes = decoder_layer(lw, cfg, h, cos, sin, masks, ck, cv, edit)
            h = constrain(h if edit is None else edit("residual", h), ACTIVATION)
            return h, (k, v, (h, *writes) if residuals else None)

        if self.remat:  # keep only each layer's input for the backward pass; recompute the rest
            body = jax.checkpoint(body, prevent_cse=False)
        elif self.fsdp:  # keep the matmuls' outputs; gather each layer's weights again for the backward pass, which
            # otherwise saved them gathered (full fine-tune of SmolLM2-135M on data:4,model:2: 871 MiB temp, 261 now)
            body = jax.checkpoint(body, prevent_cse=False,
                                  policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)
        n = len(self.local_layers)
        if span is not None:
            stacked, local = self.stacked(), jnp.asarray(self.local_layers)
            # an opaque start: with a known range, XLA slices (copies) the stacked weights before the loop
            start = jax.lax.optimization_barrier(jnp.int32(span[0]))

            def layer_of_span(h, xs):
                i, ck, cv = xs
                i = i + start
                return body(h, ({name: w[i] for name, w in stacked.items()}, local[i], ck, cv, i, None))

            x, (k, v, stream) = jax.lax.scan(layer_of_span, x, (jnp.arange(span[1] - span[0]), cache_k, cache_v))
            return x, k, v, stream
        donors = None if patch is None else (patch.residual, patch.attention, patch.mlp)
        xs = (self.stacked(), jnp.asarray(self.local_layers), cache_k, cache_v, jnp.arange(n), donors)
        x, (k, v, stream) = jax.lax.scan(body, x, xs)
        return x, k, v, stream


def decoder_layer(lw: dict[str, jax.Array], cfg: ModelConfig, x, cos, sin, masks, cache_k, cache_v, edit=None):
    """One pre-norm decoder layer (Gemma 2/3 add sandwich norms, Gemma 3 q/k norms); `edit(kind, value)`
    may replace the attention and MLP writes (activation patching)."""
    norm = lambda t, w: ops.rms_norm(t, w, cfg.norm_eps, cfg.norm_plus_one)  # noqa: E731
    b, t = x.shape[:2]
    h = norm(x, lw["attn_norm"])
    q = jnp.einsum("bth,hnd->btnd", h, lw["q"])
    k = jnp.einsum("bth,hnd->btnd", h, lw["k"])
    v = jnp.einsum("bth,hnd->btnd", h, lw["v"])
    if cfg.qk_norm:
        q, k = norm(q, lw["q_norm"]), norm(k, lw["k_norm"])
    q, k = ops.apply_rope(q, cos, sin), ops.apply_rope(k, cos, sin)
    groups = cfg.num_heads // cfg.num_kv_heads
    q = q.reshape(b, t, cfg.num_kv_heads, groups, cfg.head_dim)
    keys, values = (k,), (v,)
    if cache_k is not None:
        shared = cache_k.shape[0] == 1 and b != 1
        keys = (cache_k[0] if shared else cache_k, k)
        values = (cache_v[0] if shared else cache_v, v)
    a = ops.attention(q, keys, values, masks, cfg.query_scale, cfg.attn_softcap)
    a = jnp.einsum("btnd,ndh->bth", a.reshape(b, t, cfg.num_heads, cfg.head_dim), lw["o"])
    if cfg.sandwich_norms:
        a = norm(a, lw["post_attn_norm"])
    a = a if edit is None else edit("attention", a)
    x = x + a
    h = norm(x, lw["mlp_norm"])
    h = ops.gated_mlp(h, lw["gate"], lw["up"], lw["down"], cfg.activation)
    if cfg.sandwich_norms:
        h = norm(h, lw["post_mlp_norm"])
    h = h if edit is None else edit("mlp", h)
    return x + h, k, v, (a, h)


class SplitStack(nnx.Module):
    """The decoder as two stacks run in turn: the first `at` layers of `lower`, then `upper`: the same forward as
    one stack, with the upper layers as variables of their own (training the last K layers gives only those
    optimizer state; nnx filters select them by path). `lower` is the whole stack as loaded, its arrays the
    model's own, read in place (a stack of the lower layers sliced off it was a second copy of them: 28 of
    SmolLM2-135M's 30 layers, 378 MiB in float32, held through a last_k run); its top layers go unused."""

    def __init__(self, lower: DecoderStack, upper: DecoderStack, at: int):
        self.lower, self.upper, self.at = lower, upper, at

    @classmethod
    def of(cls, stack: DecoderStack, at: int) -> SplitStack:
        local = stack.local_layers[at:]
        upper = nnx.eval_shape(lambda: DecoderStack(stack.cfg, jnp.float32, local))
        for name in layer_weights(stack.cfg):
            getattr(upper, name).set_value(getattr(stack, name)[...][at:])
        return cls(stack, upper, at)

    def joined(self, in_place: bool = False) -> DecoderStack:
        """One stack: `lower`'s first layers, then `upper`'s. `in_place`: written into `lower`'s own buffers, which
        it donates (they are deleted), not into a copy of the whole stack beside them (a last_k run's end)."""
        stack = nnx.eval_shape(lambda: DecoderStack(self.lower.cfg, jnp.float32, self.lower.local_layers))
        for name in layer_weights(stack.cfg):
            whole, top = getattr(self.lower, name)[...], getattr(self.upper, name)[...]
            write = jax.jit(functools.partial(jax.lax.dynamic_update_slice_in_dim, start_index=self.at, axis=0),
                            donate_argnums=0 if in_place else (), out_shardings=whole.sharding)
            getattr(stack, name).set_value(write(whole, top.astype(whole.dtype)))
        return stack

    def __call__(self, x, inputs: AttentionInputs, cache_k=None, cache_v=None, residuals: bool = False,
                 patch: Patch | None = None):
        if patch is not None:
            raise NotImplementedError("activation patching runs on the joined stack (SplitStack.joined()).")
        n = self.at
        lo = (None, None) if cache_k is None else (cache_k[:n], cache_v[:n])
        hi = (None, None) if cache_k is None else (cache_k[n:], cache_v[n:])
        x, k1, v1, s1 = self.lower(x, inputs, *lo, residuals, span=(0, n))
        x, k2, v2, s2 = self.upper(x, inputs, *hi, residuals)
        stream = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), s1, s2) if residuals else None
        return x, jnp.concatenate([k1, k2]), jnp.concatenate([v1, v2]), stream
