"""The searches' baseline: best-of-N from the prior at the same forwards budget, ranked by the same J
(rmjax.search.objective), so a search is compared at equal compute."""

from __future__ import annotations

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


def best_of_n(objective: Objective, cfg: FluentConfig, banned: np.ndarray, retokenize: Sequence = ()) -> Found:
    """As many prior samples as the budget left buys, whole turns drawn in equal shares at each of
    `best_of_n_temperatures`, ranked by J; samples may repeat (each was paid for). A sample costs one RM forward
    when the RM is its own prior (the sampler's forward holds every position the reward reads but the suffix's),
    else one prior forward to draw it and its RM positions to score it; with a partner, its forwards too. With a
    disagreement's `screen` (the search's): the partner scores only the best screen/search_width share of the
    samples by this side's part of J, as a screened GCG step does, so the budget buys more samples. Samples that fail a
    `retokenize` check (a disagreement: the round trip in both sides) are not returned; screened, they are dropped
    before ranking, unscored."""
    forwards, n, end = objective.forwards, cfg.num_tokens, objective.end
    full = n + objective.tail
    own = objective.rm_is_prior
    each = objective.other_each  # a disagreement's other side: its forwards, charged by `score` unless own
    screen = objective.screen if objective.partner is not None else 0
    share = min(Fraction(screen, cfg.search_width), Fraction(1)) if screen else Fraction(1)
    mine = forwards.cost(full, 0) if own else forwards.cost(full, n + 1)
    count = int(forwards.left // (mine + share * each))
    while count and count * mine + math.ceil(count * share) * each > forwards.left:  # the kept share rounds up
        count -= 1
    if count == 0:
        raise UsageError(f"--forwards={forwards.limit} buys no best-of-N sample; give a larger budget.")
    forwards.charge(count * full if own else 0, 0 if own else count * (n + 1), count * each if own and not screen
                    else 0)
    temperatures = cfg.best_of_n_temperatures
    shares = [count // len(temperatures) + (k < count % len(temperatures)) for k in range(len(temperatures))]
    ids, lps = [], []
    for k, (drawn_here, temperature) in enumerate(zip(shares, temperatures, strict=True)):
        drawn, lp = prior_lib.sample_responses(objective.prior.model, objective.prior.cache, objective.prior.first,
                                               banned, drawn_here, n, cfg.seed + 1 + k, temperature, end=end)
        ids.append(turns.canonical(drawn, end))
        lps.append(lp)
    ids, lps = np.concatenate(ids), np.concatenate(lps)
    known = turn_fluency(lps, ids, end)
    # only texts that pass every check (a disagreement: the round trip in both sides) count; unscreened, every
    # sample was scored (and paid for) as drawn; screened, the unreadable are dropped first, so the kept share goes
    # to texts the partner can score
    readable = np.asarray([all(survives(c, turns.tokens(row, end)) for c in retokenize) for row in ids.tolist()],
                          bool)
    if screen:
        ids, known = ids[readable], known[readable]
        if len(ids):
            kept, values = objective.score_screened(ids, math.ceil(count * share), known_logp=known, paid=own)
            ids = ids[kept]
        else:
            values = objective.values(np.zeros(0), np.zeros(0), ids)
    else:
        values = objective.score_paid(ids, known) if own else objective.score(ids, known_logp=known)
        ids, values = ids[readable], values.take(readable)
    if not len(ids):  # nothing to write: the job says so
        return Found(ids.astype(np.int64), values, forwards.spent, [])
    best = int(np.lexsort((np.arange(len(ids)), -values.objective))[0])
    return Found(ids.astype(np.int64), values, forwards.spent,
                 [(float(forwards.spent), float(values.objective[best]), ids[best].tolist())])
