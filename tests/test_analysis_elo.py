"""EloEverything, end to end: `experiments.analyze --elo=builtin` writes every table and figure (with
the models given with --scores beside the published ones),
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

from rmjax.data import DATA_DIR

REPO = Path(__file__).resolve().parents[1]
ELO = DATA_DIR / "elo"
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
    proc = subprocess.run([sys.executable, "-m", "experiments.analyze", "--elo=builtin", f"--out={out}",
                           f"--models_yaml={DATA_DIR / 'reward_models.yaml'}"], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    nicknames = {m["name"]: m["nickname"] for m in yaml.safe_load((DATA_DIR / "reward_models.yaml").read_text())}
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


# --- issue 21 point 7: models given with --scores beside the published ones -------------------------------

GREATEST = "What, in one word, is the greatest thing ever"
PREFER = "What is the single thing, person, or concept that humans most prefer"
EXACT = [f"Word{i}" for i in range(12)]  # a token decodes to the item (roundtrip 1)
SPACED = [f"Spaced{i}" for i in range(8)]  # ' item' round-trips, 'item' does not (the plain template)
GLUED = [f"Glued{i}" for i in range(4)]  # only 'item', and it does not round-trip
MULTI = [f"Two words {i}" for i in range(6)]  # no token decodes to it
ITEMS = EXACT + SPACED + GLUED + MULTI


def _write_elo(directory: Path, rng: np.random.Generator) -> dict[str, pd.DataFrame]:
    """Two EloEverything prompts over ITEMS (distinct Elo scores) with two published models."""
    raw = {}
    for stem in (GREATEST, PREFER):
        elo = rng.permutation(np.arange(1000, 1000 + 7 * len(ITEMS), 7)).astype(float)
        frame = pd.DataFrame({"elo_rank": stats.rankdata(-elo).astype(int), "elo_score": elo, "name": ITEMS,
                              "elo_matches": 100, "org/Pub-A": rng.normal(size=len(ITEMS)),
                              "org/Pub-B": rng.normal(size=len(ITEMS))})
        frame.to_csv(directory / f"{stem}.csv", index=False)
        raw[stem] = frame.set_index("name")
    return raw


def _write_sweeps(directory: Path, raw: dict[str, pd.DataFrame], rng: np.random.Generator) -> dict[str, dict]:
    """Two sweep-shaped tables and, per model and prompt, the score each matched item should get."""
    from rmjax.runs import results

    expected: dict[str, dict] = {"elo-rm-test": {}, "P-A (--scores)": {}}
    greatest_elo = raw[GREATEST]["elo_score"]
    matched = EXACT + SPACED
    # greatest: a monotone function of the human Elo; prefer: a permutation of the items' scores
    greatest = {name: float(np.exp(greatest_elo[name] / 300.0)) for name in matched}
    prefer = dict(zip(matched, rng.permutation(np.arange(len(matched), dtype=float)), strict=True))
    expected["elo-rm-test"] = {GREATEST + "?": greatest, PREFER + "?": prefer}
    decoded, roundtrip, g, p = [], [], [], []
    for name in EXACT:
        decoded.append(name), roundtrip.append(1), g.append(greatest[name]), p.append(prefer[name])
    for name in SPACED:  # the round-tripping ' name' carries the score; 'name' a wrong one
        decoded += [" " + name, name]
        roundtrip += [1, 0]
        g += [greatest[name], -1e6]
        p += [prefer[name], 1e6]
    for name in GLUED:
        decoded.append(name), roundtrip.append(0), g.append(1e6), p.append(-1e6)
    for junk in ["Two", " words", "the", " x", "None"]:
        decoded.append(junk), roundtrip.append(1), g.append(rng.normal()), p.append(rng.normal())
    order = rng.permutation(len(decoded))  # rows in any order
    results.write_scores_csv(directory / "smol.csv", np.arange(len(decoded))[order] + 100,
                             [decoded[i] for i in order], [decoded[i] for i in order],
                             {"greatest": np.array(g)[order], "prefer": np.array(p)[order],
                              "worst": rng.normal(size=len(decoded))}, roundtrip=np.array(roundtrip)[order])
    results.write_meta(directory / "smol.csv", kind="sweep", model="elo-rm-test", prompts={
        "greatest": GREATEST + "?", "prefer": PREFER + "?", "worst": "What, in one word, is the worst thing ever?"})
    # a sweep of a published model (labelled P-A by the YAML), without a roundtrip column: string lookup,
    # and 'Word0' decoded by two ids is ambiguous
    names = EXACT + [" " + s for s in SPACED] + ["Word0", "Two", "the"]
    scores = rng.permutation(len(names)).astype(float)
    results.write_scores_csv(directory / "pub.csv", np.arange(len(names)), names, names, {"greatest": scores})
    results.write_meta(directory / "pub.csv", kind="sweep", model="org/Pub-A")
    expected["P-A (--scores)"] = {GREATEST + "?": {n.strip(): s for n, s in zip(names, scores, strict=True)
                                                   if n.strip() in EXACT[1:] + SPACED}}
    return expected


@pytest.fixture(scope="module")
def scores_run(tmp_path_factory):
    from rmjax.analysis import plots
    from rmjax.analysis.report import run_analyses
    from rmjax.analysis.spec import AnalysisConfig

    root = tmp_path_factory.mktemp("elo_scores")
    rng = np.random.default_rng(7)
    (root / "elo").mkdir()
    (root / "scores").mkdir()
    raw = _write_elo(root / "elo", rng)
    expected = _write_sweeps(root / "scores", raw, rng)
    models_yaml = root / "models.yaml"
    models_yaml.write_text(yaml.safe_dump([{"name": "org/Pub-A", "nickname": "P-A"},
                                           {"name": "org/Pub-B", "nickname": "P-B"}]))
    drawn = []  # every figure's data, to check what is plotted

    def recorder(draw):
        def record(*args, path, **kwargs):
            drawn.append((Path(path).stem, args))
            return draw(*args, path=path, **kwargs)
        return record

    cfg = AnalysisConfig(scores=(str(root / "scores"),), elo=str(root / "elo"), models_yaml=str(models_yaml),
                         frequencies=None, n_boot=10, n_permutations=20, top=5)
    from rmjax.analysis import elo as elo_module

    with pytest.MonkeyPatch.context() as patch:
        for name in ("heatmap", "rank_trajectories"):
            patch.setattr(plots, name, recorder(getattr(plots, name)))
        # elo-rm-test stands for a builtin RM, whose training record names the EloEverything data (issue 45); so does
        # the published Pub-A's sweep (Pub-A tuned on it), labelled P-A (--scores) beside the published P-A
        patch.setattr(elo_module, "elo_training",
                      lambda source: "builtin" if source in ("elo-rm-test", "org/Pub-A") else None)
        result = run_analyses(cfg, root / "out", echo=False)
    return root / "out", raw, expected, dict(drawn), result


def test_a_model_trained_on_the_elo_data_is_named_as_in_sample(scores_run, tmp_path):
    """Issue 45: the builtin RMs ranked above the published ones against humans without the report saying that
    they were trained on this Elo data, or on how many items each τ is."""
    from rmjax.analysis.elo import elo_training

    out, _, _, drawn, _ = scores_run
    agreement = pd.read_csv(out / "elo_human_agreement.csv", keep_default_na=False)
    tuned = agreement.model.isin(["elo-rm-test", "P-A (--scores)"])
    assert set(agreement[tuned].trained_on_elo) == {"builtin"}
    assert set(agreement[~tuned].trained_on_elo) == {""}  # the published P-A is not the tuned one
    report = (out / "report.md").read_text()
    assert "**elo-rm-test was trained on EloEverything pairs** (`--elo=builtin`)" in report
    assert "n_items |" in report  # each τ beside the items it is over, a range where the prompts' differ
    for model, counts in agreement[agreement.source == "--scores"].groupby("model")["n_items"]:
        line = next(line for line in report.splitlines() if line.startswith(f"| {model} |"))
        shown = str(counts.min()) if counts.min() == counts.max() else f"{counts.min()}–{counts.max()}"
        assert line.rstrip().endswith(f"| {shown} |"), (line, sorted(counts))
    grid = drawn["elo_spearman_to_human"][0]
    assert "elo-rm-test (trained on this data)" in list(grid.index)
    # the Kendall tau heatmaps mark them too (helper-161: the in-sample RM's tau with humans, the matrix's highest,
    # was unmarked there), on both axes, with the note in the title; the CSV keeps the plain names
    taus = [name for name in drawn if name.startswith("elo_kendall_tau_")]
    assert taus
    for name in taus:
        tau, title = drawn[name][0], drawn[name][1]
        assert "elo-rm-test *" in list(tau.index) and "elo-rm-test *" in list(tau.columns)
        assert "P-A *" not in list(tau.index) and "(* trained on this data" in title
        assert "elo-rm-test" in pd.read_csv(out / f"{name}.csv", index_col=0).index
    # the records it reads: a builtin RM's, an exported folder's; a published RM has none
    assert elo_training("elo-rm-smollm2-135m") == "builtin"
    (tmp_path / "rmjax_training.json").write_text('{"recipe": {"elo": "builtin:best"}}')
    assert elo_training(str(tmp_path)) == "builtin:best"
    exported = tmp_path / "exported"  # experiments.export of a builtin RM carries its recipe (issue 45)
    exported.mkdir()
    (exported / "rmjax_export.json").write_text('{"identity": {"job": "export"}, "recipe": {"elo": "builtin"}}')
    assert elo_training(str(exported)) == "builtin"
    assert elo_training("Skywork/Skywork-Reward-Llama-3.1-8B-v0.2") is None


def test_scores_models_join_the_published_ones(scores_run):
    out, raw, expected, drawn, _ = scores_run
    agreement = pd.read_csv(out / "elo_human_agreement.csv", keep_default_na=False)
    for model, per_prompt in expected.items():
        for prompt, scores in per_prompt.items():
            row = agreement[(agreement.prompt == prompt) & (agreement.model == model)]
            assert len(row) == 1, (model, prompt)
            row = row.iloc[0]
            names = list(scores)
            human = raw[prompt[:-1]].loc[names, "elo_score"].to_numpy()
            values = np.array([scores[n] for n in names])
            tau = stats.kendalltau(human, values, variant="b").statistic
            rho = stats.spearmanr(human, values).statistic
            assert row.source == "--scores" and row.n_items == len(names)
            assert row.kendall_tau == pytest.approx(tau, rel=1e-7, abs=1e-9)  # CSVs keep 9 digits
            assert row.spearman_rho == pytest.approx(rho, rel=1e-7, abs=1e-9)
    smol = agreement[(agreement.model == "elo-rm-test") & (agreement.prompt == GREATEST + "?")].iloc[0]
    assert smol.kendall_tau == pytest.approx(1.0) and smol.spearman_rho == pytest.approx(1.0)  # monotone in Elo
    assert -0.9 < agreement[(agreement.model == "elo-rm-test") & (agreement.prompt == PREFER + "?")].iloc[0] \
        .kendall_tau < 0.9
    # the P-A sweep has no prefer column; the published models are unchanged, over every item
    assert set(agreement[agreement.model == "P-A (--scores)"].prompt) == {GREATEST + "?"}
    published = agreement[agreement.source == "published"]
    assert len(published) == 4 and set(published.n_items) == {len(ITEMS)}
    for _, row in published.iterrows():
        frame = raw[row.prompt[:-1]]
        column = {"P-A": "org/Pub-A", "P-B": "org/Pub-B"}[row.model]
        assert row.kendall_tau == pytest.approx(stats.kendalltau(frame.elo_score, frame[column]).statistic)


def test_scores_models_ranks_tau_matrix_and_coverage(scores_run):
    out, raw, expected, _, result = scores_run
    slug = "what_in_one_word_is_the_greatest_thing_ever"
    ranks = pd.read_csv(out / f"elo_ranks_{slug}.csv").set_index("name")
    scores = expected["elo-rm-test"][GREATEST + "?"]
    names = list(scores)
    np.testing.assert_allclose(ranks.loc[names, "elo-rm-test_rank"], stats.rankdata([-scores[n] for n in names]))
    assert ranks.loc[GLUED + MULTI, "elo-rm-test_rank"].isna().all()  # not scored: no rank, not dropped
    frame = raw[GREATEST]
    median = np.median([stats.rankdata(-frame[c]) for c in ("org/Pub-A", "org/Pub-B")], axis=0)
    np.testing.assert_allclose(ranks.loc[frame.index, "median_model_rank"], median)  # published models only
    matrix = pd.read_csv(out / f"elo_kendall_tau_{slug}.csv").set_index("model")
    # the --scores models after the published ones, in load_score_tables' order (models the YAML knows first)
    assert list(matrix.index) == ["Human", "P-A", "P-B", "P-A (--scores)", "elo-rm-test"]
    assert matrix.loc["Human", "elo-rm-test"] == pytest.approx(1.0)
    pub = expected["P-A (--scores)"][GREATEST + "?"]
    both = [n for n in names if n in pub]
    assert matrix.loc["elo-rm-test", "P-A (--scores)"] == pytest.approx(
        stats.kendalltau([scores[n] for n in both], [pub[n] for n in both]).statistic)
    coverage = pd.read_csv(out / "elo_scores_coverage.csv").set_index(["model", "prompt"])
    row = coverage.loc[("elo-rm-test", GREATEST + "?")]
    assert (row.column, row.n_items, row.n_scored) == ("greatest", len(ITEMS), len(EXACT + SPACED))
    assert (row.exact, row.leading_space, row.not_roundtrip, row.not_a_single_token) == (12, 8, 4, 6)
    row = coverage.loc[("P-A (--scores)", GREATEST + "?")]
    assert (row.n_scored, row.ambiguous, row.exact, row.leading_space) == (19, 1, 11, 8)
    tokens = pd.read_csv(out / "elo_scores_item_tokens.csv", keep_default_na=False)
    assert len(tokens) == 3 * len(ITEMS)  # every item of every (model, prompt), scored or not
    spaced = tokens[(tokens.model == "elo-rm-test") & (tokens.name == SPACED[0])]
    assert set(spaced.string) == {" " + SPACED[0]} and set(spaced.match) == {"leading_space"}
    report = (out / "report.md").read_text()
    assert "2 published models and 2 from --scores (P-A (--scores), elo-rm-test)" in report
    assert "labelled 'P-A (--scores)'" in report and "prompt columns worst are not EloEverything prompts" in report
    line = next(line for line in report.splitlines() if line.startswith("| elo-rm-test | "))
    # tau columns: prefer, then greatest (pivot order), then the fewest items a model's τ is over
    assert line.endswith(" | 1.000 | 20 |")


def test_scores_models_are_in_the_figures(scores_run):
    out, _, expected, drawn, result = scores_run
    slug = "what_in_one_word_is_the_greatest_thing_ever"
    (grid, _), (tau, _) = drawn["elo_spearman_to_human"], drawn[f"elo_kendall_tau_{slug}"]
    assert list(grid.index) == ["P-A", "P-B", "P-A (--scores) (trained on this data)",
                                "elo-rm-test (trained on this data)"]
    assert grid.loc["elo-rm-test (trained on this data)", GREATEST + "?"] == pytest.approx(1.0)
    assert np.isnan(grid.loc["P-A (--scores) (trained on this data)", PREFER + "?"])  # no column for that prompt
    assert "elo-rm-test *" in tau.index and "P-A (--scores) *" in tau.columns  # both in-sample, marked
    ranks, columns, labels, items, _ = drawn[f"elo_rank_trajectories_{slug}"]
    assert "elo-rm-test_rank" in columns and "elo-rm-test\n(rho 1.00, 20 items)" in labels
    assert (Path(result["figures"]["elo_spearman_to_human"])).stat().st_size > 1000


def test_a_scores_table_without_an_elo_prompt_is_reported(tmp_path):
    from rmjax.analysis import data
    from rmjax.analysis import elo as elo_lib
    from rmjax.runs import results

    rng = np.random.default_rng(0)
    (tmp_path / "elo").mkdir()
    _write_elo(tmp_path / "elo", rng)
    path = results.write_scores_csv(tmp_path / "other.csv", [1, 2], ["Word0", "x"], ["Word0", "x"],
                                    {"worst": np.array([1.0, 2.0])})
    added = elo_lib.add_score_tables(elo_lib.load_elo(tmp_path / "elo"), data.load_score_tables([path]))
    assert added.coverage.empty and all("other" not in ep.models for ep in added.prompts)
    assert "none of its prompts (worst) is an EloEverything prompt" in added.notes[0]


def test_a_rating_or_score_that_is_not_finite_is_refused(tmp_path):
    """An EloEverything file with elo_score 'nan' made every statistic of its prompt NaN (exit 0); a model's 'inf'
    score was dropped from τ as if unscored. A model's NaN (an item it did not score) is still read."""
    from rmjax.analysis import elo as elo_lib
    from rmjax.errors import InputFileError

    raw = _write_elo(tmp_path, np.random.default_rng(0))
    path = tmp_path / f"{GREATEST}.csv"
    frame = raw[GREATEST].reset_index()
    for column, value, fragment in (("elo_score", np.nan, "'elo_score'"), ("org/Pub-A", np.inf, "'org/Pub-A'")):
        bad = frame.copy()
        bad.loc[2, column] = value
        bad.to_csv(path, index=False, na_rep="nan")
        with pytest.raises(InputFileError, match=f"column {fragment} of item '{ITEMS[2]}' is not a finite number"):
            elo_lib.load_elo(tmp_path)
    unscored = frame.copy()
    unscored.loc[2, "org/Pub-A"] = np.nan
    unscored.to_csv(path, index=False, na_rep="nan")
    loaded = {p.prompt: p for p in elo_lib.load_elo(tmp_path)}
    assert np.isnan(loaded[f"{GREATEST}?"].scores.loc[ITEMS[2]].iloc[0])


def test_a_published_model_that_leaves_items_unscored_stays_out_of_the_median():
    """Two models that rank six items exactly as humans do, one scoring only d, e, f: the median model rank was NaN
    on a-c and 1.5 ranks from the humans' on d-f (a partial model ranks 1..3), and 'humans rank higher' was filled
    with items humans rank lower. The median is over the models that score every item; each list keeps its sign."""
    from rmjax.analysis.elo import EloPrompt, human_vs_median_model, ranks_table

    names = list("abcdef")
    items = pd.DataFrame({"elo_score": [6.0, 5, 4, 3, 2, 1]}, index=names)
    scores = pd.DataFrame({"m1": [6.0, 5, 4, 3, 2, 1], "m2": [np.nan, np.nan, np.nan, 3, 2, 1]}, index=names)
    ranks = ranks_table(EloPrompt("q?", "q", items, scores))
    np.testing.assert_array_equal(ranks["median_model_rank"], stats.rankdata(-items["elo_score"]))
    np.testing.assert_array_equal(ranks["median_model_rank_minus_human_rank"], 0)
    assert human_vs_median_model(ranks).empty  # no item on either side
    scores["m1"] = [6.0, 5, 4, 1, 3, 2]  # d two ranks lower by the model, e and f one higher
    gaps = human_vs_median_model(ranks_table(EloPrompt("q?", "q", items, scores)))
    higher, lower = (gaps[gaps.direction == d] for d in ("humans_rank_higher", "humans_rank_lower"))
    assert list(higher.name) == ["d"] and list(lower.name) == ["e", "f"]


def test_roundtrip_only_keeps_each_items_match_kind(tmp_path):
    """A fault hunt: under --roundtrip_only an item whose token does not round-trip was counted 'not_a_single_token'
    (its rows were gone before the items were matched), 'not_roundtrip' without the flag."""
    from rmjax.analysis import data, elo

    rng = np.random.default_rng(7)
    (tmp_path / "elo").mkdir()
    (tmp_path / "scores").mkdir()
    raw = _write_elo(tmp_path / "elo", rng)
    _write_sweeps(tmp_path / "scores", raw, rng)
    names = list(raw[GREATEST].index)
    kinds = [elo.item_tokens(data.load_score_tables(tmp_path / "scores" / "smol.csv", roundtrip_only=only)[0], names)
             .set_index("name")["match"] for only in (False, True)]
    pd.testing.assert_series_equal(kinds[0], kinds[1])
    assert set(kinds[1][GLUED]) == {"not_roundtrip"} and set(kinds[1][SPACED]) == {"leading_space"}


@pytest.mark.parametrize("column", ["human_elo", "Human", "median_model"])
def test_a_model_named_like_the_ranks_tables_own_columns_is_refused_or_relabelled(tmp_path, column):
    """A model called `human_elo` wrote its scores over the human ratings' `human_elo_score` column (fault hunt)."""
    from rmjax.analysis import elo
    from rmjax.analysis.data import ScoreTable
    from rmjax.errors import UsageError
    frame = pd.DataFrame({"elo_rank": [1, 2, 3, 4], "elo_score": [1600, 1500, 1400, 1300], "name": list("abcd"),
                          "elo_matches": [10] * 4, "rmX": [4.0, 3.0, 1.0, 2.0]})
    frame.to_csv(tmp_path / "What is best.csv", index=False)
    (prompt,) = elo.load_elo(tmp_path)
    ranks = elo.ranks_table(prompt)
    assert ranks["human_elo_score"].tolist() == [1600, 1500, 1400, 1300]
    assert ranks["rmX_rank"].tolist() == [1, 2, 4, 3]
    # a --scores table of that name is labelled past it, and the human column keeps the ratings
    table = ScoreTable(column, column, pd.DataFrame({"text": ["a", "b", "c", "d"],
                                                     "What is best?": [0.1, 0.4, 0.3, 0.2]}), "text")
    added = elo.add_score_tables([prompt], [table])
    assert added.labels == [column + elo.USER_MARK]
    ranks = elo.ranks_table(added.prompts[0])
    assert ranks["human_elo_score"].tolist() == [1600, 1500, 1400, 1300]
    assert ranks[f"{column}{elo.USER_MARK}_score"].tolist() == [0.1, 0.4, 0.3, 0.2]
    frame.rename(columns={"rmX": column}).to_csv(tmp_path / "What is best.csv", index=False)
    with pytest.raises(UsageError, match=f"model column '{column}' is named like a column"):
        elo.load_elo(tmp_path)


def test_the_reports_item_count_is_a_range_where_a_models_prompts_differ():
    """A --scores model's τ per prompt is over the items that prompt's column scores; report.md gave the fewest
    beside every τ (fault hunt)."""
    from rmjax.analysis.report import item_counts
    agreement = pd.DataFrame({"model": ["a", "a", "b", "b", "c"], "prompt": ["p", "q", "p", "q", "p"],
                              "n_items": [12, 30, 7, 7, 5]})
    assert item_counts(agreement, ["b", "a", "c"]) == ["7", "12–30", "5"]


def test_elo_builtin_prompt_reads_that_shipped_file_alone():
    # train_rm's `--elo=builtin:<prompt>` spelling: analyze took it for a path ("not found", no names listed).
    from rmjax.analysis.inputs import load_inputs
    from rmjax.analysis.spec import AnalysisConfig
    from rmjax.errors import UsageError

    other = "What one single thing, person, or concept is the greatest ever"
    (prompt,) = load_inputs(AnalysisConfig(elo=f"builtin:{other}?", models_yaml="")).elo
    raw = pd.read_csv(ELO / f"{other}.csv", keep_default_na=False).set_index("name")
    assert prompt.prompt == f"{other}?"
    assert list(prompt.items.index) == list(raw.index)
    np.testing.assert_array_equal(prompt.items["elo_score"].to_numpy(), raw["elo_score"].to_numpy(dtype=float))
    with pytest.raises(UsageError, match=r"--elo=builtin:nope: .*give builtin") as refused:
        AnalysisConfig(elo="builtin:nope", models_yaml="")  # refused as the settings are built (a launch too)
    assert all(f'"builtin:{stem}"' in str(refused.value) for stem in SLUGS)


def test_two_columns_for_one_elo_prompt_are_refused_and_the_report_counts_each_prompts_items(tmp_path):
    """helper-151: a table scoring one EloEverything prompt in two columns (its name and its text, in opposite
    directions) had the first used and the other called no EloEverything prompt; and report.md gave the first
    prompt's item count for every prompt (files of 100, 5,000 and 7,530 items: "100 items")."""
    from rmjax.analysis import data
    from rmjax.analysis import elo as elo_lib
    from rmjax.errors import InputFileError
    from rmjax.runs import results
    from tests import inproc

    elo = tmp_path / "elo"
    elo.mkdir()
    raw = _write_elo(elo, np.random.default_rng(0))
    path = results.write_scores_csv(tmp_path / "two.csv", [1, 2, 3], ITEMS[:3], ITEMS[:3],
                                    {"greatest": np.array([1.0, 2.0, 3.0]), GREATEST: np.array([3.0, 2.0, 1.0])})
    with pytest.raises(InputFileError, match="columns 'greatest' and .* both score the EloEverything prompt"):
        elo_lib.add_score_tables(elo_lib.load_elo(elo), data.load_score_tables([path]))
    # two names of one text scored alike (--prompts=paper1,prompts54: greatest and greatest_ever_one) serve as one
    twins = results.write_scores_csv(tmp_path / "twins.csv", [1, 2, 3], ITEMS[:3], ITEMS[:3],
                                     {"greatest": np.array([1.0, 2.0, 3.0]), GREATEST: np.array([1.0, 2.0, 3.0])})
    added = elo_lib.add_score_tables(elo_lib.load_elo(elo), data.load_score_tables([twins]))
    said = f"prompt column {GREATEST} scores the prompt greatest does, alike"
    assert any(said in n for n in added.notes), added.notes
    assert not any("are not EloEverything prompts" in n for n in added.notes), added.notes
    frame = raw[PREFER].reset_index()
    frame[frame.name.isin(ITEMS[:5])].to_csv(elo / f"{PREFER}.csv", index=False)  # 5 items, GREATEST all
    inproc.analyze(tmp_path / "out", elo=str(elo), models_yaml="")
    said = (tmp_path / "out" / "report.md").read_text()
    assert f"items {len(ITEMS)} ({elo_lib.load_elo(elo)[0].slug}), 5 (" in said or \
        f"items 5 ({elo_lib.load_elo(elo)[0].slug}), {len(ITEMS)} (" in said, said[:600]
