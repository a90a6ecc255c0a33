"""Where the reward head reads a conversation that ends in the pad id, against transformers.

transformers' *ForSequenceClassification reads the rightmost token whose id is not `pad_token_id`. With pad = eos
(common: a Llama 3 RM fine-tuned with `pad_token = eos_token`), a turn that ends in that id is read at the token
before it: every row of a template that closes the turn with it, and a plain response that ends with it. The
tiny RM here has the SmolLM2 tokenizer with pad = eos = <|im_end|> (2) and a template that ends the assistant turn
with <|im_end|> and nothing after it, as Llama 3's ends with <|eot_id|>. Every rmjax path that reads the head
(whole rows, after a cached prompt, the sweep's rows, whole turns, packed variants, the GCG forward, the reward
lens and the per-token curve) is compared with transformers run on the whole conversation, one at a time.
"""

from __future__ import annotations

import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from rmjax.loading import load
from rmjax.parallel.distributed import to_host
from rmjax.scoring import calls
from rmjax.scoring.prefix import extend_prefix, score_responses, score_variants
from rmjax.scoring.texts import TextScorer
from rmjax.search import gcg as gcg_lib
from rmjax.text.chat import Conversations
from tests import tiny, tolerance

EOS = PAD = 2
EOT_TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
                "'<|im_end|>'}}{% if not loop.last %}{{'\n'}}{% endif %}{% endfor %}"
                "{% if add_generation_prompt %}{{ '\n<|im_start|>assistant\n' }}{% endif %}")
PROMPT = "What is the greatest thing ever?"
TEXTS = ["Love", "Ice cream<|im_end|>", "<|im_end|>", "a quiet<|im_end|><|im_end|>", "<|im_end|> morning"]


@pytest.fixture(scope="module")
def rm(tmp_path_factory):
    """(the rmjax model, the transformers model) of one tiny Llama RM with pad = eos and an eos-final template."""
    folder = tmp_path_factory.mktemp("pad_read") / "rm"
    hf = tiny.build_hf_model("llama3", 1, vocab_size=49152, pad_token_id=PAD, bos_token_id=1, eos_token_id=EOS)
    tiny.save_hf_model(hf, folder)
    src = tiny.smollm2_tokenizer_folder()
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / f, folder / f)
    (folder / "chat_template.jinja").write_text(EOT_TEMPLATE)
    return load(str(folder)), hf


def _transformers(hf, ids: list[int]) -> float:
    with torch.no_grad():
        return float(hf(input_ids=torch.tensor([ids])).logits[0, 0])


def _last_token(hf, ids: list[int]) -> float:
    """transformers reading the very last token (pad_token_id None, batch 1): what rmjax read before."""
    hf.config.pad_token_id = None
    try:
        return _transformers(hf, ids)
    finally:
        hf.config.pad_token_id = PAD


def _conversations(model, template: str) -> Conversations:
    return Conversations(model.tokenizer, PROMPT, template, False, model.config.max_position_embeddings)


def _atol(model) -> float:
    return tolerance.any_rewards_atol(model.params, model.config, 64)


@pytest.mark.parametrize("template", ["auto", "plain"])
def test_texts_read_before_trailing_pad_ids_whole_and_after_a_cached_prompt(rm, template):
    """Whole rows (calls.rewards) and rows after the prompt's cache (TextScorer) equal transformers; a response of
    pad ids alone reads the prompt's own read point. The case is live: the last token's reading differs."""
    model, hf = rm
    conv = _conversations(model, template)
    seqs = conv.token_ids(TEXTS)
    assert all(s[-1] == PAD for s in seqs[1:4]) and (template == "plain" or seqs[0][-1] == PAD)
    want = np.asarray([_transformers(hf, s) for s in seqs])
    moved = np.asarray([abs(_last_token(hf, s) - w) for s, w in zip(seqs, want, strict=True)])
    assert moved[1:4].min() > 100 * _atol(model)  # reading the final pad id would fail every one of these rows
    cached = TextScorer(model, PROMPT, template).score(TEXTS)
    width = max(map(len, seqs))
    ids = np.asarray([s + [0] * (width - len(s)) for s in seqs], np.int32)
    mask = np.asarray([[j < len(s) for j in range(width)] for s in seqs])
    whole = to_host(calls.rewards(model, ids, mask))[:, 0]
    np.testing.assert_allclose(cached, want, atol=_atol(model), rtol=0)
    np.testing.assert_allclose(whole, want, atol=_atol(model), rtol=0)


@pytest.mark.parametrize("template", ["auto", "plain"])
def test_the_sweeps_rows_and_whole_turns_read_before_trailing_pad_ids(rm, template):
    """score_responses' one-token rows (the pad id's own row reads the prompt) and whole turns of several lengths
    (a turn that is only the end of turn reads the prompt) equal transformers on prefix + tokens + suffix."""
    model, hf = rm
    target = gcg_lib.make_target(model, PROMPT, template)
    prefix, suffix = list(target.prefix), list(target.suffix)
    tokens = np.asarray([PAD, 30200, 8549, 5738], np.int32)
    got = score_responses(model, target.cache, target.suffix_ids, tokens[:, None], 8)
    want = [_transformers(hf, prefix + [int(t)] + suffix) for t in tokens]
    np.testing.assert_allclose(got, want, atol=_atol(model), rtol=0)
    responses = np.asarray([[30200, 8549, PAD], [PAD, PAD, PAD], [5738, PAD, 8549]], np.int32)
    lengths = np.asarray([3, 2, 1])
    turns = score_responses(model, target.cache, target.suffix_ids, responses, 8, lengths=lengths, end=EOS)
    read = [list(r[:n]) + suffix for r, n in zip(responses.tolist(), lengths, strict=True)]
    np.testing.assert_allclose(turns, [_transformers(hf, prefix + r) for r in read], atol=_atol(model), rtol=0)


@pytest.mark.parametrize("template", ["auto", "plain"])
def test_packed_variants_and_the_gcg_forward_read_before_trailing_pad_ids(rm, template):
    """score_variants (a variant whose changed tail is all pad ids reads an earlier, unchanged token; one of pad
    ids alone reads the prompt) and the GCG gradient's forward value equal transformers."""
    model, hf = rm
    target = gcg_lib.make_target(model, PROMPT, template)
    prefix, suffix = list(target.prefix), list(target.suffix)
    current = np.asarray([30200, 8549, 5738], np.int32)
    variants = np.asarray([[30200, 8549, PAD], [30200, PAD, PAD], [PAD, PAD, PAD], [5738, 8549, 5738],
                           [PAD, 8549, 5738]], np.int32)
    extended = extend_prefix(model, target.cache, current[None])
    got = score_variants(model, extended, np.asarray(suffix, np.int32), current, variants, 8)
    want = [_transformers(hf, prefix + v + suffix) for v in variants.tolist()]
    np.testing.assert_allclose(got, want, atol=_atol(model), rtol=0)
    for ids in variants[:3]:
        one_hot = jax.nn.one_hot(ids, model.config.vocab_size, dtype=jnp.float32)
        value, _ = gcg_lib._reward_of_one_hot(model.config, model.params, target.cache, one_hot, jnp.asarray(ids),
                                              target.suffix_ids, column=0)
        np.testing.assert_allclose(float(value), _transformers(hf, prefix + ids.tolist() + suffix),
                                   atol=_atol(model), rtol=0)
    if template == "plain":  # a plain whole turn's end (here not the pad id) is not read (read_offset 1), nor
        ends = ([5738, 8549, 30200], [5738, PAD, 30200])  # the pad ids before it
        packed = score_variants(model, extended, np.asarray(suffix, np.int32), current, np.asarray(ends, np.int32),
                                8, read_offset=1)
        for ids, value_packed in zip(ends, packed, strict=True):
            one_hot = jax.nn.one_hot(ids, model.config.vocab_size, dtype=jnp.float32)
            value, _ = gcg_lib._reward_of_one_hot(model.config, model.params, target.cache, one_hot,
                                                  jnp.asarray(ids), target.suffix_ids, column=0, read_offset=1)
            want = _transformers(hf, prefix + ids[:1 + (ids[1] != PAD)])
            np.testing.assert_allclose([float(value), value_packed], [want, want], atol=_atol(model), rtol=0)


def test_a_row_of_pad_ids_alone_and_a_prompt_that_ends_in_pad_ids(rm):
    """Token ids with no template: a whole row of pad ids alone is read at its first token (transformers' argmax
    of no match; every position of a run of one token holds the same state, so this pins only that it is finite);
    after a cached prefix that itself ends in pad ids, new pad ids alone read the prefix's last other token, and a
    new token is read as usual."""
    from rmjax.scoring.prefix import prefill_prefix

    model, hf = rm
    whole = np.asarray([[PAD, PAD, PAD], [30200, PAD, PAD]], np.int32)
    got = to_host(calls.rewards(model, whole, np.ones_like(whole, bool)))[:, 0]
    np.testing.assert_allclose(got, [_transformers(hf, r) for r in whole.tolist()], atol=_atol(model), rtol=0)
    prefix = [1, 30200, 8549, PAD, PAD]
    new = np.asarray([[PAD, PAD], [5738, PAD]], np.int32)
    after = to_host(calls.rewards_after(model, prefill_prefix(model, prefix), new, np.ones_like(new, bool)))[:, 0]
    np.testing.assert_allclose(after, [_transformers(hf, prefix + r) for r in new.tolist()], atol=_atol(model),
                               rtol=0)


def test_the_reward_lens_and_the_per_token_curve_read_before_trailing_pad_ids(rm):
    """The lens' reward of a whole conversation, and each cut of the per-token curve (a cut that ends in the pad id
    reads the token before), equal transformers on that conversation or cut."""
    from rmjax.inspect.lens import reward_lens, token_rewards

    model, hf = rm
    seq = _conversations(model, "auto").token_ids(["Ice cream<|im_end|><|im_end|> yes"])[0]
    cut = next(j for j in range(2, len(seq)) if seq[j - 2:j] == [PAD, PAD])  # ... cream <|im_end|> <|im_end|> | yes
    assert seq[cut - 3] != PAD and seq[-1] == PAD
    lens = reward_lens(model, [seq, seq[:cut]])
    np.testing.assert_allclose(lens.reward[:, 0], [_transformers(hf, seq), _transformers(hf, seq[:cut])],
                               atol=_atol(model), rtol=0)
    curve = token_rewards(model, [seq])[0][:, 0]
    for j in (cut - 3, cut - 2, cut - 1, len(seq) - 1):
        np.testing.assert_allclose(curve[j], _transformers(hf, seq[: j + 1]), atol=_atol(model), rtol=0)


def test_training_on_prefixes_reads_before_trailing_pad_ids_and_leaves_a_pad_only_response_whole(rm):
    """prefixed_pair_rewards (the trained layers over each prompt's cached prefix) equals transformers on whole
    conversations whose turn ends in the pad id; a response of pad ids alone (the head reads the prompt) trains on
    whole sequences instead (prefixed_pairs gives None)."""
    from rmjax.train import prefixed
    from rmjax.train.data import Pairs
    from rmjax.train.loop import trainable_part
    from rmjax.train.settings import TrainConfig

    model, hf = rm
    pairs = Pairs([PROMPT] * 3, ["Love", "Ice cream<|im_end|>", "a quiet morning"],
                  ["<|im_end|> morning", "Love<|im_end|><|im_end|>", "tea"], np.full(3, 1.0, np.float32))
    split = prefixed.prefixed_pairs(model, pairs, "auto", batch_size=4)
    assert split is not None
    module, _ = trainable_part(model, TrainConfig(trainable="last_k", last_k=1))
    data = prefixed.frozen_prefix_data(model, split, model.config.num_layers - 1, 0, batch_size=4)
    conv = _conversations(model, "auto")
    for side, texts in zip(prefixed.prefixed_pair_rewards(module, data, jnp.arange(3)), (pairs.chosen, pairs.rejected),
                           strict=True):
        want = [_transformers(hf, s) for s in conv.token_ids(texts)]
        np.testing.assert_allclose(np.asarray(side), want, atol=_atol(model), rtol=0)
    alone = Pairs([PROMPT], ["<|im_end|>"], ["Love"], np.ones(1, np.float32))
    assert prefixed.prefixed_pairs(model, alone, "auto", batch_size=4) is None


@pytest.mark.parametrize("template", ["auto", "plain"])
def test_the_beams_rows_after_a_partial_read_before_a_trailing_pad_id(rm, template):
    """An exhaustive beam over {pad, two words} (--allow_special) at depth 2: every row's score, a partial + the pad
    id among them (read at the partial's token), equals transformers on prefix + row + suffix."""
    from rmjax.search.beam import BeamConfig, beam_search

    model, hf = rm
    cands = np.asarray([PAD, 30200, 8549])
    cfg = BeamConfig(depth=2, beam=3, top=9, exhaustive=True, allow_special=True, template=template,
                     direction="optimal")
    result = beam_search(model, {"q": PROMPT}, cfg, cands, batch_size=8)
    target = gcg_lib.make_target(model, PROMPT, template)
    rows = [(ids, score) for f in result.found if f.depth == 2 for ids, score in zip(f.ids, f.scores[:, 0],
                                                                                      strict=True)]
    assert len(rows) == 9 and any(ids[0] != PAD and ids[1] == PAD for ids, _ in rows)
    want = [_transformers(hf, list(target.prefix) + ids.tolist() + list(target.suffix)) for ids, _ in rows]
    np.testing.assert_allclose([score for _, score in rows], want, atol=_atol(model), rtol=0)


def test_the_forked_forward_of_two_rms_reads_before_trailing_pad_ids(rm):
    """forked_token_rewards (two RMs sharing their lower layers; the vocabulary map) over tokens with the pad id:
    model A equals transformers, model B its own whole-sequence forward (read as the first test checks)."""
    from rmjax.scoring.context import prepare_prompt
    from rmjax.scoring.forked import forked_token_rewards
    from tests import jitted as M
    from tests.test_forked import _retrained

    a, hf = rm
    n = a.config.num_layers
    b = _retrained(a, first=n - 2)
    tokens = np.asarray([PAD, 30200, 8549, 5738])
    ra, rb = forked_token_rewards(a, b, prepare_prompt(a, "q", PROMPT), prepare_prompt(b, "q", PROMPT), tokens,
                                  n - 2, batch_size=8)
    target = gcg_lib.make_target(a, PROMPT)
    seqs = [list(target.prefix) + [int(t)] + list(target.suffix) for t in tokens]
    np.testing.assert_allclose(ra, [_transformers(hf, s) for s in seqs], atol=_atol(a), rtol=0)
    ids = np.asarray(seqs, np.int32)
    np.testing.assert_allclose(rb, np.asarray(M.rewards(b.params, b.config, ids, np.ones_like(ids, bool)))[:, 0],
                               atol=_atol(b), rtol=0)
