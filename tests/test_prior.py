"""The fluency term of issue 25: a response's token log-probabilities under an LM, after the prompt's chat context,
against transformers running the whole conversation."""

from __future__ import annotations

import jax
import numpy as np
import scipy.stats
import torch

from rmjax.loading import load
from rmjax.nn import ops
from rmjax.scoring.prefix import prefill_prefix
from rmjax.scoring.prior import first_token_log_probs, response_log_probs
from rmjax.text import prompts
from tests import tiny, tolerance


def test_response_log_probs_equal_transformers_on_the_whole_conversation(tmp_path):
    hf = tiny.build_hf_model("llama3", vocab_size=49152, pad_token_id=2, bos_token_id=1, eos_token_id=2)
    folder = tiny.save_hf_model(hf, tmp_path)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (folder / f).write_bytes((tiny.smollm2_tokenizer_folder() / f).read_bytes())
    model = load(str(folder))
    # the conversation up to the assistant's turn, as transformers' chat template renders it
    rendered = model.tokenizer.apply_chat_template([{"role": "user", "content": prompts.PAPER1["greatest"]}],
                                                   tokenize=False, add_generation_prompt=True)
    prefix = model.tokenizer(rendered, add_special_tokens=False).input_ids
    responses = np.random.default_rng(0).integers(3, 49152, size=(5, 4)).astype(np.int32)
    cache = prefill_prefix(model, prefix)
    got = response_log_probs(model, cache, first_token_log_probs(model, prefix), responses, batch_size=2)
    assert got.shape == (5, 4) and got.dtype == np.float32
    for row, lp in zip(responses, got, strict=True):
        ids = [*prefix, *row.tolist()]
        with torch.no_grad():
            ref = torch.log_softmax(hf(input_ids=torch.tensor([ids])).logits[0], -1).numpy()
        want = ref[np.arange(len(prefix) - 1, len(ids) - 1), row]  # token j predicted at the position before it
        atol = tolerance.logprobs_atol(model.params, model.config, np.asarray([ids], np.int32))
        np.testing.assert_allclose(lp, want, atol=atol, rtol=0)


def test_a_reward_model_is_its_own_prior_only_with_tied_embeddings(tmp_path):
    """Tied (Llama 3.2 here, SmolLM2 and Gemma in the default RMs): the RM made from an LM gives the LM's prior.
    Untied: the RM dropped the LM head, and the prior is refused rather than read off the input embeddings."""
    import pytest

    from rmjax.errors import UsageError
    from rmjax.loading.reward_head import reward_model_from_lm

    prefix, responses = [1, 5, 9, 13], np.asarray([[7, 8, 9], [40, 41, 3]], np.int32)
    for name, tied in (("llama3.2", True), ("llama3", False)):
        lm = load(str(tiny.save_hf_model(tiny.build_hf_model(name, seed=2), tmp_path / name)), require_tokenizer=False)
        rm = reward_model_from_lm(lm, seed=0)
        want = response_log_probs(lm, prefill_prefix(lm, prefix), first_token_log_probs(lm, prefix), responses)
        if tied:
            got = response_log_probs(rm, prefill_prefix(rm, prefix), first_token_log_probs(rm, prefix), responses)
            # the same weights through the same computation, compiled for two configs: within float32's bound
            full = np.asarray([[*prefix, *row] for row in responses.tolist()], np.int32)
            np.testing.assert_allclose(got, want, atol=tolerance.logprobs_atol(lm.params, lm.config, full), rtol=0)
        else:
            with pytest.raises(UsageError, match="untied embeddings"):
                first_token_log_probs(rm, prefix)


def test_the_two_step_sampler_draws_from_the_softmax():
    """ops.sample_categorical (a block by its total probability, then a token within it) against the exact
    probabilities of each row: 100,000 draws from each of two rows over 37 tokens in blocks of 8 (the last block
    padded), with tokens at -inf, in the second row a whole block (as the banned non-ASCII tokens fill whole blocks
    of a real vocabulary). A chi-square test at p > 1e-4 fails a correct sampler for one seed in 10,000 (every
    expected count is at least 5, as the test needs); the seed is fixed."""
    rng = np.random.default_rng(0)
    logits = (rng.normal(size=(2, 37)) * 2).astype(np.float32)
    banned = np.zeros((2, 37), bool)
    banned[0, [3, 17, 36]] = True
    banned[1, [0, *range(8, 16), 33]] = True
    logits[banned] = -np.inf
    rows = np.tile(logits, (2000, 1))  # the two rows alternate: a row must draw from its own logits
    draw = jax.jit(lambda key: ops.sample_categorical(key, jax.numpy.asarray(rows), block=8))
    draws = np.stack([np.asarray(draw(jax.random.key(k))).reshape(-1, 2) for k in range(50)]).reshape(-1, 2)
    for row in range(2):
        counts = np.bincount(draws[:, row], minlength=37)
        allowed = ~banned[row]
        assert len(counts) == 37 and counts[~allowed].sum() == 0
        p = np.exp((logits[row, allowed] - logits[row, allowed].max()).astype(np.float64))
        p /= p.sum()
        assert (len(draws) * p).min() >= 5
        assert scipy.stats.chisquare(counts[allowed], len(draws) * p).pvalue > 1e-4


def test_samples_are_the_same_on_any_mesh(lm_folder):
    """On data:3 a sampler batch of 64 was 66 rows, so from sample 64 on each sample came from another batch's
    position than on one device (best-of-N's texts, its forwards and the judge's cap moved with the mesh).
    Reference: the same call on one device."""
    from rmjax.parallel.sharding import make_mesh
    from rmjax.scoring.prior import sample_responses

    prefix = [1, 2, 3]

    def draw(model):
        never = np.zeros(model.config.vocab_size, bool)
        return sample_responses(model, prefill_prefix(model, prefix), first_token_log_probs(model, prefix), never,
                                200, 3, seed=7)

    one = load(str(lm_folder))
    want_ids, want_lps = draw(one)
    ids, lps = draw(load(str(lm_folder), mesh=make_mesh("data:3,model:1", jax.devices()[:3])))
    np.testing.assert_array_equal(ids, want_ids)
    rows = np.concatenate([np.tile(prefix, (len(ids), 1)), ids], axis=1).astype(np.int32)  # what each log-prob reads
    np.testing.assert_allclose(lps, want_lps, rtol=0, atol=tolerance.logprobs_atol(one.params, one.config, rows))


def test_many_batches_on_a_cpu_mesh_finish(rm_folder, tmp_path):
    """A multi-device CPU mesh with ~30+ batches dispatched and unread hung in XLA's all-reduce rendezvous, then
    aborted the process after 60 s (`score --batch_size=5 --mesh=model:4`: its z-sample is 410 batches), as a
    process of 4 CPU devices runs it. Its scores against one device's."""
    import pandas as pd

    from tests import cli

    texts = tmp_path / "texts.txt"
    texts.write_text("Love\nWar\nA cat\n")
    runs = {}
    for devices, mesh in ((1, "data:1,model:1"), (4, "data:1,model:4")):
        out = tmp_path / f"{devices}.csv"
        cli.ok(cli.run("score", f"--model={rm_folder}", "--prompts=greatest", f"--texts_file={texts}",
                       "--batch_size=5", f"--mesh={mesh}", f"--out={out}",
                       env={"XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}))
        runs[mesh] = pd.read_csv(out)
    one, four = runs.values()
    assert list(one.text) == list(four.text)
    one_model = load(str(rm_folder))
    # sums reordered over 4 devices; 64 positions bound the conversation (46 for "A cat" in the chat template)
    atol = 2 * tolerance.any_rewards_atol(one_model.params, one_model.config, 64)
    for column in [c for c in one.columns if c != "text"]:
        np.testing.assert_allclose(four[column], one[column], rtol=0, atol=atol)


def test_the_sampler_draws_from_the_tempered_distribution(lm_folder):
    """The temperature is an argument of the compiled sampler: two tokens allowed, the first drawn token's share at
    T 0.5 and 2 is softmax(log p / T) over the two, within 5 binomial SDs of 4,096 draws (a temperature dropped or
    passed in another argument's place draws otherwise)."""
    from rmjax.scoring.prior import sample_responses

    model, prefix = load(str(lm_folder)), [1, 2, 3]
    first = np.asarray(first_token_log_probs(model, prefix), np.float64)
    b = int(np.argmax(first))
    a = int(np.argmin(np.abs(first - (first[b] - 1.0))))  # a token 1 nat below it: tempering moves their shares
    banned = np.ones(model.config.vocab_size, bool)
    banned[[a, b]] = False
    cache, count = prefill_prefix(model, prefix), 4096
    shares = []
    for temperature in (0.5, 2.0):
        ids, _ = sample_responses(model, cache, first_token_log_probs(model, prefix), banned, count, 1, seed=3,
                                  temperature=temperature)
        want = 1 / (1 + np.exp((first[b] - first[a]) / temperature))  # p(a) of softmax(log p / T) over {a, b}
        got = float(np.mean(ids[:, 0] == a))
        assert set(np.unique(ids[:, 0])) <= {a, b}
        assert abs(got - want) <= 5 * np.sqrt(want * (1 - want) / count), (temperature, got, want)
        shares.append(want)
    assert abs(shares[0] - shares[1]) > 10 * np.sqrt(0.25 / count), (first[a], first[b])  # the test can tell
