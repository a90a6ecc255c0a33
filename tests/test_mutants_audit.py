"""Tests that kill the mutants the mutation pass over rmjax/audit (resampling, stats, compare) found surviving: each
names the mutant it kills and compares against an independent reference (every sign vector or relabelling listed
by itertools, a hand computation, an exact distribution's quantiles). Monte-Carlo bounds are derived from the number
of resamples: 5 standard errors of a quantile, or the order statistics 5 SDs either side of it."""

from __future__ import annotations

import itertools
import math
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rmjax.analysis.files import Outputs
from rmjax.audit import Contrast, stats
from rmjax.audit import batteries as battery_lib
from rmjax.audit.compare import AuditSection, run_analyses_with_audits
from rmjax.audit.job import folder_paths, write_items
from rmjax.errors import UsageError
from rmjax.runs import results

EPS32 = float(np.finfo(np.float32).eps)


# --- resampling: bootstrap_ci ------------------------------------------------------------------------------------


def test_a_bootstrap_of_many_items_in_several_blocks_is_the_normal_interval():
    """3000 items: CHUNK // n = 349 resamples per block, so 1000 resamples take three blocks. The resample mean is
    normal to a fraction of a percent (mean of 3000 normal values), so the CI is mean +- 1.96 s / sqrt(n); a sample
    quantile of B draws has SE sqrt(a (1 - a) / B) / density, and 5 of those bound it. Kills
    `means[start:start + k]` -> `means[:k]` (later blocks overwrote the first, the rest never written)."""
    d = np.random.default_rng(3).normal(3.0, 1.0, 3000)
    s = d.std() / math.sqrt(len(d))
    low, high = stats.bootstrap_ci(d, n_boot=1000, seed=1)
    tol = 5 * math.sqrt(0.025 * 0.975 / 1000) * s / (math.exp(-1.96**2 / 2) / math.sqrt(2 * math.pi))
    assert abs(low - (d.mean() - 1.96 * s)) < tol and abs(high - (d.mean() + 1.96 * s)) < tol
    assert tol < 0.5 * s


@pytest.mark.parametrize("call", [lambda: stats.bootstrap_ci(np.zeros(0)),
                                  lambda: stats.bootstrap_ci(np.ones(3), minus=np.zeros(0)),
                                  lambda: stats.bootstrap_ci(np.ones(3), n_boot=0)])
def test_a_bootstrap_of_nothing_is_refused(call):
    """An empty sample (either one) or no resample is a ValueError naming what it needs. Kills dropping
    `any(len(x) == 0 ...)` (a ZeroDivisionError) and `n_boot < 1` -> `n_boot < 0`."""
    with pytest.raises(ValueError, match="at least one value per sample and one resample"):
        call()


# --- resampling: sign_flip_p -------------------------------------------------------------------------------------


def all_signs_p(d) -> float:
    """Fraction of the 2**n sign vectors (itertools) whose |sum| reaches |sum(d)|, for integer d (exact)."""
    d = np.asarray(d, np.int64)
    signs = np.array(list(itertools.product((1, -1), repeat=len(d))), np.int64)
    return float(np.mean(np.abs(signs @ d) >= abs(int(d.sum()))))


def test_the_exact_sign_flip_test_over_several_blocks_lists_every_sign_vector():
    """17 items and n_perm = 2**17: exact, in blocks of CHUNK // 17 = 61680 sign vectors (three of them). Kills the
    block's bits taken from `np.arange(0, k)` instead of `np.arange(start, start + k)` (the first vectors again)."""
    d = np.array([3, -1, 2, 2, -2, 1, 1, 4, -3, 1, 2, -1, 0, 2, 1, -2, 1])
    want = all_signs_p(d)
    assert 0.01 < want < 0.5
    assert stats.sign_flip_p(d.astype(float), n_perm=2**17) == pytest.approx(want, abs=1e-15)


def test_the_sign_flip_tie_tolerance_is_relative_to_the_values():
    """Values of order 1e-12 are as good as any: their p is the brute-force one of the integers they scale. Kills the
    tolerance `1e-9 * mean|d|` -> `1e-9` (every flip reached such a small mean: p 1)."""
    d = np.array([1, 1, 1, 1, 2, -2, 3, 0])
    assert stats.sign_flip_p(d * 1e-12) == pytest.approx(all_signs_p(d), abs=1e-15)
    assert all_signs_p(d) < 0.5


@pytest.mark.parametrize("test", [lambda seed: stats.sign_flip_p(np.random.default_rng(5).normal(0.4, 1, 30),
                                                                 n_perm=500, seed=seed),
                                  lambda seed: stats.label_permutation_p(np.random.default_rng(6).normal(-0.5, 1, 20),
                                                                         np.random.default_rng(7).normal(0, 1, 20),
                                                                         n_perm=500, seed=seed)])
def test_a_monte_carlo_p_draws_from_its_seed(test):
    """Five seeds give more than one p: a Monte-Carlo p of 500 draws near 0.3 has SD 0.02 (a count's SD 10), so five
    equal ones would be a ~1e-6 coincidence. Kills `default_rng(seed)` -> `default_rng(0)` in sign_flip_p and in
    label_permutation_p."""
    ps = {test(seed) for seed in range(5)}
    assert len(ps) > 1 and all(0.1 < p < 0.9 for p in ps), ps  # moderate p's: not all at the floor 1/501


# --- resampling: label_permutation_p -----------------------------------------------------------------------------


def all_relabellings_p(a, b) -> float:
    """Fraction of the C(n, n_a) relabellings (itertools) whose |mean difference| reaches the observed one."""
    pooled = np.concatenate([a, b])
    n, na = len(pooled), len(a)
    first = np.array(list(itertools.combinations(range(n), na)))
    sums = pooled[first].sum(axis=1)
    gaps = np.abs(sums / na - (pooled.sum() - sums) / (n - na))
    return float(np.mean(gaps >= abs(np.mean(a) - np.mean(b)) - 1e-12))


def test_label_permutation_p_is_exact_at_n_perm_relabellings_and_two_sided():
    """C(8, 4) = 70 relabellings with n_perm = 70: exact. a below b has the p of b above a. Kills
    `comb <= n_perm` -> `<` and `observed = abs(...)` -> without abs (a first set below the second: p 1)."""
    a, b = np.array([0.5, -1.0, 0.25, -0.75]), np.array([1.5, 2.0, 0.75, 1.25])
    want = all_relabellings_p(a, b)
    assert 0 < want < 0.1
    assert stats.label_permutation_p(a, b, n_perm=70) == pytest.approx(want, abs=1e-15)
    assert stats.label_permutation_p(b, a, n_perm=70) == pytest.approx(want, abs=1e-15)


def test_label_permutation_p_needs_items_in_the_first_set_too():
    """Kills dropping `len(a) == 0` (an empty first set gave p 0)."""
    with pytest.raises(ValueError, match="both sets"):
        stats.label_permutation_p(np.zeros(0), np.array([0.5, 1.0, 2.0]))


# --- resampling: holm --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("p", [[0.1, -0.01], [0.2, 1.5], [[0.1, 0.2]]])
def test_holm_refuses_what_is_not_a_flat_list_of_probabilities(p):
    """Kills dropping `(p < 0).any()`, `(p > 1).any()` and `p.ndim != 1`."""
    with pytest.raises(ValueError, match="flat sequence of p-values in"):
        stats.holm(p)


# --- stats: items, the length null, the shuffled null ------------------------------------------------------------


COLUMNS = list(stats.ITEM_COLUMNS)


def two_group_items(x_rewards, y_rewards, battery="b", axis="ax") -> pd.DataFrame:
    """Items i0, i1, ... of (battery, axis), each with one variant of group x and one of group y."""
    return pd.DataFrame([(battery, axis, f"i{i}", g, f"answer {g}{i}", float(r), "a prompt") for i, pair in
                         enumerate(zip(x_rewards, y_rewards, strict=True))
                         for g, r in zip(("x", "y"), pair, strict=True)], columns=COLUMNS)


XY = Contrast("b", "ax", ("x",), ("y",), "shuffled")


def test_an_items_frame_without_a_column_or_with_an_infinite_reward_is_refused():
    """A frame without its prompt column, or with an infinite reward, is refused; a contrast naming no group has no
    item. Kills dropping the missing-column check (a KeyError), the non-finite reward check (an inf reward read) and
    `not needed` (every item, with a NaN difference)."""
    items = two_group_items([1.0, 2.0], [0.0, 0.5])
    d, lengths, ids = stats.item_differences(items, Contrast("b", "ax", (), (), "shuffled"))
    assert (len(d), len(lengths), ids) == (0, 0, [])
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['prompt'\]"):
        stats.group_means(items.drop(columns="prompt"), "b", "ax")
    with pytest.raises(ValueError, match="non-finite rewards"):
        stats.group_means(items.assign(reward=[1.0, np.inf, 0.0, 0.5]), "b", "ax")


def filler(padded_chars: tuple[int, int]) -> pd.DataFrame:
    """The length battery's concise (10 and 20 characters, rewards 1 and 0) and padded renderings (rewards 2, 1)."""
    return pd.DataFrame([("length", "renderings", f"q{i}", g, "x" * n, r, "question") for i, (c, p) in
                         enumerate(zip((10, 20), padded_chars, strict=True))
                         for g, n, r in (("concise", c, 1.0 - i), ("padded_neutral", p, 2.0 - i))], columns=COLUMNS)


def test_filler_that_adds_no_characters_gives_no_slope():
    """The slope is Σ gained / Σ added characters: 2 / (20 + 40) by hand; none when the padding adds 0 characters or
    fewer. Kills `added > 0` -> `added >= 0` (a ZeroDivisionError) and -> `added != 0` (a slope per character
    removed)."""
    assert stats.filler_slope(filler((30, 60))) == pytest.approx(2 / 60, rel=1e-15)
    assert stats.filler_slope(filler((10, 20))) is None
    assert stats.filler_slope(filler((5, 15))) is None


def test_an_interactions_length_null_when_only_its_first_axis_changes_length():
    """Top answers' good wording is 6 and 8 characters longer than the bad one, bottom answers' never longer: the
    null is the slope (2 / 60) times (7 - 0). With no bottom item at all there is no null to give. Kills
    `all(not np.any(x) ...)` -> `any(...)` (0 whenever one axis keeps its lengths) and dropping
    `not np.isfinite(mean_length)` (a NaN null)."""
    rows = [("framing", axis, f"{axis}{i}", g, "y" * n, r, f"{g} prompt")
            for axis, gaps in (("top", (6, 8)), ("bottom", (0, 0))) for i, gap in enumerate(gaps)
            for g, n, r in (("good", 10 + gap, 1.0 + i), ("bad", 10, 0.5 * i))]
    items = pd.concat([filler((30, 60)), pd.DataFrame(rows, columns=COLUMNS)], ignore_index=True)
    contrast = Contrast("framing", "top", ("good",), ("bad",), "length", minus_axis="bottom")
    assert stats.length_null(items, contrast) == pytest.approx(2 / 60 * 7, rel=1e-12)
    with pytest.raises(ValueError, match="of framing/top minus middle 'good vs bad' has a set of items with no"):
        stats.length_null(items, Contrast("framing", "top", ("good",), ("bad",), "length", minus_axis="middle"))


def test_the_shuffled_null_is_the_quantile_it_is_asked_for():
    """Two groups of one variant each: a shuffle swaps an item's two rewards or not, so |effect| over the shuffles is
    |mean of d_i with random signs|, whose exact distribution lists all 2**10 sign vectors. The median of 4000
    shuffles lies between that distribution's 0.5 -+ 5 SD quantiles, SD sqrt(0.25 / 4000). Kills `quantile` ->
    `0.95` (the argument ignored)."""
    rng = np.random.default_rng(11)
    x, y = rng.normal(0.3, 1, 10), rng.normal(0, 1, 10)
    signs = np.array(list(itertools.product((1, -1), repeat=10)))
    exact = np.abs(signs @ (x - y) / 10)
    band = 5 * math.sqrt(0.25 / 4000)
    low, high = np.quantile(exact, [0.5 - band, 0.5 + band], method="inverted_cdf")
    assert high < np.quantile(exact, 0.9)
    assert low <= stats.shuffled_null(two_group_items(x, y), XY, n_shuffle=4000, seed=0, quantile=0.5) <= high


def test_the_shuffled_null_reads_only_complete_items_and_needs_one():
    """An item lacking y adds nothing (neither weights nor draws): the null is the one without it. Without a
    complete item it is refused. Kills dropping `rows["item"].isin(ids)` and the `if not ids` refusal."""
    items = two_group_items([1.0, 2.0, 0.5, 3.0], [0.0, 0.5, 1.5, 1.0])
    partial = pd.concat([items, pd.DataFrame([("b", "ax", "i9", "x", "answer x9", 9.0, "a prompt")], columns=COLUMNS)])
    assert stats.shuffled_null(partial, XY, n_shuffle=200) == stats.shuffled_null(items, XY, n_shuffle=200)
    with pytest.raises(ValueError, match="no complete item"):
        stats.shuffled_null(items[items["group"] == "x"], XY, n_shuffle=200)


def test_an_interaction_with_a_shuffled_null_is_refused():
    """Kills dropping `(c.minus_axis and c.null != "length")` (two axes' items have no within-item shuffle)."""
    items = pd.concat([two_group_items([1.0, 2.0], [0.0, 0.5]), two_group_items([1.0, 2.0], [0.0, 0.5], axis="bx")])
    with pytest.raises(ValueError, match=r"null 'shuffled'.*an interaction: length"):
        stats.audit_table(items, [Contrast("b", "ax", ("x",), ("y",), "shuffled", minus_axis="bx")])


# --- stats: reward_scale and compare_models ----------------------------------------------------------------------


def test_rewards_apart_by_a_subnormal_have_no_spread():
    """0 and 1e-320 are two values, but their SD is 0 in float64 (the squared deviations underflow): no scale.
    Kills `scale <= 0` -> `scale < 0` (a scale of 0, every standardised difference infinite)."""
    items = two_group_items([0.0, 1e-320], [0.0, 0.0])
    assert items["reward"].nunique() == 2 and items["reward"].std(ddof=1) == 0.0
    with pytest.raises(ValueError, match="no spread"):
        stats.reward_scale(items)


def test_differences_within_twice_64_float32_ulps_are_rounding():
    """Two models with scale 1 and largest |reward| 1 whose x rewards differ by 96 float32 ulps: each model's
    rounding allowance is 64 ulps of its largest standardised reward, and a difference within their sum is 0
    (difference 0, CI [0, 0], p 1); 160 ulps is a difference (the mean -160 ulps). Kills the allowance
    `roundoff[a] + roundoff[b]` -> `roundoff[a]` and `64 * REWARD_EPS` -> `1 * REWARD_EPS`."""
    x = np.random.default_rng(12).uniform(-0.5, 0.5, 10)
    y = np.r_[1.0, np.random.default_rng(13).uniform(-0.5, 0.5, 9)]
    scales = {"a": 1.0, "b": 1.0}
    for ulps, want in ((96, 0.0), (160, -160 * EPS32)):
        models = {"a": two_group_items(x, y), "b": two_group_items(x + ulps * EPS32, y)}
        row = stats.compare_models(models, [XY], n_boot=200, n_perm=2000, scales=scales).iloc[0]
        assert row["difference_sd"] == pytest.approx(want, rel=1e-6, abs=0)
        assert (row["ci_low"], row["ci_high"]) == pytest.approx((want, want), rel=1e-6, abs=0)
        assert row["p"] == (1.0 if want == 0 else 2 / 2**10)  # exact: only the all-+ and all-- sign vectors


def test_a_model_whose_rounding_allowance_is_most_of_an_sd_is_not_compared():
    """helper-151: rewards 1000 +- 0.003 have an allowance of 2.6 SD (64 float32 ulps of 1000), and a real +1.57 SD
    difference per item was written as 0 (CI [0, 0], p 1). A model whose allowance passes MAX_ROUNDOFF_SD is refused;
    one just inside it is compared (its difference then stands: 2 SD per item, far above the allowance)."""
    x = np.random.default_rng(15).uniform(-0.5, 0.5, 10)
    y = np.r_[1.0, np.random.default_rng(16).uniform(-0.5, 0.5, 9)]
    limit = stats.MAX_ROUNDOFF_SD / (64 * EPS32)  # largest |reward| over the scale at the allowance's limit
    for largest, refused in ((1.01 * limit, True), (0.99 * limit, False)):
        ya = np.r_[largest, y[1:]]  # scale 1 given: the largest |reward| alone sets the allowance
        models = {"a": two_group_items(x + 2.0, ya), "b": two_group_items(x, y)}
        call = partial(stats.compare_models, models, [XY], n_boot=200, n_perm=2000, scales={"a": 1.0, "b": 1.0})
        if refused:
            with pytest.raises(ValueError, match="'s rewards lie up to .* cannot be compared"):
                call()
        else:
            assert call().iloc[0]["difference_sd"] == pytest.approx(2.0 - (largest - 1.0) / 10, rel=1e-9)


def test_compare_models_needs_two_shared_items_and_draws_from_its_seed():
    """One item in both models is refused as too few; seeds 0 and 1 draw other bootstrap resamples (the CI bounds
    of 200 resamples of 10 continuous values differ). Kills `len(common) < 2` -> `< 1` and the row seeds taken
    from seed 0 whatever `seed` is."""
    x, y = np.random.default_rng(14).normal(size=(2, 10))
    models = {"a": two_group_items(x, y), "b": two_group_items(x[:1], y[:1])}
    with pytest.raises(ValueError, match=r"has 1 item\(s\) with every group it needs in both 'a' and 'b'"):
        stats.compare_models(models, [XY], n_boot=100, n_perm=100)
    models = {"a": two_group_items(x, y), "b": two_group_items(y, x)}
    rows = [stats.compare_models(models, [XY], n_boot=200, n_perm=200, seed=seed).iloc[0] for seed in (0, 1)]
    assert rows[0]["difference_sd"] == rows[1]["difference_sd"]
    assert (rows[0]["ci_low"], rows[0]["ci_high"]) != (rows[1]["ci_low"], rows[1]["ci_high"])


def test_models_that_scored_other_variants_are_named_by_the_first_one_that_differs():
    """Item i1's y text is another in b: the message shows that variant of each model, not the item's first. Kills
    `ra[k]` -> `ra[0]`."""
    x, y = np.random.default_rng(15).normal(size=(2, 4))
    other = two_group_items(x, y)
    other.loc[(other["item"] == "i1") & (other["group"] == "y"), "text"] = "another answer"
    with pytest.raises(ValueError, match=r"item 'i1': \(group, text, prompt\) \('y', 'answer y1', 'a prompt'\) vs "
                                         r"\('y', 'another answer', 'a prompt'\)"):
        stats.compare_models({"a": two_group_items(x, y), "b": other}, [XY], n_boot=100, n_perm=100)


# --- compare: audits side by side --------------------------------------------------------------------------------


SHARED = ["length", "sycophancy", "framing"]  # 5 + 3 + 15 = 23 rows


def battery_items(sign: float, seed: int) -> pd.DataFrame:
    """The batteries' real variants with made-up rewards: 2**rank of the group within its axis (twice that for top
    answers, so framing's interactions are not 0), times `sign`, plus noise of SD 0.01: every contrast's items
    differ alike, far beyond the noise."""
    rng = np.random.default_rng(seed)
    variants = [v for b in battery_lib.build(SHARED) for v in b.variants]
    groups = {}
    for v in variants:
        groups.setdefault((v.battery, v.axis), set()).add(v.group)

    def reward(v) -> float:
        top = 2.0 if v.axis.startswith("top") else 1.0
        return sign * top * 2.0 ** sorted(groups[v.battery, v.axis]).index(v.group) + rng.normal(0, 0.01)

    return pd.DataFrame([(v.battery, v.axis, v.item, v.group, v.response, reward(v), v.prompt) for v in variants],
                        columns=COLUMNS)


def audit_folder(path: Path, items: pd.DataFrame, model: str) -> str:
    """A finished audit's folder as experiments.audit writes it (audit_items.csv, audit.csv, .meta.json with the
    files' digests and the identity of what scored), from items instead of a model. Its audit.csv, which the
    section only shows beside the others, is a stand-in: the batteries' rows with 0 in every number."""
    path.mkdir()
    paths = folder_paths(path)
    write_items(paths["items"], items)
    contrasts = [c for b in battery_lib.build(list(dict.fromkeys(items["battery"]))) for c in b.contrasts]
    results.write_table(paths["csv"], {"battery": [c.battery for c in contrasts],
                                       "axis": [c.row_axis for c in contrasts],
                                       "contrast": [c.name for c in contrasts], "n_items": [0] * len(contrasts)},
                        {k: np.zeros(len(contrasts)) for k in stats.AUDIT_COLUMNS[4:]})
    results.write_meta(paths["csv"], [paths["items"]], kind="audit", model=model,
                       identity={"job": "audit", "model": model, "output_column": 0, "template": "chat",
                                 "dtype": "float32", "stats": {"n_boot": 100, "n_perm": 100, "seed": 0}})
    return str(path)


@pytest.fixture(scope="module")
def audits(tmp_path_factory):
    """Two models' audits of the three batteries: b's rewards are a's mirrored, so every row differs."""
    root = tmp_path_factory.mktemp("audits")
    items = {"a": battery_items(1.0, 0), "b": battery_items(-1.0, 1)}
    return root, items, {name: audit_folder(root / name, frame, f"rm-{name}") for name, frame in items.items()}


def test_analyze_reports_the_rows_holm_keeps_with_its_settings(audits, tmp_path):
    """run_analyses_with_audits with seed 3, 459 permutations and 100 resamples: the report states them. Every item
    of every row differs one way, far beyond the noise, so no random sign vector or relabelling reaches the observed
    difference: every p is (1 + 0) / (1 + 459) = 1/460 (< 0.05), and Holm over 23 rows makes each 23/460 = 0.05
    exactly (in float64 too), which is not below 0.05: no row is kept. Every battery is shared (no note of one left
    out) and both audits took the same settings. Kills `seed=cfg.seed` dropped, the rows kept by `p` instead of
    `p_holm`, `p_holm < 0.05` -> `<= 0.05`, a note of left-out batteries for a model with none, and `alike` ->
    False."""
    from rmjax.analysis.spec import AnalysisConfig

    _, _, folders = audits
    cfg = AnalysisConfig(audits=(folders["a"], folders["b"]), n_boot=100, n_permutations=459, seed=3)
    found = run_analyses_with_audits(cfg, tmp_path / "analysis", echo=False)
    report = Path(found["report"]).read_text()
    diff = pd.read_csv(found["tables"]["audit_differences"], keep_default_na=False)
    assert len(diff) == 23 and diff["p"].to_numpy() == pytest.approx(np.full(23, 1 / 460), rel=1e-8)  # 9 digits
    assert (diff["p_holm"] == 0.05).all()
    assert "The differences (audit_differences.csv): 100 bootstrap resamples, 459 permutations, seed 3, Holm over " \
           "23 rows." in report
    assert "23 paired differences over shared items, 0 with p_holm < 0.05" in report and "| battery |" not in report
    # and it says none could, and from which --n_permutations one can: 23 / 461 < 0.05 <= 23 / 460
    assert "no row can reach p_holm < 0.05 with --n_permutations=459" in report, report
    assert "give --n_permutations=460 or more" in report
    assert "not in every audit" not in report
    assert "with the same settings: 100 bootstrap resamples, 100 permutations, seed 0, Holm over 23 rows." in report


def test_the_report_lists_the_first_twenty_rows_holm_keeps(audits, tmp_path):
    """With n_perm = 999 all 23 rows are kept, and the report's table lists the first 20. Kills
    dropping the table of kept rows and `.head(20)` -> `.head(5)`."""
    _, _, folders = audits
    section = AuditSection([folders["a"], folders["b"]], n_boot=100, n_perm=999)
    # every row differs one way (above): each p is 1 / 1000, Holm's 23 / 1000 < 0.05, so all 23 are kept
    assert (section.differences["p"] == 1 / 1000).all()
    kept = int((section.differences["p_holm"] < 0.05).sum())
    assert kept == 23
    outputs = Outputs(tmp_path / "analysis")
    section(outputs)
    text = "\n".join(outputs.lines)
    assert f"23 paired differences over shared items, {kept} with p_holm < 0.05" in text
    table = text[text.index("| battery |"):].splitlines()
    assert len([line for line in table if line.startswith("| ")]) == 1 + 20


def test_audits_of_other_texts_or_of_no_shared_battery_are_refused(audits, tmp_path):
    """An audit whose one length answer reads otherwise holds other conversations; audits of framing alone and of
    length alone share no battery. Kills `text` dropped from the conversations' keys (the pair then refused only as
    scoring other variants) and dropping the `not shared` refusal."""
    _, items, folders = audits
    edited = items["a"].copy()
    edited.loc[edited.index[edited["battery"] == "length"][0], "text"] = "Another answer."
    with pytest.raises(UsageError, match="hold different conversations in the batteries both ran"):
        AuditSection([folders["a"], audit_folder(tmp_path / "edited", edited, "rm-edited")], n_boot=100, n_perm=100)
    alone = [audit_folder(tmp_path / b, items["a"][items["a"]["battery"] == b], f"rm-{b}")
             for b in ("framing", "length")]
    with pytest.raises(UsageError, match="share no battery"):
        AuditSection(alone, n_boot=100, n_perm=100)
