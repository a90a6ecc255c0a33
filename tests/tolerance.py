"""Tolerances of the suite, derived from a float32 rounding-error bound (never from what one CPU produced).

The rule. A test that compares two computations of the same math run differently in float32 (PyTorch vs
JAX, eager vs jit, a batch of 1 vs 8, the prefix cache vs the full sequence, one device vs a mesh, packed
vs unpacked candidates) allows `f32_atol` of the computation: the difference comes only from rounding
(another summation order, a fused multiply-add, other vector widths, another exp/tanh/rsqrt polynomial),
which changes from one CPU, XLA version or fusion decision to the next. Two paths that must give the
same bits (the same jitted function on the same inputs; a resumed run replaying the uninterrupted one)
compare exactly. A statistic against scipy or a brute force in float64 keeps its float64 tolerance
(rel 1e-12 .. 1e-7 for a handful of float64 operations, u64 = 2^-53 ~ 1.1e-16), stated where it is used.

The bound. An inner product of n terms computed in float32 is off by at most n·u·Σ|x_i·y_i|
(u = 2^-24 ~ 6.0e-8, the unit roundoff), and, its rounding errors being independent and of mean zero,
by about sqrt(n)·u·Σ|x_i·y_i| (Higham & Mary, "A new approach to probabilistic rounding error
analysis", SIAM J. Sci. Comput. 41 (2019)). A forward is a chain of inner products: per layer the
input norm's mean square (H), q/k/v (H), [q/k norms (D)], scores (D), softmax sum and P·V (T keys each),
the output projection (heads·D), [post-attention norm (H)], the MLP norm (H), gate/up (H), down (I),
[post-MLP norm (H)]; then the final norm (H) and the head (H, or the gate's widths). Their errors add
in quadrature along the chain (`forward_terms` sums the lengths, N), and the output is off by about
sqrt(N)·u·S, where S is the sum of |terms| of the output's last inner product (`reward_scale`:
Σ_i |h_i·w_i| over the hidden state h and score column w; not |reward|, which cancellation makes ten
times smaller: on elo-rm-smollm2-135m a reward of -3.86 is a sum of terms whose magnitudes add up to 47).
Each of the two evaluations is within that, so they differ by at most

    f32_atol = 2 · sqrt(N) · u · S.

The model assumes the layers do not amplify an early error (a residual stream adds each layer's
write to it, the norms rescale); the measured spread is what checks that assumption, below. The same
rule gives the bounds of LM logits (S = Σ_i |h_i·e_vi|), log-probs (twice the logits'), a gated head's
outputs (the error carried through its gate, `_gated_scales`), the lens's direct contributions
(`contributions_atol`), gradients (`grad_atol`: the backward doubles the chain) and two Adam runs
(`adam_atol`, `bt_loss_atol`). Where a test cannot rebuild the inputs (the CSV files of two runs),
`any_rewards_atol` bounds S over every input through the final norm (about 2x reward_scale).

What it allows, what it still catches (measured when this was written, for the record only):
elo-rm-smollm2-135m (30 layers, H 576, 4 tokens): bound 2.9e-3 on rewards of ~3.9. The spread of eager
vs jit is 6e-6 on this CPU and 5.1e-5 on another x86 CPU (issue 21), of batch 1 vs 2 2.1e-5: >= 50x
below the bound. A real bug changes the math by far more: RMSNorm eps / 10 moves that reward by 1.4e-2
(5x the bound), eps x 10 by 0.13, query scale x 1.01 by 0.16, RoPE theta 1e4 for 1e5 by 0.9, Gemma's
(1 + w) norm on a Llama by 16. Tiny test models (4 layers, H 64, tests/tiny.py): reward bounds of
1.6e-5..4.8e-5 (the old fixed 1e-5 sat below all of them), logits 3e-5..2.2e-4; PyTorch vs JAX, eager
vs jit, batch 1 / 4 / 16 and XLA fast math all stay below 1/20 of them, while a query scale off by 0.1%
or a RoPE theta off by 10% exceeds them 4x to 70x (tests/test_tolerance.py keeps both sides checked).

bfloat16 (u = 2^-8 ~ 0.39%) against float32 is not this rule: each stored weight and activation rounds
once, deterministically on any IEEE CPU (round to nearest even), which dominates the float32
accumulation; those two tests keep their measured-plus-margin tolerances, stated where they are used.
"""

from __future__ import annotations

import functools
import math

import jax
import numpy as np

from rmjax import nn
from tests import jitted as M

U32 = 2.0**-24  # float32 unit roundoff: 24 significant bits
U_BF16 = 2.0**-8  # bfloat16 unit roundoff: 8 significant bits


def f32_atol(scale: float, terms: int, evaluations: int = 2) -> float:
    """Absolute tolerance between `evaluations` (2: both sides rounded; 1: against a float64 or exact
    reference) float32 evaluations of a chain of inner products of total length `terms` whose output's
    last inner product has sum of |terms| `scale`: evaluations · sqrt(terms) · u · scale."""
    return float(evaluations * math.sqrt(terms) * U32 * scale)


def forward_terms(cfg, length: int) -> int:
    """N: the summed lengths of the inner products along one forward of `cfg` over `length` keys (the
    sequence plus any cached prefix), through the final norm and a linear head (module docstring)."""
    h, d = cfg.hidden_size, cfg.head_dim
    attention = h + h + d + 2 * length + cfg.num_heads * d + (2 * d if cfg.qk_norm else 0)
    mlp = h + h + cfg.intermediate_size
    post = 2 * h if cfg.sandwich_norms else 0
    terms = cfg.num_layers * (attention + mlp + post) + 2 * h
    if cfg.head is not None:  # the gate's layers and the transform / objective sums
        terms += h + cfg.head.gate_layers * cfg.head.gate_hidden + 2 * cfg.head.score_width
    return terms


@functools.partial(jax.jit, static_argnames=("cfg",))
def _hidden(params, cfg, ids, mask):
    """Final-normed hidden states [B, T, H] and a prompt-gated head's input [B, H] (or None)."""
    m = nn.module(params, cfg)
    hidden = m(ids=ids, mask=mask).hidden
    return hidden, m.gate_input(ids, mask, hidden)


def _read_hidden(params, cfg, ids, mask, cache=None) -> tuple[np.ndarray, np.ndarray | None]:
    """Final-normed hidden state where the head reads each row (nn.at_read) [B, H], and the gate's input (or
    None)."""
    ids = np.asarray(ids, np.int32)
    mask = np.ones(ids.shape, bool) if mask is None else np.asarray(mask, bool)
    if cache is not None:
        return np.asarray(M.last_hidden_after(params, cfg, cache, ids, mask), np.float64), (
            None if cache.gate_input is None else np.asarray(cache.gate_input, np.float64))
    hidden, gate = _hidden(params, cfg, ids, mask)
    read = np.asarray(nn.at_read(hidden, mask, ids, nn.read_pad_id(cfg)), np.float64)
    return read, None if gate is None else np.asarray(gate, np.float64)


def _gated_scales(params, cfg, last: np.ndarray, gate_in: np.ndarray | None) -> np.ndarray:
    """S of each output of a gated head (ArmoRM, QRM, URM), [B, num_outputs]: the error carried through
    the head to first order, in units of sqrt(N)·u. The hidden state enters with error |h| (componentwise
    relative, as for a plain head); each linear map adds its own rounding (|x|·|W|, its sum of |terms|) to
    the error it carries, which it mixes as independent errors do: sqrt(e²·W²); an activation scales the
    error by its slope, BatchNorm by 1/sqrt(var + eps) (a tiny variance amplifies: the test heads have
    some), the softmax by gate_j / T."""
    head = cfg.head
    w = np.asarray(nn.get(params, "score.kernel"), np.float64)
    p = {k.split(".", 1)[1]: np.asarray(v, np.float64) for k, v in nn.flat(params).items() if k.startswith("head.")}

    def linear(x, e, weight, bias=0.0):
        return x @ weight + bias, np.sqrt(e**2 @ weight**2) + np.abs(x) @ np.abs(weight) + np.abs(bias)

    scores, scores_e = last @ w, np.abs(last) @ np.abs(w)  # the plain head's S, column by column
    x = np.nan_to_num(last if gate_in is None else np.broadcast_to(gate_in, last.shape))
    e = np.abs(x)
    selu_scale, selu_alpha = 1.0507009873554805, 1.6732632423543772
    for i in range(head.gate_layers + 1):
        x, e = linear(x, e, p[f"gate{i}"], p.get(f"gate{i}_bias", 0.0))
        if i == head.gate_layers:
            break
        if head.kind == "urm":
            slope = selu_scale * np.where(x > 0, 1.0, selu_alpha * np.exp(np.minimum(x, 0)))
            x = selu_scale * np.where(x > 0, x, selu_alpha * np.expm1(np.minimum(x, 0)))
        else:
            slope, x = (x > 0).astype(np.float64), np.maximum(x, 0.0)
        e = e * slope
        if head.batchnorm:
            inv = p[f"bn{i}_scale"] / np.sqrt(p[f"bn{i}_var"] + head.batchnorm_eps)
            e = (e + np.abs(x) + np.abs(p[f"bn{i}_mean"])) * np.abs(inv)
            x = (x - p[f"bn{i}_mean"]) * inv + p[f"bn{i}_shift"]
    z, z_e = x, e
    if head.kind == "urm":  # output 0: sum_j z_j * mean_j
        means, means_e = scores[:, 0::2], scores_e[:, 0::2]
        first = np.sqrt(((z * means_e) ** 2 + (z_e * means) ** 2).sum(-1)) + np.abs(z * means).sum(-1)
        return np.concatenate([first[:, None], scores_e], axis=1)
    k, q = head.num_objectives, head.num_quantiles
    objective, objective_e = scores.reshape(-1, k, q).mean(-1), scores_e.reshape(-1, k, q).mean(-1)
    transform = p["transform"] if head.transform else np.eye(k)
    adjusted, adjusted_e = linear(objective, objective_e, transform)
    zs = z / head.temperature
    gate = np.exp(zs - zs.max(-1, keepdims=True))
    gate = gate / gate.sum(-1, keepdims=True)
    # softmax: d gate_j = gate_j ((1 - gate_j) dz_j - sum_{k != j} gate_k dz_k) / T, times the logit scale
    others = (gate**2 * z_e**2).sum(-1, keepdims=True) - (gate * z_e) ** 2
    gate_e = gate * np.sqrt(((1 - gate) * z_e) ** 2 + np.maximum(others, 0.0)) / head.temperature
    scale = abs(p["logit_scale"][0])
    gate, gate_e = gate * scale, gate_e * scale
    first = np.sqrt(((gate * adjusted_e) ** 2 + (gate_e * adjusted) ** 2).sum(-1)) + np.abs(gate * adjusted).sum(-1)
    return np.concatenate([first[:, None], adjusted_e if head.kind == "qrm" else objective_e], axis=1)


def reward_scale(params, cfg, ids, mask=None, cache=None) -> float:
    """S of the reward head's outputs for these rows: the largest sum of |terms| of an output,
    max over rows and outputs of Σ_i |h_i·w_i| (a gated head: propagated through its gate)."""
    read, gate_in = _read_hidden(params, cfg, ids, mask, cache)
    if cfg.head is not None:
        return float(np.nanmax(_gated_scales(params, cfg, read, gate_in)))
    w = np.asarray(nn.get(params, "score.kernel"), np.float64)
    return float((np.abs(read) @ np.abs(w)).max())


def rewards_atol(params, cfg, ids, mask=None, cache=None, evaluations: int = 2) -> float:
    """f32_atol for the reward head's outputs on `ids` (after `cache`'s prefix, if given)."""
    length = np.asarray(ids).shape[-1] + (0 if cache is None else cache.positions.shape[-1])
    return f32_atol(reward_scale(params, cfg, ids, mask, cache), forward_terms(cfg, length), evaluations)


def reward_scale_bound(params, cfg) -> float:
    """An upper bound on reward_scale over every input (a plain score head), for comparing results whose
    inputs a test does not rebuild (CSV files of two runs): the final norm's output is g ⊙ r / rms(r)
    (Gemma: (1 + g)), and Σ_i |g_i·w_i|·|r_i| / rms(r) <= sqrt(H)·||g ⊙ w||_2 (Cauchy–Schwarz, with
    ||r||_2 = sqrt(H)·rms(r)). About 2x reward_scale on the test models."""
    if cfg.head is not None:
        raise ValueError("reward_scale_bound covers plain score heads; use rewards_atol for a gated head")
    g = np.asarray(nn.get(params, "final_norm.scale"), np.float64)
    g = 1.0 + g if cfg.norm_plus_one else g
    w = np.asarray(nn.get(params, "score.kernel"), np.float64)
    return float(math.sqrt(cfg.hidden_size) * np.linalg.norm(g[:, None] * w, axis=0).max())


def any_rewards_atol(params, cfg, length: int, evaluations: int = 2) -> float:
    """f32_atol for the reward of any sequence of at most `length` keys (reward_scale_bound)."""
    return f32_atol(reward_scale_bound(params, cfg), forward_terms(cfg, length), evaluations)


@functools.partial(jax.jit, static_argnames=("cfg",))
def _writes(params, cfg, ids, mask):
    """|embeddings| + Σ_layers |attention write| + |MLP write| at each row's last token, times the final norm's
    frozen scale: the sum of |terms| of x_final ⊙ scale, [B, H]."""
    from rmjax.nn import ops

    m = nn.module(params, cfg)
    out = m(ids=ids, mask=mask, residuals=True)
    rows, at = jax.numpy.arange(ids.shape[0]), nn.last_token_index(mask)
    writes = abs(m.embed.scaled(m.embed(ids))[rows, at]) + (abs(out.attention) + abs(out.mlp)).sum(0)[rows, at]
    final = out.residuals[-1][rows, at]
    return writes * abs(ops.rms_norm_scale(final, m.final_norm.scale[...], cfg.norm_eps, cfg.norm_plus_one))


def contributions_atol(params, cfg, sequences: list[list[int]], evaluations: int = 2) -> float:
    """f32_atol for the reward lens's direct contributions (each write through the frozen final norm and a
    linear head) and for their sum against the reward: the residual stream is the sum of the embeddings and
    every layer's writes, so S = Σ_i |w_i|·scale_i·(|embeddings_i| + Σ_layers |writes_i|), which bounds each
    contribution's and their sum's |terms| (a reward's S can be smaller: the writes cancel)."""
    if cfg.head is not None:
        raise ValueError("contributions_atol covers plain score heads")
    width = max(map(len, sequences))
    ids = np.zeros((len(sequences), width), np.int32)
    mask = np.zeros(ids.shape, bool)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)], mask[row, : len(seq)] = seq, True
    terms = np.asarray(_writes(params, cfg, ids, mask), np.float64)
    w = np.abs(np.asarray(nn.get(params, "score.kernel"), np.float64))
    return f32_atol(float((terms @ w).max()), forward_terms(cfg, width) + 2 * cfg.num_layers + 1, evaluations)


def grad_rel_error(cfg, length: int, count: int) -> float:
    """Rounding error of a weight's gradient relative to the largest element of that gradient: the backward
    pass is a second chain of inner products as long as the forward (2N in all), and a weight's gradient
    sums `count` contributions (one per token), whose |terms| add up to about sqrt(count) times the sum's
    magnitude when their signs are random: 2·sqrt(2N)·u·sqrt(count)."""
    return 2 * math.sqrt(2 * forward_terms(cfg, length)) * U32 * math.sqrt(count)


def grad_atol(grad, cfg, length: int, count: int) -> float:
    """f32 tolerance for a weight's gradient computed two ways (PyTorch vs JAX): grad_rel_error · max|grad|."""
    return grad_rel_error(cfg, length, count) * float(np.abs(np.asarray(grad)).max())


def adam_atol(lr: float, steps: int, rel_grad_error: float) -> float:
    """How far two Adam runs' parameters drift apart when their gradients differ by rounding (a mesh's
    partial sums vs one device): a step lr·m̂/(sqrt(v̂) + eps) sees the gradient only through m̂/sqrt(v̂),
    which a relative gradient error r moves by at most about 2r, so `steps` steps move a parameter by at
    most 2·steps·lr·r. A bug (other rows, a gradient left un-reduced) moves a step by O(lr)."""
    return 2 * steps * lr * rel_grad_error


def bt_loss_atol(params, cfg, length: int, head_drift: float) -> float:
    """Bradley–Terry loss softplus(r_rejected - r_chosen) of two training runs: it moves by at most the two
    rewards' changes, each rounding (any_rewards_atol) plus the drift of the trained weights. The score
    weights each within `head_drift` (adam_atol), with independent signs, move r by about ||h||_2·head_drift,
    and ||h||_2 <= sqrt(H)·max|g| after the final norm; a trained last layer reaches h through the final
    norm, which removes its scale, and is counted as a second term of that size."""
    g = np.asarray(nn.get(params, "final_norm.scale"), np.float64)
    g = 1.0 + g if cfg.norm_plus_one else g
    drift = 2 * math.sqrt(cfg.hidden_size) * float(np.abs(g).max()) * head_drift
    return 2 * (any_rewards_atol(params, cfg, length) + drift)


def logits_atol(params, cfg, ids, mask=None, evaluations: int = 2) -> float:
    """f32_atol for LM logits at every real position: S = max over positions and vocab of Σ_i |h_i·e_vi|
    (the final soft cap's slope is at most 1)."""
    ids = np.asarray(ids, np.int32)
    mask = np.ones(ids.shape, bool) if mask is None else np.asarray(mask, bool)
    hidden = np.abs(np.asarray(_hidden(params, cfg, ids, mask)[0], np.float32))[mask]
    flat = nn.flat(params)
    table = flat["lm_head.kernel"] if "lm_head.kernel" in flat else flat["embed.embedding"].T
    scale = float((hidden @ np.abs(np.asarray(table, np.float32))).max())  # (a scale: float32 is plenty)
    return f32_atol(scale, forward_terms(cfg, ids.shape[-1]) + cfg.hidden_size, evaluations)


def logprobs_atol(params, cfg, ids, mask=None, evaluations: int = 2) -> float:
    """For log-softmax(logits): logit_v - logsumexp(logits) moves by at most twice the largest logit error."""
    return 2 * logits_atol(params, cfg, ids, mask, evaluations)

