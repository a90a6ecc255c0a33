"""Pure statistics: moments, rank correlations, RBO, MDS, RSA with a permutation test, OLS, Mann-Whitney.

Every function takes arrays or DataFrames and returns numbers or DataFrames; nothing reads or writes
files, so each can be checked against an independent reference on hand-made data.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
from scipy import stats


def moments(x: np.ndarray) -> dict[str, float]:
    """Mean, population variance (ddof=0) and biased skewness, as in the paper's Table of moments."""
    x = np.asarray(x, np.float64)
    return {"mean": float(x.mean()), "variance": float(x.var(ddof=0)),
            "skewness": float(stats.skew(x, bias=True))}


# a resample's variance at or below this share of its second raw moment is rounding (its mean's error, ~log2(n) ulp,
# squared): the resample is one repeated value
DEGENERATE = (64 * np.finfo(np.float64).eps) ** 2


def bootstrap_moments(x: np.ndarray, n_boot: int = 1000, confidence: float = 0.95, seed: int = 0) -> dict[str, float]:
    """`moments` plus percentile-bootstrap confidence intervals (resampling tokens with replacement).

    Keys: mean, variance, skewness and <each>_ci_low / <each>_ci_high (NaN under MIN_ITEMS tokens, the skewness
    too; the variance under 2). Resample b = 0 .. n_boot-1 is
    x[rng.integers(0, n, size=n)], drawn in that order from rng = np.random.default_rng(seed): the same seed
    gives the same intervals, byte for byte. The interval is the (1 - confidence)/2 and (1 + confidence)/2
    quantiles (numpy's default, linear) of the resamples' moments; a resample of one repeated value has no
    skewness (scipy: NaN) and the skewness interval is over the others (`skewness_resamples` counts them). Each
    resample's moments come from its own deviations (one gather per resample: ~4 ms for 256k tokens): power sums
    of the raw values gave a rounding-sized skewness of 1e8 when nearly every draw was one value.
    """
    x = np.asarray(x, np.float64)
    n = len(x)
    if n < MIN_ITEMS:  # one token's "interval" was its value twice, variance [0, 0]: no value, as a correlation's
        out = moments(x) if n else {"mean": np.nan, "variance": np.nan, "skewness": np.nan}
        out["skewness"] = np.nan  # two distinct values' is always 0
        if n < 2:
            out["variance"] = np.nan
        return out | {f"{name}_ci_{end}": np.nan for name in ("mean", "variance", "skewness")
                      for end in ("low", "high")} | {"skewness_resamples": 0}
    centre = x.mean()
    centred = x - centre
    rng = np.random.default_rng(seed)
    boot = np.empty((n_boot, 3))
    for b in range(n_boot):
        y = centred[rng.integers(0, n, size=n)]
        m1 = y.sum() / n
        d = y - m1
        d2 = d * d
        m2, m3 = d2.sum() / n, (d2 * d).sum() / n
        boot[b] = (centre + m1, m2, m3 / m2**1.5 if m2 > DEGENERATE * (m2 + m1 * m1) else np.nan)
    alpha = (1.0 - confidence) / 2.0
    out = moments(x)
    for j, name in enumerate(("mean", "variance", "skewness")):
        low, high = np.nanquantile(boot[:, j], [alpha, 1.0 - alpha]) if n_boot else (np.nan, np.nan)
        out[f"{name}_ci_low"], out[f"{name}_ci_high"] = float(low), float(high)
    out["skewness_resamples"] = int(np.isfinite(boot[:, 2]).sum())
    return out


def descending_ranks(x: np.ndarray) -> np.ndarray:
    """Rank 1 = highest value; ties get their average rank."""
    return stats.rankdata(-np.asarray(x, np.float64), method="average")


def z_scores(x: np.ndarray) -> np.ndarray:
    """(x - mean) / std with ddof=0; NaN for values of one value (`ranks_something`): their computed SD is not
    always 0 (three 0.1s have mean 0.1 + 1.4e-17), and 1.4e-17 / SD gave every item a z of -1."""
    x = np.asarray(x, np.float64)
    if not ranks_something(x):
        return np.full(x.shape, np.nan)
    return (x - x.mean()) / x.std(ddof=0)


# Fewer items give no correlation worth a value: two give +-1 whatever the models (helper-151: two shared strings
# wrote tau -1, EPIC distance 1 and an MDS layout), one none. Every correlation of the analyses is NaN below it.
MIN_ITEMS = 3


def _pairwise(frame: pd.DataFrame, fn) -> pd.DataFrame:
    """fn of every pair of columns; the diagonal 1, or NaN for a column of one value (as scipy gives for its pairs);
    all NaN over fewer than MIN_ITEMS rows."""
    cols = list(frame.columns)
    values = [frame[c].to_numpy(np.float64) for c in cols]
    if len(frame) < MIN_ITEMS:
        return pd.DataFrame(np.full((len(cols), len(cols)), np.nan), index=cols, columns=cols)
    out = np.diag([1.0 if ranks_something(v) else np.nan for v in values])
    for i, j in itertools.combinations(range(len(cols)), 2):
        out[i, j] = out[j, i] = fn(values[i], values[j])
    return pd.DataFrame(out, index=cols, columns=cols)


def ranks_something(values: np.ndarray) -> bool:
    """Whether the finite values hold two different ones: a correlation with one value is undefined."""
    values = np.asarray(values, np.float64)
    return np.unique(values[np.isfinite(values)]).size > 1


def kendall_tau_matrix(frame: pd.DataFrame) -> pd.DataFrame:
    """Kendall tau-b between every pair of columns (rows are the aligned items)."""
    return _pairwise(frame, lambda a, b: stats.kendalltau(a, b, variant="b").statistic)


def epic_distance(a: np.ndarray, b: np.ndarray) -> float:
    """The affine-invariant distance of two reward vectors over the same items (EPIC's Pearson distance, Gleave et
    al. 2021): sqrt((1 − r) / 2) of their Pearson r, i.e. the distance of the standardised rewards; 0 for rewards
    equal up to a positive affine map, 1 for opposite ones. Rank correlations (τ) ignore how far apart items are;
    this reads the scale each RM puts them on."""
    r = pearson(a, b)
    return float(np.sqrt(max(0.0, (1.0 - r) / 2.0))) if np.isfinite(r) else float("nan")


def pearson(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson's r; NaN where either side holds one value (as scipy says), which np.corrcoef reads as r = 0 when the
    mean rounds (a constant model then stood at EPIC distance 0.707 from every other), and over fewer than
    MIN_ITEMS items."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.size < MIN_ITEMS or not (ranks_something(a) and ranks_something(b)):
        return float("nan")
    return float(np.corrcoef(a, b)[0, 1])


def epic_distance_matrix(frame: pd.DataFrame) -> pd.DataFrame:
    """`epic_distance` between every pair of columns (0 on the diagonal, NaN for a column of one value)."""
    return 1.0 - _pairwise(frame, lambda a, b: 1.0 - epic_distance(a, b))


def spearman_matrix(frame: pd.DataFrame) -> pd.DataFrame:
    return _pairwise(frame, lambda a, b: stats.spearmanr(a, b).statistic)


def ranking(scores: pd.Series) -> list:
    """Items (the index) sorted by score, highest first; ties broken by the item itself, so the
    ranking does not depend on row order."""
    ordered = pd.DataFrame({"item": scores.index.astype(str), "score": scores.to_numpy(np.float64)})
    ordered = ordered.sort_values(["score", "item"], ascending=[False, True], kind="mergesort")
    return list(ordered["item"])


def rbo(ranking_a: Sequence, ranking_b: Sequence, p: float = 0.9, depth: int = 132) -> float:
    """Truncated rank-biased overlap (Webber, Moffat & Zobel 2010), the prefix sum at depth d:

        RBO@d = (1 - p) * sum_{k=1..d} p^(k-1) * |S[:k] & T[:k]| / k

    with no extrapolation of the unseen tail, so two identical rankings score 1 - p^d (0.99999990
    for p=0.9, d=132), not 1. Depth is capped at the shorter ranking.
    """
    depth = min(depth, len(ranking_a), len(ranking_b))
    seen_a: set = set()
    seen_b: set = set()
    overlap = 0
    total = 0.0
    for k in range(1, depth + 1):
        a, b = ranking_a[k - 1], ranking_b[k - 1]
        if a == b:
            overlap += 1
        else:
            overlap += (a in seen_b) + (b in seen_a)
        seen_a.add(a)
        seen_b.add(b)
        total += p ** (k - 1) * overlap / k
    return (1.0 - p) * total


def rbo_matrix(frame: pd.DataFrame, p: float = 0.9, depth: int = 132) -> pd.DataFrame:
    """RBO between every pair of columns; rankings are the index sorted by each column, descending. A column of one
    value ranks nothing (its order would be the tie-break's, alphabetical): NaN, as its rank correlations are."""
    rankings = {c: ranking(frame[c])[:depth] for c in frame.columns}
    cols = list(frame.columns)
    ranked = {c: frame[c].nunique() > 1 for c in cols}
    out = pd.DataFrame(np.eye(len(cols)), index=cols, columns=cols)
    for a, b in itertools.combinations(cols, 2):
        out.loc[a, b] = out.loc[b, a] = rbo(rankings[a], rankings[b], p, depth) if ranked[a] and ranked[b] else np.nan
    for c in cols:
        out.loc[c, c] = rbo(rankings[c], rankings[c], p, depth) if ranked[c] else np.nan
    return out


def mds_embedding(dissimilarity: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """2-D metric MDS of a precomputed dissimilarity matrix (rows = models), columns x and y.

    scikit-learn >= 1.8 spells `dissimilarity='precomputed'` as `metric='precomputed'`; the start is
    classical MDS, so the layout is reproducible.
    """
    from sklearn.manifold import MDS

    values = dissimilarity.to_numpy(np.float64)
    values = (values + values.T) / 2.0
    np.fill_diagonal(values, 0.0)
    if not values.any():  # every model at one point: scikit-learn divides 0 by 0 for 300 iterations to say so
        return pd.DataFrame(np.zeros((len(values), 2)), index=dissimilarity.index, columns=["x", "y"])
    mds = MDS(n_components=2, metric="precomputed", metric_mds=True, init="classical_mds", random_state=seed)
    coords = mds.fit_transform(values)
    return pd.DataFrame(coords, index=dissimilarity.index, columns=["x", "y"])


def upper_triangle(matrix: np.ndarray | pd.DataFrame) -> np.ndarray:
    matrix = np.asarray(matrix, np.float64)
    return matrix[np.triu_indices(len(matrix), k=1)]


# Each RSA theory matrix and the metadata column it is built from.
THEORY_FIELDS = {"same_base_model": "base_model", "same_developer": "developer",
                 "parameter_similarity": "parameters_b", "rewardbench_rank_similarity": "reward_bench_rank"}


def unknown_metadata(metadata: pd.DataFrame) -> dict[str, list[str]]:
    """Theory -> the models (rows of `metadata`) whose field it is built from is not given: '' or NaN. Two unknown
    base models compared equal ('' == ''), and a NaN rank gave rho NaN with p 0."""
    unknown = {}
    for theory, field in THEORY_FIELDS.items():
        values = metadata[field]
        missing = values.isna() if pd.api.types.is_numeric_dtype(values) else \
            values.isna() | (values.astype(str).str.strip() == "")
        if missing.any():
            unknown[theory] = [str(m) for m in metadata.index[missing.to_numpy()]]
    return unknown


def theoretical_similarities(metadata: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The paper's four RSA model matrices, as similarities between models (rows of `metadata`):
    same base [base_i == base_j]; same developer; parameters (1+|p_i-p_j|)^-1 (billions);
    RewardBench rank (1+|r_i-r_j|)^-1. Only those whose field every model has (`unknown_metadata`)."""
    labels = list(metadata.index)

    def frame(values: np.ndarray) -> pd.DataFrame:
        return pd.DataFrame(values.astype(np.float64), index=labels, columns=labels)

    base = metadata["base_model"].to_numpy()
    developer = metadata["developer"].to_numpy()
    params = metadata["parameters_b"].to_numpy(np.float64)
    rank = metadata["reward_bench_rank"].to_numpy(np.float64)
    unknown = unknown_metadata(metadata)
    return {name: matrix for name, matrix in {
        "same_base_model": frame(base[:, None] == base[None, :]),
        "same_developer": frame(developer[:, None] == developer[None, :]),
        "parameter_similarity": frame(1.0 / (1.0 + np.abs(params[:, None] - params[None, :]))),
        "rewardbench_rank_similarity": frame(1.0 / (1.0 + np.abs(rank[:, None] - rank[None, :]))),
    }.items() if name not in unknown}


def rsa_permutation_test(model_dissimilarity: np.ndarray, theory: np.ndarray, n_permutations: int = 10000,
                         seed: int = 0) -> dict[str, float]:
    """Spearman rho between the upper triangles of two model x model matrices, and a two-sided
    permutation p-value from relabelling the models (rows and columns of `theory` permuted together).

    When n! <= n_permutations every relabelling is enumerated (exact p); otherwise p = (1 + #{|rho*| >=
    |rho|}) / (1 + n_permutations) over random relabellings.
    """
    model_dissimilarity = np.asarray(model_dissimilarity, np.float64)
    theory = np.asarray(theory, np.float64)
    n = len(theory)
    iu = np.triu_indices(n, k=1)
    observed_x, observed_y = model_dissimilarity[iu], theory[iu]
    if not (np.isfinite(observed_x).all() and np.isfinite(observed_y).all()):  # rho NaN, and |rho*| >= NaN never
        raise ValueError("rsa_permutation_test: a matrix holds NaN/Inf; leave out what is not known.")
    if np.ptp(observed_x) == 0 or np.ptp(observed_y) == 0:
        return {"rho": float("nan"), "p_value": float("nan"), "n_permutations": 0, "exact": False}
    rho = float(stats.spearmanr(observed_x, observed_y).statistic)
    exact = math.factorial(n) <= n_permutations
    if exact:
        perms = np.array(list(itertools.permutations(range(n))))
    else:
        rng = np.random.default_rng(seed)
        perms = np.argsort(rng.random((n_permutations, n)), axis=1)
    permuted = theory[perms[:, :, None], perms[:, None, :]][:, iu[0], iu[1]]
    ranked_y = stats.rankdata(permuted, axis=1)
    ranked_x = stats.rankdata(observed_x)
    ranked_x = ranked_x - ranked_x.mean()
    ranked_y = ranked_y - ranked_y.mean(axis=1, keepdims=True)
    null = (ranked_y @ ranked_x) / (np.linalg.norm(ranked_y, axis=1) * np.linalg.norm(ranked_x))
    extreme = np.abs(null) >= abs(rho) - 1e-12
    p_value = float(extreme.mean()) if exact else float((1 + extreme.sum()) / (1 + len(null)))
    return {"rho": rho, "p_value": p_value, "n_permutations": int(len(null)), "exact": exact}


def ols(y: np.ndarray, predictors: dict[str, np.ndarray]) -> pd.DataFrame:
    """OLS of y on an intercept and `predictors`: coefficient and standard error (sigma^2 = RSS/(n-k)).

    Rows: intercept, then each predictor. Too few points or a rank-deficient design give NaN.
    """
    y = np.asarray(y, np.float64)
    names = ["intercept", *predictors]
    design = np.column_stack([np.ones_like(y), *(np.asarray(v, np.float64) for v in predictors.values())])
    n, k = design.shape
    nan = pd.DataFrame({"coef": np.nan, "se": np.nan}, index=names)
    if n <= k:
        return nan
    q, r = np.linalg.qr(design)
    if np.min(np.abs(np.diag(r))) < 1e-10 * max(1.0, np.max(np.abs(np.diag(r)))):
        return nan
    coef = np.linalg.solve(r, q.T @ y)
    residual = y - design @ coef
    sigma2 = residual @ residual / (n - k)
    r_inv = np.linalg.inv(r)
    se = np.sqrt(sigma2 * np.sum(r_inv**2, axis=1))
    return pd.DataFrame({"coef": coef, "se": se}, index=names)


def mann_whitney(x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """Two-sided Mann-Whitney U of x vs y, U for x, and the rank-biserial correlation 2U/(n_x n_y) - 1
    (+1: every x above every y)."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if len(x) == 0 or len(y) == 0:
        return {"u": float("nan"), "p_value": float("nan"), "rank_biserial": float("nan")}
    result = stats.mannwhitneyu(x, y, alternative="two-sided")
    u = float(result.statistic)
    return {"u": u, "p_value": float(result.pvalue), "rank_biserial": 2.0 * u / (len(x) * len(y)) - 1.0}
