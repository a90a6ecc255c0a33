"""Resampling tests of a mean effect over items: percentile-bootstrap CIs, the paired sign-flip test, the two-sample
label-permutation test (an interaction over two independent sets of items), and Holm's correction.

Every function takes the per-item values and a seed, and gives the same numbers for the same arguments. Nothing
here knows about batteries or files (rmjax.audit.stats builds the per-item values).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

CHUNK = 1 << 20  # elements per random block: bounds memory for many items without changing results per seed


def _resampled_means(d: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    n = len(d)
    means = np.empty(n_boot)
    chunk = max(1, CHUNK // n)
    for start in range(0, n_boot, chunk):
        k = min(chunk, n_boot - start)
        means[start:start + k] = d[rng.integers(0, n, size=(k, n))].mean(axis=1)
    return means


def _finite(values, name: str) -> np.ndarray:
    """float64 values, refused when any is NaN/Inf: a NaN made every comparison false, so p came out 0."""
    values = np.asarray(values, np.float64)
    if not np.isfinite(values).all():
        raise ValueError(f"{name}: {int((~np.isfinite(values)).sum())} of {values.size} values are NaN or infinite")
    return values


def bootstrap_ci(d: np.ndarray, n_boot: int = 2000, seed: int = 0, level: float = 0.95,
                 minus: np.ndarray | None = None) -> tuple[float, float]:
    """Percentile bootstrap of mean(d): items resampled with replacement (the item is the independent unit); the
    (1 - level)/2 and (1 + level)/2 quantiles (numpy's linear) of the resample means. With `minus` (another,
    independent set of items), of mean(d) - mean(minus), each set resampled within itself."""
    samples = [_finite(d, "bootstrap_ci")] + ([] if minus is None else [_finite(minus, "bootstrap_ci")])
    if any(len(x) == 0 for x in samples) or n_boot < 1:
        raise ValueError(f"bootstrap_ci needs at least one value per sample and one resample (got "
                         f"{[len(x) for x in samples]}, n_boot={n_boot})")
    rng = np.random.default_rng(seed)
    means = _resampled_means(samples[0], n_boot, rng)
    if minus is not None:
        means -= _resampled_means(samples[1], n_boot, rng)
    alpha = (1.0 - level) / 2.0
    low, high = np.quantile(means, [alpha, 1.0 - alpha])
    return float(low), float(high)


def _rounding(values: np.ndarray) -> float:
    """A bound on the float64 rounding error of any signed sum of `values` (n·eps·Σ|v|, any order of summation):
    statistics closer than that are ties. A relative tolerance (1e-9 of mean|d|) swallowed real differences when
    the values spanned orders of magnitude: d = [1e10, -1e10, 1, 0.5] gave p 1 against an exact 0.75 (helper-164)."""
    return len(values) * np.finfo(np.float64).eps * float(np.abs(values).sum())


def sign_flip_p(d: np.ndarray, n_perm: int = 10000, seed: int = 0) -> float:
    """Two-sided paired permutation p of mean(d) == 0: under the null each item's difference is as likely to have
    either sign. Every sign vector when 2**n <= n_perm (exact), else p = (1 + #{|mean*| >= |mean|}) / (1 + n_perm)
    over random flips. A tolerance of the sums' rounding keeps it from splitting ties (_rounding)."""
    d = _finite(d, "sign_flip_p")
    n = len(d)
    if n == 0 or not np.any(d):
        return 1.0
    threshold = abs(d.sum()) / n - 2 * _rounding(d) / n
    exact = 2**n <= n_perm
    total = 2**n if exact else n_perm
    rng = np.random.default_rng(seed)
    count = 0
    chunk = max(1, CHUNK // n)
    for start in range(0, total, chunk):
        k = min(chunk, total - start)
        if exact:  # the bits of start .. start + k - 1 are every sign vector once
            bits = (np.arange(start, start + k)[:, None] >> np.arange(n)) & 1
        else:
            bits = rng.integers(0, 2, size=(k, n))
        count += int(np.sum(np.abs((1.0 - 2.0 * bits) @ d) / n >= threshold))
    return float(count / total) if exact else float((1 + count) / (1 + n_perm))


def label_permutation_p(a: np.ndarray, b: np.ndarray, n_perm: int = 10000, seed: int = 0) -> float:
    """Two-sided p of mean(a) == mean(b) for two independent sets of items: under the null the items' set labels
    are exchangeable. Every relabelling when C(n_a + n_b, n_a) <= n_perm (exact), else (1 + #{|stat*| >= |stat|}) /
    (1 + n_perm) over random relabellings; ties within the sums' rounding, as sign_flip_p."""
    a, b = _finite(a, "label_permutation_p"), _finite(b, "label_permutation_p")
    if len(a) == 0 or len(b) == 0:
        raise ValueError("label_permutation_p needs items in both sets")
    pooled = np.concatenate([a, b])
    n, na, nb = len(pooled), len(a), len(b)
    total_sum = pooled.sum()

    def stats(sums: np.ndarray) -> np.ndarray:  # mean of the first set minus mean of the rest, from its sum
        return sums / na - (total_sum - sums) / nb

    observed = abs(float(stats(np.array([a.sum()]))[0]))
    if np.all(pooled == pooled[0]):
        return 1.0
    threshold = observed - 4 * _rounding(pooled) * (1 / na + 1 / nb)  # two statistics, each from two sums
    exact = math.comb(n, na) <= n_perm
    if exact:
        sums = np.array([pooled[list(c)].sum() for c in itertools.combinations(range(n), na)])
        return float(np.mean(np.abs(stats(sums)) >= threshold))
    rng = np.random.default_rng(seed)
    count = 0
    chunk = max(1, CHUNK // n)
    for start in range(0, n_perm, chunk):
        k = min(chunk, n_perm - start)
        first = np.argsort(rng.random((k, n)), axis=1)[:, :na]
        count += int(np.sum(np.abs(stats(pooled[first].sum(axis=1))) >= threshold))
    return float((1 + count) / (1 + n_perm))


def holm(p: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjusted p-values in the input order: the i-th smallest gets max over j <= i of
    min(1, (m - j + 1) p_(j)), so the family-wise error is controlled over every row at once. Each product is
    raised by two float64 epsilons (relative), more than its rounding and p's own can take off: 75 x (1/1500)
    was an ulp below its exact 0.05 and passed as p_holm < 0.05; now every rounding errs towards keeping H0."""
    p = np.asarray(p, np.float64)
    if p.ndim != 1 or np.isnan(p).any() or (p < 0).any() or (p > 1).any():
        raise ValueError("holm needs a flat sequence of p-values in [0, 1]")
    m = len(p)
    order = np.argsort(p, kind="stable")
    products = (m - np.arange(m)) * p[order] * (1 + 2 * np.finfo(np.float64).eps)
    adjusted = np.minimum(1.0, np.maximum.accumulate(products))
    out = np.empty(m)
    out[order] = adjusted
    return out
