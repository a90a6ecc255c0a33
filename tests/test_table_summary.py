"""The end-of-job summary gives the numbers a reference point (z, percentile), the prompt and the round trips."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from rmjax.runs import results, table_summary


def test_summary_names_the_prompt_and_places_each_token_in_the_distribution(tmp_path):
    rng = np.random.default_rng(0)
    values = rng.normal(size=50)
    roundtrip = np.arange(50) % 3 != 0
    out = tmp_path / "s.csv"
    results.write_scores_csv(out, np.arange(50), [f"t{i}" for i in range(50)], [f"w{i}" for i in range(50)],
                             {"greatest": values}, roundtrip=roundtrip)
    text = "What, in one word, is the greatest thing ever?"
    results.meta_path(out).write_text(json.dumps({"identity": {"prompts": {"greatest": text}}}))
    summary = table_summary.summarize_table(out, k=3)
    assert repr(text) in summary
    assert f"round trip: {int(roundtrip.sum())} of 50 tokens" in summary
    rows = re.findall(r"^\s+(-?\d+\.\d+)\s+z\s+([+-]\d+\.\d+)\s+pct\s+(\d+\.\d+)\s+(\d+)\s+'(w\d+)'(.*)$", summary,
                      re.MULTILINE)
    assert len(rows) == 6
    order = np.argsort(-values, kind="stable")
    assert [int(r[3]) for r in rows] == [*order[:3], *order[::-1][:3]]
    for value, z, pct, token_id, _, flag in rows:
        i = int(token_id)
        assert abs(float(value) - values[i]) <= 5e-5  # printed to 4 decimals
        assert abs(float(z) - (values[i] - values.mean()) / values.std(ddof=1)) <= 0.005  # 2 decimals; the
        # SD of every job's z (ddof 1): at z near 2 ddof 0 differs by 0.02 over 50 values
        assert abs(float(pct) - 100 * np.sum(values < values[i]) / 50) <= 0.005
        assert ("no round trip" in flag) == (not roundtrip[i])



@pytest.mark.parametrize("k, shown", [(0, 0), (2, 2), (9, 4)])
def test_the_lists_are_as_long_as_asked_and_the_column_allows(tmp_path, k, shown):
    """--top=0 prints each column's statistics and no empty "top 0" heading; a column shorter than --top says how
    many tokens its lists hold."""
    out = tmp_path / "s.csv"
    results.write_scores_csv(out, np.arange(4), list("abcd"), list("wxyz"), {"p": np.array([0.5, -3.0, 2.0, 0.1])})
    summary = table_summary.summarize_table(out, k=k)
    assert "4 tokens: mean" in summary
    headings = re.findall(r"^(top|bottom) (\d+) tokens by score", summary, re.MULTILINE)
    assert headings == ([("top", str(shown)), ("bottom", str(shown))] if shown else [])
    assert len(re.findall(r"^\s+-?\d+\.\d+\s+z ", summary, re.MULTILINE)) == 2 * shown

@pytest.mark.parametrize("decoded, values, want", [
    (["low", "lowest", "best", "mid"], [0.5, -3.0, 2.0, 0.1], ["top: 'best' 2.00", "bottom: 'lowest' -3.00"]),
    # a token decoding to U+FFFD (a byte fragment) is not marked even at the top, with no roundtrip column; the best
    # whole token is (kills `~df["token_decoded"].str.contains(…)` losing its `~`: helper-123's mutation pass)
    (["\ufffd", "low", "good", "mid"], [9.0, -3.0, 2.0, 0.1], ["top: 'good' 2.00", "bottom: 'low' -3.00"]),
])
def test_histogram_marks_the_top_and_bottom_token(tmp_path, monkeypatch, decoded, values, want):
    import matplotlib.axes

    out = tmp_path / "s.csv"
    results.write_scores_csv(out, np.arange(4), list("abcd"), decoded, {"p": np.array(values)})
    notes = []
    real = matplotlib.axes.Axes.annotate
    monkeypatch.setattr(matplotlib.axes.Axes, "annotate",
                        lambda self, text, *a, **k: notes.append(text) or real(self, text, *a, **k))
    table_summary.plot_distributions(out)
    assert notes == want


def test_a_constant_columns_tokens_are_zero_sds_from_its_mean(tmp_path):
    """Three rewards of 0.1: the computed SD is rounding (1.7e-17), and every token was printed at z -0.82
    (helper-164)."""
    out = tmp_path / "s.csv"
    results.write_scores_csv(out, np.arange(3), ["a", "b", "c"], ["a", "b", "c"], {"greatest": np.full(3, 0.1)})
    zs = re.findall(r"\bz\s+([+-]\d+\.\d+)", table_summary.summarize_table(out, k=3))
    assert len(zs) == 6 and all(float(z) == 0 for z in zs), zs
