"""The two sides of a disagreement (issue 46): a reward model, or the implicit reward of two causal LMs.

A side scores response *texts* for one prompt, each in its own chat template and tokenization, so two sides may
read different vocabularies (the default RMs: 49,152 and 262,144 tokens); a text counts only where it round-trips
(its tokens in the conversation decode back to it; no whitespace at its edges, which one
template keeps and another strips). The implicit side `implicit:CHOSEN:REFERENCE` is the second
paper's log-prob difference, log π_chosen(y|x) − log π_reference(y|x) over the response's own tokens (each LM on
its own tokenization of the text; the end of turn is left out, so a one-token response's value is what
`experiments.logprobs` gives the two LMs); its tokens, for the search and the vocabulary map, are the chosen LM's.
"""

from __future__ import annotations

import dataclasses
import os
from fractions import Fraction

import jax
import numpy as np

from rmjax import heads
from rmjax.errors import UsageError
from rmjax.model import Model
from rmjax.parallel.distributed import replicated
from rmjax.scoring import finite
from rmjax.scoring.context import prepare_prompt, score_tokens
from rmjax.scoring.forked import forked_token_rewards, shared_layers
from rmjax.scoring.judge import PromptLogProbs
from rmjax.scoring.texts import TextScorer
from rmjax.search import turns
from rmjax.search.gcg import Target, reward_gradient_on_device
from rmjax.text import chat
from rmjax.text.candidates import token_round_trips

IMPLICIT = "implicit:"


@dataclasses.dataclass(frozen=True)
class SideSpec:
    """One side as given on the command line: a reward model spec, or `implicit:CHOSEN_LM:REFERENCE_LM`."""

    text: str
    models: tuple[str, ...]  # (rm,) or (chosen, reference)

    @classmethod
    def parse(cls, text: str) -> SideSpec:
        text = text.strip()
        if not text.startswith(IMPLICIT):
            if not text:
                raise UsageError("--models: an empty side; give two reward models or implicit:CHOSEN:REFERENCE.")
            return cls(text, (text,))
        parts = text[len(IMPLICIT):].split(":")
        if len(parts) != 2 or not all(parts):
            raise UsageError(f"--models side {text!r}: an implicit side is implicit:CHOSEN_LM:REFERENCE_LM (two causal "
                             "LMs, the chosen one's log-prob minus the reference's).")
        if same_model(*parts):  # its reward is 0 for every text: z_B a constant, the search A's alone
            raise UsageError(f"--models side {text!r}: the chosen and the reference LM are the same model, so its "
                             "reward is 0 for every text; give two different LMs.")
        return cls(text, tuple(parts))

    @property
    def implicit(self) -> bool:
        return len(self.models) == 2

    @property
    def each(self) -> int:
        """Whole forwards to score one text: one per model."""
        return len(self.models)


class Side:
    """A side after one prompt: `rewards(texts)`, `token_rewards(ids)` of its own vocabulary's single tokens,
    `round_trips(text)`, and the tokenizer of its tokens."""

    spec: SideSpec
    tokenizer: object
    vocab: int
    gradient_each: int = 0  # whole forwards one `gradient` costs (0: the side gives none)

    def rewards(self, texts: list[str]) -> np.ndarray:
        raise NotImplementedError

    def token_rewards(self, ids: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def round_trips(self, text: str) -> bool:
        raise NotImplementedError

    def tokens_read_back(self, ids: np.ndarray, texts: list[str], done: dict | None = None) -> np.ndarray:
        """Per single token of this side's (its text `texts[i]`): does `token_rewards` score the sequence the
        text's own conversation is (candidates.token_round_trips, the sweep's roundtrip rule)? `done`: this side's
        masks after earlier prompts, for these ids (token_round_trips)."""
        raise NotImplementedError

    def reads_like(self, other: Side) -> bool:
        """Whether `other` reads every text as this side does (tokens_read_back would give the same mask)."""
        return False

    def gradient(self, text: str) -> tuple[jax.Array, list[int]] | None:
        """d reward / d one_hot of the text's own tokens in this side's conversation [L, V] (on the device) and those
        tokens; None where the side has no gradient."""
        return None

    def gives_gradient(self, text: str) -> bool:
        """Whether `gradient(text)` runs (and costs gradient_each), known from the text's tokens alone."""
        return False

    def prefill_forwards(self, num_tokens: int) -> Fraction:
        """What the prompt's prefill costs, in this side's whole forwards of a response of `num_tokens` tokens
        (rmjax.search.objective's rule for side A: prefix positions over the positions one response runs)."""
        raise NotImplementedError

    def yardstick(self, z_sample: int, allow_nonfinite: bool, known: dict[int, float] | None = None
                  ) -> finite.Scale:
        """Mean and SD of its single-token rewards over `z_sample` of its tokens (finite.sampled_yardstick: the
        sample `score` and the frontier draw, so an RM side's z is theirs); `known`: rewards of its tokens scored
        already (the vocabulary map's), read instead of scored again."""
        known = known or {}

        def rewards(ids: np.ndarray) -> np.ndarray:
            out = np.asarray([known.get(int(i), np.nan) for i in ids], np.float64)
            missing = np.asarray([int(i) not in known for i in ids], bool)
            if missing.any():
                out[missing] = self.token_rewards(np.asarray(ids)[missing])
            return out

        return finite.sampled_yardstick(self.vocab, z_sample, rewards, allow=allow_nonfinite,
                                        fix=f"raise --z_sample (side {self.spec.text} scores every token alike?)")


def round_trips_in(conversations: chat.Conversations, text: str) -> bool:
    """The text, put in the model's conversation and tokenized, decodes back to itself from its response tokens,
    up to the one space the plain template puts before a response (as the published pipeline did). A text with
    whitespace at its edges does not count: one template keeps it and another strips it, so two models would read
    two texts (a trailing space cost SmolLM2's chat reading 2 SD against Gemma 3's plain one)."""
    if text != text.strip():
        return False
    body = conversations.response_ids([text])[0]
    return body is not None and conversations.tokenizer.decode(body).strip() == text


class RewardSide(Side):
    """A reward model: a text's reward is what experiments.score gives it (TextScorer), a token's the sweep's."""

    gradient_each = 1

    def __init__(self, spec: SideSpec, model: Model, prompt: str, template: str, batch_size: int = 256):
        self.spec, self.model, self.tokenizer, self.batch_size = spec, model, model.tokenizer, batch_size
        self.vocab = min(model.config.vocab_size, len(model.tokenizer))
        self.scorer = TextScorer(model, prompt, template)
        self.context = prepare_prompt(model, "side", prompt, template)
        self._target = Target(model, prompt, tuple(self.scorer.prefix), (), self.scorer.cache,
                              replicated(np.zeros(0, np.int32), model.mesh))

    def rewards(self, texts: list[str]) -> np.ndarray:
        return self.scorer.score(list(texts)).astype(np.float64) if texts else np.zeros(0)

    def token_rewards(self, ids: np.ndarray) -> np.ndarray:
        return score_tokens(self.model, self.context, np.asarray(ids), self.batch_size).astype(np.float64)

    def round_trips(self, text: str) -> bool:
        return round_trips_in(self.scorer, text)

    def tokens_read_back(self, ids: np.ndarray, texts: list[str], done: dict | None = None) -> np.ndarray:
        return token_round_trips(self.scorer, ids, texts, done)

    def reads_like(self, other: Side) -> bool:
        """The same prompt split, chat template and tokenizer (a planted RM and its clean twin): one read-back
        serves both (it renders and tokenizes every string's conversation)."""
        mine, theirs = (getattr(t, "backend_tokenizer", None) for t in (self.tokenizer, other.tokenizer))
        return (isinstance(other, RewardSide) and self.scorer.split == other.scorer.split and mine is not None
                and theirs is not None and getattr(self.tokenizer, "chat_template", None) ==
                getattr(other.tokenizer, "chat_template", None) and mine.to_str() == theirs.to_str())

    def prefill_forwards(self, num_tokens: int) -> Fraction:
        return Fraction(len(self.scorer.prefix), num_tokens + turns.rm_tail(self.scorer.split.suffix))

    def _after_prefix(self, text: str) -> tuple[list[int], list[int]] | None:
        """The conversation's tokens after the cached prefix and the response's own, where they continue it."""
        ids, body = self.scorer.token_ids([text])[0], self.scorer.response_ids([text])[0]
        prefix = len(self.scorer.prefix)
        tail = ids[prefix:]
        if body is None or ids[:prefix] != self.scorer.prefix or tail[: len(body)] != body:
            return None
        if heads.moves_gate(self.model.config.head, self.scorer.prefix, tail):  # the cached gate is not its own
            return None
        return tail, body

    def gives_gradient(self, text: str) -> bool:
        return self._after_prefix(text) is not None

    def gradient(self, text: str) -> tuple[jax.Array, list[int]] | None:
        """The gradient of the reward `rewards` gives the text (read where the scorer reads it: the conversation's
        last token) over the response's own tokens; None where the conversation does not continue the cached
        prefix with them."""
        found = self._after_prefix(text)
        if found is None:
            return None
        tail, body = found
        grad, _ = reward_gradient_on_device(self._target, np.asarray(tail, np.int32))
        return grad[: len(body)], body

    def shared_layers(self, other: Side) -> int:
        """Leading layers this RM and `other` hold alike (rmjax.scoring.forked), when `other` is an RM reading the
        same prompt in the same tokens: what a forked forward of both can run once; else 0."""
        if not isinstance(other, RewardSide) or self.context.split != other.context.split:
            return 0
        return shared_layers(self.model, other.model)

    def forked_token_rewards(self, other: RewardSide, ids: np.ndarray, layers: int, progress=None, chunk: int = 4096
                             ) -> tuple[np.ndarray, np.ndarray]:
        """token_rewards of the same ids under this RM and `other`, their first `layers` layers run once."""
        ra, rb = forked_token_rewards(self.model, other.model, self.context, other.context, np.asarray(ids), layers,
                                      self.batch_size, progress, chunk)
        return ra.astype(np.float64), rb.astype(np.float64)


class ImplicitSide(Side):
    """log π_chosen(y|x) − log π_reference(y|x) over the response's own tokens, each LM on its tokenization."""

    def __init__(self, spec: SideSpec, chosen: Model, reference: Model, prompt: str, template: str):
        self.spec, self.chosen, self.reference, self.tokenizer = spec, chosen, reference, chosen.tokenizer
        self.vocab = min(chosen.config.vocab_size, len(chosen.tokenizer))
        self.conversations = [chat.Conversations(m.tokenizer, prompt, template) for m in (chosen, reference)]
        self.readers = [PromptLogProbs(m, prompt, template) for m in (chosen, reference)]  # each prefilled once
        self.first = np.asarray(self.readers[0].first, np.float64)
        self._read_back: dict[int, bool] = {}  # token id -> tokens_read_back's answer (one prompt's side)

    def prefill_forwards(self, num_tokens: int) -> Fraction:
        """Each LM's prefix over the positions one response runs in it (the response and its end of turn)."""
        return sum((Fraction(len(r.prefix), num_tokens + 1) for r in self.readers), Fraction(0))

    @staticmethod
    def _log_probs(reader: PromptLogProbs, texts: list[str]) -> np.ndarray:
        return np.asarray([lp.sum() for lp in reader(texts)], np.float64)

    def rewards(self, texts: list[str]) -> np.ndarray:
        texts = list(texts)
        if not texts:
            return np.zeros(0)
        return self._log_probs(self.readers[0], texts) - self._log_probs(self.readers[1], texts)

    def token_rewards(self, ids: np.ndarray) -> np.ndarray:
        """The implicit reward of each token's text, both LMs reading that one text: the chosen LM's log-prob of
        the token as the response's first (its logprobs row) where its conversation tokenizes the text to that
        token, else of the text as its conversation reads it, minus the reference's of the text on its own
        tokenization. (The row alone read another response there: `Love` glued to `Assistant:` in the plain
        format, which the reference read as `Assistant: Love`; one LM as both sides had SD 3.1, not 0.)"""
        ids = np.asarray(ids)
        texts = self.chosen.tokenizer.batch_decode([[int(i)] for i in ids])
        chosen = self.first[ids].copy()
        unknown = [k for k, i in enumerate(ids.tolist()) if i not in self._read_back]
        if unknown:  # the map asked already (disagree_job._read_back): its masks are not rendered again
            self.tokens_read_back(ids[unknown], [texts[k] for k in unknown])
        glued = ~np.fromiter((self._read_back[i] for i in ids.tolist()), bool, len(ids))
        if glued.any():
            chosen[glued] = self._log_probs(self.readers[0], [t for t, g in zip(texts, glued, strict=True) if g])
        return chosen - self._log_probs(self.readers[1], texts)

    def round_trips(self, text: str) -> bool:
        return all(round_trips_in(c, text) for c in self.conversations)

    def tokens_read_back(self, ids: np.ndarray, texts: list[str], done: dict | None = None) -> np.ndarray:
        """The chosen LM's token mode (its first-token log-prob); the reference reads the text itself."""
        mask = token_round_trips(self.conversations[0], ids, texts, done)
        self._read_back.update(zip(np.asarray(ids).tolist(), mask.tolist(), strict=True))
        return mask


def make_side(spec: SideSpec, models: dict[str, Model], prompt: str, template: str, batch_size: int = 256) -> Side:
    """The side after `prompt`, from the loaded models (by spec); a reward model scores single tokens `batch_size`
    at a time."""
    if spec.implicit:
        return ImplicitSide(spec, models[spec.models[0]], models[spec.models[1]], prompt, template)
    return RewardSide(spec, models[spec.models[0]], prompt, template, batch_size)


def same_model(a: str, b: str) -> bool:
    """Two specs naming one model: a path however it is spelled (a trailing slash, ./, ..), else the same text."""
    def where(spec: str) -> str:
        return os.path.realpath(spec) if os.path.exists(spec) else spec

    return where(a) == where(b)


def refuse_one_model(sides: tuple[SideSpec, SideSpec], fp: dict[str, dict]) -> None:
    """One model by content (`fp`: each spec's fingerprint), spelt as two (a copied folder): every gap 0, or an
    implicit reward of 0, refused before loading as one spelling is (`same_model`). An export of a model is other
    files: not caught here."""
    a, b = sides
    pairs = [(b.models[0], b.models[1], f"--models side {b.text!r}: the chosen and the reference LM")] if b.implicit \
        else [(a.models[0], b.models[0], f"--models: {a.text} and {b.text}")]
    for first, second, named in pairs:
        if fp[first] == fp[second]:
            raise UsageError(f"{named} are one model (the same weights, tokenizer and template files); a model does "
                             "not disagree with itself: give two different models.")
