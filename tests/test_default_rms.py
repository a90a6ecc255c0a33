"""The default reward models load offline from their builtin names and prefer what humans prefer."""

from __future__ import annotations

import numpy as np
import pytest

from rmjax import nn
from rmjax.loading import config_of, load
from rmjax.loading.registry import BUILTIN_DIR
from rmjax.loading.safetensors_io import iter_tensors
from rmjax.scoring.texts import TextScorer
from rmjax.train.data import read_elo_items

PROMPT = "What, in one word, is the greatest thing ever?"


@pytest.mark.parametrize("name", ["elo-rm-smollm2-135m", "elo-rm-gemma3-270m"])
def test_default_rm_loads_and_ranks_elo_extremes(name):
    rm = load(name)
    assert rm.config.is_reward_model and rm.config.num_labels == 1
    assert config_of(name) == rm.config  # what jobs check before loading (the frontier's LM-head refusal)
    (_, head), = list(iter_tensors(BUILTIN_DIR / f"{name}.safetensors"))
    np.testing.assert_array_equal(np.asarray(nn.get(rm.params, "score.kernel")), np.asarray(head()).T)
    items = read_elo_items("builtin").sort_values("elo_score")  # the greatest-thing file the heads trained on
    bottom, top = items["name"].head(40).tolist(), items["name"].tail(40).tolist()
    scores = TextScorer(rm, PROMPT).score(top + bottom)
    # Humans' 40 favourite items score higher on average than their 40 least favourite.
    assert scores[:40].mean() > scores[40:].mean()
