"""Tests that kill the mutants issue 42's campaign found surviving or only narrowly killed: each states the mutant
it kills and compares against an independent reference (float64 numpy, a redrawn bootstrap, a brute-force count)."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pandas as pd
import pytest

from rmjax.nn import ops
from tests import cli, inproc, tiny
from tests.test_analysis_stats import redrawn_bootstrap_intervals
from tests.test_safety_analyze import sweep
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


def _analyze(scores: Path, out: Path, seed: int) -> dict[str, bytes]:
    """One cheap analysis that runs the bootstrap (two stand-in sweeps; no metadata, lexicon files or RSA), and
    its tables (CSV) as bytes: `analyze --scores=DIR --models_yaml= --frequencies= --n_boot=30 --n_permutations=5
    --top=3 --seed=S`, in-process."""
    inproc.analyze(out, scores=(str(scores),), models_yaml=None, frequencies=None, n_boot=30, n_permutations=5,
                   top=3, seed=seed)
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.suffix == ".csv"}


def test_analyze_seed_fixes_every_table_and_moves_the_intervals(tmp_path):
    """Mutants killed: the bootstrap ignoring its seed (`--seed` had no effect, and no test could tell), and a
    level other than 95% anywhere between the flag and the table. The same --seed gives byte-identical tables,
    whose intervals are those of the resamples redrawn from the table's scores; another seed gives other
    intervals around the same moments. (The CSVs hold 9 significant digits: rel 1e-8.)"""
    rng = np.random.default_rng(9)
    scores = tmp_path / "scores"
    scores.mkdir()
    for model in ("a", "b"):
        sweep(scores / f"{model}.csv", {"greatest": rng.gamma(2.0, size=40)}, model=model)
    first = _analyze(scores, tmp_path / "first", seed=7)
    assert "paper1_moments.csv" in first
    assert _analyze(scores, tmp_path / "again", seed=7) == first
    other = _analyze(scores, tmp_path / "other", seed=8)
    assert other != first
    for run, seed in (("first", 7), ("other", 8)):
        moments = pd.read_csv(tmp_path / run / "paper1_moments.csv").set_index("model")
        for model in ("a", "b"):
            read = pd.read_csv(scores / f"{model}.csv")["greatest"].to_numpy(np.float64)  # what analyze reads
            want = redrawn_bootstrap_intervals(read, n_boot=30, seed=seed)
            got = moments.loc[model, list(want)].to_dict()
            assert got == pytest.approx(want, rel=1e-8, abs=0), (run, model)
    tables = [pd.read_csv(tmp_path / run / "paper1_moments.csv") for run in ("first", "other")]
    point = ["prompt", "model", "n_tokens", "mean", "variance", "skewness"]
    pd.testing.assert_frame_equal(tables[0][point], tables[1][point])
    intervals = [c for c in tables[0].columns if c.endswith(("_ci_low", "_ci_high"))]
    assert len(intervals) == 6 and (tables[0][intervals].to_numpy() != tables[1][intervals].to_numpy()).all()


@pytest.fixture(scope="module")
def overflow_row(tmp_path_factory):
    """A tiny Gemma 2 reward model (SmolLM2 tokenizer) whose reward is NaN for responses holding 'Love' only: its
    embedding row is finite (4.3e37 in one channel) but times Gemma's sqrt(hidden) = 8 it overflows to inf, and the
    first norm turns inf into NaN. Its gradient entries stay finite (8·g·4.3e37 for |g| < 1), so GCG's gradient
    check passes and only the candidates' own check can see the NaN. Returns (folder, the start token 'No', 'Love')."""
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("overflow") / "rm"
    tiny.save_reward_model_with_tokenizer(folder, name="gemma2", seed=3)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    (start,), (nan,) = (tokenizer(w, add_special_tokens=False).input_ids for w in ("No", "Love"))
    assert start < nan  # --token_ids without 'x': the search starts from the lowest id, 'No'
    with np.errstate(over="ignore"):
        assert np.isinf(np.float32(4.3e37) * np.float32(8.0))
    cli.edit_embedding_row(folder, nan, 4.3e37, zero_rest=True)
    return folder, start, nan


def test_gcg_candidate_nan_for_one_token_is_refused_or_counted(overflow_row, tmp_path):
    """Mutant killed: GCG's check of its candidates' rewards skipped (a NaN candidate dropped silently). It was
    caught only because the test model was NaN for every start; here the model is NaN for one token, which the
    one step evaluates as its only candidate (two tokens allowed: the start 'No' and 'Love'). Without
    --allow_nonfinite the job stops naming it and writes nothing; with it, the NaN candidate is never a result
    and .meta.json counts it: one candidate dropped, the one evaluated."""
    from rmjax.search.gcg_config import GCGConfig
    from rmjax.search.gcg_job import GcgSpec, run_gcg

    folder, start, nan = overflow_row

    def gcg(out, allow_nonfinite: bool):  # gcg --num_tokens=1 --steps=1 --selection=greedy --topk=2 --search_width=2
        # --token_ids=START,NAN [--allow_nonfinite], in-process
        return run_gcg(GcgSpec(inproc.options(folder, out, allow_nonfinite=allow_nonfinite), inproc.prompts(),
                               GCGConfig(num_tokens=1, steps=1, selection="greedy", topk=2, search_width=2,
                                         token_ids=(start, nan), allow_nonfinite=allow_nonfinite)))

    refused = tmp_path / "refused.json"
    line = inproc.refused(lambda: gcg(refused, False), "non-finite rewards", "1 of 1",
                          f"response ids [{nan}] ('Love')", "--allow_nonfinite")
    assert "gradient" not in line  # the candidates' check, not the gradient's
    assert not refused.exists()
    out = tmp_path / "allowed.json"
    gcg(out, True)
    meta = json.loads(out.with_name(out.name + ".meta.json").read_text())
    assert meta["nonfinite"] == {"candidates_dropped": 1}
    result = json.loads(out.read_text())
    assert result["history"][0]["candidates"] == 1 and result["best_ids"] == [start]
    assert [entry["ids"] for entry in result["buffer"]] == [[start]]
    assert np.isfinite(result["best_reward"])


def test_the_joint_gradients_filler_cannot_make_a_finite_turn_non_finite(overflow_row, monkeypatch):
    """A turn shorter than its slots runs with filler after it (one program for every length): the filler was a real
    token, so one whose embedding row overflows in the forward ('Love' here, as the filler id) made the turn's
    gradient, log-probs and cache NaN through attention's 0 x NaN (helper-163). Masked, the turn's values are
    finite and equal to the same turn run with no filler, within the float32 bounds of tests/tolerance.py (one
    computation but for the padded rows)."""
    from rmjax.loading import load
    from rmjax.search import joint_gradient
    from rmjax.search.gcg import make_target
    from tests import tolerance

    folder, start, nan = overflow_row
    rm = load(str(folder))
    target = make_target(rm, "Name one thing.")
    first = jax.nn.log_softmax(jnp.asarray(np.random.default_rng(0).normal(size=rm.config.vocab_size), jnp.float32))
    turn = np.asarray([start, start + 1, target.suffix[0]], np.int32)
    assert nan not in turn and nan not in target.prefix and nan not in target.suffix
    alone = joint_gradient.joint_gradient_on_device(target, first, turn, 1.0, 0.7, True)
    monkeypatch.setattr(joint_gradient, "FILLER", nan)
    padded = joint_gradient.joint_gradient_on_device(target, first, turn, 1.0, 0.7, True, longest=7)
    (grad, extended, every), (grad2, extended2, every2) = alone, padded
    grad, every, grad2, every2 = (np.asarray(a) for a in (grad, every, grad2, every2))
    full = np.asarray([[*target.prefix, *turn.tolist(), *target.suffix]], np.int32)
    for name, a, b in (("K", extended.k, extended2.k), ("V", extended.v, extended2.v)):
        a, b = np.asarray(a), np.asarray(b)
        assert np.isfinite(b).all(), name
        atol = tolerance.f32_atol(float(np.abs(a).max()), tolerance.forward_terms(rm.config, full.shape[1]))
        np.testing.assert_allclose(b, a, rtol=0, atol=atol, err_msg=name)
    assert np.isfinite(grad2).all() and np.isfinite(every2).all()
    np.testing.assert_allclose(grad2, grad, rtol=0, atol=tolerance.grad_atol(grad, rm.config, full.shape[1] + 1,
                                                                             rm.config.hidden_size))
    np.testing.assert_allclose(every2, every, rtol=0, atol=tolerance.logprobs_atol(rm.params, rm.config, full))
