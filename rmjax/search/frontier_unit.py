"""A frontier unit, (prompt, direction, method, λ) and what it found, and its one-chunk form in the store: a kill
leaves a whole unit or none, and a unit read back is held to the run's finiteness rule as a fresh one is; and which
of a search's rows a unit keeps (`search_rows`, the disagreement search's too), its seed and progress label."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from rmjax.errors import NonFiniteError
from rmjax.runs.chunks import ChunkStore
from rmjax.scoring import finite
from rmjax.search import frontier_out, pareto, turns

if TYPE_CHECKING:
    from rmjax.search.fluent import Found


@dataclasses.dataclass
class Unit:
    """One (prompt, direction, method, λ) and what it found: ids [W, N], reward, prior log-prob, judge
    perplexity, round trip per row; the forwards it spent and its best-J history. best-of-N keeps every sample
    (λ None: ranked per λ when written)."""

    prompt: str
    direction: str
    method: str
    lam: float | None
    ids: np.ndarray
    reward: np.ndarray
    prior_logp: np.ndarray
    judge_ppl: np.ndarray
    roundtrip: np.ndarray
    forwards: float
    history: np.ndarray  # [H, 2]: forwards, best J
    z: tuple[float, float]  # the reward's mean and SD over single tokens (a Scale when computed, not read back)
    seconds: float = 0.0
    swaps_skipped: int = 0  # swaps of allowed tokens a NaN/Inf gradient entry kept from being proposed
    candidates_dropped: int = 0  # sequences scored with a NaN/Inf term, never kept (Objective._checked)
    end: int = -1  # the end-of-turn id that fills the slots after a shorter response (rmjax.search.turns)

    def texts(self, tokenizer) -> list[str]:
        return turns.decode(tokenizer, self.ids, self.end)

    def meta(self) -> dict:
        return {"prompt": self.prompt, "direction": self.direction, "method": self.method, "lambda": self.lam,
                "rows": len(self.ids), "forwards": self.forwards, "seconds": round(self.seconds, 3)} | (
                frontier_out.nonfinite_record([self]) or {})


def check_terms(tokenizer, u: Unit, allow: bool, what: str) -> None:
    """finite.check of a unit's reward, prior log-prob and judge perplexity (fresh, or read back)."""
    texts = u.texts(tokenizer)
    finite.check(np.stack([u.reward, u.prior_logp, u.judge_ppl], axis=1), what=what, allow=allow,
                 columns=["reward", "prior_logp", "judge_ppl"], row=lambda i: f"response {texts[i]!r}")


def check_counts(u: Unit, allow: bool, path: Path) -> None:
    """A saved unit that dropped NaN/Inf sequences or skipped NaN/Inf gradient swaps (stored with
    --allow_nonfinite) is held to this run's rule, as a fresh unit is (Objective's checks)."""
    if (u.swaps_skipped or u.candidates_dropped) and not allow:
        raise NonFiniteError(f"the {u.method} unit saved in {path} ({u.direction}, λ = {u.lam}) ran with "
                             f"--allow_nonfinite and met NaN/Inf values ({frontier_out.nonfinite_record([u])}). "
                             f"Fix the model, or {finite.ALLOW_HINT}.")


def write_unit(store: ChunkStore, key: str, u: Unit) -> None:
    """A unit as one chunk (one atomic file: a kill leaves the whole unit or none of it): a header row [rows,
    gradient swaps skipped, sequences dropped, NaN…], its rows [ids, reward, prior log-prob, judge perplexity,
    round trip], then [forwards, seconds], the reward's mean and SD and the best-J history, two values a row,
    padded with NaN."""
    columns = np.column_stack([u.ids.astype(np.float64), u.reward, u.prior_logp, u.judge_ppl,
                               u.roundtrip.astype(np.float64)])
    extra = np.vstack([[u.forwards, u.seconds], [*u.z], u.history])
    header = np.full((1, columns.shape[1]), np.nan)
    header[0, :3] = len(columns), u.swaps_skipped, u.candidates_dropped
    padded = np.full((len(extra), columns.shape[1]), np.nan)
    padded[:, :2] = extra
    store.write(key, np.vstack([header, columns, padded]))


def read_unit(store: ChunkStore, key: str, name: str, direction: str, method: str, lam, n: int, end: int) -> Unit:
    """A unit `write_unit` stored; any other array (another layout, another --num_tokens) is refused naming its file."""
    packed = store.load(key)
    ok = packed.dtype == np.float64 and packed.ndim == 2 and packed.shape[0] >= 3 and packed.shape[1] == n + 4
    rows, skipped, dropped = (float(v) for v in packed[0, :3]) if ok else (-1.0, -1.0, -1.0)
    ok = ok and all(v.is_integer() and v >= 0 for v in (rows, skipped, dropped)) and rows <= len(packed) - 3
    if not (ok and np.isnan(packed[0, 3:]).all() and np.isnan(packed[int(rows) + 1:, 2:]).all()):
        raise store.damaged(key, f"is not a frontier unit of this run ({packed.dtype} of shape {packed.shape}, for "
                                 f"responses of {n} tokens)")
    columns, extra = packed[1:int(rows) + 1], packed[int(rows) + 1:, :2]
    return Unit(name, direction, method, lam, columns[:, :n].astype(np.int64), columns[:, n], columns[:, n + 1],
                columns[:, n + 2], columns[:, n + 3].astype(bool), float(extra[0, 0]), extra[2:], tuple(extra[1]),
                float(extra[0, 1]), int(skipped), int(dropped), end)


def unit_label(prompt: str, direction: str, method: str, lam: float | None, index: int, units: int) -> str:
    """What the progress line is running now: `frontier 3/10: greatest optimal, search λ=0.25`."""
    what = f"search λ={lam:g}" if method == "search" else "best-of-N"
    return f"frontier {index + 1}/{units}: {prompt} {direction}, {what}"


def search_seed(seed: int, lam: float, lambdas: tuple[float, ...]) -> int:
    """The seed of λ's search: --seed for the largest λ, a seed drawn from (--seed, its place from the largest)
    for the others, so that each λ's search draws its own prior samples and tails. With one seed for all, each
    search paid to draw and score the samples the searches before it had drawn and scored."""
    place = sorted(lambdas, reverse=True).index(lam)
    return seed if place == 0 else int(np.random.SeedSequence([seed, place]).generate_state(1)[0])


def search_rows(found: Found, top: int, front_rows: int, sign: float, rho: float) -> np.ndarray:
    """The `top` rows by J and up to `front_rows` from the search's own Pareto layers over every sequence it
    evaluated (sign·reward vs fluency F = prior log-prob − ρ·repetition; all must know F), best J first. The
    search's answer is a frontier, as EPO's is: best-of-N offers all its samples, the search its front and the
    layers behind it, since the judge, another LM, does not rank fluency as the prior does."""
    v = found.values
    rows = [i for i in found.best(top).tolist() if np.isfinite(v.objective[i])]  # none dropped (--allow_nonfinite)
    if front_rows:
        fluency = v.prior_logp - rho * v.repetition
        rows += [i for i in pareto.layers(sign * v.reward, -fluency, front_rows).tolist() if i not in rows]
    return np.asarray(sorted(rows, key=lambda i: (-v.objective[i], i)), np.int64)
