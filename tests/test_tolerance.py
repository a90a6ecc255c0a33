"""The float32 bound of tests/tolerance.py on both sides: it covers rounding (other batch shapes, eager vs jit,
PyTorch) and is still far below what a small change of the math does."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from rmjax.loading.hf import load_hf_model_folder
from tests import jitted as M
from tests import tiny, tolerance


@pytest.fixture(scope="module", params=["llama3.1", "gemma2"])
def built(request, tmp_path_factory):
    hf = tiny.build_hf_model(request.param, num_labels=3)
    model = load_hf_model_folder(tiny.save_hf_model(hf, tmp_path_factory.mktemp(request.param)),
                                 require_tokenizer=False)
    ids, mask = tiny.random_batch(seed=1, batch=4, length=12, padding="left")
    return hf, model, ids, mask


def test_bound_covers_rounding(built):
    hf, model, ids, mask = built
    p, cfg = model.params, model.config
    atol = tolerance.rewards_atol(p, cfg, ids, mask)
    ref = np.asarray(M.rewards(p, cfg, ids, mask))
    with torch.no_grad():
        torch_rewards = hf(input_ids=torch.from_numpy(ids).long(), attention_mask=torch.from_numpy(mask).long(),
                           position_ids=tiny.torch_positions(mask)).logits.numpy()
    variants = {
        "pytorch": torch_rewards,
        "eager": np.asarray(M.module(p, cfg).rewards(ids, mask)),
        "rows one by one": np.concatenate([np.asarray(M.rewards(p, cfg, ids[i : i + 1], mask[i : i + 1]))
                                           for i in range(len(ids))]),
        "batch of 16": np.asarray(M.rewards(p, cfg, np.tile(ids, (4, 1)), np.tile(mask, (4, 1))))[: len(ids)],
    }
    for name, got in variants.items():  # measured: at most 1/20 of the bound
        np.testing.assert_allclose(got, ref, atol=atol, rtol=0, err_msg=name)


def test_bound_still_sees_a_small_change_of_the_math(built):
    _, model, ids, mask = built
    p, cfg = model.params, model.config
    atol = tolerance.rewards_atol(p, cfg, ids, mask)
    ref = np.asarray(M.rewards(p, cfg, ids, mask))
    theta = dataclasses.replace(cfg.rope_global, theta=cfg.rope_global.theta * 1.1)
    for name, changed in {"query scale x 1.01": cfg.replace(query_scale=cfg.query_scale * 1.01),
                          "RoPE theta x 1.1": cfg.replace(rope_global=theta)}.items():
        moved = np.abs(np.asarray(M.rewards(p, changed, ids, mask)) - ref).max()
        assert moved > 3 * atol, (name, moved, atol)  # measured: 50x to 90x, and 70x
