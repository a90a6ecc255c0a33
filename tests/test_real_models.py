"""The two real models shipped on PyPI: rmjax logits equal transformers-from-GGUF logits."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
import transformers

from rmjax.loading import config_of, load, resolve
from tests import jitted as M
from tests import tolerance
from tests.gguf_reading import plain_reading_once

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
    assert config_of(name) == model.config  # read before loading, without the weights
    ids = _prompt_ids(model)
    if name.startswith("smollm2"):
        assert model.chat_template and ids.shape[1] == 42  # system + user + assistant header
    mask = np.ones_like(ids, bool)
    got = np.asarray(M.logits(model.params, model.config, ids, mask))[0]

    _, gguf_path = resolve(name)
    # gguf's reader slices a numpy.memmap once per metadata item; reading the same bytes through a plain view
    # (tests/gguf_reading.py) takes 30 s less for Gemma's 262k-token vocabulary.
    with plain_reading_once():
        ref_model = transformers.AutoModelForCausalLM.from_pretrained(
            str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32,
            attn_implementation="eager",
        ).eval()
    with torch.no_grad():
        ref = ref_model(input_ids=torch.from_numpy(ids).long()).logits[0].float().numpy()
    assert got.shape == ref.shape
    err = np.abs(got - ref).max()
    atol = tolerance.logits_atol(model.params, model.config, ids, mask)  # the float32 bound (tests/tolerance.py)
    print(f"{name}: max |logit diff| = {err:.2e} over {ref.size} logits (bound {atol:.2e})")
    assert err <= atol
    # Greedy next token after every prefix position agrees, where the top two logits are further apart than
    # the two sides' rounding can move them (2 atol): elsewhere the argmax is a matter of rounding.
    top2 = np.sort(ref, axis=-1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 2 * atol
    assert clear.mean() > 0.8
    np.testing.assert_array_equal(got.argmax(-1)[clear], ref.argmax(-1)[clear])


TEXTS = ["What, in one word, is the greatest thing ever?", " love", "None", "NaN", ",", "\n", "  two  spaces",
         "原始内容存档", "সন্", "══", "<|im_end|>x<bos>", "café déjà-vu 123,456.7 🙂", "\t\ttabs\r\n"]


@pytest.mark.parametrize("name", ["smollm2-135m-instruct", "gemma-3-270m"])
def test_gguf_tokenizer_equals_transformers_gguf_tokenizer(name):
    """rmjax builds the tokenizer without transformers' torch-importing GGUF reader; it must be the same one."""
    from rmjax.loading.gguf_file import hf_config_from_gguf, read_gguf
    from rmjax.loading.gguf_tokenizer import tokenizer_from_gguf

    _, gguf_path = resolve(name)
    contents = read_gguf(gguf_path)
    ours = tokenizer_from_gguf(contents, hf_config_from_gguf(contents, gguf_path)["model_type"], gguf_path)
    # transformers reads SmolLM2's file with gguf's own reader unchanged; Gemma 3's 262,144-token vocabulary
    # through that reader takes 30 s more, so it goes through the plain view (the same bytes).
    reading = plain_reading_once() if name.startswith("gemma") else contextlib.nullcontext()
    with reading:
        ref = transformers.AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    assert type(ours) is type(ref)
    assert ours.backend_tokenizer.to_str() == ref.backend_tokenizer.to_str()
    assert ours.chat_template == ref.chat_template
    for attr in ("bos_token", "eos_token", "pad_token", "unk_token", "all_special_ids"):
        assert getattr(ours, attr) == getattr(ref, attr), attr
    for text in TEXTS:
        for special in (True, False):
            assert ours(text, add_special_tokens=special).input_ids == ref(text, add_special_tokens=special).input_ids
    ids = list(range(0, len(ref), 97))
    assert ours.convert_ids_to_tokens(ids) == ref.convert_ids_to_tokens(ids)
    assert [ours.decode([i]) for i in ids] == [ref.decode([i]) for i in ids]


def test_gguf_tokenizer_needs_no_torch():
    """torch is a test extra: the runtime GGUF path must not import it (a fresh `make demo` has none)."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['torch'] = None\n"
            "from rmjax.loading import resolve\n"
            "from rmjax.loading.gguf_file import hf_config_from_gguf, read_gguf\n"
            "from rmjax.loading.gguf_tokenizer import tokenizer_from_gguf\n"
            "_, path = resolve('smollm2-135m-instruct')\n"
            "contents = read_gguf(path)\n"
            "tok = tokenizer_from_gguf(contents, hf_config_from_gguf(contents, path)['model_type'], path)\n"
            "print(len(tok))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == "49152"
