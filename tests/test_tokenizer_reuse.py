"""A tokenizer read once per process and content (rmjax.loading.hf): a second load of the same folder reuses it,
and a tokenizer file changed in place is read again (the reused one would tokenize with the old vocabulary: a
silently wrong result)."""

from __future__ import annotations

import json

from transformers import AutoTokenizer

from rmjax.loading import identity, load
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
    templated = load(str(folder)).tokenizer
    assert templated is not changed  # any file the tokenizer reads

    named = folder / "additional_chat_templates" / "tool_use.jinja"  # read by transformers, named by no list
    named.parent.mkdir()
    named.write_text("{{ messages[0].content }}")
    assert load(str(folder)).tokenizer is not templated
    before = identity.tokenizer_digest(folder)
    named.write_text("{{ messages[-1].content }}")  # changed in place: read again, and another identity
    assert identity.tokenizer_digest(folder) != before
    assert load(str(folder)).tokenizer.chat_template["tool_use"] == "{{ messages[-1].content }}"


def test_the_tokenizer_digest_of_the_usual_files_is_unchanged(rm_folder):
    """A folder of the usual files (identity.TOKENIZER_FILES only) digests as before tokenizer_files existed, so
    results made before still resume."""
    files = {name: identity.file_sha256(rm_folder / name) for name in identity.TOKENIZER_FILES
             if (rm_folder / name).is_file()}
    assert set(identity.tokenizer_files(rm_folder)) == set(files)
    assert identity.tokenizer_digest(rm_folder) == identity.hash_json(files)
