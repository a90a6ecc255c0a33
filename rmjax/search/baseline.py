"""The searches' baseline: best-of-N from the prior at the same forwards budget, ranked by the same J
(rmjax.search.objective), so a search is compared at equal compute."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from fractions import Fraction

import numpy as np

from rmjax.errors import UsageError
from rmjax.scoring import prior as prior_lib
from rmjax.search import turns
from rmjax.search.fluent import FluentConfig, Found, turn_fluency
from rmjax.search.gcg_swaps import survives
from rmjax.search.objective import Objective
from rmjax.search.terms import Values

SAMPLER_ROWS = 64  # prior_lib.sample_responses' batch: larger counts run in batches of it


def best_of_n(objective: Objective, cfg: FluentConfig, banned: np.ndarray, retokenize: Sequence = ()) -> Found:
    """As many prior samples as the budget left buys, whole turns drawn in equal shares at each of
    `best_of_n_temperatures`, ranked by J; samples may repeat (each draw was paid for; a partner scores a text once,
    and is paid once for it, as for the search's candidates). A sample costs one RM forward
    when the RM is its own prior (the sampler's forward holds every position the reward reads but the suffix's),
    else one prior forward to draw it and its RM positions to score it; with a partner, its forwards too. With a
    disagreement's `screen` (the search's): the partner scores only the best screen/search_width share of the
    samples by this side's part of J, as a screened GCG step does, so the budget buys more samples. Samples that fail a
    `retokenize` check (a disagreement: the round trip in both sides) are not returned; screened, they are dropped
    before ranking, unscored. A sample is priced as a whole N-token turn before it is drawn, and a shorter one is
    charged its own length: what a round leaves buys another round, until no sample fits (equal compute)."""
    forwards = objective.forwards
    screen = objective.screen if objective.partner is not None else 0
    share = min(Fraction(screen, cfg.search_width), Fraction(1)) if screen else Fraction(1)
    ids, values = [], []
    for round_ in range(1 << 20):
        count = _affordable(objective, cfg, share)
        if count == 0:
            if round_ == 0:
                raise UsageError(f"--forwards={forwards.limit} buys no best-of-N sample; give a larger budget.")
            break
        # below a sampler batch, a power of two: the rounds' small counts share a few compiled sampler shapes (each
        # count its own rows compiled the sampler again, a few seconds each); what is left goes to the next round
        count = count if count >= SAMPLER_ROWS else 1 << (count.bit_length() - 1)
        drawn, scored = _round(objective, cfg, banned, retokenize, count, share, round_)
        ids.append(drawn)
        values.append(scored)
    ids = np.concatenate(ids).astype(np.int64)
    values = Values.joined(values)
    if not len(ids):  # nothing to write: the job says so
        return Found(ids, values, forwards.spent, [])
    best = int(np.lexsort((np.arange(len(ids)), -values.objective))[0])
    return Found(ids, values, forwards.spent, [(float(forwards.spent), float(values.objective[best]),
                                                ids[best].tolist())])


def _affordable(objective: Objective, cfg: FluentConfig, share: Fraction) -> int:
    """How many whole N-token samples the budget left pays for (the partner's kept share rounds up)."""
    forwards, n = objective.forwards, cfg.num_tokens
    full, each = n + objective.tail, objective.other_each
    mine = forwards.cost(full, 0) if objective.rm_is_prior else forwards.cost(full, n + 1)
    count = int(forwards.left // (mine + share * each))
    while count and count * mine + math.ceil(count * share) * each > forwards.left:
        count -= 1
    return count


def sample_seed(seed: int, temperature_index: int, round_: int) -> int:
    """The seed of one temperature's share of one round: its own stream (seed + 1 + k drew what the search's starts
    at --seed=seed+1+k drew, so runs at nearby seeds shared samples: not independent replicates)."""
    return int(np.random.SeedSequence([seed, 0x626F6E, temperature_index, round_]).generate_state(1)[0])


def _round(objective: Objective, cfg: FluentConfig, banned: np.ndarray, retokenize: Sequence, count: int,
           share: Fraction, round_: int) -> tuple[np.ndarray, Values]:
    """`count` samples drawn, paid for and scored; those every `retokenize` check reads back (ids, values)."""
    forwards, n, end = objective.forwards, cfg.num_tokens, objective.end
    full, own = n + objective.tail, objective.rm_is_prior
    screen = objective.screen if objective.partner is not None else 0
    forwards.charge(count * full if own else 0, 0 if own else count * (n + 1), 0)  # the partner's: below
    temperatures = cfg.best_of_n_temperatures
    # equal shares; the remainder goes to another temperature each round
    shares = [count // len(temperatures) + ((k - round_) % len(temperatures) < count % len(temperatures))
              for k in range(len(temperatures))]
    ids, lps = [], []
    cache, at = objective.sampling_cache(n)  # the search's sampler program
    for k, (drawn_here, temperature) in enumerate(zip(shares, temperatures, strict=True)):
        if not drawn_here:
            continue
        drawn, lp = prior_lib.sample_responses(objective.prior.model, cache, objective.prior.first, banned,
                                               drawn_here, n, sample_seed(cfg.seed, k, round_), temperature,
                                               end=end, at=at)
        ids.append(turns.canonical(drawn, end))
        lps.append(lp)
    ids, lps = np.concatenate(ids), np.concatenate(lps)
    known = turn_fluency(lps, ids, end)
    # only texts that pass every check (a disagreement: the round trip in both sides) are scored and paid for, as
    # the search scores only those: the sample's own forward (the RM as its prior) is spent already; a separate
    # RM's positions and the partner's forwards are not, and what they save buys the next round
    readable = np.asarray([all(survives(c, turns.tokens(row, end)) for c in retokenize) for row in ids.tolist()],
                          bool)
    ids, known = ids[readable], known[readable]
    if not len(ids):
        return ids, Values.joined([])
    if screen:
        kept, values = objective.score_screened(ids, math.ceil(count * share), known_logp=known, paid=own)
        return ids[kept], values
    if own:
        forwards.charge(0, 0, objective.partner_forwards(ids))
        return ids, objective.score_paid(ids, known)
    return ids, objective.score(ids, known_logp=known)


def distinct_samples(found: Found) -> Found:
    """Each sample once (its first draw): a table of best rows filled with one text's repeats showed fewer of
    best-of-N's finds than of the search's (whose archive is distinct)."""
    if not len(found.ids):
        return found
    _, first = np.unique(found.ids, axis=0, return_index=True)
    keep = np.sort(first)
    return dataclasses.replace(found, ids=found.ids[keep], values=found.values.take(keep))
