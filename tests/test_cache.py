"""Prefill-then-extend equals the full forward (the sweep's prefix cache)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from rmjax import nn
from rmjax.loading.hf import load_hf_model_folder
from tests import jitted as M
from tests import tiny, tolerance


@pytest.fixture(scope="module", params=["llama3.1", "gemma2", "gemma3"])
def reward_model(request, tmp_path_factory):
    hf = tiny.build_hf_model(request.param, num_labels=2)
    folder = tiny.save_hf_model(hf, tmp_path_factory.mktemp(request.param))
    return load_hf_model_folder(folder, require_tokenizer=False)


def test_shared_prefix_cache_equals_full_forward(reward_model):
    p, cfg = reward_model.params, reward_model.config
    rng = np.random.default_rng(0)
    prefix = rng.integers(3, tiny.VOCAB, size=(1, 9)).astype(np.int32)
    cands = rng.integers(3, tiny.VOCAB, size=(6, 3)).astype(np.int32)
    cache = M.prefill(p, cfg, prefix, np.ones_like(prefix, bool))
    got = np.asarray(M.rewards_after(p, cfg, cache, cands))
    full = np.concatenate([np.repeat(prefix, 6, axis=0), cands], axis=1)
    ref = np.asarray(M.rewards(p, cfg, full, np.ones_like(full, bool)))
    np.testing.assert_allclose(got, ref, atol=tolerance.rewards_atol(p, cfg, full), rtol=0)


def test_per_row_cache_with_left_padded_prefix(reward_model):
    """A batched cache whose prefixes have different lengths (left padded)."""
    p, cfg = reward_model.params, reward_model.config
    ids, mask = tiny.random_batch(seed=3, batch=3, length=10, padding="left")
    cands = np.random.default_rng(1).integers(3, tiny.VOCAB, size=(3, 2)).astype(np.int32)
    cache = M.prefill(p, cfg, ids, mask)
    got = np.asarray(M.rewards_after(p, cfg, cache, cands))
    atol = tolerance.rewards_atol(p, cfg, cands, cache=cache)
    for row in range(3):
        seq = np.concatenate([ids[row][mask[row]], cands[row]])[None]
        ref = np.asarray(M.rewards(p, cfg, seq, np.ones_like(seq, bool)))
        np.testing.assert_allclose(got[row], ref[0], atol=atol, rtol=0)


def test_extend_cache_then_continue(reward_model):
    """Two-step extension (prefill, extend by one block, then score) equals one pass."""
    p, cfg = reward_model.params, reward_model.config
    rng = np.random.default_rng(2)
    a = rng.integers(3, tiny.VOCAB, size=(1, 5)).astype(np.int32)
    b = rng.integers(3, tiny.VOCAB, size=(1, 4)).astype(np.int32)
    c = rng.integers(3, tiny.VOCAB, size=(1, 3)).astype(np.int32)
    cache = M.prefill(p, cfg, a)
    step = M.forward(p, cfg, ids=jnp.asarray(b), cache=cache).kv
    cache = M.extend_cache(cache, step)
    got = np.asarray(M.rewards_after(p, cfg, cache, c))
    full = np.concatenate([a, b, c], axis=1)
    ref = np.asarray(M.rewards(p, cfg, full, np.ones_like(full, bool)))
    np.testing.assert_allclose(got, ref, atol=tolerance.rewards_atol(p, cfg, full), rtol=0)


def test_embeds_path_equals_ids_path(reward_model):
    """forward(embeds=embed[ids]) == forward(ids) (GCG feeds one-hot @ embed)."""
    p, cfg = reward_model.params, reward_model.config
    ids, mask = tiny.random_batch(seed=4, batch=2, length=8, padding="right")
    h_ids = M.forward(p, cfg, ids=ids, mask=mask).hidden
    one_hot = jnp.eye(cfg.vocab_size, dtype=jnp.float32)[ids]
    h_emb = M.forward(p, cfg, embeds=one_hot @ nn.get(p, "embed.embedding"), mask=mask).hidden
    # exact: a one-hot row times the table sums one non-zero product, and the rest is the same forward
    np.testing.assert_array_equal(np.asarray(h_emb), np.asarray(h_ids))
