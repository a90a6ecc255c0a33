"""The reward–perplexity frontier: which responses no other beats on both reward and judge perplexity, and the
area they dominate.

Points are (gain, perplexity), gain = sign·reward (higher is better in both directions) and perplexity lower
is better. The hypervolume is measured on (gain, −log perplexity) from a reference point both methods share.
"""

from __future__ import annotations

import numpy as np


def front(gain: np.ndarray, perplexity: np.ndarray) -> np.ndarray:
    """Indices of the points that no other point dominates (at least as good on both, better on one), by
    rising perplexity; of equal points the first. NaN points never enter."""
    gain, perplexity = np.asarray(gain, np.float64), np.asarray(perplexity, np.float64)
    ok = np.flatnonzero(np.isfinite(gain) & np.isfinite(perplexity))
    order = ok[np.lexsort((ok, -gain[ok], perplexity[ok]))]  # by perplexity, then the larger gain, then first
    kept, best = [], -np.inf
    for i in order:
        if gain[i] > best:
            kept.append(int(i))
            best = gain[i]
    return np.asarray(kept, np.int64)


def hypervolume(gain: np.ndarray, perplexity: np.ndarray, reference: tuple[float, float]) -> float:
    """Area dominated by the points on (gain, −log perplexity) above `reference` (gain, perplexity): the union
    of the rectangles from the reference to each point."""
    gain, perplexity = np.asarray(gain, np.float64), np.asarray(perplexity, np.float64)
    ref_gain, ref_fluency = reference[0], -np.log(reference[1])
    points = [(gain[i], -np.log(perplexity[i])) for i in front(gain, perplexity)
              if gain[i] > ref_gain and -np.log(perplexity[i]) > ref_fluency]
    points.sort(key=lambda p: -p[1])  # most fluent first: gains rise along the front
    area, covered = 0.0, ref_gain
    for g, f in points:
        if g > covered:
            area += (g - covered) * (f - ref_fluency)
            covered = g
    return float(area)


def spread(indices: np.ndarray, k: int) -> np.ndarray:
    """k of a front's indices evenly spaced along it, both ends kept; all of them when there are no more than k."""
    indices = np.asarray(indices, np.int64)
    if len(indices) <= k:
        return indices
    return indices[np.unique(np.linspace(0, len(indices) - 1, k).round().astype(np.int64))] if k else indices[:0]


def layers(gain: np.ndarray, perplexity: np.ndarray, k: int) -> np.ndarray:
    """k points taken layer by layer (NSGA-II's non-dominated sorting): the front, then the front of the points
    left, …; the last layer taken is spread to fit (both its ends kept where two fit). All of them when there are
    no more than k (NaN points never enter)."""
    gain, perplexity = np.asarray(gain, np.float64), np.asarray(perplexity, np.float64)
    left, taken = np.flatnonzero(np.isfinite(gain) & np.isfinite(perplexity)), []
    while len(left) and len(taken) < k:
        layer = left[front(gain[left], perplexity[left])]
        taken += spread(layer, k - len(taken)).tolist()
        left = np.setdiff1d(left, layer)
    return np.asarray(taken, np.int64)
