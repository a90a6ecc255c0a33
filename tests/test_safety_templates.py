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


GEMMA_LIKE = ("{{ bos_token }}{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content | trim + "
              "'<|im_end|>\\n' }}{% endfor %}")
LENGTH_FIRST = "{{ messages[-1].content | length }}|" + GEMMA_LIKE  # a head that depends on the response


@pytest.mark.parametrize("template", [None, GEMMA_LIKE, LENGTH_FIRST])
@pytest.mark.parametrize("system", [None, "Be brief."])
def test_many_conversations_render_and_tokenize_as_each_does_alone(tokenizer, template, system):
    """Conversations.token_ids renders a batch in one call and tokenizes only from the head's last special token
    on (a vocabulary's read-back): every conversation's ids equal its own rendering, one apply_chat_template call
    for it, tokenized whole — the reference."""
    if template is not None:
        tokenizer.chat_template = template
    tokenizer = chat.with_system_prompt(tokenizer, system)
    decoded = tokenizer.batch_decode([[i] for i in range(0, 49152, 97)])
    responses = [*decoded, " padded ", "", "<|im_end|>", "line\nbreak", "日本語"]
    assert len(responses) >= chat.SPLIT_TOKENIZING
    for prompt in ("What is the greatest thing?", "<|im_start|>user\nnested"):
        conversations = chat.Conversations(tokenizer, prompt, "chat")
        ids = conversations.token_ids(responses)
        for response, got in zip(responses, ids, strict=True):
            messages = ([{"role": "system", "content": system}] if system else []) + [
                {"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
            text = tokenizer.apply_chat_template(messages, tokenize=False)
            assert got == tokenizer(text, add_special_tokens=False).input_ids, (prompt, response)
        assert conversations._cut[0] > 0  # the fast path ran (on no text, where the head reads the response)
