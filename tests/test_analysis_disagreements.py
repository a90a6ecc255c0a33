"""analyze --disagreements: the search against best-of-N over seeds, by hand and against scipy's t quantile."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from rmjax.analysis.disagreements import ahead_share, load_runs
from rmjax.runs import results
from tests.inproc import analyze, refused


def _best(gap):
    return None if gap is None else {"text": "x", "gap": gap, "z_a": 0.0, "z_b": 0.0, "judge_ppl": 10.0,
                                     "ends_turn": 1}


def _run(folder, seed, gaps, forwards=1000):
    """A finished disagreement job's files: gaps {(direction, view): (search, best_of_n)}."""
    folder.mkdir()
    (folder / "disagree.csv").write_text("prompt\n")
    ran = {"search": forwards, "best_of_n": forwards}
    summary = {"greatest": {d: {"forwards": ran, **{v: {"cap": 100.0, "search": _best(gaps[d, v][0]),
                                                        "best_of_n": _best(gaps[d, v][1])}
                                                    for v in ("at_cap", "complete")}}
                            for d in ("a_over_b", "b_over_a")}}
    identity = {"job": "disagree", "config": {"forwards": forwards}, "search": {"num_tokens": 8, "seed": seed}}
    meta = {"kind": "disagree", "identity": identity, "summary": summary}
    (folder / "disagree.csv.meta.json").write_text(json.dumps(meta))
    return str(folder)


DIGITS = 1e-8  # the CSV holds 9 significant digits
SEARCH = {("a_over_b", "at_cap"): [3.5, 2.0, 3.2], ("a_over_b", "complete"): [1.0, None, 2.0],
          ("b_over_a", "at_cap"): [-4.0, -3.1, -2.0], ("b_over_a", "complete"): [-1.0, -1.0, -1.0]}
BEST_OF_N = {("a_over_b", "at_cap"): [3.0, 2.5, 3.0], ("a_over_b", "complete"): [0.5, 1.0, 1.0],
             ("b_over_a", "at_cap"): [-3.0, -3.0, -3.0], ("b_over_a", "complete"): [-1.5, -1.5, -1.5]}


def test_the_advantage_over_seeds_and_its_t_interval(tmp_path):
    folders = [_run(tmp_path / f"s{k}", k, {key: (SEARCH[key][k], BEST_OF_N[key][k]) for key in SEARCH})
               for k in range(3)]
    found = analyze(tmp_path / "out", disagreements=tuple(folders))
    table = pd.read_csv(found["tables"]["disagreement_seeds"], keep_default_na=False)
    assert len(table) == 4
    # as docs/outputs.md lists them (the doc said the counts came last; the CSV wrote them before the values)
    assert list(table.columns) == ["prompt", "direction", "view", "runs", "paired", "search_ahead", "goal_met",
                                   "search_gap", "best_of_n_gap", "advantage", "ci_low", "ci_high"]
    for row in table.itertuples():
        key, sign = (row.direction, row.view), 1 if row.direction == "a_over_b" else -1
        pairs = [(s, b) for s, b in zip(SEARCH[key], BEST_OF_N[key], strict=True) if s is not None]
        adv = np.asarray([sign * (s - b) for s, b in pairs])
        half = stats.t.ppf(0.975, len(adv) - 1) * adv.std(ddof=1) / np.sqrt(len(adv))
        assert row.runs == 3 and row.paired == len(adv)  # a run with no search row counts (lost), unpaired
        assert row.advantage == pytest.approx(adv.mean(), rel=DIGITS, abs=1e-12)
        assert (row.ci_low, row.ci_high) == pytest.approx((adv.mean() - half, adv.mean() + half), rel=DIGITS, abs=1e-12)
        assert row.search_ahead == (adv > 0).sum()
        assert row.goal_met == sum(a > 0 and sign * s >= 3 for a, (s, _) in zip(adv, pairs, strict=True))
    # hand-counted: a>b at cap ahead in runs 0 and 2, the goal in both (3.5, 3.2); b>a at cap ahead in 0 and 1,
    # the goal in both (−4.0, −3.1); complete b>a: behind by 0.5 every run, an interval of no width
    a_cap = table[(table.direction == "a_over_b") & (table.view == "at_cap")].iloc[0]
    b_cap = table[(table.direction == "b_over_a") & (table.view == "at_cap")].iloc[0]
    b_done = table[(table.direction == "b_over_a") & (table.view == "complete")].iloc[0]
    assert (a_cap.search_ahead, a_cap.goal_met, b_cap.search_ahead, b_cap.goal_met) == (2, 2, 2, 2)
    assert b_done.ci_low == b_done.ci_high == pytest.approx(-0.5) and b_done.search_ahead == 0
    report = open(found["report"]).read()
    assert "Disagreement search against best-of-N over seeds" in report
    # the share of cell-runs the search wins: Clopper-Pearson's interval from the beta quantiles, widened to the
    # cluster-robust one over runs (each run's cells share its seed; helper-151)
    per_run = {"at_cap": [2, 1, 1], "complete": [1, 0, 1]}  # hand-counted from SEARCH and BEST_OF_N, 2 cells each
    for view, counts in per_run.items():  # complete a>b run 1: no search row, best-of-N's 1.0 (counted, lost)
        k, total = sum(counts), 6
        low, high = stats.beta.ppf(0.025, k, total - k + 1), stats.beta.ppf(0.975, k + 1, total - k)
        share = k / total
        spread = np.sqrt(3 / 2 * sum((a - 2 * share) ** 2 for a in counts)) / total
        half = stats.t.ppf(0.975, 2) * spread
        low, high = min(low, max(0, share - half)), max(high, min(1, share + half))
        assert ahead_share(load_runs(folders), view) == pytest.approx((k, total, low, high), abs=1e-9)
        assert f"- {view}: the search ahead in {k} of {total} cell-runs" in report


def test_the_ahead_share_of_runs_that_win_or_lose_together_is_not_the_cells_share():
    """helper-151: seed 0 ahead in all 20 cells, seed 1 in none: 20 of 40 had Clopper-Pearson's 34-66%, as if 40
    independent trials; two runs cannot bound the share (binomtest(1, 2): 1.3-98.7%). Cells that vary within each
    run alike keep the exact interval."""
    from rmjax.analysis.disagreements import DisagreementRun

    def run(seed, ahead):  # `ahead` of 20 prompts' a>b cells won at the cap
        summary = {f"p{i}": {"a_over_b": {"forwards": {"search": 10, "best_of_n": 10},
                                           "at_cap": {"search": _best(2.0 if i < ahead else 0.0),
                                                      "best_of_n": _best(1.0)},
                                           "complete": {"search": None, "best_of_n": None}}} for i in range(20)}
        return DisagreementRun(f"s{seed}", seed, {}, summary)

    exact = stats.binomtest(20, 40).proportion_ci(0.95, method="exact")
    assert ahead_share([run(0, 20), run(1, 0)], "at_cap") == pytest.approx((20, 40, 0.0, 1.0))
    assert ahead_share([run(0, 10), run(1, 10)], "at_cap") == pytest.approx((20, 40, exact.low, exact.high))


def test_a_run_where_one_method_has_no_row_counts_for_the_other(tmp_path):
    """Cell-runs where the search wrote no row under the cap and best-of-N did were dropped from the counts: "ahead
    in 2 of 2" where it was 2 of 6. Counted as the job's summary counts them: a loss for the side with no row, a
    win for the other (and toward the goal when that side is the search and ≥ 3 SD); never where the other
    method did not run."""
    from rmjax.analysis.disagreements import DisagreementRun, seed_table

    def run(s, b, ran=("search", "best_of_n")):
        entry = {"forwards": {m: 1000 for m in ran}, **{v: {"search": _best(s), "best_of_n": _best(b)}
                                                        for v in ("at_cap", "complete")}}
        return DisagreementRun("f", 0, {}, {"greatest": {"a_over_b": entry}})

    table = seed_table([run(None, 2.0), run(3.5, None), run(1.0, 0.5), run(None, None), run(4.0, None, ("search",))])
    row = table.iloc[0]
    # counted: runs 0 (lost), 1 (won, the goal), 2 (won, paired); not 3 (neither) nor 4 (best-of-N did not run)
    assert (row.runs, row.paired, row.search_ahead, row.goal_met) == (3, 1, 2, 1)
    assert row.advantage == pytest.approx(0.5) and row.search_gap == 1.0


def test_runs_of_different_jobs_or_one_run_are_refused(tmp_path):
    gaps = {key: (SEARCH[key][0], BEST_OF_N[key][0]) for key in SEARCH}
    a = _run(tmp_path / "a", 0, gaps)
    b = _run(tmp_path / "b", 1, gaps, forwards=2000)
    refused(lambda: analyze(tmp_path / "o1", disagreements=(a, b)), "differs", "config.forwards", "--seed")
    refused(lambda: analyze(tmp_path / "o2", disagreements=(a,)), "at least two runs")
    missing = str(tmp_path / "none")
    refused(lambda: analyze(tmp_path / "o3", disagreements=(a, missing)), "no finished", f"--out={missing}")
    # a --nosearch run writes its vocabulary map alone: it ran no search, which is what to say (helper-159: "no
    # finished disagreement job there ... run experiments.disagree first")
    map_only = tmp_path / "map_only"
    map_only.mkdir()
    (map_only / "vocab_map.csv").write_text("prompt,text,gap\n")
    results.write_meta(map_only / "vocab_map.csv", kind="disagree", identity={"job": "disagree",
                                                                               "config": {"search": False}})
    refused(lambda: analyze(tmp_path / "o4", disagreements=(a, str(map_only))), "ran no search", "--nosearch")
    # a search run stopped between its map and its rows (helper-160) is an unfinished job, not a --nosearch one
    results.write_meta(map_only / "vocab_map.csv", kind="disagree", identity={"job": "disagree",
                                                                               "config": {"search": True}})
    refused(lambda: analyze(tmp_path / "o5", disagreements=(a, str(map_only))), "no finished disagreement job")
    results.write_meta(map_only / "vocab_map.csv", kind="disagree", identity={"job": "disagree", "config": None})
    refused(lambda: analyze(tmp_path / "o6", disagreements=(a, str(map_only))), "no finished disagreement job")
    assert not any(p.name.startswith("o") for p in tmp_path.iterdir())  # refused before --out is touched
