"""Issue 25's objective over whole turns (issue 43, rmjax.search.turns), and what it costs in forwards.

Optimal: maximize J = R + λ·F; pessimal: maximize J = −R + λ·F, i.e. fluent *and* disliked. R is the reward of
prompt + response + suffix (one RM target, the GCG target), the response a whole turn of L ≤ N tokens; F = the
mean log p_prior over the response's L tokens + log p_prior of its end of turn after them, at full weight (given
the prompt's chat context; turns.fluency_weights says why) − ρ·repetition. The
repetition share counts the response's positions that repeat the token before them or a bigram seen earlier, over
L: loops are what a small LM rates most likely, and ρ keeps F from rewarding them. At λ = 0 the prior has no say
in J (it may still propose: rmjax.search.fluent's `explore`).

Forwards (the budget every method spends; `Forwards`): one forward is one whole candidate through one model after
its cached prompt: a response of N tokens and the template's suffix (N + S positions; plain template: N + 1, the
end of turn the RM runs for its log-probs) through the RM, the response and its end of turn (N + 1) through the
prior. A call running p positions of a model costs p / that model's unit: a whole turn of L tokens L + S, a GCG
candidate that shares its head with the sequence it came from runs from its first change in turn form
(prefix.score_variants), a beam level's d-token turn d + S. A gradient costs 3 times its forward's positions
(forward + backward). When the RM is its own prior, one RM forward serves both terms: the prior log-probs of a
candidate (whole, a beam level, or a GCG variant's tail) and of a gradient are read off the LM head at the
positions the RM runs, and cost no prior positions. A prompt's prefill costs its prefix positions once per model.
Padding rows cost nothing (they carry no candidate), nor does a variant scored again alone because a row-mate was
NaN (prefix.score_variants): a candidate is charged once. Counts are exact fractions.

A disagreement search (issue 46, rmjax.search.disagree) is this objective with a `partner`: R becomes the gap
z_A − z_B of the candidate (A: this RM target, in SDs of its single-token rewards; B: the other side, scoring the
decoded text in its own template and tokens), the gradient is A's plus B's where the partner can map it onto A's
tokens (`Partner.gradient`: the tokens both read alike; GRADIENT_COST of B's whole forwards a step), and each
text the partner scores costs its whole forwards (`Partner.each`): a text it scored before (a repeated sample) is
not scored again, and costs nothing (best-of-N paid B for its repeats, compute neither method spent).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from rmjax.errors import UsageError
from rmjax.parallel.distributed import replicated, to_host
from rmjax.scoring import finite
from rmjax.scoring import prior as prior_lib
from rmjax.scoring.prefix import (
    extend_prefix,
    first_changes,
    score_responses,
    score_variants,
)
from rmjax.search import turns
from rmjax.search.budget import Forwards
from rmjax.search.gcg import Target, explain_nonfinite, reward_gradient_on_device
from rmjax.search.joint_gradient import joint_gradient_on_device
from rmjax.search.terms import Partner, Prior, Values, repetition

GRADIENT_COST = 3  # a backward pass costs about twice its forward


def _shared_log_probs(current: np.ndarray, cands: list[np.ndarray], every: jax.Array, after: list[np.ndarray],
                      first: np.ndarray) -> np.ndarray:
    """F's log-prob term of variants of `current` (turn forms, rmjax.search.turns: tokens and end of turn): its own
    tokens' log-probs before the first change and the changed token's (both from `every` [L + 1, V] on the device,
    the prior at every position of current's turn; only those L + 1 + W entries come to the host), then the
    tail's (`after`, from the variant's forward), weighed by turns.fluency_log_prob; `first`: where each variant's
    forward started."""
    rows = np.concatenate([np.arange(len(current)), first])
    changed = [int(c[f]) for c, f in zip(cands, first, strict=True)]
    picked = to_host(every[rows, np.concatenate([current, changed]).astype(np.int32)]).astype(np.float64)
    own, width = picked[: len(current)], max(len(c) for c in cands)
    lps = np.zeros((len(cands), width), np.float64)
    for i, (f, tail) in enumerate(zip(first, after, strict=True)):
        row = np.concatenate([own[:f], [picked[len(current) + i]], tail])
        lps[i, : len(row)] = row
    return turns.fluency_log_prob(lps, [len(c) - 1 for c in cands])


@dataclasses.dataclass(eq=False)
class Objective:
    """J of one direction and λ over one RM target, charged to `forwards` (module docstring)."""

    target: Target
    prior: Prior | None
    lam: float
    sign: float  # +1 optimal, -1 pessimal
    repetition_weight: float
    forwards: Forwards
    batch_size: int = 256
    allow_nonfinite: bool = False  # NaN/Inf gradient entries and terms counted, not refused
    swaps_skipped: int = 0  # swaps of allowed tokens a NaN/Inf gradient entry kept from being proposed
    candidates_dropped: int = 0  # sequences scored with a NaN/Inf term (allow_nonfinite), never kept
    partner: Partner | None = None  # a disagreement's other side: R is the gap z_A − z_B (module docstring)
    screen: int = 0  # with a partner: a GCG step's partner scores only this many candidates (score_screened)

    def __post_init__(self):
        if self.lam > 0 and self.prior is None:
            raise UsageError("a fluency weight λ > 0 needs a prior LM.")
        t = self.target
        self.end = turns.end_of_turn(t.suffix, t.model.tokenizer, t.model.source)
        self.read_offset = 0 if turns.reads_end(t.suffix) else 1  # plain: the reward is read before the end
        self.tail = turns.rm_tail(t.suffix)  # RM positions after a turn's tokens (Forwards' rm_unit is N + tail)
        rest = tuple(t.suffix[1:])  # the gradient's and variants' suffix: turn forms carry the end of turn
        self.turn_target = dataclasses.replace(t, suffix=rest,
                                               suffix_ids=replicated(np.asarray(rest, np.int32), t.model.mesh))
        self._prompt_to_sample: dict[int, object] = {}  # sampling_cache's padded prompt cache, per N: made once

    @property
    def uses_prior(self) -> bool:
        return self.lam > 0

    @property
    def other_each(self) -> int:
        """Whole forwards of the partner per text it scores (0 without one)."""
        return self.partner.each if self.partner is not None else 0

    def partner_forwards(self, cands: np.ndarray) -> int:
        """The partner's whole forwards for scoring candidates [W, N]: each text it has not scored yet."""
        return self.partner.unscored(cands) * self.other_each if self.partner is not None else 0

    @property
    def gradient_sign(self) -> float:
        """The weight of the RM's reward in the gradient: sign, over A's SD when R is a gap of z-scores."""
        return self.sign / self.partner.scale if self.partner is not None else self.sign

    def values(self, reward: np.ndarray, logp: np.ndarray, ids: np.ndarray) -> Values:
        if self.partner is not None:
            reward = self.partner.gap(reward, np.asarray(ids))
        return self._values(reward, logp, ids, self.sign)

    def _values(self, reward: np.ndarray, logp: np.ndarray, ids: np.ndarray, weight: float) -> Values:
        rep = repetition(ids, self.end)
        fluency = np.nan_to_num(logp, nan=0.0) - self.repetition_weight * rep
        return Values(reward, logp, rep, weight * np.asarray(reward, np.float64) + self.lam * fluency)

    @property
    def rm_is_prior(self) -> bool:
        """The prior is the RM itself after the same prompt: one RM forward gives both terms."""
        return (self.prior is not None and self.prior.model is self.target.model
                and self.prior.prefix == tuple(self.target.prefix))

    def _prior_runs(self, current, every, known_logp) -> bool:
        """Whether `score` runs the prior: not at λ = 0, not for known log-probs, not when the RM's own forward
        reads them (the RM is its own prior: whole candidates, and variants of current when the gradient gave the
        prior at every position of current)."""
        shared = self.rm_is_prior and (current is None or every is not None)
        return self.uses_prior and known_logp is None and not shared

    def _positions(self, cands: np.ndarray, current: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """The RM positions each candidate runs (whole: L + S; a variant of current: from its first change in turn
        form to the end of the suffix) and each one's prior positions if the prior runs it (L + 1)."""
        size, tail = turns.lengths(cands, self.end), self.tail
        if current is None:
            return size + tail, size + 1
        first = self._firsts(turns.turn(current, self.end), [turns.turn(c, self.end) for c in cands])
        return size - first + tail, size + 1

    def _firsts(self, mine: np.ndarray, variants: list[np.ndarray]) -> np.ndarray:
        """Where each variant's RM forward starts (turn forms): its first change; with the plain template no later
        than its last token, whose position the reward is read at (the end of turn after it is the prior's)."""
        first = first_changes(mine, variants)
        if self.read_offset:
            first = np.minimum(first, np.asarray([len(v) - 2 for v in variants], np.int64))
        return first

    def cost(self, cands: np.ndarray, current: np.ndarray | None = None, every=None, known: bool = False,
             partner: bool = True, paid: bool = False) -> np.ndarray:
        """What `score` charges for each candidate [W] (Fractions); `known`: their log-probs are given; without
        `partner`, this side's part alone (`score_screened` charges the partner per candidate it keeps); `paid`:
        the partner's part alone (this side's forwards were the sampler's, charged by the caller)."""
        rm, lm = self._positions(cands, current)
        runs = self._prior_runs(current, every, 0.0 if known else None) and not paid
        return np.asarray([self.forwards.cost(0 if paid else int(r), int(m) if runs else 0,
                                              self.other_each if partner else 0)
                           for r, m in zip(rm, lm, strict=True)], object)

    def score(self, cands: np.ndarray, current: np.ndarray | None = None, extended=None,
              known_logp: np.ndarray | None = None, every: jax.Array | None = None, paid: bool = False) -> Values:
        """J of whole turns [W, N] (N slots, turns' canonical form), charged first. With `current`, the RM runs
        each from its first change (in turn form) against `extended`, the cache of prefix + current's turn (from
        the gradient's forward); when the RM is its own prior, its forward's LM head gives the prior term (no
        prior forward): for variants, with `every` (the prior's log-probs at every position of current's turn,
        from the gradient). `known_logp`: their F log-prob terms, already computed (a sampler's): the prior
        is not run again. `paid`: the RM's positions were charged by the caller (the RM's own sampler ran them);
        only a partner's forwards are charged here."""
        cands = np.asarray(cands, np.int32)
        reward, logp = self._own_terms(cands, current, extended, known_logp, every, True, paid)
        return self._checked(self.values(reward, logp, cands), cands)

    def score_screened(self, cands: np.ndarray, keep: int, current: np.ndarray | None = None, extended=None,
                       known_logp: np.ndarray | None = None, every: jax.Array | None = None, paid: bool = False
                       ) -> tuple[np.ndarray, Values]:
        """`score` with a disagreement's partner run only for the `keep` best candidates by this side's part of J
        (sign·reward over A's SD + λ·F, J less the partner's term): each candidate is charged this side's positions
        (unless `paid`, as `score_paid`), the partner's forwards only for those kept (a candidate with a NaN/Inf
        term of this side's is dropped, allow_nonfinite, before the partner is charged). Returns the kept indices
        (best first) and their Values; a candidate screened out has no gap and is neither kept nor written."""
        cands = np.asarray(cands, np.int32)
        reward, logp = self._whole_terms(cands, False, known_logp) if paid else \
            self._own_terms(cands, current, extended, known_logp, every, False)
        own = self._checked(self._values(reward, logp, cands, self.gradient_sign), cands)
        order = np.lexsort((np.arange(len(cands)), -own.objective))[:keep]
        order = order[np.isfinite(own.objective[order])]  # a NaN/Inf term of this side's (allow_nonfinite)
        self.forwards.charge(whole=self.partner_forwards(cands[order]))  # within cost(partner=False) + keep·each
        return order, self._checked(self.values(reward[order], logp[order], cands[order]), cands[order])

    def _own_terms(self, cands: np.ndarray, current, extended, known_logp, every, partnered: bool, paid: bool = False
                   ) -> tuple[np.ndarray, np.ndarray]:
        """This RM's rewards of candidates and their F log-prob terms (`score`), charged first (unless `paid`), with
        the partner's forwards for them when `partnered`."""
        if current is not None and extended is None:
            extended = self.extended_cache(current)
        rm_positions, lm_positions = self._positions(cands, current)
        run_prior = self._prior_runs(current, every, known_logp)
        shared = self.uses_prior and known_logp is None and not run_prior
        self.forwards.charge(0 if paid else int(rm_positions.sum()),
                             int(lm_positions.sum()) if run_prior and not paid else 0,
                             self.partner_forwards(cands) if partnered else 0)
        if current is None:
            return self._whole_terms(cands, shared, known_logp)
        t, end = self.turn_target, self.end
        mine, variants = turns.turn(current, end), [turns.turn(c, end) for c in cands]
        firsts = self._firsts(mine, variants)
        reward = score_variants(t.model, extended, np.asarray(t.suffix, np.int32), mine, variants, self.batch_size,
                                log_probs=shared, longest=cands.shape[1] + 1, firsts=firsts,
                                read_offset=self.read_offset)
        if shared:
            reward, after = reward
            return reward, _shared_log_probs(mine, variants, every, after, firsts)
        return reward, self._fluency_log_probs(cands, known_logp)

    def score_paid(self, cands: np.ndarray, known_logp: np.ndarray) -> Values:
        """J of whole turns whose forwards the caller charged (best-of-N's samples drawn by the RM as its own
        prior: the sampler's forward was the scoring one), with their known F log-prob terms."""
        cands = np.asarray(cands, np.int32)
        return self._checked(self.values(*self._whole_terms(cands, False, known_logp), cands), cands)

    def score_partials(self, partials: np.ndarray) -> Values:
        """J of d-token responses [W, d] (d ≤ N: a beam level; each a whole turn of d tokens), charged (d + S) RM
        positions each and d + 1 prior positions unless the RM is its own prior."""
        partials = np.asarray(partials, np.int32)
        d, tail = partials.shape[1], self.tail
        shared = self.uses_prior and self.rm_is_prior
        self.forwards.charge(len(partials) * (d + tail),
                             len(partials) * (d + 1) if self.uses_prior and not shared else 0,
                             self.partner_forwards(partials))
        return self._checked(self.values(*self._whole_terms(partials, shared), partials), partials)

    def _whole_terms(self, cands: np.ndarray, shared: bool, known_logp: np.ndarray | None = None
                     ) -> tuple[np.ndarray, np.ndarray]:
        """Rewards and F log-prob terms of responses run whole after the prompt (already charged); `shared`: the
        RM's forward gives the prior term too."""
        t, size = self.target, turns.lengths(cands, self.end)
        if shared:
            reward, lps = score_responses(t.model, t.cache, t.suffix_ids, cands, self.batch_size,
                                          first=self.prior.first, lengths=size, end=self.end)
            return reward, turns.fluency_log_prob(lps, size)
        reward = score_responses(t.model, t.cache, t.suffix_ids, cands, self.batch_size, lengths=size, end=self.end)
        return reward, self._fluency_log_probs(cands, known_logp)

    def _checked(self, v: Values, cands: np.ndarray) -> Values:
        """GCG's rule for what it scores: a NaN/Inf term J reads (the reward; the prior log-prob at λ > 0) stops the
        job, naming the first sequence and where its model turns non-finite; with allow_nonfinite the sequence is
        dropped (J = −inf: never kept, ranked or written) and counted in `candidates_dropped`."""
        terms = np.stack([v.reward, v.prior_logp], axis=1)[:, : 2 if self.uses_prior else 1].astype(np.float64)
        bad = ~np.isfinite(terms).all(axis=1)
        if not bad.any():
            return v
        if not self.allow_nonfinite:
            decode = self.target.model.tokenizer.decode
            body = [turns.tokens(c, self.end) for c in cands]
            finite.check(terms, what=f"objective terms (λ = {self.lam:g})", columns=["reward", "prior_logp"],
                         allow=False, row=lambda i: f"response ids {body[i]} ({decode(body[i])!r})",
                         explain=lambda i, j: self._explain_terms(np.asarray(body[i]), j))
        self.candidates_dropped += int(bad.sum())
        return dataclasses.replace(v, objective=np.where(bad, -np.inf, v.objective))

    def _explain_terms(self, ids: np.ndarray, column: int) -> str:
        """Where the RM (column 0, the reward) or the prior (1, its log-prob) turns non-finite on `ids`."""
        if column == 0:
            return explain_nonfinite([self.target], ids)
        return f" (the prior {self.prior.model.source})" + finite.diagnose(self.prior.model,
                                                                          [*self.prior.prefix, *ids.tolist()])

    def _fluency_log_probs(self, cands: np.ndarray, known_logp: np.ndarray | None) -> np.ndarray:
        if known_logp is not None:
            return np.asarray(known_logp, np.float64)
        return self.prior.fluency_log_probs(cands, self.end) if self.uses_prior else np.full(len(cands), np.nan)

    def extended_cache(self, current: np.ndarray):
        """The RM cache of prefix + current's turn (what `score` runs variants against), charged L + 1 RM
        positions."""
        mine = turns.turn(current, self.end)
        self.forwards.charge(len(mine))
        return extend_prefix(self.target.model, self.target.cache, mine[None])

    def sampling_cache(self, n: int, current: np.ndarray | None = None, j: int = 0, extended=None
                       ) -> tuple[object, int]:
        """The prior's cache of prompt + current[:j] for drawing N-token responses, and the slot where that prefix
        ends, in one width per search (the prompt's slots + N + 1, the rest free): every draw, the starts' and each
        tail's, runs one sampler program (prior.sample_responses with `at`). The head of `extended` (the RM's cache
        of prompt + current's turn) when the RM is the prior, else the prior's prompt cache extended by j tokens
        (charged j prior positions)."""
        if self.rm_is_prior and current is not None:
            cache, prompt = extended, extended.k.shape[2] - len(turns.turn(current, self.end))
        elif j:
            self.forwards.charge(0, j)
            cache = extend_prefix(self.prior.model, self.prior.cache, np.asarray(current, np.int32)[None, :j])
            prompt = self.prior.cache.k.shape[2]
        else:  # the prompt alone (starts, best-of-N's rounds, a separate prior's tails at j = 0): padded once
            prompt = self.prior.cache.k.shape[2]
            if n not in self._prompt_to_sample:
                self._prompt_to_sample[n] = self.prior.cache.with_free_slots(n + 1)
            return self._prompt_to_sample[n], prompt
        free = prompt + n + 1 - cache.k.shape[2]
        return (cache.with_free_slots(free) if free > 0 else cache), prompt + j

    def gradient(self, current: np.ndarray, explore: bool = False) -> tuple[jax.Array, object, jax.Array | None]:
        """d(−J)/d one_hot(turn) [L + 1, V] on the device (current's turn form: row L, its end of turn's slot,
        says what putting a token there, one more before the end, would do), the RM cache of prefix + that turn
        (for `score`), and the prior's log-probabilities of every token at every position of it [L + 1, V],
        charged first. At λ = 0 those come only with `explore` (a prior forward, for the prior's proposals), else
        None. When the RM is its own prior, one forward and backward of the RM gives all three
        (joint_gradient_on_device)."""
        longest, current = len(current) + 1, turns.turn(current, self.end)
        n, tail = len(current), len(self.turn_target.suffix)
        explore = explore and not self.uses_prior and self.prior is not None
        other = GRADIENT_COST * self.partner.gradient_cost(current) if self.partner is not None else 0
        if self.rm_is_prior and (self.uses_prior or explore):
            self.forwards.charge(GRADIENT_COST * (n + tail), 0, other)
            grad, extended, every = joint_gradient_on_device(self.turn_target, self.prior.first, current,
                                                             self.gradient_sign,
                                                             self.lam, fluent=self.uses_prior,
                                                             read_offset=self.read_offset, longest=longest)
            return self._with_partner(-grad, current, other), extended, every
        lm = GRADIENT_COST * n if self.uses_prior else n if explore else 0
        self.forwards.charge(GRADIENT_COST * (n + tail), lm, other)
        grad, extended = reward_gradient_on_device(self.turn_target, current, self.read_offset)
        loss = -self.gradient_sign * grad
        every = None
        if self.uses_prior:
            prior_grad, every = prior_lib.prior_gradient(self.prior.model, self.prior.cache, self.prior.first,
                                                         current, turns.fluency_weights([n - 1], n)[0])
            vocab = min(loss.shape[1], prior_grad.shape[1])
            loss = loss[:, :vocab] - self.lam * jax.device_put(prior_grad[:, :vocab], loss.sharding)
        elif explore:
            every = prior_lib.every_log_probs(self.prior.model, self.prior.cache, self.prior.first, current)
        return self._with_partner(loss, current, other), extended, every

    def _with_partner(self, loss: jax.Array, turn: np.ndarray, charged: int) -> jax.Array:
        """−dJ/d one_hot with the other side's part, where it gives one (`charged`: its forwards, paid): J holds
        −sign·z_B."""
        if not charged:
            return loss
        other = self.partner.gradient(turn, loss.shape[1])
        return loss if other is None else loss + self.sign * jax.device_put(other, loss.sharding)

    def check_gradient(self, loss: jax.Array, banned: jax.Array, current: np.ndarray) -> None:
        """GCG's rule for a gradient (finite.gradient_swaps_skipped): a NaN/Inf entry of `loss` [N, V] over the
        searched vocabulary (`banned` [V']) stops the job, naming where the RM or the prior turns non-finite, or
        with allow_nonfinite is counted in `swaps_skipped` (swap_scores never proposes it)."""
        self.swaps_skipped += finite.gradient_swaps_skipped(
            loss[:, : banned.shape[0]], banned, allow=self.allow_nonfinite, tokenizer=self.target.model.tokenizer,
            what=f"the objective's gradient (λ = {self.lam:g}) for response ids {np.asarray(current).tolist()}",
            explain=lambda: self._explain(current))

    def _explain(self, current: np.ndarray) -> str:
        """Where the RM turns non-finite on prefix + current + suffix, else the non-finite parameters of the RM and
        of the prior when its gradient is in J."""
        found = explain_nonfinite([self.target], np.asarray(turns.tokens(current, self.end)))
        if found or not self.uses_prior or self.rm_is_prior:
            return found
        params = finite.nonfinite_parameters(self.prior.model.params)
        return f"; non-finite parameters of the prior {self.prior.model.source}: {'; '.join(params)}" if params else ""

    def next_token_log_probs(self, partials: np.ndarray) -> jnp.ndarray:
        """The prior's log-probabilities of each partial's next token [W, V] (the beam's proposals), charged d
        prior positions each."""
        if self.prior is None:
            raise UsageError("the prior's proposals need a prior LM.")
        partials = np.asarray(partials, np.int32)
        self.forwards.charge(0, partials.size)
        return prior_lib.next_log_probs(self.prior.model, self.prior.cache, self.prior.first, partials)
