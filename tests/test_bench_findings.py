"""bench/frontier_findings.py's compute multiplier, its models stubbed: what it counts as reached."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rmjax.search import fluent


def test_the_compute_multiplier_counts_a_search_with_no_row_as_reached_at_once(tmp_path):
    """bench/frontier_findings.py's multiplier: a cap under which the search wrote no row was recorded censored at
    --multiples (best-of-N never reached the search), the search's best possible score, and entered the geometric
    mean. Best-of-N reaches it with its first sample under the cap. The models are stubbed: every sample is fluent
    and ends the turn, so the first sample is the first to reach (k = 1 of a 100-forward budget)."""
    import json
    import runpy
    from argparse import Namespace
    from types import SimpleNamespace as stub

    bench = runpy.run_path(str(Path(__file__).resolve().parents[1] / "bench" / "frontier_findings.py"))
    summary = {"optimal": {"search_forwards": 100.0, "best_of_n": {"samples": 100},
                           "at_judge_ppl": [{"cap": 30.0, "search": None, "best_of_n": 1.5, "delta_sd": None},
                                            {"cap": 100.0, "search": 2.0, "best_of_n": 1.5, "delta_sd": 0.5}],
                           "at_judge_ppl_complete": []}}
    (tmp_path / "frontier.csv.meta.json").write_text(json.dumps({"judge": "J", "prompts": {"greatest": "Q?"},
                                                                 "summary": summary}))
    (tmp_path / "frontier.csv").write_text("direction,method,reward,judge_ppl,ids\noptimal,search,2.0,50.0,1 2\n"
                                           "optimal,best_of_n,1.5,20.0,3 4\n")
    found = stub(ids=np.array([[5, 6, 0]] * 400), values=stub(reward=np.linspace(0.0, 3.0, 400)))
    fns = bench["_multiples"].__globals__
    fns.update(load_for_job=lambda o: stub(tokenizer=None, config=stub(vocab_size=10)),
               make_target=lambda rm, p: stub(prefix=[1], suffix=[2]), Prior=stub(of=lambda rm, prefix: None),
               banned_tokens=lambda *a, **k: np.zeros(0, int), Objective=lambda *a, **k: stub(end=0),
               baseline=stub(best_of_n=lambda *a, **k: found),
               turns=stub(decode=lambda tok, ids, end: ["t"] * len(ids), tokens=lambda r, end: list(r[:2])),
               judge_perplexities=lambda judge, prompt, texts, end_of_turn: np.full(len(texts), 10.0))
    rows = {r["cap"]: r for r in bench["_multiples"]("m", 0, Namespace(num_tokens=2, multiples=4), tmp_path)}
    assert rows[30.0]["samples_to_reach"] == 1 and rows[30.0]["multiplier"] == 0.01
    assert rows[30.0]["censored"] is False
    # the search's 2.0 under ppl 100: the first sample with reward ≥ 2.0 in the interleaved order of two streams
    gains = np.linspace(0.0, 3.0, 400)[bench["_interleaved"](400, len(fluent.FluentConfig().best_of_n_temperatures))]
    assert rows[100.0]["samples_to_reach"] == int(np.flatnonzero(gains >= 2.0)[0]) + 1


def test_the_search_efficiency_beam_gets_the_largest_k_the_budget_buys(tmp_path, monkeypatch):
    """bench/search_efficiency.py's beam baseline: K = 48 spent 74% of the 25,000-forward budget on SmolLM2's RM and
    49% on Gemma 3's (a baseline given less compute than the search). `largest_beam` is checked against the bench's
    own Counter on a real beam (a tiny RM, 20 candidates): K's run stays within the budget and K + 1's passes it."""
    import runpy

    from rmjax.loading import load
    from rmjax.search import beam, gcg
    from rmjax.search.gcg import make_target
    from tests import tiny

    for module, name in ((beam, "score_responses"), (beam, "extend_prefix"), (beam, "_estimate"),
                         (gcg, "score_responses"), (gcg, "extend_prefix"), (gcg, "score_variants"),
                         (gcg, "reward_gradient_on_device")):
        monkeypatch.setattr(module, name, getattr(module, name))  # Counter.install patches them: restored after
    bench = runpy.run_path(str(Path(__file__).resolve().parents[1] / "bench" / "search_efficiency.py"))
    tiny.save_reward_model_with_tokenizer(tmp_path / "rm", num_labels=1)
    model = load(str(tmp_path / "rm"))
    target = make_target(model, bench["_prompt"]())
    prefix, tail = len(target.prefix), len(target.suffix)
    counter = bench["Counter"](tail)
    counter.install()
    cands = np.arange(10, 30)
    budget = 150
    k = bench["largest_beam"](budget, len(cands), prefix, tail)
    assert 1 < k < len(cands) - 1

    def spent(beam_k: int) -> float:
        counter.spent = bench["Fraction"](prefix, 2 + tail)  # the prompt's prefill, as main charges it
        curve, _ = bench["run_beam"](model, cands, "optimal", beam_k, counter, lambda ids: 1)
        return curve[-1][0]

    assert spent(k) <= budget < spent(k + 1)


def test_the_compute_multipliers_interval_over_seeds_is_a_t_interval_not_their_range():
    """bench/frontier_findings.py's interval over 3 seeds was a bootstrap whose 2.5/97.5 percentiles are the seeds'
    least and greatest (a resample of one seed thrice has probability 1/27, above 2.5%): BUILD_NOTES printed the
    range as a 95% CI. Now a t-interval on the logs, against scipy's one-sample t confidence interval."""
    import runpy

    from scipy import stats

    ci = runpy.run_path(str(Path(__file__).resolve().parents[1] / "bench" / "frontier_findings.py"))["_geometric_ci"]
    values = [0.09, 0.5, 4.0]
    geo, low, high = ci(values)
    want = stats.ttest_1samp(np.log(values), 0.0).confidence_interval(0.95)
    assert np.isclose(geo, np.exp(np.mean(np.log(values))), rtol=1e-12)
    assert np.allclose([low, high], np.exp([want.low, want.high]), rtol=1e-12)
    assert low < min(values) and high > max(values)  # three seeds this far apart bound little
