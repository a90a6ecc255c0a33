"""Word lists (AFINN-111, BNC frequencies, Big Two stems), wildcard matching and the Big Two tests."""

from __future__ import annotations

import importlib.util

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from rmjax.analysis import bigtwo, lexicons
from rmjax.analysis.data import ScoreTable
from rmjax.data import DATA_DIR
from rmjax.errors import InputFileError


def test_wildcard_stems():
    assert lexicons.matches_stem("achievement", "achiev*")
    assert lexicons.matches_stem("achiev", "achiev*")
    assert not lexicons.matches_stem("achie", "achiev*")
    assert lexicons.matches_stem("care", "care")
    assert not lexicons.matches_stem("career", "care")
    assert not lexicons.matches_stem("car", "care")
    lexicon = {"agency": ["achiev*", "able", "compet*"], "communion": ["care", "caring", "affection*", "comp*"]}
    matcher = lexicons.StemMatcher(lexicon)
    assert matcher.category("achievements") == "agency"
    assert matcher.category("able") == "agency" and matcher.category("capable") == ""
    assert matcher.category("career") == "" and matcher.category("care") == "communion"
    assert matcher.category("competent") == "ambiguous"  # compet* and comp* both match
    assert matcher.category("company") == "communion"
    got = lexicons.categorize([" Achieved", "CARE\n", " careful", "Affectionate", "None", " "], lexicon)
    assert got.tolist() == ["agency", "communion", "", "communion", "", ""]
    with pytest.raises(ValueError, match="only allowed at the end"):
        lexicons.StemMatcher({"agency": ["a*b"]})


def test_big_two_stems_from_nvm_and_from_csv(tmp_path):
    lexicon = lexicons.load_bigtwo()
    assert len(lexicon["agency"]) == 192 and len(lexicon["communion"]) == 184
    assert "achiev*" in lexicon["agency"] and "accept*" in lexicon["communion"]
    assert len(lexicons.load_bigtwo(variant="b")["agency"]) == 64
    csv = tmp_path / "big2.csv"
    csv.write_text("word,category\nWin*,agency\nkind,Communion\n")
    assert lexicons.load_bigtwo(csv) == {"agency": ["win*"], "communion": ["kind"]}
    csv.write_text("word,category\nwin,other\n")
    with pytest.raises(ValueError, match="neither agency nor communion"):
        lexicons.load_bigtwo(csv)


def test_afinn_111_from_the_installed_package():
    afinn = lexicons.load_afinn()
    assert len(afinn) == 2477  # AFINN-111 has 2477 entries
    assert afinn["love"] == 3 and afinn["hate"] == -3 and afinn["outstanding"] == 5
    assert lexicons.lookup([" Love", "HATE ", "table"], afinn)[:2].tolist() == [3.0, -3.0]
    assert np.isnan(lexicons.lookup(["table"], afinn)[0])


def test_missing_word_list_names_the_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "afinn" else real(name, *a))
    with pytest.raises(lexicons.MissingLexiconError, match=r"pip install --no-deps afinn==0\.1"):
        lexicons.load_afinn()


def test_bnc_frequencies_sum_word_forms_over_parts_of_speech(tmp_path):
    sample = tmp_path / "bnc.txt"
    sample.write_bytes("\tWord\tPoS\t\tFreq\tRa\tDisp\n"
                       "\tcaf\xe9\tNoC\t:\t12\t90\t0.9\n"
                       "\tgo\tVerb\t%\t2078\t100\t0.91\n"
                       "\t@\t@\tgo\t881\t100\t0.90\n"
                       "\t@\t@\tgoing*\t366\t100\t0.90\n"
                       "\t@\t@\twent\t483\t100\t0.92\n"
                       "\tgo\tNoC\t%\t21\t98\t0.83\n"
                       "\t@\t@\tgo\t20\t98\t0.83\n"
                       "\t@\t@\tgos\t0\t9\t0.61\n"
                       "\tThe\tDet\t:\t61847\t100\t0.98\n"
                       "lie (/lay)\tVerb\t%\t187\t100\t0.94#\n"
                       "@\t@\tlie\t41#\t100#\t0.95#\n"
                       "\taxis\tNoC\t:\t14#\t87#\t0.86#\n".encode("latin-1"))
    assert lexicons.load_bnc_frequencies(sample) == {"café": 12.0, "go": 901.0, "going": 366.0, "went": 483.0,
                                                     "the": 61847.0, "lie": 41.0, "axis": 14.0}
    real = lexicons.load_bnc_frequencies(DATA_DIR / "corpora" / "1_1_all_alpha.txt")
    assert real["the"] == 61847.0 and real["went"] == 483.0
    # "bases" is a form of base (12#), of basis (3#) and a verb form (1): the flagged counts count
    assert real["bases"] == 16.0 and real["lying"] == 46.0
    assert real["love"] > 150 and all(v > 0 for v in real.values())
    sample.write_bytes(sample.read_bytes() + b"\tword\tNoC\t:\tmany\t87\t0.86\n")
    with pytest.raises(InputFileError, match=r"line 14 gives the frequency 'many'"):
        lexicons.load_bnc_frequencies(sample)


def _table(strings: list[str], scores: np.ndarray, name: str = "m") -> ScoreTable:
    return ScoreTable(name, name, pd.DataFrame({"text": strings, "p": scores}), "text")


LEXICON = {"agency": ["achiev*", "goal"], "communion": ["care", "friend*"]}


def test_big_two_comparison_matches_scipy():
    strings = ["achieve", " Goal", "friends", "care", "x", "y", "achiever", "Friendly", "goals"]
    scores = np.array([9.0, 1.0, 7.0, 2.0, 5.0, 4.0, 8.0, 3.0, 6.0])
    table = _table(strings, scores)
    row = bigtwo.bigtwo_comparison([table], ["p"], LEXICON).iloc[0]
    agency, communion = scores[[0, 1, 6]], scores[[2, 3, 7]]  # "goals" matches no stem
    ref = scipy_stats.mannwhitneyu(agency, communion, alternative="two-sided")
    assert (row.n_agency, row.n_communion) == (3, 3)
    assert row.mann_whitney_u == ref.statistic and row.p_value == pytest.approx(ref.pvalue)
    assert row.rank_biserial == pytest.approx(2 * ref.statistic / 9 - 1)
    # ranks in the whole table, 1 = highest: agency 1, 9, 2 -> median 2; communion 3, 8, 7 -> median 7
    assert (row.median_rank_agency, row.median_rank_communion) == (2.0, 7.0)


def test_big_two_percentiles_count_ties_as_at_or_below_and_ambiguous_words_are_counted_out():
    """A token's percentile is the share of the whole table scoring at or below it (a loop), ties included; a word
    both categories' stems match is left out of both and counted."""
    lexicon = {**LEXICON, "communion": [*LEXICON["communion"], "goal*"]}  # "goal" is now both
    strings = ["achieve", "care", "goal", "x", "y", "friend", "achiever"]
    scores = np.array([3.0, 3.0, 5.0, 3.0, 1.0, 2.0, 3.0])
    points = bigtwo.bigtwo_points(_table(strings, scores), "p", lexicon).set_index("token_decoded")
    assert sorted(points.index) == ["achieve", "achiever", "care", "friend"]
    for token, percentile in points["percentile"].items():
        assert percentile == np.mean(scores <= scores[strings.index(token)]), token
    assert points.loc["achieve", "percentile"] == 6 / 7  # four tokens tie at 3.0, two score below
    row = bigtwo.bigtwo_comparison([_table(strings, scores)], ["p"], lexicon).iloc[0]
    assert row.n_ambiguous_left_out == 1 and (row.n_agency, row.n_communion) == (2, 2)


def test_big_two_family_pools_models_and_checkpoints_track_ranks():
    strings = ["achieve", "care", "goal", "friend", "x"]
    llama = [_table(strings, np.array([5.0, 1.0, 4.0, 2.0, 3.0]), "L1"),
             _table(strings, np.array([4.0, 2.0, 5.0, 1.0, 3.0]), "L2")]
    gemma = [_table(strings, np.array([1.0, 5.0, 2.0, 4.0, 3.0]), "G1")]
    families = {"L1": "Llama", "L2": "Llama", "G1": "Gemma"}
    got = bigtwo.bigtwo_family_comparison(llama + gemma, ["p"], LEXICON, families).set_index("family")
    assert got.loc["Llama", "rank_biserial"] == 1.0 and got.loc["Gemma", "rank_biserial"] == -1.0
    assert got.loc["Llama", "n_agency"] == 4 and got.loc["Llama", "models"] == "L1,L2"
    steps = [(0, llama[0]), (100, gemma[0])]
    frame = bigtwo.bigtwo_checkpoints(steps, LEXICON)
    assert frame[["step", "median_rank_agency", "median_rank_communion"]].values.tolist() == [
        [0, 1.5, 4.5], [100, 4.5, 1.5]]
