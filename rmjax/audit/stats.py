"""The audit's statistics: paired effects over items, percentile-bootstrap CIs, sign-flip p-values, Holm's
correction and each row's null (what length alone, or chance alone, would give).

Input is the items frame of audit_items.csv (columns battery, axis, item, group, text, reward, prompt; one row per
scored variant). The item is the unit of independence: a group's variants are averaged inside the item first, so
every n below counts items. Response length is `len(text)` in characters, so every number here can be recomputed
from audit_items.csv alone. Nothing reads or writes files and nothing imports jax.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import pandas as pd

from rmjax.audit import AXIS_MEAN, Contrast

ITEM_COLUMNS = ("battery", "axis", "item", "group", "text", "reward", "prompt")
AUDIT_COLUMNS = ["battery", "axis", "contrast", "n_items", "effect", "ci_low", "ci_high", "p", "p_holm",
                 "null_effect"]
COMPARE_COLUMNS = ["battery", "axis", "contrast", "model_a", "model_b", "n_items", "effect_a", "effect_b",
                   "difference", "ci_low", "ci_high", "p", "p_holm"]
NULLS = ("length", "shuffled")
_CHUNK = 1 << 20  # elements per random block: bounds memory for many items without changing results per seed


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
    """Per item with every group the contrast needs (AXIS_MEAN: every group of the axis), d_i = mean over x of the
    group means minus mean over y; returns (d of rewards, d of lengths in chars, item ids), items sorted."""
    return _differences(_normalised(items), contrast)


def bootstrap_ci(d: np.ndarray, n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap of mean(d): items resampled with replacement (the item is the independent unit); the
    (1 - level)/2 and (1 + level)/2 quantiles (numpy's linear) of the resample means."""
    d = np.asarray(d, np.float64)
    n = len(d)
    if n == 0 or n_boot < 1:
        raise ValueError(f"bootstrap_ci needs at least one value and one resample (got {n}, n_boot={n_boot})")
    rng = np.random.default_rng(seed)
    means = np.empty(n_boot)
    chunk = max(1, _CHUNK // n)
    for start in range(0, n_boot, chunk):
        k = min(chunk, n_boot - start)
        means[start:start + k] = d[rng.integers(0, n, size=(k, n))].mean(axis=1)
    alpha = (1.0 - level) / 2.0
    low, high = np.quantile(means, [alpha, 1.0 - alpha])
    return float(low), float(high)


def sign_flip_p(d: np.ndarray, n_perm: int = 10000, seed: int = 0) -> float:
    """Two-sided paired permutation p of mean(d) == 0: under the null each item's difference is as likely to have
    either sign. Every sign vector when 2**n <= n_perm (exact), else p = (1 + #{|mean*| >= |mean|}) / (1 + n_perm)
    over random flips. A relative tolerance (1e-9 of mean|d|) keeps rounding from splitting ties."""
    d = np.asarray(d, np.float64)
    n = len(d)
    if n == 0 or not np.any(d):
        return 1.0
    scale = np.abs(d).mean()
    threshold = abs(d.sum()) / n - 1e-9 * scale
    exact = 2**n <= n_perm
    total = 2**n if exact else n_perm
    rng = np.random.default_rng(seed)
    count = 0
    chunk = max(1, _CHUNK // n)
    for start in range(0, total, chunk):
        k = min(chunk, total - start)
        if exact:  # the bits of start .. start + k - 1 are every sign vector once
            bits = (np.arange(start, start + k)[:, None] >> np.arange(n)) & 1
        else:
            bits = rng.integers(0, 2, size=(k, n))
        count += int(np.sum(np.abs((1.0 - 2.0 * bits) @ d) / n >= threshold))
    return float(count / total) if exact else float((1 + count) / (1 + n_perm))


def holm(p: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjusted p-values in the input order: the i-th smallest gets max over j <= i of
    min(1, (m - j + 1) p_(j)), so the family-wise error is controlled over every row at once."""
    p = np.asarray(p, np.float64)
    if p.ndim != 1 or np.isnan(p).any() or (p < 0).any() or (p > 1).any():
        raise ValueError("holm needs a flat sequence of p-values in [0, 1]")
    m = len(p)
    order = np.argsort(p, kind="stable")
    adjusted = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    out = np.empty(m)
    out[order] = adjusted
    return out


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


def _length_null(frame: pd.DataFrame, contrast: Contrast, length: np.ndarray) -> float:
    mean_length = float(length.mean()) if len(length) else float("nan")
    if mean_length == 0:  # the responses never differ in length (framing, identity in the prompt)
        return 0.0
    slope = _filler_slope(frame)
    if slope is None or not np.isfinite(mean_length):
        raise ValueError(f"the length-only null of {contrast.battery}/{contrast.axis} {contrast.name!r} needs the "
                         "length battery's padded_neutral and concise renderings in the same audit")
    return slope * mean_length


def length_null(items: pd.DataFrame, contrast: Contrast) -> float:
    """The effect the contrast would show from its length difference alone: `filler_slope` times the mean over
    items of the contrast's length difference (0 when lengths never differ). Compare the effect with it."""
    frame = _normalised(items)
    _, length, _ = _differences(frame, contrast)
    return _length_null(frame, contrast, length)


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


def _checked_ci(d: np.ndarray, effect: float, n_boot: int, seed: int, what: str) -> tuple[float, float]:
    low, high = bootstrap_ci(d, n_boot=n_boot, seed=seed)
    tol = 1e-9 * float(np.abs(d).max())
    if not low - tol <= effect <= high + tol:
        raise RuntimeError(f"{what}: bootstrap CI [{low}, {high}] does not contain the effect {effect}")
    return low, high


def _too_few(contrast: Contrast, n: int, where: str = "") -> ValueError:
    return ValueError(f"contrast {contrast.name!r} of {contrast.battery}/{contrast.axis} has {n} item(s) with every "
                      f"group it needs{where}; a paired test needs at least 2")


def audit_table(items: pd.DataFrame, contrasts: Sequence[Contrast], n_boot: int = 2000, n_perm: int = 10000,
                seed: int = 0) -> pd.DataFrame:
    """audit.csv: one row per contrast in the given order (AUDIT_COLUMNS); p_holm is Holm over every row. Each row
    draws from its own streams seeded by (seed, row index), so a row does not change when others are added after
    it, and the same seed gives the same table."""
    for c in contrasts:
        if c.null not in NULLS:
            raise ValueError(f"contrast {c.name!r} of {c.battery}/{c.axis} has null {c.null!r}; known: {NULLS}")
    frame = _normalised(items)
    rows = []
    for index, c in enumerate(contrasts):
        d, length, _ = _differences(frame, c)
        if len(d) < 2:
            raise _too_few(c, len(d))
        boot_seed, perm_seed, null_seed = _row_seeds(seed, index)
        effect = float(d.mean())
        low, high = _checked_ci(d, effect, n_boot, boot_seed, f"{c.battery}/{c.axis} {c.name}")
        if c.null == "length":
            null = _length_null(frame, c, length)
        else:
            null = shuffled_null(frame, c, seed=null_seed)
        rows.append({"battery": c.battery, "axis": c.axis, "contrast": c.name, "n_items": len(d), "effect": effect,
                     "ci_low": low, "ci_high": high, "p": sign_flip_p(d, n_perm=n_perm, seed=perm_seed),
                     "null_effect": null})
    table = pd.DataFrame(rows, columns=[k for k in AUDIT_COLUMNS if k != "p_holm"])
    table.insert(AUDIT_COLUMNS.index("p_holm"), "p_holm", holm(table["p"].to_numpy()))
    return table[AUDIT_COLUMNS]


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


def compare_models(items_by_model: dict[str, pd.DataFrame], contrasts: Sequence[Contrast], n_boot: int = 2000,
                   n_perm: int = 10000, seed: int = 0) -> pd.DataFrame:
    """Audits side by side: for every contrast, then every pair (A, B) of models in the given order, the paired
    difference d_i^A - d_i^B over the items both have (which must hold identical variants): its mean, percentile
    CI and sign-flip p; p_holm is Holm over every row (COMPARE_COLUMNS)."""
    frames = {name: _normalised(items) for name, items in items_by_model.items()}
    cache: dict[tuple[str, Contrast], tuple[np.ndarray, list[str]]] = {}
    out = []
    for c in contrasts:
        for name in frames:
            d, _, ids = _differences(frames[name], c)
            cache[name, c] = d, ids
        for a, b in itertools.combinations(frames, 2):
            (da, ids_a), (db, ids_b) = cache[a, c], cache[b, c]
            common = sorted(set(ids_a) & set(ids_b))
            if len(common) < 2:
                raise _too_few(c, len(common), f" in both {a!r} and {b!r}")
            _check_same(a, b, _item_rows(frames[a], c.battery, c.axis), _item_rows(frames[b], c.battery, c.axis),
                        common, c.battery, c.axis)
            pos_a, pos_b = {i: k for k, i in enumerate(ids_a)}, {i: k for k, i in enumerate(ids_b)}
            ea, eb = da[[pos_a[i] for i in common]], db[[pos_b[i] for i in common]]
            e = ea - eb
            boot_seed, perm_seed, _ = _row_seeds(seed, len(out))
            difference = float(e.mean())
            low, high = _checked_ci(e, difference, n_boot, boot_seed, f"{c.battery}/{c.axis} {c.name} {a} - {b}")
            out.append({"battery": c.battery, "axis": c.axis, "contrast": c.name, "model_a": a, "model_b": b,
                        "n_items": len(e), "effect_a": float(ea.mean()), "effect_b": float(eb.mean()),
                        "difference": difference, "ci_low": low, "ci_high": high,
                        "p": sign_flip_p(e, n_perm=n_perm, seed=perm_seed)})
    table = pd.DataFrame(out, columns=[k for k in COMPARE_COLUMNS if k != "p_holm"])
    table["p_holm"] = holm(table["p"].to_numpy())
    return table[COMPARE_COLUMNS]
