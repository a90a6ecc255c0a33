"""Two RMs that share their lower layers, scored with one pass through them (rmjax.scoring.forked): the shared
layers found from the weights, and each model's rewards against its own full forward."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest

from rmjax import nn
from rmjax.loading import load
from rmjax.parallel import sharding
from rmjax.scoring.context import PromptContext
from rmjax.scoring.forked import forked_token_rewards, shared_layers
from rmjax.scoring.prefix import prefill_prefix
from rmjax.search.disagree import both_token_rewards
from rmjax.search.sides import RewardSide, SideSpec
from rmjax.text import chat, prompts
from tests import jitted as M
from tests import tiny, tolerance

PREFIX, SUFFIX = (1, 17, 33, 5, 60), (2, 9)


def _retrained(model, first: int, seed: int = 3):
    """`model` with every layer from `first` on, the final norm and the score head moved (what train_rm --last_k
    changes), the layers below left alone."""
    rng = np.random.default_rng(seed)
    flat = nn.flat(model.params)
    changes = {}
    for path, w in flat.items():
        w = np.asarray(w)
        if path.startswith("layers."):
            w = w.copy()
            w[first:] += 0.05 * rng.standard_normal(w[first:].shape).astype(w.dtype)
        elif path.startswith(("final_norm.", "score.")):
            w = w + 0.3 * rng.standard_normal(w.shape).astype(w.dtype)
        else:
            continue
        changes[path] = jnp.asarray(w)
    params = nn.replace(model.params, model.config, **changes)
    return dataclasses.replace(model, params=params, fingerprint=None, fingerprint_of=None)


def _context(model) -> PromptContext:
    split = chat.ChatSplit("", PREFIX, SUFFIX, "chat")
    return PromptContext("p", split, prefill_prefix(model, PREFIX), jnp.asarray(SUFFIX, jnp.int32))


@pytest.mark.parametrize("family", ["llama3", "gemma3"])  # gemma3: sliding-window layers split at the fork
def test_forked_rewards_equal_each_models_own_full_forward(family, tmp_path):
    a = load(str(tiny.save_hf_model(tiny.build_hf_model(family, num_labels=1, seed=2), tmp_path)),
             require_tokenizer=False)
    n = a.config.num_layers
    b = _retrained(a, first=n - 2)
    assert shared_layers(a, b) == n - 2
    assert shared_layers(a, a) == n - 1  # all alike: the last layer still runs per model
    assert shared_layers(a, _retrained(a, first=0)) == 0
    moved_embeddings = nn.replace(a.params, a.config, **{"embed.embedding": nn.get(a.params, "embed.embedding") + 1})
    assert shared_layers(a, dataclasses.replace(a, params=moved_embeddings, fingerprint=None)) == 0

    tokens = np.arange(3, 3 + 37)  # not a multiple of the batch: the last batch is padded
    ra, rb = forked_token_rewards(a, b, _context(a), _context(b), tokens, n - 2, batch_size=16)
    ids = np.asarray([[*PREFIX, t, *SUFFIX] for t in tokens], np.int32)
    mask = np.ones_like(ids, bool)
    for model, got in ((a, ra), (b, rb)):
        want = np.asarray(M.rewards(model.params, model.config, ids, mask))[:, 0]
        atol = tolerance.rewards_atol(model.params, model.config, ids)
        np.testing.assert_allclose(got, want, rtol=0, atol=atol)
    assert np.abs(ra - rb).min() > 100 * atol  # B's own upper layers and head, not A's
    with pytest.raises(ValueError, match="share"):
        forked_token_rewards(a, b, _context(a), _context(b), tokens, n - 1)


@pytest.mark.parametrize("mesh_spec", ["data:2,model:4", "data:8,model:1"])
def test_forked_rewards_on_a_mesh_equal_the_unsharded_ones(mesh_spec, tmp_path):
    """Sharded weights (heads over `model`) and rows over `data`: the fork's slices of the stacked layers keep
    their placement, and the rewards are the one-device ones within the bound (partial sums over `model`)."""
    folder = tiny.save_hf_model(tiny.build_hf_model("llama3", num_labels=1, seed=4), tmp_path)
    plain = load(str(folder), require_tokenizer=False)
    mesh = sharding.make_mesh(mesh_spec)
    a = load(str(folder), mesh=mesh, require_tokenizer=False)
    n = a.config.num_layers
    b, b_plain = (_retrained(m, first=n - 1) for m in (a, plain))
    b = dataclasses.replace(b, params=jax.device_put(b.params, nn.shardings(b.config, mesh)))
    assert shared_layers(a, b) == n - 1
    tokens = np.arange(5, 5 + 21)
    got = forked_token_rewards(a, b, _context(a), _context(b), tokens, n - 1, batch_size=8)
    want = forked_token_rewards(plain, b_plain, _context(plain), _context(b_plain), tokens, n - 1, batch_size=8)
    ids = np.asarray([[*PREFIX, t, *SUFFIX] for t in tokens], np.int32)
    for model, g, w in ((plain, got[0], want[0]), (b_plain, got[1], want[1])):
        np.testing.assert_allclose(g, w, rtol=0, atol=tolerance.rewards_atol(model.params, model.config, ids))


def test_the_vocabulary_map_forks_two_rms_that_share_layers(rm_folder):
    a_model = load(str(rm_folder))
    b_model = _retrained(a_model, first=2)
    side = {name: RewardSide(SideSpec.parse(name), m, prompts.PAPER1["greatest"], "auto")
            for name, m in (("a", a_model), ("b", b_model))}
    ids = np.arange(300, 300 + 40)
    shared = pd.DataFrame({"text": [str(i) for i in ids], "token_a": ids, "token_b": ids})
    ra, rb, layers = both_token_rewards(side["a"], side["b"], shared)
    assert layers == 2
    atol = tolerance.any_rewards_atol(a_model.params, a_model.config, 64)
    np.testing.assert_allclose(ra, side["a"].token_rewards(ids), rtol=0, atol=atol)
    np.testing.assert_allclose(rb, side["b"].token_rewards(ids), rtol=0, atol=atol)
    # other tokens for B (another tokenizer's ids): each side runs its own forward
    *_, layers = both_token_rewards(side["a"], side["b"], shared.assign(token_b=ids + 1))
    assert layers == 0


def test_a_span_outside_the_stack_is_refused(rm_folder):
    """A layer index past the stack would be clamped by the in-loop read (the last layer run again): refused."""
    model = load(str(rm_folder))
    stack, n = nn.module(model.params, model.config).layers, model.config.num_layers
    for span in ((0, n + 1), (2, 2), (-1, 2)):
        with pytest.raises(ValueError, match="is not a range of this stack"):
            stack(None, None, span=span)
