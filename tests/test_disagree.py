"""Issue 46: the disagreement search and map between two sides — the cross-tokenizer round trip, the budget ledger
across two models, the implicit side against experiments.logprobs, and the job's rows against experiments.score."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import shutil
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from rmjax.analysis.stats import epic_distance_matrix
from rmjax.loading import config_and_tokenizer, load
from rmjax.runs.options import RunOptions
from rmjax.search import baseline, disagree_config, disagree_job, disagree_out, fluent, sides, turns
from rmjax.search.budget import Forwards
from rmjax.search.disagree import Disagreement, agreement
from rmjax.search.disagree_config import DisagreeConfig, DisagreeSpec
from rmjax.search.disagree_job import run_disagree
from rmjax.search.gcg import make_target
from rmjax.search.objective import Objective
from rmjax.search.sides import ImplicitSide, Side, SideSpec
from rmjax.search.terms import Prior
from rmjax.text import chat, prompts
from rmjax.text.chat import Conversations
from tests import cli, tiny, tolerance
from tests.inproc import no_weights_read, refused
from tests.test_frontier import _Ledger

PROMPT = prompts.PAPER1["greatest"]
SEARCH = fluent.FluentConfig(num_tokens=3, samples=8, beam=2, proposals=4, search_width=16, topk=8)


@pytest.fixture(scope="module")
def lower_rm(tmp_path_factory):
    """Side B: another tiny RM whose tokenizer lowercases its input (a normalizer), so a text with a capital letter
    does not come back from it as itself: a text that round-trips in A but not in B."""
    _, folder = tiny.save_reward_model_with_tokenizer(tmp_path_factory.mktemp("lower") / "rm", seed=7)
    data = json.loads((folder / "tokenizer.json").read_text())
    data["normalizer"] = {"type": "Lowercase"}
    (folder / "tokenizer.json").write_text(json.dumps(data))
    return folder


@pytest.fixture(scope="module")
def lm2_folder(tmp_path_factory, lm_folder):
    """A second tiny causal LM with the SmolLM2 tokenizer: the implicit side's reference."""
    folder = tmp_path_factory.mktemp("lm2") / "lm"
    hf = tiny.build_hf_model("llama3", vocab_size=49152, pad_token_id=2, bos_token_id=1, eos_token_id=2, seed=5)
    tiny.save_hf_model(hf, folder)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(lm_folder / f, folder / f)
    return folder


class _CountingSide(Side):
    """A side whose reward is a text's length, counting every text it scores; texts holding an "e" (or
    `unreadable`) do not round-trip in it."""

    def __init__(self, tokenizer, unreadable: str = "e"):
        self.spec, self.tokenizer, self.vocab, self.scored = SideSpec("counting", ("x", "y")), tokenizer, 100, []
        self.unreadable = unreadable

    def rewards(self, texts):
        self.scored += list(texts)
        return np.asarray([float(len(t)) for t in texts])

    def round_trips(self, text):
        return self.unreadable not in text


@pytest.mark.parametrize("method", ["search", "best_of_n"])
def test_both_sides_forwards_are_charged_and_the_budget_never_passed(rm_folder, lm_folder, monkeypatch, method):
    """Side A's positions (counted from its calls, as the frontier's ledger does) plus side B's whole forwards
    (each = 2 models per text it scores, once per candidate) equal what was charged, within the budget; no
    candidate whose text B cannot read back is scored by B or kept by the search."""
    rm, lm = load(str(rm_folder)), load(str(lm_folder))
    target = make_target(rm, PROMPT)
    n, budget = SEARCH.num_tokens, 240
    ledger = _Ledger(monkeypatch, rm, n, len(target.suffix), target.suffix[0])
    forwards = Forwards(budget, n + len(target.suffix), n + 1)
    side = _CountingSide(rm.tokenizer)
    end = turns.end_of_turn(target.suffix, rm.tokenizer, rm.source)
    partner = Disagreement(rm.tokenizer, end, (0.0, 2.0), side, (1.0, 4.0))
    calls = []
    real_gap = partner.gap
    monkeypatch.setattr(partner, "gap", lambda reward, ids: (calls.append(len(ids)), real_gap(reward, ids))[1])
    obj = Objective(target, Prior.of(lm, target.prefix), 1.0, 1.0, 2.0, forwards, partner=partner)
    banned = np.ones(rm.config.vocab_size, bool)
    banned[300:5000] = False
    drawn, sample = [], baseline.prior_lib.sample_responses
    monkeypatch.setattr(baseline.prior_lib, "sample_responses",
                        lambda *a, **kw: (drawn.append(a[4]), sample(*a, **kw))[1])
    if method == "search":
        found = fluent.fluent_search(obj, SEARCH, banned, [partner.round_trips])
    else:
        found = baseline.best_of_n(obj, SEARCH, banned, [partner.round_trips])
    # the filter ran before B scored anything: best-of-N paid B for readable samples only, as the search pays
    assert all("e" not in t for t in side.scored)
    assert found.spent == forwards.spent <= budget
    # B is paid for each text it runs (a repeated sample's text is scored once, and paid once)
    assert forwards.spent == ledger.forwards() + Fraction(2 * len(side.scored))
    assert sum(calls) >= len(side.scored) == len(set(side.scored)) > 0
    texts = turns.decode(rm.tokenizer, found.ids, end)
    assert all("e" not in t for t in texts)  # nothing B cannot read back is returned
    if method == "best_of_n":  # each readable sample kept; the unreadable drawn, never scored
        assert 0 < len(found.ids) == sum(calls) < sum(drawn)
        assert len(side.scored) == len(set(texts))  # B ran each distinct text once
    want = (found.values.reward, (np.asarray([len(t) for t in texts]) - 1.0) / 4.0)
    reward_a = np.asarray([partner.ledger[tuple(turns.tokens(r, end))][0] for r in found.ids.tolist()])
    np.testing.assert_allclose(want[0], reward_a / 2.0 - want[1], rtol=0, atol=1e-12)  # gap = z_A − z_B


@pytest.mark.parametrize("screen", [0, 2])
def test_best_of_n_with_the_rm_as_its_own_prior_pays_b_for_each_readable_sample(tied, monkeypatch, screen):
    """The RM as its own prior (its sampler's forward is A's): each drawn sample costs one forward, and B's whole
    forwards are charged for the samples it scores, the readable ones (or the screen's share) alone. No test ran
    this branch: B's charge deleted (best-of-N scored B for free), charged for every drawn sample, or A's positions
    charged twice under the screen all passed."""
    _, _, rm = tied
    target = make_target(rm, PROMPT)
    n, budget = SEARCH.num_tokens, 120
    forwards = Forwards(budget, n + len(target.suffix), n + 1)
    end = turns.end_of_turn(target.suffix, rm.tokenizer, rm.source)
    side = _CountingSide(rm.tokenizer, unreadable="x")
    partner = Disagreement(rm.tokenizer, end, (0.0, 2.0), side, (1.0, 4.0))
    obj = Objective(target, Prior.of(rm, target.prefix), 1.0, 1.0, 2.0, forwards, partner=partner, screen=screen)
    assert obj.rm_is_prior and partner.each == 2
    banned = np.ones(rm.config.vocab_size, bool)
    banned[300:5000] = False
    drawn, sample = [], baseline.prior_lib.sample_responses
    monkeypatch.setattr(baseline.prior_lib, "sample_responses",
                        lambda *a, **kw: (drawn.append(a[4]), sample(*a, **kw))[1])
    found = baseline.best_of_n(obj, SEARCH, banned, [partner.round_trips])
    texts = turns.decode(rm.tokenizer, np.asarray(found.ids), end)
    assert 0 < len(side.scored) < sum(drawn) and all("x" not in t for t in side.scored + texts)
    assert len(side.scored) == len(set(side.scored))  # a repeated sample's text is scored, and paid for, once
    assert forwards.spent == sum(drawn) + 2 * len(side.scored) <= budget  # A once a sample, B per text it ran
    assert baseline._affordable(obj, SEARCH, Fraction(screen or SEARCH.search_width, SEARCH.search_width)) == 0


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_a_screened_step_has_b_score_only_a_s_best_and_charges_b_for_those_alone(rm_folder, lm_folder, monkeypatch,
                                                                                 sign):
    """--screen=K: each GCG step's candidates are ranked by A's part of J (sign·reward over A's SD + λ·F), and B
    scores only the K best. The ranking is checked against A's terms of the same candidates scored whole by an
    objective without a partner (another code path: whole turns, no prefix variants); the charge against side A's
    positions counted from its calls plus B's whole forwards for the texts it scored, each step's charge as
    predicted (A's cost of every candidate, B's of the kept); no screened-out candidate is kept."""
    rm, lm = load(str(rm_folder)), load(str(lm_folder))
    target, prior = make_target(rm, PROMPT), Prior.of(lm, make_target(rm, PROMPT).prefix)
    n, budget, keep, lam, scale = SEARCH.num_tokens, 240, 2, 1.0, 2.0
    ledger = _Ledger(monkeypatch, rm, n, len(target.suffix), target.suffix[0])
    forwards = Forwards(budget, n + len(target.suffix), n + 1)
    side = _CountingSide(rm.tokenizer)
    end = turns.end_of_turn(target.suffix, rm.tokenizer, rm.source)
    partner = Disagreement(rm.tokenizer, end, (0.0, scale), side, (1.0, 4.0))
    obj = Objective(target, prior, lam, sign, 2.0, forwards, partner=partner, screen=keep)
    steps, real = [], obj.score_screened

    def screened(cands, k, current, extended, every=None):
        before = forwards.spent
        kept, values = real(cands, k, current, extended, every=every)
        assert forwards.spent - before == sum(obj.cost(cands, current, every, partner=False)) + 2 * min(k, len(cands))
        steps.append((np.asarray(cands), k, kept))
        return kept, values

    monkeypatch.setattr(obj, "score_screened", screened)
    banned = np.ones(rm.config.vocab_size, bool)
    banned[300:5000] = False
    found = fluent.fluent_search(obj, SEARCH, banned, [partner.round_trips])
    assert found.spent == forwards.spent <= budget
    assert forwards.spent == ledger.forwards() + Fraction(2 * len(side.scored))  # B: 2 models a text
    assert any(len(c) > keep for c, _, _ in steps)  # the screen screened
    reference = Objective(target, prior, lam, sign, 2.0, Forwards(10**9, n + len(target.suffix), n + 1))
    archived = {tuple(r) for r in found.ids.tolist()}
    for cands, k, kept in steps:
        assert len(set(kept.tolist())) == len(kept) == min(k, len(cands))
        whole = reference.score(cands)  # no partner: reward is A's alone
        own = sign * whole.reward / scale + lam * (whole.prior_logp - 2.0 * whole.repetition)
        out = np.setdiff1d(np.arange(len(cands)), kept)
        # float32 forwards, cached against whole, agree to ~1e-6 on a tiny model's O(1) terms; 1e-4 leaves room
        assert not len(out) or own[kept].min() >= own[out].max() - 1e-4
        assert {tuple(r) for r in cands[kept].tolist()} <= archived
        assert not {tuple(r) for r in cands[out].tolist()} & archived
    texts = turns.decode(rm.tokenizer, found.ids, end)
    reward_a = np.asarray([partner.ledger[tuple(turns.tokens(r, end))][0] for r in found.ids.tolist()])
    np.testing.assert_allclose(found.values.reward, reward_a / scale - (np.asarray([len(t) for t in texts]) - 1.0)
                               / 4.0, rtol=0, atol=1e-12)  # every kept row has its gap z_A − z_B


def test_a_screened_candidate_with_a_nan_term_of_a_s_is_dropped_before_b_is_charged(rm_folder, lm_folder,
                                                                                     monkeypatch):
    """--allow_nonfinite with --screen: a candidate whose side-A reward is NaN is neither kept nor scored by B, even
    when the screen keeps every candidate; B is charged for the finite ones alone."""
    rm, lm = load(str(rm_folder)), load(str(lm_folder))
    target = make_target(rm, PROMPT)
    prior = Prior.of(lm, target.prefix)
    n = SEARCH.num_tokens
    forwards = Forwards(10**9, n + len(target.suffix), n + 1)
    side = _CountingSide(rm.tokenizer, unreadable="\x00")
    partner = Disagreement(rm.tokenizer, turns.end_of_turn(target.suffix, rm.tokenizer, rm.source), (0.0, 1.0),
                           side, (1.0, 4.0))
    obj = Objective(target, prior, 1.0, 1.0, 2.0, forwards, partner=partner, screen=4, allow_nonfinite=True)
    real = obj._whole_terms

    def one_nan(cands, shared, known):
        reward, logp = real(cands, shared, known)
        return np.where(np.arange(len(reward)) == 1, np.nan, reward), logp

    monkeypatch.setattr(obj, "_whole_terms", one_nan)
    cands = np.random.default_rng(0).integers(300, 5000, size=(4, n)).astype(np.int32)
    before = forwards.spent
    kept, values = obj.score_screened(cands, 4)
    assert sorted(kept.tolist()) == [0, 2, 3] and np.isfinite(values.objective).all()
    texts = turns.decode(rm.tokenizer, cands, partner.end)
    assert sorted(side.scored) == sorted(texts[i] for i in (0, 2, 3))
    assert forwards.spent - before == sum(obj.cost(cands, partner=False)) + 2 * 3
    assert obj.candidates_dropped >= 1


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_screened_best_of_n_buys_more_samples_and_has_b_score_only_a_s_best_share(rm_folder, lm_folder,
                                                                                  monkeypatch, sign):
    """--screen=K applies to the baseline too (the fair control for the screened search): best-of-N draws as many
    samples as A's cost of each plus B's of the best K/search_width share buys, more than unscreened at the same
    budget; B scores only that share, A's best by its part of J (checked against a partner-less objective scoring
    the same samples whole); the ledger holds and nothing screened out is kept."""
    rm, lm = load(str(rm_folder)), load(str(lm_folder))
    target, prior = make_target(rm, PROMPT), Prior.of(lm, make_target(rm, PROMPT).prefix)
    n, budget, keep, lam, scale = SEARCH.num_tokens, 240, 2, 1.0, 2.0
    banned = np.ones(rm.config.vocab_size, bool)
    banned[300:5000] = False
    end = turns.end_of_turn(target.suffix, rm.tokenizer, rm.source)

    def objective(screen: int):
        forwards = Forwards(budget, n + len(target.suffix), n + 1)
        side = _CountingSide(rm.tokenizer, unreadable="x")  # a few samples B cannot read, not most
        partner = Disagreement(rm.tokenizer, end, (0.0, scale), side, (1.0, 4.0))
        return Objective(target, prior, lam, sign, 2.0, forwards, partner=partner, screen=screen), side

    plain, _ = objective(0)
    unscreened = len(baseline.best_of_n(plain, SEARCH, banned).ids)
    ledger = _Ledger(monkeypatch, rm, n, len(target.suffix), target.suffix[0])
    obj, side = objective(keep)
    calls, rounds, real = [], [], obj.score_screened

    def screened_recording(cands, k, **kw):
        kept, values = real(cands, k, **kw)
        calls.append((np.asarray(cands), k, kept, rounds[-1]))  # and the size of the round it screens
        return kept, values

    monkeypatch.setattr(obj, "score_screened", screened_recording)
    drawn, sample = [], baseline.prior_lib.sample_responses
    monkeypatch.setattr(baseline.prior_lib, "sample_responses",
                        lambda *a, **kw: (drawn.append(a[4]), sample(*a, **kw))[1])
    one_round = baseline._round
    monkeypatch.setattr(baseline, "_round", lambda *a: (rounds.append(a[4]), one_round(*a))[1])
    found = baseline.best_of_n(obj, SEARCH, banned, [obj.partner.round_trips])
    share = Fraction(keep, SEARCH.search_width)
    assert 0 < len(calls) <= len(rounds) and sum(rounds) == sum(drawn)  # each round screens its own samples
    for cands, k, kept, count in calls:
        assert k == -(-count * keep // SEARCH.search_width) and len(kept) == min(k, len(cands))
    assert sum(len(kept) for _, _, kept, _ in calls) == len(side.scored)
    assert sum(drawn) > unscreened  # plain best-of-N counts every sample's B forwards
    cands = np.concatenate([c for c, *_ in calls])
    texts = turns.decode(rm.tokenizer, cands, end)  # what B cannot read back ("x") was dropped before the screen
    assert all("x" not in t for t in texts) and all("x" not in t for t in side.scored) and sum(drawn) > len(cands)
    assert baseline._affordable(obj, SEARCH, share) == 0  # one more sample would not fit
    assert obj.forwards.spent == ledger.forwards() + Fraction(2 * len(side.scored)) <= budget
    reference = Objective(target, prior, lam, sign, 2.0, Forwards(10**9, n + len(target.suffix), n + 1))
    kept_rows = []
    for round_cands, _, kept, _ in calls:
        whole = reference.score(round_cands)
        own = sign * whole.reward / scale + lam * (whole.prior_logp - 2.0 * whole.repetition)
        out = np.setdiff1d(np.arange(len(round_cands)), kept)
        # the sampler's f32 log-probs against the whole's
        assert not len(out) or own[kept].min() >= own[out].max() - 1e-4
        kept_rows += [tuple(r) for r in round_cands[kept].tolist()]
    assert any(len(np.setdiff1d(np.arange(len(c)), kept)) for c, _, kept, _ in calls)  # the screen dropped some
    assert {tuple(r) for r in found.ids.tolist()} <= set(kept_rows)


@pytest.mark.parametrize("template", ["plain", "auto"])
def test_one_lm_as_both_implicit_halves_gives_every_token_zero(lm_folder, template, monkeypatch):
    """helper-150: a token's implicit reward took the chosen LM's logprobs row (the token glued to `Assistant:` in
    the plain format) minus the reference's reading of its text (`Assistant: Love`): two responses. One LM as both
    halves (the true implicit reward 0 for every response) had single-token rewards of SD 3.1 on Gemma 3 (the
    disagree job's B yardstick). Now both read the token's text: 0 up to two f32 evaluations of it."""
    lm = load(str(lm_folder))
    side = ImplicitSide(SideSpec.parse(f"implicit:{lm_folder}:x"), lm, lm, PROMPT, template)
    ids = np.random.default_rng(3).choice(np.arange(200, side.vocab), 40, replace=False)
    texts = lm.tokenizer.batch_decode([[int(i)] for i in ids])
    read_back = side.tokens_read_back(ids, texts)
    assert 0 < read_back.sum() < len(ids) or template != "plain"  # plain: both kinds, the row's and the text's
    conversations = Conversations(lm.tokenizer, PROMPT, template)
    atol = 2 * max(tolerance.logprobs_atol(lm.params, lm.config, np.asarray([c], np.int32))
                   for c in conversations.token_ids(texts))
    np.testing.assert_allclose(side.token_rewards(ids), 0.0, rtol=0, atol=atol)
    # the map reads its strings back first (disagree_job._read_back): token_rewards renders none of them again
    rendered = []
    monkeypatch.setattr(sides, "token_round_trips", lambda *a, **k: rendered.append(a) or read_back)
    fresh = ImplicitSide(SideSpec.parse(f"implicit:{lm_folder}:x"), lm, lm, PROMPT, template)
    fresh.tokens_read_back(ids, texts)
    np.testing.assert_allclose(fresh.token_rewards(ids), 0.0, rtol=0, atol=atol)
    assert len(rendered) == 1


def test_the_implicit_side_equals_the_two_lms_logprobs(lm_folder, lm2_folder, tmp_path, monkeypatch):
    """implicit:CHOSEN:REFERENCE of a one-token response is the chosen LM's log-prob minus the reference's, as
    `experiments.logprobs` writes them (one job per LM); a text's is the same through the text path."""
    from rmjax.scoring.logprobs import LogprobsSpec, run_logprobs

    tables = {}
    for name, folder in (("chosen", lm_folder), ("reference", lm2_folder)):
        out = tmp_path / f"{name}.csv"
        run_logprobs(LogprobsSpec(RunOptions(model=str(folder), out=str(out)), {"greatest": PROMPT}))
        tables[name] = pd.read_csv(out, keep_default_na=False).set_index("token_id")["greatest"]
    chosen, reference = load(str(lm_folder)), load(str(lm2_folder))
    side = ImplicitSide(SideSpec.parse(f"implicit:{lm_folder}:{lm2_folder}"), chosen, reference, PROMPT, "auto")
    words = [" cat", " dog", " good", "Love", " the"]
    ids = np.asarray([chosen.tokenizer(w, add_special_tokens=False).input_ids[0] for w in words])
    want = tables["chosen"].loc[ids].to_numpy() - tables["reference"].loc[ids].to_numpy()
    texts = [chosen.tokenizer.decode([int(i)]) for i in ids]

    def bound(model) -> float:
        """logprobs_atol over the LM's own conversations of these responses (its template and tokenization)."""
        conversations = Conversations(model.tokenizer, PROMPT, "auto").token_ids(texts)
        return max(tolerance.logprobs_atol(model.params, model.config, np.asarray([c], np.int32))
                   for c in conversations)

    atol = bound(chosen) + bound(reference)  # a difference of two log-probs, each from two f32 evaluations
    # a text round-trips where both LMs read it back; with whitespace at an edge it does not count (one template
    # keeps it, another strips it)
    assert side.round_trips("Love") and side.round_trips("cats and dogs")
    assert not any(side.round_trips(t) for t in (" cat", "Love ", "cats\n"))
    np.testing.assert_allclose(side.rewards(texts), want, rtol=0, atol=atol)
    np.testing.assert_allclose(side.token_rewards(ids), want, rtol=0, atol=atol)
    # its prompt is prefilled once per LM, whatever it scores after; the budget pays each prefix over the positions
    # one response of N tokens runs (its tokens and the end of turn)
    from rmjax.scoring import judge

    monkeypatch.setattr(judge, "prefill_prefix", lambda *a: pytest.fail("the prompt was prefilled again"))
    np.testing.assert_allclose(side.rewards(texts), want, rtol=0, atol=atol)
    prefixes = [len(chat.split_chat(m.tokenizer, PROMPT, "auto").prefix) for m in (chosen, reference)]
    assert side.prefill_forwards(4) == Fraction(prefixes[0], 5) + Fraction(prefixes[1], 5)


def test_prompt_shifts_against_a_loop_over_the_strings_every_map_holds():
    """Each string's gap after a prompt minus its mean gap after the others, over the strings all maps hold, largest
    first; the job's summary names the map_top at each end."""
    from rmjax.search.disagree import prompt_shifts

    rng = np.random.default_rng(0)
    strings = [f"s{i}" for i in range(60)]
    frames, maps = {}, {}
    for k, prompt in enumerate(("greatest", "best", "worst")):
        mine = [t for i, t in enumerate(strings) if i % 7 != k]  # each map lacks its own few strings
        z_a, z_b = rng.normal(size=len(mine)), rng.normal(size=len(mine))
        frames[prompt] = pd.DataFrame({"text": mine, "z_a": z_a, "z_b": z_b, "gap": z_a - z_b}).sort_values(
            "gap", ascending=False, ignore_index=True)
        maps[prompt] = (frames[prompt], {})
    gap = {p: dict(zip(f.text, f.gap, strict=True)) for p, f in frames.items()}
    common = [t for t in strings if all(t in g for g in gap.values())]
    assert 0 < len(common) < len(strings)
    shifts = prompt_shifts(frames)
    for p in frames:
        others = [q for q in frames if q != p]
        want = {t: gap[p][t] - sum(gap[q][t] for q in others) / len(others) for t in common}
        order = sorted(common, key=lambda t: -want[t])
        got = shifts[p]
        assert got.text.tolist() == order
        np.testing.assert_allclose(got["shift"], [want[t] for t in order], rtol=0, atol=1e-12)
        np.testing.assert_allclose(got.others_gap, [np.mean([gap[q][t] for q in others]) for t in order], rtol=0,
                                   atol=1e-12)
        summary = disagree_out.summaries([], [], maps, DisagreeConfig(map_top=3, vocab_map=True, search=False))[p]
        assert [r["text"] for r in summary["vocab_map"]["rises"]] == order[:3]
        assert [r["text"] for r in summary["vocab_map"]["falls"]] == order[::-1][:3]
    assert prompt_shifts({"greatest": frames["greatest"]}) == {}  # one prompt: nothing to compare
    one = disagree_out.summaries([], [], {"greatest": maps["greatest"]}, DisagreeConfig(vocab_map=True, search=False))
    assert "rises" not in one["greatest"]["vocab_map"]


def test_agreement_against_scipy_and_its_affine_invariance():
    rng = np.random.default_rng(0)
    a = rng.normal(size=50)
    b = a + rng.normal(size=50)
    got = agreement(a, b)
    assert got["kendall_tau"] == pytest.approx(stats.kendalltau(a, b).statistic)
    assert got["pearson_r"] == pytest.approx(stats.pearsonr(a, b).statistic)
    assert agreement(a, 3 * a + 7)["epic_distance"] == pytest.approx(0.0, abs=1e-7)
    assert agreement(a, -a)["epic_distance"] == pytest.approx(1.0)
    # analyze's pairwise table over several RMs: the same distance for every pair, 0 on the diagonal
    frame = pd.DataFrame({"x": a, "y": b, "z": rng.normal(size=50)})
    matrix = epic_distance_matrix(frame)
    for i, j in [("x", "y"), ("x", "z"), ("y", "z")]:
        want = np.sqrt((1 - stats.pearsonr(frame[i], frame[j]).statistic) / 2)
        assert matrix.loc[i, j] == matrix.loc[j, i] == pytest.approx(want)
    assert (np.diag(matrix) == 0).all()


def test_the_vocabulary_map_runs_by_gap_then_text_with_each_sides_z():
    """Rows by gap z_A − z_B, largest first; equal gaps (here exact, from rewards on a grid) by text A→Z, so a
    rerun writes the same order. Sorted here with Python's sorted over (−gap, text)."""
    from rmjax.search.disagree import vocab_map

    rng = np.random.default_rng(3)
    texts = [f"w{i:02d}" for i in rng.permutation(24)]
    shared = pd.DataFrame({"text": texts, "token_a": np.arange(24), "token_b": np.arange(24) + 100})
    ra, rb = rng.integers(0, 4, 24).astype(np.float64), rng.integers(0, 4, 24).astype(np.float64)
    z_a, z_b = (1.0, 2.0), (-1.0, 0.5)
    frame, summary = vocab_map(shared, (ra, rb, 0), z_a, z_b, "q")
    gap = (ra - 1.0) / 2.0 - (rb + 1.0) / 0.5
    want = sorted(range(24), key=lambda i: (-gap[i], texts[i]))
    assert frame["text"].tolist() == [texts[i] for i in want]
    assert len(set(gap.tolist())) < 24  # ties, so the text order is tested
    np.testing.assert_array_equal(frame["gap"], gap[want])
    np.testing.assert_array_equal(frame["token_b"], np.asarray(want) + 100)
    assert summary["n"] == 24 and summary["kendall_tau"] == pytest.approx(stats.kendalltau(ra, rb).statistic)


def test_a_nan_string_of_an_allowed_map_spoils_neither_its_statistics_nor_its_ends():
    """--allow_nonfinite writes a NaN reward into the map: one made the prompt's τ, r and EPIC distance NaN, led
    the summary's B-over-A end, and its missing shift reordered nothing but could not be ranked (a fault hunt).
    The statistics are those of the finite strings alone (scipy), with the dropped count."""
    from rmjax.search.disagree import prompt_shifts

    rng = np.random.default_rng(1)
    ra, rb = rng.normal(size=40), rng.normal(size=40)
    rb_nan = rb.copy()
    rb_nan[[3, 17]] = np.nan
    got, finite = agreement(ra, rb_nan), np.isfinite(rb_nan)
    assert got["n"] == 38 and got["nonfinite"] == 2
    assert got["kendall_tau"] == pytest.approx(stats.kendalltau(ra[finite], rb[finite]).statistic)
    assert got["pearson_r"] == pytest.approx(stats.pearsonr(ra[finite], rb[finite]).statistic)
    texts = [f"s{i}" for i in range(40)]
    frames = {}
    for p, shift in (("greatest", 0.0), ("best", 0.5)):
        frame = pd.DataFrame({"text": texts, "z_a": ra + shift, "z_b": rb_nan, "gap": ra + shift - rb_nan})
        frames[p] = frame.sort_values(["gap", "text"], ascending=[False, True], ignore_index=True)
    summary = disagree_out.summaries([], [], {p: (f, got) for p, f in frames.items()},
                                     DisagreeConfig(map_top=3, vocab_map=True, search=False))["greatest"]["vocab_map"]
    kept = np.flatnonzero(finite)
    lowest = kept[np.argsort((ra - rb)[kept])[:3]]  # the most B-over-A of the finite strings, most first
    assert [r["text"] for r in summary["bottom"]] == [texts[i] for i in lowest]
    assert all(np.isfinite(r["gap"]) for r in summary["top"] + summary["bottom"])
    assert set(prompt_shifts(frames)["greatest"].text) == {t for t, f in zip(texts, finite, strict=True) if f}


def test_rescored_rows_are_held_to_their_dtype_s_rounding():
    """A row whose search score is not its text's is refused; the tolerance is the dtype's rounding. bfloat16's is
    in SDs of the side's rewards: the case an H200 run refused (a 1B Llama shape, 0.12 SD apart) passes, a shift of
    one SD (what a template or tokenization mismatch gives) does not."""
    from rmjax.errors import RmjaxError
    from rmjax.search.disagree_out import check_rescored

    texts = ["x", "y"]
    check_rescored("A", texts, np.array([1.0, -2.0]), np.array([1.0005, -2.001]), "float32", 0.26)
    with pytest.raises(RmjaxError, match="side A's reward of 'y' is -2 scored as a text but -2.003"):
        check_rescored("A", texts, np.array([1.0, -2.0]), np.array([1.0, -2.003]), "float32", 0.26)
    seen = np.array([0.98872, 0.0]), np.array([0.956913, 0.0])
    with pytest.raises(RmjaxError):
        check_rescored("A", texts, *seen, "float32", 0.2635)
    check_rescored("A", texts, *seen, "bfloat16", 0.2635)
    with pytest.raises(RmjaxError, match=r"side B.*\(\+1.00 SD in bfloat16\)"):
        check_rescored("B", texts, np.array([0.5, 0.2635]), np.array([0.5, 0.0]), "bfloat16", 0.2635)


def _spec(a, b, out, lm, **config):
    cfg = DisagreeConfig(**{"direction": "both", "forwards": 150, "top": 3, "front_rows": 4, "z_sample": 64,
                            "vocab_map": True, "b_gradient": True} | config)
    return DisagreeSpec(RunOptions(model=str(a), out=str(out)), (str(a), str(b)), {"greatest": PROMPT}, cfg, SEARCH,
                        lm=str(lm), judge=str(lm))


def _map_a_spread_of_the_shared_strings(monkeypatch, keep: int = 3000) -> list[int]:
    """The job's vocabulary map over `keep` strings spread evenly through the shared ones (in their order), for
    tests whose point is not the whole vocabulary: its read-back and scoring were most of their time (the map of
    every shared string: test_each_map_row_is_what_each_side_scores_its_string_as_a_text). A stored map is read back
    against all the shared strings, as in a job. Returns the number of shared strings each map was given."""
    real, given = disagree_job._read_back, []

    def spread(p, shared, done):
        given.append(len(shared))
        return real(p, shared.iloc[np.unique(np.linspace(0, len(shared) - 1, keep).astype(int))], done)

    monkeypatch.setattr(disagree_job, "_read_back", spread)
    return given


def test_the_job_writes_rows_each_side_scores_as_a_text_and_resumes_byte_for_byte(rm_folder, lower_rm, lm_folder,
                                                                                  tmp_path, monkeypatch, capsys):
    from rmjax.scoring.texts import ScoreSpec, run_score
    from rmjax.search import disagree

    shared = _map_a_spread_of_the_shared_strings(monkeypatch)

    failed = []
    real = disagree.Disagreement.round_trips

    def recording(self, body):
        ok = real(self, body)
        if not ok:
            failed.append(self.tokenizer.decode(list(body)))
        return ok

    monkeypatch.setattr(disagree.Disagreement, "round_trips", recording)
    checked, real_check = [], disagree_out.check_rescored

    def spy_check(side, texts, fresh, searched, dtype, sd):
        checked.append((side, sd))
        return real_check(side, texts, fresh, searched, dtype, sd)

    monkeypatch.setattr(disagree_out, "check_rescored", spy_check)
    # 100 forwards (not _spec's 150) buy each search 2 GCG steps and each screened best-of-N round more readable
    # samples than B scores (at 70 it had none to leave out)
    out, F = tmp_path / "d", 100
    spec = functools.partial(_spec, forwards=F)
    run_disagree(spec(rm_folder, lower_rm, out, lm_folder))
    table = pd.read_csv(out / "disagree.csv", keep_default_na=False)
    # the phases before the search's first line and after its last show progress too (6 silent minutes after the
    # default RMs' search): started, then done
    err = capsys.readouterr().err
    for label, n, unit in (("disagree: yardsticks, single-token rewards on each side", 1, "prompts"),
                           ("disagree: rows completed, re-scored, judged", 3 * len(table), "row checks")):
        assert f"[{label}] 0/{n:,} {unit} (0.0%)" in err and f"[{label}] {n:,}/{n:,} {unit} (100.0%)" in err, err
    assert list(table.columns) == ["prompt", "direction", "method", "rank", "text", "ends_turn", "completed_text",
                                   "reward_a", "reward_b", "z_a", "z_b", "gap", "judge_ppl", "forwards"]
    assert set(table.direction) == {"a_over_b", "b_over_a"} and set(table.method) == {"search", "best_of_n"}
    for _, rows in table.groupby(["direction", "method"]):  # best-of-N's repeats took its rows (the search's none)
        assert rows.text.is_unique
    texts = [json.loads(t) for t in table.text]
    # the round trip: the search met texts B lowercases, and wrote none of them
    assert any(t != t.lower() for t in failed)
    assert all(t == t.lower() for t in texts)
    # each row's completion continues its own text (rows of all units after a prompt are completed together)
    completed = [json.loads(t) for t in table.completed_text]
    assert all(c.startswith(t) and (c == t) == bool(e) for c, t, e in zip(completed, texts, table.ends_turn,
                                                                         strict=True))
    # each side's reward is what experiments.score gives the text, z one affine map per side (score's scale)
    meta = json.loads((out / "disagree.csv.meta.json").read_text())
    # the re-scoring check holds each side to its own yardstick's SD (bfloat16's tolerance is in those SDs)
    yardsticks = meta["yardsticks"]["greatest"]
    assert set(checked) == {("A", yardsticks["a"][1]), ("B", yardsticks["b"][1])}
    phases = meta["seconds_by_phase"]  # where the time went, every phase of the job once
    assert list(phases) == ["load", "prepare", "vocab_map", "yardsticks", "search", "complete", "rescore", "judge"]
    assert sum(phases.values()) == pytest.approx(meta["seconds"], abs=0.05 * len(phases))
    z_atol = {}
    for side, folder in (("a", rm_folder), ("b", lower_rm)):
        scored = run_score(ScoreSpec(RunOptions(model=str(folder), out=None), {"greatest": PROMPT}, tuple(texts),
                                     z_sample=64))
        model = load(str(folder))
        atol = tolerance.any_rewards_atol(model.params, model.config, 64)
        np.testing.assert_allclose(table[f"reward_{side}"], scored.scores["greatest"], rtol=0, atol=max(atol, 1e-6))
        mean, sd = scored.scale["greatest"]
        assert meta["yardsticks"]["greatest"][side] == pytest.approx([mean, sd], abs=atol)
        # how many single tokens it was taken over, none left out for NaN/Inf (the helper-108 record)
        assert meta["yardsticks_sampled"]["greatest"][side]["values"] == 64
        assert meta["yardsticks_sampled"]["greatest"][side]["nonfinite"] is None
        # the yardstick, read from the map, is within atol of score's: z within atol·(1 + |z|)/sd
        want = ((table[f"reward_{side}"] - mean) / sd).to_numpy()
        z_atol[side] = 1e-6 + atol * (1 + np.abs(want).max()) / sd
        np.testing.assert_allclose(table[f"z_{side}"], want, rtol=0, atol=z_atol[side])
    np.testing.assert_allclose(table.gap, table.z_a - table.z_b, rtol=0, atol=1e-6)  # 9 digits in the CSV
    assert (table.forwards <= F).all() and (table.forwards > F - 8).all()
    # the vocabulary map: strings both tokenizers hold as one allowed token, sorted by gap, τ as scipy's
    vocab = pd.read_csv(out / "vocab_map.csv", keep_default_na=False)
    strings = [json.loads(t) for t in vocab.text]
    assert len(strings) == len(set(strings)) > 1000 and all(s == s.lower() for s in strings)
    assert (np.diff(vocab.gap.to_numpy()) <= 0).all()
    a_tok = load(str(rm_folder)).tokenizer
    assert all(a_tok.decode([int(i)]) == s for i, s in zip(vocab.token_a[:50], strings[:50], strict=True))
    summary = meta["summary"]["greatest"]["vocab_map"]
    # its count, and the shared strings it left out: those the map was given and did not keep (here most of them,
    # the spread's), as the report says
    assert summary["n"] == len(vocab) and shared == [len(vocab) + summary["left_out"]] and shared[0] > 20000
    assert summary["kendall_tau"] == pytest.approx(stats.kendalltau(vocab.reward_a, vocab.reward_b).statistic)
    assert [r["text"] for r in summary["top"]] == strings[:20]
    # a crash after two units: the rerun computes the rest and writes the same bytes
    first = (out / "disagree.csv").read_bytes()
    again = tmp_path / "again"
    real_compute, computed = disagree_job._compute, []

    def crash_after_two(*args, **kwargs):
        if len(computed) == 2:
            raise KeyboardInterrupt
        computed.append(1)
        return real_compute(*args, **kwargs)

    monkeypatch.setattr(disagree_job, "_compute", crash_after_two)
    with pytest.raises(KeyboardInterrupt):
        run_disagree(spec(rm_folder, lower_rm, again, lm_folder))
    monkeypatch.setattr(disagree_job, "_compute", real_compute)
    real_map, mapped = disagree_job._map_rewards, []
    monkeypatch.setattr(disagree_job, "_map_rewards", lambda *a: (mapped.append(1), real_map(*a))[1])
    run_disagree(spec(rm_folder, lower_rm, again, lm_folder))
    assert (again / "disagree.csv").read_bytes() == first
    # the map the crashed run stored is read, not scored again, and written alike
    assert not mapped and (again / "vocab_map.csv").read_bytes() == (out / "vocab_map.csv").read_bytes()
    # --methods=best_of_n (a control rerun): the joint run's best-of-N rows, alone; --screen is the search's alone
    # unless --screen_best_of_n
    real_screened, screened_calls = Objective.score_screened, []

    def spy(self, cands, keep, *args, **kwargs):
        kept, values = real_screened(self, cands, keep, *args, **kwargs)
        tok = self.target.model.tokenizer
        screened_calls.append((len(cands), keep, {tok.decode(turns.tokens(r, self.end)) for r in cands[kept].tolist()}))
        return kept, values

    monkeypatch.setattr(Objective, "score_screened", spy)
    alone = tmp_path / "alone"  # the joint run's --screen=2 screens its search only: best-of-N alone has none
    # (the controls skip the map, which reads the whole vocabulary: their yardsticks score the same sampled tokens)
    run_disagree(spec(rm_folder, lower_rm, alone, lm_folder, methods="best_of_n", b_gradient=False, vocab_map=False))
    assert not screened_calls
    control = pd.read_csv(alone / "disagree.csv", keep_default_na=False)
    joint = table[table.method == "best_of_n"].reset_index(drop=True)
    assert set(control.method) == {"best_of_n"} and len(control) == len(joint) > 0
    z_columns = ["z_a", "z_b", "gap"]  # its yardsticks scored their tokens apart from the map: z within rounding
    pd.testing.assert_frame_equal(control.drop(columns=z_columns), joint.drop(columns=z_columns), check_exact=False,
                                  rtol=0, atol=1e-6)
    for side in ("a", "b"):
        np.testing.assert_allclose(control[f"z_{side}"], joint[f"z_{side}"], rtol=0, atol=z_atol[side])
    np.testing.assert_allclose(control.gap, joint.gap, rtol=0, atol=z_atol["a"] + z_atol["b"])
    screened = tmp_path / "screened"
    real_best_of_n = disagree_job.best_of_n
    monkeypatch.setattr(disagree_job, "best_of_n", lambda *a: (screened_calls.append("unit"), real_best_of_n(*a))[1])
    run_disagree(spec(rm_folder, lower_rm, screened, lm_folder, methods="best_of_n", screen=1, screen_best_of_n=True,
                       b_gradient=False, vocab_map=False))
    units = json.loads((screened / "disagree.csv.meta.json").read_text())["units"]
    assert len(units) == 2 and all(u["method"] == "best_of_n" for u in units)
    # --screen_best_of_n: screened scorings in each unit (one a round of samples), B scoring fewer than the readable
    # samples of its first round, and every written row among those B scored in its unit
    per_unit = [[]]
    for call in screened_calls[1:]:
        per_unit.append([]) if call == "unit" else per_unit[-1].append(call)
    assert screened_calls[0] == "unit" and len(per_unit) == 2 and all(calls for calls in per_unit)
    assert all(0 < calls[0][1] < calls[0][0] for calls in per_unit)
    written = pd.read_csv(screened / "disagree.csv", keep_default_na=False)
    for calls, (_, rows) in zip(per_unit, written.groupby("direction", sort=False), strict=True):
        assert {json.loads(t) for t in rows.text} <= set().union(*(kept for _, _, kept in calls))
    assert written.text.tolist() != joint.text.tolist()
    _analyze_seeds_of_a_real_run(out, again, tmp_path)


def test_bad_sides_and_budgets_are_refused_before_any_model_loads(rm_folder, lm_folder, lm2_folder, lower_rm,
                                                                    tmp_path, monkeypatch):
    no_weights_read(monkeypatch)
    out = tmp_path / "x"
    implicit = f"implicit:{lm_folder}:{lm2_folder}"
    refused(lambda: run_disagree(_spec(implicit, rm_folder, out, lm_folder)), "side A", "reward model")
    refused(lambda: run_disagree(_spec(rm_folder, rm_folder, out, lm_folder)), "does not disagree with itself")
    # one model spelled twice (rm and rm/): loaded twice, a map of gaps 0 and tau 1
    refused(lambda: run_disagree(_spec(rm_folder, f"{rm_folder}/", out, lm_folder)), "does not disagree with itself")
    refused(lambda: run_disagree(_spec(rm_folder, f"implicit:{lm_folder}:{lm_folder}/../{lm_folder.name}", out,
                                       lm_folder)), "the same model")
    # one model by content, spelt as two folders (a copy): gaps all 0 (helper-116's fault hunt: it ran)
    copy, lm_copy = cli.copy_folder(rm_folder, tmp_path / "copy"), cli.copy_folder(lm_folder, tmp_path / "lm_copy")
    refused(lambda: run_disagree(_spec(rm_folder, copy, out, lm_folder)), f"--models: {rm_folder} and {copy} are one "
            "model", "does not disagree with itself")
    refused(lambda: run_disagree(_spec(rm_folder, f"implicit:{lm_folder}:{lm_copy}", out, lm_folder, b_gradient=False)),
            "the chosen and the reference LM are one model")
    # an --output_column a side lacks: with --overwrite the earlier result was deleted before the weights said so
    def column(model, n, lm=lm_folder):
        return dataclasses.replace(_spec(model, lower_rm, out, lm), options=RunOptions(
            model=str(model), out=str(out), output_column=n, overwrite=True))

    refused(lambda: run_disagree(column(rm_folder, 3)), "--output_column=3", "has 1 reward outputs")
    two = cli.copy_folder(rm_folder, tmp_path / "two")
    config = json.loads((two / "config.json").read_text())
    (two / "config.json").write_text(json.dumps({**config, "num_labels": 2, "id2label": {"0": "a", "1": "b"}}))
    # side A as --lm too is loaded once, as an LM: its rewards read column 0 under an identity that said 1
    refused(lambda: run_disagree(column(two, 1, lm=two)), "--output_column=1", "also read as a language model")
    # the map's shared strings follow --allow_non_ascii on both sides (side B's filter was fixed off: the flag was
    # recorded and changed nothing)
    from types import SimpleNamespace

    from rmjax.search.gcg_swaps import disallowed_ids

    tok = config_and_tokenizer(str(rm_folder))[1]
    side = SimpleNamespace(tokenizer=tok, vocab=len(tok))
    for allow in (False, True):
        ready = SimpleNamespace(side_a=side, side_b=side, banned=disallowed_ids(tok, len(tok), False, allow))
        shared = disagree_job._shared(ready, DisagreeConfig(allow_non_ascii=allow))
        assert any(not text.isascii() for text in shared.text) == allow
    refused(lambda: run_disagree(_spec(rm_folder, "implicit:onlyone", out, lm_folder)), "implicit:CHOSEN_LM")
    # an RM as an implicit side's LM (helper-150: a head-only RM and its own base LM ran as two models, every
    # implicit reward 0); experiments.logprobs refuses an RM as well
    for side in (f"implicit:{lower_rm}:{lm_folder}", f"implicit:{lm_folder}:{lower_rm}"):
        refused(lambda side=side: run_disagree(_spec(rm_folder, side, out, lm_folder, b_gradient=False)),
                f"={lower_rm} is a reward model", "two causal LMs' log-prob difference")
    refused(lambda: run_disagree(_spec(rm_folder, implicit, out, lm_folder, forwards=3, b_gradient=False)),
            "--forwards=3")
    refused(lambda: DisagreeConfig(search=False, vocab_map=False), "--nosearch")
    # the map's batch: negative refused; one the host cannot hold refused by the sweep's memory plan, naming the
    # largest that fits (which the plan then accepts), before any weight is read
    refused(lambda: dataclasses.replace(_spec(rm_folder, lower_rm, out, lm_folder), batch_size=-1), "batch_size")
    line = refused(lambda: run_disagree(dataclasses.replace(_spec(rm_folder, lower_rm, out, lm_folder),
                                                            batch_size=10**12)), "--batch_size=1000000000000",
                   "does not fit", "is the largest that fits")
    fits = int(line.split("smaller --batch_size: ")[1].split(" ")[0])
    assert 256 < fits < 10**12
    held = sum(_tensor_bytes(f) for f in (rm_folder, lower_rm, lm_folder, lm_folder))  # the prior and the judge
    assert disagree_job.map_batch(dataclasses.replace(_spec(rm_folder, lower_rm, out, lm_folder), batch_size=fits),
                                  [config_and_tokenizer(str(rm_folder))], held) == fits
    # off the CPU the plan would pick up to 4096 for one model alone; the job holds several, so 0 stays at 256
    from rmjax.scoring import memory

    monkeypatch.setattr(memory.jax, "default_backend", lambda: "gpu")
    alone = memory.plan(config_and_tokenizer(str(rm_folder))[0], "float32", 64, 8, None).batch_size
    assert alone > 256
    assert disagree_job.map_batch(_spec(rm_folder, lower_rm, out, lm_folder),
                                  [config_and_tokenizer(str(rm_folder))]) == 256
    # an implicit side of one LM twice rewards every text 0: z_B a constant, the "disagreement" A's reward alone
    refused(lambda: run_disagree(_spec(rm_folder, f"implicit:{lm_folder}:{lm_folder}", out, lm_folder)),
            "the same model", "reward is 0 for every text")
    # settings that would change nothing yet be recorded as used
    refused(lambda: run_disagree(_spec(rm_folder, implicit, out, lm_folder)), "--b_gradient", "implicit")
    refused(lambda: DisagreeConfig(methods="best_of_n", b_gradient=True), "--b_gradient")
    refused(lambda: DisagreeConfig(screen_best_of_n=True), "--screen_best_of_n", "--screen=K")
    refused(lambda: DisagreeConfig(screen=2, screen_best_of_n=True, methods="search"), "--screen_best_of_n")
    refused(lambda: DisagreeConfig(screen=2, methods="best_of_n"), "--screen", "--screen_best_of_n")
    refused(lambda: DisagreeConfig(screen=2, search=False, vocab_map=True), "--screen")
    # a screen as wide as the step (accepted before) has B score every candidate: it screens nothing
    refused(lambda: _spec(rm_folder, lower_rm, out, lm_folder, screen=SEARCH.search_width), "screens nothing")
    # every prompt is checked, whatever its place: the context of each model (side B's too) and the budget
    long = " ".join(["word"] * 600)
    for prompts_ in ({"greatest": PROMPT, "long": long}, {"long": long, "greatest": PROMPT}):
        spec = dataclasses.replace(_spec(rm_folder, lower_rm, out, lm_folder), prompts=prompts_)
        refused(lambda spec=spec: run_disagree(spec), "prompt 'word word", "max_position_embeddings")
    need = {}
    for name, text in (("short", "Hi?"), ("longer", " ".join(["word"] * 120))):
        line = refused(lambda name=name, text=text: run_disagree(dataclasses.replace(
            _spec(rm_folder, lower_rm, out, lm_folder, forwards=3), prompts={name: text})), "--forwards=3")
        need[name] = int(line.split("give --forwards=")[1].split(" ")[0])
    assert need["short"] < need["longer"]
    # the least budget buys every model's prefill (side B's too: its prefix over one response's positions there)
    # and one candidate: a prior sample, A's score and B's
    longer, n = " ".join(["word"] * 120), SEARCH.num_tokens

    def prefill(folder, reads_suffix: bool) -> Fraction:
        split = chat.split_chat(config_and_tokenizer(str(folder))[1], longer, "auto")
        return Fraction(len(split.prefix), n + (max(len(split.suffix), 1) if reads_suffix else 1))

    paid = prefill(rm_folder, True) + prefill(lm_folder, False) + prefill(lower_rm, True)
    assert need["longer"] == max(math.ceil(paid + 3), math.ceil(3 / Fraction(SEARCH.start_share)))
    for order in (("short", "longer"), ("longer", "short")):
        texts = {"short": "Hi?", "longer": " ".join(["word"] * 120)}
        spec = dataclasses.replace(_spec(rm_folder, lower_rm, out, lm_folder, forwards=need["longer"] - 1),
                                   prompts={k: texts[k] for k in order})
        refused(lambda spec=spec: run_disagree(spec), f"give --forwards={need['longer']} or more")
    assert not out.exists()


def test_the_summary_claims_no_win_over_a_best_of_n_that_did_not_run():
    """--methods=search: the summary said the search beat best-of-N (there was nothing to beat); --methods=best_of_n:
    that the search lost to it (a fault hunt)."""
    cfg = DisagreeConfig(direction="a_over_b", methods="search")
    unit = disagree_job.Unit("greatest", "a_over_b", "search", np.zeros((1, 3), np.int64), np.zeros(1), np.zeros(1),
                             100.0, 1.0)
    row = {"prompt": "greatest", "direction": "a_over_b", "method": "search", "rank": 1, "text": '"x"',
           "ends_turn": 1, "completed_text": '"x"', "reward_a": 0.0, "reward_b": 0.0, "z_a": 0.1, "z_b": 0.0,
           "gap": 0.1, "judge_ppl": 10.0, "forwards": 100.0}
    entry = disagree_out.summaries([row], [unit], {}, cfg)["greatest"]["a_over_b"]
    assert entry["at_cap"]["search"]["gap"] == 0.1 and entry["at_cap"]["search_beats_best_of_n"] is None
    assert entry["at_cap"]["search"]["text"] == "x"  # the text, not its CSV cell '"x"' (JSON-quoted twice in .meta)
    both = disagree_out.summaries([row], [unit, dataclasses.replace(unit, method="best_of_n")], {},
                                  DisagreeConfig(direction="a_over_b"))["greatest"]["a_over_b"]
    assert both["at_cap"]["search_beats_best_of_n"] is True  # best-of-N ran and wrote no row under the cap
    # the other way round: the search wrote no row under the cap and best-of-N did: a loss (it said None)
    units = [unit, dataclasses.replace(unit, method="best_of_n")]
    lost = disagree_out.summaries([{**row, "method": "best_of_n"}], units, {},
                                  DisagreeConfig(direction="a_over_b"))["greatest"]["a_over_b"]
    assert lost["at_cap"]["search"] is None and lost["at_cap"]["search_beats_best_of_n"] is False
    # --methods=best_of_n: the search did not run, so it did not lose either (it said False)
    alone_cfg = DisagreeConfig(direction="a_over_b", methods="best_of_n")
    alone = disagree_out.summaries([{**row, "method": "best_of_n"}], [dataclasses.replace(unit, method="best_of_n")],
                                   {}, alone_cfg)["greatest"]["a_over_b"]
    assert alone["at_cap"]["best_of_n"]["gap"] == 0.1 and alone["at_cap"]["search_beats_best_of_n"] is None


def _analyze_seeds_of_a_real_run(out, again, tmp_path):
    """analyze --disagreements reads the job's own summary (tests/test_analysis_disagreements.py checks its
    numbers): two runs of one seed are refused; with a copy labelled seed 1 each cell counts the runs where both
    methods have a row under the cap (the tiny judge's perplexity may leave none)."""
    import shutil

    from tests.inproc import analyze, refused

    refused(lambda: analyze(tmp_path / "same", disagreements=(str(out), str(again))), "seed 0 is given twice")
    other = tmp_path / "seed1"
    shutil.copytree(out, other)
    meta_file = other / "disagree.csv.meta.json"
    meta = json.loads(meta_file.read_text())
    meta["identity"]["search"]["seed"] = 1
    meta_file.write_text(json.dumps(meta))
    found = analyze(tmp_path / "seeds", disagreements=(str(out), str(other)))
    table = pd.read_csv(found["tables"]["disagreement_seeds"], keep_default_na=False)
    summary = meta["summary"]["greatest"]
    assert [(r.direction, r.view) for r in table.itertuples()] == [
        (d, v) for d in ("a_over_b", "b_over_a") for v in ("at_cap", "complete")]
    for row in table.itertuples():
        cell = summary[row.direction][row.view]
        both = bool(cell["search"] and cell["best_of_n"])
        assert row.runs == 2 * both and (not both or row.ci_low == row.ci_high == row.advantage)


def test_a_rerun_leaves_no_earlier_runs_map_beside_its_results(rm_folder, lower_rm, lm_folder, tmp_path, monkeypatch):
    """vocab_map.csv was the job's own only when this run wrote one: a map-only run, then a search without a map
    with --overwrite into the same folder, left the first run's map beside the second's results; a map-only rerun
    over a search left the search's record. One search, a map-only rerun, then the search again."""
    _map_a_spread_of_the_shared_strings(monkeypatch)
    out = tmp_path / "d"
    spec = _spec(rm_folder, lower_rm, out, lm_folder, vocab_map=False, b_gradient=False, direction="a_over_b",
                 methods="best_of_n")
    again = dataclasses.replace(spec, options=dataclasses.replace(spec.options, overwrite=True))
    run_disagree(spec)
    # a map-only rerun over the search's folder leaves none of the search's files, its record included
    run_disagree(dataclasses.replace(_spec(rm_folder, lower_rm, out, lm_folder, search=False, b_gradient=False),
                                     options=again.options))
    assert (out / "vocab_map.csv").is_file()
    assert not [p.name for p in out.iterdir() if p.name.startswith("disagree")]
    charged = []  # each unit's first charge: the prompt's prefill
    real_charge = Forwards.charge

    def spy(self, rm_positions=0, lm_positions=0, whole=0):
        if self.spent == 0:
            charged.append(self.cost(rm_positions, lm_positions, whole))
        return real_charge(self, rm_positions, lm_positions, whole)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Forwards, "charge", spy)
        run_disagree(again)
    assert (out / "disagree.csv").is_file() and not (out / "vocab_map.csv").exists()
    assert not (out / "vocab_map.csv.meta.json").exists()  # nor the map-only run's record
    # each model's prefix over the positions one response of N tokens runs in it: A's (and its suffix), the
    # prior's (and an end of turn) and side B's, an RM reading its suffix (side B's had been left out)
    n = SEARCH.num_tokens

    def prefill(folder, reads_suffix: bool) -> Fraction:
        split = chat.split_chat(load(str(folder)).tokenizer, PROMPT, "auto")
        return Fraction(len(split.prefix), n + (max(len(split.suffix), 1) if reads_suffix else 1))

    assert charged == [prefill(rm_folder, True) + prefill(lm_folder, False) + prefill(lower_rm, True)]


def test_each_map_row_is_what_each_side_scores_its_string_as_a_text(rm_folder, lower_rm, lm_folder, tmp_path,
                                                                    monkeypatch):
    """The vocabulary map scores prefix + [id] + suffix: under the plain template 'love' reads as ' love', so a
    string whose conversation is another sequence held a reward no text of it gets (a fault hunt: 32% of the default
    pair's strings, B's 'love' +3.23 in the map, +3.68 as a text). Each row now equals experiments.score's reward
    of its string on each side, and the strings left out are counted. The map alone loads the two sides only: a
    prior given from Python (`lm`, which the entry point refuses with --nosearch) is neither loaded nor counted."""
    from rmjax.scoring.texts import ScoreSpec, run_score

    out = tmp_path / "plain"
    spec = _spec(rm_folder, lower_rm, out, lm_folder, search=False, b_gradient=False)
    loaded, real_load = [], disagree_job.load_for_job
    monkeypatch.setattr(disagree_job, "load_for_job", lambda o, m, *rest: loaded.append(m) or real_load(o, m, *rest))
    run_disagree(dataclasses.replace(spec, options=dataclasses.replace(spec.options, template="plain")))
    assert sorted(loaded) == sorted([str(rm_folder), str(lower_rm)]), loaded
    vocab = pd.read_csv(out / "vocab_map.csv", keep_default_na=False)
    meta = json.loads((out / "vocab_map.csv.meta.json").read_text())
    assert meta["summary"]["greatest"]["vocab_map"]["left_out"] > 100  # the strings without a leading space
    rows = vocab.iloc[np.linspace(0, len(vocab) - 1, 40).astype(int)]
    texts = tuple(json.loads(t) for t in rows.text)
    for side, folder in (("a", rm_folder), ("b", lower_rm)):
        scored = run_score(ScoreSpec(RunOptions(model=str(folder), out=None, template="plain"),
                                     {"greatest": PROMPT}, texts, z_sample=64)).scores["greatest"]
        model = load(str(folder))
        np.testing.assert_allclose(rows[f"reward_{side}"], scored, rtol=0,
                                   atol=max(tolerance.any_rewards_atol(model.params, model.config, 64), 1e-6))


def test_best_of_n_rows_are_distinct_samples():
    """disagree wrote best-of-N's repeats as ranks 1–4 of one text: its rows held fewer of its finds than the
    search's (whose archive is distinct). Each sample is kept once, at its first draw, with its own terms (the job
    test checks the written rows are distinct)."""
    from rmjax.search.terms import Values

    ids = np.array([[1, 2], [3, 4], [1, 2], [5, 6], [3, 4]])
    terms = np.arange(5.0)
    found = fluent.Found(ids, Values(terms, terms + 10, terms + 20, terms + 30), Fraction(5), [])
    kept = baseline.distinct_samples(found)
    assert kept.ids.tolist() == [[1, 2], [3, 4], [5, 6]] and kept.values.reward.tolist() == [0.0, 1.0, 3.0]
    assert kept.values.objective.tolist() == [30.0, 31.0, 33.0] and kept.spent == 5  # each was paid for


def test_the_judge_reads_its_own_template_whatever_the_sides_read(rm_folder, lower_rm, lm_folder, tmp_path):
    """disagree passed the sides' --template to the judge: with --template=chat a judge without a chat template
    stopped the job after both sides had loaded (naming no judge), and --template=plain read a chat judge otherwise
    than the frontier's judge does. The judge reads its own template ("auto"), as in the frontier."""
    from rmjax.scoring.judge import judge_perplexities
    judge = cli.copy_without_chat_template(lm_folder, tmp_path / "plain_judge")
    out = tmp_path / "out"
    cfg = DisagreeConfig(direction="a_over_b", forwards=150, top=2, front_rows=0, z_sample=64, vocab_map=False,
                         b_gradient=False, methods="best_of_n")
    run_disagree(DisagreeSpec(RunOptions(model=str(rm_folder), out=str(out), template="chat"),
                              (str(rm_folder), str(lower_rm)), {"greatest": PROMPT}, cfg, SEARCH, lm=str(lm_folder),
                              judge=str(judge)))
    table = pd.read_csv(out / "disagree.csv", keep_default_na=False)
    texts = [json.loads(t) for t in table.text]
    want = judge_perplexities(load(str(judge)), PROMPT, texts, end_of_turn=True)
    np.testing.assert_allclose(table.judge_ppl, want, rtol=1e-6)  # 9 digits in the CSV; one float32 program


def test_the_end_of_turn_is_never_a_response_token_under_allow_special(rm_folder, lower_rm, lm_folder, tmp_path):
    """disagree --allow_special let the end of turn be a response token, as the frontier's did (an empty turn,
    scored as an answer); only the frontier had a test. The other special tokens are allowed."""
    spec = _spec(rm_folder, lower_rm, tmp_path / "d", lm_folder, allow_special=True)
    a, b = disagree_config.parse_sides(spec.models)
    models = disagree_job._load(spec, a, b)
    rm = models[a.models[0]]
    ready = disagree_job._prepare(spec, models, a, b, rm, models[spec.lm], "greatest", PROMPT)
    special = set(rm.tokenizer.all_special_ids) - {ready.end}
    assert ready.banned[ready.end] and special and not ready.banned[sorted(special)].any()


def test_a_stored_map_is_read_only_for_the_strings_of_this_run(tmp_path):
    """A rerun reads a prompt's stored map (disagree_job._map_of) only where its token pairs are the shared strings
    it kept, in their order; any other chunk is refused naming the file to delete."""
    from rmjax.errors import ResumeMismatchError
    from rmjax.runs.chunks import ChunkStore

    store = ChunkStore(tmp_path / "out.csv", {"job": "test"}, 1)
    shared = pd.DataFrame({"text": ["a", "b", "c"], "token_a": [5, 6, 7], "token_b": [50, 60, 70]})
    kept = np.asarray([[2, 1, np.nan, np.nan], [5, 50, 0.25, -1.5], [7, 70, 3.0, 0.125]])
    store.write("m0000", kept)
    readable, (ra, rb, layers) = disagree_job._read_map(store, "m0000", shared)
    assert readable.text.tolist() == ["a", "c"] and ra.tolist() == [0.25, 3.0] and rb.tolist() == [-1.5, 0.125]
    assert layers == 1
    for bad in (kept[[0, 2, 1]], np.vstack([[3, 1, np.nan, np.nan], kept[1:], [[9, 90, 0.0, 0.0]]]),
                kept[:, :3], np.vstack([[2, 1, np.nan, np.nan], [[5, 60, 0.0, 0.0]], kept[2:]]),
                np.vstack([[1, 1, np.nan, np.nan], kept[1:]])):
        store.write("m0000", bad)
        with pytest.raises(ResumeMismatchError, match=r"m0000.npy is not a vocabulary map of this run \(.*\); delete"):
            disagree_job._read_map(store, "m0000", shared)


def _tensor_bytes(folder, skip: str | None = None) -> int:
    """A checkpoint's weights in bytes, from its safetensors headers (each stored tensor once; none whose name
    holds `skip`)."""
    from safetensors import safe_open

    total = 0
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), "np") as f:
            for key in (k for k in f.keys() if skip is None or skip not in k):
                tensor = f.get_slice(key)
                assert tensor.get_dtype() == "F32", (path, key)
                total += 4 * math.prod(tensor.get_shape())
    return total


def test_a_forked_map_on_a_cpu_in_bfloat16_counts_both_rms_float32_copies(rm_folder, lower_rm, lm_folder, tmp_path,
                                                                         monkeypatch):
    """Two RMs of one architecture may share lower layers: the map then runs both in one forward, and on a CPU
    in bfloat16 XLA holds a float32 copy of each one's layer weights for the call (its compile of SmolLM2-135M's
    forked step: 829 MiB of temp, 423 for the one-model step). The weights check counts both copies, and each
    RM's map plan the other's weights and its copy. Reference sizes: the float32 checkpoints' tensors, the copy
    all but the embedding table (only gathered from). A side B of another architecture shares no layer: one copy,
    the larger, is counted."""
    from rmjax.scoring import memory
    from rmjax.search.sweep import memory_plan

    def parts(folder):  # (bfloat16 weights with the score head kept in float32, the float32 copy of the rest)
        total, embedding = _tensor_bytes(folder), _tensor_bytes(folder) - _tensor_bytes(folder, skip="embed_tokens")
        score = total - _tensor_bytes(folder, skip="score")
        return (total - score) // 2 + score, total - embedding - score

    (weights_a, copy_a), (weights_b, copy_b) = parts(rm_folder), parts(lower_rm)
    weights = weights_a + weights_b
    spec = _spec(rm_folder, lower_rm, tmp_path / "d", lm_folder, search=False, b_gradient=False)
    spec = dataclasses.replace(spec, options=dataclasses.replace(spec.options, dtype="bfloat16"))
    no_weights_read(monkeypatch)
    monkeypatch.setattr(memory, "device_memory_bytes", lambda: weights + copy_a + copy_b - 1)
    refused(lambda: run_disagree(spec), "the disagreement job holds 2 models at once")
    monkeypatch.setattr(memory, "device_memory_bytes", lambda: weights + copy_a + copy_b)
    assert "models at once" not in refused(lambda: run_disagree(spec), "does not fit", "the job's other models")
    # a side B of another architecture shares no layer with A: a call holds one copy, the larger
    _, other = tiny.save_reward_model_with_tokenizer(tmp_path / "other", seed=5, num_hidden_layers=3)
    weights_c, copy_c = parts(other)
    assert copy_c < copy_a
    three = dataclasses.replace(spec, models=(str(rm_folder), str(other)))
    monkeypatch.setattr(memory, "device_memory_bytes", lambda: weights_a + weights_c + copy_a)
    assert "models at once" not in refused(lambda: run_disagree(three), "does not fit", "the job's other models")
    monkeypatch.setattr(memory, "device_memory_bytes", lambda: weights_a + weights_c + copy_a - 1)
    refused(lambda: run_disagree(three), "the disagreement job holds 2 models at once")
    # side A's plan at a batch of 8 (its weights and its copy in it) beside B's weights and B's copy
    own8 = memory_plan(*config_and_tokenizer(str(rm_folder)), {"greatest": PROMPT}, "auto", "bfloat16", None, 8)
    assert own8.params_bytes == weights_a and own8.upcast_bytes == copy_a
    monkeypatch.setattr(memory, "device_memory_bytes", lambda: own8.total_bytes + weights_b + copy_b)
    with pytest.raises(AssertionError, match="a weight was read"):  # 8 passes every check
        run_disagree(dataclasses.replace(spec, batch_size=8))
    refused(lambda: run_disagree(dataclasses.replace(spec, batch_size=16)), "--batch_size=16", "does not fit",
            "the job's other models", "--batch_size: 8 is the largest that fits")


def test_the_models_a_job_holds_at_once_fit_together_and_the_map_batch_beside_them(rm_folder, lower_rm, lm_folder,
                                                                                   tmp_path, monkeypatch):
    """Each model was planned as if the device were its own. The disagreement job holds side A, side B, the prior
    and the judge at once (the judge loaded apart, here the prior's folder again), the frontier the RM, its prior and
    the judge, GCG its RMs and prior. A device all fit on alone but not together is refused before any weight is
    read, naming each. The
    map's batch is planned beside the other models' weights: on a device with room for those and a batch of 8 of
    side A's work, 8 is kept and 16 refused (planned alone, 16 fitted). Reference sizes: the float32 checkpoints'
    tensors (safetensors headers)."""
    from rmjax.scoring import memory
    from rmjax.search import frontier_checks
    from rmjax.search.frontier_job import FrontierConfig, FrontierSpec, run_frontier
    from rmjax.search.gcg_config import GCGConfig
    from rmjax.search.gcg_job import GcgSpec, run_gcg
    from rmjax.search.sweep import memory_plan

    sizes = {f: _tensor_bytes(f) for f in (rm_folder, lower_rm, lm_folder)}
    held = sizes[rm_folder] + sizes[lower_rm] + 2 * sizes[lm_folder]
    out = tmp_path / "d"
    no_weights_read(monkeypatch)
    monkeypatch.setattr(memory, "device_memory_bytes", lambda: held - 1)
    line = refused(lambda: run_disagree(_spec(rm_folder, lower_rm, out, lm_folder)),
                   "the disagreement job holds 4 models at once", f"the RM {rm_folder}", f"the prior --lm={lm_folder}",
                   f"the judge --judge={lm_folder}", "more than its")
    assert str(lower_rm) in line
    # with room for exactly the four, the weights pass; the map's batch beside them does not fit
    monkeypatch.setattr(memory, "device_memory_bytes", lambda: held)
    line = refused(lambda: run_disagree(_spec(rm_folder, lower_rm, out, lm_folder)), "does not fit",
                   "the job's other models")
    assert "models at once" not in line
    frontier = FrontierSpec(RunOptions(model=str(rm_folder), out=str(tmp_path / "f")), {"greatest": PROMPT},
                            FrontierConfig(forwards=200, z_sample=64), SEARCH, lm=str(lm_folder), judge=str(lm_folder))
    monkeypatch.setattr(memory, "device_memory_bytes", lambda: sizes[rm_folder] + 2 * sizes[lm_folder] - 1)
    refused(lambda: run_frontier(frontier), "the frontier job holds 3 models at once")
    monkeypatch.setattr(memory, "device_memory_bytes", lambda: sizes[rm_folder] + 2 * sizes[lm_folder])
    frontier_checks.check_before_loading(frontier, str(lm_folder))  # exactly room: passes
    # a prior that is the RM: the frontier loads it apart, the disagreement job once (the RM is then its own
    # prior: one forward a sampled candidate, as Objective.rm_is_prior charges it, not two)
    for load_once, n in ((False, 3), (True, 2)):
        checks = frontier_checks.PromptChecks(frontier.options, SEARCH, str(rm_folder), str(lm_folder),
                                              load_once=load_once)
        assert len(checks.held) == n
        assert (checks.own_prior, checks.candidate) == ((True, 1) if load_once else (False, 2))
    # GCG over two RMs with a prior for its completion check
    gcg = GcgSpec(RunOptions(model=f"{rm_folder},{lower_rm}", out=str(tmp_path / "g.json")), {"greatest": PROMPT},
                  GCGConfig(num_tokens=2, steps=1), lm=str(lm_folder))
    monkeypatch.setattr(memory, "device_memory_bytes", lambda: sum(sizes.values()) - 1)
    refused(lambda: run_gcg(gcg), "the GCG job holds 3 models at once", f"the prior --lm={lm_folder}")
    # with room for exactly the three, each RM's search is planned beside the others' weights: no room for it
    monkeypatch.setattr(memory, "device_memory_bytes", lambda: sum(sizes.values()))
    line = refused(lambda: run_gcg(gcg), "does not fit")
    assert "models at once" not in line
    # the map's batch beside the others: side A's own work at a batch of 8 (the sweep's plan) is what is left
    a = config_and_tokenizer(str(rm_folder))
    monkeypatch.setattr(memory, "device_memory_bytes", lambda: 10**12)
    own8 = memory_plan(*a, {"greatest": PROMPT}, "auto", "float32", None, 8)
    assert own8.params_bytes == sizes[rm_folder]
    room = held + own8.total_bytes - own8.params_bytes
    monkeypatch.setattr(memory, "device_memory_bytes", lambda: room)
    assert memory_plan(*a, {"greatest": PROMPT}, "auto", "float32", None, 16).batch_size == 16  # alone it fitted
    spec = _spec(rm_folder, lower_rm, out, lm_folder)
    assert disagree_job.map_batch(dataclasses.replace(spec, batch_size=8), [a], held) == 8
    refused(lambda: run_disagree(dataclasses.replace(spec, batch_size=16)), "--batch_size=16", "does not fit",
            "the job's other models", "--batch_size: 8 is the largest that fits")


def test_a_map_with_nan_rewards_is_reused_only_with_allow_nonfinite(rm_folder, tmp_path, monkeypatch):
    """A fault hunt (helper-133): a map-only run with --allow_nonfinite wrote NaN rewards of side B into
    vocab_map.csv but recorded them only in its summary's map entry, and a rerun without the flag reused that
    result, exit 0, where a fresh run refuses the map. The writers now count what they write (`nonfinite_written`)."""
    import torch

    hf = tiny.build_hf_model("llama3", num_labels=1, seed=7, vocab_size=49152, pad_token_id=2, bos_token_id=1,
                             eos_token_id=2)
    with torch.no_grad():
        hf.model.embed_tokens.weight[[1000, 1100]] = float("nan")
    nan_b = tiny.save_hf_model(hf, tmp_path / "b")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (nan_b / name).write_bytes((tiny.smollm2_tokenizer_folder() / name).read_bytes())
    real = disagree_job._read_back  # a map over A's tokens 990..1109, holding both NaN rows
    monkeypatch.setattr(disagree_job, "_read_back", lambda p, shared, done: real(
        p, shared[(shared.token_a >= 990) & (shared.token_a < 1110)].reset_index(drop=True), done))
    out = tmp_path / "d"

    def spec(allow: bool) -> DisagreeSpec:
        return DisagreeSpec(RunOptions(model=str(rm_folder), out=str(out), allow_nonfinite=allow),
                            (str(rm_folder), str(nan_b)), {"greatest": PROMPT},
                            DisagreeConfig(search=False, vocab_map=True, z_sample=64), SEARCH)

    refused(lambda: run_disagree(spec(False)), "reward_b", "NaN/Inf", "--allow_nonfinite")
    run_disagree(spec(True))
    written = pd.read_csv(out / "vocab_map.csv", keep_default_na=True)
    assert written.reward_b.isna().sum() == 2
    meta = json.loads((out / "vocab_map.csv.meta.json").read_text())
    numbers = written.select_dtypes("number")  # a token's text read as NaN is no NaN value written
    assert meta["nonfinite_written"] == {"vocab_map.csv": int((~np.isfinite(numbers.to_numpy())).sum())}
    refused(lambda: run_disagree(spec(False)), "holds non-finite values", "pass --allow_nonfinite to reuse it")
    run_disagree(spec(True))  # reused with the flag


def test_each_text_encoded_alone_is_what_the_tokenizer_makes_of_it(rm_folder, lower_rm):
    """disagree's shared strings encode every token's text through the fast tokenizer's own batch (candidates.
    encoded_each): the ids must be transformers' for each text, over the whole SmolLM2 vocabulary and texts with
    markers, case, spaces and non-ASCII, with the lowercasing normalizer too; a tokenizer without a fast backend
    is called as before."""
    from types import SimpleNamespace

    from rmjax.text.candidates import decoded_tokens, encoded_each

    extra = ["<|im_end|>x<|im_start|>", "Café DÉJÀ-vu 123,456.7", "  two  spaces", "\t\ttabs\r\n", "原始内容存档", "🙂"]
    for folder, every in ((rm_folder, 1), (lower_rm, 16)):
        _, tok = config_and_tokenizer(str(folder))
        texts = [t for t in decoded_tokens(tok, len(tok))[::every] if t] + extra
        assert len(texts) > 3000 and encoded_each(tok, texts) == tok(texts, add_special_tokens=False).input_ids
    # a tokenizer that marks the start of a text when asked to (as Gemma's puts <bos>): not here
    import tokenizers
    import transformers

    backend = tokenizers.Tokenizer.from_file(str(rm_folder / "tokenizer.json"))
    backend.post_processor = tokenizers.processors.TemplateProcessing(single="<|im_start|> $A",
                                                                      special_tokens=[("<|im_start|>", 1)])
    marking = transformers.PreTrainedTokenizerFast(tokenizer_object=backend)
    assert marking(extra[1:2]).input_ids[0][0] == 1
    assert encoded_each(marking, extra) == marking(extra, add_special_tokens=False).input_ids
    called = lambda texts, add_special_tokens: SimpleNamespace(input_ids=[[len(t)] for t in texts])  # noqa: E731
    assert encoded_each(called, ["ab", "c"]) == [[2], [1]]
