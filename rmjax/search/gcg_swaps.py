"""GCG's swaps: the tokens a response may not hold (`disallowed_ids`), how much each (position, token) swap is
expected to lower the loss (`swap_scores`), the candidates sampled from those scores (`sample_candidates`), and the
filter they pass before evaluation (`filter_candidates`: repeats, revisits, the re-tokenization check) with the
words that report it."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rmjax.parallel.distributed import to_host
from rmjax.search.gcg_config import GCGConfig
from rmjax.text.candidates import decoded_tokens, special_or_byte
from rmjax.text.chat import Conversations


def disallowed_ids(tokenizer, vocab_size: int, allow_special: bool, allow_non_ascii: bool) -> np.ndarray:
    """Boolean [V]: special and byte tokens (`special_or_byte`, unless allowed), non-ASCII or non-printable ones
    (unless allowed), and ids past the tokenizer. A copy of the one computed for these arguments: each search unit
    asks (1 s for Gemma 3's 262,144 tokens; a frontier runs a unit per λ and direction)."""
    if tokenizer is None:
        return np.zeros(vocab_size, bool)
    return _disallowed(tokenizer, len(tokenizer), vocab_size, allow_special, allow_non_ascii).copy()


@functools.lru_cache(maxsize=4)  # as decoded_tokens: it holds the tokenizers it keys on
def _disallowed(tokenizer, size: int, vocab_size: int, allow_special: bool, allow_non_ascii: bool) -> np.ndarray:
    """`disallowed_ids`, once per tokenizer (at its `size`: added tokens make another) and arguments."""
    bad = np.zeros(vocab_size, bool)
    n = min(size, vocab_size)
    bad[n:] = True
    if not allow_special:
        bad |= special_or_byte(tokenizer, vocab_size)
    if not allow_non_ascii:
        for i, text in enumerate(decoded_tokens(tokenizer, n)):
            if not text or not text.isascii() or not text.isprintable() or "\ufffd" in text:
                bad[i] = True
    bad.flags.writeable = False
    return bad


def retokenizes(conversations, ids: list[int], expected: list[int]) -> bool:
    """The response survives decode -> template -> tokenize as the same ids."""
    text = conversations.tokenizer.decode(ids)
    return conversations.token_ids([text])[0] == expected


@jax.jit
def swap_scores(loss_grad: jax.Array, banned: jax.Array, current: jax.Array, embed: jax.Array | None,
                embed_reg: float) -> jax.Array:
    """How much each swap (position, token) is expected to lower the loss, lower is better (only the order, and
    which are finite, is read): the loss gradient [N, V], plus the Faster-GCG embedding-distance penalty when
    `embed` is given; banned and non-finite swaps at +inf. |e - c| comes from norms and one matmul: [N, V, hidden]
    is never built."""
    score = jnp.where(jnp.isfinite(loss_grad), loss_grad, jnp.inf)
    if embed is not None:
        here = embed[current]
        # |e|^2 + |c|^2 - 2 e.c cancels between near tokens: the product at full precision, whatever JAX's default
        cross = jnp.matmul(here, embed.T, precision=jax.lax.Precision.HIGHEST)
        sq = (embed**2).sum(-1)[None, :] + (here**2).sum(-1)[:, None] - 2.0 * cross
        dist = jnp.sqrt(jnp.maximum(sq, 0.0))
        # lower is better is all that is read: past a weight of 1 both terms are divided by it, which keeps the order
        # and keeps a weight near float32's largest (--embed_reg=3e38) from overflowing far tokens to +inf (unproposed)
        scale = jnp.maximum(1.0, embed_reg)
        score = score / scale + (embed_reg / scale) * dist / (dist.mean() + 1e-9)
    return jnp.where(banned[None, :], jnp.inf, score)


@functools.partial(jax.jit, static_argnames=("k",))
def _best_swaps(score: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """Per position, the k most loss-decreasing tokens [N, k] and their scores (lowest first)."""
    neg, top = jax.lax.top_k(-score, k)
    return top, -neg


@functools.partial(jax.jit, static_argnames=("width", "n_replace"))
def _random_swaps(current: jax.Array, top: jax.Array, live: jax.Array, key: jax.Array, width: int,
                  n_replace: int) -> jax.Array:
    """`width` candidates, each `current` with `n_replace` distinct `live` positions set to one of their top-k
    tokens (n_replace ≤ the live positions)."""
    n, k = top.shape
    where_key, which_key = jax.random.split(key)
    # a position that is not live draws past every live one (uniform draws are < 1), so it is never taken
    order = jnp.where(live[None, :], jax.random.uniform(where_key, (width, n)), 2.0)
    positions = jnp.argsort(order, axis=1)[:, :n_replace]
    choice = jax.random.randint(which_key, (width, n_replace), 0, k)
    return jnp.tile(current, (width, 1)).at[jnp.arange(width)[:, None], positions].set(top[positions, choice])


def sample_candidates(current: np.ndarray, score: jax.Array, cfg: GCGConfig, key: jax.Array) -> np.ndarray:
    """Candidate responses [W, N] from `swap_scores` (on the device: only the top-k swaps or the candidates
    come back to the host, never the [N, V] scores)."""
    n = len(current)
    # A position with no finite score (every token banned, or under --allow_nonfinite a non-finite gradient row)
    # stays as it is; the others still swap. Never past the allowed tokens: with --topk above their number, top-k
    # would reach banned ones (+inf).
    allowed = to_host(jnp.isfinite(score).sum(axis=1))
    live = allowed > 0
    if not live.any():
        return np.zeros((0, n), current.dtype)
    k = min(cfg.topk, int(allowed[live].min()))
    top, top_scores = _best_swaps(score, k)
    if cfg.selection == "greedy":
        return _greedy_candidates(current, to_host(top), to_host(top_scores), live, cfg)
    # (n_replace is static: a live count under it compiles once more; the stall fallback's larger n_replace then
    # redraws the same number of swaps)
    cands = _random_swaps(jnp.asarray(current, jnp.int32), top, jnp.asarray(live), key, cfg.search_width,
                          min(cfg.n_replace, int(live.sum())))
    return to_host(cands).astype(current.dtype)


def _greedy_candidates(current: np.ndarray, top: np.ndarray, top_scores: np.ndarray, live: np.ndarray,
                       cfg: GCGConfig) -> np.ndarray:
    """Deterministic candidates: the i-th best single swap (by gradient), plus, up to `n_replace` positions,
    the best swap at each of the positions whose best swap scores best (so the stall fallback's larger
    n_replace gives new candidates, not the same single swaps again); only `live` positions swap."""
    n, k = top.shape
    pos, rank = np.unravel_index(np.argsort(top_scores, axis=None, kind="stable"), (n, k))
    pos, rank = pos[live[pos]], rank[live[pos]]
    # Per position, its best token that is not the current one, and positions by that swap's score.
    second = min(1, k - 1)
    differs = top[:, 0] != current
    alt = np.where(differs, top[:, 0], top[:, second])
    by_score = np.argsort(np.where(differs, top_scores[:, 0], top_scores[:, second]), kind="stable")
    by_score = by_score[live[by_score]]
    cands, seen = [], set()
    for p, r in zip(pos, rank, strict=True):
        c = current.copy()
        c[p] = top[p, r]
        extra = [q for q in by_score if q != p][: max(0, min(cfg.n_replace, n) - 1)]
        c[extra] = alt[extra]
        if tuple(c) not in seen:  # two swaps can complete each other into one candidate
            seen.add(tuple(c))
            cands.append(c)
        if len(cands) == cfg.search_width:
            break
    return np.asarray(cands, current.dtype).reshape(-1, n)


class RetokenizationCheck(NamedTuple):
    """One target's re-tokenization filter: its prompt in its template (`conversations`), and the ids its response
    sits between."""

    conversations: Conversations
    prefix: tuple[int, ...]
    suffix: tuple[int, ...]


def survives(check: RetokenizationCheck | Callable[[list[int]], bool], ids: list[int]) -> bool:
    """The response passes the check: a target's re-tokenization, or any other test of its ids (a disagreement's
    other side: the decoded text round-trips there too)."""
    if isinstance(check, RetokenizationCheck):
        return retokenizes(check.conversations, ids, [*check.prefix, *ids, *check.suffix])
    return check(ids)


def filter_candidates(cands: np.ndarray, checks: list[RetokenizationCheck], cfg: GCGConfig,
                      seen: set) -> tuple[np.ndarray, dict[str, int]]:
    """The candidates to evaluate, sorted: each distinct one once (even without the history), none evaluated
    before (with forbid_revisits), none failing the re-tokenization filter; and the counts: `sampled`, removed
    as `repeats` (within the batch), `revisits` and `retokenize_failed`, and `left`."""
    n = cands.shape[1]
    distinct = np.unique(cands, axis=0) if len(cands) else cands.reshape(0, n)
    counts = {"sampled": len(cands), "repeats": len(cands) - len(distinct), "revisits": 0, "retokenize_failed": 0}
    keep = []
    for c in distinct:
        key = tuple(c.tolist())
        if cfg.forbid_revisits and key in seen:
            counts["revisits"] += 1
            continue
        if not all(survives(check, list(key)) for check in checks):
            counts["retokenize_failed"] += 1
            continue
        seen.add(key)
        keep.append(c)
    counts["left"] = len(keep)
    return (np.asarray(keep).reshape(-1, n) if keep else np.zeros((0, n), np.int32)), counts


def removed_by_filter(counts: dict[str, int]) -> str:
    removed = [f"{counts[key]} {what}" for key, what in (
        ("repeats", "repeats"), ("revisits", "evaluated before"),
        ("retokenize_failed", "failing the re-tokenization filter")) if counts[key]]
    return "removed " + ", ".join(removed) if removed else "none removed"


def describe_filter(counts: dict[str, int]) -> str:
    return f"{counts['left']} of {counts['sampled']} sampled candidates left, {removed_by_filter(counts)}"


def filter_advice(counts: dict[str, int], cfg: GCGConfig, allowed: int) -> str:
    """What to change for more candidates, for the filter that removed most first."""
    k = min(cfg.topk, allowed)
    narrow = (f"widen --topk (now {cfg.topk})" if cfg.topk < allowed else
              f"allow more tokens (only {allowed} may be searched)")
    fewer = f"lower --search_width ({cfg.num_tokens} positions x top {k} tokens make {cfg.num_tokens * k} single swaps)"
    actions = {
        "repeats": [narrow, "raise --n_replace", fewer],
        "revisits": [narrow, "pass --noforbid_revisits"],
        "retokenize_failed": ["pass --noretokenize_filter (a response may then not be what a conversation tokenizes "
                              "to)"],
    }
    todo = [a for c in sorted((c for c in actions if counts[c]), key=lambda c: -counts[c]) for a in actions[c]]
    if counts["sampled"] < cfg.search_width:  # greedy selection: fewer distinct swaps than the width
        todo += [narrow, fewer]
    todo = list(dict.fromkeys(todo)) or [narrow, fewer]
    return "To get more: " + (", ".join(todo[:-1]) + " or " if len(todo) > 1 else "") + todo[-1] + "."
