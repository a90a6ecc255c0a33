"""A tokenizer read once per process and content (rmjax.loading.hf): a second load of the same folder reuses it,
and a tokenizer file changed in place is read again (the reused one would tokenize with the old vocabulary: a
silently wrong result)."""

from __future__ import annotations

import json

from transformers import AutoTokenizer

from rmjax.loading import load
from tests import cli

WORDS = "a b ab ba love"


def _ids(tokenizer) -> list[int]:
    return tokenizer(WORDS, add_special_tokens=False).input_ids


def test_a_folder_tokenizer_is_reused_until_its_files_change(rm_folder, tmp_path):
    folder = cli.copy_folder(rm_folder, tmp_path / "rm")
    first, second = load(str(folder)), load(str(folder))
    assert second.tokenizer is first.tokenizer  # read once
    assert _ids(first.tokenizer) == _ids(AutoTokenizer.from_pretrained(str(folder)))

    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    vocab["a"], vocab["b"] = vocab["b"], vocab["a"]  # same size, same file length: another tokenizer
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    changed = load(str(folder)).tokenizer
    assert changed is not first.tokenizer
    want = _ids(AutoTokenizer.from_pretrained(str(folder)))
    assert _ids(changed) == want != _ids(first.tokenizer)

    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": "{{ messages[0].content }}"}))
    assert load(str(folder)).tokenizer is not changed  # any file the tokenizer reads
