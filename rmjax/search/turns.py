"""Whole responses (issue 43): a response is a whole turn of 1..N tokens that ends with the model's end of turn.

A search fragment of N tokens cut off mid-sentence scored as a finished answer is what the reward model saw as
a finished answer: its reward comes from where the text stops (the Gemma 3 RM pays about +3.5 SD for an
unfinished sentence). So the fluent search's responses are turns: the RM reads prefix + response + suffix (the
template's end of turn and what follows it), and the fluency term and the judge's perplexity include the end of
turn's log-probability, which a fragment no model would stop on does not earn.

Responses live in N slots, as every search array does: a response of L < N tokens is followed by the end-of-turn
id in every slot after it (the canonical form; the end of turn is never a response token). Its turn form is its
L tokens and one end of turn: the tokens the models read before the rest of the suffix.
"""

from __future__ import annotations

import numpy as np

from rmjax.text import chat


def end_of_turn(suffix: tuple[int, ...] | list[int], tokenizer, source: str) -> int:
    """The end-of-turn id (chat.end_of_turn_id): the template's suffix's first token (<end_of_turn>, <|im_end|>,
    <|eot_id|>); with the plain template (no suffix: the RM reads the response's last token) the newline before
    the next turn, which only the prior reads. A plain template whose tokenizer appends an EOS has that EOS as its
    suffix, and so as its end of turn, read by the RM as a chat template's is. Neither: refused."""
    return chat.end_of_turn_id(tokenizer, suffix, source)


def rm_tail(suffix) -> int:
    """The RM positions after a whole turn's tokens: its suffix's, or with the plain template the end of turn
    (which the RM runs for the log-probs its LM head gives, though the reward is read before it)."""
    return max(len(suffix), 1)


def reads_end(suffix) -> bool:
    """Whether the RM reads the end of turn (a chat template's suffix starts with it) or only the prior does
    (plain: the reward is read at the response's last token)."""
    return len(suffix) > 0


def lengths(ids: np.ndarray, end: int) -> np.ndarray:
    """Each response's token count L (its first end of turn's slot, else N): [W] int64."""
    ids = np.asarray(ids)
    ids = ids if ids.ndim == 2 else ids.reshape(len(ids), -1)  # rows as given (none: [0, N]), or a list of rows
    ended = ids == end
    return np.where(ended.any(1), ended.argmax(1), ids.shape[1]).astype(np.int64)


def canonical(ids: np.ndarray, end: int) -> np.ndarray:
    """Responses with every slot after their first end of turn set to the end of turn (a copy)."""
    ids = np.array(ids)
    after = np.cumsum(ids == end, axis=1) > 0
    ids[after] = end
    return ids


def tokens(row, end: int) -> list[int]:
    """A response's own tokens (before its end of turn)."""
    row = list(np.asarray(row).tolist())
    return row[: row.index(end)] if end in row else row


def turn(row, end: int) -> np.ndarray:
    """A response's turn form: its tokens and one end of turn (L + 1 ids)."""
    return np.asarray([*tokens(row, end), end], np.int32)


def from_turns(turns, n: int, end: int) -> np.ndarray:
    """Turn forms (or bare token lists) as N-slot responses [W, N], filled with the end of turn."""
    out = np.full((len(turns), n), end, np.int32)
    for i, t in enumerate(turns):
        body = tokens(t, end)
        out[i, : len(body)] = body
    return out


def fluency_weights(lengths, width: int) -> np.ndarray:
    """Each position's weight in F's log-prob term, for turn forms of `lengths` tokens over `width` positions
    [W, width]: 1/L for each of the L tokens, 1 for the end of turn, 0 after it. Averaged in with the tokens, the end
    of turn cost an 8-token fragment a ninth of log p(end), and the search's rows at λ > 0 were still cut
    mid-sentence (+0.7 to +2.2 SD of reward from where they stopped); at full weight a response the prior would not
    stop on pays all of it."""
    lengths = np.asarray(lengths, np.float64).reshape(-1, 1)
    at = np.arange(width)[None]
    return np.where(at < lengths, 1.0 / np.maximum(lengths, 1.0), (at == lengths).astype(np.float64))


def fluency_log_prob(lps: np.ndarray, lengths) -> np.ndarray:
    """F's log-prob term of turn forms from their per-position log-probs [W, ≥ L + 1] (tokens, then the end of
    turn; what follows is ignored): the tokens' mean plus the end of turn's (fluency_weights). [W] float64."""
    lps = np.asarray(lps, np.float64)
    weights = fluency_weights(lengths, lps.shape[1])
    return (weights * np.where(weights > 0, lps, 0.0)).sum(axis=1)


def decode(tokenizer, ids: np.ndarray, end: int) -> list[str]:
    """Each response's text (its tokens before the end of turn)."""
    return tokenizer.batch_decode([tokens(row, end) for row in np.asarray(ids)])


def moves(current: np.ndarray, end: int) -> np.ndarray:
    """Length moves from an N-slot response of L tokens, canonical: every truncation (the first j tokens, 1 ≤ j <
    L) and every deletion of one token (L > 1), the moves a swap cannot make (FLRT's insert/delete, the gradient
    proposing the inserts at the end of turn's slot)."""
    body, n = tokens(current, end), len(current)
    out = [body[:j] for j in range(1, len(body))] + [body[:j] + body[j + 1 :] for j in range(len(body))
                                                        if len(body) > 1]
    return from_turns(out, n, end) if out else np.zeros((0, n), np.int32)


def banned_with_end(banned: np.ndarray, end: int) -> np.ndarray:
    """`banned` with the end of turn too: it is never a response token (the sampler and the truncations end turns).
    Allowed by --allow_special, a swap or sample put it first: an empty turn, scored as an answer."""
    banned = np.array(banned, bool)
    banned[end] = True
    return banned
