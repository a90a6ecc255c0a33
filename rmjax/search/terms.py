"""The objective's terms (rmjax.search.objective): their values per candidate, the prior LM that gives F, the
repetition share, and the partner a disagreement search adds."""

from __future__ import annotations

import dataclasses
from typing import Protocol

import jax
import numpy as np

from rmjax.model import Model
from rmjax.scoring import prior as prior_lib
from rmjax.scoring.prefix import prefill_prefix
from rmjax.search import turns


def repetition(ids: np.ndarray, end: int | None = None) -> np.ndarray:
    """Share of each response's positions [W, N] that repeat the previous token or an earlier bigram: [W]. With
    `end`, whole turns: over each response's own tokens (turns.tokens)."""
    ids = np.asarray(ids)
    out = np.zeros(len(ids), np.float64)
    for r, row in enumerate(ids.tolist()):
        row = turns.tokens(row, end) if end is not None else row
        bigrams, repeats = set(), 0
        for j in range(1, len(row)):
            pair = (row[j - 1], row[j])
            repeats += row[j] == row[j - 1] or pair in bigrams
            bigrams.add(pair)
        out[r] = repeats / max(len(row), 1)  # an empty turn repeats nothing
    return out


@dataclasses.dataclass
class Values:
    """The terms of candidates [W]: reward, F's prior log-prob term (NaN where the prior was not run: λ = 0),
    repetition share and objective J."""

    reward: np.ndarray
    prior_logp: np.ndarray
    repetition: np.ndarray
    objective: np.ndarray

    def take(self, index) -> Values:
        """The terms of the candidates `index` selects (a mask or indices)."""
        return Values(*(np.asarray(getattr(self, f.name))[index] for f in dataclasses.fields(Values)))

    @staticmethod
    def joined(parts: list[Values]) -> Values:
        """The terms of several candidate lists, one after another (none: an empty list)."""
        return Values(*(np.concatenate([np.zeros(0)] + [np.asarray(getattr(v, f.name), np.float64) for v in parts])
                        for f in dataclasses.fields(Values)))


@dataclasses.dataclass(eq=False)
class Prior:
    """The prior LM after one prompt's chat context: its model, prefix cache and first-token log-probs."""

    model: Model
    prefix: tuple[int, ...]
    cache: object
    first: jax.Array

    @classmethod
    def of(cls, model: Model, prefix) -> Prior:
        prior_lib.require_lm_head(model)
        return cls(model, tuple(prefix), prefill_prefix(model, prefix),
                   prior_lib.first_token_log_probs(model, list(prefix)))

    def fluency_log_probs(self, ids: np.ndarray, end: int, batch_size: int = 64) -> np.ndarray:
        """F's log-prob term of each whole turn [W, N] (turns.fluency_log_prob: its tokens' mean and its end of
        turn's)."""
        ids = np.asarray(ids)
        rows = np.concatenate([ids, np.full((len(ids), 1), end)], axis=1)
        lps = prior_lib.response_log_probs(self.model, self.cache, self.first, rows, batch_size)
        return turns.fluency_log_prob(lps, turns.lengths(ids, end))


class Partner(Protocol):
    """The other side of a disagreement search (rmjax.search.disagree.Disagreement)."""

    each: int  # whole forwards each candidate costs on the other side
    scale: float  # A's SD: the gradient of z_A is A's reward gradient over it

    def gap(self, reward: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """z_A − z_B of candidates [W, N] from A's rewards [W]."""

    def unscored(self, ids: np.ndarray) -> int:
        """How many distinct texts among candidates [W, N] the other side has not scored: what `gap` will run."""

    def gradient_cost(self, turn: np.ndarray) -> int:
        """Whole forwards of the other side that `gradient(turn)` runs (0: it gives none for this turn)."""

    def gradient(self, turn: np.ndarray, width: int) -> jax.Array | None:
        """d z_B / d one_hot(A's turn form) [L + 1, width], where the other side can say."""
