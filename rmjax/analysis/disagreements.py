"""One disagreement job run at several --seed values (`analyze --disagreements=DIR,DIR…`): per prompt, direction
and view, how far the search's best row went beyond best-of-N's at the same forwards, over the runs, with a 95% t
interval. One run's win can be its seed's luck; a method is ahead where the interval is.

Each run's best rows are the job's own summary (its .meta.json: the largest gap by direction at judge perplexity
≤ the cap, and among complete answers). The runs must be one job but for the seed: the same sides (weights and
tokenizers), prompts, budget and settings, each seed once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from rmjax.analysis.files import Outputs, markdown
from rmjax.errors import MissingFileError, UsageError
from rmjax.runs import results
from rmjax.runs.identities import without_typed_paths

VIEWS = ("at_cap", "complete")  # the job's summary: every row under the judge cap; complete answers only
DIRECTIONS = ("a_over_b", "b_over_a")
GOAL_SD = 3.0  # issue 46: the search's best row at least this far apart, and ahead of best-of-N
# in the order the CSV has them (analysis tables write their key columns, text and counts, before the values)
COLUMNS = ["prompt", "direction", "view", "runs", "paired", "search_ahead", "goal_met", "search_gap", "best_of_n_gap",
           "advantage", "ci_low", "ci_high"]


@dataclasses.dataclass(frozen=True)
class DisagreementRun:
    folder: str
    seed: int
    identity: dict
    summary: dict


def load_runs(folders: Sequence[str]) -> list[DisagreementRun]:
    """Every folder's finished disagreement job, checked to be one job at distinct seeds; refused in one line."""
    runs = []
    for folder in folders:
        path = Path(folder) / "disagree.csv"
        meta = results.read_meta(path) if path.is_file() else None
        map_meta = results.read_meta(Path(folder) / "vocab_map.csv") if not path.exists() else None
        if (((map_meta or {}).get("identity") or {}).get("config") or {}).get("search") is False:  # --nosearch's
            raise UsageError(f"--disagreements={folder}: the job ran no search (--nosearch: a vocabulary map "
                             "alone); nothing to compare.")
        if not meta or meta.get("kind") != "disagree" or not isinstance(meta.get("summary"), dict):
            raise MissingFileError(f"--disagreements={folder}: no finished disagreement job there (disagree.csv and "
                                   f"its .meta.json); run experiments.disagree --out={folder} first.")
        identity = meta.get("identity") or {}
        runs.append(DisagreementRun(str(folder), int((identity.get("search") or {}).get("seed", 0)), identity,
                                    meta["summary"]))
    if len(runs) < 2:
        raise UsageError("--disagreements: give at least two runs of one job at different --seed values.")
    first = runs[0]
    for run in runs[1:]:
        differs = _differences(*(without_typed_paths(_without_seed(r.identity)) for r in (first, run)))
        if differs:
            raise UsageError(f"--disagreements: {run.folder} differs from {first.folder} in {', '.join(differs)}; "
                             "compare runs of one job that differ only in --seed.")
    seeds = [run.seed for run in runs]
    if len(set(seeds)) < len(seeds):
        twice = sorted({s for s in seeds if seeds.count(s) > 1})
        raise UsageError(f"--disagreements: seed {twice[0]} is given twice; each run must be its own seed (the same "
                         "seed repeats the same search).")
    if not any(d in entry for entry in first.summary.values() for d in DIRECTIONS):
        raise UsageError(f"--disagreements={first.folder}: the job ran no search (--nosearch); nothing to compare.")
    return runs


def _without_seed(identity: dict) -> dict:
    search = {k: v for k, v in (identity.get("search") or {}).items() if k != "seed"}
    return {**identity, "search": search}


def _differences(a: dict, b: dict) -> list[str]:
    """The keys (one level into dicts: config.forwards) whose values differ."""
    out = []
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key), b.get(key)
        if isinstance(x, dict) and isinstance(y, dict):
            out += [f"{key}.{k}" for k in sorted(set(x) | set(y)) if x.get(k) != y.get(k)]
        elif x != y:
            out.append(key)
    return out


def seed_table(runs: Sequence[DisagreementRun]) -> pd.DataFrame:
    """Per prompt, direction and view: the runs where a method that ran has a best row (`runs`), and where both
    have one (`paired`); the paired runs' mean gaps and the search's advantage (its gap beyond best-of-N's in the
    direction's sense, in SD: > 0 the search went further) with its 95% t interval; in how many runs the search was
    ahead, and met the goal (≥ GOAL_SD and ahead). A run where one method wrote no row under the cap and the other
    did counts for the other, as the job's own summary says (dropped, a search with no answer was no loss)."""
    rows = []
    for prompt, direction, view in _cells(runs):
        sign = 1.0 if direction == "a_over_b" else -1.0
        cells = [cell for cell in _outcomes(runs, prompt, direction, view) if cell is not None]
        pairs = np.asarray([(s["gap"], b["gap"]) for s, b in cells if s and b], np.float64).reshape(-1, 2)
        alone = [s["gap"] for s, b in cells if s and not b]  # best-of-N ran and wrote no row here
        advantage = sign * (pairs[:, 0] - pairs[:, 1])
        low, high = t_interval(advantage)
        rows.append({"prompt": prompt, "direction": direction, "view": view, "runs": len(cells),
                     "paired": len(pairs), "search_gap": _mean(pairs[:, 0]),
                     "best_of_n_gap": _mean(pairs[:, 1]), "advantage": _mean(advantage), "ci_low": low,
                     "ci_high": high, "search_ahead": int((advantage > 0).sum()) + len(alone),
                     "goal_met": int(((advantage > 0) & (sign * pairs[:, 0] >= GOAL_SD)).sum())
                     + sum(sign * gap >= GOAL_SD for gap in alone)})
    return pd.DataFrame(rows, columns=COLUMNS)


def _cells(runs: Sequence[DisagreementRun]) -> list[tuple[str, str, str]]:
    """(prompt, direction, view) of every cell the runs searched, in the summary's order."""
    return [(prompt, direction, view) for prompt, entry in runs[0].summary.items()
            for direction in DIRECTIONS if direction in entry for view in VIEWS]


def _outcomes(runs: Sequence[DisagreementRun], prompt: str, direction: str, view: str) -> list[tuple | None]:
    """Per run, (search's best, best-of-N's best) where a method that ran has a best row (either may be None:
    that method wrote no row), else None (the cell does not count for that run)."""
    out: list[tuple | None] = []
    for run in runs:
        ran, best = run.summary[prompt][direction].get("forwards") or {}, run.summary[prompt][direction][view]
        s, b = best.get("search"), best.get("best_of_n")
        out.append((s, b) if (s and b) or (s and "best_of_n" in ran) or (b and "search" in ran) else None)
    return out


def _ahead(cell: tuple, direction: str) -> bool:
    s, b = cell
    sign = 1.0 if direction == "a_over_b" else -1.0
    return bool(s) and (not b or sign * (s["gap"] - b["gap"]) > 0)


def _mean(values: np.ndarray) -> float:
    return float(values.mean()) if len(values) else float("nan")


def t_interval(values: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """The mean's t interval over independent runs (NaN with fewer than two)."""
    values = np.asarray(values, np.float64)
    if len(values) < 2:
        return float("nan"), float("nan")
    if np.ptp(values) == 0:  # every run alike: no spread, the interval is the point
        return float(values[0]), float(values[0])
    result = stats.ttest_1samp(values, 0.0).confidence_interval(level)
    return float(result.low), float(result.high)


def ahead_share(runs: Sequence[DisagreementRun], view: str) -> tuple[int, int, float, float]:
    """Cell-runs of `view` where the search was ahead, of all, and a 95% interval of the share: how often the search
    wins one prompt and direction at one seed. The cells of one run share its seed, and a seed that wins or loses
    them together leaves fewer independent trials than cells (helper-151: 20 of 40 had 34-66% from two seeds). So
    the interval holds both readings: Clopper-Pearson's exact one over independent cell-runs, widened to the
    cluster-robust one over runs (the ratio estimator's variance from each run's residual count, t with runs - 1
    degrees of freedom; none for one run)."""
    per_run = np.zeros((len(runs), 2), np.int64)  # ahead, counted
    for prompt, direction, cell_view in _cells(runs):
        if cell_view != view:
            continue
        for i, cell in enumerate(_outcomes(runs, prompt, direction, view)):
            if cell is not None:
                per_run[i] += (_ahead(cell, direction), 1)
    ahead, total = (int(v) for v in per_run.sum(axis=0))
    if not total:
        return 0, 0, float("nan"), float("nan")
    ci = stats.binomtest(ahead, total).proportion_ci(0.95, method="exact")
    low, high = float(ci.low), float(ci.high)
    counted = per_run[per_run[:, 1] > 0]
    if len(counted) >= 2:
        share, m = ahead / total, len(counted)
        residuals = counted[:, 0] - share * counted[:, 1]
        half = stats.t.ppf(0.975, m - 1) * np.sqrt(m / (m - 1) * np.sum(residuals**2)) / total
        low, high = min(low, max(0.0, share - half)), max(high, min(1.0, share + half))
    return ahead, total, low, high


def section(outputs: Outputs, runs: Sequence[DisagreementRun]) -> None:
    """disagreement_seeds.csv and the report's lines."""
    table = outputs.table("disagreement_seeds", seed_table(runs))
    seeds = ", ".join(str(run.seed) for run in runs)
    ahead = table[table["ci_low"] > 0]
    behind = table[table["ci_high"] < 0]
    outputs.say("## Disagreement search against best-of-N over seeds", "",
                f"{len(runs)} runs (seeds {seeds}) of one job at equal forwards. advantage: the search's best gap "
                "beyond best-of-N's in the direction's sense (SD; > 0 the search went further), mean over the runs "
                "where both have a row (paired) with its 95% t interval; a run where one method has no row and the "
                f"other has counts for the other. Ahead by its interval in {len(ahead)} of {len(table)} cells, "
                f"behind in {len(behind)}; the goal (≥ {GOAL_SD:g} SD and ahead) met in "
                f"{int(table['goal_met'].sum())} of {int(table['runs'].sum())} cell-runs.", "")
    for view in VIEWS:
        ahead, total, low, high = ahead_share(runs, view)
        reading = "cell-runs independent or each run's cells together" if len(runs) > 1 else "cells independent"
        outputs.say(f"- {view}: the search ahead in {ahead} of {total} cell-runs (95% CI of the share {low:.0%} to "
                    f"{high:.0%}, {reading})")
    outputs.say("", markdown(table), "")
