"""Chat templates split around the response slot, and the vocabulary's token table.

Every candidate response shares the templated text before the response (the prefix: system,
user turn, assistant header) and after it (the suffix, e.g. `<|eot_id|>`), so the sweep
computes the prefix once and runs only response + suffix per candidate.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import datetime
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from rmjax.errors import PromptTooLongError, RmjaxError, UnsupportedModelError, UsageError

MARKER = "\u2063RMJAX_RESPONSE\u2063"
PLAIN_FORMAT = "User: {prompt}\nAssistant:"


class NoChatTemplateError(RmjaxError):
    """The tokenizer carries no chat template but the job needs one."""


@dataclasses.dataclass(frozen=True)
class ChatSplit:
    """Token ids around the response slot for one prompt."""

    prompt: str
    prefix: tuple[int, ...]
    suffix: tuple[int, ...]
    template: str  # "chat" or "plain"

    def ids_with(self, response: list[int] | tuple[int, ...]) -> list[int]:
        return [*self.prefix, *response, *self.suffix]


def end_of_turn_id(tokenizer, suffix, source: str) -> int:
    """The token that ends the assistant's turn after a response whose template suffix is `suffix`: the chat
    template's first token after the response (<end_of_turn>, <|im_end|>, <|eot_id|>); in the plain format (no
    suffix) the newline before the next `User:` line (what a base model writes when its answer is over; its end of
    sequence it almost never does), or the end of sequence where a newline is not one token. Neither: refused.
    (A plain format whose tokenizer appends an EOS has it as its suffix: that EOS ends the turn.)"""
    if len(suffix):
        return int(suffix[0])
    newline = tokenizer("\n", add_special_tokens=False).input_ids
    end = newline[0] if len(newline) == 1 else tokenizer.eos_token_id
    if end is None:
        raise UsageError(f"{source}'s template puts nothing after the response and its tokenizer has neither a "
                         "one-token newline nor an end-of-sequence token: whole responses need an end of turn; use "
                         "a chat template.")
    return int(end)


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def template_source(tokenizer) -> str:
    """Where the tokenizer's chat template comes from, for error messages: its file when it has a folder."""
    folder = Path(getattr(tokenizer, "name_or_path", "") or ".")
    for name in ("chat_template.jinja", "chat_template.json", "tokenizer_config.json"):
        if folder.is_dir() and (folder / name).is_file():
            return f"the chat template in {folder / name}"
    return f"the chat template of {folder}"


# A template may read the clock (Llama 3.2's `strftime_now("%d %b %Y")`): rendered at the time of the run, the same
# inputs would score differently on another day, and a resume across midnight would mix two prompts. Every
# template sees this fixed day instead, the one Llama 3.1's template writes when it is given none.
TEMPLATE_CLOCK = datetime.datetime(2024, 7, 26)
RENDER_SECONDS = 30  # a checkpoint's template renders in milliseconds; one that loops for ever is refused
SPLIT_TOKENIZING, SPLIT_CHECKS = 256, 32  # token_ids tokenizes this many or more after the head's cut, checking so many
RENDER_BATCH = 1000  # conversations rendered in one call have RENDER_SECONDS per this many


@contextlib.contextmanager
def _fixed_clock() -> Iterator[None]:
    """transformers gives templates `strftime_now`, which reads `datetime.now()` of its chat_template_utils module
    (a callable passed in the render's keywords would reach the template as a string): that clock reads
    TEMPLATE_CLOCK while a template renders."""
    from transformers.utils import chat_template_utils as rendering

    real = rendering.datetime

    class Fixed(real):
        @classmethod
        def now(cls, tz=None):
            return cls.combine(TEMPLATE_CLOCK.date(), TEMPLATE_CLOCK.time(), tz)

    rendering.datetime = Fixed
    try:
        yield
    finally:
        rendering.datetime = real


@contextlib.contextmanager
def _time_limit(seconds: float, what: str, count: int = 1) -> Iterator[None]:
    """Stop a render that takes longer than `seconds` (a template is code from the checkpoint: a loop of 10^10 steps
    must not hang the job). Only the main thread can take a signal; elsewhere the render runs unbounded."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise TimeoutError

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    except TimeoutError:
        many = "one conversation" if count == 1 else f"{count:,} conversations"
        raise UsageError(f"{what} did not finish rendering {many} in {seconds} s; fix the template, or "
                         "pass --template=plain.") from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


SYSTEM_PROMPT_ATTR = "rmjax_system_prompt"


def with_system_prompt(tokenizer, text: str | None):
    """The tokenizer whose every conversation (`render_template`) opens with `text` as its system message
    (--system_prompt): a shallow copy holding it, so every job's every rendering path agrees and
    rmjax.loading.identity reads it (results made under another system prompt are never resumed or reused). None
    keeps the template's own behaviour (SmolLM2's injects "You are a helpful AI assistant named SmolLM…"). A copy,
    because loads of one tokenizer share one object (rmjax.loading.hf): set on it, a system prompt reached every
    later job of the process."""
    if tokenizer is None or text is None:
        return tokenizer
    tokenizer = copy.copy(tokenizer)
    setattr(tokenizer, SYSTEM_PROMPT_ATTR, text)
    return tokenizer


def system_prompt_of(tokenizer) -> str | None:
    return getattr(tokenizer, SYSTEM_PROMPT_ATTR, None)


def template_head(tokenizer) -> str | None:
    """What the chat template renders before the user's words (the system turn it injects, if any), for
    .meta.json; None without a chat template."""
    if tokenizer is None or not has_chat_template(tokenizer):
        return None
    return render_template(tokenizer, [{"role": "user", "content": MARKER}]).split(MARKER)[0]


def render_template(tokenizer, messages: list[dict]) -> str:
    """The chat template applied to `messages` as text (render_templates for one conversation)."""
    return render_templates(tokenizer, [messages])[0]


def render_templates(tokenizer, conversations: list[list[dict]]) -> list[str]:
    """The chat template applied to each conversation as text (after the --system_prompt system message when one is
    set and a conversation has none), at the fixed TEMPLATE_CLOCK and within RENDER_SECONDS per RENDER_BATCH
    conversations; a template jinja cannot compile, that raises, runs out of memory or of time is a UsageError
    naming the template (not a traceback from inside jinja). One call for many (a vocabulary's read-back): jinja
    renders 4x faster than through one apply_chat_template call each."""
    import jinja2

    if not conversations:
        return []
    system = system_prompt_of(tokenizer)
    if system is not None:
        conversations = [m if m and m[0].get("role") == "system" else [{"role": "system", "content": system}, *m]
                         for m in conversations]
    source = template_source(tokenizer)
    seconds = RENDER_SECONDS * max(1, -(-len(conversations) // RENDER_BATCH))
    try:
        with _time_limit(seconds, source, len(conversations)), _fixed_clock():
            texts = tokenizer.apply_chat_template(conversations, tokenize=False)
    except jinja2.TemplateSyntaxError as error:
        raise UsageError(f"{source} is not valid jinja: {error.message} (line {error.lineno} "
                         "of the template). Fix the template, or pass --template=plain.") from None
    except UsageError:
        raise
    except Exception as error:  # the template is the checkpoint's code: whatever it raises is its fault
        # with a --system_prompt (Gemma's templates raise on a system turn) --template=plain is refused: not the fix
        what, fix = (("a system + user + assistant conversation", "leave --system_prompt out")
                     if system is not None else ("a user + assistant conversation", "pass --template=plain"))
        raise UsageError(f"{source} failed on {what}: {type(error).__name__}"
                         f"{': ' + str(error)[:200] if str(error) else ''}. Fix the template, or {fix}.") from None
    if len(texts) != len(conversations) or not all(isinstance(t, str) for t in texts):
        raise RmjaxError(f"{source} rendered {len(conversations)} conversations as {len(texts)} texts.")
    return list(texts)


def check_template(tokenizer, template: str = "auto") -> None:
    """Apply the template as the jobs do (`split_chat`) to a placeholder prompt, so that a broken or missing chat
    template is refused before the model's weights load."""
    if tokenizer is None:
        return
    split = split_chat(tokenizer, "What, in one word, is the greatest thing ever?", template)
    system = system_prompt_of(tokenizer)
    if split.template == "plain" and system is not None:
        raise UsageError("--system_prompt needs a chat template, and this run uses the plain `User: …\\nAssistant:` "
                         "format (--template=plain, or a tokenizer without a chat template): drop --system_prompt "
                         "or use a model with a chat template.")
    if system is not None and system.strip() and system.strip() not in template_head(tokenizer):
        # a template that drops the system turn: every number would be the one without it, recorded as with it
        raise UsageError(f"--system_prompt: {template_source(tokenizer)} drops the system turn (a rendered "
                         f"conversation holds no {system.strip()[:40]!r}), so it would change nothing; leave "
                         "--system_prompt out, or use a chat template that renders a system message.")


def split_chat(
    tokenizer,
    prompt: str,
    template: str = "auto",
    max_positions: int | None = None,
    response_tokens: int = 1,
) -> ChatSplit:
    """Prefix/suffix ids for `prompt`.

    template: "chat" (the tokenizer's chat template; an error without one), "plain"
    (`User: {prompt}\\nAssistant:`, for base models), or "auto" (chat when available).
    Prefix and suffix are tokenized separately without adding special tokens (the template
    text already carries BOS), so no second BOS appears.
    """
    if template == "auto":
        template = "chat" if has_chat_template(tokenizer) else "plain"
    if template == "chat":
        if not has_chat_template(tokenizer):
            raise NoChatTemplateError(
                "this model's tokenizer has no chat template (e.g. a base model). Use "
                "--template=plain for the `User: ...\\nAssistant:` format, or add the chat template "
                "(chat_template.jinja / tokenizer_config.json) from the instruct model to the folder."
            )
        messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": MARKER}]
        text = render_template(tokenizer, messages)  # with the --system_prompt turn (render_templates)
        if text.count(MARKER) != 1:
            where = getattr(tokenizer, "name_or_path", "") or "this model"
            raise RmjaxError(f"{where}: the chat template placed the assistant's response {text.count(MARKER)} "
                             "times, not once as written (a template that drops, repeats or rewrites it, e.g. "
                             "lower-cases it); fix chat_template.jinja (or tokenizer_config.json's chat_template), "
                             "or use --template=plain.")
        before, after = text.split(MARKER)
        prefix = tokenizer(before, add_special_tokens=False).input_ids
        suffix = tokenizer(after, add_special_tokens=False).input_ids if after else []
    elif template == "plain":
        prefix, suffix = _plain_split(tokenizer, PLAIN_FORMAT.format(prompt=prompt))
    else:
        raise ValueError(f"template must be auto, chat or plain, not {template!r}")
    split = ChatSplit(prompt, tuple(prefix), tuple(suffix), template)
    if max_positions is not None:
        check_fits(prompt, len(prefix), response_tokens, len(suffix), max_positions)
    return split


def _plain_split(tokenizer, text: str) -> tuple[list[int], list[int]]:
    """The plain prompt's tokens with what the tokenizer's own special-token rule adds around a text: what it puts
    before (a BOS: Gemma adds one, SmolLM2 none) leads the prefix, what it puts after (an EOS, where its
    post-processor appends one) is the suffix, after the response, where tokenizing the whole text puts it."""
    bare, marked = tokenizer(text, add_special_tokens=False).input_ids, tokenizer(text).input_ids
    at = next((k for k in range(len(marked) - len(bare) + 1) if marked[k:k + len(bare)] == bare), None)
    if at is None:  # the specials changed the text's own tokens: the rule is not one of adding around it
        raise UnsupportedModelError("this tokenizer's special-token rule changes the plain prompt's own tokens; "
                                    "use a chat template (--template=chat) or a tokenizer that only adds tokens.")
    return marked[:at + len(bare)], marked[at + len(bare):]


def check_fits(prompt: str, prefix: int, response_tokens: int, suffix: int, max_positions: int) -> None:
    """Refuse a templated prompt whose prefix, response and suffix run past the model's context (positions it was
    never trained on). Pure: the jobs and their plans (rmjax.plan.spec) share it."""
    needed, room = prefix + response_tokens + suffix, max_positions - prefix - suffix
    if needed > max_positions:  # a prompt that leaves room for a shorter response: the response's length is the fix
        fix = (f"Give a response of at most {room} token{'s' if room > 1 else ''}, or shorten the prompt"
               if room >= 1 and response_tokens > 1
               else "Shorten the prompt or the system message")
        raise PromptTooLongError(
            f"prompt {prompt[:60]!r}... needs {needed} positions (prefix {prefix} + response "
            f"{response_tokens} + suffix {suffix}) but the model's context is {max_positions} "
            f"(max_position_embeddings). {fix}."
        )


def check_response_fits(response: str, length: int, context: int, fix: str = "") -> None:
    """Refuse a whole conversation (template and response) of `length` tokens past the model's `context`: its
    numbers would come from positions the model never saw. One wording for every job that reads responses as text
    (score, inspect, train_rm); `fix` says what to do."""
    if length > context:
        raise PromptTooLongError(f"response {response[:40]!r} makes a conversation of {length} tokens, more than the "
                                 f"model's context of {context} (max_position_embeddings){fix}.")


def token_table(tokenizer, vocab_size: int) -> tuple[np.ndarray, list[str], list[str]]:
    """(ids, token_name, token_decoded) for ids 0..vocab_size-1 (rows past the tokenizer: '')."""
    n = min(len(tokenizer), vocab_size)
    ids = np.arange(vocab_size)
    names = tokenizer.convert_ids_to_tokens(list(range(n)))
    decoded = tokenizer.batch_decode([[i] for i in range(n)], skip_special_tokens=False)
    pad = [""] * (vocab_size - n)
    return ids, [s if s is not None else "" for s in names] + pad, list(decoded) + pad


class Conversations:
    """Responses placed in a prompt's template and tokenized, as the published pipeline did."""

    def __init__(self, tokenizer, prompt: str, template: str = "auto", add_special_tokens: bool = False,
                 max_positions: int | None = None):
        self.tokenizer, self.prompt, self.add_special_tokens = tokenizer, prompt, add_special_tokens
        self.split = split_chat(tokenizer, prompt, template, max_positions)
        self.head = None
        if self.split.template == "chat":
            self.head = self.conversation(MARKER).split(MARKER)[0]
            self.prefix = tokenizer(self.head, add_special_tokens=add_special_tokens).input_ids
        else:
            self.prefix = list(self.split.prefix)
        self._cut = None  # (characters, tokens) of the head before its last special token (token_ids), once asked

    def conversation(self, response: str) -> str:
        return self.conversations([response])[0]

    def conversations(self, responses: list[str]) -> list[str]:
        if self.split.template == "chat":
            return render_templates(self.tokenizer, [[{"role": "user", "content": self.prompt},
                                                      {"role": "assistant", "content": r}] for r in responses])
        return [PLAIN_FORMAT.format(prompt=self.prompt) + " " + r.strip() for r in responses]

    def token_ids(self, responses: list[str]) -> list[list[int]]:
        """The re-tokenized conversations (what the reference pipeline feeds its model)."""
        tok = self.tokenizer
        if not responses:  # a tokenizer given no text fails inside transformers
            return []
        if self.split.template == "plain":  # one space after "Assistant:", trimmed like chat templates do
            spaced, suffix = [" " + r.strip() for r in responses], list(self.split.suffix)
            return [self.prefix + ids + suffix for ids in tok(spaced, add_special_tokens=False).input_ids]
        texts = self.conversations(responses)
        if len(texts) < SPLIT_TOKENIZING or self.add_special_tokens or not self._head_cut():
            return tok(texts, add_special_tokens=self.add_special_tokens).input_ids
        return self._tokenized_after_cut(texts)

    def _head_cut(self) -> tuple[int, list[int]] | None:
        """Where the head may be cut: before its last special token. A tokenizer splits its input at special tokens
        before it normalizes or splits words, so the text from there on tokenizes alone as it does in the whole;
        None where the head has no special token or does not tokenize as its two parts."""
        if self._cut is None:
            tok, ids = self.tokenizer, self.prefix
            special = _special_ids(tok)  # once: Gemma 3's 6,384 added tokens are rebuilt on each call
            last = max((k for k, t in enumerate(ids) if t in special), default=None)
            at = -1 if last is None else self.head.rfind(tok.convert_ids_to_tokens(ids[last]))
            parts = [tok(part, add_special_tokens=False).input_ids for part in (self.head[:at], self.head[at:])]
            self._cut = (at, parts[0]) if at > 0 and parts[0] + parts[1] == ids else (0, [])  # the head's own split
        return self._cut if self._cut[0] else None

    def _tokenized_after_cut(self, texts: list[str]) -> list[list[int]]:
        """token_ids of rendered `texts`, each tokenizing only from the head's last special token on (the head is
        most of a short conversation's tokens: bench/read_back.py, 2.3x on SmolLM2's vocabulary). Checked against whole
        tokenization on a spread of texts: where one differs, every text is tokenized whole."""
        tok, (at, kept) = self.tokenizer, self._cut
        head = self.head[:at]
        tails = tok([t[at:] if t.startswith(head) else t for t in texts], add_special_tokens=False).input_ids
        rows = [kept + tail if t.startswith(head) else tail for t, tail in zip(texts, tails, strict=True)]
        spread = sorted({*range(0, len(texts), max(1, len(texts) // SPLIT_CHECKS)), len(texts) - 1})
        whole = tok([texts[k] for k in spread], add_special_tokens=False).input_ids
        if any(rows[k] != ids for k, ids in zip(spread, whole, strict=True)):
            return tok(texts, add_special_tokens=False).input_ids
        return rows

    def check_fit(self, responses: list[str], max_positions: int, fix: str = "") -> None:
        """Refuse a response whose conversation is past `max_positions`, from the tokenizer alone (before the
        weights load), tokenizing only the responses that may not fit: every token covers at least one byte of its
        text (a special token many), and a tokenizer adds at most a dummy-prefix token, a BOS and an EOS, so a
        conversation of at most `max_positions - 3` bytes fits. Scoring checks every conversation again."""
        if self.split.template == "chat":  # the template's text around the response
            fixed = sum(len(part.encode()) for part in self.conversation(MARKER).split(MARKER))
        else:  # the prefix's ids, then " " + the response
            fixed = len(self.prefix) + 1
        room = max_positions - fixed - 3
        long = [r for r in responses if len(r.encode("utf-8", "surrogatepass")) > room]
        for response, ids in zip(long, self.token_ids(long) if long else [], strict=True):
            check_response_fits(response, len(ids), max_positions, fix)

    def response_ids(self, responses: list[str]) -> list[list[int] | None]:
        """Each response's own tokens in its conversation, between the template's prefix and suffix; None where the
        conversation does not start with the prefix and end with the suffix (a merge across the template's edge) or
        leaves no token between them. Judges, implicit sides and round-trip checks read a response this one way."""
        prefix, suffix = list(self.split.prefix), list(self.split.suffix)
        rows = []
        for ids in self.token_ids(list(responses)):
            body = ids[len(prefix): len(ids) - len(suffix)]
            whole = ids[: len(prefix)] == prefix and (not suffix or ids[len(ids) - len(suffix):] == suffix)
            rows.append(body if whole and body else None)
        return rows


def _special_ids(tokenizer) -> set[int]:
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    return set(tokenizer.all_special_ids) | {i for i, t in added.items() if getattr(t, "special", False)}
