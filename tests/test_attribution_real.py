"""Integrated gradients add up on the real default reward model (issue 21): the straight path from the pad
baseline has cliffs 0.003 wide in α that uniform steps miss (64 midpoints: a 387% completeness gap for 'love')."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rmjax.inspect.attribution import MAX_EVALUATIONS, TOLERANCE, attribute
from rmjax.inspect.job import items_from_texts
from rmjax.loading import load
from tests import jitted as M

pytestmark = pytest.mark.optimized  # the real RM's forwards take longer than their compiles (tests/conftest.py)

PROMPT = "What, in one word, is the greatest thing ever?"


def _reward(model, ids: list[int], at_last: bool = False) -> float:
    """A plain forward from token ids; `at_last`: read at the last token even where it is the pad id (as
    transformers reads `inputs_embeds`: the path's points are embeddings, read where the input x is)."""
    arr = np.asarray([ids], np.int32)
    cfg = dataclasses.replace(model.config, pad_token_id=None) if at_last else model.config
    rewards = np.asarray(M.rewards(model.params, cfg, arr, np.ones_like(arr, bool)))
    return float(rewards[0, model.output_column])


def test_integrated_gradients_add_up_on_the_default_rm():
    """'love' under 'greatest' at default settings: the IG sum equals R(x) − R(baseline) within 5%, both rewards
    from plain forwards of token ids. The baseline puts the pad token's row at every position but the template's
    special tokens, which is the embedding of those token ids; every point of the path is read where x is, its last
    token (the baseline's is the pad id, which a forward of token ids would read past)."""
    model = load("elo-rm-smollm2-135m")
    ids = list(items_from_texts(model, PROMPT, ["love"])[0].ids)
    tok = model.tokenizer
    special = set(tok.all_special_ids)
    baseline_ids = [t if t in special else tok.pad_token_id for t in ids]
    assert ids[-1] != model.config.pad_token_id and baseline_ids[-1] == model.config.pad_token_id
    want = _reward(model, ids) - _reward(model, baseline_ids, at_last=True)
    attr = attribute(model, ids)
    total = attr.integrated_gradients.sum()
    print(f"IG sum {total:+.4f}, R(x) - R(baseline) {want:+.4f}, {attr.evaluations} gradient evaluations")
    assert abs(total - want) <= TOLERANCE * abs(want), (total, want, attr.evaluations)
    assert attr.relative_gap <= TOLERANCE and attr.converged
    assert abs((attr.reward - attr.baseline_reward) - want) < 1e-3  # the path's ends are these two inputs
    assert attr.evaluations <= MAX_EVALUATIONS
    assert np.isfinite(attr.integrated_gradients).all() and attr.integrated_gradients.shape == (len(ids),)
