"""The audit's statistics: paired effects over items, percentile-bootstrap CIs, sign-flip p-values, Holm's
correction and each row's null (what length alone, or chance alone, would give).

Input is the items frame of audit_items.csv (columns battery, axis, item, group, text, reward, prompt; one row per
scored variant). The item is the unit of independence: a group's variants are averaged inside the item first, so
every n below counts items. Response length is `len(text)` in characters, so every number here can be recomputed
from audit_items.csv alone. Nothing reads or writes files and nothing imports jax.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

import numpy as np
import pandas as pd

from rmjax.audit import AXIS_MEAN, Contrast
from rmjax.audit.resampling import bootstrap_ci, holm, label_permutation_p, sign_flip_p

ITEM_COLUMNS = ("battery", "axis", "item", "group", "text", "reward", "prompt")
AUDIT_COLUMNS = ["battery", "axis", "contrast", "n_items", "effect", "ci_low", "ci_high", "p", "p_holm",
                 "null_effect"]
COMPARE_COLUMNS = ["battery", "axis", "contrast", "model_a", "model_b", "n_items", "effect_a", "effect_b",
                   "scale_a", "scale_b", "difference_sd", "ci_low", "ci_high", "p", "p_holm"]
NULLS = ("length", "shuffled")
ALPHA = 0.05  # a row survives Holm's correction at p_holm < ALPHA
REWARD_EPS = float(np.finfo(np.float32).eps)  # rewards' precision: scoring returns float32
# compare_models refuses a model whose float32 rounding allowance (64 ulps of its largest |reward|, generous) is
# larger, in its SDs: a line drawn by judgement, far from real RMs (~1e-4 SD), not a bound
MAX_ROUNDOFF_SD = 0.05
__all__ = ["bootstrap_ci", "holm", "label_permutation_p", "sign_flip_p"]  # the tests' one import point


def _normalised(items: pd.DataFrame) -> pd.DataFrame:
    """Keys and texts as strings (a CSV may read an item id as a number, an empty text as NaN), rewards as finite
    floats, plus `length`: the same frame whether it came from the job or from audit_items.csv."""
    missing = [c for c in ITEM_COLUMNS if c not in items.columns]
    if missing:
        raise ValueError(f"items frame lacks column(s) {missing}; it needs {list(ITEM_COLUMNS)}")
    out = pd.DataFrame({k: items[k].astype(str) for k in ("battery", "axis", "item", "group")})
    for k in ("text", "prompt"):
        out[k] = items[k].fillna("").astype(str)
    out["reward"] = items["reward"].to_numpy(np.float64)
    if not np.isfinite(out["reward"]).all():
        raise ValueError("items frame holds non-finite rewards")
    out["length"] = out["text"].str.len().astype(np.float64)
    return out


def _axis_rows(frame: pd.DataFrame, battery: str, axis: str) -> pd.DataFrame:
    return frame[(frame["battery"] == battery) & (frame["axis"] == axis)]


def _means(rows: pd.DataFrame, value: str) -> pd.DataFrame:
    if rows.empty:
        return pd.DataFrame(index=pd.Index([], name="item"), columns=pd.Index([], name="group"), dtype=np.float64)
    return rows.groupby(["item", "group"])[value].mean().unstack("group")


def group_means(items: pd.DataFrame, battery: str, axis: str, value: str = "reward") -> pd.DataFrame:
    """Items x groups of (battery, axis): the mean of `value` ("reward" or "length", chars of the response) over
    each group's variants within the item; NaN where an item lacks the group. Index and columns sorted."""
    if value not in ("reward", "length"):
        raise ValueError(f"value must be 'reward' or 'length', not {value!r}")
    return _means(_axis_rows(_normalised(items), battery, axis), value)


def _expand(groups: Sequence[str], axis_groups: Sequence[str]) -> list[str]:
    return list(axis_groups) if tuple(groups) == (AXIS_MEAN,) else [str(g) for g in groups]


def _contrast_groups(contrast: Contrast, axis_groups: Sequence[str]) -> tuple[list[str], list[str], list[str]]:
    """(x, y, groups an item needs): an AXIS_MEAN side needs every group of the axis."""
    x, y = _expand(contrast.x, axis_groups), _expand(contrast.y, axis_groups)
    return x, y, sorted(set(x) | set(y))


def _differences(frame: pd.DataFrame, contrast: Contrast) -> tuple[np.ndarray, np.ndarray, list[str]]:
    rows = _axis_rows(frame, contrast.battery, contrast.axis)
    reward, length = _means(rows, "reward"), _means(rows, "length")
    x, y, needed = _contrast_groups(contrast, list(reward.columns))
    if not needed or any(g not in reward.columns for g in needed):
        return np.zeros(0), np.zeros(0), []
    keep = reward[needed].notna().all(axis=1).to_numpy()
    reward, length = reward[keep], length[keep]

    def diff(m: pd.DataFrame) -> np.ndarray:
        return m[x].to_numpy(np.float64).mean(axis=1) - m[y].to_numpy(np.float64).mean(axis=1)

    return diff(reward), diff(length), [str(i) for i in reward.index]


def item_differences(items: pd.DataFrame, contrast: Contrast) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Per item of the contrast's (first) axis with every group the contrast needs (AXIS_MEAN: every group of the
    axis), d_i = mean over x of the group means minus mean over y; returns (d of rewards, d of lengths in chars,
    item ids), items sorted."""
    return _differences(_normalised(items), contrast)


def _samples(frame: pd.DataFrame, contrast: Contrast) -> list[tuple[np.ndarray, np.ndarray, list[str]]]:
    """The contrast's per-item differences on each of its axes: one set (paired), or two (an interaction)."""
    return [_differences(frame, dataclasses.replace(contrast, axis=axis, minus_axis="")) for axis in contrast.axes()]


def _gap(values: Sequence[np.ndarray]) -> float:
    """A row's effect from its sets of per-item values: the mean, or the first set's mean minus the second's."""
    return float(values[0].mean() - (values[1].mean() if len(values) > 1 else 0.0))


# The length-only predictor's slope: reward per character of content-free filler, the length battery's padded
# rendering (the concise answer plus filler sentences) against the concise one.
FILLER = ("length", "renderings", "padded_neutral", "concise")


def _filler_slope(frame: pd.DataFrame) -> float | None:
    battery, axis, padded, concise = FILLER
    rows = _axis_rows(frame, battery, axis)
    reward, length = _means(rows, "reward"), _means(rows, "length")
    if padded not in reward.columns or concise not in reward.columns:
        return None
    keep = reward[[padded, concise]].notna().all(axis=1).to_numpy()
    added = float((length[padded] - length[concise])[keep].sum())
    gained = float((reward[padded] - reward[concise])[keep].sum())
    return gained / added if added > 0 else None


def filler_slope(items: pd.DataFrame) -> float | None:
    """Reward per character of filler that adds no content (FILLER: Σ over items of the padded-minus-concise reward
    over Σ of the added characters); None without the length battery's two renderings. A slope fitted on the
    contrast's own rows would be its effect divided by its length difference: the filler measures what length
    alone earns, apart from any contrast."""
    return _filler_slope(_normalised(items))


def _length_null(frame: pd.DataFrame, contrast: Contrast, lengths: Sequence[np.ndarray]) -> float:
    mean_length = _gap(lengths) if all(len(x) for x in lengths) else float("nan")
    if all(not np.any(x) for x in lengths):  # the responses never differ in length (framing, identity in the prompt)
        return 0.0
    slope, name = _filler_slope(frame), f"{contrast.battery}/{contrast.row_axis} {contrast.name!r}"
    if slope is None:
        raise ValueError(f"the length-only null of {name} needs the length battery's padded_neutral and concise "
                         "renderings in the same audit")
    if not np.isfinite(mean_length):  # an item set (an interaction's axis) with no complete item
        raise ValueError(f"the length-only null of {name} has a set of items with no complete item: no length "
                         "difference to weigh")
    return slope * mean_length


def length_null(items: pd.DataFrame, contrast: Contrast) -> float:
    """The effect the contrast would show from its length difference alone: `filler_slope` times the mean over
    items of the contrast's length difference (of an interaction: the first axis's mean minus the second's; 0 when
    lengths never differ). Compare the effect with it."""
    frame = _normalised(items)
    return _length_null(frame, contrast, [length for _, length, _ in _samples(frame, contrast)])


def shuffled_null(items: pd.DataFrame, contrast: Contrast, n_shuffle: int = 1000, seed: int = 0,
                  quantile: float = 0.95) -> float:
    """What chance alone gives: group labels permuted at random among each item's variants of the contrast's groups,
    the contrast's effect recomputed, and the `quantile` of |effect| over the shuffles. Compare |effect| with it.

    d_i is linear in the item's rewards with one weight per row (+1/(|x| c_g) for a row of group g in x, -1/(|y| c_g)
    in y, c_g its group's variant count); a shuffle keeps the counts, so it only permutes those weights.
    """
    frame = _normalised(items)
    rows = _axis_rows(frame, contrast.battery, contrast.axis)
    _, _, ids = _differences(frame, contrast)
    if not ids:
        raise ValueError(f"contrast {contrast.name!r} of {contrast.battery}/{contrast.axis} has no complete item")
    x, y, needed = _contrast_groups(contrast, sorted(set(rows["group"])))
    rng = np.random.default_rng(seed)
    total = np.zeros(n_shuffle)
    # labels are shuffled among the contrast's own groups: another group's real effect is not chance
    for _, cell in rows[rows["item"].isin(ids) & rows["group"].isin(needed)].groupby("item"):
        groups = cell["group"].to_numpy()
        counts = cell.groupby("group")["group"].transform("size").to_numpy(np.float64)
        weight = np.array([x.count(g) / len(x) - y.count(g) / len(y) for g in groups]) / counts
        perms = np.argsort(rng.random((n_shuffle, len(groups))), axis=1)
        total += weight[perms] @ cell["reward"].to_numpy(np.float64)
    return float(np.quantile(np.abs(total / len(ids)), quantile))


def _row_seeds(seed: int, row: int) -> list[int]:
    """Independent seeds for one row's bootstrap, sign flips and null, from (seed, row index) alone."""
    return [int(s) for s in np.random.SeedSequence([seed, row]).generate_state(3)]


def _tested(values: Sequence[np.ndarray], n_boot: int, n_perm: int, seeds: Sequence[int], what: str
            ) -> tuple[float, float, float, float]:
    """(effect, ci_low, ci_high, p) of one row from its sets of per-item values: paired (one set: the bootstrap of
    its mean, sign flips) or an interaction (two independent sets: the bootstrap of the difference of their means,
    each resampled within itself, and a permutation of the items' set labels). A CI that misses its effect stops."""
    effect = _gap(values)
    boot_seed, perm_seed = seeds
    if len(values) == 1:
        low, high = bootstrap_ci(values[0], n_boot=n_boot, seed=boot_seed)
        p = sign_flip_p(values[0], n_perm=n_perm, seed=perm_seed)
    else:
        low, high = bootstrap_ci(values[0], n_boot=n_boot, seed=boot_seed, minus=values[1])
        p = label_permutation_p(values[0], values[1], n_perm=n_perm, seed=perm_seed)
    tol = 1e-9 * max(float(np.abs(v).max()) for v in values)
    if not low - tol <= effect <= high + tol:
        raise RuntimeError(f"{what}: bootstrap CI [{low}, {high}] does not contain the effect {effect}")
    return effect, low, high, p


def _too_few(contrast: Contrast, n: int, where: str = "") -> ValueError:
    return ValueError(f"contrast {contrast.name!r} of {contrast.battery}/{contrast.row_axis} has {n} item(s) with "
                      f"every group it needs{where}; a paired test needs at least 2")


def audit_table(items: pd.DataFrame, contrasts: Sequence[Contrast], n_boot: int = 2000, n_perm: int = 10000,
                seed: int = 0) -> pd.DataFrame:
    """audit.csv: one row per contrast in the given order (AUDIT_COLUMNS); p_holm is Holm over every row. Each row
    draws from its own streams seeded by (seed, row index), so a row does not change when others are added after
    it, and the same seed gives the same table. An interaction's n_items counts both of its sets."""
    for c in contrasts:
        if c.null not in NULLS or (c.minus_axis and c.null != "length"):
            raise ValueError(f"contrast {c.name!r} of {c.battery}/{c.row_axis} has null {c.null!r}; known: {NULLS} "
                             "(an interaction: length)")
    frame = _normalised(items)
    rows = []
    for index, c in enumerate(contrasts):
        samples = _samples(frame, c)
        for d, _, _ in samples:
            if len(d) < 2:
                raise _too_few(c, len(d))
        boot_seed, perm_seed, null_seed = _row_seeds(seed, index)
        effect, low, high, p = _tested([d for d, _, _ in samples], n_boot, n_perm, (boot_seed, perm_seed),
                                       f"{c.battery}/{c.row_axis} {c.name}")
        if c.null == "length":
            null = _length_null(frame, c, [length for _, length, _ in samples])
        else:
            null = shuffled_null(frame, c, seed=null_seed)
        rows.append({"battery": c.battery, "axis": c.row_axis, "contrast": c.name,
                     "n_items": sum(len(d) for d, _, _ in samples), "effect": effect, "ci_low": low,
                     "ci_high": high, "p": p, "null_effect": null})
    table = pd.DataFrame(rows, columns=[k for k in AUDIT_COLUMNS if k != "p_holm"])
    table.insert(AUDIT_COLUMNS.index("p_holm"), "p_holm", holm(table["p"].to_numpy()))
    return table[AUDIT_COLUMNS]


def holm_floor(rows: int, n_perm: int, min_items: int) -> float | None:
    """The smallest p_holm a table of `rows` can hold when every row's p comes from `n_perm` random draws: Holm
    multiplies the smallest p by the rows, and a random test's p is at least 1 / (1 + n_perm). None where a row's
    test may be exact instead (its sets hold at least `min_items` items: 2^n <= n_perm sign vectors, or as many
    relabellings, which is more), whose p can be smaller."""
    if 2**min_items <= n_perm:
        return None
    return float(holm([1 / (1 + n_perm)] * rows).min())  # as `holm` computes it from that p


def holm_floor_note(rows: int, n_perm: int, min_items: int, flag: str) -> str | None:
    """One line where no row can survive Holm's correction (the floor is ALPHA or more), naming the `flag` value
    from which one can; None otherwise. Without it a table of strong effects reads "0 survive"."""
    floor = holm_floor(rows, n_perm, min_items)
    if floor is None or floor < ALPHA:
        return None
    need = n_perm + 1
    while (least := holm_floor(rows, need, min_items)) is not None and least >= ALPHA:
        need += 1
    return (f"note: no row can reach p_holm < {ALPHA:g} with {flag}={n_perm}: a random test's p is at least "
            f"1/{n_perm + 1}, and Holm multiplies the smallest by the {rows} rows ({floor:.3g}); give {flag}={need} or "
            "more.")


def _item_rows(frame: pd.DataFrame, battery: str, axis: str) -> dict[str, list[tuple[str, str, str]]]:
    rows = _axis_rows(frame, battery, axis)
    return {item: sorted(zip(cell["group"], cell["text"], cell["prompt"], strict=True))
            for item, cell in rows.groupby("item")}


def _check_same(a: str, b: str, rows_a: dict, rows_b: dict, ids: list[str], battery: str, axis: str) -> None:
    """Paired differences are only meaningful when both models scored the very same conversations."""
    for item in ids:
        ra, rb = rows_a[item], rows_b[item]
        if ra != rb:
            k = next((i for i, (u, v) in enumerate(zip(ra, rb, strict=False)) if u != v), min(len(ra), len(rb)))
            va = ra[k] if k < len(ra) else "no such variant"
            vb = rb[k] if k < len(rb) else "no such variant"
            raise ValueError(f"models {a!r} and {b!r} scored different variants of {battery}/{axis} item {item!r}: "
                             f"(group, text, prompt) {va!r} vs {vb!r}")


def reward_scale(items: pd.DataFrame, batteries: Sequence[str] | None = None) -> float:
    """The SD (ddof 1) of a model's rewards over the conversations of `batteries` (default: all), each (prompt,
    text) once (the identity battery's two name axes share all theirs: counted twice, they weighed double): the
    unit in which two reward models' effects can be compared, since a reward model's reward means the same after any
    positive affine map (the Bradley-Terry loss fixes neither its offset nor, across models, its scale)."""
    frame = _normalised(items)
    if batteries is not None:
        frame = frame[frame["battery"].isin(list(batteries))]
    frame = frame.drop_duplicates(["prompt", "text"])
    scale = float(frame["reward"].std(ddof=1)) if len(frame) > 1 else float("nan")
    if not np.isfinite(scale) or scale <= 0 or frame["reward"].nunique() < 2:  # one value: its SD may round above 0
        raise ValueError(f"the rewards of batteries {batteries} have no spread (SD {scale}): nothing to scale by")
    return scale


def compare_models(items_by_model: dict[str, pd.DataFrame], contrasts: Sequence[Contrast], n_boot: int = 2000,
                   n_perm: int = 10000, seed: int = 0, scales: dict[str, float] | None = None) -> pd.DataFrame:
    """Audits side by side: for every contrast, then every pair (A, B) of models in the given order, the paired
    difference d_i^A / s_A - d_i^B / s_B over the items both have (which must hold identical variants), each model's
    effects in SDs of its rewards over the contrasts' batteries (`reward_scale`, same conversations for every model,
    so the difference is the same after any positive affine map of either model's reward): its mean, percentile CI
    and sign-flip p; p_holm is Holm over every row (COMPARE_COLUMNS). effect_a and effect_b stay in reward units.
    `scales` (each model's reward_scale over the contrasts' batteries) are computed here when not given."""
    frames = {name: _normalised(items) for name, items in items_by_model.items()}
    if scales is None:
        batteries = sorted({c.battery for c in contrasts})
        scales = {name: reward_scale(frame, batteries) for name, frame in frames.items()}
    # An item's d of two models equal up to an affine map is rounding, not 0, and a test would read it as data (p
    # 0.002 for a model against itself + 7). Rewards are float32 (scoring's output, audit_items.csv's 9 digits): a
    # copy mapped in float32 is off by its ulps, not float64's (p 0.009, CIs excluding 0). |d| within 64 float32
    # ulps of the largest standardised reward is 0.
    roundoff = {name: 64 * REWARD_EPS * float(frame["reward"].abs().max()) / scales[name]
                for name, frame in frames.items()}
    # A model whose rewards sit thousands of SDs from 0 (1000 +- 0.003) has an allowance of a large part of an SD:
    # real differences were read as 0 (helper-151: +1.57 SD per item, difference 0, p 1). float32 cannot tell
    # them from rounding there, so the comparison is refused, not written as no difference.
    blunt = {name: value for name, value in roundoff.items() if value > MAX_ROUNDOFF_SD}
    if blunt:
        name, value = next(iter(blunt.items()))
        raise ValueError(f"{name}'s rewards lie up to {float(frames[name]['reward'].abs().max()):.6g} from 0 with an "
                         f"SD of {scales[name]:.3g}: in float32, differences within {value:.2g} SD are rounding at "
                         "that size, so the models cannot be compared (the largest |reward| must be within "
                         f"{MAX_ROUNDOFF_SD / (64 * REWARD_EPS):,.0f} SDs)")
    out = []
    for c in contrasts:
        samples = {name: _samples(frames[name], c) for name in frames}
        for a, b in itertools.combinations(frames, 2):
            values, effects = [], []
            for axis, (da, _, ids_a), (db, _, ids_b) in zip(c.axes(), samples[a], samples[b], strict=True):
                common = sorted(set(ids_a) & set(ids_b))
                if len(common) < 2:
                    raise _too_few(c, len(common), f" in both {a!r} and {b!r}")
                _check_same(a, b, _item_rows(frames[a], c.battery, axis), _item_rows(frames[b], c.battery, axis),
                            common, c.battery, axis)
                pos_a, pos_b = {i: k for k, i in enumerate(ids_a)}, {i: k for k, i in enumerate(ids_b)}
                ea, eb = da[[pos_a[i] for i in common]], db[[pos_b[i] for i in common]]
                d = ea / scales[a] - eb / scales[b]
                values.append(np.where(np.abs(d) <= roundoff[a] + roundoff[b], 0.0, d))
                effects.append((ea, eb))
            boot_seed, perm_seed, _ = _row_seeds(seed, len(out))
            difference, low, high, p = _tested(values, n_boot, n_perm, (boot_seed, perm_seed),
                                               f"{c.battery}/{c.row_axis} {c.name} {a} - {b}")
            out.append({"battery": c.battery, "axis": c.row_axis, "contrast": c.name, "model_a": a, "model_b": b,
                        "n_items": sum(len(v) for v in values), "effect_a": _gap([ea for ea, _ in effects]),
                        "effect_b": _gap([eb for _, eb in effects]), "scale_a": scales[a], "scale_b": scales[b],
                        "difference_sd": difference, "ci_low": low, "ci_high": high, "p": p})
    table = pd.DataFrame(out, columns=[k for k in COMPARE_COLUMNS if k != "p_holm"])
    table["p_holm"] = holm(table["p"].to_numpy())
    return table[COMPARE_COLUMNS]
