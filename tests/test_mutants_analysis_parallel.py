"""Tests that kill the mutants a mutation pass over rmjax.analysis (stats, paper1, bigtwo, elo, implicit, lexicons,
beams, disagreements), rmjax.parallel and rmjax.text found surviving the suite: each names the mutant it kills and
checks against an independent reference (scipy, brute force, a hand count, the published formula)."""

from __future__ import annotations

import itertools
import textwrap
import types

import jax
import numpy as np
import pandas as pd
import pytest
from jax.sharding import PartitionSpec as P
from scipy import stats as scipy_stats
from transformers import AutoTokenizer

from rmjax.analysis import beams, bigtwo, disagreements, elo, lexicons, paper1, stats
from rmjax.analysis.data import ScoreTable
from rmjax.errors import UsageError
from rmjax.parallel import batching, distributed, mesh_spec, sharding
from rmjax.text import chat, prompts, visible
from tests import tiny


def _table(strings: list[str], columns: dict[str, np.ndarray], name: str = "m") -> ScoreTable:
    return ScoreTable(name, name, pd.DataFrame({"text": strings, **columns}), "text")


def test_rsa_is_exact_when_the_relabellings_number_exactly_n_permutations():
    """Mutant `math.factorial(n) <= n_permutations` -> `<`: 4 models have 4! = 24 relabellings, so 24 permutations
    enumerate them all (p = share of the 24, exact), not 24 random draws with p = (1 + k) / 25."""
    rng = np.random.default_rng(4)
    a = rng.random((4, 4))
    dissimilarity = a + a.T
    np.fill_diagonal(dissimilarity, 0.0)
    theory = 1.0 / (1.0 + np.abs(np.arange(4)[:, None] - np.arange(4)[None]))
    iu = np.triu_indices(4, 1)
    rho = scipy_stats.spearmanr(dissimilarity[iu], theory[iu]).statistic
    null = [scipy_stats.spearmanr(dissimilarity[iu], theory[np.ix_(p, p)][iu]).statistic
            for p in itertools.permutations(range(4))]
    got = stats.rsa_permutation_test(dissimilarity, theory, n_permutations=24, seed=3)
    assert got["exact"] and got["n_permutations"] == 24
    assert got["p_value"] == pytest.approx(np.mean(np.abs(null) >= abs(rho) - 1e-12), abs=1e-12)


def test_one_finite_value_beside_nans_ranks_nothing():
    """Mutant `np.unique(values[np.isfinite(values)])` -> `np.unique(values)`: numpy counts NaN as a value of its
    own, so a model scoring every item it covers alike (NaN elsewhere) read as ranking something."""
    assert not stats.ranks_something(np.array([0.5, np.nan, 0.5, np.nan]))
    assert stats.ranks_something(np.array([0.5, np.nan, 0.25]))
    frame = pd.DataFrame({"a": [1.0, 2.0, 3.0, 4.0], "b": [7.0, np.nan, 7.0, 7.0]})
    assert np.isnan(stats.kendall_tau_matrix(frame).loc["b", "b"])  # scipy: a constant side has no tau
    assert np.isnan(scipy_stats.kendalltau([1.0, 3.0, 4.0], [7.0, 7.0, 7.0]).statistic)


def test_top_k_of_distinct_scores_is_k_rows_highest_first():
    """Mutant: the top cut one place too high (np.partition index len - k + 1), which kept k - 1 rows where the
    scores are distinct (the suite's table tied at the cut, so the extra tied row filled the k-th place)."""
    strings = [f"w{i}" for i in range(10)]
    scores = np.array([3.5, 9.0, -1.0, 7.25, 0.0, 8.5, 2.0, 6.0, 4.0, 5.5])
    got = paper1.top_bottom_table([_table(strings, {"p": scores})], ["p"], k=3)
    order = np.argsort(-scores, kind="stable")
    top, bottom = got[got.side == "top"], got[got.side == "bottom"]
    assert top.token_decoded.tolist() == [strings[i] for i in order[:3]]
    assert top.score.tolist() == sorted(scores, reverse=True)[:3]
    assert bottom.token_decoded.tolist() == [strings[i] for i in order[::-1][:3]]
    assert bottom.rank_in_vocabulary.tolist() == [10, 9, 8]


def test_a_word_of_valence_zero_is_in_neither_sentiment_regression():
    """Mutant `points.sentiment < 0` -> `<= 0`: AFINN-111 lists a word of valence 0 ("some kind"); the negative
    words' slope is over the words below 0 alone (hand OLS of score on valence over those)."""
    afinn = {"bad": -3, "awful": -2, "meh": -1, "neutral": 0, "good": 2, "great": 3}
    strings = ["bad", "awful", "meh", "neutral", "good", "great"]
    scores = np.array([-2.0, -1.5, 0.75, 10.0, 1.0, 2.5])
    got = paper1.sentiment_regressions([_table(strings, {"p": scores})], ["p"], afinn).set_index("valence")
    x, y = np.array([-3.0, -2.0, -1.0]), scores[:3]
    slope = np.sum((x - x.mean()) * (y - y.mean())) / np.sum((x - x.mean()) ** 2)
    assert got.loc["negative", "n_tokens"] == 3 and got.loc["positive", "n_tokens"] == 2
    assert got.loc["negative", "slope"] == pytest.approx(slope, rel=1e-12)


def test_frequency_slope_is_per_natural_log_of_the_per_million_frequency():
    """Mutant `np.log(freq)` -> `np.log10(freq)`: the slope is documented per natural log (FREQUENCY_SCALES); log10
    multiplies it by ln 10. Reference: least squares of score on [1, ln f, AFINN valence (0 when unlisted)]."""
    strings = ["love", "war", "cat", "the", "zebra", "happy", "rare"]
    frequencies = {"love": 150.0, "war": 90.0, "cat": 20.0, "the": 60000.0, "zebra": 1.5, "happy": 40.0,
                   "rare": 8.0}
    afinn = {"love": 3, "war": -2, "happy": 3}
    scores = np.array([2.0, -1.0, 0.5, -0.25, 1.75, 1.5, 0.0])
    got = paper1.frequency_regressions([_table(strings, {"p": scores})], ["p"], afinn, frequencies).iloc[0]
    design = np.column_stack([np.ones(7), np.log([frequencies[s] for s in strings]),
                              [afinn.get(s, 0) for s in strings]])
    beta, *_ = np.linalg.lstsq(design, scores, rcond=None)
    assert got["n_tokens"] == 7
    assert got["slope_frequency"] == pytest.approx(beta[1], rel=1e-9)
    assert got["slope_sentiment"] == pytest.approx(beta[2], rel=1e-9)


def test_framing_correlations_and_the_valence_axis():
    """Mutants: best-worst computed as worst-best (its top and bottom swapped), and the framing's Spearman rho taken
    as Pearson's r. References: scipy's spearmanr / pearsonr / kendalltau, and z-scores by hand (ddof 0)."""
    strings = [f"t{i}" for i in range(8)]
    best = np.array([5.0, 1.0, 3.0, 8.0, -2.0, 0.5, 4.0, 2.0])
    worst = np.array([-1.0, 6.0, 0.0, 2.0, 3.0, 9.0, -4.0, 1.0])
    correlations, rankings = paper1.framing_tables([_table(strings, {"best": best, "worst": worst})], k=2)
    row = correlations.iloc[0]
    assert row["spearman"] == pytest.approx(scipy_stats.spearmanr(best, worst).statistic, abs=1e-12)
    assert row["pearson"] == pytest.approx(scipy_stats.pearsonr(best, worst).statistic, abs=1e-12)
    assert row["kendall_tau"] == pytest.approx(scipy_stats.kendalltau(best, worst).statistic, abs=1e-12)
    valence = (best - best.mean()) / best.std() - (worst - worst.mean()) / worst.std()
    axis = rankings[rankings.combination == "best-worst"]
    top, bottom = axis[axis.side == "top"], axis[axis.side == "bottom"]
    assert top.token_decoded.tolist() == [strings[i] for i in np.argsort(-valence)[:2]]
    assert bottom.token_decoded.tolist() == [strings[i] for i in np.argsort(valence)[:2]]
    assert top.combined_z.to_numpy() == pytest.approx(np.sort(valence)[::-1][:2], abs=1e-12)


def test_mesh_spec_sizes_and_the_one_axis_that_takes_the_rest():
    """Mutants of parse_mesh_spec: a size 0 accepted (`< 1` -> `< 0`), two -1 axes accepted (`> 1` -> `> 2`), and
    `model:-1` alone giving data -1 too (both axes then took every device, 8 x 8 = 64 on 8)."""
    for spec, words in (("data:0", "sizes are >= 1"), ("model:0", "sizes are >= 1"),
                        ("data:-1,model:-1", "only one axis may be -1")):
        with pytest.raises(ValueError, match=words):
            mesh_spec.parse_mesh_spec(spec)
    assert mesh_spec.parse_mesh_spec("model:-1") == {"model": -1, "data": 1}
    assert mesh_spec.parse_mesh_spec("model:2") == {"model": 2, "data": -1}
    assert sharding.make_mesh("model:-1").shape == {"data": 1, "model": len(jax.devices())}


def test_a_process_id_alone_without_a_coordinator_is_refused(monkeypatch):
    """Mutant `(num_processes or 1) > 1 or (process_id or 0) > 0` -> `(num_processes or 1) > 1`: --process_id=1 alone
    ran one process as if it were the whole run."""
    for name in ("RMJAX_COORDINATOR", "RMJAX_NUM_PROCESSES", "RMJAX_PROCESS_ID"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(UsageError, match="--process_id=1 without --coordinator"):
        distributed.initialize(process_id=1)
    monkeypatch.setenv("RMJAX_PROCESS_ID", "3")
    with pytest.raises(UsageError, match="--process_id=3 without --coordinator"):
        distributed.initialize()
    monkeypatch.setenv("RMJAX_PROCESS_ID", "0")
    assert distributed.initialize() is False  # process 0 of one: nothing to start
    # mutant `[0-9]+` -> `-?[0-9]+` in _env_int: still refused, but as a --process_id flag the user never gave
    monkeypatch.setenv("RMJAX_PROCESS_ID", "-1")
    with pytest.raises(UsageError, match=r"\$RMJAX_PROCESS_ID='-1' is not a non-negative integer"):
        distributed.initialize()


class _EosAppending:
    """A tokenizer whose special-token rule adds BOS 1 before and EOS 2 after a text (as a post-processor that
    appends an EOS does); its own tokens are one per character, 100 + code point."""

    def __call__(self, text, add_special_tokens=True):
        ids = [100 + ord(c) for c in text]
        return types.SimpleNamespace(input_ids=[1, *ids, 2] if add_special_tokens else ids)


def test_a_plain_prompt_whose_tokenizer_appends_an_eos_has_it_as_the_suffix():
    """Mutant: _plain_split returning (everything, []) put the EOS in the prefix, before the response, where
    tokenizing the whole conversation puts it after."""
    text = chat.PLAIN_FORMAT.format(prompt="hi")
    split = chat.split_chat(_EosAppending(), "hi", template="plain")
    assert split.prefix == (1, *[100 + ord(c) for c in text]) and split.suffix == (2,)
    assert split.ids_with([7, 8])[-3:] == [7, 8, 2]


def test_a_plain_response_is_tokenized_as_its_conversation_reads():
    """Mutant: token_ids of the plain format without stripping the response, while the conversation text
    (`conversations`) strips it: the ids must be those of the conversation's own text."""
    tokenizer = AutoTokenizer.from_pretrained(str(tiny.smollm2_tokenizer_folder()))
    conversations = chat.Conversations(tokenizer, "What is best?", template="plain")
    responses = ["  love ", "\tpeace\n", "x"]
    want = [tokenizer(text, add_special_tokens=False).input_ids for text in conversations.conversations(responses)]
    assert conversations.token_ids(responses) == want


def test_a_cut_figure_label_is_at_most_cut_characters():
    """Mutant `shown[: cut - 1] + "…"` -> `shown[:cut] + "…"` (cut + 1 characters)."""
    for text, cut in (("abcdefghij", 5), (" spaced out ", 4), ("exactly6", 8)):
        shown = visible.figure_text(text, cut)
        full = visible.visible(text)
        assert len(shown) <= cut
        assert shown == (full if len(full) <= cut else full[: cut - 1] + "…")


def test_figure_text_wraps_at_the_documented_width():
    """Mutant: the width without DejaVu Sans' 0.6 em a character. Width = inches * 72 pt / (0.6 * fontsize) characters,
    at least 12; lines as textwrap gives them at that width."""
    text = " ".join(f"word{i}" for i in range(40))
    for inches, fontsize in ((4.0, 12), (3.0, 10), (1.0, 20)):
        width = max(12, int(inches * 72 / (0.6 * fontsize)))
        assert visible.wrap(text, inches, fontsize) == "\n".join(textwrap.wrap(text, width))


def test_prompt_names_given_twice_with_different_texts_are_refused(tmp_path):
    """Mutants of resolve_prompts: a name given twice with two texts kept the last one unsaid (`_add`), a
    `--prompt=name=text` whose text holds `=` split at its last one, a YAML prompt of spaces taken as a prompt."""
    with pytest.raises(UsageError, match="'greatest' is given twice with different texts"):
        prompts.resolve_prompts("greatest", ["greatest=Another text?"])
    assert prompts.resolve_prompts(None, ["eq=Is 1+1=2?"]) == {"eq": "Is 1+1=2?"}
    path = tmp_path / "p.yaml"
    path.write_text('blank: "   "\n')
    with pytest.raises(UsageError, match="'blank' has no text"):
        prompts.resolve_prompts(str(path))


def test_big_two_median_percentiles_are_the_share_at_or_below():
    """Mutant: median_percentile_communion read from the ranks. Percentile = share of the whole table scoring at or
    below the token (a loop over the table); the medians per category by hand."""
    lexicon = {"agency": ["achiev*", "goal"], "communion": ["care", "friend*"]}
    strings = ["achieve", "goal", "friends", "care", "x", "y", "achiever", "friendly", "z"]
    scores = np.array([9.0, 1.0, 7.0, 2.0, 5.0, 4.0, 8.0, 3.0, 6.0])
    row = bigtwo.bigtwo_comparison([_table(strings, {"p": scores})], ["p"], lexicon).iloc[0]

    def percentile(token):
        return np.mean(scores <= scores[strings.index(token)])

    agency = [percentile(t) for t in ("achieve", "goal", "achiever")]  # 9/9, 1/9, 8/9
    communion = [percentile(t) for t in ("friends", "care", "friendly")]  # 7/9, 2/9, 3/9
    assert row.median_percentile_agency == pytest.approx(8 / 9, abs=1e-15) == np.median(agency)
    assert row.median_percentile_communion == pytest.approx(3 / 9, abs=1e-15) == np.median(communion)


def _beam(model: str, rows: list[tuple[int, str, float]]) -> beams.BeamTable:
    """A beam result of (depth, decoded, score) rows, ranked per depth and direction as experiments.beam writes."""
    frame = pd.DataFrame([{"depth": d, "direction": "optimal", "rank": 0, "ids": (i,), "tokens": [s], "decoded": s,
                           "p": v} for i, (d, s, v) in enumerate(rows)])
    frame["rank"] = frame.groupby("depth")["p"].rank(ascending=False, method="first").astype(int)
    return beams.BeamTable(model, frame, None)


def test_beam_scores_by_string_keep_each_strings_best_at_that_depth_only():
    """Mutants: two id sequences decoding alike kept at their lowest score (`.max()` -> `.min()`), and rows of other
    depths mixed in (`depth == d` -> `>= d`). By hand: depth 1 holds a, b (twice: 2 and 5), c."""
    table = _beam("m", [(1, "a", 1.0), (1, "b", 2.0), (1, "b", 5.0), (1, "c", -1.0), (2, "ab", 9.0), (2, "a", 7.0)])
    assert beams.scores_by_string(table, 1, "p").to_dict() == {"a": 1.0, "b": 5.0, "c": -1.0}
    assert beams.scores_by_string(table, 2, "p").to_dict() == {"a": 7.0, "ab": 9.0}


def test_beam_tau_needs_three_shared_strings_and_is_scipys_tau_b_over_them():
    """Mutants: a tau over 2 shared strings (`>= 3` -> `>= 2`: always ±1, no evidence), and a diagonal of 1 for a
    model with under 3 strings or one value."""
    one = _beam("one", [(1, s, v) for s, v in zip("abcde", [5.0, 4.0, 3.0, 2.0, 1.0], strict=True)])
    two = _beam("two", [(1, s, v) for s, v in zip("abcdx", [1.0, 3.0, 2.0, 5.0, 0.0], strict=True)])
    pair = _beam("pair", [(1, "a", 1.0), (1, "b", 2.0), (1, "y", 3.0)])
    flat = _beam("flat", [(1, s, 1.0) for s in "abc"])
    tau, shared = beams.tau_between([one, two, pair, flat], 1, "p")
    assert shared.loc["one", "two"] == 4 and shared.loc["one", "pair"] == 2
    assert tau.loc["one", "two"] == pytest.approx(
        scipy_stats.kendalltau([5.0, 4.0, 3.0, 2.0], [1.0, 3.0, 2.0, 5.0]).statistic, abs=1e-12)
    assert np.isnan(tau.loc["one", "pair"]) and np.isnan(tau.loc["pair", "two"])
    assert tau.loc["one", "one"] == 1.0 and tau.loc["pair", "pair"] == 1.0 and np.isnan(tau.loc["flat", "flat"])
    short = _beam("short", [(1, "a", 1.0), (1, "b", 2.0)])
    assert np.isnan(beams.tau_between([one, short], 1, "p")[0].loc["short", "short"])


def _brute_tau_b(x, y) -> float:
    """Kendall tau-b by counting pairs: (C - D) / sqrt((n0 - ties in x) (n0 - ties in y))."""
    pairs = list(itertools.combinations(range(len(x)), 2))
    s = sum(np.sign(x[i] - x[j]) * np.sign(y[i] - y[j]) for i, j in pairs)
    tx = sum(x[i] == x[j] for i, j in pairs)
    ty = sum(y[i] == y[j] for i, j in pairs)
    return s / np.sqrt((len(pairs) - tx) * (len(pairs) - ty))


def test_cross_prompt_tau_is_tau_b_with_ties_over_the_items_both_prompts_score():
    """Mutant variant b -> c: without ties the two are equal (the suite's scores are continuous); with ties tau-c is
    not the documented tau-b. Items are joined by name; an item one prompt lacks or scores NaN is left out."""
    names_a = ["i1", "i2", "i3", "i4", "i5", "i6", "i7"]
    a = pd.DataFrame({"m": [1.0, 1.0, 2.0, 3.0, 3.0, 3.0, np.nan]}, index=names_a)
    b = pd.DataFrame({"m": [2.0, 1.0, 1.0, 5.0, 4.0, 4.0, 0.0, 9.0]}, index=["i2", "i1", "i3", "i4", "i5", "i6", "i7",
                                                                             "only_b"])
    items = pd.DataFrame({"elo_score": 0.0}, index=names_a)
    got = elo.cross_prompt_tau([elo.EloPrompt("A?", "a", items, a), elo.EloPrompt("B?", "b", items, b)]).iloc[0]
    x = np.array([1.0, 1.0, 2.0, 3.0, 3.0, 3.0])
    y = np.array([1.0, 2.0, 1.0, 5.0, 4.0, 4.0])  # b's scores of i1..i6
    assert got["n_items"] == 6
    assert got["kendall_tau"] == pytest.approx(_brute_tau_b(x, y), abs=1e-12)


def test_trajectory_items_are_the_human_top_and_bottom_n_and_every_models_first():
    """Mutant `tail(n)` -> `tail(n - 1)`. By hand: 7 items, n = 2; human top i1, i2 and bottom i6, i7; model m ranks
    i4 first, model k ties i2 and i5 for first (both listed, i2 once)."""
    ranks = pd.DataFrame({"name": [f"i{j}" for j in range(1, 8)], "human_rank": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0],
                          "m_rank": [3.0, 2.0, 4.0, 1.0, 5.0, 6.0, 7.0],
                          "k_rank": [3.0, 1.5, 4.0, 5.0, 1.5, 6.0, 7.0]}).sample(frac=1.0, random_state=0)
    got = elo.trajectory_items(ranks, ["m", "k"], n=2)
    assert got == [("i1", "human_top"), ("i2", "human_top"), ("i6", "human_bottom"), ("i7", "human_bottom"),
                   ("i4", "model_first"), ("i5", "model_first")]


def test_the_median_model_rank_leaves_out_a_scores_model_even_when_it_scores_every_item():
    """Mutant: a --scores model that scores every item joined the median (documented: the published models only).
    By hand: ranks (1 = best) of the three published models, median per item; the --scores model u ranks the items
    in reverse and would move the median of four."""
    items = pd.DataFrame({"elo_score": [1500.0, 1400.0, 1300.0, 1200.0], "elo_rank": [1.0, 2.0, 3.0, 4.0],
                          "elo_matches": 10.0}, index=["w", "x", "y", "z"])
    scores = pd.DataFrame({"p1": [4.0, 3.0, 2.0, 1.0], "p2": [3.0, 4.0, 1.0, 2.0], "p3": [1.0, 4.0, 3.0, 2.0],
                           "u": [1.0, 2.0, 3.0, 4.0]}, index=items.index)
    ranks = elo.ranks_table(elo.EloPrompt("Q?", "q", items, scores, ("u",)))
    published = np.array([[1, 2, 3, 4], [2, 1, 4, 3], [4, 1, 2, 3]], float)  # descending ranks of p1, p2, p3
    assert ranks["u_rank"].tolist() == [4.0, 3.0, 2.0, 1.0]
    assert ranks["median_model_rank"].tolist() == np.median(published, axis=0).tolist() == [2.0, 1.0, 3.0, 3.0]


def test_a_lemma_without_forms_counts_as_its_own_form_at_the_end_of_the_list_too(tmp_path):
    """Mutant: the last line's pending `%` lemma dropped (a lemma listing no `@` forms counts as its own form, as in
    the middle of the list). By hand: both lemmas without forms keep their own frequency."""
    sample = tmp_path / "bnc.txt"
    sample.write_bytes("\tWord\tPoS\t\tFreq\tRa\tDisp\n"
                       "\tabbey\tNoC\t%\t20\t90\t0.9\n"
                       "\tgo\tVerb\t%\t2078\t100\t0.91\n"
                       "\t@\t@\tgo\t881\t100\t0.90\n"
                       "\tzebra\tNoC\t%\t3\t40\t0.80\n".encode("latin-1"))
    assert lexicons.load_bnc_frequencies(sample) == {"abbey": 20.0, "go": 881.0, "zebra": 3.0}


def test_a_search_row_exactly_goal_sd_apart_and_ahead_meets_the_goal():
    """Mutant `sign * gap >= GOAL_SD` -> `>`: the goal (issue 46) is at least 3 SD apart; a best row exactly 3.0
    apart (or −3.0 for b over a) and ahead of best-of-N meets it. Counted by hand over two seeds."""
    def best(gap):
        return {"text": "x", "gap": gap, "z_a": 0.0, "z_b": 0.0, "judge_ppl": 10.0, "ends_turn": 1}

    def run(seed, a_over_b, b_over_a):
        ran = {"search": 100, "best_of_n": 100}
        entry = {d: {"forwards": ran, **{v: {"cap": 100.0, "search": best(s), "best_of_n": best(b)}
                                         for v in disagreements.VIEWS}}
                 for d, (s, b) in (("a_over_b", a_over_b), ("b_over_a", b_over_a))}
        return disagreements.DisagreementRun(f"s{seed}", seed, {}, {"greatest": entry})

    runs = [run(0, (3.0, 2.0), (-3.0, -2.5)), run(1, (2.9, 1.0), (-3.0, -3.5))]
    table = disagreements.seed_table(runs).set_index(["direction", "view"])
    for view in disagreements.VIEWS:
        a, b = table.loc[("a_over_b", view)], table.loc[("b_over_a", view)]
        assert (a.search_ahead, a.goal_met) == (2, 1)  # 3.0 ahead: met; 2.9 ahead: short of 3
        assert (b.search_ahead, b.goal_met) == (1, 1)  # −3.0 beyond −2.5: met; −3.0 short of −3.5: behind


def test_fsdp_puts_data_on_the_largest_free_dimension_data_divides():
    """Mutants of fsdp_spec: the smallest free dimension chosen (`max` -> `min`), and a dimension `data` does not
    divide chosen (the divisibility test dropped). The rule, by hand, on a data:4 x model:2 mesh."""
    mesh = sharding.make_mesh("data:4,model:2")
    assert sharding.fsdp_spec(P(None, None), (16, 8), mesh) == P("data", None)  # both divide: the larger
    assert sharding.fsdp_spec(P(None, None), (10, 8), mesh) == P(None, "data")  # 4 does not divide 10
    assert sharding.fsdp_spec(P(None, "model"), (12, 64), mesh) == P("data", "model")  # 64 is model's
    assert sharding.fsdp_spec(P(None), (6,), mesh) == P(None)  # nothing data divides: as it was
    assert sharding.fsdp_spec(P("data", None), (8, 16), mesh) == P("data", None)  # data already placed
    assert sharding.fsdp_spec(P(None, None), (16, 8), sharding.make_mesh("data:1,model:8")) == P(None, None)


def test_logical_axes_go_to_the_documented_mesh_axes():
    """Mutant RULES["vocab"] = "data": the forward is still right (XLA gathers), so only the placement tells. The
    module's rule: batch over `data`; heads, kv heads, MLP and vocabulary over `model`; the rest replicated; a
    dimension its mesh axis does not divide replicated."""
    mesh = sharding.make_mesh("data:4,model:2")
    assert sharding.spec_for(("vocab", "embed"), (64, 24), mesh) == P("model", None)
    assert sharding.spec_for(("embed", "vocab"), (24, 64), mesh) == P(None, "model")
    assert sharding.spec_for(("batch", None), (8, 5), mesh) == P("data", None)
    assert sharding.spec_for(("embed", "heads", "head_dim"), (24, 4, 6), mesh) == P(None, "model", None)
    assert sharding.spec_for(("embed", "kv_heads", "head_dim"), (24, 2, 6), mesh) == P(None, "model", None)
    assert sharding.spec_for(("layers", "embed", "mlp"), (3, 24, 48), mesh) == P(None, None, "model")
    assert sharding.spec_for(("vocab", "embed"), (63, 24), mesh) == P(None, None)  # 2 does not divide 63
    assert sharding.spec_for(("batch",), (6,), mesh) == P(None)  # 4 does not divide 6


def test_batch_sizes_round_up_to_the_data_axis_and_rows_to_a_power_of_two():
    """Mutants: bucket rounding down (`-(-n // m)` -> `n // m`), and rows_for doubling a power of two
    (`count - 1` -> `count`). By the docstrings: the smallest multiple >= n (and >= multiple); the next power of two
    >= count, as a multiple of the data shards."""
    for n, multiple in itertools.product(range(0, 20), (1, 2, 3, 4, 8)):
        want = max(multiple, min(k for k in range(multiple, 64, multiple) if k >= n))
        assert batching.bucket(n, multiple) == want, (n, multiple)
    for count, data in itertools.product(range(0, 40), (1, 2, 4, 8)):
        power = 1 if count <= 1 else 2 ** int(np.ceil(np.log2(count)))
        assert batching.rows_for(count, data) == batching.bucket(power, data), (count, data)
    assert (batching.rows_for(4, 1), batching.rows_for(5, 1), batching.rows_for(3, 8)) == (4, 8, 8)
    # a decoding loop's rows: a power of two, at least 8, at most the batch size
    assert [batching.decode_rows(count, 64, None) for count in (1, 8, 9, 40, 64)] == [8, 8, 16, 64, 64]
    assert (batching.decode_rows(3, 4, None), batching.decode_rows(3, 50, None)) == (4, 8)


def test_pad_rows_puts_each_rows_tokens_at_the_side_asked():
    """Mutant: the sides swapped. By hand: width 4, a third all-padding row, pad id 9."""
    ids, mask = batching.pad_rows([[1, 2], [3, 4, 5]], 4, side="left", pad_id=9, num_rows=3)
    assert ids.tolist() == [[9, 9, 1, 2], [9, 3, 4, 5], [9, 9, 9, 9]]
    assert mask.tolist() == [[False, False, True, True], [False, True, True, True], [False] * 4]
    ids, mask = batching.pad_rows([[1, 2], [3, 4, 5]], side="right", pad_id=9)
    assert ids.tolist() == [[1, 2, 9], [3, 4, 5]] and mask.tolist() == [[True, True, False], [True, True, True]]


def test_an_item_a_token_decodes_to_exactly_is_matched_before_its_leading_space_form():
    """Mutant: the leading-space form tried first. The documented order: the token that decodes to the item
    ('exact'), else the one decoding to ' ' + item. By hand: 'cat' has both, 'dog' only ' dog', 'emu' neither."""
    frame = pd.DataFrame({"token_id": [10, 11, 12, 13], "token_decoded": [" cat", "cat", " dog", "x"],
                          "p": [0.1, 0.2, 0.3, 0.4]})
    found = elo.item_tokens(ScoreTable("m", "m", frame, "token_decoded"), ["cat", "dog", "emu"]).set_index("name")
    assert found.loc["cat", ["match", "row", "token_id"]].tolist() == ["exact", 1, 11]
    assert found.loc["dog", ["match", "row", "token_id"]].tolist() == ["leading_space", 2, 12]
    assert found.loc["emu", ["match", "row"]].tolist() == ["not_a_single_token", -1]


def test_a_model_outside_every_family_joins_none():
    """Mutant `families.get(model) == family` -> `families.get(model, family) == family`: a model the families do
    not name was pooled into every family. By hand: family F holds model a only."""
    lexicon = {"agency": ["achiev*"], "communion": ["care"]}
    strings = ["achieve", "care", "x"]
    a = _table(strings, {"p": np.array([3.0, 1.0, 2.0])}, "a")
    stray = _table(strings, {"p": np.array([1.0, 3.0, 2.0])}, "stray")
    got = bigtwo.bigtwo_family_comparison([a, stray], ["p"], lexicon, {"a": "F"}).set_index("family")
    assert list(got.index) == ["F"] and got.loc["F", "models"] == "a"
    assert (got.loc["F", "n_agency"], got.loc["F", "n_communion"], got.loc["F", "rank_biserial"]) == (1, 1, 1.0)


def test_heterogeneity_rbo_uses_the_depth_asked():
    """Mutant: heterogeneity's RBO at the default depth 132 whatever --rbo_depth says. Reference: the truncated sum
    (1 - p) sum_{k<=d} p^(k-1) |A[:k] & B[:k]| / k over the rankings by hand (highest first), d = 3."""
    aligned = pd.DataFrame({"a": [6.0, 5.0, 4.0, 3.0, 2.0, 1.0], "b": [5.0, 6.0, 1.0, 4.0, 3.0, 2.0]},
                           index=["u", "v", "w", "x", "y", "z"])
    ranking_a, ranking_b = list("uvwxyz"), list("vuxyzw")
    p, depth = 0.8, 3
    want = (1 - p) * sum(p ** (k - 1) * len(set(ranking_a[:k]) & set(ranking_b[:k])) / k for k in range(1, depth + 1))
    got = paper1.heterogeneity(aligned, rbo_p=p, rbo_depth=depth)["rbo"]
    assert got.loc["a", "b"] == pytest.approx(want, abs=1e-15)
    assert got.loc["a", "a"] == pytest.approx(1 - p**depth, abs=1e-15)
