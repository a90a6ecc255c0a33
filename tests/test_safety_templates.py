"""A chat template is the checkpoint's code: it renders at a fixed clock (a result never depends on the day it ran),
and one that loops, exhausts memory or raises is refused in one line, not a hang or a traceback."""

from __future__ import annotations

import datetime
import time

import pytest
from transformers import AutoTokenizer

from rmjax.errors import UsageError
from rmjax.text import chat
from tests import tiny

MESSAGES = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]


@pytest.fixture()
def tokenizer():
    return AutoTokenizer.from_pretrained(str(tiny.smollm2_tokenizer_folder()))


def test_a_template_reading_the_clock_renders_the_fixed_day(tokenizer, monkeypatch):
    """Llama 3.2's template writes `strftime_now("%d %b %Y")` into the system turn: a resume across midnight mixed
    chunks scored under two prompts, and a reuse reported another day's rendering as current."""
    tokenizer.chat_template = "{{ strftime_now('%d %b %Y %H:%M') }}|{% for m in messages %}{{ m.content }}{% endfor %}"
    from transformers.utils import chat_template_utils

    class Midnight(datetime.datetime):  # transformers' own clock, moved to another day
        @classmethod
        def now(cls, tz=None):
            return cls(2031, 1, 2, 23, 59)

    monkeypatch.setattr(chat_template_utils, "datetime", Midnight)
    assert tokenizer.apply_chat_template(MESSAGES, tokenize=False).startswith("02 Jan 2031 23:59|")  # the hazard
    assert chat.render_template(tokenizer, MESSAGES) == "26 Jul 2024 00:00|hiyo"
    assert chat_template_utils.datetime is Midnight  # put back after the render
    conversations = chat.Conversations(tokenizer, "hi", template="chat")  # the re-tokenized path renders alike
    assert conversations.conversation("yo") == "26 Jul 2024 00:00|hiyo"


@pytest.mark.parametrize(("template", "says"), [
    ("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}", "did not finish rendering"),
    ("{{ 'x' * 100000000000 }}", "MemoryError"),
    ("{% include 'other.j2' %}", "TypeError"),
    ("{{ 1 / 0 }}", "ZeroDivisionError"),
])
def test_a_template_that_hangs_exhausts_memory_or_raises_is_one_usage_error(tokenizer, monkeypatch, template, says):
    monkeypatch.setattr(chat, "RENDER_SECONDS", 1)
    tokenizer.chat_template = template
    start = time.monotonic()
    with pytest.raises(UsageError, match=says) as refused:
        chat.split_chat(tokenizer, "hi", "chat")
    assert time.monotonic() - start < 20
    assert "--template=plain" in str(refused.value)


@pytest.mark.parametrize("adds", [(), ("<|im_start|>",), ("<|im_start|>", "<|endoftext|>")])
def test_the_plain_format_puts_what_the_tokenizer_adds_where_tokenizing_the_whole_text_does(tmp_path, adds):
    """A tokenizer whose own rule appends an end of sequence: the plain prompt was tokenized with it and the
    response appended after, so the EOS sat between 'Assistant:' and the response (a fault hunt). Each conversation
    is now what the tokenizer makes of the whole rendered text; the prompt's prefix (log-probs, token mode) holds
    only what comes before the response. `adds`: nothing, a leading special, or one before and one after."""
    import json
    import shutil

    src = tiny.smollm2_tokenizer_folder()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, tmp_path / name)
    tokenizer_json = json.loads((tmp_path / "tokenizer.json").read_text())
    ids = {"<|im_start|>": 1, "<|endoftext|>": 0}
    single = [{"Sequence": {"id": "A", "type_id": 0}}]
    if adds:
        single = [{"SpecialToken": {"id": adds[0], "type_id": 0}}] + single + [
            {"SpecialToken": {"id": t, "type_id": 0}} for t in adds[1:]]
    tokenizer_json["post_processor"] = {"type": "TemplateProcessing", "single": single, "pair": single,
                                        "special_tokens": {t: {"id": t, "ids": [ids[t]], "tokens": [t]} for t in adds}}
    (tmp_path / "tokenizer.json").write_text(json.dumps(tokenizer_json))
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path))
    conversations = chat.Conversations(tokenizer, "What is best?", "plain")
    responses = ["Love", " love ", "a list, of words\nand lines"]
    for response, got in zip(responses, conversations.token_ids(responses), strict=True):
        assert got == tokenizer(conversations.conversation(response)).input_ids
    prefix = list(chat.split_chat(tokenizer, "What is best?", "plain").prefix)
    assert prefix == tokenizer("User: What is best?\nAssistant:").input_ids[:len(prefix)]
    assert 0 not in prefix and prefix[0] == (1 if adds else prefix[0])
