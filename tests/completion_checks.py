"""The completion check's table (beam, GCG) against independent readings, shared by their tests."""

from __future__ import annotations

import json

import numpy as np
import torch

from rmjax.scoring import calls
from rmjax.text import chat
from tests import tolerance


def check_table(table, rm, lm, hf_lm, prompts: dict[str, str], want_reward: np.ndarray, signs: np.ndarray,
                reward_atol: float) -> None:
    """Each row (a written response and a prompt): its reward is `want_reward` (the job's own reading of it),
    ends_turn is transformers' argmax after the conversation's prefix + response, the completed text starts with
    the response's (equal exactly when it ends) and its reward is a full forward without cache of the whole
    conversation (the text in the prompt's template, tokenized whole: not the check's own cached scorer), and the
    truncation gain is sign · (reward − completed_reward)."""
    names = {name: text for name, text in prompts.items()}
    np.testing.assert_allclose(table.reward, want_reward, rtol=1e-6, atol=reward_atol)
    np.testing.assert_allclose(table.truncation_gain, signs * (table.reward - table.completed_reward), atol=1e-6)
    for (_, row), text in zip(table.iterrows(), (names[p] for p in table.prompt), strict=True):
        ids = [int(t) for t in str(row["ids"]).split()]
        completed, response = json.loads(row["completed_text"]), rm.tokenizer.decode(ids)
        assert completed.startswith(response)
        split = chat.split_chat(lm.tokenizer, text)
        with torch.no_grad():
            argmax = int(hf_lm(input_ids=torch.tensor([[*split.prefix, *ids]])).logits[0, -1].argmax())
        assert row["ends_turn"] == int(argmax == split.suffix[0])
        assert (completed == response) == bool(row["ends_turn"])
        full = chat.Conversations(rm.tokenizer, text).token_ids([completed])[0]
        want = float(np.asarray(calls.rewards(rm, np.asarray([full], np.int32), np.ones((1, len(full)), bool)))[0, 0])
        assert abs(row["completed_reward"] - want) <= tolerance.any_rewards_atol(rm.params, rm.config, len(full))
