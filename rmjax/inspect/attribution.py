"""Which input tokens the reward rests on: gradient × input and integrated gradients with respect to the input
embeddings (the raw rows; Gemma's scale is applied inside the forward), per token of prompt and response.

IG integrates dR/dα along the straight path x(α) = baseline + α·(x − baseline) (every position's embedding set
to the pad token's row, or to zero; the template's special tokens stay as they are). `completeness_gap` is
sum(IG) − (R(x) − R(baseline)).

Adaptive quadrature. On the real models R(α) is smooth but has narrow cliffs: elo-rm-smollm2-135m, 'love' under
'greatest', falls from −2.1 to −9.8 between α = 0.276 and 0.2803 and is back at −5.6 by 0.287, with dR/dα down
to −6000 (the gradients agree with finite differences of R there; no jump, no NaN). At such a cliff the last
residual at the reward position loses most of its norm (~3500 → ~800) and turns, and the final RMSNorm passes
only its direction to the score head. The embeddings are not the cause: along the path no position's embedding
falls below half its norm. A cliff 0.003 wide falls between the steps of any uniform rule (midpoints: 387% gap
at 64 steps, 121% at 128, 470% at 256 with the sign flipped, 104% at 512; Simpson on 1025 points: 63%).

So the path is cut into Simpson panels [a, b] with nodes a, (a+b)/2, b. Every forward gives R with the gradient,
so each panel knows its own error e = Simpson(dR/dα) − (R(b) − R(a)), and the gap is Σe. The panels with the
largest |e| are bisected, two new nodes each, in fixed-shape batches (one compilation), until the errors summed
within each starting panel add up, in absolute value, to at most `tolerance`·|R(x) − R(baseline)|, or until
`max_evaluations` gradient evaluations are spent (integrate_path). R's float32 rounding on a cliff (~0.003 per
node) is why the errors are summed per starting panel: it telescopes away inside one, and panels are not split
below MIN_PANEL. The per-token IG are the same panel weights applied to each token's gradient × (x − baseline),
so they sum to the quadrature exactly. A feature with no net change inside a panel stays unseen; the uniform
start (`steps`) keeps panels narrow (per-token IG at 64 steps agree with a 0.5%-tolerance run within 0.7% of
the largest; at 16 steps only within 11%).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from rmjax import nn
from rmjax.compiled import PARAMS, REPLICATED, Compiled, compiled, declared_params, rows_of
from rmjax.config import ModelConfig
from rmjax.errors import UsageError
from rmjax.model import Model
from rmjax.parallel import batching
from rmjax.parallel.distributed import replicated, to_host

# The pad token's row is the default: from the zero embedding the first RMSNorm (scale-invariant but for its
# eps) keeps the reward nearly constant along the path except at α ≈ 0, where it jumps; no step count resolves
# that in float32 (tiny models: 92–173% completeness gap at 64 steps, worse at 256; the pad baseline: < 0.01%).
BASELINES = ("pad", "zero")
TOLERANCE = 0.05  # relative completeness gap the adaptive quadrature refines to
MAX_EVALUATIONS = 1024  # gradient evaluations (forward + backward of one conversation) at most per attribution
# Panels are not split below this width: there the reward's float32 rounding (elo-rm-smollm2-135m: ~0.003 on a
# cliff with slope 6000) outweighs what a split could gain. 2^-16 is 1024 times finer than 64 steps, and nodes on
# a power-of-two grid are exact in float32.
MIN_PANEL = 2.0**-16


def check_batch_size(batch_size: int) -> None:
    """Each call evaluates `batch_size` path points, padded to that many rows: more than one attribution ever
    evaluates is only memory. Refused before anything loads by the inspect job and by its plan (rmjax.plan.spec)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise UsageError(f"--batch_size={batch_size}: must be an integer >= 1.")
    if batch_size > MAX_EVALUATIONS:
        raise UsageError(f"--batch_size={batch_size} is more than the {MAX_EVALUATIONS} path points one attribution "
                         f"evaluates at most; use --batch_size={MAX_EVALUATIONS} or less.")


@dataclasses.dataclass
class Attribution:
    ids: list[int]
    grad_x_input: np.ndarray  # [T]
    integrated_gradients: np.ndarray  # [T]
    reward: float
    baseline_reward: float
    evaluations: int = 0  # gradient evaluations spent on the path (α = 0 and 1 included)
    tolerance: float = TOLERANCE
    alphas: np.ndarray | None = None  # the path's nodes, sorted
    path_rewards: np.ndarray | None = None  # R at each node
    path_slopes: np.ndarray | None = None  # dR/dα at each node

    @property
    def completeness_gap(self) -> float:
        return float(self.integrated_gradients.sum() - (self.reward - self.baseline_reward))

    @property
    def relative_gap(self) -> float:
        return abs(self.completeness_gap) / max(abs(self.reward - self.baseline_reward), 1e-12)

    @property
    def converged(self) -> bool:
        """Whether the IG add up to the reward difference within `tolerance` (False for NaN)."""
        return bool(self.relative_gap <= self.tolerance)


LENGTH_BUCKET = 8  # conversations are right-padded to a multiple of this: one compilation serves many lengths


def gradients_call(cfg: ModelConfig, mesh, batch_size: int, column: int = 0) -> Compiled:
    """The compiled path step: (params, ids [1, T], mask, embeddings at `batch_size` path points [B, T, H]) ->
    (rewards [B], their gradients [B, T, H]), the points over `data` when it divides them."""
    return compiled(_rewards_and_grads, cfg, mesh, (PARAMS, REPLICATED, REPLICATED, rows_of(batch_size, 3, mesh)),
                    (rows_of(batch_size, 1, mesh), rows_of(batch_size, 3, mesh)), column=column)


def _rewards_and_grads(cfg: ModelConfig, params, ids: jax.Array, mask: jax.Array, embeds: jax.Array, *, column: int):
    """Reward output `column` and its gradient w.r.t. the embedding rows, for each row of embeds [S, T, H]
    (right padding past `mask` is causal-invisible to the real tokens and gets zero gradient)."""
    model = nn.module(params, cfg)

    def reward(rows):
        hidden = model(embeds=rows[None], mask=mask).hidden
        return model.rewards_from(ids, mask, hidden)[0, column]

    return jax.vmap(jax.value_and_grad(reward))(embeds)


def pad_baseline_id(tokenizer) -> int:
    """The pad token whose row --baseline=pad puts at every position (inspect refuses its absence before loading)."""
    pad = tokenizer.pad_token_id if tokenizer is not None else None
    if pad is None:
        raise UsageError("--baseline=pad: this tokenizer has no pad token; use --baseline=zero.")
    return pad


def attribute(model: Model, ids: list[int], *, steps: int = 64, baseline: str = "pad", batch_size: int = 16,
              column: int | None = None, keep_special: bool = True, tolerance: float = TOLERANCE,
              max_evaluations: int = MAX_EVALUATIONS, history: list | None = None) -> Attribution:
    """Gradient × input and integrated gradients of one conversation's reward (token ids). The path starts as
    ceil(steps / 2) Simpson panels (steps + 1 nodes, α = 0 and 1 included) and is refined where it does not add
    up (module docstring, integrate_path) until the relative completeness gap is within `tolerance` (summed per
    starting panel) or `max_evaluations` gradient evaluations are spent (`converged` says which); with
    max_evaluations ≤ steps + 1 it is plain composite Simpson. `history`: integrate_path's."""
    if baseline not in BASELINES:
        raise UsageError(f"--baseline={baseline}: must be one of {', '.join(BASELINES)}.")
    check_batch_size(batch_size)
    column = model.output_column if column is None else column
    table = nn.get(model.params, "embed.embedding")
    x = table[jnp.asarray(ids)].astype(jnp.float32)  # [T, H]
    if baseline == "zero":
        base = jnp.zeros_like(x)
    else:
        pad = pad_baseline_id(model.tokenizer)
        base = jnp.broadcast_to(table[pad].astype(jnp.float32), x.shape)
    if keep_special and model.tokenizer is not None:
        # The template's special tokens (BOS, turn markers) stay as they are on the whole path: real models park
        # massive activations on them, and interpolating them makes the path integral diverge.
        special = np.isin(np.asarray(ids), list(getattr(model.tokenizer, "all_special_ids", ())))
        base = jnp.where(jnp.asarray(special)[:, None], x, base)
    t = len(ids)
    width = batching.bucket(t, LENGTH_BUCKET)
    ids_arr, mask = replicated(batching.pad_rows([ids], width), model.mesh)
    delta = np.asarray(x - base, np.float64)
    grad_x = None
    split = rows_of(batch_size, 1, model.mesh) != REPLICATED  # the path's points over `data` when it divides them
    gradients = gradients_call(model.config, model.mesh, batch_size, column)
    params, place = declared_params(model), batching.place if split else replicated

    def evaluate(alphas: list[float]) -> tuple[np.ndarray, np.ndarray]:
        """R and per-token gradient × (x − baseline) at each α, in batches of batch_size rows (one shape: one
        compilation)."""
        nonlocal grad_x
        rewards, contributions = [], []
        for start in range(0, len(alphas), batch_size):
            part = alphas[start : start + batch_size]
            a = jnp.asarray(part, jnp.float32)
            rows = base[None] + a[:, None, None] * (x - base)[None]
            # the path's points in the model's dtype: a bfloat16 model reads them rounded, as its embeddings are
            padded = jnp.zeros((batch_size, width, x.shape[1]), table.dtype).at[: len(rows), :t].set(
                rows.astype(table.dtype))
            r, g = gradients(params, ids_arr, mask, place(padded, model.mesh))
            g = to_host(g)[: len(part), :t].astype(np.float64)
            rewards.append(to_host(r)[: len(part)].astype(np.float64))
            contributions.append((g * delta).sum(-1))
            if 1.0 in part:
                grad_x = g[part.index(1.0)]
        return np.concatenate(rewards), np.concatenate(contributions)

    path = integrate_path(evaluate, steps=steps, tolerance=tolerance, max_evaluations=max_evaluations,
                          per_round=batch_size, history=history)
    return Attribution(list(ids), (np.asarray(x, np.float64) * grad_x).sum(-1), path.integral, path.end_value,
                       path.start_value, len(path.alphas), tolerance, path.alphas, path.values, path.slopes)


@dataclasses.dataclass
class PathIntegral:
    """A path integral of f' over α in [0, 1] from adaptive Simpson panels: the nodes, f and f' (summed over the
    parts) at each, and the integral of each part of f' (the same node weights applied to each part)."""

    alphas: np.ndarray  # [N] sorted, 0 and 1 included
    values: np.ndarray  # [N] f(α)
    slopes: np.ndarray  # [N] Σ_parts f'(α)
    integral: np.ndarray  # [P] per part
    panel_errors: np.ndarray  # [panels] Simpson(f') − (f(b) − f(a)) per panel
    panels: np.ndarray  # [panels, 3] each panel's α = a, (a + b) / 2, b

    @property
    def start_value(self) -> float:
        return float(self.values[0])

    @property
    def end_value(self) -> float:
        return float(self.values[-1])


def first_points(steps: int) -> int:
    """The path's first grid: ceil(steps / 2) Simpson panels (at least one), so an odd --steps takes steps + 2."""
    return 2 * max(1, -(-steps // 2)) + 1


def integrate_path(evaluate, *, steps: int, tolerance: float, max_evaluations: int, per_round: int,
                   history: list | None = None) -> PathIntegral:
    """∫₀¹ f'(α) dα by parts, where evaluate(alphas: list[float]) -> (f [n], f' by part [n, P]) (f' summed over the
    parts is df/dα). Starts from ceil(steps / 2) Simpson panels, then bisects the panels with the largest error
    e = Simpson(f') − (f(b) − f(a)), `per_round` // 2 panels per call (at least one), none narrower than
    MIN_PANEL, until Σ_g |Σ_{panels in g} e| ≤ tolerance·|f(1) − f(0)| over the starting panels g, or
    `max_evaluations` nodes are spent, or no panel a split may refine carries an error, or a round would add no
    node, or an error is not finite. The gap itself is |Σe|. Summing the errors within a starting panel first
    lets f's float32 rounding at the nodes inside it telescope away (on a cliff it is ~0.003 per node, so Σ|e|
    over thousands of fine panels would only measure that), while an unresolved feature in one starting panel
    cannot hide behind an opposite one in another.
    `history` (a list) gets (nodes, |Σe| / |Δ|, Σ_g |Σ_g e| / |Δ|) after each round."""
    n = (first_points(steps) - 1) // 2
    grid = [i / (2 * n) for i in range(2 * n + 1)]
    nodes: dict[float, tuple[float, np.ndarray]] = {}  # α -> (f, f' by part)

    def add(alphas: list[float]) -> None:
        values, parts = evaluate(alphas)
        nodes.update({a: (float(v), np.asarray(p, np.float64)) for a, v, p in zip(alphas, values, parts, strict=True)})

    add([1.0, 0.0, *grid[1:-1]])  # α = 1 first (attribute's gradient × input is in the first batch)
    panels = [(grid[2 * i], grid[2 * i + 1], grid[2 * i + 2]) for i in range(n)]
    group = list(range(n))  # the starting panel each panel lies in

    def errors() -> np.ndarray:
        return np.asarray([(b - a) / 6 * (nodes[a][1].sum() + 4 * nodes[m][1].sum() + nodes[b][1].sum())
                           - (nodes[b][0] - nodes[a][0]) for a, m, b in panels])

    scale = max(abs(nodes[1.0][0] - nodes[0.0][0]), 1e-12)
    while True:
        err = errors()
        grouped = np.abs(np.bincount(group, weights=err, minlength=n)).sum() if np.isfinite(err).all() else np.inf
        if history is not None:
            history.append((len(nodes), abs(err.sum()) / scale, grouped / scale))
        if not np.isfinite(err).all() or grouped <= tolerance * scale:
            break
        # A panel's |e| counts as much as its starting panel's errors do not cancel: where they do, they are f's
        # rounding at the nodes, which a split does not remove. A panel that carries none is not split (a jump
        # narrower than MIN_PANEL left the budget to panels with no error).
        within = np.bincount(group, weights=np.abs(err), minlength=n)
        real = np.abs(np.bincount(group, weights=err, minlength=n)) / np.maximum(within, 1e-300)
        splittable = np.asarray([b - a > MIN_PANEL for a, _, b in panels])
        weight = np.where(splittable, np.abs(err) * real[group], 0.0)
        room = min((max_evaluations - len(nodes)) // 2, max(1, per_round // 2), int((weight > 0).sum()))
        if room < 1:
            break
        order = np.argsort(-weight, kind="stable")
        split, new, refined, regroup = {int(i) for i in order[:room]}, [], [], []
        for i, (a, m, b) in enumerate(panels):
            if i in split:
                left, right = (a + m) / 2, (m + b) / 2
                new += [left, right]
                refined += [(a, left, m), (m, right, b)]
                regroup += [group[i], group[i]]
            else:
                refined.append((a, m, b))
                regroup.append(group[i])
        if all(alpha in nodes for alpha in new):
            break  # float64 has no point between these panels' ends (only MIN_PANEL keeps splits from here)
        add(new)
        panels, group = refined, regroup
    integral = sum((b - a) / 6 * (nodes[a][1] + 4 * nodes[m][1] + nodes[b][1]) for a, m, b in panels)
    alphas = np.asarray(sorted(nodes))
    return PathIntegral(alphas, np.asarray([nodes[a][0] for a in alphas]),
                        np.asarray([nodes[a][1].sum() for a in alphas]), np.asarray(integral, np.float64), err,
                        np.asarray(panels, np.float64))
