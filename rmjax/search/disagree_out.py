"""The disagreement job's outputs: the written rows (each re-scored by both sides as experiments.score scores a
text, judged, completion-checked), the comparison with best-of-N at a judge-perplexity cap, the vocabulary map's
CSV and the figure."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from rmjax.analysis import plots
from rmjax.errors import RmjaxError
from rmjax.runs import results
from rmjax.runs.progress import PhaseClock, Progress
from rmjax.scoring.judge import judge_perplexities
from rmjax.search import turns
from rmjax.search.completion import complete_responses
from rmjax.search.disagree import prompt_shifts, response_content, z_of
from rmjax.search.frontier_out import FLUENT_PPL

KEYS = ("prompt", "direction", "method", "rank", "text", "ends_turn", "completed_text")
VALUES = ("reward_a", "reward_b", "z_a", "z_b", "gap", "judge_ppl", "forwards")
LABELS = {"search": "search", "best_of_n": "best-of-N"}
MAP_KEYS = ("prompt", "text", "token_a", "token_b")
MAP_VALUES = ("reward_a", "reward_b", "z_a", "z_b", "gap")


def _tolerance(dtype: str, reward: np.ndarray, sd: float) -> np.ndarray:
    """How far a row's reward through the search's cached ids may sit from the same text scored afresh. float32:
    rounding over a forward (about 1e-6 relative per op), well inside 1e-3 of the reward's scale. bfloat16 (8 bits
    of mantissa) errs by a share of the rewards' spread: rmjax's bf16 rewards sat 0.04-0.09 SD (of random rows) from
    float64 at published shapes (BUILD_NOTES, On a GPU), and one text's two bf16 paths 0.12 SD (of the single-token
    yardstick) apart on an H200. 0.5 SD of the side's single-token rewards (a judgement, 4x that case), or 3e-2 of
    the reward's scale where larger; a template or tokenization mismatch moves a reward by SDs (sides.py: 2 SD)."""
    scale = np.maximum(1.0, np.abs(reward))
    return 1e-3 * scale if dtype == "float32" else np.maximum(3e-2 * scale, 0.5 * sd)


def check_rescored(side: str, texts: list[str], fresh: np.ndarray, searched: np.ndarray, dtype: str,
                   sd: float) -> None:
    """Refuse rows whose search scores are not the texts' (a tokenization or template that differs between the
    search and experiments.score), beyond the dtype's rounding (`_tolerance`)."""
    off = np.abs(fresh - searched) > _tolerance(dtype, searched, sd)
    if off.any():
        i = int(np.flatnonzero(off)[0])
        hint = "" if dtype == "float32" else f" ({(fresh[i] - searched[i]) / sd:+.2f} SD in {dtype})"
        raise RmjaxError(f"side {side}'s reward of {texts[i]!r} is {fresh[i]:.6g} scored as a text but "
                         f"{searched[i]:.6g} in the search{hint}: the search's scores are not the text's. Nothing "
                         "was written; report this with the command.")


def rows(units, ready: dict, judge, spec, clock: PhaseClock | None = None) -> list[dict]:
    """Every CSV row, units in plan order and each unit's rows in its order (best objective first): both sides'
    rewards of the decoded text scored afresh (what experiments.score gives it), checked against what the search
    scored; z per side; the judge's perplexity; the completion check (each timed on `clock`)."""
    out, clock = [], clock or PhaseClock()
    # minutes after the search's last forward on a CPU (the default RMs' 3 prompts: 6), shown as they go
    progress = Progress(3 * sum(len(u.ids) for u in units), "disagree: rows completed, re-scored, judged",
                        unit="row checks", every=10.0)
    progress.update(0, force=True)
    completed = _completions(units, ready, spec, progress)
    clock("complete")
    for u, done in zip(units, completed, strict=True):
        p = ready[u.prompt]
        tokenizer, end = p.target.model.tokenizer, p.end
        texts = [response_content(t, p.plain) for t in turns.decode(tokenizer, u.ids, end)]
        ra, rb = p.side_a.rewards(texts), p.side_b.rewards(texts)
        for side, fresh, searched, scale in (("A", ra, u.reward_a, p.z_a), ("B", rb, u.reward_b, p.z_b)):
            check_rescored(side, texts, fresh, searched, spec.options.dtype, scale[1])
        progress.update(len(texts))
        clock("rescore")
        ppl = judge_perplexities(judge, p.prompt, texts, end_of_turn=True)  # the judge's own template (as frontier)
        progress.update(len(texts))
        clock("judge")
        za, zb = z_of(ra, p.z_a), z_of(rb, p.z_b)
        out += [{"prompt": u.prompt, "direction": u.direction, "method": u.method, "rank": k + 1,
                 "text": json.dumps(texts[k], ensure_ascii=False), "ends_turn": int(done[0][k]),
                 "completed_text": json.dumps(done[1][k], ensure_ascii=False),
                 "reward_a": float(ra[k]), "reward_b": float(rb[k]), "z_a": float(za[k]), "z_b": float(zb[k]),
                 "gap": float(za[k] - zb[k]), "judge_ppl": float(ppl[k]), "forwards": u.forwards}
                for k in range(len(texts))]
    return out


def _completions(units, ready: dict, spec, progress: Progress) -> list[tuple[list[bool], list[str]]]:
    """Each unit's completion check (ends_turn, completed_text per row), the rows of all units after one prompt
    completed together: one decode batch instead of one per unit."""
    out = [None] * len(units)
    for prompt in dict.fromkeys(u.prompt for u in units):
        p, mine = ready[prompt], [i for i, u in enumerate(units) if u.prompt == prompt]
        responses = [turns.tokens(r, p.end) for i in mine for r in units[i].ids.tolist()]
        done = complete_responses(p.target.model, p.prior.model, p.prompt, responses, spec.options.template,
                                  allow_nonfinite=spec.options.allow_nonfinite)
        start = 0
        for i in mine:
            stop = start + len(units[i].ids)
            out[i] = (done.ends_turn[start:stop].tolist(), done.completed_text[start:stop])
            start = stop
        progress.update(len(responses))
    return out


def _best(table: list[dict], prompt: str, direction: str, method: str, cap: float, complete: bool) -> dict | None:
    """The row of the largest gap by direction at judge perplexity ≤ cap (and ending where the prior would end the
    turn, with `complete`)."""
    sign = 1.0 if direction == "a_over_b" else -1.0
    mine = [r for r in table if (r["prompt"], r["direction"], r["method"]) == (prompt, direction, method)
            and r["judge_ppl"] <= cap and (r["ends_turn"] or not complete)]
    if not mine:
        return None
    r = max(mine, key=lambda r: sign * r["gap"])  # the text itself, not the CSV cell's JSON quoting of it
    return {"text": json.loads(r["text"]), **{k: r[k] for k in ("gap", "z_a", "z_b", "judge_ppl", "ends_turn")}}


def summaries(table: list[dict], units, maps: dict, cfg) -> dict:
    """Per prompt: per direction, each method's forwards and most disagreeing row at judge perplexity ≤
    FLUENT_PPL (and among complete answers), and whether the search's beats best-of-N's; the vocabulary map's
    agreement and its `map_top` strings at each end; with two or more prompts, the `map_top` strings whose gap
    after the prompt rises most above (and falls most below) their mean gap after the others (prompt_shifts)."""
    out = {}
    shifts = prompt_shifts({p: f for p, (f, _) in maps.items()})
    for prompt in dict.fromkeys([u.prompt for u in units] + list(maps)):
        entry = {}
        for direction in (cfg.directions if units else ()):
            sign = 1.0 if direction == "a_over_b" else -1.0
            d = {"forwards": {u.method: u.forwards for u in units if (u.prompt, u.direction) == (prompt, direction)}}
            ran = d["forwards"]
            both_ran = "search" in ran and "best_of_n" in ran
            for complete in (False, True):
                best = {m: _best(table, prompt, direction, m, FLUENT_PPL, complete) for m in ("search", "best_of_n")}
                s, b = best["search"], best["best_of_n"]
                d["complete" if complete else "at_cap"] = {
                    "cap": FLUENT_PPL, **best,
                    # None: one method did not run (--methods), or neither has a row; a search with no row lost
                    # to one that has
                    "search_beats_best_of_n": None if not both_ran or (s is None and b is None)
                    else s is not None and (b is None or sign * s["gap"] > sign * b["gap"])}
            entry[direction] = d
        if prompt in maps:
            frame, agree = maps[prompt]
            frame = frame[np.isfinite(frame["gap"])]  # --allow_nonfinite's NaN rows sort last: not the bottom
            entry["vocab_map"] = {**agree, "top": _ends(frame.head(cfg.map_top)),
                                  "bottom": _ends(frame.tail(cfg.map_top).iloc[::-1])}
            if prompt in shifts:
                moved = shifts[prompt]
                entry["vocab_map"] |= {"rises": _shifted(moved.head(cfg.map_top)),
                                       "falls": _shifted(moved.tail(cfg.map_top).iloc[::-1])}
        out[prompt] = entry
    return out


def _ends(frame: pd.DataFrame) -> list[dict]:
    return [{"text": t, "gap": float(g), "z_a": float(a), "z_b": float(b)}
            for t, g, a, b in zip(frame["text"], frame["gap"], frame["z_a"], frame["z_b"], strict=True)]


def _shifted(frame: pd.DataFrame) -> list[dict]:
    return [{"text": t, "shift": float(s), "gap": float(g), "others_gap": float(o)}
            for t, s, g, o in zip(frame["text"], frame["shift"], frame["gap"], frame["others_gap"], strict=True)]


def write(paths: dict[str, Path], table: list[dict], maps: dict, cfg) -> Path:
    """disagree.csv (texts JSON-quoted, so any response survives), vocab_map.csv, the figure; returns the main
    file (the map's with --nosearch)."""
    if maps:
        frame = pd.concat([f for f, _ in maps.values()], ignore_index=True)
        results.write_table(paths["map"], {"prompt": frame["prompt"].tolist(),
                                           "text": [json.dumps(t, ensure_ascii=False) for t in frame["text"]],
                                           "token_a": frame["token_a"].tolist(), "token_b": frame["token_b"].tolist()},
                            {c: frame[c].to_numpy(np.float64) for c in MAP_VALUES})
    if not cfg.search:
        return paths["map"]
    results.write_table(paths["csv"], {c: [r[c] for r in table] for c in KEYS},
                        {c: np.asarray([r[c] for r in table], np.float64) for c in VALUES})
    plots.disagreement_scatter(table, {p: f for p, (f, _) in maps.items()}, paths["png"], FLUENT_PPL)
    return paths["csv"]


def describe(summary: dict, paths: dict[str, Path], cfg) -> str:
    lines = []
    for prompt, entry in summary.items():
        for direction in cfg.directions:
            if direction not in entry:
                continue
            d = entry[direction]
            for key, what in (("at_cap", "at judge perplexity"), ("complete", "complete answers at judge perplexity")):
                c = d[key]
                ran = cfg.method_names
                lines.append(f"{prompt} {direction}, {what} <= {c['cap']:g}: "
                             + ", ".join(f"{LABELS[m]} {_fmt(c[m])}" for m in ran)
                             + " (forwards " + " vs ".join(f"{d['forwards'].get(m, 0):.0f}" for m in ran) + ")")
        if "vocab_map" in entry:
            m = entry["vocab_map"]
            lines.append(f"{prompt} vocabulary map over {m['n']} shared strings ({m['left_out']} left out: not that "
                         "token in a conversation" + (f"; {m['nonfinite']} non-finite" if m.get("nonfinite") else "")
                         + f"): Kendall τ {m['kendall_tau']:.3f}, "
                         f"EPIC distance {m['epic_distance']:.3f}; A over B most: "
                         + ", ".join(f"{r['text']!r} {r['gap']:+.1f}" for r in m["top"][:5]) + "; B over A most: "
                         + ", ".join(f"{r['text']!r} {r['gap']:+.1f}" for r in m["bottom"][:5]))
            if "rises" in m:
                lines.append(f"{prompt} vocabulary map, gap after this prompt minus after the others: most above: "
                             + ", ".join(f"{r['text']!r} {r['shift']:+.1f}" for r in m["rises"][:5])
                             + "; most below: " + ", ".join(f"{r['text']!r} {r['shift']:+.1f}" for r in m["falls"][:5]))
    written = [paths["csv"], paths["png"]] if cfg.search else []
    return "\n".join(lines) + "\n-> " + ", ".join(map(str, written + ([paths["map"]] if cfg.vocab_map else [])))


def _fmt(best: dict | None) -> str:
    if best is None:
        return "none"
    text = json.dumps(best["text"], ensure_ascii=False)
    return f"gap {best['gap']:+.2f} SD ({text}, z_A {best['z_a']:+.2f}, z_B {best['z_b']:+.2f})"
