"""GCG's start: the tokens the search may use (`banned_tokens`: the candidate set of --vocab_file / --token_ids
less special and non-ASCII tokens) and the sequences it starts from (`start_sequences`: --init_from's best rows,
--init, or 'x x x ...'), each of which must pass the re-tokenization filter; and `init_from_rows`, which the entry
point also calls before the model loads."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from rmjax.errors import UsageError
from rmjax.runs import results, stages
from rmjax.search.gcg_config import GCGConfig
from rmjax.search.gcg_swaps import RetokenizationCheck, disallowed_ids, survives
from rmjax.text.candidates import read_vocab_file, words_to_ids
from rmjax.text.chat import Conversations, split_chat


def banned_tokens(tokenizer: Any, vocab: int, cfg: GCGConfig) -> np.ndarray:
    """Boolean [V]: the tokens no response may hold: special/control, non-ASCII (unless allowed), past the
    tokenizer, and outside the candidate set (--vocab_file / --token_ids). A set that leaves none is refused."""
    banned = disallowed_ids(tokenizer, vocab, cfg.allow_special, cfg.allow_non_ascii)
    if cfg.vocab_file:
        banned |= ~_only(tokenizer, cfg.vocab_file, vocab)
    if cfg.token_ids:
        banned |= ~_only_ids(cfg.token_ids, vocab)
    if banned.all():
        raise UsageError("no token may be searched: the candidate set (--vocab_file / --token_ids) holds only "
                         "special, non-ASCII or out-of-tokenizer tokens; pass --allow_special / --allow_non_ascii, "
                         "or give other tokens.")
    return banned


def start_sequences(tokenizer: Any, cfg: GCGConfig, banned: np.ndarray,
                    checks: list[RetokenizationCheck]) -> list[list[int]]:
    """The sequences the buffer starts from: --init_from's best (see `_seeds`), then each --init response not
    among them; with neither, the default start (see `_init_ids`)."""
    rng = np.random.default_rng(cfg.seed)
    seeds = _seeds(cfg, checks, banned) if cfg.init_from else []
    texts = cfg.init or (() if seeds else ("",))
    return seeds + [ids for ids in (_init_ids(tokenizer, text, cfg, banned, rng, checks) for text in texts)
                    if ids not in seeds]


def _init_ids(tokenizer, text: str, cfg: GCGConfig, banned: np.ndarray, rng,
              checks: list[RetokenizationCheck]) -> list[int]:
    """The starting response: `text` (--init), or by default "x x x ..." (with and without a leading space:
    templates that trim the response make the spaced form impossible). A start that no real conversation
    produces could be reported as the best response, so it must pass the same re-tokenization filter."""
    if tokenizer is None:  # a model without one (tiny test models): a random start, never in place of an --init
        if text:
            raise UsageError(f"--init {text!r} needs the model's tokenizer to read it, and this model has none; "
                             "give the model folder with its tokenizer files, or leave --init out.")
        return [int(i) for i in rng.choice(np.flatnonzero(~banned), cfg.num_tokens)]
    tries = [text] if text else [" x" * cfg.num_tokens, "x" + " x" * (cfg.num_tokens - 1)]
    for attempt in tries:
        ids = tokenizer(attempt, add_special_tokens=False).input_ids
        ids = ids if text else ids[: cfg.num_tokens]  # an --init longer than --num_tokens is refused, not cut
        outside = [i for i in ids if i >= len(banned) or banned[i]]
        if text and outside:  # its tokens would be reported as the best response the search found
            names = ", ".join(repr(tokenizer.decode([i])) for i in outside[:5])
            raise UsageError(f"--init {text!r} holds tokens the search may not use ({names}: special, control, "
                             "non-ASCII or outside --vocab_file / --token_ids); give --init of allowed tokens, or "
                             "--allow_special / --allow_non_ascii.")
        if len(ids) == cfg.num_tokens and not outside and all(survives(check, ids) for check in checks):
            return ids
    if not text and (cfg.vocab_file or cfg.token_ids):  # 'x' is not in the set: its lowest allowed id, repeated
        ids = [int(np.flatnonzero(~banned)[0])] * cfg.num_tokens
        if all(survives(check, ids) for check in checks):
            return ids
    what = f"--init {text!r}" if text else "the default start 'x x x ...'"
    if text and not checks:  # the filter is off: its length alone is what is wrong (helper-144)
        raise UsageError(f"{what} is {len(ids)} token{'s' * (len(ids) != 1)}, not --num_tokens={cfg.num_tokens}; "
                         f"give --init a response of exactly {cfg.num_tokens} tokens, or --num_tokens={len(ids)}.")
    raise UsageError(f"{what} does not come out of a real conversation as {cfg.num_tokens} tokens (decode -> "
                     "template -> tokenize gives other ids, or fewer tokens); give --init a response of exactly "
                     f"--num_tokens={cfg.num_tokens} tokens that survives the template, or --noretokenize_filter.")


def _only(tokenizer, path: str, vocab: int) -> np.ndarray:
    """Boolean [V]: the single tokens of --vocab_file."""
    ids, _ = words_to_ids(tokenizer, read_vocab_file(path))
    if not len(ids):
        raise UsageError(f"--vocab_file={path}: none of its lines is a single token of this tokenizer.")
    allowed = np.zeros(vocab, bool)
    allowed[ids[ids < vocab]] = True
    return allowed


def _only_ids(ids: tuple[int, ...], vocab: int) -> np.ndarray:
    """Boolean [V]: --token_ids (as experiments.beam's; ids past the vocabulary are refused)."""
    outside = [i for i in ids if i >= vocab]
    if outside:
        raise UsageError(f"--token_ids: {outside[:5]} are outside the vocabulary [0, {vocab}).")
    allowed = np.zeros(vocab, bool)
    allowed[list(ids)] = True
    return allowed


def check_starts(cfg: GCGConfig, tokenizer: Any, vocab_size: int, prompts: Iterable[str]) -> None:
    """The start sequences (--init_from's, --init, or the default), from the tokenizer alone: a start that does not
    survive the template stops the job before the weights load, not after."""
    if tokenizer is None:
        return
    checks = [RetokenizationCheck(Conversations(tokenizer, prompt, cfg.template), split.prefix, split.suffix)
              for prompt in prompts
              for split in [split_chat(tokenizer, prompt, cfg.template)]] if cfg.retokenize_filter else []
    start_sequences(tokenizer, cfg, banned_tokens(tokenizer, vocab_size, cfg), checks)


def init_from_rows(cfg: GCGConfig, vocab_size: int | None = None):
    """The rows of --init_from with --num_tokens tokens in --direction, best first. A file that is not a whole beam
    CSV (or cannot be parsed as one), has no such rows, or (given `vocab_size`) holds ids outside [0, vocab_size)
    is a one-line error naming the file: the entry point calls this before the model loads."""
    import pandas as pd

    path = Path(cfg.init_from)
    flag = f"--init_from={path}"
    stages.read_input(path, ("beam",), "--init_from")  # whole, and a beam's (python -m experiments.beam)
    try:
        df = results.read_beam_csv(path)
    except (ValueError, KeyError, TypeError, UnicodeDecodeError, pd.errors.ParserError) as error:
        raise UsageError(f"{flag}: cannot be read as a beam result CSV ({' '.join(str(error).split())[:200]}); rerun "
                         "python -m experiments.beam to write it again.") from None
    rows = df[(df.depth == cfg.num_tokens) & (df.direction == cfg.direction)].sort_values("rank")
    if rows.empty:
        have = sorted({(int(d), str(r)) for d, r in zip(df.depth, df.direction, strict=True)})
        has_depth, has_direction = (any(d == cfg.num_tokens for d, _ in have),
                                    any(r == cfg.direction for _, r in have))
        fix = ([] if has_depth else [f"--depth={cfg.num_tokens}"]) + (
            [f"--direction={cfg.direction} (or both)"] if has_depth or not has_direction else [])
        raise UsageError(f"{flag} has no {cfg.direction} sequences of --num_tokens={cfg.num_tokens} tokens (it has "
                         f"depth/direction {have}); run the beam with {' '.join(fix)}.")
    uneven = [ids for ids in rows.ids if len(ids) != cfg.num_tokens]
    if uneven:
        raise UsageError(f"{flag}: a depth-{cfg.num_tokens} row holds {len(uneven[0])} ids {list(uneven[0])[:8]}; the "
                         "CSV was edited: rerun the beam.")
    if vocab_size is not None:
        outside = sorted({i for ids in rows.ids for i in ids if not 0 <= i < vocab_size})
        if outside:
            raise UsageError(f"{flag}: token ids {outside[:5]} are outside this model's vocabulary [0, {vocab_size}) "
                             "(a beam of another model, or an edited CSV); run the beam with this model.")
    return rows


def read_init_from(cfg: GCGConfig, model_fps: list[dict]) -> stages.StageInput:
    """--init_from, refused in one line unless the beam that wrote it ran a model with the tokenizer of one of
    these (its ids are then the same tokens); what was read, for .meta.json. Its scores are not read: GCG scores
    its starts itself, so another model, prompt or template only gives other starts."""
    return stages.read_input(cfg.init_from, ("beam",), "--init_from", stages.Needs(tokenizer_of=tuple(model_fps)),
                             why="its token ids are other tokens for this model, so GCG would start from text the "
                                 "beam never found; run the beam with a model of this tokenizer")


def _seeds(cfg: GCGConfig, checks: list[RetokenizationCheck], banned: np.ndarray) -> list[list[int]]:
    """The best `buffer_size` sequences of --init_from with --num_tokens tokens in --direction that GCG could
    itself reach (allowed tokens, surviving the re-tokenization filter), best first."""
    path = Path(cfg.init_from)
    rows = init_from_rows(cfg, len(banned))
    seeds = []
    for ids in rows.ids:
        ids = [int(i) for i in ids]
        if not banned[ids].any() and all(survives(check, ids) for check in checks):
            seeds.append(ids)
        if len(seeds) == cfg.buffer_size:
            break
    if not seeds:
        raise UsageError(f"--init_from={path}: none of its {len(rows)} {cfg.direction} sequences of {cfg.num_tokens} "
                         "tokens is one GCG may search (banned tokens, or they do not survive decode -> template -> "
                         "tokenize); widen the beam's --top, or pass --noretokenize_filter / --allow_special.")
    return seeds
