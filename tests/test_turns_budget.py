"""The whole-turn helpers and the forwards ledger every search shares (rmjax.search.turns, rmjax.search.budget),
each against a loop over its definition: a mutation pass found these rules read by no test that could fail."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from rmjax.search import turns
from rmjax.search.budget import BudgetSpent, Forwards

END = 9


def test_length_moves_are_every_truncation_and_every_one_token_deletion_never_an_empty_turn():
    for body in ([1], [1, 2], [1, 2, 3], [4, 5, 6, 7]):
        n = 6
        row = np.asarray(body + [END] * (n - len(body)), np.int32)
        want = [body[:j] for j in range(1, len(body))]  # truncations: at least one token kept
        if len(body) > 1:
            want += [body[:j] + body[j + 1:] for j in range(len(body))]  # deletions leave at least one
        got = turns.moves(row, END)
        assert got.shape == (len(want), n)
        assert [turns.tokens(r, END) for r in got] == want
        assert all(turns.lengths(got, END) >= 1)
        assert (turns.canonical(got, END) == got).all()


def test_the_fluency_term_is_the_tokens_mean_log_prob_plus_the_end_of_turns_and_ignores_what_follows():
    rng = np.random.default_rng(0)
    lengths = np.asarray([1, 3, 5])
    lps = rng.normal(-2.0, 1.0, (3, 7))
    lps[0, 2:] = np.nan  # positions after the end of turn: padding, whatever they hold
    lps[1, 4:] = -np.inf
    want = [lps[i, :n].mean() + lps[i, n] for i, n in enumerate(lengths)]
    np.testing.assert_allclose(turns.fluency_log_prob(lps, lengths), want, rtol=1e-12)
    weights = turns.fluency_weights(lengths, 7)
    for i, n in enumerate(lengths):
        assert weights[i, :n].tolist() == [1 / n] * n and weights[i, n] == 1.0 and not weights[i, n + 1:].any()


def test_the_end_of_turn_is_banned_as_a_response_token_and_a_plain_rm_runs_it():
    banned = np.zeros(12, bool)
    banned[3] = True
    got = turns.banned_with_end(banned, END)
    assert got.tolist() == [i in (3, END) for i in range(12)] and not banned[END]  # a copy
    assert turns.rm_tail(()) == 1 and turns.rm_tail((END, 5)) == 2  # plain: the end of turn after the tokens


def test_the_ledger_refuses_the_call_that_would_pass_the_limit_and_spends_nothing_then():
    budget = Forwards(limit=10, rm_unit=4, lm_unit=3)
    budget.charge(rm_positions=36)  # 9 forwards
    assert budget.spent == 9 and budget.left == 1
    with pytest.raises(BudgetSpent):
        budget.charge(rm_positions=4, lm_positions=1)  # 1 + 1/3 would pass 10
    assert budget.spent == 9
    budget.charge(rm_positions=2, lm_positions=1, whole=Fraction(1, 6))  # 1/2 + 1/3 + 1/6 = 1: exactly the limit
    assert budget.spent == 10 and budget.left == 0
    with pytest.raises(BudgetSpent):
        budget.charge(lm_positions=1)
