"""Tests that kill the mutants the mutation pass over rmjax/search (gcg_swaps, objective, terms, fluent, gcg_start,
sides, completion; joint_gradient's need a model) found surviving: each names the mutant it kills and compares
against an independent reference (a hand computation, a brute-force loop). No model runs: stand-in tokenizers,
targets and partners carry only what the code reads of them."""

from __future__ import annotations

import re
from fractions import Fraction
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rmjax.errors import UsageError
from rmjax.search import fluent, gcg_start, gcg_swaps, terms
from rmjax.search.budget import BudgetSpent, Forwards
from rmjax.search.gcg import Target
from rmjax.search.gcg_config import GCGConfig
from rmjax.search.objective import Objective

# --- gcg_swaps ---------------------------------------------------------------------------------------------------


class _Tokenizer:
    """What disallowed_ids reads of a tokenizer: its length, each id decoded alone, its special ids and tokens."""

    def __init__(self, texts: list[str], special: tuple[int, ...] = ()):
        self.texts, self.all_special_ids = texts, list(special)
        self.all_special_tokens = [texts[i] for i in special]
        self.added_tokens_decoder = {}

    def __len__(self):
        return len(self.texts)

    def batch_decode(self, rows):
        return [self.texts[row[0]] for row in rows]

    def convert_ids_to_tokens(self, ids):
        return [self.texts[i] for i in ids]

    def get_vocab(self):
        return {text: i for i, text in enumerate(self.texts)}

    def decode(self, ids):
        return "".join(self.texts[i] for i in ids)

    def __call__(self, text, add_special_tokens=False):
        """Each piece (a non-space character with the space before it, if any) is its own token."""
        return SimpleNamespace(input_ids=[self.texts.index(p) for p in re.findall(r" ?[^ ]", text)])


def test_disallowed_ids_by_hand_on_a_stand_in_tokenizer():
    """gcg_swaps.disallowed_ids against hand-listed masks: "" (empty), "é" (non-ASCII), "b\\x07" (non-printable) and
    U+FFFD are banned without --allow_non_ascii; special and byte tokens without --allow_special; ids past the
    tokenizer always; an embedding narrower than the tokenizer reads only its own ids. Kills
    `min(len(tokenizer), vocab_size)` -> `len(tokenizer)` and dropping each of `not text`, `not text.isascii()` and
    `not text.isprintable()`."""
    tok = _Tokenizer(["", "a", "\u00e9", "b\x07", " x", "\ufffd", "<|end|>"], special=(6,))
    mask = lambda *bad, size=9: np.isin(np.arange(size), bad)  # noqa: E731
    np.testing.assert_array_equal(gcg_swaps.disallowed_ids(tok, 9, True, False), mask(0, 2, 3, 5, 7, 8))
    np.testing.assert_array_equal(gcg_swaps.disallowed_ids(tok, 9, False, True), mask(0, 3, 5, 6, 7, 8))
    np.testing.assert_array_equal(gcg_swaps.disallowed_ids(tok, 9, True, True), mask(7, 8))
    np.testing.assert_array_equal(gcg_swaps.disallowed_ids(tok, 5, True, False), mask(0, 2, 3, size=5))


def test_disallowed_ids_are_read_once_per_tokenizer_and_each_caller_gets_its_own_copy():
    """Each search unit asks for the mask (1 s a call for Gemma 3's vocabulary): the tokenizer is read once for the
    same arguments; a caller that edits its mask does not edit the next caller's; a tokenizer given tokens since is
    read again."""
    calls = []

    class Counting(_Tokenizer):
        def convert_ids_to_tokens(self, ids):
            calls.append(len(ids))
            return super().convert_ids_to_tokens(ids)

    tok = Counting(["a", " b", "<|end|>"], special=(2,))
    first = gcg_swaps.disallowed_ids(tok, 5, False, True)
    np.testing.assert_array_equal(first, [False, False, True, True, True])
    first[:] = True
    np.testing.assert_array_equal(gcg_swaps.disallowed_ids(tok, 5, False, True), [False, False, True, True, True])
    assert calls == [3]
    tok.texts.append("\u00e9")  # id 3, past the tokenizer before
    np.testing.assert_array_equal(gcg_swaps.disallowed_ids(tok, 5, False, True), [False, False, True, False, True])
    np.testing.assert_array_equal(gcg_swaps.disallowed_ids(tok, 5, False, False), [False, False, True, True, True])
    gcg_swaps.disallowed_ids(tok, 5, False, True)
    assert calls == [3, 4, 4]  # the grown tokenizer read again, once for each setting


def test_swap_scores_put_non_finite_and_banned_swaps_at_plus_infinity():
    """gcg_swaps.swap_scores without the embedding penalty: a NaN, +inf or -inf gradient entry and a banned token
    score +inf (never proposed; -inf would otherwise be the best swap), the rest are the gradient itself. Kills
    `jnp.where(jnp.isfinite(loss_grad), loss_grad, jnp.inf)` -> `loss_grad`."""
    grad = np.asarray([[np.nan, -np.inf, 1.0, 2.0], [np.inf, 0.0, -1.0, 3.0]], np.float32)
    banned = np.asarray([False, False, False, True])
    got = np.asarray(gcg_swaps.swap_scores(grad, banned, np.asarray([0, 1]), None, 0.0))
    np.testing.assert_array_equal(got, [[np.inf, np.inf, 1.0, np.inf], [np.inf, 0.0, -1.0, np.inf]])


def test_top_k_stops_at_the_position_with_the_fewest_allowed_tokens():
    """gcg_swaps.sample_candidates (greedy) with --topk=4 where position 0 allows only 2 tokens: k = 2 at every
    position, the 4 single swaps in score order (hand-sorted), none to a +inf token. Kills `.min()` -> `.max()`."""
    inf = np.inf
    score = jnp.asarray([[inf, 0.5, 0.1, inf, inf, inf], [0.3, 0.2, 0.4, 0.0, 0.6, 0.7]], jnp.float32)
    cfg = GCGConfig(num_tokens=2, selection="greedy", topk=4, search_width=100)
    got = gcg_swaps.sample_candidates(np.asarray([5, 5], np.int32), score, cfg, jax.random.key(0))
    np.testing.assert_array_equal(got, [[5, 3], [2, 5], [5, 1], [1, 5]])


def test_random_candidates_with_no_allowed_token_or_fewer_positions_than_n_replace():
    """gcg_swaps.sample_candidates (random): with no finite score anywhere there is no candidate; a response of 2
    positions with --n_replace=3 swaps both, each to one of its top-2 tokens (the current one scores +inf), and
    over 64 draws each of the 4 (position, token) pairs is drawn. Kills dropping the no-live-position return,
    `min(cfg.n_replace, ...)` -> `cfg.n_replace` and the token drawn from [0, k - 1) instead of [0, k)."""
    current = np.asarray([0, 1], np.int32)
    cfg = GCGConfig(num_tokens=4, topk=2, search_width=64, n_replace=3)
    none = jnp.full((2, 4), np.inf, jnp.float32)
    assert gcg_swaps.sample_candidates(current, none, cfg, jax.random.key(0)).shape == (0, 2)
    score = jnp.asarray([[np.inf, 0.0, 1.0, 5.0], [0.0, np.inf, 1.0, 5.0]], jnp.float32)
    got = gcg_swaps.sample_candidates(current, score, cfg, jax.random.key(1))
    assert got.shape == (64, 2) and (got != current).all()
    assert set(got[:, 0].tolist()) == {1, 2} and set(got[:, 1].tolist()) == {0, 2}


@pytest.mark.parametrize("selection", ["random", "greedy"])
def test_a_position_with_no_finite_score_stays_and_the_others_swap(selection):
    """gcg_swaps.sample_candidates where position 1's every score is +inf (its gradient row non-finite under
    --allow_nonfinite): the candidates are not none (the step used to end empty), position 1 is never changed, and
    the others swap to their top-2 tokens by hand: position 0 to 2 or 1, position 2 to 3 or 0. k is 2 from the
    live positions (position 2 allows only 2), and --n_replace=3 swaps both live positions in every random one.
    Greedy, by hand: the single swaps in score order (0->2 at -3, 2->3 at -2, 0->1 at -1, 2->0 at 0), each with the
    other live position's best swap, the repeat dropped."""
    inf = np.inf
    score = jnp.asarray([[0.5, -1.0, -3.0, 4.0], [inf] * 4, [0.0, inf, inf, -2.0]], jnp.float32)
    current = np.asarray([0, 1, 1], np.int32)
    cfg = GCGConfig(num_tokens=3, topk=3, search_width=64, n_replace=3, selection=selection)
    got = gcg_swaps.sample_candidates(current, score, cfg, jax.random.key(2))
    if selection == "greedy":
        np.testing.assert_array_equal(got, [[2, 1, 3], [1, 1, 3], [2, 1, 0]])
        return
    assert got.shape == (64, 3) and (got[:, 1] == 1).all()
    assert set(got[:, 0].tolist()) == {1, 2} and set(got[:, 2].tolist()) == {0, 3}


_GREEDY_SCORE = np.asarray([[-10.0, 5.0, 9.0, 9.0], [8.0, 7.0, 1.0, 9.0], [8.0, 7.0, 9.0, 2.0]], np.float32)


@pytest.mark.parametrize(("topk", "n_replace", "want"), [
    (2, 2, [[0, 2, 0], [0, 2, 3], [1, 2, 0], [0, 1, 3], [0, 2, 1]]),
    (2, 3, [[0, 2, 3], [1, 2, 3], [1, 1, 3], [1, 2, 1]]),
    (1, 2, [[0, 2, 0], [0, 0, 3]]),
])
def test_greedy_candidates_by_hand(topk, n_replace, want):
    """gcg_swaps.sample_candidates (greedy) from [0, 0, 0], position 0's best token its current one: single swaps in
    score order, each with the best other swaps (position 0's: its second best, token 1; positions ordered by that
    swap's score: 1, 2, 0), repeats dropped; hand-derived rows. Kills `second = min(1, k - 1)` -> `1` (top-1)
    and positions ordered by their best swap whatever it is (`by_score` without `differs`)."""
    cfg = GCGConfig(num_tokens=3, selection="greedy", topk=topk, n_replace=n_replace, search_width=10)
    got = gcg_swaps.sample_candidates(np.zeros(3, np.int32), jnp.asarray(_GREEDY_SCORE), cfg, jax.random.key(0))
    np.testing.assert_array_equal(got, want)


def test_greedy_candidates_tie_to_the_lower_position():
    """gcg_swaps.sample_candidates (greedy), 8 positions whose 4 best tokens score 0, 0.5, 1, 1.5 alike: the single
    swaps come rank by rank, each rank's positions in order (a brute-force loop). Kills the swaps' argsort
    `kind="stable"` -> `kind="quicksort"` (where numpy's quicksort reorders ties, as on x86)."""
    score = np.tile(np.asarray([0.0, 0.5, 1.0, 1.5, 5.0, 5.0], np.float32), (8, 1))
    cfg = GCGConfig(num_tokens=8, selection="greedy", topk=4, search_width=32)
    got = gcg_swaps.sample_candidates(np.full(8, 5, np.int32), jnp.asarray(score), cfg, jax.random.key(0))
    want = []
    for token in range(4):
        for p in range(8):
            want.append(np.full(8, 5))
            want[-1][p] = token
    np.testing.assert_array_equal(got, want)


def test_filter_candidates_counts_each_removal_and_remembers_what_it_keeps():
    """gcg_swaps.filter_candidates against a hand count: 5 sampled, 1 repeat, 1 evaluated before, 1 failing the
    check; the kept ones join `seen`; without forbid_revisits a seen one is kept; none left is an int array. Kills
    `cfg.forbid_revisits and key in seen` -> `key in seen` and the empty result's `np.zeros((0, n), np.int32)`."""
    cands = np.asarray([[1, 2], [3, 4], [1, 2], [5, 6], [7, 8]])
    checks = [lambda ids: ids != [5, 6]]
    seen = {(3, 4)}
    kept, counts = gcg_swaps.filter_candidates(cands, checks, GCGConfig(num_tokens=2), seen)
    np.testing.assert_array_equal(kept, [[1, 2], [7, 8]])
    assert counts == {"sampled": 5, "repeats": 1, "revisits": 1, "retokenize_failed": 1, "left": 2}
    assert seen == {(3, 4), (1, 2), (7, 8)}
    kept, counts = gcg_swaps.filter_candidates(cands, checks, GCGConfig(num_tokens=2, forbid_revisits=False), {(3, 4)})
    np.testing.assert_array_equal(kept, [[1, 2], [3, 4], [7, 8]])
    assert counts["revisits"] == 0
    kept, _ = gcg_swaps.filter_candidates(cands[3:4], checks, GCGConfig(num_tokens=2), set())
    assert kept.shape == (0, 2) and kept.dtype == np.int32


def test_filter_words_by_hand():
    """gcg_swaps.describe_filter and filter_advice against hand-written sentences. Kills dropping `if counts[key]`
    (a "0 repeats" listed), `cfg.topk < allowed` -> `<=`, `k = min(cfg.topk, allowed)` -> `cfg.topk`, the filters
    sorted by -count -> count, `counts["sampled"] < cfg.search_width` -> `<=` and dropping the de-duplication."""
    counts = {"sampled": 16, "repeats": 3, "revisits": 5, "retokenize_failed": 0, "left": 8}
    assert gcg_swaps.describe_filter(counts) == ("8 of 16 sampled candidates left, removed 3 repeats, "
                                                 "5 evaluated before")
    assert gcg_swaps.describe_filter(dict(counts, repeats=0, revisits=0, left=16)) == ("16 of 16 sampled candidates "
                                                                                       "left, none removed")
    cfg = GCGConfig(num_tokens=3, topk=4, search_width=16)
    fewer = "lower --search_width (3 positions x top {k} tokens make {n} single swaps)"
    assert gcg_swaps.filter_advice(counts, cfg, 10) == ("To get more: widen --topk (now 4), pass --noforbid_revisits, "
                                                        "raise --n_replace or " + fewer.format(k=4, n=12) + ".")
    only_retokenize = dict(counts, repeats=0, revisits=0, retokenize_failed=2)
    assert gcg_swaps.filter_advice(only_retokenize, cfg, 10) == (
        "To get more: pass --noretokenize_filter (a response may then not be what a conversation tokenizes to).")
    assert gcg_swaps.filter_advice(dict(counts, repeats=0, revisits=0), cfg, 4) == (
        "To get more: allow more tokens (only 4 may be searched) or " + fewer.format(k=4, n=12) + ".")
    assert gcg_swaps.filter_advice(dict(counts, repeats=0, revisits=0), cfg, 2) == (
        "To get more: allow more tokens (only 2 may be searched) or " + fewer.format(k=2, n=6) + ".")


# --- gcg_start ---------------------------------------------------------------------------------------------------

_START_TOKENS = ["", "a", "b", " x", "x", "\u00e9"]


def test_banned_tokens_within_token_ids_by_hand():
    """gcg_start.banned_tokens with --token_ids=1,2,5: 5 ("é", non-ASCII) stays banned, only 1 and 2 may be searched;
    a set of only banned tokens is refused, an id past the vocabulary too. Kills `banned |= ~_only_ids(...)` ->
    `banned = ~_only_ids(...)` and the all-banned refusal -> `if False`."""
    tok = _Tokenizer(_START_TOKENS)
    got = gcg_start.banned_tokens(tok, 6, GCGConfig(num_tokens=2, token_ids=(1, 2, 5)))
    np.testing.assert_array_equal(got, [True, False, False, True, True, True])
    with pytest.raises(UsageError, match="no token may be searched"):
        gcg_start.banned_tokens(tok, 6, GCGConfig(num_tokens=2, token_ids=(0, 5)))
    with pytest.raises(UsageError, match="outside the vocabulary"):
        gcg_start.banned_tokens(tok, 6, GCGConfig(num_tokens=2, token_ids=(1, 6)))


def test_the_default_start_and_an_init_by_hand():
    """gcg_start.start_sequences on a stand-in tokenizer (" x" = 3, "x" = 4): " x x" when allowed; "x x" when the
    check refuses " x x"; within --token_ids=1,2 (no x) the lowest allowed id repeated; --init "ab" as typed, and
    an --init of 3 tokens for 2 is refused, not cut. Kills `np.flatnonzero(~banned)[0]` -> `[-1]` (the highest
    allowed id)."""
    tok = _Tokenizer(_START_TOKENS)
    cfg = GCGConfig(num_tokens=2)
    banned = gcg_start.banned_tokens(tok, 6, cfg)
    assert gcg_start.start_sequences(tok, cfg, banned, []) == [[3, 3]]
    assert gcg_start.start_sequences(tok, cfg, banned, [lambda ids: ids != [3, 3]]) == [[4, 3]]
    only = GCGConfig(num_tokens=2, token_ids=(1, 2))
    assert gcg_start.start_sequences(tok, only, gcg_start.banned_tokens(tok, 6, only), []) == [[1, 1]]
    assert gcg_start.start_sequences(tok, GCGConfig(num_tokens=2, init=("ab",)), banned, []) == [[1, 2]]
    with pytest.raises(UsageError, match="'aba' is 3 tokens, not --num_tokens=2"):  # no filter: its length named
        gcg_start.start_sequences(tok, GCGConfig(num_tokens=2, init=("aba",)), banned, [])
    with pytest.raises(UsageError, match="as 2 tokens"):  # through the filter: it may be what changed the count
        gcg_start.start_sequences(tok, GCGConfig(num_tokens=2, init=("aba",)), banned, [lambda ids: True])


# --- objective, terms ----------------------------------------------------------------------------------------------

END, N = 7, 4


class _Partner:
    """A disagreement's other side: z_B = 1 for every text, 3 whole forwards a text, A's SD 4; it has scored
    `scored` before."""

    each, scale = 3, 4.0

    def __init__(self, scored=frozenset()):
        self.scored = set(scored)

    def gap(self, reward, ids):
        return np.asarray(reward) / self.scale - 1.0

    def unscored(self, ids):
        return len({tuple(r) for r in np.asarray(ids).tolist()} - self.scored)


def _objective(lam=0.0, sign=1.0, suffix=(END, 8, 9), partner=None, repetition_weight=0.5) -> Objective:
    """An Objective over a stand-in target (its suffix; the plain template's end of turn from a tokenizer whose
    newline is END) and, at λ > 0, a stand-in prior that is not the RM; N = 4 slots."""
    tokenizer = lambda text, add_special_tokens=True: SimpleNamespace(input_ids=[END])  # noqa: E731
    model = SimpleNamespace(tokenizer=tokenizer, source="stand-in", mesh=None)
    target = Target(model, "p", (1, 2), tuple(suffix), None, np.asarray(suffix, np.int32))
    prior = SimpleNamespace(model=object(), prefix=(1, 2)) if lam > 0 else None
    return Objective(target, prior, lam, sign, repetition_weight, Forwards(10**6, N + max(len(suffix), 1), N + 1),
                     partner=partner)


def test_j_at_lambda_zero_reads_the_reward_alone_and_at_lambda_two_the_fluency_by_hand():
    """Objective.values: at λ = 0 the prior log-prob is NaN (not run) and J = sign·R exactly; at λ = 2,
    J = R + 2·(log p − 0.5·repetition) by hand (repetition of [3, 3]: 1 of 2 positions). Kills dropping
    `np.nan_to_num(logp, nan=0.0)` (J NaN at λ = 0)."""
    ids = np.asarray([[3, 3, END, END], [3, 4, 5, 6]])
    v = _objective(sign=-1.0).values(np.asarray([1.5, -2.0]), np.full(2, np.nan), ids)
    np.testing.assert_array_equal(v.objective, [-1.5, 2.0])
    np.testing.assert_array_equal(v.repetition, [0.5, 0.0])
    assert np.isnan(v.prior_logp).all()
    v = _objective(lam=2.0).values(np.asarray([1.5, -2.0]), np.asarray([-1.0, -3.0]), ids)
    np.testing.assert_array_equal(v.objective, [1.5 + 2 * (-1.0 - 0.25), -2.0 + 2 * -3.0])  # dyadic: exact


def test_a_fluency_weight_without_a_prior_is_refused():
    """Objective with λ > 0 and no prior LM: a UsageError at construction. Kills the check -> `if False`."""
    target = _objective().target
    with pytest.raises(UsageError, match="needs a prior"):
        Objective(target, None, 0.5, 1.0, 0.0, Forwards(10, 7, 5))


def test_a_partners_gap_gradient_weight_and_forwards_by_hand():
    """With a partner (A's SD 4, 3 forwards a text): J reads the gap, the gradient weighs A's reward by sign / 4,
    and scoring pays 3 forwards for each distinct text the partner has not scored (2 of the 3 distinct here);
    without one, sign and 0. Kills `self.sign / self.partner.scale` -> `self.sign * self.partner.scale` or
    `self.sign`, and `unscored(cands) * self.other_each` -> `len(cands) * self.other_each`."""
    obj = _objective(sign=-1.0, partner=_Partner({(3, 4, 5, 6)}))
    assert obj.gradient_sign == -0.25 and _objective(sign=-1.0).gradient_sign == -1.0
    cands = np.asarray([[3, 4, 5, 6], [3, 3, END, END], [3, 3, END, END], [5, 5, 5, 5]])
    assert obj.partner_forwards(cands) == 2 * 3 and _objective().partner_forwards(cands) == 0
    np.testing.assert_array_equal(obj.values(np.asarray([8.0]), np.full(1, np.nan), cands[:1]).objective, [-1.0])


def test_what_scoring_charges_each_candidate_by_hand():
    """Objective.cost against hand-counted positions (N = 4): chat suffix (S = 3; RM unit 7, prior unit 5), whole
    turns of 2 and 4 tokens run L + 3 RM and L + 1 prior positions, a partner adds its 3 forwards (or, paid, is all
    that is charged); variants of [3, 4, 5] run from their first change; with the plain template (RM unit 5) no
    later than their last token. Kills dropping `and not paid` (the prior charged to a paid candidate) and
    `self.other_each if partner else 0` -> `self.other_each`."""
    obj = _objective(lam=1.0, partner=_Partner())
    whole = np.asarray([[3, 4, END, END], [3, 4, 5, 6]])
    F = Fraction
    assert obj.cost(whole, partner=False).tolist() == [F(5, 7) + F(3, 5), F(7, 7) + F(5, 5)]
    assert obj.cost(whole).tolist() == [F(5, 7) + F(3, 5) + 3, F(7, 7) + F(5, 5) + 3]
    assert obj.cost(whole, known=True, partner=False).tolist() == [F(5, 7), F(7, 7)]
    assert obj.cost(whole, paid=True).tolist() == [3, 3]
    variants = np.asarray([[3, 4, END, END], [3, 4, 5, 6], [9, 4, 5, END]])
    assert obj.cost(variants, np.asarray([3, 4, 5, END]), partner=False).tolist() == [
        F(3, 7) + F(3, 5), F(4, 7) + F(5, 5), F(6, 7) + F(4, 5)]
    plain = _objective(suffix=())
    assert plain.cost(variants[:2], np.asarray([3, 4, 5, END])).tolist() == [F(2, 5), F(2, 5)]


def test_repetition_share_by_hand():
    """terms.repetition: [5, 5, 6, 5, 6, 9] repeats at 1 (5 after 5) and 4 (the bigram 5 6 again): 2 of 6, or of 5
    over its turn before the end 9; with end 0 (a falsy id) the turn [1, 2, 1, 2] repeats once in 4; an empty turn
    repeats nothing (it divided by zero); Values of no lists are empty. Kills dropping `bigrams.add(pair)`,
    `if end is not None` -> `if end` and Values.joined without its `np.zeros(0)`."""
    np.testing.assert_array_equal(terms.repetition(np.asarray([[5, 5, 6, 5, 6, 9]])), [2 / 6])
    np.testing.assert_array_equal(terms.repetition(np.asarray([[5, 5, 6, 5, 6, 9]]), 9), [2 / 5])
    np.testing.assert_array_equal(terms.repetition(np.asarray([[1, 2, 1, 2, 0, 0]]), 0), [1 / 4])
    np.testing.assert_array_equal(terms.repetition(np.asarray([[9, 1, 1, 1]]), 9), [0.0])
    assert terms.Values.joined([]).objective.shape == (0,)


# --- fluent --------------------------------------------------------------------------------------------------------


def test_an_exact_step_at_each_slot_by_hand():
    """fluent._coordinate of [1, 2, 3] (end 9, N = 4) over allowed [4, 5]: at slot 1 both swaps, the cut [1] and
    the deletion [1, 3]; at slot 3 (= L) a fourth token and no cut; past L nothing. Kills `p > size` -> `p >= size`
    and `if p < size` -> `if p <= size`."""
    current, allowed = np.asarray([1, 2, 3, 9]), np.asarray([4, 5])
    np.testing.assert_array_equal(fluent._coordinate(current, 1, allowed, 9),
                                  [[1, 4, 3, 9], [1, 5, 3, 9], [1, 9, 9, 9], [1, 3, 9, 9]])
    np.testing.assert_array_equal(fluent._coordinate(current, 3, allowed, 9), [[1, 2, 3, 4], [1, 2, 3, 5]])
    assert fluent._coordinate(np.asarray([1, 9, 9, 9]), 2, allowed, 9).shape == (0, 4)


def test_fresh_keeps_first_unseen_non_empty_turns_that_pass_the_checks():
    """fluent._fresh against a hand mask: an empty turn, a repeat, a seen one and one failing a check are not
    kept; the kept join `seen`. Kills dropping `body and` and dropping `seen.add(tuple(row))`."""
    cands = np.asarray([[9, 9, 9], [1, 9, 9], [1, 9, 9], [2, 9, 9], [3, 4, 9], [5, 9, 9]])
    seen = {(5, 9, 9)}
    keep = fluent._fresh(cands, [lambda ids: ids != [2]], seen, 9)
    np.testing.assert_array_equal(keep, [False, True, False, False, True, False])
    assert seen == {(5, 9, 9), (1, 9, 9), (3, 4, 9)}


def test_affordable_keeps_the_leading_candidates_whose_sum_fits_exactly():
    """fluent._affordable: costs 1, 2, 3, 0 with 3 left keep 2 (a sum equal to what is left fits); a screened
    partner adds 2 forwards for the first `screen` = 1 alone (8 buys all four); none fitting raises BudgetSpent.
    Kills `total <= left` -> `<` and `min(screen, i + 1)` -> `i + 1`."""
    def stand_in(left):
        return SimpleNamespace(forwards=Forwards(left, 1, 1), other_each=2,
                               cost=lambda cands, *a, **k: np.asarray([Fraction(c) for c in cands[:, 0]], object))

    cands = np.asarray([[1], [2], [3], [0]])
    np.testing.assert_array_equal(fluent._affordable(stand_in(3), cands, None, None), [[1], [2]])
    np.testing.assert_array_equal(fluent._affordable(stand_in(8), cands, None, None, screen=1), cands)  # 3 5 8 8
    with pytest.raises(BudgetSpent):
        fluent._affordable(stand_in(0), cands, None, None)


def test_the_archive_keeps_each_sequence_once_and_its_best_ties_to_the_earlier():
    """fluent._Archive and Found.best: a sequence added again keeps its first terms; the history's best and
    Found.best break a tie in J towards the earlier sequence. Kills `(self.terms[i][3], -i)` -> `(..., i)` and
    Found.best's tie order reversed."""
    archive = fluent._Archive(Forwards(10, 1, 1))
    j = np.asarray([1.0, 3.0, 3.0])
    archive.add(np.asarray([[1, 2], [3, 4], [5, 6]]), terms.Values(j, j, j, j))
    archive.add(np.asarray([[1, 2]]), terms.Values(*[np.asarray([9.0])] * 4))
    assert archive.history[-1] == (0.0, 3.0, [3, 4])
    found = archive.found(2)
    np.testing.assert_array_equal(found.values.objective, [1.0, 3.0, 3.0])
    np.testing.assert_array_equal(found.best(3), [1, 2, 0])


# --- sides ---------------------------------------------------------------------------------------------------------


def test_an_empty_side_is_refused():
    """sides.SideSpec.parse refuses a side of spaces alone (stripped, nothing is left to load), in one line. Kills
    the empty-side refusal -> `if False`."""
    from rmjax.search.sides import SideSpec

    with pytest.raises(UsageError, match="an empty side"):
        SideSpec.parse("   ")


def test_a_yardstick_reads_known_rewards_and_scores_only_the_rest():
    """sides.Side.yardstick over all 5 tokens of a stand-in side (reward 2·id), with tokens 0 and 3 known (0 read
    as 10): token_rewards runs for 1, 2 and 4 alone, and the mean is (10 + 2 + 4 + 6 + 8) / 5 by hand. Kills
    `missing = [int(i) not in known ...]` -> every token (the known ones scored again)."""
    from rmjax.search.sides import Side, SideSpec

    class Doubling(Side):
        spec, vocab = SideSpec.parse("stand-in"), 5

        def __init__(self):
            self.asked = []

        def token_rewards(self, ids):
            self.asked.extend(int(i) for i in ids)
            return 2.0 * np.asarray(ids, np.float64)

    side = Doubling()
    mean, _ = side.yardstick(5, False, known={0: 10.0, 3: 6.0})
    assert sorted(side.asked) == [1, 2, 4]
    assert mean == (10 + 2 + 4 + 6 + 8) / 5  # 30 / 5: exact


# --- completion ----------------------------------------------------------------------------------------------------


def test_gains_summary_by_hand():
    """completion.gains_summary: group a's gains 1, NaN, 3 give 1 non-finite and the median 2 of the finite ones;
    group b's only gain is NaN: no median. Kills `gains[np.isfinite(gains)]` -> `gains`, the non-finite count
    `len(gains) - len(finite)` -> 0 and `if len(finite) else None` -> `if True`."""
    from rmjax.search.completion import gains_summary

    table = {"truncation_gain": [1.0, np.nan, 3.0, np.nan], "ends_turn": [1, 0, 1, 1]}
    got = gains_summary(table, ["a", "a", "a", "b"])
    assert got == {"a": {"rows": 3, "nonfinite": 1, "median_truncation_gain": 2.0, "ends_turn": 2 / 3},
                   "b": {"rows": 1, "nonfinite": 1, "median_truncation_gain": None, "ends_turn": 1.0}}


def test_completion_refusals_at_their_boundaries():
    """completion: a context of exactly prefix + response + max_new passes the length check (and the one-token
    prefix is then refused), one more position is PromptTooLongError; max_new 0 is refused; an RM without its LM
    head is refused as --lm, another vocabulary too, the RM itself is its own. Kills `> context` -> `>= context`,
    `len(prefix) < 2` -> `< 1`, `and not cfg.tie_embeddings` -> `or ...` and dropping the vocabulary comparison."""
    from rmjax.errors import PromptTooLongError
    from rmjax.search.completion import greedy_continuations, require_prior_config, same_tokenizer

    lm = SimpleNamespace(is_reward_model=False, tie_embeddings=False, max_position_embeddings=10)
    prior = SimpleNamespace(config=lm, source="stand-in", tokenizer=None)
    with pytest.raises(UsageError, match="1 token here"):
        greedy_continuations(prior, [1], 2, [[5, 6, 7, 8]], max_new=5)
    with pytest.raises(PromptTooLongError, match="needs 11 positions"):
        greedy_continuations(prior, [1], 2, [[5, 6, 7, 8, 9]], max_new=5)
    with pytest.raises(UsageError, match="max_new must be at least 1"):
        greedy_continuations(prior, [1, 2], 2, [[5]], max_new=0)
    with pytest.raises(UsageError, match="has no LM head"):
        require_prior_config(SimpleNamespace(is_reward_model=True, tie_embeddings=False), "rm", "--lm")
    require_prior_config(SimpleNamespace(is_reward_model=True, tie_embeddings=True), "rm", "--lm")
    require_prior_config(lm, "lm", "--lm")
    same_tokenizer(prior, prior)
    with pytest.raises(UsageError, match="another tokenizer"):
        same_tokenizer(SimpleNamespace(tokenizer=_Tokenizer(["a"]), source="a"),
                       SimpleNamespace(tokenizer=_Tokenizer(["b"]), source="b"))
