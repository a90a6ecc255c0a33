"""EloEverything, end to end: `experiments.analyze --elo=../shared/data/elo` writes every table and figure,
and its numbers equal scipy computed independently here from the raw files."""

from __future__ import annotations

import json
import subprocess
import sys
from itertools import combinations
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from scipy import stats

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
ELO = SHARED / "elo"
SLUGS = {
    "What is the single thing, person, or concept that humans most prefer":
        "what_is_the_single_thing_person_or_concept_that_humans_most",
    "What one single thing, person, or concept is the greatest ever":
        "what_one_single_thing_person_or_concept_is_the_greatest_ever",
    "What, in one word, is the greatest thing ever": "what_in_one_word_is_the_greatest_thing_ever",
}


@pytest.fixture(scope="module")
def elo_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("elo") / "out"
    proc = subprocess.run([sys.executable, "-m", "experiments.analyze", f"--elo={ELO}", f"--out={out}",
                           f"--models_yaml={SHARED / 'reward_models.yaml'}"], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    nicknames = {m["name"]: m["nickname"] for m in yaml.safe_load((SHARED / "reward_models.yaml").read_text())}
    raw = {stem: pd.read_csv(ELO / f"{stem}.csv", keep_default_na=False) for stem in SLUGS}
    return out, proc.stdout, raw, nicknames


def test_every_elo_table_and_figure_is_written(elo_run):
    out, stdout, _, _ = elo_run
    expected = ["elo_human_agreement.csv", "elo_cross_prompt_tau.csv", "elo_cross_prompt_tau.png",
                "elo_spearman_to_human.png", "report.md"]
    for slug in SLUGS.values():
        expected += [f"elo_ranks_{slug}.csv", f"elo_kendall_tau_{slug}.csv", f"elo_kendall_tau_{slug}.png",
                     f"elo_human_vs_median_model_{slug}.csv", f"elo_human_vs_median_model_{slug}.png",
                     f"elo_rank_trajectories_{slug}.png"]
    for name in expected:
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    assert sorted(p.name for p in out.iterdir()) == sorted([*expected, "analysis.json"])
    manifest = json.loads((out / "analysis.json").read_text())  # what --overwrite may remove later
    assert sorted(manifest["files"]) == sorted(expected) and manifest["complete"] is True
    assert "## EloEverything" in stdout and "R-Lla-3B" in (out / "report.md").read_text()


def test_human_agreement_equals_scipy(elo_run):
    out, _, raw, nicknames = elo_run
    table = pd.read_csv(out / "elo_human_agreement.csv", keep_default_na=False)
    assert len(table) == 30 and set(table.n_items) == {7530}
    for stem, frame in raw.items():
        for hf_id, nickname in nicknames.items():
            row = table[(table.prompt == stem + "?") & (table.model == nickname)].iloc[0]
            tau = stats.kendalltau(frame["elo_score"], frame[hf_id], variant="b")
            rho = stats.spearmanr(frame["elo_score"], frame[hf_id])
            assert row.kendall_tau == pytest.approx(tau.statistic, rel=1e-7, abs=1e-9)
            assert row.spearman_rho == pytest.approx(rho.statistic, rel=1e-7, abs=1e-9)
            assert 0.05 < row.kendall_tau < 0.5  # the RMs agree with humans only weakly


def test_tau_matrix_and_cross_prompt_tau_equal_scipy(elo_run):
    out, _, raw, nicknames = elo_run
    stem = "What one single thing, person, or concept is the greatest ever"
    frame = raw[stem]
    matrix = pd.read_csv(out / f"elo_kendall_tau_{SLUGS[stem]}.csv", keep_default_na=False).set_index("model")
    assert list(matrix.index) == ["Human", *nicknames.values()]
    ids = list(nicknames)
    for a, b in [("Human", ids[0]), (ids[3], ids[7]), (ids[1], ids[9])]:
        x = frame["elo_score"] if a == "Human" else frame[a]
        expected = stats.kendalltau(x, frame[b], variant="b").statistic
        label_a = "Human" if a == "Human" else nicknames[a]
        assert matrix.loc[label_a, nicknames[b]] == pytest.approx(expected, rel=1e-7)
        assert matrix.loc[nicknames[b], label_a] == matrix.loc[label_a, nicknames[b]]
    cross = pd.read_csv(out / "elo_cross_prompt_tau.csv", keep_default_na=False)
    assert len(cross) == 10 * 3
    for first, second in combinations(SLUGS, 2):
        left = raw[first].set_index("name")
        right = raw[second].set_index("name").loc[left.index]
        hf_id = ids[4]
        row = cross[(cross.model == nicknames[hf_id]) & (cross.prompt_a == first + "?")
                    & (cross.prompt_b == second + "?")].iloc[0]
        assert row.kendall_tau == pytest.approx(stats.kendalltau(left[hf_id], right[hf_id]).statistic, rel=1e-7)


def test_ranks_and_human_vs_median_model(elo_run):
    out, _, raw, nicknames = elo_run
    stem = "What, in one word, is the greatest thing ever"
    ranks = pd.read_csv(out / f"elo_ranks_{SLUGS[stem]}.csv", keep_default_na=False).set_index("name")
    frame = raw[stem].set_index("name")
    model_ranks = np.stack([stats.rankdata(-frame[hf_id]) for hf_id in nicknames], axis=1)
    median = np.median(model_ranks, axis=1)  # over the ten models only
    np.testing.assert_allclose(ranks.loc[frame.index, "median_model_rank"], median)
    np.testing.assert_allclose(ranks.loc[frame.index, "human_rank"], stats.rankdata(-frame["elo_score"]))
    np.testing.assert_allclose(ranks.loc[frame.index, "R-Gem-2B_z"],
                               stats.zscore(frame["Ray2333/GRM-gemma2-2B-rewardmodel-ft"]), rtol=1e-7, atol=1e-9)
    gaps = pd.read_csv(out / f"elo_human_vs_median_model_{SLUGS[stem]}.csv", keep_default_na=False)
    assert "median_model_rank (over models only)" in gaps.columns
    difference = median - stats.rankdata(-frame["elo_score"])
    higher = gaps[gaps.direction == "humans_rank_higher"]
    lower = gaps[gaps.direction == "humans_rank_lower"]
    assert len(higher) == len(lower) == 20
    assert higher.iloc[0]["name"] == frame.index[np.argmax(difference)]
    assert lower.iloc[0]["name"] == frame.index[np.argmin(difference)]
    assert higher.median_model_rank_minus_human_rank.iloc[0] == pytest.approx(difference.max())
