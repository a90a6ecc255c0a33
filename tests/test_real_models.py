"""The two real models shipped on PyPI: rmjax logits equal transformers-from-GGUF logits."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from rmjax import model as M
from rmjax.loading import load, resolve

PROMPT = "What, in one word, is the greatest thing ever?"


def _prompt_ids(model) -> np.ndarray:
    tok = model.tokenizer
    if tok.chat_template:
        text = tok.apply_chat_template([{"role": "user", "content": PROMPT}], tokenize=False,
                                       add_generation_prompt=True)
        ids = tok(text, add_special_tokens=False).input_ids
    else:  # base model: the papers' plain format
        ids = tok(f"User: {PROMPT}\nAssistant:").input_ids
    return np.asarray([ids], np.int32)


@pytest.mark.parametrize("name", ["smollm2-135m-instruct", "gemma-3-270m"])
def test_real_model_matches_transformers_gguf(name):
    model = load(name)
    ids = _prompt_ids(model)
    if name.startswith("smollm2"):
        assert model.chat_template and ids.shape[1] == 42  # system + user + assistant header
    mask = np.ones_like(ids, bool)
    got = np.asarray(M.logits(model.params, model.config, ids, mask))[0]

    _, gguf_path = resolve(name)
    ref_model = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32,
        attn_implementation="eager",
    ).eval()
    with torch.no_grad():
        ref = ref_model(input_ids=torch.from_numpy(ids).long()).logits[0].float().numpy()
    assert got.shape == ref.shape
    err = np.abs(got - ref).max()
    print(f"{name}: max |logit diff| = {err:.2e} over {ref.size} logits")
    assert err <= 1e-3
    # Greedy next token after every prefix position agrees.
    np.testing.assert_array_equal(got.argmax(-1), ref.argmax(-1))
