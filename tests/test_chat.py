"""rmjax.text.chat's small rules, each against transformers' own rendering or the rule's definition: where a plain
turn ends, which system message a conversation gets, how long renders may take, where a context is full."""

from __future__ import annotations

import types

import pytest
from transformers import AutoTokenizer

from rmjax.errors import PromptTooLongError, UsageError
from rmjax.text import chat
from tests import tiny

USER = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]


@pytest.fixture()
def tokenizer():
    return AutoTokenizer.from_pretrained(str(tiny.smollm2_tokenizer_folder()))


class _Fake:
    """A tokenizer that tokenizes "\\n" as `newline_ids` and has end of sequence `eos`."""

    def __init__(self, newline_ids, eos):
        self.newline_ids, self.eos_token_id = newline_ids, eos

    def __call__(self, text, add_special_tokens=True):
        assert text == "\n" and not add_special_tokens
        return types.SimpleNamespace(input_ids=self.newline_ids)


def test_a_plain_turn_ends_at_the_newline_token_else_at_the_end_of_sequence(tokenizer):
    """The plain format has no suffix: a base model ends its answer with the newline before the next `User:` line,
    where the newline is one token; otherwise with its end of sequence; with neither, refused."""
    newline = tokenizer.convert_tokens_to_ids("Ċ")  # SmolLM2's byte-level newline
    assert chat.end_of_turn_id(tokenizer, (), "m") == newline != tokenizer.eos_token_id
    assert chat.end_of_turn_id(tokenizer, (7, 8), "m") == 7  # a template's suffix: its first token
    assert chat.end_of_turn_id(_Fake([5, 6], eos=2), (), "m") == 2
    assert chat.end_of_turn_id(_Fake([5], eos=2), (), "m") == 5
    with pytest.raises(UsageError, match="m's template puts nothing after the response"):
        chat.end_of_turn_id(_Fake([5, 6], eos=None), (), "m")


def test_the_system_prompt_opens_only_conversations_without_their_own(tokenizer):
    """--system_prompt: a conversation without a system turn gets it first; one that has its own keeps only that
    one. Both equal transformers' rendering of the conversation as it should be."""
    pirate = chat.with_system_prompt(tokenizer, "Be a pirate.")
    own = [{"role": "system", "content": "Be brief."}, *USER]
    got = chat.render_templates(pirate, [USER, own])
    assert got == [tokenizer.apply_chat_template([{"role": "system", "content": "Be a pirate."}, *USER],
                                                 tokenize=False),
                   tokenizer.apply_chat_template(own, tokenize=False)]
    assert got[1].count("<|im_start|>system") == 1 and "pirate" not in got[1]


def test_many_conversations_have_the_render_time_of_each_batch_of_them(tokenizer, monkeypatch):
    """RENDER_SECONDS for each RENDER_BATCH conversations or part of one: 5 conversations in batches of 2 have 3
    batches' time."""
    limits = []
    real = chat._time_limit

    def recorded(seconds, what, count=1):
        limits.append((seconds, count))
        return real(seconds, what, count)

    monkeypatch.setattr(chat, "_time_limit", recorded)
    monkeypatch.setattr(chat, "RENDER_BATCH", 2)
    assert len(chat.render_templates(tokenizer, [USER] * 5)) == 5
    chat.render_templates(tokenizer, [USER] * 2)
    assert limits == [(3 * chat.RENDER_SECONDS, 5), (chat.RENDER_SECONDS, 2)]


def test_a_prompt_that_fills_the_context_exactly_fits_and_one_more_token_does_not():
    chat.check_fits("p", 10, 1, 5, 16)  # 10 + 1 + 5 = 16 positions of 16
    with pytest.raises(PromptTooLongError, match=r"needs 17 positions \(prefix 11 \+ response 1 \+ suffix 5\)"):
        chat.check_fits("p", 11, 1, 5, 16)
    # a longer response where one token still fits: the response's length is the fix, in the singular
    with pytest.raises(PromptTooLongError, match="Give a response of at most 1 token, or shorten the prompt"):
        chat.check_fits("p", 10, 3, 5, 16)
    with pytest.raises(PromptTooLongError, match="at most 2 tokens, or"):
        chat.check_fits("p", 10, 3, 5, 17)
    with pytest.raises(PromptTooLongError, match="Shorten the prompt or the system message"):
        chat.check_fits("p", 11, 3, 5, 16)


def test_the_token_table_names_a_token_the_tokenizer_has_no_string_for_as_empty():
    """convert_ids_to_tokens gives None for an id with no token (a hole in a vocabulary); the published CSV's
    token_name is then '', as for ids past the tokenizer."""

    class Holed:
        def __len__(self):
            return 3

        def convert_ids_to_tokens(self, ids):
            return ["a", None, "c"]

        def batch_decode(self, rows, skip_special_tokens=False):
            return ["a", "", "c"]

    ids, names, decoded = chat.token_table(Holed(), 4)
    assert ids.tolist() == [0, 1, 2, 3] and names == ["a", "", "c", ""] and decoded == ["a", "", "c", ""]


def test_a_response_merging_into_the_templates_suffix_or_holding_no_token_has_no_ids(tokenizer):
    """response_ids reads a response between the template's prefix and suffix only where the conversation ends
    with the suffix's own tokens: '!' before a suffix '!!' tokenizes as '!!!' (the suffix is not there), and an
    empty response leaves no token between them. Elsewhere the ids are the response's own tokenization."""
    tokenizer.chat_template = ("{% for m in messages %}{% if m.role == 'user' %}Q: {{ m.content }}\n"
                               "{% else %}A:{{ m.content }}!!{% endif %}{% endfor %}")
    conversations = chat.Conversations(tokenizer, "hi", template="chat")
    assert conversations.split.suffix == tuple(tokenizer("!!", add_special_tokens=False).input_ids)
    ids = conversations.response_ids(["wow", "wow!", ""])
    assert ids[0] == tokenizer("wow", add_special_tokens=False).input_ids
    assert tokenizer.convert_ids_to_tokens(conversations.token_ids(["wow!"])[0])[-1] == "!!!"  # merged
    assert ids[1:] == [None, None]


def test_a_cut_head_that_tokenizes_otherwise_falls_back_to_whole_conversations(tokenizer):
    """token_ids tokenizes many conversations from the head's last special token on, checked on a spread of them
    against whole tokenization: where the cut gives other ids (here a cut whose kept head tokens are wrong),
    every conversation is tokenized whole."""
    conversations = chat.Conversations(tokenizer, "What is best?", template="chat")
    responses = [f"answer {i}" for i in range(chat.SPLIT_TOKENIZING)]
    whole = tokenizer(conversations.conversations(responses), add_special_tokens=False).input_ids
    assert conversations.token_ids(responses) == whole and conversations._cut[0] > 0  # the cut was taken
    at, kept = conversations._cut
    conversations._cut = (at, kept[:-1])  # drops a head token: every cut row is one token short
    assert conversations.token_ids(responses) == whole


def test_a_system_prompt_without_a_chat_template_is_refused_and_the_head_is_what_precedes_the_user(tokenizer):
    """--template=auto falls back to the plain format for a tokenizer without a chat template, where a system prompt
    has no turn: refused. The head .meta.json records is what transformers renders before the user's words."""
    want = tokenizer.apply_chat_template([{"role": "user", "content": "XYZ"}], tokenize=False).split("XYZ")[0]
    assert chat.template_head(tokenizer) == want and want.startswith("<|im_start|>system")
    tokenizer.chat_template = None
    assert chat.template_head(tokenizer) is None
    chat.check_template(tokenizer, "auto")
    with pytest.raises(UsageError, match="--system_prompt needs a chat template"):
        chat.check_template(chat.with_system_prompt(tokenizer, "Be brief."), "auto")


@pytest.mark.parametrize("assistant", ["{{ m.content }}{{ m.content }}", "done"])
def test_a_template_that_does_not_place_the_response_exactly_once_is_refused(tokenizer, assistant):
    """Twice (a template echoing the answer) or never: no prefix and suffix surround one response slot."""
    from rmjax.errors import RmjaxError

    tokenizer.chat_template = ("{% for m in messages %}{% if m.role == 'user' %}Q: {{ m.content }}\n{% else %}A: "
                               + assistant + "{% endif %}{% endfor %}")
    times = 2 if "content }}{{" in assistant else 0
    with pytest.raises(RmjaxError, match=f"placed the assistant's response {times} times, not once") as refused:
        chat.split_chat(tokenizer, "hi", "chat")
    assert "fix chat_template.jinja" in str(refused.value) and "--template=plain" in str(refused.value)


def test_text_mode_with_the_tokenizers_specials_tokenizes_each_conversation_as_the_published_pipeline(tmp_path):
    """--text_add_special_tokens: a tokenizer that adds a BOS (as Llama 3's does) puts it before the rendered
    conversation, a second one where the template renders its own; the prefix the sweep caches is the start of
    exactly those ids."""
    import json
    import shutil

    src = tiny.smollm2_tokenizer_folder()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(src / name, tmp_path / name)
    spec = json.loads((tmp_path / "tokenizer.json").read_text())
    bos = {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}
    spec["post_processor"] = {"type": "TemplateProcessing", "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
                              "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
                              "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [0],
                                                                   "tokens": ["<|endoftext|>"]}}}
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path))
    conversations = chat.Conversations(tokenizer, "What is best?", "chat", add_special_tokens=True)
    responses = ["Love", "a list, of words\nand lines"]
    for response, got in zip(responses, conversations.token_ids(responses), strict=True):
        want = tokenizer(conversations.conversation(response)).input_ids
        assert got == want and want[0] == 0 and got[: len(conversations.prefix)] == conversations.prefix
    assert conversations.prefix[0] == 0
