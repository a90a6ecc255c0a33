"""Training the last K layers on each prompt's prefix (and each distinct response's frozen states) computed once
(rmjax.train.prefixed): the rewards and the loss's gradient are the whole conversations' (an independent full
forward, no cache), within the float32 bound, and a run trains as a run on whole sequences does, within Adam's
rounding drift."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rmjax import nn
from rmjax.loading import load
from rmjax.text.chat import Conversations
from rmjax.train import prefixed
from rmjax.train.data import Pairs
from rmjax.train.loop import train_reward_model, trainable_part
from rmjax.train.rm import bradley_terry_loss
from rmjax.train.settings import TrainConfig
from tests import jitted as M
from tests import tiny, tolerance

PROMPTS = ["What is the greatest thing ever?", "Name one thing.", "Which is the worst, in your honest opinion, of all?"]
WORDS = ["apple", "a river in spring", "house", "the music of the spheres, loud", "dog", "book", "tree", "city lights",
         "stone", "garden", "friend", "road"]


def _pairs(seed: int, n: int) -> Pairs:
    rng = np.random.default_rng(seed)
    prompts = [PROMPTS[i] for i in rng.integers(0, len(PROMPTS), n)]
    chosen = [WORDS[i] for i in rng.integers(0, len(WORDS), n)]
    rejected = [WORDS[i] for i in rng.integers(0, len(WORDS), n)]
    return Pairs(prompts, chosen, rejected, rng.uniform(0, 1, n).astype(np.float32))


def _rm(name: str, folder) -> object:
    return load(str(tiny.save_reward_model_with_tokenizer(folder / "rm", name, seed=5)[1]))


@pytest.fixture(scope="module", params=["llama3", "gemma3"])
def rm(request, tmp_path_factory):
    """A tiny RM with the SmolLM2 tokenizer and template; Gemma 3's sliding window (4) is far shorter than a
    prompt's prefix, so the responses' frozen layers read a windowed cache."""
    return _rm(request.param, tmp_path_factory.mktemp(request.param))


def _whole(rm, pairs: Pairs) -> tuple[np.ndarray, np.ndarray]:
    """Each side's whole conversation, [2, P, T] ids and mask, built here from the template (not the code's
    split)."""
    sides = []
    for texts in (pairs.chosen, pairs.rejected):
        rows = [Conversations(rm.tokenizer, q, "auto").token_ids([t])[0]
                for q, t in zip(pairs.prompt, texts, strict=True)]
        sides.append(rows)
    width = max(len(r) for s in sides for r in s)
    padded = [_pad(s, width) for s in sides]
    return np.stack([p[0] for p in padded]), np.stack([p[1] for p in padded])


def _pad(rows, width):
    ids, mask = np.zeros((len(rows), width), np.int32), np.zeros((len(rows), width), bool)
    for i, r in enumerate(rows):
        ids[i, : len(r)], mask[i, : len(r)] = r, True
    return ids, mask


@pytest.mark.parametrize("trainable,steps", [("last_k", 0), ("last_k", 100), ("full", 100)],
                         ids=["frozen_layers_each_step", "frozen_states_once", "full"])
def test_rewards_and_gradient_equal_the_whole_conversations(rm, trainable, steps, monkeypatch):
    """`full`: no frozen layer, every layer runs each prefix once a call and the responses after it."""
    last_k = 2 if rm.config.has_local_layers else 1  # Gemma 3: a full-attention and a windowed layer train
    pairs = _pairs(0, 10)
    split = prefixed.prefixed_pairs(rm, pairs, "auto", batch_size=6)
    assert split is not None and len(split.prefixes) == len(PROMPTS)
    assert len(set(split.prefix_mask.sum(1).tolist())) == len(PROMPTS)  # padded prefixes of three widths
    module, wrt = trainable_part(rm, TrainConfig(trainable=trainable, last_k=last_k))
    monkeypatch.setattr(prefixed, "STATES_CHUNK", 3)  # several calls, the last one padded
    frozen = rm.config.num_layers - last_k if trainable == "last_k" else 0
    data = prefixed.frozen_prefix_data(rm, split, frozen, steps, batch_size=6)
    distinct = set(zip(pairs.prompt, pairs.chosen, strict=True)) | set(zip(pairs.prompt, pairs.rejected, strict=True))
    if steps and frozen:  # each distinct (prompt, response) once, counted here from the texts
        assert len(data[-1][0]) == len(distinct) and len(distinct) % 3 != 0
    else:  # 0 steps would run the frozen layers over no row, and with none a state is the embedding: no states
        assert data[-1] is None
    idx = jnp.asarray([7, 2, 2, 0, 9, 4])  # a batch with a repeat, in no order
    label = jnp.asarray(pairs.label[np.asarray(idx)])
    ids, mask = _whole(rm, pairs)
    length = ids.shape[-1]
    for s, got in enumerate(nnx.jit(prefixed.prefixed_pair_rewards)(module, data, idx)):
        want = M.rewards(rm.params, rm.config, ids[s][np.asarray(idx)], mask[s][np.asarray(idx)])[:, 0]
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0,
                                   atol=tolerance.rewards_atol(rm.params, rm.config, ids[s], mask[s]))

    def grads_of(pair_rewards, d):
        def loss_fn(m):
            return bradley_terry_loss(*pair_rewards(m, d, idx), label)

        return nnx.jit(nnx.value_and_grad(loss_fn, argnums=nnx.DiffState(0, wrt)))(module)

    # the reference: the full forward of the whole conversations (tests.jitted's module), differentiated the same way
    def whole_rewards(m, d, i):
        return m.rewards(d[0][0][i], d[1][0][i])[:, 0], m.rewards(d[0][1][i], d[1][1][i])[:, 0]

    loss, grads = grads_of(prefixed.prefixed_pair_rewards, data)
    want_loss, want_grads = grads_of(whole_rewards, (jnp.asarray(ids), jnp.asarray(mask)))
    assert float(loss) == pytest.approx(float(want_loss), abs=2 * tolerance.any_rewards_atol(rm.params, rm.config,
                                                                                             length))
    got, want = nn.flat(grads), nn.flat(want_grads)
    assert set(got) == set(want) and any(("upper" if frozen else "layers.") in k for k in got)
    for key in want:
        atol = tolerance.grad_atol(want[key], rm.config, length, 2 * len(idx) * length)
        np.testing.assert_allclose(np.asarray(got[key]), np.asarray(want[key]), rtol=0, atol=atol, err_msg=key)


@pytest.mark.parametrize("trainable", ["last_k", "full"])
def test_a_run_trains_as_on_whole_sequences(tmp_path, monkeypatch, trainable):
    rm = _rm("llama3", tmp_path)
    train, held = _pairs(1, 48), _pairs(2, 16)
    cfg = TrainConfig(trainable=trainable, last_k=2, steps=4, batch_size=8, learning_rate=1e-2, checkpoint_every=4)
    said = []
    fast = train_reward_model(rm, train, held, cfg, tmp_path / "prefixed", log=said.append)
    distinct = len({*zip(train.prompt, train.chosen, strict=True), *zip(train.prompt, train.rejected, strict=True)})
    assert distinct < 2 * cfg.steps * cfg.batch_size  # so the states of the responses are computed once
    if trainable == "last_k":
        train_line = f"prompt prefixes and {distinct} distinct responses through the 2 frozen layers"
        held_line = "held-out pairs: prompt prefixes and responses through the 2 frozen layers once"
    else:
        train_line = "training pairs: split at their prompts' prefixes (every layer trains"
        held_line = "held-out pairs: split at their prompts' prefixes"
    assert any(m.startswith(train_line) for m in said) and any(m.startswith(held_line) for m in said), said
    monkeypatch.setattr(prefixed, "prefixed_pairs", lambda *a: None)
    whole = train_reward_model(rm, train, held, cfg, tmp_path / "whole", log=lambda *_: None)
    length = _whole(rm, train)[0].shape[-1]
    drift = tolerance.adam_atol(cfg.learning_rate, cfg.steps,
                                tolerance.grad_rel_error(rm.config, length, 2 * cfg.batch_size * length))
    np.testing.assert_allclose([h["loss"] for h in fast.history], [h["loss"] for h in whole.history], rtol=0,
                               atol=tolerance.bt_loss_atol(whole.model.params, rm.config, length, drift))
    # held-out evaluation on the held-out prompts' prefixes and responses' states computed once, against the whole
    # conversations (the same trained weights up to the drift: the same bound)
    held_length = _whole(rm, held)[0].shape[-1]
    for got, want in zip(fast.evals, whole.evals, strict=True):
        assert got["step"] == want["step"]
        np.testing.assert_allclose(got["heldout_loss"], want["heldout_loss"], rtol=0,
                                   atol=tolerance.bt_loss_atol(whole.model.params, rm.config, held_length, drift))
    a, b = nn.flat(fast.model.params), nn.flat(whole.model.params)
    for key in ("score.kernel", "layers.down", "final_norm.scale"):
        np.testing.assert_allclose(np.asarray(a[key]), np.asarray(b[key]), rtol=0, atol=drift, err_msg=key)
    assert not np.array_equal(np.asarray(a["layers.down"][-1]), np.asarray(nn.flat(rm.params)["layers.down"][-1]))


def test_a_prompt_gated_head_or_many_prompts_train_on_whole_sequences(tmp_path):
    """A gated head reads the prefix's final hidden state, which the trained layers change; with more prompts than
    a batch has pairs, running every prefix's trained layers each step would cost more than whole sequences."""
    import dataclasses

    from rmjax.heads import HeadConfig

    rm = _rm("llama3", tmp_path)
    pairs = _pairs(0, 12)
    head = HeadConfig(kind="armo", num_objectives=2, pattern=(1, 2))
    gated = dataclasses.replace(rm, config=dataclasses.replace(rm.config, head=head))
    assert prefixed.prefixed_pairs(gated, pairs, "auto", batch_size=8) is None
    assert prefixed.prefixed_pairs(rm, pairs, "auto", batch_size=8) is not None  # 3 prompts
    assert prefixed.prefixed_pairs(rm, pairs, "auto", batch_size=2) is None
    many = Pairs([f"Prompt number {i}?" for i in range(12)], pairs.chosen, pairs.rejected, pairs.label)
    assert prefixed.prefixed_pairs(rm, many, "auto", batch_size=8) is None


def test_a_response_that_merges_into_the_template_prefix_trains_on_whole_sequences(tmp_path):
    """SmolLM2's template ends its prefix in a newline; a response starting with two more tokenizes the three as
    'ĊĊ', 'Ċ', so the conversation does not start with the prefix: splitting it there would train on other tokens."""
    rm = _rm("llama3", tmp_path)
    pairs = _pairs(0, 12)
    merged = Pairs(pairs.prompt, ["\n\nHello", *pairs.chosen[1:]], pairs.rejected, pairs.label)
    conversation = Conversations(rm.tokenizer, merged.prompt[0], "auto")
    prefix = conversation.prefix
    assert conversation.token_ids([merged.chosen[0]])[0][: len(prefix)] != prefix  # the merge the test is about
    assert prefixed.prefixed_pairs(rm, pairs, "auto", batch_size=8) is not None
    assert prefixed.prefixed_pairs(rm, merged, "auto", batch_size=8) is None
