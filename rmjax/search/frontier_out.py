"""The frontier job's outputs: the CSV rows (each λ's search rows, and best-of-N's samples re-ranked by that λ's
J), the comparison with best-of-N (a dominating search row, hypervolumes) and the figure."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from rmjax.analysis import plots
from rmjax.runs import results
from rmjax.search import pareto, turns
from rmjax.search.terms import repetition

FLUENT_PPL = 100.0  # judge perplexity at or below which a response counts as fluent (the fluency cost)
PPL_CAPS = (30.0, 100.0)  # the primary metric's judge-perplexity caps (and best-of-N's median)
HV_PPL = 1000.0  # the hypervolume's fixed reference perplexity, inside the fluent band
KEYS = ("direction", "lambda", "method", "rank", "ids", "text", "roundtrip", "ends_turn", "completed_text")
VALUES = ("reward", "reward_z", "prior_logp", "judge_ppl", "completed_reward", "forwards")
COLUMNS = KEYS + VALUES


SAMPLE_COLUMNS = ("direction", "rank", "ids", "text", "roundtrip", "reward", "reward_z", "prior_logp", "judge_ppl")


def png_path(csv: str | Path) -> Path:
    return Path(csv).with_name("frontier.png")


def samples_path(csv: str | Path) -> Path:
    """Every best-of-N sample, so that each summary number about best-of-N (its best reward, its median judge
    perplexity, the hypervolume reference) is a column of a CSV, not only a line of the summary."""
    return Path(csv).with_name("frontier_best_of_n.csv")


def sample_rows(units, tokenizer) -> list[dict]:
    """Per direction, best-of-N's samples, the most rewarding (by direction) first; a sample drawn twice is a row
    each time, as the median counts it."""
    out = []
    for unit in (u for u in units if u.method == "best_of_n"):
        sign, (mean, sd) = (1.0 if unit.direction == "optimal" else -1.0), unit.z
        order = np.lexsort((np.arange(len(unit.ids)), -sign * unit.reward))
        out += [{"direction": unit.direction, "rank": rank + 1,
                 "ids": " ".join(map(str, turns.tokens(unit.ids[i], unit.end))),
                 "text": json.dumps(tokenizer.decode(turns.tokens(unit.ids[i], unit.end)), ensure_ascii=False),
                 "roundtrip": int(unit.roundtrip[i]), "reward": float(unit.reward[i]),
                 "reward_z": (float(unit.reward[i]) - mean) / sd, "prior_logp": float(unit.prior_logp[i]),
                 "judge_ppl": float(unit.judge_ppl[i])} for rank, i in enumerate(order.tolist())]
    return out


def _objective(unit, lam: float, rho: float) -> np.ndarray:
    sign = 1.0 if unit.direction == "optimal" else -1.0
    return sign * unit.reward + lam * (unit.prior_logp - rho * repetition(unit.ids, unit.end))


def rows(units, cfg, tokenizer) -> list[dict]:
    """Every CSV row: per direction and λ, the search's rows in its order (best J first), then best-of-N's
    `top` best distinct samples by the same J."""
    out = []
    for unit in units:
        if unit.method == "search":
            out += _rows_of(unit, unit.lam, range(len(unit.ids)), tokenizer)
            continue
        for lam in cfg.lambdas:
            order = np.lexsort((np.arange(len(unit.ids)), -_objective(unit, lam, cfg.repetition_penalty)))
            first = list(dict.fromkeys(tuple(unit.ids[i].tolist()) for i in order))[: cfg.top]
            index = {tuple(unit.ids[i].tolist()): int(i) for i in order[::-1]}  # the first sample of each
            out += _rows_of(unit, lam, [index[ids] for ids in first], tokenizer)
    order = {d: i for i, d in enumerate(("optimal", "pessimal"))}
    return sorted(out, key=lambda r: (order[r["direction"]], r["lambda"], r["method"] != "search", r["rank"]))


def _rows_of(unit, lam: float, which, tokenizer) -> list[dict]:
    mean, sd = unit.z
    return [{"direction": unit.direction, "lambda": float(lam), "method": unit.method, "rank": rank + 1,
             "ids": " ".join(map(str, turns.tokens(unit.ids[i], unit.end))),
             "text": json.dumps(tokenizer.decode(turns.tokens(unit.ids[i], unit.end)), ensure_ascii=False),
             "roundtrip": int(unit.roundtrip[i]), "reward": float(unit.reward[i]),
             "reward_z": (float(unit.reward[i]) - mean) / sd, "prior_logp": float(unit.prior_logp[i]),
             "judge_ppl": float(unit.judge_ppl[i]), "forwards": unit.forwards}
            for rank, i in enumerate(which)]


def summaries(units, cfg, table: list[dict] | None = None) -> dict:
    """Per direction: the compute each method spent (best-of-N: the searches' pooled budget), the primary metric
    (each method's best reward at judge perplexity ≤ each cap, and the difference in SDs of the single-token
    rewards), best-of-N's best reward and median judge perplexity over all its samples, the distinct search
    responses that dominate both, each method's hypervolume from a fixed reference inside the fluent band
    (best-of-N's median reward, perplexity HV_PPL), what fluency costs the search, and (from the written rows'
    completion check, `table`) the truncation gain: how much of a row's reward its stopping point earns."""
    out = {}
    for direction in cfg.directions:
        sign = 1.0 if direction == "optimal" else -1.0
        search = [u for u in units if u.direction == direction and u.method == "search"]
        base = next(u for u in units if u.direction == direction and u.method == "best_of_n")
        s_gain, s_ppl = sign * np.concatenate([u.reward for u in search]), np.concatenate([u.judge_ppl for u in search])
        b_gain, b_ppl = sign * base.reward, base.judge_ppl
        ref = (float(np.median(b_gain)), HV_PPL)
        median, best = float(np.median(b_ppl)), float(b_gain.max())
        dominating, seen = [], set()  # a response several λs wrote counts once
        for u in search:
            for i in range(len(u.ids)):
                if u.judge_ppl[i] <= median and sign * u.reward[i] >= best and tuple(u.ids[i].tolist()) not in seen:
                    seen.add(tuple(u.ids[i].tolist()))
                    dominating.append((u, i))
        hv_search, hv_base = pareto.hypervolume(s_gain, s_ppl, ref), pareto.hypervolume(b_gain, b_ppl, ref)
        sd = base.z[1]
        out[direction] = {
            "search_forwards": float(sum(u.forwards for u in search)),
            "best_of_n": {"samples": len(base.ids), "forwards": float(base.forwards), "best_reward": sign * best,
                          "median_judge_ppl": median},
            "at_judge_ppl": [_at_cap(cap, s_gain, s_ppl, b_gain, b_ppl, sign, sd) for cap in (*PPL_CAPS, median)],
            "compute_multiplier": None,  # measured by bench/frontier_findings.py (best-of-N at 1x..8x), not here
            "dominating_responses": len(dominating),
            "best_dominating": _most_rewarding(dominating, sign),
            "hypervolume": {"search": hv_search, "best_of_n": hv_base,
                            "ratio": hv_search / hv_base if hv_base > 0 else None,
                            "reference": {"reward": sign * ref[0], "judge_ppl": ref[1]}},
            "fluency_cost": _fluency_cost(search, sign),
            "truncation_gain": None if table is None else truncation_gains(table, direction, base.z),
        }
    return out


def _at_cap(cap: float, s_gain, s_ppl, b_gain, b_ppl, sign: float, sd: float) -> dict:
    """Each method's most rewarding response (by direction) at judge perplexity ≤ cap, and the search's lead in
    SDs; ci95 comes from seeds (the findings bench), not one job."""
    s = s_gain[s_ppl <= cap].max(initial=-np.inf)
    b = b_gain[b_ppl <= cap].max(initial=-np.inf)
    found = np.isfinite(s) and np.isfinite(b)
    return {"cap": float(cap), "search": sign * float(s) if np.isfinite(s) else None,
            "best_of_n": sign * float(b) if np.isfinite(b) else None,
            "delta_sd": float((s - b) / sd) if found else None, "ci95": None}


def complete_at_caps(summary: dict, units, ends_of, batch: int = 32) -> None:
    """Adds `at_judge_ppl_complete` to each direction's summary: the primary metric over complete responses only,
    those after which the prior's most likely next token ends the turn. A judge cap alone lets fragments through
    (a plain judge's end of turn, a newline, is cheap after one; SmolLM2's best-of-N best at ppl ≤ 100 was the
    unfinished `The question of "What, in one`). `ends_of(responses) -> bool [W]` is asked lazily: each method's
    responses under the cap, in order of reward (by direction), `batch` at a time until one ends; each response
    is asked once."""
    known: dict[tuple[int, ...], bool] = {}
    for direction, s in summary.items():
        sign = 1.0 if direction == "optimal" else -1.0
        mine = [u for u in units if u.direction == direction]
        pools = {m: [(sign * float(u.reward[i]), float(u.judge_ppl[i]), tuple(turns.tokens(u.ids[i], u.end)))
                     for u in mine if u.method == m for i in range(len(u.ids))] for m in ("search", "best_of_n")}
        sd, entries = next(u for u in mine if u.method == "best_of_n").z[1], []
        for cap in (c["cap"] for c in s["at_judge_ppl"]):
            best = {m: _first_complete(pool, cap, ends_of, known, batch) for m, pool in pools.items()}
            found = best["search"] is not None and best["best_of_n"] is not None
            entries.append({"cap": cap, **{m: None if b is None else sign * b for m, b in best.items()},
                            "delta_sd": (best["search"] - best["best_of_n"]) / sd if found else None, "ci95": None})
        s["at_judge_ppl_complete"] = entries
        # the fluency cost over complete answers: the best row at any perplexity is often a fragment (the reward
        # read where the text stops), which makes fluency look dearer than it is
        best, fluent = (_first_complete(pools["search"], cap, ends_of, known, batch) for cap in (np.inf, FLUENT_PPL))
        cost = None if best is None or fluent is None else best - fluent
        s["fluency_cost_complete"] = {"max_judge_ppl": FLUENT_PPL, "best": None if best is None else sign * best,
                                      "best_fluent": None if fluent is None else sign * fluent, "reward": cost,
                                      "sd": None if cost is None else cost / sd}


def _first_complete(pool, cap: float, ends_of, known: dict, batch: int) -> float | None:
    """The highest gain of a response in `pool` (gain, judge ppl, tokens) at judge perplexity ≤ cap that ends the
    turn (`known`, else asked of `ends_of` a batch at a time); None when none does."""
    under = sorted((r for r in pool if r[1] <= cap), key=lambda r: -r[0])
    order = list(dict.fromkeys(r[2] for r in under))
    gain = {}
    for g, _, ids in under:
        gain.setdefault(ids, g)  # the first: its highest
    for start in range(0, len(order), batch):
        part = order[start : start + batch]
        unknown = [ids for ids in part if ids not in known]
        if unknown:
            known.update(zip(unknown, (bool(e) for e in ends_of([list(ids) for ids in unknown])), strict=True))
        hit = next((ids for ids in part if known[ids]), None)
        if hit is not None:
            return gain[hit]
    return None


def truncation_gains(table: list[dict], direction: str, z: tuple[float, float]) -> dict:
    """The written rows' truncation gain (direction-signed reward − completed_reward, in SDs of the single-token
    rewards): median and share of rows whose prior would end the turn there, for the search at λ > 0, at λ = 0
    and for best-of-N."""
    sign, out = (1.0 if direction == "optimal" else -1.0), {}
    groups = {"search": lambda r: r["method"] == "search" and r["lambda"] > 0,
              "search_lambda0": lambda r: r["method"] == "search" and r["lambda"] == 0,
              "best_of_n": lambda r: r["method"] == "best_of_n"}
    for name, keep in groups.items():
        mine = {r["ids"]: r for r in table if r["direction"] == direction and keep(r)}.values()  # distinct rows
        gains = [sign * (r["reward"] - r["completed_reward"]) / z[1] for r in mine]
        out[name] = {"rows": len(gains), "median_sd": float(np.median(gains)) if gains else None,
                     "ends_turn": float(np.mean([r["ends_turn"] for r in mine])) if gains else None}
    return out


def _fluency_cost(search, sign: float) -> dict:
    """The search's most rewarding row at any judge perplexity against its most rewarding at ≤ FLUENT_PPL (by
    direction): the reward fluency costs, also in SDs of the single-token rewards (the reward_z scale)."""
    rows = [(u, i) for u in search for i in range(len(u.ids))]
    top = _most_rewarding(rows, sign)
    fluent = _most_rewarding([(u, i) for u, i in rows if u.judge_ppl[i] <= FLUENT_PPL], sign)
    cost = None if fluent is None else sign * (top["reward"] - fluent["reward"])
    return {"max_judge_ppl": FLUENT_PPL, "best": top, "best_fluent": fluent, "reward": cost,
            "sd": None if cost is None else cost / search[0].z[1]}


def _most_rewarding(rows, sign: float) -> dict | None:
    """The most rewarding (by direction) of search rows given as (unit, index); of equals, the first."""
    if not rows:
        return None
    unit, i = max(rows, key=lambda r: sign * r[0].reward[r[1]])
    return {"lambda": unit.lam, "ids": turns.tokens(unit.ids[i], unit.end), "reward": float(unit.reward[i]),
            "judge_ppl": float(unit.judge_ppl[i])}


def nonfinite_record(units) -> dict | None:
    """.meta.json's `nonfinite`, as GCG's: the sequences dropped for a NaN/Inf term and the swaps of allowed tokens
    NaN/Inf gradient entries kept from being proposed, over `units`; None when there were none."""
    counts = {"candidates_dropped": sum(u.candidates_dropped for u in units),
              "gradient_swaps_skipped": sum(u.swaps_skipped for u in units)}
    return {k: v for k, v in counts.items() if v} or None


def write(path: Path, table: list[dict], summary: dict, samples: list[dict]) -> Path:
    """The CSV (COLUMNS; texts JSON-quoted, so any response survives), best-of-N's samples (`samples_path`) and
    the figure beside them."""
    _write_rows(path, table, KEYS, VALUES)
    _write_rows(samples_path(path), samples, SAMPLE_COLUMNS[:5], SAMPLE_COLUMNS[5:])
    fronts = {(d, m): _front(table if m == "search" else samples, d, m) for d in summary
              for m in ("search", "best_of_n")}  # best-of-N's front: of every sample, as the summary's numbers
    plots.frontier_scatter(table, fronts, png_path(path), samples)
    return path


def _write_rows(path: Path, rows: list[dict], keys, values) -> None:
    results.write_table(path, {c: [r[c] for r in rows] for c in keys},
                        {c: np.asarray([r[c] for r in rows], np.float64) for c in values})


def describe(summary: dict, out: Path) -> str:
    lines = []
    for direction, s in summary.items():
        base, hv = s["best_of_n"], s["hypervolume"]
        ratio = f"{hv['ratio']:.2f}x" if hv["ratio"] is not None else "n/a"
        lines.append(f"{direction}: search {s['search_forwards']:.0f} forwards (all λ), best-of-N "
                     f"{base['forwards']:.0f} ({base['samples']} whole-turn samples, all in "
                     f"{samples_path(out).name}) best reward {base['best_reward']:.3f}, median judge perplexity "
                     f"{base['median_judge_ppl']:.1f}")
        for cap in s["at_judge_ppl"]:
            lead = "n/a" if cap["delta_sd"] is None else f"{cap['delta_sd']:+.2f} SD"
            lines.append(f"  at judge perplexity <= {cap['cap']:.3g}: search {_fmt(cap['search'])}, best-of-N "
                         f"{_fmt(cap['best_of_n'])} ({lead})")
        for cap in s.get("at_judge_ppl_complete") or []:
            lead = "n/a" if cap["delta_sd"] is None else f"{cap['delta_sd']:+.2f} SD"
            lines.append(f"  complete answers only, at judge perplexity <= {cap['cap']:.3g}: search "
                         f"{_fmt(cap['search'])}, best-of-N {_fmt(cap['best_of_n'])} ({lead})")
        gain = s.get("truncation_gain") or {}
        for name, g in gain.items():
            if g["rows"]:
                lines.append(f"  truncation gain ({name}, {g['rows']} rows): median {g['median_sd']:+.2f} SD; "
                             f"{g['ends_turn']:.0%} end where the prior would end the turn")
        lines.append(f"  {s['dominating_responses']} search responses dominate best-of-N's best and median; "
                     f"hypervolume search/best-of-N {ratio} (reference: best-of-N's median reward, perplexity "
                     f"{HV_PPL:g})")
        cost = s["fluency_cost"]
        if cost["reward"] is not None:
            lines.append(f"  fluency costs {cost['reward']:.2f} reward ({cost['sd']:.1f} SD): the search's best "
                         f"{cost['best']['reward']:.3f} at judge perplexity {cost['best']['judge_ppl']:.3g}, its "
                         f"best at <= {FLUENT_PPL:g} {cost['best_fluent']['reward']:.3f} (fragments included)")
        whole = s.get("fluency_cost_complete") or {}
        if whole.get("reward") is not None:
            lines.append(f"  complete answers only, fluency costs {whole['reward']:.2f} reward ({whole['sd']:.1f} "
                         f"SD): the search's best complete {whole['best']:.3f}, at <= {FLUENT_PPL:g} "
                         f"{whole['best_fluent']:.3f}")
    return "\n".join(lines) + f"\n-> {out}, {samples_path(out)}, {png_path(out)}"


def _fmt(value: float | None) -> str:
    return "none" if value is None else f"{value:.3f}"


def _front(table: list[dict], direction: str, method: str) -> list[dict]:
    """The rows of one direction and method on its Pareto front (reward by direction vs judge perplexity); rows
    without a method (best-of-N's samples) are that method's."""
    mine = [r for r in table if r["direction"] == direction and r.get("method", method) == method]
    sign = 1.0 if direction == "optimal" else -1.0
    keep = pareto.front(np.asarray([sign * r["reward"] for r in mine]), np.asarray([r["judge_ppl"] for r in mine]))
    return [mine[i] for i in keep]
