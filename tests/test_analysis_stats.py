"""Each statistic of rmjax.analysis.stats against an independent reference on small hand-made data."""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from rmjax.analysis import stats


def brute_force_tau_b(x, y) -> float:
    """Kendall tau-b by counting concordant, discordant and tied pairs."""
    concordant = discordant = ties_x = ties_y = 0
    n = len(x)
    for i in range(n):
        for j in range(i + 1, n):
            dx, dy = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
            if dx == 0 and dy == 0:
                ties_x += 1
                ties_y += 1
            elif dx == 0:
                ties_x += 1
            elif dy == 0:
                ties_y += 1
            elif dx == dy:
                concordant += 1
            else:
                discordant += 1
    n0 = n * (n - 1) / 2
    return (concordant - discordant) / math.sqrt((n0 - ties_x) * (n0 - ties_y))


def brute_force_rbo(s: list, t: list, p: float, depth: int) -> float:
    """RBO@d from its definition: (1-p) sum_k p^(k-1) |S[:k] & T[:k]| / k."""
    return (1 - p) * sum(p ** (k - 1) * len(set(s[:k]) & set(t[:k])) / k for k in range(1, depth + 1))


def test_moments_match_scipy_describe():
    x = np.array([0.5, 2.0, 2.0, 3.5, 9.0, -1.0, 4.25])
    described = scipy_stats.describe(x, ddof=0, bias=True)
    got = stats.moments(x)
    assert got["mean"] == pytest.approx(described.mean, rel=1e-12)
    assert got["variance"] == pytest.approx(described.variance, rel=1e-12)
    assert got["skewness"] == pytest.approx(described.skewness, rel=1e-12)
    assert got["skewness"] == pytest.approx(scipy_stats.skew(x, bias=True), rel=1e-12)


def test_bootstrap_intervals_agree_with_scipy_bootstrap():
    x = np.random.default_rng(1).gamma(2.0, size=400)
    got = stats.bootstrap_moments(x, n_boot=4000, seed=3)
    for name, fn in (("mean", np.mean), ("variance", np.var),
                     ("skewness", lambda v, axis=-1: scipy_stats.skew(v, bias=True, axis=axis))):
        ref = scipy_stats.bootstrap((x,), fn, n_resamples=4000, method="percentile", random_state=7,
                                    vectorized=True).confidence_interval
        width = ref.high - ref.low
        # two Monte Carlo estimates (other resamples): a 4000-resample percentile moves by a few % of the width
        assert got[f"{name}_ci_low"] == pytest.approx(ref.low, abs=0.12 * width)
        assert got[f"{name}_ci_high"] == pytest.approx(ref.high, abs=0.12 * width)
        assert got[f"{name}_ci_low"] < got[name] < got[f"{name}_ci_high"]


def redrawn_bootstrap_intervals(x: np.ndarray, n_boot: int, seed: int, confidence: float = 0.95) -> dict[str, float]:
    """The percentile intervals of the resamples stats.bootstrap_moments documents (x[rng.integers(0, n, size=n)]
    in order from default_rng(seed)), redrawn here, each resample's moments computed directly (numpy, scipy)."""
    rng = np.random.default_rng(seed)
    resamples = [x[rng.integers(0, len(x), size=len(x))] for _ in range(n_boot)]
    # a resample of one value has no skewness (scipy's own test for it misses some: -1.0 for 31 x 0.1)
    moments = np.array([(y.mean(), y.var(), scipy_stats.skew(y, bias=True) if np.ptp(y) > 0 else np.nan)
                        for y in resamples])
    alpha = (1 - confidence) / 2
    low, high = np.nanquantile(moments, [alpha, 1 - alpha], axis=0)
    names = ("mean", "variance", "skewness")
    return {**{f"{n}_ci_low": float(v) for n, v in zip(names, low, strict=True)},
            **{f"{n}_ci_high": float(v) for n, v in zip(names, high, strict=True)}}


@pytest.mark.parametrize("seed, confidence", [(3, None), (11, 0.8)])
def test_bootstrap_quantiles_are_those_of_the_same_resamples_redrawn(seed, confidence):
    """Mutants killed: the seed ignored (every --seed the same intervals) and the "95%" interval taken at 97.5%;
    the scipy comparison above allows 12% of the width and saw neither (None: the default level, 95%). Against
    the same resamples redrawn: equal but for float64 rounding (power sums of the centred data vs direct sums of
    400 values, ~n·u64 ~ 1e-13 relative)."""
    x = np.random.default_rng(1).gamma(2.0, size=400)
    level = {} if confidence is None else {"confidence": confidence}
    got = stats.bootstrap_moments(x, n_boot=300, seed=seed, **level)
    want = redrawn_bootstrap_intervals(x, 300, seed, **level)
    assert got == pytest.approx({**got, **want}, rel=1e-10, abs=0) and len(want) == 6
    other = stats.bootstrap_moments(x, n_boot=300, seed=seed + 1, **level)
    assert all(other[key] != got[key] for key in want)


@pytest.mark.parametrize("x", [[1.1, 2.3, 7.7], [-1.806] * 8 + [-0.484, 0.09], [0.1] * 30 + [0.3]])
def test_bootstrap_skewness_of_tied_data_leaves_out_one_value_resamples(x):
    """A resample that draws one value n times has no skewness (scipy: NaN); its variance came out a rounding
    error above 0, and m3 / m2^1.5 put the interval's end at 1e8 ([-0.71, 1.0e8] for three values)."""
    x = np.asarray(x)
    got = stats.bootstrap_moments(x, n_boot=1000, seed=0)
    want = redrawn_bootstrap_intervals(x, 1000, 0)
    assert got == pytest.approx({**got, **want}, rel=1e-9, abs=1e-12)
    assert abs(got["skewness_ci_high"]) < 10 and abs(got["skewness_ci_low"]) < 10
    rng = np.random.default_rng(0)  # the interval is over the resamples that have a skewness: counted
    assert got["skewness_resamples"] == sum(np.ptp(x[rng.integers(0, len(x), len(x))]) > 0 for _ in range(1000))


def test_kendall_tau_b_matrix_matches_pair_counting_with_ties():
    frame = pd.DataFrame({"a": [1, 2, 2, 3, 5, 5, 7, 0], "b": [2, 1, 3, 3, 4, 6, 6, 1],
                          "c": [9, 8, 8, 1, 2, 3, 0, 0]}, dtype=float)
    tau = stats.kendall_tau_matrix(frame)
    for a, b in itertools.combinations(frame.columns, 2):
        assert tau.loc[a, b] == pytest.approx(brute_force_tau_b(frame[a].to_numpy(), frame[b].to_numpy()), abs=1e-12)
        assert tau.loc[b, a] == tau.loc[a, b]
    assert np.allclose(np.diag(tau), 1.0)


def test_spearman_matrix_is_pearson_of_average_ranks():
    frame = pd.DataFrame({"a": [1, 2, 2, 3, 5, 4], "b": [6, 1, 3, 3, 4, 2], "c": [0, 1, 1, 2, 9, 9]}, dtype=float)
    rho = stats.spearman_matrix(frame)
    ranks = frame.rank(method="average")
    for a, b in itertools.combinations(frame.columns, 2):
        assert rho.loc[a, b] == pytest.approx(np.corrcoef(ranks[a], ranks[b])[0, 1], abs=1e-12)


def test_a_column_of_one_value_correlates_with_nothing_itself_included():
    """Its τ, ρ and EPIC distance with itself were 1, 1 and 0 beside NaN with every other column (fault hunt):
    scipy's τ and ρ of it with itself are NaN, as its RBO is."""
    frame = pd.DataFrame({"a": [1, 2, 2, 3, 5], "flat": [4, 4, 4, 4, 4], "b": [2, 1, 3, 3, 4]}, dtype=float)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy warns of the constant input it answers NaN for
        tau, rho = stats.kendall_tau_matrix(frame), stats.spearman_matrix(frame)
        epic = stats.epic_distance_matrix(frame)
        for column in frame.columns:
            assert np.isnan(scipy_stats.kendalltau(frame[column], frame[column]).statistic) == (column == "flat")
            for matrix, itself in [(tau, 1.0), (rho, 1.0), (epic, 0.0)]:
                if column == "flat":
                    assert matrix[column].isna().all() and matrix.loc[column].isna().all()
                else:
                    assert matrix.loc[column, column] == itself
    assert tau.loc["a", "b"] == pytest.approx(scipy_stats.kendalltau(frame["a"], frame["b"]).statistic, abs=1e-12)


@pytest.mark.parametrize("p,depth", [(0.9, 132), (0.9, 5), (0.5, 20)])
def test_rbo_matches_definition(p, depth):
    rng = np.random.default_rng(depth)
    items = [f"t{i}" for i in range(200)]
    for _ in range(5):
        s = list(rng.permutation(items))
        t = s[:30] + list(rng.permutation(s[30:])) if rng.random() < 0.5 else list(rng.permutation(items))
        assert stats.rbo(s, t, p, depth) == pytest.approx(brute_force_rbo(s, t, p, depth), abs=1e-12)
    assert stats.rbo(items, items, 0.9, 132) == pytest.approx(1 - 0.9**132, abs=1e-12)
    assert stats.rbo(items[:100], items[100:], 0.9, 132) == 0.0
    # depth stops at the shorter ranking: (1 - p) (1/1 + p 2/2) for a 3-item and a 2-item ranking that agree
    assert stats.rbo(["a", "b", "c"], ["a", "b"], 0.9, 132) == pytest.approx(0.1 * (1 + 0.9), abs=1e-12)


def test_rbo_matrix_ranks_by_score_descending_with_ties_by_string():
    index = ["d", "a", "c", "b", "e"]
    frame = pd.DataFrame({"m1": [5.0, 4.0, 4.0, 1.0, 0.0], "m2": [0.0, 1.0, 2.0, 3.0, 4.0]}, index=index)
    assert stats.ranking(frame["m1"]) == ["d", "a", "c", "b", "e"]
    assert stats.ranking(frame["m2"]) == ["e", "b", "c", "a", "d"]
    matrix = stats.rbo_matrix(frame, p=0.9, depth=3)
    expected = brute_force_rbo(["d", "a", "c", "b", "e"], ["e", "b", "c", "a", "d"], 0.9, 3)
    assert matrix.loc["m1", "m2"] == pytest.approx(expected, abs=1e-12)
    assert matrix.loc["m1", "m1"] == pytest.approx(1 - 0.9**3, abs=1e-12)


def test_mds_recovers_planar_distances():
    points = np.array([[0, 0], [1, 0], [0, 2], [3, 1], [-1, -1.5]], dtype=float)
    distances = np.linalg.norm(points[:, None] - points[None], axis=-1)
    labels = list("abcde")
    coords = stats.mds_embedding(pd.DataFrame(distances, index=labels, columns=labels))
    embedded = np.linalg.norm(coords.to_numpy()[:, None] - coords.to_numpy()[None], axis=-1)
    np.testing.assert_allclose(embedded, distances, atol=1e-3)  # SMACOF stops at a stress change of 1e-6: not exact
    assert list(coords.index) == labels and list(coords.columns) == ["x", "y"]


def test_mds_of_models_all_alike_puts_them_at_one_point_without_warnings():
    """Every dissimilarity 0 (two runs of one model): the embedding is one point; scikit-learn got there after 300
    iterations of 0/0 (a RuntimeWarning each)."""
    labels = list("abc")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        coords = stats.mds_embedding(pd.DataFrame(np.zeros((3, 3)), index=labels, columns=labels))
    assert (coords.to_numpy() == 0).all() and list(coords.index) == labels


def test_theoretical_similarities_follow_the_paper():
    meta = pd.DataFrame({"base_model": ["Llama", "Gemma", "Llama"], "developer": ["x", "x", "y"],
                         "parameters_b": [8.0, 27.0, 3.0], "reward_bench_rank": [10.0, 2.0, 19.0]},
                        index=["m1", "m2", "m3"])
    got = stats.theoretical_similarities(meta)
    np.testing.assert_array_equal(got["same_base_model"].to_numpy(), [[1, 0, 1], [0, 1, 0], [1, 0, 1]])
    np.testing.assert_array_equal(got["same_developer"].to_numpy(), [[1, 1, 0], [1, 1, 0], [0, 0, 1]])
    assert got["parameter_similarity"].loc["m1", "m2"] == pytest.approx(1 / 20)
    assert got["parameter_similarity"].loc["m1", "m3"] == pytest.approx(1 / 6)
    assert got["rewardbench_rank_similarity"].loc["m2", "m3"] == pytest.approx(1 / 18)


def _brute_force_rsa(dissimilarity: np.ndarray, theory: np.ndarray) -> tuple[float, float]:
    iu = np.triu_indices(len(theory), 1)
    rho = scipy_stats.spearmanr(dissimilarity[iu], theory[iu]).statistic
    null = [scipy_stats.spearmanr(dissimilarity[iu], theory[np.ix_(p, p)][iu]).statistic
            for p in itertools.permutations(range(len(theory)))]
    return rho, float(np.mean(np.abs(null) >= abs(rho) - 1e-12))


def _symmetric(rng: np.random.Generator, n: int) -> np.ndarray:
    a = rng.random((n, n))
    a = (a + a.T) / 2
    np.fill_diagonal(a, 0)
    return a


def test_rsa_exact_permutation_p_matches_brute_force():
    rng = np.random.default_rng(0)
    dissimilarity = _symmetric(rng, 5)
    base = np.array([0, 0, 1, 1, 1])
    theory = (base[:, None] == base[None]).astype(float)
    rho, p = _brute_force_rsa(dissimilarity, theory)
    got = stats.rsa_permutation_test(dissimilarity, theory, n_permutations=1000)
    assert got["exact"] and got["n_permutations"] == 120
    assert got["rho"] == pytest.approx(rho, abs=1e-12)
    assert got["p_value"] == pytest.approx(p, abs=1e-12)


def test_rsa_random_permutation_p_is_close_to_exact():
    rng = np.random.default_rng(5)
    dissimilarity = _symmetric(rng, 7)
    theory = 1.0 / (1.0 + np.abs(np.arange(7)[:, None] - np.arange(7)[None]))
    dissimilarity = dissimilarity + 3.0 * (1 - theory)  # a real association
    rho, p = _brute_force_rsa(dissimilarity, theory)
    got = stats.rsa_permutation_test(dissimilarity, theory, n_permutations=3000, seed=1)
    assert not got["exact"] and got["n_permutations"] == 3000
    assert got["rho"] == pytest.approx(rho, abs=1e-12)
    assert got["p_value"] == pytest.approx(p, abs=0.02)  # Monte Carlo: 3000 permutations, SE <= 0.009
    assert rho < 0 and p < 0.05


def test_rsa_random_permutation_p_is_never_zero():
    """A Monte Carlo p counts the observed labelling among the draws: (1 + #extreme) / (1 + draws), at least
    1 / (1 + draws) where no draw is as extreme (9 models: 9! labellings, 200 drawn)."""
    rng = np.random.default_rng(8)
    theory = 1.0 / (1.0 + np.abs(np.arange(9)[:, None] - np.arange(9)[None]))
    dissimilarity = 1.0 - theory + 1e-3 * _symmetric(rng, 9)  # ranked almost exactly as the theory
    got = stats.rsa_permutation_test(dissimilarity, theory, n_permutations=200, seed=0)
    assert not got["exact"] and got["rho"] < -0.95
    assert got["p_value"] == pytest.approx(1 / 201, rel=1e-12)


def test_ols_matches_lstsq_formula():
    rng = np.random.default_rng(2)
    x1, x2 = rng.normal(size=40), rng.normal(size=40)
    y = 1.5 + 2.0 * x1 - 0.7 * x2 + rng.normal(scale=0.5, size=40)
    design = np.column_stack([np.ones(40), x1, x2])
    beta, *_ = np.linalg.lstsq(design, y, rcond=None)
    residual = y - design @ beta
    sigma2 = residual @ residual / (40 - 3)
    se = np.sqrt(np.diag(sigma2 * np.linalg.inv(design.T @ design)))
    got = stats.ols(y, {"x1": x1, "x2": x2})
    np.testing.assert_allclose(got["coef"].to_numpy(), beta, rtol=1e-10)
    np.testing.assert_allclose(got["se"].to_numpy(), se, rtol=1e-10)
    simple = stats.ols(y, {"x1": x1})
    ref = scipy_stats.linregress(x1, y)
    assert simple.loc["x1", "coef"] == pytest.approx(ref.slope, rel=1e-10)
    assert simple.loc["x1", "se"] == pytest.approx(ref.stderr, rel=1e-10)
    assert simple.loc["intercept", "se"] == pytest.approx(ref.intercept_stderr, rel=1e-10)
    assert stats.ols(np.array([1.0, 2.0]), {"x": np.array([1.0, 2.0])})["coef"].isna().all()
    assert stats.ols(y, {"x": np.ones(40)})["se"].isna().all()  # collinear with the intercept


def test_mann_whitney_and_rank_biserial():
    x = np.array([3.0, 5.0, 5.0, 8.0, 9.0, 1.0])
    y = np.array([2.0, 5.0, 4.0, 0.0, 1.0])
    ref = scipy_stats.mannwhitneyu(x, y, alternative="two-sided")
    got = stats.mann_whitney(x, y)
    assert got["u"] == ref.statistic and got["p_value"] == pytest.approx(ref.pvalue)
    wins = sum(np.sign(a - b) for a in x for b in y)  # (#x>y - #x<y), ties count zero
    assert got["rank_biserial"] == pytest.approx(wins / (len(x) * len(y)), abs=1e-12)
    assert stats.mann_whitney(np.array([5.0, 6.0]), np.array([1.0, 2.0]))["rank_biserial"] == 1.0
    assert math.isnan(stats.mann_whitney(np.array([]), y)["p_value"])


def test_z_scores_and_descending_ranks():
    x = np.array([3.0, 1.0, 3.0, 7.0])
    np.testing.assert_allclose(stats.z_scores(x), scipy_stats.zscore(x, ddof=0))
    np.testing.assert_array_equal(stats.descending_ranks(x), [2.5, 4.0, 2.5, 1.0])


# One value three times: numpy's mean is 0.1 + 1.4e-17, so the computed SD is 1.4e-17, not 0 (checked below).
ONE_VALUE = np.full(3, 0.1)


def test_one_value_has_no_z_scores_and_no_correlation_even_when_its_sd_rounds_above_zero():
    """A model scoring every item alike: scipy calls its correlations undefined; numpy's rounding made its z-scores
    -1 everywhere and its Pearson r 0 (EPIC distance 0.707 from every model, beside a NaN diagonal)."""
    assert ONE_VALUE.std() > 0  # the premise: a test of `std == 0` would pass it
    other = np.array([1.0, 2.0, 3.0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy warns that the input is constant
        assert math.isnan(scipy_stats.pearsonr(ONE_VALUE, other).statistic)
        assert np.isnan(scipy_stats.zscore(np.full(3, 5.0))).all()  # scipy, where the mean is exact
    assert np.isnan(stats.z_scores(ONE_VALUE)).all()
    assert math.isnan(stats.pearson(ONE_VALUE, other)) and math.isnan(stats.pearson(other, ONE_VALUE))
    assert math.isnan(stats.epic_distance(ONE_VALUE, other))
    epic = stats.epic_distance_matrix(pd.DataFrame({"flat": ONE_VALUE, "b": other, "c": [3.0, 1.0, 2.0]}))
    assert epic.loc["flat"].isna().all() and epic["flat"].isna().all()
    assert epic.loc["b", "c"] == pytest.approx(np.sqrt((1 - scipy_stats.pearsonr(other, [3.0, 1.0, 2.0]).statistic)
                                                       / 2), abs=1e-12)
    assert stats.pearson(other, [3.0, 1.0, 2.0]) == pytest.approx(-0.5, abs=1e-12)


def test_theories_without_their_metadata_are_left_out():
    """A model without reward_bench_rank made its theory matrix NaN: rho NaN and p 0.0 (|rho*| >= NaN is never
    true) reached paper1_rsa.csv. Two models without base_model were the same base ('' == ''). A theory is now
    built only from metadata every model has, and the test refuses a NaN matrix."""
    meta = pd.DataFrame({"base_model": ["Llama", "", "Llama", ""], "developer": ["x", "x", "y", "z"],
                         "parameters_b": [8.0, 27.0, 3.0, 1.0], "reward_bench_rank": [10.0, 2.0, np.nan, 4.0]},
                        index=["m1", "m2", "m3", "m4"])
    assert stats.unknown_metadata(meta) == {"same_base_model": ["m2", "m4"], "rewardbench_rank_similarity": ["m3"]}
    assert sorted(stats.theoretical_similarities(meta)) == ["parameter_similarity", "same_developer"]
    theory = np.where(np.eye(4) > 0, 1.0, 0.5)
    theory[0, 1] = theory[1, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        stats.rsa_permutation_test(np.arange(16.0).reshape(4, 4), theory)


def test_fewer_than_three_items_correlate_nothing_and_three_are_scipys():
    """Two shared strings gave tau -1, Spearman -1, EPIC distance 1 and an MDS layout (helper-151), two items of the
    EloEverything list tau -1 beside the published models' thousands, two tokens a framing correlation of -1:
    docs/outputs.md says fewer than 3 items have no value. At 3 items each is scipy's."""
    from rmjax.analysis import elo, paper1
    from rmjax.analysis.data import ScoreTable

    two = pd.DataFrame({"a": [1.0, 2.0], "b": [2.0, 1.0]})
    for matrix in (stats.kendall_tau_matrix(two), stats.spearman_matrix(two), stats.epic_distance_matrix(two)):
        assert matrix.isna().all().all(), matrix
    assert np.isnan(stats.pearson(two.a, two.b))
    three = pd.DataFrame({"a": [1.0, 2.0, 4.0], "b": [2.0, 1.0, 3.0]})
    assert stats.kendall_tau_matrix(three).loc["a", "b"] == pytest.approx(
        scipy_stats.kendalltau(three.a, three.b).statistic, abs=1e-12)
    assert stats.pearson(three.a, three.b) == pytest.approx(scipy_stats.pearsonr(three.a, three.b).statistic, abs=1e-12)

    names = ["Love", "War", "Tea", "Sun"]
    items = pd.DataFrame({"elo_score": [4.0, 1.0, 3.0, 2.0], "elo_rank": [1, 4, 2, 3], "elo_matches": [9] * 4},
                         index=names)
    scores = pd.DataFrame({"two": [1.0, 2.0, np.nan, np.nan], "three": [1.0, 2.0, 0.5, np.nan]}, index=names)
    prompt = elo.EloPrompt("What is greatest?", "greatest", items, scores, user_models=("two", "three"))
    rows = elo.human_agreement([prompt]).set_index("model")
    assert rows.loc["two", ["kendall_tau", "kendall_p", "spearman_rho", "spearman_p"]].isna().all()
    reference = scipy_stats.kendalltau([4.0, 1.0, 3.0], [1.0, 2.0, 0.5])
    assert rows.loc["three", "kendall_tau"] == pytest.approx(reference.statistic, abs=1e-12)
    assert rows.loc["three", "kendall_p"] == pytest.approx(reference.pvalue, abs=1e-12)
    assert elo.tau_matrix(prompt).loc[elo.HUMAN, "two"] != elo.tau_matrix(prompt).loc[elo.HUMAN, "two"]  # NaN

    def table(n):
        frame = pd.DataFrame({"token_decoded": names[:n], "best": [1.0, 2.0, 4.0][:n], "worst": [2.0, 1.0, 3.0][:n]})
        return ScoreTable(f"m{n}", f"m{n}", frame, "token_decoded")

    correlations, _ = paper1.framing_tables([table(2), table(3)], k=1)
    correlations = correlations.set_index("model")
    assert correlations.loc["m2", ["pearson", "spearman", "kendall_tau"]].isna().all()
    assert correlations.loc["m3", "kendall_tau"] == pytest.approx(scipy_stats.kendalltau(
        [1.0, 2.0, 4.0], [2.0, 1.0, 3.0]).statistic, abs=1e-12)


def test_moments_of_fewer_than_three_tokens_have_no_interval():
    """A one-row score table was written with variance 0, mean CI [x, x] and variance CI [0, 0] (helper-155): a
    bootstrap of one value is that value. Under stats.MIN_ITEMS tokens every interval is NaN (as a correlation's),
    the variance and skewness of one token too; from 3 on, the percentile bootstrap runs (checked by hand-drawn
    resamples above)."""
    one = stats.bootstrap_moments(np.array([0.7055]), n_boot=200)
    assert one["mean"] == 0.7055 and np.isnan(one["variance"]) and np.isnan(one["skewness"])
    two = stats.bootstrap_moments(np.array([0.5, 1.5]), n_boot=200)
    assert two["mean"] == 1.0 and two["variance"] == 0.25 and np.isnan(two["skewness"])  # numpy's ddof=0 variance
    for got in (one, two):
        assert all(np.isnan(got[f"{m}_ci_{end}"]) for m in ("mean", "variance", "skewness") for end in ("low", "high"))
    three = stats.bootstrap_moments(np.array([0.5, 1.5, 4.0]), n_boot=200)
    assert three["mean_ci_low"] < three["mean_ci_high"] and np.isfinite(three["variance_ci_high"])
