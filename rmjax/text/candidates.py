"""Candidate token ids: the vocabulary (or a subset, a word list), checked and identified."""

from __future__ import annotations

import functools
import hashlib
import sys
import unicodedata
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rmjax.errors import UsageError, require_file
from rmjax.text.chat import Conversations, _special_ids


def _is_main() -> bool:
    """distributed.is_main, imported when asked: launch/*.sh read a job's flags through this module
    (experiments.job_line) without starting jax (1.8 s of a 2.3 s check)."""
    from rmjax.parallel.distributed import is_main

    return is_main()


@functools.lru_cache(maxsize=4)
def decoded_tokens(tokenizer, n: int) -> tuple[str, ...]:
    """Each of the first `n` token ids decoded alone, once per tokenizer (Gemma 3's 262,144 take ≈1 s; beam, GCG
    and the frontier each ask, GCG twice)."""
    return tuple(tokenizer.batch_decode([[i] for i in range(n)]))


def encoded_each(tokenizer, texts: list[str]) -> list[list[int]]:
    """Each text's ids alone, without special tokens: through the fast tokenizer's own batch where it has one
    (transformers' call builds a dict a text: Gemma 3's 262,144 token strings 5.3 s, 2.3 s this way)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return tokenizer(texts, add_special_tokens=False).input_ids
    return [encoding.ids for encoding in backend.encode_batch(texts, add_special_tokens=False)]


def special_or_byte(tokenizer, vocab_size: int) -> np.ndarray:
    """Boolean [V]: the tokens searches leave out unless --allow_special: special/control tokens (declared or
    added as special, `<|…|>` and `<unused…>` markers) and byte tokens (a lone token decodes to nothing, to U+FFFD
    or to a control character), plus ids past the tokenizer. One rule for beam, GCG and the frontier: an
    `<|endoftext|>` or a raw byte ranks high by ending or breaking the text, not for what it says."""
    out = np.zeros(vocab_size, bool)
    if tokenizer is None:
        return out
    n = min(len(tokenizer), vocab_size)
    out[n:] = True
    out[[i for i in tokenizer.all_special_ids if i < vocab_size]] = True
    added = getattr(tokenizer, "added_tokens_decoder", {})  # SmolLM2's <file_sep> …: special, yet not "all_special"
    out[[i for i, tok in added.items() if tok.special and i < vocab_size]] = True
    declared = set(tokenizer.all_special_tokens)
    for i, tok in enumerate(tokenizer.convert_ids_to_tokens(list(range(n)))):
        if tok is not None and tok.startswith("<") and tok.endswith(">") and len(tok) > 2 and (
                "|" in tok or tok.startswith("<unused") or tok in declared):
            out[i] = True
    for i, text in enumerate(decoded_tokens(tokenizer, n)):
        if not text or "\ufffd" in text or any(_control(c) for c in text):
            out[i] = True
    return out


# The rule's version, in the identity of a job it filters (a result left out other tokens): 2 counts \x0b, \x0c and
# \x1c-\x1f as control characters (Python calls them whitespace: SmolLM2's '\x1c' filled a beam's top rows).
LEFT_OUT = 2


def left_out_rule(allow_non_ascii: bool, allow_special: bool) -> dict:
    """A search identity's record of LEFT_OUT where this rule alone decides what is left out (--allow_non_ascii
    without --allow_special); {} elsewhere, so other identities stay as they were."""
    return {"left_out": LEFT_OUT} if allow_non_ascii and not allow_special else {}


def _control(c: str) -> bool:
    """A character no answer holds: a control character (category Cc) other than tab, newline and carriage return,
    or one that is neither printable nor whitespace."""
    return (unicodedata.category(c) == "Cc" and c not in "\t\n\r") or (not c.isprintable() and not c.isspace())


def _sha1(values: np.ndarray) -> str:
    """rmjax.runs.results.array_sha1 (the same digest, so identities agree), here so text never imports runs."""
    return hashlib.sha1(np.ascontiguousarray(values).tobytes()).hexdigest()


def candidate_count(cfg, tokenizer, token_ids=None, limit: int | None = None) -> int:
    """How many candidates `candidate_ids` will give, from the config and tokenizer alone (before the weights)."""
    vocab = min(cfg.vocab_size, len(tokenizer)) if tokenizer is not None else cfg.vocab_size
    n = len(token_ids) if token_ids is not None else vocab
    refuse_limit_keeping_all(limit, n)
    return min(n, limit) if limit is not None else n


def refuse_two_candidate_sets(token_ids, vocab_file: str | None) -> None:
    """The candidate set is given once: --token_ids or --vocab_file (sweep, beam, gcg; and from the flags alone,
    where a launch reads the job's line)."""
    if token_ids is not None and vocab_file:
        raise UsageError("give the candidate set once: --token_ids or --vocab_file, not both.")


def refuse_limit_keeping_all(limit: int | None, n: int) -> None:
    """A --limit that keeps all `n` candidates changes nothing, yet the identity would record it as if it had kept
    fewer."""
    if limit is not None and limit >= n:  # --limit is >= 1: with one candidate, no --limit keeps fewer
        fewer = f", or give a --limit below {n:,}" if n > 1 else ""
        raise UsageError(f"--limit={limit} keeps all {n:,} candidate{'s' * (n != 1)}, so it changes nothing; leave it "
                         f"out{fewer}.")


def candidate_ids(tokenizer, vocab: int, token_ids=None, limit: int | None = None) -> np.ndarray:
    """The candidate ids a job scores: `token_ids` (checked against every token both the model's `vocab` size and
    its tokenizer have: check_token_ids) or every such token; `limit` keeps the first N. Needs no weights (a
    check before loading)."""
    if token_ids is None:
        ids = np.arange(min(vocab, len(tokenizer)))
    else:
        ids = np.asarray(list(token_ids), np.int64)
        check_token_ids(ids.tolist(), vocab, tokenizer)
    return ids[:limit] if limit is not None else ids


def check_token_ids(ids: Sequence[int], vocab: int, tokenizer=None) -> None:
    """UsageError naming the ids at or past the model's `vocab` size, or past the `tokenizer`'s tokens where the
    embedding is padded beyond them: such an id is no token (an empty name, and in text mode the empty response's
    reward written under it)."""
    tokens = vocab if tokenizer is None else min(vocab, len(tokenizer))
    outside = [int(t) for t in ids if t < 0 or t >= tokens]
    if outside:
        padded = (f"; the embedding has {vocab} rows, but ids from {tokens} on are past the tokenizer's tokens"
                  if tokens < vocab else "")
        raise UsageError(f"--token_ids: {outside[:5]} are outside the vocabulary [0, {tokens}){padded}.")


class VocabLines(list):
    """The candidate strings of a --vocab_file (a list), with the file and how many blank lines it skipped."""

    path: str = ""
    blank: int = 0


def words_to_ids(tokenizer, lines: list[str], report: bool = True) -> tuple[np.ndarray, list[str]]:
    """Token ids of the lines that are exactly one token (taken verbatim: ' cat' and 'cat' differ), in file
    order without repeats; and the lines that are not one token. With `report`, every kind of line left out of the
    set (blank, not one token, a repeat of an earlier line's token) is counted on stderr, one line per kind, so a
    smaller set than the file's line count is never silent."""
    ids: dict[int, str] = {}
    skipped, repeated = [], []
    for line in lines:
        tokens = tokenizer(line, add_special_tokens=False).input_ids if line else []
        if len(tokens) != 1:
            skipped.append(line)
        elif tokens[0] in ids:
            repeated.append(line)
        else:
            ids[tokens[0]] = line
    if report and _is_main():
        for line in skipped_lines_report(lines, skipped, repeated):
            print(line, file=sys.stderr)
    return np.asarray(list(ids), np.int64), skipped


def skipped_lines_report(lines: list[str], skipped: list[str], repeated: list[str]) -> list[str]:
    """One line per kind of --vocab_file line left out of the candidate set (none when every line is a token)."""
    flag = f"--vocab_file={lines.path}" if isinstance(lines, VocabLines) and lines.path else "--vocab_file"
    blank = lines.blank if isinstance(lines, VocabLines) else 0
    out = []
    if blank:
        out.append(f"{flag}: {blank} blank or whitespace-only line{'s' * (blank != 1)} skipped (give a whitespace "
                   "token by its id with --token_ids).")
    if skipped:
        out.append(f"{flag}: {len(skipped)} line{'s' * (len(skipped) != 1)} that {'are' if len(skipped) != 1 else 'is'}"
                   f" not one token of this tokenizer skipped (first: {', '.join(map(repr, skipped[:3]))}).")
    if repeated:
        out.append(f"{flag}: {len(repeated)} duplicate line{'s' * (len(repeated) != 1)} skipped (the token of an "
                   f"earlier line; first: {', '.join(map(repr, repeated[:3]))}).")
    return out


def read_vocab_file(path: str | Path, flag: str = "--vocab_file") -> VocabLines:
    """The strings of a one-per-line file (--vocab_file, score's --texts_file), verbatim but for the line end (a
    Windows '\\r\\n' and a leading byte-order mark are not part of a line). Lines end at '\\n' only: str.splitlines
    would also cut at a form feed, '\\x85' or U+2028 inside a line, making two strings of one. Blank and
    whitespace-only lines are skipped and counted (`.blank`; `words_to_ids` reports them). A pipe is refused, as
    every other input file is: GCG reads its --vocab_file again, and a pipe's second read is empty."""
    require_file(path, f"{flag}={path}")
    try:
        text = Path(path).read_bytes().decode("utf-8")  # read_text would end a line at a lone '\r' too
    except OSError as error:
        raise UsageError(f"{flag}={path}: cannot read it ({error.strerror or error}).") from None
    except UnicodeDecodeError as error:
        raise UsageError(f"{flag}={path}: not UTF-8 text ({error.reason} at byte {error.start}); save it as "
                         "UTF-8, one string per line.") from None
    raw = text.removeprefix("\ufeff").split("\n")
    if raw and raw[-1] == "":
        raw.pop()  # the end of the last line, not a blank line
    raw = [line.removesuffix("\r") for line in raw]
    lines = VocabLines(line for line in raw if line.strip())
    lines.path, lines.blank = str(path), len(raw) - len(lines)
    return lines


def identity_of_candidates(token_ids: list[int] | None, vocab_lines: list[str] | None) -> str | None:
    """The candidate set as requested (before a tokenizer turns words into ids): part of the job's identity."""
    if token_ids is not None:
        return "token_ids:" + _sha1(np.asarray(token_ids, np.int64))
    if vocab_lines is not None:
        return "vocab_file:" + _sha1(np.frombuffer("\n".join(vocab_lines).encode(), np.uint8))
    return None


def read_back_key(conversations: Conversations, special: set[int]) -> tuple:
    """What a token's read-back after a prompt rests on: tokenizers split the text at special tokens before anything
    else, so prompts whose prefix agrees after its last special token (and whose suffix agrees) read every token
    back alike (SmolLM2's '<|im_start|>assistant\\n', whatever the user's words)."""
    split = conversations.split
    cut = max((i for i, t in enumerate(split.prefix) if t in special), default=-1)
    return split.template, tuple(split.prefix[cut:] if cut >= 0 else split.prefix), tuple(split.suffix)


def token_round_trips(conversations: Conversations, tokens: np.ndarray, decoded: list[str],
                      done: dict | None = None) -> np.ndarray:
    """Per token: is `prefix + [id] + suffix` the conversation of its text `decoded[i]` as the response?
    `done`: the masks of earlier prompts by read_back_key, for these same tokens, texts and tokenizer (a prompt with
    a key there reuses its mask: the read-back renders and tokenizes every token's conversation)."""
    key = read_back_key(conversations, _special_ids(conversations.tokenizer)) if done is not None else None
    if key is not None and key in done:
        return done[key].copy()
    retokenized = conversations.token_ids(list(decoded))
    mask = np.fromiter((ids == conversations.split.ids_with([int(t)]) for ids, t in zip(retokenized, tokens,
                                                                                        strict=True)),
                       bool, len(tokens))
    if done is not None:
        done[key] = mask.copy()
    return mask


def roundtrip_mask(tokenizer, prompts: dict[str, str], template: str, tokens: np.ndarray, decoded: list[str],
                   max_positions: int | None = None) -> tuple[np.ndarray, dict[str, int]]:
    """Per token: is `prefix + [id] + suffix` (what token mode scores) exactly what a real conversation
    gives — decode the id, put the text in the template as the response, tokenize — for every prompt?

    Plain template: only tokens that start with a space read as `Assistant: word`; chat templates
    that trim the response (Llama 3, Gemma): only tokens without one. Returns the mask and the count
    per prompt. Tokenizers split the text at special tokens before anything else, so prompts whose
    prefix agrees after its last special token (and whose suffix agrees) share one computation.
    """
    done: dict[tuple, np.ndarray] = {}
    mask, counts = np.ones(len(tokens), bool), {}
    for name, text in prompts.items():
        conversations = Conversations(tokenizer, text, template, False, max_positions)
        found = token_round_trips(conversations, tokens, decoded, done)
        counts[name] = int(found.sum())
        mask &= found
    return mask, counts


def single_token_ids(tokenizer, lines: list[str], path: str | None, report: bool = True
                     ) -> tuple[np.ndarray, list[str]]:
    """(the ids of the --vocab_file lines that are one token of `tokenizer`, the lines skipped); none is refused.
    With `report`, the count goes to stderr."""
    ids, skipped = words_to_ids(tokenizer, lines, report)
    if not len(ids):
        raise UsageError(f"--vocab_file={path}: none of its {len(lines)} lines is a single token of this tokenizer.")
    if report and _is_main():
        print(f"--vocab_file: {len(ids)} of {len(lines)} lines are single tokens", file=sys.stderr)
    return ids, skipped
