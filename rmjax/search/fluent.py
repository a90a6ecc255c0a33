"""Issue 25's search for fluent optimal and pessimal responses, and its baseline, both within a forwards budget
(rmjax.search.objective).

The search: starts, then GCG on the full objective J from the best of them (seeded GCG was never worse).
- Starts, within `start_share` of the budget: samples from the prior, then a beam (BEAST-like) whose partials
  are extended by the prior's top `proposals` next tokens and ranked by J of the partial.
- GCG from the best sequences so far: candidates are single swaps sampled from the gradient of −J's top-k
  (the prior's term is in the gradient) mixed with swaps to the prior's top next tokens at each position; and
  `resamples` responses that keep the current sequence's first j tokens and draw the rest from the prior. The
  swaps that each raised J, at different positions, are then scored applied together (`merges`).
- A candidate set no larger than `exact_limit` (the findings' 500 nouns) is searched exactly instead: the beam
  extends by every allowed token and each step proposes every allowed token at one position (a coordinate step),
  since scoring them costs less than a few guesses.
- Seeds, another search's rows (the frontier's larger λs), join the archive first, free: GCG goes on from the
  best of them and the starts.
At λ = 0 the prior does not enter J, but with `explore` it still proposes its swaps and tails (one prior forward a
step; none when the RM is its own prior, whose gradient forward gives them): over a large vocabulary the gradient's
single swaps alone stall (Gemma 3 pessimal ended above best-of-N's best without them). Exact mode needs neither.
Both search and baseline stop when the next call would pass the budget.

The baseline, best-of-N at the same budget, is rmjax.search.baseline.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np

from rmjax import checks
from rmjax.checks import setting
from rmjax.errors import UsageError
from rmjax.parallel.distributed import to_host
from rmjax.scoring import prior as prior_lib
from rmjax.search import turns
from rmjax.search.budget import BudgetSpent
from rmjax.search.gcg_config import GCGConfig
from rmjax.search.gcg_swaps import RetokenizationCheck, sample_candidates, survives, swap_scores
from rmjax.search.objective import Objective
from rmjax.search.terms import Values

BUFFER_TRIES = 4  # buffer entries a step tries before the search counts as stuck


@dataclasses.dataclass(frozen=True)
class FluentConfig:
    num_tokens: int = setting(8, "Response length N in tokens.")
    samples: int = setting(32, "Prior samples among the starts (at least).")
    sample_share: float = setting(0.25, "At λ > 0 (or exploring), the share of the budget the starts' prior "
                                        "samples may take.")
    beam: int = setting(4, "Partials the start beam keeps per level (K).")
    proposals: int = setting(8, "The prior's top next tokens proposed per partial (beam) and per position (GCG).")
    exact_limit: int = setting(1024, "A candidate set this small is searched exactly (every token at a position).")
    search_width: int = setting(64, "Candidates per GCG step.")
    resamples: int = setting(8, "Tails per GCG step redrawn from the prior after a random position of the current "
                                 "sequence (fluent moves the gradient does not propose).")
    explore: bool = setting(True, "At λ = 0 too, the prior proposes swaps and tails (one prior forward a GCG step, "
                                  "free when the RM is its own prior; J does not read it): exploration where the "
                                  "gradient alone stalls.")
    topk: int = setting(64, "Swaps per position by gradient.")
    merges: int = setting(4, "A GCG step's improving swaps (at different positions) applied together, up to this "
                             "many; 0 or 1: none merged.")
    buffer_size: int = setting(8, "Best sequences GCG keeps.")
    start_share: float = setting(0.4, "Share of the budget the starts (samples and beam) may spend.")
    temperature: float = setting(1.0, "Sampling temperature of the prior's starts and tails.")
    best_of_n_temperatures: tuple[float, ...] = setting((0.7, 1.0), "Best-of-N draws equal shares of its samples "
                                                                    "at each of these temperatures.")
    seed: int = setting(0, "Random seed.")

    def __post_init__(self):
        object.__setattr__(self, "best_of_n_temperatures", tuple(float(t) for t in self.best_of_n_temperatures))
        checks.validate(self, {"resamples": checks.NON_NEGATIVE, "merges": checks.NON_NEGATIVE}
                        | {n: checks.POSITIVE for n in ("num_tokens", "samples", "beam", "proposals", "search_width",
                                                        "topk", "buffer_size", "temperature")}
                        | {"best_of_n_temperatures": (lambda v: len(v) > 0 and all(t > 0 for t in v),
                                                      "positive temperatures")}
                        | {"start_share": (lambda v: 0 < v < 1, "a share in (0, 1)"),
                           "sample_share": (lambda v: 0 <= v < 1, "a share in [0, 1)"),
                           "exact_limit": checks.NON_NEGATIVE,
                           "seed": (lambda v: 0 <= v < 2**32, "an integer in [0, 4294967295]")})
        if self.sample_share >= self.start_share:  # the samples would spend the starts' share: no beam, unsaid
            raise UsageError(f"--sample_share={self.sample_share} must be below --start_share={self.start_share}: "
                             "both are shares of the whole budget, and the start beam spends what the samples leave "
                             "of the starts' share.")

    def gcg(self, **settings) -> GCGConfig:
        """The GCG settings its swaps and filter read (candidate set, tokens allowed, re-tokenization filter)."""
        return GCGConfig(num_tokens=self.num_tokens, search_width=self.search_width, topk=self.topk,
                         buffer_size=self.buffer_size, seed=self.seed, **settings)


@dataclasses.dataclass
class Found:
    """Every sequence a method evaluated (distinct, in order), their terms, the forwards spent and the history of
    the best J against forwards."""

    ids: np.ndarray  # [W, N]
    values: Values
    spent: Fraction
    history: list[tuple[float, float, list[int]]]  # (forwards, best J, best ids) after each scoring call
    converged: bool = False  # stopped before the budget: no sequence evaluated had a new neighbour to propose

    def best(self, k: int) -> np.ndarray:
        """Indices of the k highest J, ties to the earlier."""
        return np.lexsort((np.arange(len(self.ids)), -self.values.objective))[:k]


class _Archive:
    def __init__(self, forwards):
        self.forwards, self.index = forwards, {}
        self.ids, self.terms, self.history = [], [], []

    def add(self, cands: np.ndarray, v: Values) -> None:
        for i, row in enumerate(np.asarray(cands).tolist()):
            if tuple(row) not in self.index:
                self.index[tuple(row)] = len(self.ids)
                self.ids.append(row)
                self.terms.append((v.reward[i], v.prior_logp[i], v.repetition[i], v.objective[i]))
        best = max(range(len(self.ids)), key=lambda i: (self.terms[i][3], -i))
        self.history.append((float(self.forwards.spent), float(self.terms[best][3]), self.ids[best]))

    def found(self, n: int) -> Found:
        cols = np.asarray(self.terms, np.float64).reshape(-1, 4)
        return Found(np.asarray(self.ids, np.int64).reshape(-1, n), Values(*cols.T), self.forwards.spent,
                     self.history)


def fluent_search(objective: Objective, cfg: FluentConfig, banned: np.ndarray,
                  retokenize: list[RetokenizationCheck], progress: Callable[[tuple], None] | None = None,
                  seeds: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> Found:
    """The search (module docstring) until the budget is spent or every neighbour of the buffer was evaluated;
    `progress(latest)` after each scoring call, with (forwards spent, best J, its ids). `seeds` (ids [S, N], their
    rewards and mean prior log-probs, found and paid for by another search) join the archive first, free."""
    forwards, n = objective.forwards, cfg.num_tokens
    archive, seen = _Archive(forwards), set()
    if seeds is not None and len(seeds[0]):
        ids, reward, logp = (np.asarray(a) for a in seeds)
        keep = _fresh(ids, retokenize, seen, objective.end)
        if keep.any():
            archive.add(ids[keep], objective.values(reward[keep], logp[keep], ids[keep]))
    allowed = np.flatnonzero(~banned)
    exact = len(allowed) <= cfg.exact_limit
    limit, forwards.limit = forwards.limit, min(forwards.limit, forwards.spent + Fraction(cfg.start_share) *
                                                forwards.limit)
    before = forwards.spent
    try:
        _sample_starts(objective, cfg, banned, retokenize, archive, seen, limit, exact)
        _beam_starts(objective, cfg, banned, allowed, exact, retokenize, archive, seen, progress)
    except BudgetSpent:
        pass
    finally:
        forwards.limit = limit
    if not archive.ids:
        # drawn but every one left out (helper-144: a disagreement keeps only texts both sides read back)
        why = (f"it drew responses ({float(forwards.spent - before):.0f} forwards), and every one was left out: a "
               "repeat, or a response that does not come back from its text as the same tokens (for a "
               "disagreement: in both sides' templates)" if forwards.spent > before else
               f"it buys none of them ({cfg.samples} samples and a beam of {cfg.beam})")
        raise UsageError(f"--forwards={forwards.limit} does not buy the search's starts: {why}; give a larger "
                         f"budget, e.g. --forwards={2 * int(forwards.limit)}.")
    converged = False
    try:
        converged = _gcg(objective, cfg, banned, allowed, exact, retokenize, archive, seen, progress)
    except BudgetSpent:
        pass
    return dataclasses.replace(archive.found(n), converged=converged)


def _sample_starts(objective: Objective, cfg: FluentConfig, banned, retokenize, archive: _Archive, seen,
                   budget: int, exact: bool) -> None:
    """--samples prior samples; at λ > 0 (or exploring, outside exact mode) as many as sample_share of the budget
    buys, if more (the fluent starts)."""
    prior, n, forwards, end = objective.prior, cfg.num_tokens, objective.forwards, objective.end
    own = objective.rm_is_prior  # the sampler's forward is the scoring one, as best-of-N's (baseline._round)
    per_sample = forwards.cost(n + objective.tail, 0 if own else n + 1, objective.other_each)  # at most: N tokens
    count = cfg.samples
    if objective.uses_prior or (cfg.explore and not exact):
        count = max(count, int(Fraction(cfg.sample_share) * budget // per_sample))
    count = min(count, int(forwards.left // per_sample))  # what the starts' share has left
    if count == 0:
        return
    forwards.charge(count * (n + objective.tail) if own else 0, 0 if own else count * (n + 1))
    cache, at = objective.sampling_cache(n)
    ids, lps = prior_lib.sample_responses(prior.model, cache, prior.first, banned, count, n, cfg.seed,
                                          cfg.temperature, end=end, at=at)
    ids = turns.canonical(ids, end)
    keep = _fresh(ids, retokenize, seen, end)
    if not keep.any():
        return
    ids, known = ids[keep], turn_fluency(lps[keep], ids[keep], end)
    if own:
        forwards.charge(0, 0, objective.partner_forwards(ids))
        archive.add(ids, objective.score_paid(ids, known))
    else:
        archive.add(ids, objective.score(ids, known_logp=known))


def turn_fluency(lps: np.ndarray, ids: np.ndarray, end: int, head: float | np.ndarray = 0.0, kept: int = 0
               ) -> np.ndarray:
    """F's log-prob term of whole turns [W, N] (turns.fluency_log_prob) from a sampler's log-probs of their slots
    after the first `kept` (prior.sample_responses with `end`: [W, N − kept + 1], the end of turn's included) and
    the kept tokens' summed log-prob `head`."""
    size = turns.lengths(ids, end)
    lps = lps.astype(np.float64)
    at_end = lps[np.arange(len(lps)), size - kept]
    tokens = head + np.where(np.arange(lps.shape[1])[None] < (size - kept)[:, None], lps, 0.0).sum(axis=1)
    return tokens / size + at_end


def _fresh(cands: np.ndarray, retokenize, seen: set, end: int) -> np.ndarray:
    """Mask of the first occurrence of each candidate (a whole turn of at least one token) not seen before that
    passes the re-tokenization filter; they join `seen`."""
    keep = np.zeros(len(cands), bool)
    for i, row in enumerate(np.asarray(cands).tolist()):
        body = turns.tokens(row, end)
        if body and tuple(row) not in seen and all(survives(c, body) for c in retokenize):
            seen.add(tuple(row))
            keep[i] = True
    return keep


def _beam_starts(objective: Objective, cfg: FluentConfig, banned, allowed, exact: bool, retokenize,
                 archive: _Archive, seen, progress) -> None:
    """Level by level: each kept partial extended by every allowed token (exact) or the prior's top proposals,
    those that pass the checks (re-tokenization; a disagreement's other side) scored, the K best by J kept. Every
    level's sequences are whole turns of their length: they join the archive."""
    n, partials, end = cfg.num_tokens, np.zeros((1, 0), np.int64), objective.end
    banned_on_device = jnp.asarray(banned)
    for depth in range(1, n + 1):
        if exact:
            tokens = np.broadcast_to(allowed, (len(partials), len(allowed)))
        else:
            lp = objective.next_token_log_probs(partials)[:, : len(banned)]
            tokens = to_host(jax.lax.top_k(jnp.where(banned_on_device[None], -jnp.inf, lp), cfg.proposals)[1])
        cands = np.concatenate([np.repeat(partials, tokens.shape[1], axis=0), tokens.reshape(-1, 1)], axis=1)
        passes = np.asarray([all(survives(c, row.tolist()) for c in retokenize) for row in cands], bool)
        cands = cands[passes]  # a partial that fails a check is neither scored nor extended
        if not len(cands):
            return
        whole = turns.from_turns(cands, n, end)
        if depth < n:
            values = objective.score_partials(cands)
            keep = _fresh(whole, retokenize, seen, end)
            if keep.any():
                archive.add(whole[keep], values.take(keep))
        else:
            cands = cands[_fresh(whole, retokenize, seen, end)]
            if not len(cands):
                return
            values = objective.score(cands)
            archive.add(cands, values)
        partials = cands[np.lexsort((np.arange(len(cands)), -values.objective))[: cfg.beam]]
        if progress and archive.history:
            progress(archive.history[-1])


def _gcg(objective: Objective, cfg: FluentConfig, banned, allowed, exact: bool, retokenize, archive: _Archive,
         seen, progress) -> bool:
    """GCG steps, each from the best sequence evaluated so far that still has a candidate to give, until the
    budget is spent (BudgetSpent) or none has (True). A sequence none of whose proposals is new is passed over from
    then on: exact mode moves down the archive (coordinate ascent from the next start), gradient mode tries at most
    BUFFER_TRIES entries a step."""
    gcg_cfg = cfg.gcg(n_replace=1)
    banned_on_device, key, n = jnp.asarray(banned), jax.random.key(cfg.seed), cfg.num_tokens
    position, spent = 0, set()  # exact mode: the next position to sweep; sequences with nothing left to give
    for step in range(10**9):
        found = archive.found(n)
        order = [i for i in found.best(len(found.ids)) if tuple(found.ids[i].tolist()) not in spent]
        for attempt, index in enumerate(order if exact else order[:BUFFER_TRIES]):
            current = found.ids[index].astype(np.int32)
            if exact:
                cands = None
                for shift in range(n):
                    p = (position + shift) % n
                    swaps = _coordinate(current, p, allowed, objective.end)
                    keep = _fresh(swaps, retokenize, seen, objective.end)
                    if keep.any():
                        cands, position = swaps[keep], (p + 1) % n
                        break
                if cands is None:
                    spent.add(tuple(current.tolist()))
                    continue
                extended, every = objective.extended_cache(current), None
            else:
                loss, extended, every = objective.gradient(current, cfg.explore)  # λ = 0, no explore: None
                objective.check_gradient(loss, banned_on_device, current)  # NaN/Inf: refused, or counted
                step_key = jax.random.fold_in(key, step * BUFFER_TRIES + attempt)
                cands = _whole(_proposals(turns.turn(current, objective.end), loss, every, banned_on_device, gcg_cfg,
                                          cfg, step_key), current, objective.end)
                cands = np.unique(np.concatenate([cands, turns.moves(current, objective.end)]), axis=0)
                cands = cands[_fresh(cands, retokenize, seen, objective.end)]
                if not len(cands):
                    spent.add(tuple(current.tolist()))
                    continue
            screen = objective.screen if objective.partner is not None else 0
            cands = _affordable(objective, cands, current, every, screen=screen)
            if screen:
                kept, values = objective.score_screened(cands, screen, current, extended, every=every)
                cands = cands[kept]
            else:
                values = objective.score(cands, current, extended, every=every)
            archive.add(cands, values)
            if not exact and cfg.merges:
                _merge_improvements(objective, cfg, current, found.values.objective[index], cands, values, extended,
                                    every, retokenize, archive, seen)
            if every is not None and cfg.resamples:
                _resample_tails(objective, cfg, current, every, extended, banned, retokenize, archive, seen, step)
            if progress:
                progress(archive.history[-1])
            break
        else:
            if exact or len(order) <= BUFFER_TRIES:
                return True  # nothing evaluated so far has a new neighbour to propose


def _coordinate(current: np.ndarray, p: int, allowed: np.ndarray, end: int) -> np.ndarray:
    """Exact mode's step at slot p of a whole turn of L tokens: every allowed token there (at p = L: one more token
    before the end), and the turn cut at p and without its token p."""
    size = int(turns.lengths(current[None], end)[0])
    if p > size:
        return np.zeros((0, len(current)), np.int32)
    swaps = np.repeat(current[None], len(allowed), axis=0)
    swaps[:, p] = allowed
    body = turns.tokens(current, end)
    shorter = [body[:p], body[:p] + body[p + 1 :]] if p < size else []
    return np.concatenate([swaps, turns.from_turns([t for t in shorter if t], len(current), end)])


def _whole(proposals: np.ndarray, current: np.ndarray, end: int) -> np.ndarray:
    """Swaps of current's turn form [W, L + 1] as N-slot whole turns: a swap at the end of turn's slot puts one
    more token before it (none past N)."""
    n, size = len(current), proposals.shape[1] - 1
    grown = proposals[:, size] != end
    if size == n:
        proposals = proposals[~grown]
    return turns.from_turns(proposals, n, end)


def _merge_improvements(objective: Objective, cfg: FluentConfig, current: np.ndarray, current_j: float,
                        cands: np.ndarray, values: Values, extended, every, retokenize, archive: _Archive, seen
                        ) -> None:
    """Swaps that each raised J, at different positions, applied together: the best two, the best three, ... up
    to `merges` (I-GCG's multi-coordinate update; the best alone was scored already). A step whose single swaps
    improve at several positions takes them all at once instead of one (scored, not assumed to add up)."""
    swaps: dict[int, int] = {}  # position -> the token of the best improving swap there, best swap first
    for i in np.lexsort((np.arange(len(cands)), -values.objective)).tolist():
        if values.objective[i] <= current_j or len(swaps) == cfg.merges:
            break
        changed = np.flatnonzero(cands[i] != current)
        if len(changed) == 1 and int(changed[0]) not in swaps:
            swaps[int(changed[0])] = int(cands[i, changed[0]])
    merged, row = [], current.copy()
    for k, (p, token) in enumerate(swaps.items()):
        row = row.copy()
        row[p] = token
        if k:
            merged.append(row)
    if not merged:
        return
    merged = turns.canonical(np.asarray(merged), objective.end)  # a cut and a swap after it: one turn
    merged = merged[_fresh(merged, retokenize, seen, objective.end)]
    if len(merged):
        merged = _affordable(objective, merged, current, every)
        archive.add(merged, objective.score(merged, current, extended, every=every))


def _proposals(current, loss, every, banned, gcg_cfg: GCGConfig, cfg: FluentConfig, key) -> np.ndarray:
    """Single swaps: from the gradient's top-k (GCG), and, with the prior's log-probs at every position
    (`every`), half of them to the prior's top next tokens there."""
    grad_key, prior_key = jax.random.split(key)
    width = cfg.search_width if every is None else cfg.search_width - cfg.search_width // 2
    score = swap_scores(loss[:, : len(banned)], banned, jnp.asarray(current), None, 0.0)
    cands = sample_candidates(current, score, dataclasses.replace(gcg_cfg, search_width=width), grad_key)
    if every is None:
        return cands
    top = jax.lax.top_k(jnp.where(banned[None], -jnp.inf, every[:, : len(banned)]), cfg.proposals)[1]
    where_key, which_key = jax.random.split(prior_key)
    count = cfg.search_width - width
    positions = jax.random.randint(where_key, (count,), 0, len(current))
    choice = jax.random.randint(which_key, (count,), 0, cfg.proposals)
    swaps = jnp.tile(jnp.asarray(current), (count, 1)).at[jnp.arange(count), positions].set(top[positions, choice])
    return np.concatenate([cands, to_host(swaps).astype(cands.dtype)])


def _resample_tails(objective: Objective, cfg: FluentConfig, current: np.ndarray, every, extended, banned,
                    retokenize, archive: _Archive, seen, step: int) -> None:
    """`resamples` responses that keep current's first j tokens (j drawn per step) and draw the rest from the prior,
    scored from their first change; their log-probs are the sampler's and current's own (`every`), so the prior
    runs only to draw (and, when it is not the RM, to extend its cache by the j kept tokens). Drawn by the RM as its
    own prior, a tail costs its sampler's forward (n − j + S RM positions: the reward's but the suffix, as a start
    does), and its score is that forward's."""
    prior, n, end = objective.prior, len(current), objective.end
    j = int(np.random.default_rng([cfg.seed, step]).integers(0, turns.lengths(current[None], end)[0]))
    cache, at = objective.sampling_cache(n, current, j, extended)
    own_prior, count = objective.rm_is_prior, cfg.resamples
    if own_prior:  # as many as the budget left buys
        count = min(count, int(objective.forwards.left // objective.forwards.cost(n - j + objective.tail)))
        if not count:
            raise BudgetSpent
        objective.forwards.charge(count * (n - j + objective.tail))
    else:
        objective.forwards.charge(0, count * (n - j + 1))
    tails, lps = prior_lib.sample_responses(prior.model, cache, every[j], banned, count, n - j,
                                            (cfg.seed * 1_000_003 + step) % 2**32, cfg.temperature, end=end,
                                            end_from=0 if j else 1, at=at, steps=n)
    cands = turns.canonical(np.concatenate([np.repeat(current[None, :j], len(tails), axis=0), tails], axis=1), end)
    kept_logp = float(to_host(every[np.arange(j), current[:j]]).astype(np.float64).sum())  # j entries, not [L + 1, V]
    keep = _fresh(cands, retokenize, seen, end)
    if keep.any():
        cands, known = cands[keep], turn_fluency(lps[keep], cands[keep], end, kept_logp, j)
        fits = len(_affordable(objective, cands, current, None, known=True, paid=own_prior))
        archive.add(cands[:fits], objective.score(cands[:fits], current, extended, known_logp=known[:fits],
                                                  paid=own_prior))


def _affordable(objective: Objective, cands: np.ndarray, current: np.ndarray, every, known: bool = False,
                screen: int = 0, paid: bool = False) -> np.ndarray:
    """The leading candidates whose scoring fits the budget left (`screen`: the other side scores at most that many
    of them, Objective.score_screened); BudgetSpent when not even one does."""
    left, forwards = objective.forwards.left, objective.forwards
    totals = np.cumsum(objective.cost(cands, current, every, known, partner=not screen, paid=paid))
    if screen:
        totals = [t + forwards.cost(whole=min(screen, i + 1) * objective.other_each) for i, t in enumerate(totals)]
    fits = sum(1 for total in totals if total <= left)  # the sums only grow
    if fits == 0:
        raise BudgetSpent
    return cands[:fits]
