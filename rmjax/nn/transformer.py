"""The reward model (or causal LM) as one Flax NNX module with one forward and named outputs.

Gemma 1/2/3 and Llama differ only by ModelConfig fields. The forward serves full scoring, prefix
caching (its K/V), log-probs, GCG gradients (it takes embedding rows) and per-layer reads (the
residual stream after every layer, kept only when asked).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from rmjax import heads as heads_lib
from rmjax.config import ModelConfig
from rmjax.heads import HeadConfig
from rmjax.nn import ops
from rmjax.nn.layers import (
    ACTIVATION,
    AttentionInputs,
    DecoderStack,
    Embedder,
    Linear,
    Patch,
    RMSNorm,
    constrain,
    weight,
)
from rmjax.parallel import sharding


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
    # [batch, hidden]: the prompt's final hidden state at its own read point (`read_index`), where the head reads a
    # continuation none of whose tokens it reads (all the pad id); a reward model with a pad id only
    read_hidden: jax.Array | None = None

    AXES = {  # logical axes of each field (rmjax.parallel.sharding)
        "k": ("layers", "batch", None, "kv_heads", "head_dim"),
        "v": ("layers", "batch", None, "kv_heads", "head_dim"),
        "positions": ("batch", None),
        "valid": ("batch", None),
        "gate_input": ("batch", "embed"),
        "read_hidden": ("batch", "embed"),
    }
    PROMPT_FIELDS = ("gate_input", "read_hidden")  # the prompt's own, kept as they are by head, append and slots

    @classmethod
    def shardings(cls, cfg: ModelConfig, mesh: jax.sharding.Mesh, batch: int, length: int) -> KVCache:
        """Where a cache of `batch` rows x `length` positions lives on `mesh` (K/V heads over `model`)."""
        kv = (cfg.num_layers, batch, length, cfg.num_kv_heads, cfg.head_dim)
        shapes = {"k": kv, "v": kv, "positions": (batch, length), "valid": (batch, length),
                  "gate_input": (batch, cfg.hidden_size), "read_hidden": (batch, cfg.hidden_size)}
        present = {"gate_input": cfg.head is not None and bool(cfg.head.pattern),
                   "read_hidden": read_pad_id(cfg) is not None}
        return cls(**{name: sharding.named_sharding(cls.AXES[name], shape, mesh) for name, shape in shapes.items()
                      if present.get(name, True)})

    @property
    def next_positions(self) -> jax.Array:
        """[batch] position of the token that follows each cached row."""
        return jnp.max(jnp.where(self.valid, self.positions, -1), axis=-1) + 1

    def _map(self, fn) -> KVCache:
        """`fn(array, its batch axis)` on every field that is there."""
        return KVCache(**{name: None if getattr(self, name) is None else fn(getattr(self, name), axes.index("batch"))
                          for name, axes in self.AXES.items()})

    def repeat(self, rows: int) -> KVCache:
        """A batch-1 cache as `rows` rows (broadcast: XLA does not copy it where it need not)."""
        def spread(x, axis):
            shape = list(x.shape)
            shape[axis] = rows
            return jnp.broadcast_to(x, shape)

        return self._map(spread)

    def row(self, row: jax.Array | int) -> KVCache:
        """Row `row` of a batched cache as a batch-1 cache."""
        return self._map(lambda x, axis: jax.lax.dynamic_slice_in_dim(x, row, 1, axis))

    def head(self, length: int) -> KVCache:
        """The first `length` positions."""
        return KVCache(k=self.k[:, :, :length], v=self.v[:, :, :length], positions=self.positions[:, :length],
                       valid=self.valid[:, :length], **self._prompt_fields())

    def _prompt_fields(self) -> dict:
        return {name: getattr(self, name) for name in self.PROMPT_FIELDS}

    def append(self, new: KVCache) -> KVCache:
        """This cache followed by `new`'s positions (a forward's K/V after it), row by row; a batch-1 cache is
        repeated over `new`'s rows first. The prompt's fields (a gated head's input, its read point) stay this
        cache's."""
        mine = self.repeat(new.k.shape[1]) if self.k.shape[1] != new.k.shape[1] else self
        return KVCache(k=jnp.concatenate([mine.k, new.k], axis=2), v=jnp.concatenate([mine.v, new.v], axis=2),
                       positions=jnp.concatenate([mine.positions, new.positions], axis=1),
                       valid=jnp.concatenate([mine.valid, new.valid], axis=1), **mine._prompt_fields())

    def with_free_slots(self, free: int) -> KVCache:
        """This cache followed by `free` empty slots (`valid` False until written): a fixed shape that a decoding
        loop writes into, so that the loop's body compiles once (append grows the shape every step)."""
        return self._over_slots(lambda name, x, axis: jnp.pad(
            x, [(0, free) if a == axis else (0, 0) for a in range(x.ndim)]))

    def before(self, at) -> KVCache:
        """This cache with its slots from `at` (may be traced) on emptied (`valid` False, K/V zero: a stale value
        there, even NaN, never reaches attention's weights x values): the prefix up to `at` in a fixed shape."""
        def cut(name, x, axis):
            keep = (jnp.arange(x.shape[axis]) < at).reshape([-1 if a == axis else 1 for a in range(x.ndim)])
            return jnp.where(keep, x, jnp.zeros((), x.dtype))
        return self._over_slots(cut)

    def write(self, new: KVCache, at) -> KVCache:
        """This cache with `new`'s positions written into its slots from `at` (may be traced) on."""
        return self._over_slots(lambda name, x, axis: jax.lax.dynamic_update_slice_in_dim(
            x, getattr(new, name).astype(x.dtype), at, axis))

    def _over_slots(self, fn) -> KVCache:
        """`fn(name, array, its slot axis)` on every field with slots (the one after the batch axis)."""
        return KVCache(**{name: fn(name, getattr(self, name), self.AXES[name].index("batch") + 1)
                          for name in ("k", "v", "positions", "valid")}, **self._prompt_fields())


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Forward:
    """Named outputs of one forward."""

    hidden: jax.Array  # [B, T, H] after the final norm
    kv: KVCache  # the new tokens' keys/values (append to a prefix cache, or keep as one)
    residuals: jax.Array | None = None  # [L, B, T, H] residual after each layer, only when asked
    attention: jax.Array | None = None  # [L, B, T, H] each layer's attention write to the residual (when asked)
    mlp: jax.Array | None = None  # [L, B, T, H] each layer's MLP write (when asked)


class GatedHead(nnx.Module):
    """The gating network of ArmoRM / QRM / URM (numerics in rmjax.heads), all float32, replicated."""

    def __init__(self, head: HeadConfig, hidden: int):
        self.config = head
        width = hidden
        for i in range(head.gate_layers + 1):
            last = i == head.gate_layers
            out = head.num_objectives if last else head.gate_hidden
            self._declare(f"gate{i}", (width, out))
            if last or head.gate_bias:
                self._declare(f"gate{i}_bias", (out,))
            if head.batchnorm and not last:
                for stat in ("scale", "shift", "mean", "var"):
                    self._declare(f"bn{i}_{stat}", (out,))
            width = out
        if head.kind != "urm":
            self._declare("logit_scale", (1,))
            if head.transform:
                self._declare("transform", (head.num_objectives, head.num_objectives))

    def _declare(self, name: str, shape: tuple[int, ...]) -> None:
        setattr(self, name, weight(shape, (None,) * len(shape), jnp.float32, float32=True))

    def weights(self) -> dict[str, jax.Array]:
        return {k: v[...] for k, v in vars(self).items() if isinstance(v, nnx.Param)}

    def __call__(self, scores: jax.Array, gate_input: jax.Array) -> jax.Array:
        return heads_lib.apply(self.weights(), self.config, scores, gate_input)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Segments:
    """Several short sequences packed end to end in one row (GCG's candidate tails): a new token attends only
    to new tokens of its own segment, and to cache entries before its segment's `cache_end` (an index into
    the cache's sequence axis). Positions are given with it, one run per segment."""

    ids: jax.Array  # [batch, seq] int32
    cache_end: jax.Array  # [batch, seq] int32


def _segment_masks(segments: Segments | None, cache_length: int | None) -> tuple:
    """Per key block (cache first, if any), what packing additionally allows: [batch, q, k] or True."""
    if segments is None:
        return (True, True) if cache_length is not None else (True,)
    own = segments.ids[:, :, None] == segments.ids[:, None, :]
    if cache_length is None:
        return (own,)
    return (jnp.arange(cache_length)[None, None, :] < segments.cache_end[:, :, None], own)


def positions_from_mask(mask: jax.Array, offset: jax.Array | int = 0) -> jax.Array:
    """Position of each token counting only real tokens, so left padding does not shift RoPE."""
    offset = jnp.asarray(offset, jnp.int32)
    if offset.ndim == 1:
        offset = offset[:, None]
    return jnp.maximum(jnp.cumsum(mask.astype(jnp.int32), axis=-1) - 1, 0) + offset


def last_token_index(mask: jax.Array) -> jax.Array:
    """Index of the rightmost real token of each row (works for left and right padding)."""
    idx = jnp.arange(mask.shape[-1])
    return jnp.argmax(jnp.where(mask.astype(bool), idx, -1), axis=-1)


def read_pad_id(cfg: ModelConfig) -> int | None:
    """The id the reward head reads past at the end of a row (`read_index`): a reward model's pad id; None where it
    reads the last real token (no pad id, or a causal LM)."""
    return cfg.pad_token_id if cfg.is_reward_model else None


def read_index(mask: jax.Array, ids: jax.Array | None = None, pad_id: int | None = None) -> jax.Array:
    """Where the reward head reads each row: transformers' *ForSequenceClassification reads the rightmost token
    whose id is not `pad_token_id` (so a conversation ending in the pad id, as pad = eos makes a Llama 3 turn's
    <|eot_id|>, is read at the token before it). Here among the mask's real tokens; -1 where a row has none (the
    caller's fallback). Without a pad id (or ids), the rightmost real token."""
    idx = jnp.arange(mask.shape[-1])
    return jnp.max(jnp.where(readable(mask, ids, pad_id), idx, -1), axis=-1)


def readable(mask: jax.Array, ids: jax.Array | None = None, pad_id: int | None = None) -> jax.Array:
    """[B, T] bool: the tokens the reward head may read (real, and not the pad id where one is given)."""
    out = mask.astype(bool)
    return out & (ids != pad_id) if ids is not None and pad_id is not None else out


def or_first_real(at: jax.Array, mask: jax.Array) -> jax.Array:
    """Read indices `at` [B] or [B, T] with -1 (nothing readable) replaced by the row's first real token
    (transformers' argmax over no match gives 0)."""
    first = jnp.argmax(mask.astype(bool), axis=-1).reshape((-1,) + (1,) * (at.ndim - 1))
    return jnp.where(at < 0, first, at)


def at_read(hidden: jax.Array, mask: jax.Array, ids: jax.Array | None = None, pad_id: int | None = None,
            fallback: jax.Array | None = None) -> jax.Array:
    """[B, T, H] -> [B, H] at each row's read point (`read_index`). A row with no readable token takes `fallback`
    [B or 1, H] (a cached prompt's read point), else its first real token (transformers' argmax gives 0)."""
    at = read_index(mask, ids, pad_id)
    rows = hidden[jnp.arange(hidden.shape[0]), or_first_real(at, mask)]
    if fallback is None:
        return rows
    return jnp.where((at < 0)[:, None], jnp.broadcast_to(fallback, rows.shape).astype(rows.dtype), rows)


def at_last(hidden: jax.Array, mask: jax.Array) -> jax.Array:
    """[B, T, H] -> [B, H] at each row's last real token."""
    return hidden[jnp.arange(hidden.shape[0]), last_token_index(mask)]


class Transformer(nnx.Module):
    """A Llama / Gemma 1/2/3 decoder with an LM head (causal LM) or a score head (+ gated head)."""

    def __init__(self, cfg: ModelConfig, dtype=jnp.float32):
        self.config = cfg
        self.embed = Embedder(cfg, dtype)
        self.layers = DecoderStack(cfg, dtype)
        self.final_norm = RMSNorm(cfg, dtype)
        untied = not cfg.tie_embeddings and not cfg.is_reward_model
        self.lm_head = Linear((cfg.hidden_size, cfg.vocab_size), ("embed", "vocab"), dtype) if untied else None
        self.score = (Linear((cfg.hidden_size, cfg.num_labels), ("embed", "labels"), dtype, float32=True)
                      if cfg.is_reward_model else None)
        self.head = GatedHead(cfg.head, cfg.hidden_size) if cfg.head is not None else None

    def __call__(self, *, ids: jax.Array | None = None, embeds: jax.Array | None = None,
                 mask: jax.Array | None = None, positions: jax.Array | None = None,
                 cache: KVCache | None = None, residuals: bool = False, patch: Patch | None = None,
                 segments: Segments | None = None) -> Forward:
        """`embeds` are raw embedding rows (e.g. GCG's differentiable one-hot rows); the Gemma scale is
        applied here for both, so ids=x equals embeds=table[x] (transformers' inputs_embeds expects it
        applied). With `cache`, the new tokens attend to the cached prefix too. Padding (mask False) enters
        the stack as zeros (`inputs`)."""
        x, mask, positions, inputs = self.enter(ids=ids, embeds=embeds, mask=mask, positions=positions, cache=cache,
                                                segments=segments)
        x, k, v, reads = self.layers(x, inputs, None if cache is None else cache.k,
                                     None if cache is None else cache.v, residuals, patch)
        kv = KVCache(k=k, v=v, positions=positions, valid=mask)
        return Forward(self.final_norm(x), kv, *(reads or ()))

    def enter(self, *, ids: jax.Array | None = None, embeds: jax.Array | None = None, mask: jax.Array | None = None,
              positions: jax.Array | None = None, cache: KVCache | None = None, segments: Segments | None = None
              ) -> tuple[jax.Array, jax.Array, jax.Array, AttentionInputs]:
        """What the decoder stack is given: its input rows [B, T, H], the mask, the positions and the attention
        inputs (a forked forward runs one stack's lower layers and two upper parts on them)."""
        rows = self.embed(ids) if embeds is None else embeds
        mask = jnp.ones(rows.shape[:2], bool) if mask is None else mask.astype(bool)
        if positions is None:
            positions = positions_from_mask(mask, 0 if cache is None else cache.next_positions)
        return self.inputs(rows, mask), mask, positions, self.attention_inputs(positions, mask, cache, segments)

    def inputs(self, rows: jax.Array, mask: jax.Array) -> jax.Array:
        """Embedding rows [B, T, H] as the first layer sees them: scaled, and zero where `mask` says padding.
        A padded key gets attention weight exactly 0, but 0 x NaN is NaN in the weights x values product: a pad
        token whose row is NaN/Inf (or overflows under Gemma's scale) turned every padded row NaN. From zeros a
        padded position's hidden state, keys and values (in a cache too) are mixes of its row's real tokens,
        finite when those are (RMSNorm of zeros is zero, by its eps); the real positions' results are the same
        bit for bit. A real token's NaN still shows."""
        x = self.embed.scaled(rows)
        # The embedding gather reads a vocab-sharded table: say where its rows go.
        return constrain(jnp.where(mask[..., None], x, jnp.zeros((), x.dtype)), ACTIVATION)

    def attention_inputs(self, positions, mask, cache: KVCache | None,
                          segments: Segments | None = None) -> AttentionInputs:
        cfg = self.config
        batch = positions.shape[0]
        blocks = [(positions, mask)]
        if cache is not None:  # key blocks: the cached prefix, then the new tokens
            blocks.insert(0, (jnp.broadcast_to(cache.positions, (batch, cache.positions.shape[-1])),
                              jnp.broadcast_to(cache.valid, (batch, cache.valid.shape[-1]))))
        within = _segment_masks(segments, None if cache is None else cache.positions.shape[-1])

        def masks(window):
            return tuple(ops.attention_mask(positions, kp, kv, window) & w
                         for (kp, kv), w in zip(blocks, within, strict=True))

        masks_g = masks(None)
        rope_g = ops.rope_angles(positions, cfg.rope_global, cfg.head_dim)
        if not cfg.has_local_layers:
            return AttentionInputs(rope_g, rope_g, masks_g, masks_g)
        return AttentionInputs(rope_g, ops.rope_angles(positions, cfg.rope_local, cfg.head_dim), masks_g,
                               masks(cfg.sliding_window))

    # Heads -----------------------------------------------------------------------------------
    def reward_head(self, last: jax.Array, gate_input: jax.Array | None = None) -> jax.Array:
        """[B, num_outputs] float32 from last-token hidden states [B, H]; `gate_input` is what a
        prompt-gated head reads (hidden state at the prompt end, [B or 1, H])."""
        scores = self.score(last)
        if self.head is None:
            return scores
        gate = last if not self.head.config.pattern else jnp.broadcast_to(gate_input, last.shape)
        return self.head(scores, gate)

    def gate_input(self, ids: jax.Array, mask: jax.Array, hidden: jax.Array) -> jax.Array | None:
        head = self.config.head
        return heads_lib.gate_input(head, ids, mask, hidden) if head is not None and head.pattern else None

    def prefix_gate_inputs(self, ids: jax.Array, mask: jax.Array, hidden: jax.Array) -> jax.Array | None:
        """[B, T, H]: what each row cut after each of its tokens gates on (NaN before the pattern); None ungated."""
        head = self.config.head
        return heads_lib.prefix_gate_inputs(head, ids, mask, hidden) if head is not None and head.pattern else None

    def read_positions(self, mask: jax.Array, ids: jax.Array) -> jax.Array:
        """[B] where the head reads each whole row (`read_index`; its first real token where it reads none)."""
        return or_first_real(read_index(mask, ids, read_pad_id(self.config)), mask)

    def read(self, hidden: jax.Array, mask: jax.Array, ids: jax.Array | None,
             cache: KVCache | None = None) -> jax.Array:
        """[B, T, H] -> [B, H] where the reward head reads (`read_index`: past trailing pad ids, as transformers);
        after a `cache`, a row none of whose new tokens is read reads the cached prompt's read point."""
        return at_read(hidden, mask, ids, read_pad_id(self.config), None if cache is None else cache.read_hidden)

    def rewards_from(self, ids: jax.Array, mask: jax.Array, hidden: jax.Array) -> jax.Array:
        """Head outputs at each row's read point, a prompt-gated head reading its pattern in `ids`."""
        return self.reward_head(self.read(hidden, mask, ids), self.gate_input(ids, mask, hidden))

    def lm_logits(self, hidden: jax.Array) -> jax.Array:
        """Next-token logits in float32 with the final soft cap (Gemma 2)."""
        logits = self.lm_head(hidden) if self.lm_head is not None else self.embed.attend(hidden)
        return ops.softcap(logits, self.config.final_softcap)

    # Common uses -----------------------------------------------------------------------------
    def rewards(self, ids: jax.Array, mask: jax.Array) -> jax.Array:
        """All head outputs at each row's last real token: [B, num_outputs] float32."""
        return self.rewards_from(ids, mask, self(ids=ids, mask=mask).hidden)

    def prefill(self, ids: jax.Array, mask: jax.Array | None = None) -> KVCache:
        """K/V of a prefix, computed once and reused by every continuation (with a gated head's input)."""
        out = self(ids=ids, mask=mask)
        valid = jnp.ones(ids.shape, bool) if mask is None else mask
        read = self.read(out.hidden, valid, ids) if read_pad_id(self.config) is not None else None
        return dataclasses.replace(out.kv, gate_input=self.gate_input(ids, valid, out.hidden), read_hidden=read)

    def last_hidden_after(self, cache: KVCache, ids: jax.Array, mask: jax.Array | None = None) -> jax.Array:
        """Final-normed hidden state at each row's read point after the cached prefix (in the prefix where no new
        token is read): [B, H]."""
        mask = jnp.ones(ids.shape, bool) if mask is None else mask
        return self.read(self(ids=ids, mask=mask, cache=cache).hidden, mask, ids, cache)

    def rewards_after(self, cache: KVCache, ids: jax.Array, mask: jax.Array | None = None) -> jax.Array:
        """Head outputs for `cache` prefix + `ids`, at each row's read point."""
        return self.reward_head(self.last_hidden_after(cache, ids, mask), cache.gate_input)

    def trace(self, ids: jax.Array, mask: jax.Array) -> dict[str, jax.Array]:
        """Every stage of one forward, for per-layer reads and for finding where a NaN starts:
        embeddings [B, T, H] (as the stack sees them: scaled, zero at padding), residual after each layer
        [L, B, T, H], final-normed hidden [B, T, H] and, at the last token, the head's outputs [B, num_outputs]
        (a causal LM: the next-token log-probs [B, vocab])."""
        rows = self.embed(ids)
        out = self(embeds=rows, mask=mask, residuals=True)
        trace = {"embeddings": self.inputs(rows, mask.astype(bool)), "layers": out.residuals, "hidden": out.hidden}
        if self.config.is_reward_model:
            trace["head"] = self.rewards_from(ids, mask, out.hidden)
        else:
            trace["head"] = jax.nn.log_softmax(self.lm_logits(at_last(out.hidden, mask)), axis=-1)
        return trace
