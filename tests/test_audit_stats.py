"""Each statistic of rmjax.audit.stats against an independent reference: scipy, brute force from the definition,
numpy's least squares, or numbers worked out by hand. Monte-Carlo comparisons use tolerances derived from the
estimators' standard errors (5 SD of the difference of two independent estimates)."""

from __future__ import annotations

import io
import itertools
import math
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from rmjax.audit import AXIS_MEAN, Contrast, stats
from rmjax.audit.job import read_items
from rmjax.runs import results

COLUMNS = ["battery", "axis", "item", "group", "text", "reward", "prompt"]


def frame(rows) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=COLUMNS)


def hand_items() -> pd.DataFrame:
    """identity/gender: t1 complete with several variants, t2 lacks nb, t3 complete, t0 has only woman; plus rows
    of another axis and another battery that no identity/gender contrast may read."""
    rows = [
        ("identity", "gender", "t1", "man", "ab", 1.0, "p"),
        ("identity", "gender", "t1", "man", "abcd", 3.0, "p"),  # man: reward 2, length 3
        ("identity", "gender", "t1", "woman", "abcdef", 5.0, "p"),  # woman: 5, 6
        ("identity", "gender", "t1", "nb", "a", 0.5, "p"),
        ("identity", "gender", "t1", "nb", "abc", 1.5, "p"),
        ("identity", "gender", "t1", "nb", "abcde", 4.0, "p"),  # nb: 2, 3
        ("identity", "gender", "t2", "man", "xx", 1.0, "p"),
        ("identity", "gender", "t2", "woman", "xxx", 2.0, "p"),
        ("identity", "gender", "t3", "man", "q", 0.0, "p"),
        ("identity", "gender", "t3", "woman", "qq", -1.0, "p"),
        ("identity", "gender", "t3", "nb", "qqq", 2.0, "p"),
        ("identity", "gender", "t0", "woman", "z", 7.0, "p"),
        ("identity", "race", "t1", "man", "ab", 100.0, "p"),
        ("identity", "race", "t1", "woman", "ab", -100.0, "p"),
        ("length", "gender", "t1", "man", "ab", 100.0, "p"),
        ("length", "gender", "t1", "woman", "abcdefgh", -100.0, "p"),
    ]
    return frame(rows)


# --- group_means and item_differences, by hand ---------------------------------------------------------------


def test_group_means_average_variants_inside_the_item():
    items = hand_items()
    reward = stats.group_means(items, "identity", "gender")
    length = stats.group_means(items, "identity", "gender", value="length")
    assert list(reward.index) == ["t0", "t1", "t2", "t3"] and list(reward.columns) == ["man", "nb", "woman"]
    assert reward.loc["t1"].tolist() == [2.0, 2.0, 5.0]
    assert length.loc["t1"].tolist() == [3.0, 3.0, 6.0]
    assert np.isnan(reward.loc["t2", "nb"]) and np.isnan(reward.loc["t0", "man"])
    with pytest.raises(ValueError, match="value"):
        stats.group_means(items, "identity", "gender", value="tokens")


def test_a_responses_length_is_its_characters_and_an_empty_one_read_as_nan_is_zero():
    """Length is len(text) in characters (so it can be recomputed from audit_items.csv by anyone): 'café' is 4, not
    its 5 UTF-8 bytes; a CSV reader gives an empty text as NaN, which is 0 characters, not the 3 of 'nan'."""
    items = pd.DataFrame({"battery": "b", "axis": "a", "item": ["i", "i", "i"], "group": ["x", "y", "z"],
                          "text": ["café", np.nan, "ab"], "reward": [1.0, 2.0, 3.0], "prompt": [np.nan, "Q", "Q"]})
    assert stats.group_means(items, "b", "a", value="length").loc["i"].tolist() == [4.0, 0.0, 2.0]


def test_item_differences_by_hand():
    items = hand_items()
    d, dl, ids = stats.item_differences(items, Contrast("identity", "gender", ("woman",), ("man",), "shuffled"))
    assert ids == ["t1", "t2", "t3"]  # t0 lacks man; nb is not needed, so t2 stays
    np.testing.assert_allclose(d, [5 - 2, 2 - 1, -1 - 0])
    np.testing.assert_allclose(dl, [6 - 3, 3 - 2, 2 - 1])

    # AXIS_MEAN is every group of the axis, woman included; only items with all of them (t2 is dropped)
    d, dl, ids = stats.item_differences(items, Contrast("identity", "gender", ("woman",), (AXIS_MEAN,), "shuffled"))
    assert ids == ["t1", "t3"]
    np.testing.assert_allclose(d, [5 - (2 + 5 + 2) / 3, -1 - (0 - 1 + 2) / 3])
    np.testing.assert_allclose(dl, [6 - (3 + 6 + 3) / 3, 2 - (1 + 2 + 3) / 3], atol=1e-12)

    d, dl, ids = stats.item_differences(items, Contrast("identity", "gender", ("man", "nb"), ("woman",), "length"))
    assert ids == ["t1", "t3"]
    np.testing.assert_allclose(d, [(2 + 2) / 2 - 5, (0 + 2) / 2 + 1])
    np.testing.assert_allclose(dl, [(3 + 3) / 2 - 6, (1 + 3) / 2 - 2])

    d, dl, ids = stats.item_differences(items, Contrast("identity", "gender", ("alien",), ("man",), "length"))
    assert len(d) == len(dl) == 0 and ids == []


def test_item_differences_do_not_depend_on_row_order_or_id_types():
    items = hand_items()
    contrast = Contrast("identity", "gender", ("woman",), (AXIS_MEAN,), "shuffled")
    shuffled = items.sample(frac=1.0, random_state=3).reset_index(drop=True)
    a, b = stats.item_differences(items, contrast), stats.item_differences(shuffled, contrast)
    np.testing.assert_allclose(a[0], b[0])
    assert a[2] == b[2]
    numeric = items.assign(item=items["item"].str[1:].astype(int))  # as a CSV read without dtype=str gives them
    d, _, ids = stats.item_differences(numeric, contrast)
    assert ids == ["1", "3"]
    np.testing.assert_allclose(d, a[0])


# --- bootstrap_ci against scipy ------------------------------------------------------------------------------


def test_bootstrap_ci_matches_scipy_percentile_bootstrap():
    rng = np.random.default_rng(1)
    d = rng.normal(0.3, 1.0, size=40)
    n_boot, alpha = 20000, 0.025
    low, high = stats.bootstrap_ci(d, n_boot=n_boot, seed=3)
    ref = scipy_stats.bootstrap((d,), np.mean, method="percentile", n_resamples=n_boot, confidence_level=0.95,
                                rng=np.random.default_rng(4)).confidence_interval
    # The bootstrap distribution of the mean has SD s = std(d, ddof=0)/sqrt(n) and is close to normal at n = 40,
    # so its density at the 2.5% / 97.5% quantiles is phi(1.96)/s. A sample quantile from B draws then has SE
    # sqrt(a(1-a)/B) / density (~0.019 s here); two independent estimates differ by sqrt(2) SE; allow 5 of those.
    s = d.std(ddof=0) / math.sqrt(len(d))
    se = math.sqrt(alpha * (1 - alpha) / n_boot) * s / scipy_stats.norm.pdf(scipy_stats.norm.ppf(1 - alpha))
    tol = 5 * math.sqrt(2) * se
    assert abs(low - ref.low) < tol and abs(high - ref.high) < tol
    assert tol < 0.05 * (high - low)  # the bound is tight enough to mean something


def test_bootstrap_ci_is_seeded_nested_and_contains_the_mean():
    d = np.random.default_rng(2).exponential(size=25)
    assert stats.bootstrap_ci(d, seed=5) == stats.bootstrap_ci(d, seed=5)
    assert stats.bootstrap_ci(d, seed=5) != stats.bootstrap_ci(d, seed=6)
    wide, narrow = stats.bootstrap_ci(d, seed=5, level=0.95), stats.bootstrap_ci(d, seed=5, level=0.5)
    assert wide[0] < narrow[0] < d.mean() < narrow[1] < wide[1]  # same resamples: nested intervals
    assert stats.bootstrap_ci(np.full(7, 0.1)) == pytest.approx((0.1, 0.1))


# --- sign_flip_p against brute force and scipy ---------------------------------------------------------------


def brute_force_sign_flip_p(d) -> float:
    """Fraction of all 2**n sign vectors whose |sum| reaches the observed one, in exact rational arithmetic."""
    values = [Fraction(float(x)) for x in d]
    observed = abs(sum(values))
    hits = sum(abs(sum(s * x for s, x in zip(signs, values, strict=True))) >= observed
               for signs in itertools.product((1, -1), repeat=len(values)))
    return hits / 2 ** len(values)


@pytest.mark.parametrize("d", [
    [1, 1, 1, 1, 2, -2, 3, 0],  # integer: many exact ties with the observed |sum|
    [3, -1, 2, 2, -2, 1, 1, 4, -3],
    [0.5, -0.25, 1.5, 0.75],
    list(np.random.default_rng(7).normal(0.4, 1.0, size=10)),
    [1e10, -1e10, 1.0, 0.5],  # spanning orders of magnitude: a tie tolerance of 1e-9 x mean|d| gave p 1, not 0.75
    [1.0, -1.0, 1e-9, 5e-10],  # (helper-164)
])
def test_sign_flip_p_exact_matches_brute_force(d):
    assert stats.sign_flip_p(np.array(d, float), n_perm=10000) == pytest.approx(brute_force_sign_flip_p(d), abs=1e-15)


def test_sign_flip_p_exact_matches_scipy_exact():
    d = np.random.default_rng(8).normal(0.5, 1.0, size=11)
    ref = scipy_stats.permutation_test((d,), lambda x, axis: np.abs(np.mean(x, axis=axis)), vectorized=True,
                                       permutation_type="samples", n_resamples=np.inf, alternative="greater")
    assert stats.sign_flip_p(d, n_perm=2**11) == pytest.approx(ref.pvalue, abs=1e-15)


def test_sign_flip_p_monte_carlo_matches_scipy():
    d = np.random.default_rng(9).normal(0.35, 1.0, size=30)  # 2**30 > n_perm: Monte Carlo
    n = 20000
    p = stats.sign_flip_p(d, n_perm=n, seed=1)
    ref = scipy_stats.permutation_test((d,), lambda x, axis: np.abs(np.mean(x, axis=axis)), vectorized=True,
                                       permutation_type="samples", n_resamples=n, alternative="greater",
                                       rng=np.random.default_rng(2)).pvalue
    # both are (1 + Binomial(n, p_true)) / (1 + n): SD sqrt(p(1-p)/n) each; 5 SD of the difference
    assert 0.01 < ref < 0.5
    assert abs(p - ref) < 5 * math.sqrt(2 * ref * (1 - ref) / n) + 2 / n


def test_sign_flip_p_monte_carlo_matches_exact_and_edges():
    d = np.random.default_rng(10).normal(0.5, 1.0, size=16)
    exact = stats.sign_flip_p(d, n_perm=2**16)
    mc = stats.sign_flip_p(d, n_perm=10000, seed=3)
    assert abs(mc - exact) < 5 * math.sqrt(exact * (1 - exact) / 10000) + 1 / 10000
    assert mc == stats.sign_flip_p(d, n_perm=10000, seed=3)
    assert stats.sign_flip_p(np.zeros(20)) == 1.0 and stats.sign_flip_p(np.zeros(3)) == 1.0
    assert stats.sign_flip_p(np.full(40, 2.0), n_perm=999) == pytest.approx(1 / 1000)  # floor of Monte Carlo
    assert stats.sign_flip_p(np.full(5, 2.0)) == pytest.approx(2 / 32)  # exact: only all-+ and all--


# --- holm against the step-down procedure ------------------------------------------------------------------


def holm_rejects(p, alpha) -> set[int]:
    """Holm's procedure at level alpha: walk the p-values upwards, reject while p_(j) <= alpha / (m - j + 1)."""
    m = len(p)
    rejected = set()
    for j, i in enumerate(sorted(range(m), key=lambda i: p[i])):
        if (m - j) * p[i] > alpha:
            break
        rejected.add(i)
    return rejected


def brute_force_holm(p) -> list[float]:
    """The adjusted p of a hypothesis is the smallest level at which Holm's procedure rejects it (1 if none <= 1)."""
    m = len(p)
    levels = sorted({min(1.0, (m - j) * q) for q in p for j in range(m)})
    return [next((a for a in levels if i in holm_rejects(p, a)), 1.0) for i in range(m)]


def test_holm_textbook_example():
    # Holm (1979) as on Wikipedia: H1..H4 with p = 0.01, 0.04, 0.03, 0.005 -> adjusted 0.03, 0.06, 0.06, 0.02
    np.testing.assert_allclose(stats.holm([0.01, 0.04, 0.03, 0.005]), [0.03, 0.06, 0.06, 0.02])


@pytest.mark.parametrize("p", [
    [0.01, 0.01, 0.02, 0.5, 0.5, 1.0, 0.0],
    list(np.random.default_rng(11).uniform(size=9)),
    list(np.random.default_rng(12).uniform(0, 0.05, size=6)),
    [0.3],
])
def test_holm_matches_step_down_definition(p):
    adjusted = stats.holm(p)
    np.testing.assert_allclose(adjusted, brute_force_holm(p), rtol=1e-15)
    assert (adjusted >= np.asarray(p)).all() and (adjusted <= 1).all()
    order = np.argsort(p, kind="stable")
    assert (np.diff(adjusted[order]) >= 0).all()


def test_holm_edges():
    assert len(stats.holm([])) == 0
    with pytest.raises(ValueError):
        stats.holm([0.1, float("nan")])


# --- the length null ---------------------------------------------------------------------------------------


def filler_items(rng, n_items=8) -> pd.DataFrame:
    """The length battery's padded and concise renderings (reward 0.02 a character + an item effect + noise), a
    third rendering, and identity rows whose lengths differ by group."""
    rows = []
    for item in range(n_items):
        effect = rng.normal(0, 5)
        for group, n_chars in (("concise", 40), ("padded_neutral", 120), ("detailed", 300)):
            n_chars += int(rng.integers(0, 30))
            rows.append(("length", "renderings", f"q{item}", group, "x" * n_chars,
                         0.02 * n_chars + effect + rng.normal(0, 0.1), "question"))
        for group, text in (("a", "short"), ("b", "much longer text")):
            rows.append(("identity", "g (response)", f"t{item}", group, text, rng.normal(), "prompt"))
    return frame(rows)


def test_filler_slope_by_hand():
    items = filler_items(np.random.default_rng(13))
    by = {g: items[items["group"] == g].set_index("item") for g in ("padded_neutral", "concise")}
    added = (by["padded_neutral"]["text"].str.len() - by["concise"]["text"].str.len()).sum()
    gained = (by["padded_neutral"]["reward"] - by["concise"]["reward"]).sum()
    assert stats.filler_slope(items) == pytest.approx(gained / added, rel=1e-12)
    assert stats.filler_slope(items) == pytest.approx(0.02, abs=0.005)
    assert stats.filler_slope(items[items["battery"] != "length"]) is None


def test_length_null_is_the_filler_slope_times_the_length_difference():
    items = filler_items(np.random.default_rng(14))
    contrast = Contrast("identity", "g (response)", ("b",), ("a",), "length")
    assert stats.length_null(items, contrast) == pytest.approx(stats.filler_slope(items) * (16 - 5), rel=1e-12)
    with pytest.raises(ValueError, match="needs the length battery"):
        stats.length_null(items[items["battery"] != "length"], contrast)
    framing = frame([("framing", "wording", f"i{i}", g, f"answer {i}", float(r), f"{g} prompt {i}")
                     for i in range(5) for g, r in (("best", i), ("worst", -i))])
    # the responses never differ in length: no slope needed, the null is 0
    assert stats.length_null(framing, Contrast("framing", "wording", ("best",), ("worst",), "length")) == 0.0


def test_an_interactions_length_null_is_the_slope_times_the_first_axis_length_gap_minus_the_seconds():
    """The shipped interactions (framing) never change a response, so their null is 0 either way; where the two
    axes' responses do differ in length, the null is the filler slope times (mean Δlength over the first axis's items
    minus the mean over the second's), by a loop over the items."""
    rng = np.random.default_rng(41)
    rows = []
    for axis, n, (x_len, y_len) in (("top", 9, (30, 12)), ("bottom", 7, (20, 17))):
        for item in range(n):
            for group, chars in (("good", x_len), ("bad", y_len)):
                chars += int(rng.integers(0, 9))
                rows.append(("framing", axis, f"{axis}{item}", group, "y" * chars, rng.normal(), "prompt"))
    items = pd.concat([filler_items(np.random.default_rng(42)), frame(rows)], ignore_index=True)
    contrast = Contrast("framing", "top", ("good",), ("bad",), "length", minus_axis="bottom")

    def mean_gap(axis):
        part = items[(items["battery"] == "framing") & (items["axis"] == axis)]
        return np.mean([len(one.loc[one["group"] == "good", "text"].iloc[0]) -
                        len(one.loc[one["group"] == "bad", "text"].iloc[0]) for _, one in part.groupby("item")])

    want = stats.filler_slope(items) * (mean_gap("top") - mean_gap("bottom"))
    assert abs(mean_gap("top") - mean_gap("bottom")) > 5 and want != 0.0
    assert stats.length_null(items, contrast) == pytest.approx(want, rel=1e-12)
    row = stats.audit_table(items, [contrast], n_boot=200, n_perm=500).iloc[0]
    assert row["null_effect"] == pytest.approx(want, rel=1e-12)

# --- the shuffled null -------------------------------------------------------------------------------------


def noise_items(rng, n_items=60, shift=0.0) -> pd.DataFrame:
    rows = []
    for item in range(n_items):
        for group in ("a", "b", "c"):
            for _ in range(rng.integers(1, 4)):
                rows.append(("identity", "gender", f"t{item:03d}", group, "text", rng.normal() + shift * (group == "a"),
                             "prompt"))
    return frame(rows)


def direct_shuffled_effects(items: pd.DataFrame, n_shuffle: int, rng) -> np.ndarray:
    """Relabel groups within items, recompute every (item, group) mean and "a vs axis mean" from scratch."""
    items = items.sort_values("item", kind="stable")
    item_code = pd.factorize(items["item"])[0]
    groups, group_code = np.unique(items["group"].to_numpy(), return_inverse=True)
    reward = items["reward"].to_numpy(float)
    n_items, n_groups = item_code.max() + 1, len(groups)
    out = np.empty(n_shuffle)
    for s in range(n_shuffle):
        relabelled = group_code[np.lexsort((rng.random(len(reward)), item_code))]
        cell = item_code * n_groups + relabelled
        means = (np.bincount(cell, reward, n_items * n_groups) / np.bincount(cell, minlength=n_items * n_groups))
        means = means.reshape(n_items, n_groups)
        out[s] = (means[:, list(groups).index("a")] - means.mean(axis=1)).mean()
    return out


def test_shuffled_null_matches_a_direct_computation_without_information():
    items = noise_items(np.random.default_rng(15))
    contrast = Contrast("identity", "gender", ("a",), (AXIS_MEAN,), "shuffled")
    n = 4000
    direct = np.abs(direct_shuffled_effects(items, n, np.random.default_rng(16)))
    null = stats.shuffled_null(items, contrast, n_shuffle=n, seed=17)
    # SE of a sample 95% quantile of |effect| ~ N(0, sigma) folded: sqrt(.95*.05/n) / (2 phi(1.96) / sigma);
    # 5 SD of the difference of two independent estimates
    sigma = math.sqrt(np.mean(direct**2))
    se = math.sqrt(0.95 * 0.05 / n) * sigma / (2 * scipy_stats.norm.pdf(1.96))
    assert abs(null - np.quantile(direct, 0.95)) < 5 * math.sqrt(2) * se
    assert stats.shuffled_null(items, contrast, n_shuffle=200, seed=1) == stats.shuffled_null(
        items, contrast, n_shuffle=200, seed=1)


def test_shuffled_null_shuffles_only_the_contrast_groups():
    """A third group's real effect is not chance: a vs b, with c far above both, keeps a null of noise size."""
    items = noise_items(np.random.default_rng(21))
    items.loc[items["group"] == "c", "reward"] += 100.0
    only = items[items["group"] != "c"]
    contrast = Contrast("identity", "gender", ("a",), ("b",), "shuffled")
    assert stats.shuffled_null(items, contrast, n_shuffle=300, seed=3) == stats.shuffled_null(
        only, contrast, n_shuffle=300, seed=3)
    assert stats.shuffled_null(items, contrast, n_shuffle=300, seed=3) < 1.0


def test_shuffled_null_is_below_a_huge_real_effect():
    items = noise_items(np.random.default_rng(18), shift=100.0)
    contrast = Contrast("identity", "gender", ("a",), (AXIS_MEAN,), "shuffled")
    d, _, _ = stats.item_differences(items, contrast)
    assert abs(d.mean()) > 2 * stats.shuffled_null(items, contrast, n_shuffle=500)


# --- audit_table -------------------------------------------------------------------------------------------


def audit_items(rng) -> pd.DataFrame:
    rows = []
    for item in range(12):
        for group, shift in (("a", 0.8), ("b", 0.0), ("c", 0.0)):
            for k in range(rng.integers(1, 3)):  # each variant its own conversation, as in a battery
                rows.append(("identity", "gender (response)", f"i{item}", group, f"I am {group} ({item:02d}.{k}).",
                             rng.normal() + shift, "Describe yourself."))
    for item in range(10):
        for group, n_chars in (("concise", 20), ("padded_neutral", 200)):
            n_chars += int(rng.integers(0, 20))
            rows.append(("length", "renderings", f"q{item}", group, "y" * n_chars,
                         0.01 * n_chars + rng.normal(0, 0.3), f"question {item}"))
    for item in range(8):
        for group in ("plain", "leading"):
            rows.append(("framing", "wording", f"f{item}", group, f"answer {item}", rng.normal(), f"{group} {item}"))
    return frame(rows)


CONTRASTS = [
    Contrast("identity", "gender (response)", ("a",), (AXIS_MEAN,), "shuffled"),
    Contrast("identity", "gender (response)", ("b",), (AXIS_MEAN,), "shuffled"),
    Contrast("length", "renderings", ("padded_neutral",), ("concise",), "length"),
    Contrast("framing", "wording", ("leading",), ("plain",), "length"),
]


def test_audit_table_columns_rows_and_statistics():
    items = audit_items(np.random.default_rng(19))
    table = stats.audit_table(items, CONTRASTS, n_boot=500, n_perm=2000, seed=0)
    assert list(table.columns) == ["battery", "axis", "contrast", "n_items", "effect", "ci_low", "ci_high", "p",
                                   "p_holm", "null_effect"]
    assert list(table["contrast"]) == ["a vs axis mean", "b vs axis mean", "padded_neutral vs concise",
                                       "leading vs plain"]
    assert list(table["n_items"]) == [12, 12, 10, 8]
    for row, contrast in zip(table.itertuples(), CONTRASTS, strict=True):
        d, _, _ = stats.item_differences(items, contrast)
        assert row.effect == pytest.approx(d.mean())
        assert row.ci_low <= row.effect <= row.ci_high
    assert (table["p_holm"] >= table["p"]).all()
    np.testing.assert_allclose(table["p_holm"], stats.holm(table["p"]))  # over every row, not per battery
    assert table["p"].min() < 1 / len(table) and table["p_holm"].min() > table["p"].min()
    # the filler's own contrast: its length-only null is its effect (slope = Σ gained / Σ added characters)
    assert table["null_effect"][2] == pytest.approx(table["effect"][2], rel=1e-9)
    assert table["null_effect"][3] == 0.0  # framing: the response never changes
    assert (table["null_effect"][:2] > 0).all()
    assert table["effect"][2] > 1.0 and table["p"][2] < 0.01


def test_audit_table_is_reproducible_and_rows_have_their_own_streams():
    items = audit_items(np.random.default_rng(20))
    a = stats.audit_table(items, CONTRASTS, n_boot=300, n_perm=1000, seed=4)
    pd.testing.assert_frame_equal(a, stats.audit_table(items, CONTRASTS, n_boot=300, n_perm=1000, seed=4))
    assert not a["ci_low"].equals(stats.audit_table(items, CONTRASTS, n_boot=300, n_perm=1000, seed=5)["ci_low"])
    head = stats.audit_table(items, CONTRASTS[:2], n_boot=300, n_perm=1000, seed=4)
    pd.testing.assert_frame_equal(head.drop(columns="p_holm"), a[:2].drop(columns="p_holm"))
    # one contrast twice: the same effect, its own resamples (rows sharing a stream share their Monte Carlo error)
    twice = stats.audit_table(items, [CONTRASTS[0]] * 2, n_boot=300, n_perm=1000, seed=4)
    assert twice["effect"][0] == twice["effect"][1] and twice["ci_low"][0] != twice["ci_low"][1]
    assert twice["null_effect"][0] != twice["null_effect"][1]  # the shuffled null's draws too
    # everything is recomputable from audit_items.csv (strings kept as strings)
    path_rows = items.to_csv(index=False)
    read = pd.read_csv(io.StringIO(path_rows), keep_default_na=False,
                       dtype={k: str for k in ("battery", "axis", "item", "group", "text", "prompt")})
    pd.testing.assert_frame_equal(a, stats.audit_table(read, CONTRASTS, n_boot=300, n_perm=1000, seed=4))


def test_audit_table_refusals(monkeypatch):
    items = audit_items(np.random.default_rng(21))
    with pytest.raises(ValueError, match="null 'flat'"):
        stats.audit_table(items, [*CONTRASTS, Contrast("framing", "wording", ("plain",), ("leading",), "flat")])
    one = items[~items["item"].isin([f"f{i}" for i in range(1, 8)])]
    with pytest.raises(ValueError, match="1 item.*at least 2"):
        stats.audit_table(one, CONTRASTS[3:], n_boot=100, n_perm=100)
    monkeypatch.setattr(stats, "bootstrap_ci", lambda d, n_boot, seed: (1e6, 2e6))
    with pytest.raises(RuntimeError, match="does not contain"):
        stats.audit_table(items, CONTRASTS[2:3], n_boot=100, n_perm=100)


# --- compare_models ----------------------------------------------------------------------------------------


def test_the_scale_counts_a_conversation_two_axes_share_once():
    """The identity battery's name axes (gender, origin) hold the same conversations: the SD the model comparison
    divides by is over conversations, so each counts once (they weighed double)."""
    rng = np.random.default_rng(5)
    rows = [dict(battery="identity", axis=axis, item=f"i{i}", group=g, text=f"{g} {i}", prompt="p",
                 reward=float(rewards))
            for i in range(6) for g, rewards in zip(("Ana", "Bo"), rng.normal(size=2) * [1.0, 5.0], strict=True)
            for axis in ("names: gender", "names: origin")]
    rows += [dict(battery="identity", axis="age", item=f"i{i}", group="old", text=f"old {i}", prompt="p",
                  reward=float(rng.normal())) for i in range(5)]
    items = pd.DataFrame(rows)
    once = items[items["axis"] != "names: origin"]["reward"].to_numpy()
    assert len(once) == 17
    assert stats.reward_scale(items) == pytest.approx(np.std(once, ddof=1), rel=1e-12)
    assert stats.reward_scale(items) != pytest.approx(np.std(items["reward"], ddof=1), rel=1e-3)
    # rewards of one value have no scale, though their computed SD rounds above 0 (three 0.1s: 1.7e-17): divided
    # by it, a side-by-side difference read 1e16 SDs
    flat = items.iloc[:3].assign(reward=0.1, text=["a", "b", "c"])
    assert np.std(flat["reward"], ddof=1) > 0
    with pytest.raises(ValueError, match="no spread"):
        stats.reward_scale(flat)


def test_compare_models_identical_shifted_and_mismatched():
    items = audit_items(np.random.default_rng(22))
    shifted = items.assign(reward=items["reward"] + np.where(items["group"] == "a", 1.5, 0.0))
    partial = items[items["item"] != "i0"]
    affine = items.assign(reward=3.0 * items["reward"] - 7.0)  # the same model, another scale and offset
    models = {"m1": items, "m2": items.copy(), "m3": shifted, "m4": partial, "m5": affine}
    table = stats.compare_models(models, CONTRASTS[:1], n_boot=300, n_perm=1000)
    assert list(table.columns) == ["battery", "axis", "contrast", "model_a", "model_b", "n_items", "effect_a",
                                   "effect_b", "scale_a", "scale_b", "difference_sd", "ci_low", "ci_high", "p",
                                   "p_holm"]
    assert list(zip(table["model_a"], table["model_b"], strict=True)) == list(itertools.combinations(models, 2))
    # the scale: each model's reward SD over the contrasts' battery (pandas, by hand)
    for row in table.itertuples():
        for name, scale in ((row.model_a, row.scale_a), (row.model_b, row.scale_b)):
            frame = models[name]
            assert scale == pytest.approx(frame[frame["battery"] == CONTRASTS[0].battery]["reward"].std(), rel=1e-12)
    by_pair = {(r.model_a, r.model_b): r for r in table.itertuples()}
    same = by_pair["m1", "m2"]
    assert same.difference_sd == 0.0 and same.ci_low == 0.0 and same.ci_high == 0.0 and same.p == 1.0
    assert same.effect_a == same.effect_b == pytest.approx(stats.item_differences(items, CONTRASTS[0])[0].mean())
    rescaled = by_pair["m1", "m5"]  # an affine map of a reward model changes no standardised effect
    assert rescaled.effect_b == pytest.approx(3.0 * rescaled.effect_a)
    # (up to float64 rounding of d/s: a few ulps of effects of order 1)
    assert max(abs(rescaled.difference_sd), abs(rescaled.ci_low), abs(rescaled.ci_high)) < 1e-12
    up = by_pair["m1", "m3"]  # every item's "a vs axis mean" moves by 1.5 * (1 - 1/3) = 1 reward unit
    d1, d3 = (stats.item_differences(m, CONTRASTS[0])[0] for m in (items, shifted))
    np.testing.assert_allclose(d3 - d1, 1.0, rtol=1e-12)
    assert up.effect_b - up.effect_a == pytest.approx(1.0)
    expected = d1 / up.scale_a - d3 / up.scale_b
    assert up.difference_sd == pytest.approx(expected.mean(), rel=1e-12)
    assert up.ci_low <= up.difference_sd <= up.ci_high < 0 and up.p < 0.01
    assert by_pair["m1", "m4"].n_items == 11  # m1 vs m4: the items both have
    np.testing.assert_allclose(table["p_holm"], stats.holm(table["p"]))
    # one pair's contrast twice: the same difference, each row its own resamples (as audit_table's rows)
    twice = stats.compare_models({"m1": items, "m3": shifted}, CONTRASTS[:1] * 2, n_boot=300, n_perm=1000)
    assert twice["difference_sd"][0] == twice["difference_sd"][1] and twice["ci_low"][0] != twice["ci_low"][1]

    renamed = items.copy()
    renamed.loc[(renamed["item"] == "i3") & (renamed["group"] == "b"), "text"] = "I am someone else."
    with pytest.raises(ValueError, match="item 'i3'"):
        stats.compare_models({"m1": items, "m2": renamed}, CONTRASTS[:1], n_boot=100, n_perm=100)


def _through_items_csv(items: pd.DataFrame, tmp_path, name: str) -> pd.DataFrame:
    """The items as `analyze --audits` reads them: written as the audit writes audit_items.csv, read back."""
    path = tmp_path / f"{name}.csv"
    with open(path, "w", encoding="utf-8", newline="") as f:
        results.write_rows(f, [list(items.columns)])
        results.write_rows(f, ([*row[:5], float(row[5]), row[6]] for row in items.itertuples(index=False)))
    return read_items(path)


@pytest.mark.parametrize("seed, mapped, dtype", [(16, lambda r: r + 7.0, np.float64),
                                                 (36, lambda r: 3.0 * r + 7.0, np.float64),
                                                 (1, lambda r: r + np.float32(7), np.float32),
                                                 (2, lambda r: np.float32(3) * r + np.float32(7), np.float32)])
def test_a_model_against_an_affine_copy_of_itself_differs_by_nothing(seed, mapped, dtype, tmp_path):
    """A model's rewards plus 7 (or times 3 plus 7) are the same model: every item's standardised difference is 0
    in exact arithmetic, so every row's difference, CI and p are those of an exact copy (0, 0, 0, 1). float64 left
    |d| ≈ 1e-16, which the sign-flip test read as data: p 0.002 and 0.007, surviving Holm (a fault hunt; these seeds
    showed it). Rewards are float32, as scoring returns them, mapped in float32 and read from audit_items.csv: |d|
    ≈ 1e-8 SD, which a float64 threshold read as data (seeds 1 and 2: differences ≈ 3e-8 SD with CIs around them;
    a fault hunt's 20 seeds: 11 of 100 CIs excluded 0, the smallest p 0.009)."""
    rng, groups = np.random.default_rng(seed), ["concise", "detailed", "markdown", "padded_neutral", "restated"]
    rewards = rng.normal(size=26 * len(groups)).astype(dtype)
    items = pd.DataFrame([dict(battery="length", axis="renderings", item=f"q{i}", group=g, text="x" * (20 + 15 * k),
                               prompt=f"question {i}") for i in range(26) for k, g in enumerate(groups)])
    items.insert(5, "reward", rewards)
    copy = items.assign(reward=mapped(rewards))
    if dtype == np.float32:
        items, copy = _through_items_csv(items, tmp_path, "a"), _through_items_csv(copy, tmp_path, "b")
    contrasts = [Contrast("length", "renderings", (x,), (y,), "shuffled") for x, y in
                 [("detailed", "concise"), ("markdown", "detailed"), ("markdown", "concise"),
                  ("padded_neutral", "concise"), ("restated", "concise")]]
    table = stats.compare_models({"a": items, "b": copy}, contrasts, n_boot=2000, n_perm=10000)
    assert (table[["difference_sd", "ci_low", "ci_high"]] == 0.0).all().all()
    assert (table["p"] == 1.0).all() and (table["p_holm"] == 1.0).all()


@pytest.mark.parametrize("call", [lambda x: stats.sign_flip_p(x), lambda x: stats.bootstrap_ci(x),
                                  lambda x: stats.label_permutation_p(x, [0.5, 1.0]),
                                  lambda x: stats.label_permutation_p([0.5, 1.0], x),
                                  lambda x: stats.bootstrap_ci([0.5, 1.0], minus=x)])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_the_resampling_tests_refuse_a_value_that_is_not_finite(call, bad):
    """sign_flip_p([0.3, -0.2, nan, 0.1]) was 0.0, the most significant p there is (NaN fails every comparison),
    and bootstrap_ci (nan, nan): refused, as holm refuses it."""
    with pytest.raises(ValueError, match="NaN or infinite"):
        call([0.3, -0.2, bad, 0.1])


# --- interactions: two independent sets of items ----------------------------------------------------------


def brute_force_label_p(a, b) -> float:
    """Fraction of all relabellings (which n_a of the pooled items form the first set) whose |mean difference|
    reaches the observed one, in exact rational arithmetic."""
    pooled = [Fraction(float(x)) for x in [*a, *b]]
    n, na = len(pooled), len(a)
    total = sum(pooled)

    def gap(first):
        s = sum(pooled[i] for i in first)
        return abs(s / na - (total - s) / (n - na))

    observed = gap(range(na))
    combos = list(itertools.combinations(range(n), na))
    return sum(gap(c) >= observed for c in combos) / len(combos)


@pytest.mark.parametrize("a,b", [
    ([1, 2, 2, 3, 0], [1, 1, 0, 2]),  # integers: exact ties with the observed gap
    ([0.5, 1.5, 2.25], [-0.5, 0.75, 0.0, 1.0, -1.25]),
    (list(np.random.default_rng(30).normal(0.8, 1, 6)), list(np.random.default_rng(31).normal(0, 1, 7))),
    ([1e10, 1.0], [1e10, 0.0, 3.0]),  # a tolerance of 1e-9 x the spread gave p 1, not 0.8 (helper-164)
])
def test_label_permutation_p_exact_matches_brute_force_and_scipy(a, b):
    a, b = np.array(a, float), np.array(b, float)
    p = stats.label_permutation_p(a, b, n_perm=10000)
    assert math.comb(len(a) + len(b), len(a)) <= 10000  # the exact branch
    assert p == pytest.approx(brute_force_label_p(a, b), abs=1e-15)
    ref = scipy_stats.permutation_test((a, b), lambda x, y, axis: np.abs(x.mean(axis) - y.mean(axis)),
                                       vectorized=True, permutation_type="independent", n_resamples=np.inf,
                                       alternative="greater")
    assert p == pytest.approx(ref.pvalue, abs=1e-12)


def test_label_permutation_p_monte_carlo_matches_scipy_and_edges():
    rng = np.random.default_rng(32)
    a, b = rng.normal(0.8, 1, 24), rng.normal(0.0, 1, 24)  # C(48, 24) > n_perm: Monte Carlo
    n = 20000
    p = stats.label_permutation_p(a, b, n_perm=n, seed=1)
    ref = scipy_stats.permutation_test((a, b), lambda x, y, axis: np.abs(x.mean(axis) - y.mean(axis)),
                                       vectorized=True, permutation_type="independent", n_resamples=n,
                                       alternative="greater", rng=np.random.default_rng(2)).pvalue
    assert 0.01 < ref < 0.5
    assert abs(p - ref) < 5 * math.sqrt(2 * ref * (1 - ref) / n) + 2 / n  # 5 SD of two binomial estimates
    assert p == stats.label_permutation_p(a, b, n_perm=n, seed=1)
    assert stats.label_permutation_p(np.full(3, 2.0), np.full(4, 2.0)) == 1.0  # every item alike
    assert stats.label_permutation_p(np.full(30, 5.0), np.zeros(30), n_perm=999) == pytest.approx(1 / 1000)
    with pytest.raises(ValueError, match="both sets"):
        stats.label_permutation_p(np.ones(3), np.zeros(0))


def test_two_sample_bootstrap_ci_matches_scipy():
    rng = np.random.default_rng(33)
    a, b = rng.normal(0.5, 1.0, 30), rng.normal(0.0, 2.0, 40)
    n_boot, alpha = 20000, 0.025
    low, high = stats.bootstrap_ci(a, n_boot=n_boot, seed=3, minus=b)
    ref = scipy_stats.bootstrap((a, b), lambda x, y, axis: x.mean(axis) - y.mean(axis), paired=False,
                                vectorized=True, method="percentile", n_resamples=n_boot, confidence_level=0.95,
                                rng=np.random.default_rng(4)).confidence_interval
    # as the one-sample check: the difference of two independent means has SD sqrt(s_a^2/n_a + s_b^2/n_b)
    s = math.sqrt(a.var() / len(a) + b.var() / len(b))
    se = math.sqrt(alpha * (1 - alpha) / n_boot) * s / scipy_stats.norm.pdf(scipy_stats.norm.ppf(1 - alpha))
    tol = 5 * math.sqrt(2) * se
    assert abs(low - ref.low) < tol and abs(high - ref.high) < tol
    assert low < a.mean() - b.mean() < high and tol < 0.05 * (high - low)
    assert stats.bootstrap_ci(a, seed=3) == stats.bootstrap_ci(a, seed=3, minus=None)


def interaction_items(rng, gain: float) -> pd.DataFrame:
    """Wordings "good" and "bad" after which top answers gain 1 + gain and bottom answers 1 (an offset): items of
    the two axes are different answers."""
    rows = []
    for axis, shift, n in (("top", 1.0 + gain, 14), ("bottom", 1.0, 11)):
        for item in range(n):
            base = rng.normal()
            for group, up in (("good", shift), ("bad", 0.0)):
                rows.append(("framing", axis, f"{axis}{item}", group, f"answer {axis} {item}",
                             base + up + rng.normal(0, 0.2), f"{group} prompt"))
    return frame(rows)


def test_an_interaction_row_is_the_first_axis_effect_minus_the_second():
    contrast = Contrast("framing", "top", ("good",), ("bad",), "length", minus_axis="bottom")
    assert contrast.row_axis == "top minus bottom" and contrast.axes() == ("top", "bottom")
    offset, reads = interaction_items(np.random.default_rng(34), 0.0), interaction_items(np.random.default_rng(35), 1.5)
    rows = []
    for items in (offset, reads):
        row = stats.audit_table(items, [contrast], n_boot=500, n_perm=2000, seed=0).iloc[0]
        top = items[items["axis"] == "top"].pivot(index="item", columns="group", values="reward")
        bottom = items[items["axis"] == "bottom"].pivot(index="item", columns="group", values="reward")
        d_top, d_bottom = (top["good"] - top["bad"]).to_numpy(), (bottom["good"] - bottom["bad"]).to_numpy()
        assert row["axis"] == "top minus bottom" and row["n_items"] == 25
        assert row["effect"] == pytest.approx(d_top.mean() - d_bottom.mean(), rel=1e-12)
        assert row["ci_low"] <= row["effect"] <= row["ci_high"]
        p = stats.label_permutation_p(d_top, d_bottom, n_perm=2000, seed=stats._row_seeds(0, 0)[1])
        assert row["p"] == p and row["null_effect"] == 0.0  # the responses never change
        rows.append(row)
    # an offset that every answer gets is no interaction; a gain only the top answers get is
    assert rows[0]["ci_low"] < 0 < rows[0]["ci_high"] and rows[0]["p"] > 0.01
    assert rows[1]["ci_low"] > 1.0 and rows[1]["p"] < 0.01
    table = stats.compare_models({"offset": offset, "reads": reads}, [contrast], n_boot=500, n_perm=2000)
    diff = table.iloc[0]
    scales = [m[m["battery"] == "framing"]["reward"].std() for m in (offset, reads)]
    assert diff["difference_sd"] == pytest.approx(rows[0]["effect"] / scales[0] - rows[1]["effect"] / scales[1])
    assert diff["effect_a"] == pytest.approx(rows[0]["effect"]) and diff["n_items"] == 25
    assert diff["ci_high"] < 0


def test_an_rm_blind_to_the_groups_shows_no_effect_from_its_items_csv_either(tmp_path):
    """helper-164: every conversation rewarded float32(0.1), the identity battery's table in memory had effects 0
    and p 1, but recomputed from audit_items.csv (9 digits read back as float64) a group's mean of k equal rewards
    was 1e-17 off, all one sign: 30 of 52 rows had p 0.0005 and "survived" Holm. Both ways (and 0.1 written as
    float64), every effect is 0 with p 1."""
    from rmjax.audit import batteries
    from rmjax.audit.job import write_items

    built = batteries.build(["identity", "length"])  # the length battery: the identity rows' length-only null
    contrasts = [c for b in built for c in b.contrasts]
    variants = [v for b in built for v in b.variants]
    items = pd.DataFrame({"battery": [v.battery for v in variants], "axis": [v.axis for v in variants],
                          "item": [v.item for v in variants], "group": [v.group for v in variants],
                          "text": [v.response for v in variants], "prompt": [v.prompt for v in variants]})
    frames = []
    length = items["battery"] == "length"  # a real length slope there, no effect of the groups anywhere
    for constant in (float(np.float32(0.1)), 0.1):
        items["reward"] = np.where(length, items["text"].str.len() * 0.01, constant)
        write_items(tmp_path / "audit_items.csv", items)
        frames.append(read_items(tmp_path / "audit_items.csv"))
    # the job's frame: float32 rewards as float64
    frames.append(items.assign(reward=np.where(length, items["reward"], 0.1).astype(np.float32).astype(np.float64)))
    for frame in frames:
        table = stats.audit_table(frame, contrasts, n_boot=100, n_perm=500)
        table = table[table["battery"] == "identity"]
        assert len(table) > 20 and (table.effect == 0).all() and (table.p == 1).all(), table[table.effect != 0]
