"""Tests that kill the mutants issue 42's campaign found surviving or only narrowly killed: each states the mutant
it kills and compares against an independent reference (float64 numpy, a redrawn bootstrap, a brute-force count)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from rmjax.nn import ops
from tests.tolerance import U32

BF16 = ml_dtypes.bfloat16
HIDDEN = 2048


def _bf16_roundings(exact: np.ndarray, slack: float) -> tuple[np.ndarray, np.ndarray]:
    """The bfloat16 values a computation of `exact` (float64) rounded once to bf16 may give: the nearest one, and
    where `exact` lies within `slack` ulp of the midpoint between its two neighbours (a float32 computation's own
    error can put it on either side), the other neighbour too. Returns (nearest, other or nearest) as float64."""
    f32 = exact.astype(np.float32)  # within 2^-24: only moves a value lying next to a bf16 value, never a midpoint
    toward_zero = (f32.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
    away = (toward_zero.view(np.uint32) + np.uint32(0x10000)).view(np.float32)
    low, high = toward_zero.astype(np.float64), away.astype(np.float64)
    from_mid = np.abs(exact - (low + high) / 2) / np.abs(high - low)
    nearest = np.where(np.abs(exact - low) <= np.abs(exact - high), low, high)
    other = np.where(nearest == low, high, low)
    return nearest, np.where(from_mid < slack, other, nearest)


def _rms_norm_bf16_allowed(x: np.ndarray, w: np.ndarray, eps: float, plus_one: bool) -> list[np.ndarray]:
    """Every bf16 output a correct bf16 RMSNorm may give per element, from float64 math: transformers' order
    (Gemma: normalize and scale by (1 + w) in float32, one rounding; Llama: normalize in float32, round to bf16,
    then w * that, rounded). A float32 evaluation of the mean of H squares, the rsqrt and the scaling is off by at
    most (H + 8)·u32 relative, i.e. (H + 8)·u32·2^8 bf16 ulps (a bf16 ulp is >= 2^-8 of the value): within that
    of a rounding midpoint either neighbour is right."""
    slack = (x.shape[-1] + 8) * U32 * 2.0**8
    h = x.astype(np.float64)
    h = h / np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + eps)
    if plus_one:
        return list(_bf16_roundings(h * (1.0 + w.astype(np.float64)), slack))
    return [r for hb in _bf16_roundings(h, slack) for r in _bf16_roundings(w.astype(np.float64) * hb, slack)]


def _outlier_rows(seed: int) -> np.ndarray:
    """Rows of HIDDEN channels in bf16, one channel 1e3x the rest (as real residual streams have), one row
    without an outlier."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((8, HIDDEN))
    x[np.arange(7), rng.integers(0, HIDDEN, 7)] *= 1e3
    return x.astype(BF16)


@pytest.mark.parametrize("plus_one", [False, True], ids=["llama_w", "gemma_1_plus_w"])
def test_bf16_rms_norm_is_float32_math_rounded_once(plus_one):
    """Mutant killed: RMSNorm's float32 upcast removed (the mean of squares, the rsqrt and the product in bf16).
    On 64-wide test models at a 0.1 tolerance it was invisible; at H = 2,048 with an outlier channel every element
    must be within 1 bf16 ulp of float64 math, and more: the very rounding transformers' order gives, but where
    the exact value sits on a midpoint (the float32 error bound decides which)."""
    x = _outlier_rows(seed=1)
    w = (np.random.default_rng(2).standard_normal(HIDDEN) * 0.5).astype(BF16)
    eps = 1e-6
    got = jax.jit(ops.rms_norm, static_argnums=(2, 3))(jnp.asarray(x), jnp.asarray(w), eps, plus_one)
    assert got.dtype == jnp.bfloat16
    got = np.asarray(got).astype(np.float64)
    allowed = _rms_norm_bf16_allowed(x, w, eps, plus_one)
    ok = np.logical_or.reduce([got == a for a in allowed])
    bad = np.argwhere(~ok)
    assert not len(bad), (f"{len(bad)} of {got.size} elements are not float32 math rounded to bf16, e.g. "
                          f"{[(tuple(i), got[tuple(i)], allowed[0][tuple(i)]) for i in bad[:3]]}")
    ulp = np.abs(allowed[0]) * 2.0**-7  # a bf16 ulp is at most 2^-7 of the value
    assert (np.abs(got - allowed[0]) <= ulp).all()
