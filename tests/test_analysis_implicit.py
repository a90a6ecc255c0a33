"""The implicit RM between two LMs: MWLR value, sign, antisymmetry, dedupe and the shared vocabulary."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from rmjax.analysis.data import ScoreTable
from rmjax.analysis.implicit import implicit_reward, implicit_table, implicit_top_bottom, mwlr


def _logprob_table(name: str, strings: list[str], probs: dict[str, list[float]]) -> ScoreTable:
    frame = pd.DataFrame({"token_id": range(len(strings)), "token_name": strings, "token_decoded": strings,
                          **{p: np.log(v) for p, v in probs.items()}})
    return ScoreTable(name, name, frame, "token_decoded")


def test_mwlr_value_sign_and_antisymmetry():
    reference, chosen = np.array([0.2, 0.01, 1e-9, 0.3]), np.array([0.05, 0.04, 1e-6, 0.3])
    got = mwlr(np.log(chosen), np.log(reference))
    np.testing.assert_allclose(got, 0.5 * (reference + chosen) * (np.log(chosen) - np.log(reference)), rtol=1e-12)
    assert got[0] < 0 < got[1]  # the chosen model likes token 1 more than the reference does, token 0 less
    assert got[3] == 0.0
    assert abs(got[2]) < 1e-5  # a 1000x ratio among junk probabilities is worth almost nothing
    np.testing.assert_allclose(mwlr(np.log(reference), np.log(chosen)), -got, rtol=1e-12)


def test_implicit_reward_on_shared_strings_keeping_max_probability():
    a = _logprob_table("A", ["Love", " Love", "Freedom", "only-a", "Love"],
                       {"greatest": [0.10, 0.30, 0.05, 0.2, 0.2], "worst": [0.01, 0.02, 0.03, 0.04, 0.05]})
    b = _logprob_table("B", ["Freedom", " Love", "Love", "only-b"],
                       {"greatest": [0.40, 0.10, 0.05, 0.3], "worst": [0.02, 0.02, 0.01, 0.5]})
    rewards = implicit_reward(chosen=b, reference=a)
    assert list(rewards.index) == [" Love", "Freedom", "Love"]
    # "Love" appears twice in A: its highest probability per prompt (0.2 for greatest, 0.05 for worst) is kept
    assert rewards.loc["Love", "greatest:logp_reference"] == pytest.approx(np.log(0.2))
    assert rewards.loc["Love", "worst:logp_reference"] == pytest.approx(np.log(0.05))
    expected = 0.5 * (0.2 + 0.05) * (np.log(0.05) - np.log(0.2))
    assert rewards.loc["Love", "greatest"] == pytest.approx(expected)
    assert rewards.loc["Freedom", "greatest"] > 0 > rewards.loc["Love", "greatest"]
    swapped = implicit_reward(chosen=a, reference=b)
    np.testing.assert_allclose(swapped["greatest"], -rewards["greatest"], rtol=1e-12)
    top = implicit_top_bottom(rewards, k=1)
    assert top[(top.prompt == "greatest") & (top.side == "top")].text.tolist() == ["Freedom"]
    assert top[(top.prompt == "greatest") & (top.side == "bottom")].text.tolist() == [" Love"]
    table = implicit_table(rewards, "A->B")
    assert table.prompts == ["greatest", "worst"] and table.strings.tolist() == [" Love", "Freedom", "Love"]


def test_top_and_bottom_are_the_extremes_first_with_ties_ordered_by_string():
    """top: highest MWLR first; bottom: lowest first; ties by string (a sort of the whole table, by a loop)."""
    texts = ["d", "b", "a", "e", "c", "f"]
    values = [0.5, 0.5, -0.2, -0.2, 0.1, 0.5]
    rewards = pd.DataFrame({"p": values, "p:logp_chosen": np.zeros(6), "p:logp_reference": np.zeros(6)},
                           index=pd.Index(texts, name="text"))
    got = implicit_top_bottom(rewards, k=3)
    ordered = [t for _, t in sorted(zip([-v for v in values], texts, strict=True))]
    assert got[got.side == "top"].text.tolist() == ordered[:3] == ["b", "d", "f"]
    assert got[got.side == "bottom"].text.tolist() == ordered[::-1][:3] == ["e", "a", "c"]
    assert got[got.side == "bottom"]["rank"].tolist() == [1, 2, 3]


def test_implicit_reward_needs_shared_strings():
    a = _logprob_table("A", ["x"], {"p": [0.5]})
    b = _logprob_table("B", ["y"], {"p": [0.5]})
    with pytest.raises(ValueError, match="share no decoded string"):
        implicit_reward(a, b)
