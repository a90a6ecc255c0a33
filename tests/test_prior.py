"""The fluency term of issue 25: a response's token log-probabilities under an LM, after the prompt's chat context,
against transformers running the whole conversation."""

from __future__ import annotations

import numpy as np
import torch

from rmjax.loading import load
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
