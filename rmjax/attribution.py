"""Which input tokens the reward rests on: gradient × input and integrated gradients with respect to the input
embeddings (the raw rows; Gemma's scale is applied inside the forward), per token of prompt and response.

IG integrates along the straight path from a baseline (every position's embedding set to the pad token's row,
or to zero; the template's special tokens stay as they are) with midpoint steps, batched. `completeness_gap`
is sum(IG) − (reward(x) − reward(baseline)); it shrinks as the steps grow (the tests hold it within 1% at 64
steps on tiny models). On real models the path leaves the embedding manifold and the reward along it swings
hard (elo-rm-smollm2-135m: from −2.4 to −11 between α = 0.25 and 0.6, slopes up to 290): give --steps in the
hundreds and read the reported gap.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from rmjax import batching, nn
from rmjax.config import ModelConfig
from rmjax.distributed import replicated, to_host
from rmjax.errors import UsageError
from rmjax.loading import Model

# The pad token's row is the default: from the zero embedding the first RMSNorm (scale-invariant but for its
# eps) keeps the reward nearly constant along the path except at α ≈ 0, where it jumps; no step count resolves
# that in float32 (tiny models: 92–173% completeness gap at 64 steps, worse at 256; the pad baseline: < 0.01%).
BASELINES = ("pad", "zero")


@dataclasses.dataclass
class Attribution:
    ids: list[int]
    grad_x_input: np.ndarray  # [T]
    integrated_gradients: np.ndarray  # [T]
    reward: float
    baseline_reward: float

    @property
    def completeness_gap(self) -> float:
        return float(self.integrated_gradients.sum() - (self.reward - self.baseline_reward))

    @property
    def relative_gap(self) -> float:
        return abs(self.completeness_gap) / max(abs(self.reward - self.baseline_reward), 1e-12)


LENGTH_BUCKET = 8  # conversations are right-padded to a multiple of this: one compilation serves many lengths


@functools.partial(jax.jit, static_argnames=("cfg", "column"))
def _rewards_and_grads(params, cfg: ModelConfig, ids: jax.Array, mask: jax.Array, embeds: jax.Array, column: int):
    """Reward output `column` and its gradient w.r.t. the embedding rows, for each row of embeds [S, T, H]
    (right padding past `mask` is causal-invisible to the real tokens and gets zero gradient)."""
    model = nn.module(params, cfg)

    def reward(rows):
        hidden = model(embeds=rows[None], mask=mask).hidden
        return model.rewards_from(ids, mask, hidden)[0, column]

    return jax.vmap(jax.value_and_grad(reward))(embeds)


def attribute(model: Model, ids: list[int], *, steps: int = 64, baseline: str = "pad", batch_size: int = 16,
              column: int | None = None, keep_special: bool = True) -> Attribution:
    """Gradient × input and integrated gradients of one conversation's reward (token ids)."""
    if baseline not in BASELINES:
        raise UsageError(f"--baseline={baseline}: must be one of {', '.join(BASELINES)}.")
    column = model.output_column if column is None else column
    table = nn.get(model.params, "embed.embedding")
    x = table[jnp.asarray(ids)].astype(jnp.float32)  # [T, H]
    if baseline == "zero":
        base = jnp.zeros_like(x)
    else:
        pad = model.tokenizer.pad_token_id if model.tokenizer is not None else None
        if pad is None:
            raise UsageError("--baseline=pad: this tokenizer has no pad token; use --baseline=zero.")
        base = jnp.broadcast_to(table[pad].astype(jnp.float32), x.shape)
    if keep_special and model.tokenizer is not None:
        # The template's special tokens (BOS, turn markers) stay as they are on the whole path: real models park
        # massive activations on them, and interpolating them makes the path integral diverge.
        special = np.isin(np.asarray(ids), list(getattr(model.tokenizer, "all_special_ids", ())))
        base = jnp.where(jnp.asarray(special)[:, None], x, base)
    t = len(ids)
    width = batching.bucket(t, LENGTH_BUCKET)
    ids_arr, mask = replicated(batching.pad_rows([ids], width), model.mesh)

    def run(rows: jax.Array) -> tuple[np.ndarray, np.ndarray]:
        """Rewards and gradients of up to batch_size embedding sequences [S, T, H] (one shape: one compilation)."""
        padded = jnp.zeros((batch_size, width, x.shape[1]), table.dtype).at[: len(rows), :t].set(rows)
        r, g = _rewards_and_grads(model.params, model.config, ids_arr, mask, padded, column)
        return to_host(r)[: len(rows)], to_host(g)[: len(rows), :t]

    # One stream of rows in batches: the input (α = 1), the baseline (α = 0), then the IG midpoints.
    alphas = np.concatenate([[1.0, 0.0], (np.arange(steps) + 0.5) / steps])
    rewards, total = [], np.zeros(x.shape, np.float64)
    for start in range(0, len(alphas), batch_size):
        a = jnp.asarray(alphas[start : start + batch_size], jnp.float32)
        r, grads = run(base[None] + a[:, None, None] * (x - base)[None])
        rewards += r.tolist()
        if start == 0:
            grad_x = grads[0]
        total += grads[max(0, 2 - start) :].astype(np.float64).sum(0) / steps
    reward, base_reward = rewards[0], rewards[1]
    delta = np.asarray(x - base, np.float64)
    return Attribution(list(ids), (np.asarray(x, np.float64) * grad_x).sum(-1), (delta * total).sum(-1),
                       float(reward), float(base_reward))

