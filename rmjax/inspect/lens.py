"""Where a reward model makes its preference: the reward lens per layer, the direct contribution of each
attention and MLP write, and the reward of every prefix of a response. One forward with per-layer reads
(`Forward.residuals`, `.attention`, `.mlp`) serves all three.

- Lens: the head read from the residual stream after the embeddings and after each layer (final norm,
  then the score head and any gate, at the reward position). After the last layer it is the reward.
- Direct contributions: each write u (embeddings, every attention and MLP output) mapped to the reward
  through the final norm with its scale frozen at the reward token (w ⊙ u / rms(x_final)) and the head
  linearized there. The writes sum to x_final, so for a linear head the contributions sum to the reward
  (minus the head's bias); `explained` reports the sum over the reward for every head.
- Curve: the head at each position of one forward: what reward-bench gets with one forward per prefix.

A prompt-gated head (ArmoRM, QRM) keeps the gate of the actual run at every layer.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from rmjax import heads, nn
from rmjax.compiled import PARAMS, REPLICATED, Compiled, compiled, declared_params
from rmjax.config import ModelConfig
from rmjax.model import Model
from rmjax.nn import ops
from rmjax.parallel import batching
from rmjax.parallel.distributed import replicated, to_host


@dataclasses.dataclass
class Lens:
    """For B conversations, all head outputs: lens [L+1, B, out] (row 0: the embeddings), reward [B, out];
    contributions of the embeddings [B, out], attention and MLP writes [L, B, out]; their sum [B, out]."""

    lens: np.ndarray
    reward: np.ndarray
    embeddings: np.ndarray
    attention: np.ndarray
    mlp: np.ndarray

    @property
    def total(self) -> np.ndarray:
        return self.embeddings + self.attention.sum(0) + self.mlp.sum(0)

    @property
    def explained(self) -> np.ndarray:
        """The linear sum over the reward [B, out] (1 for a linear head without bias)."""
        return self.total / self.reward


def _lens(cfg: ModelConfig, params, ids: jax.Array, mask: jax.Array) -> dict[str, jax.Array]:
    model = nn.module(params, cfg)
    embeds = model.embed.scaled(model.embed(ids))
    out = model(ids=ids, mask=mask, residuals=True)
    rows = jnp.arange(ids.shape[0])
    at = model.read_positions(mask, ids)
    gate = model.gate_input(ids, mask, out.hidden)
    stream = jnp.concatenate([embeds[None], out.residuals])[:, rows, at]  # [L+1, B, H], the model's dtype
    # normed in the model's dtype, as the forward norms it; the last layer's reading is the reward itself, read from
    # the forward's hidden state (in bfloat16 a residual cast to float32 first read 1.6e-3 off it, and a norm XLA
    # fuses into the head keeps excess precision: 5.6e-4)
    lens = jax.vmap(lambda x: model.reward_head(model.final_norm(x), gate))(stream[:-1])
    lens = jnp.concatenate([lens, model.reward_head(out.hidden[rows, at], gate)[None]])
    stream = stream.astype(jnp.float32)
    final = stream[-1]
    normed = model.final_norm(final)
    scale = ops.rms_norm_scale(final, model.final_norm.scale[...], cfg.norm_eps, cfg.norm_plus_one)
    _, head = jax.linearize(lambda h: model.reward_head(h, gate), normed.astype(jnp.float32))

    def through(writes):  # [..., B, H] -> [..., B, out]
        flat = writes.reshape(-1, *final.shape)
        return jax.vmap(head)(flat * scale).reshape(*writes.shape[:-2], final.shape[0], -1)

    return {"lens": lens, "reward": lens[-1], "embeddings": through(embeds[rows, at][None])[0],
            "attention": through(out.attention[:, rows, at]), "mlp": through(out.mlp[:, rows, at])}


def reward_lens(model: Model, sequences: list[list[int]]) -> Lens:
    """The lens and direct contributions of full conversations (token ids), right-padded into one batch."""
    ids, mask = batching.pad_rows(sequences, pad_id=0)
    out = _whole(_lens, model, ids, mask)
    return Lens(**{k: to_host(v) for k, v in out.items()})


def _curve(cfg: ModelConfig, params, ids: jax.Array, mask: jax.Array) -> jax.Array:
    model = nn.module(params, cfg)
    hidden = model(ids=ids, mask=mask).hidden
    b, t, h = hidden.shape
    gate = model.prefix_gate_inputs(ids, mask, hidden)  # a cut before the pattern has no gate: NaN, as scored
    gate = None if gate is None else gate.reshape(b * t, -1)
    pad = nn.read_pad_id(cfg)
    if pad is not None:  # a cut ending in pad ids is read before them (nn.read_index), its first token where all are
        at = jax.lax.cummax(jnp.where(nn.readable(mask, ids, pad), jnp.arange(t)[None], -1), axis=1)
        hidden = hidden[jnp.arange(b)[:, None], nn.or_first_real(at, mask)]
    return model.reward_head(hidden.reshape(b * t, h), gate).reshape(b, t, -1)


def token_rewards(model: Model, sequences: list[list[int]]) -> list[np.ndarray]:
    """Per conversation, every head output at each of its positions [T_i, out]: position j is the reward of
    the conversation cut after token j (causal attention: one forward gives every prefix; a prompt-gated head reads
    the gate pattern's last occurrence inside the cut, so its score is NaN before the first)."""
    ids, mask = batching.pad_rows(sequences, pad_id=0)
    out = to_host(_whole(_curve, model, ids, mask))
    return [out[i, : len(s)] for i, s in enumerate(sequences)]


def gated_from(model: Model, sequence: list[int]) -> int:
    """The first position of `token_rewards` a prompt-gated head gives a score (its first cut holding the pattern):
    0 for other heads, len(sequence) where no cut holds it."""
    head = model.config.head
    if head is None or not head.pattern:
        return 0
    ids = np.asarray([sequence], np.int32)
    found = np.flatnonzero(np.asarray(heads.pattern_starts(head, ids, np.ones_like(ids, bool)))[0] >= 0)
    return int(found[0]) if found.size else len(sequence)


def _whole(fn, model: Model, ids: np.ndarray, mask: np.ndarray):
    """`fn` on a few whole conversations: every device holds them (too few rows to split), the weights stay where
    they are declared."""
    return whole_call(fn, model.config, model.mesh)(declared_params(model), *replicated((ids, mask), model.mesh))


def whole_call(fn, cfg: ModelConfig, mesh) -> Compiled:
    """`fn` (the lens, the token curve) compiled for whole conversations on every device."""
    return compiled(fn, cfg, mesh, (PARAMS, REPLICATED, REPLICATED), REPLICATED)
