"""Issue 43's findings: the frontier's search against best-of-N at equal and at more compute, and the truncation
hack, on whole responses.

    python bench/frontier_findings.py multiplier --out=DIR [--models=A,B] [--seeds=0,1,2] [--forwards=2000]
    python bench/frontier_findings.py truncation --out=DIR [--models=A,B] [--prompts=10] [--samples=128]

`multiplier`: per model and seed, the frontier job (both directions, the given λs and budget) in DIR/MODEL-sS;
then, per direction, best-of-N drawn again at `--multiples` x the searches' pooled budget with the job's seeds
(its first samples are the job's own: prefix-stable draws), the two temperatures' streams interleaved so that its
first k samples are best-of-N at a budget of k. At each judge-perplexity cap (30, 100, the job's best-of-N median)
the compute multiplier is k*/(search forwards), k* the first sample that reaches the search's best at that cap
(judged lazily: only samples rewarded at least that much are judged); censored at `--multiples` when none does.
Also over complete answers only (the job's `at_judge_ppl_complete`: a sample counts when it also ends the turn,
the prior's argmax after it being the end of turn). Over seeds: the geometric mean and a 95% t-interval on the
logs (where a seed is censored, the mean is a lower bound and no interval is given).

`truncation`: how much reward an unfinished sentence earns. Per model and prompt (the 54-prompt set's first
`--prompts`), `--samples` 8-token prior samples that do not end the turn (fragments, as the pre-issue-43 search
wrote), each completed greedily by the prior (rmjax.search.completion); the gain is reward(fragment) −
reward(completed) in SDs of the prompt's single-token rewards (z_sample tokens), with the share that ends
where the prior would stop.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rmjax.loading.for_job import load_for_job  # noqa: E402
from rmjax.runs.options import RunOptions  # noqa: E402
from rmjax.scoring.judge import judge_perplexities  # noqa: E402
from rmjax.scoring.prefix import score_responses  # noqa: E402
from rmjax.scoring.prior import sample_responses  # noqa: E402
from rmjax.search import baseline, turns  # noqa: E402
from rmjax.search.budget import Forwards  # noqa: E402
from rmjax.search.completion import complete_responses, greedy_continuations  # noqa: E402
from rmjax.search.fluent import FluentConfig  # noqa: E402
from rmjax.search.frontier_job import FrontierConfig, FrontierSpec, run_frontier  # noqa: E402
from rmjax.search.gcg import make_target  # noqa: E402
from rmjax.search.gcg_start import banned_tokens  # noqa: E402
from rmjax.search.objective import Objective  # noqa: E402
from rmjax.search.terms import Prior  # noqa: E402
from rmjax.text import prompts as prompt_lib  # noqa: E402

MODELS = "elo-rm-smollm2-135m,elo-rm-gemma3-270m"
JUDGE_BATCH = 64


def _job(model: str, seed: int, args, out: Path) -> Path:
    cfg = FrontierConfig(lambdas=tuple(args.lambdas), direction="both", forwards=args.forwards)
    search = FluentConfig(num_tokens=args.num_tokens, seed=seed)
    spec = FrontierSpec(RunOptions(model=model, out=str(out)), prompt_lib.resolve_prompts([args.prompt], []), cfg,
                        search)
    run_frontier(spec)
    return out


def _multiples(model: str, seed: int, args, folder: Path) -> list[dict]:
    """The compute multiplier of each direction and cap, for one finished job."""
    meta = json.loads((folder / "frontier.csv.meta.json").read_text())
    rows = _csv(folder / "frontier.csv")
    rm = load_for_job(RunOptions(model=model, out=str(folder)))
    judge = load_for_job(RunOptions(model=meta["judge"], out=str(folder)))
    prompt = next(iter(meta["prompts"].values()))
    target = make_target(rm, prompt)
    prior = Prior.of(rm, target.prefix)
    search = FluentConfig(num_tokens=args.num_tokens, seed=seed)
    banned = banned_tokens(rm, rm.config.vocab_size,  # as the job bans (frontier_job._prepare, its defaults)
                           search.gcg(allow_non_ascii=FrontierConfig().allow_non_ascii, template="auto"))
    out = []
    for direction, summary in meta["summary"].items():
        sign = 1.0 if direction == "optimal" else -1.0
        budget = int(round(summary["search_forwards"]))
        objective = Objective(target, prior, 0.0, sign, 2.0, Forwards(args.multiples * budget,
                                                                     args.num_tokens + len(target.suffix),
                                                                     args.num_tokens + 1))
        started = time.perf_counter()
        found = baseline.best_of_n(objective, search, banned)
        order = _interleaved(len(found.ids), len(search.best_of_n_temperatures))
        ids, gain = found.ids[order], sign * found.values.reward[order]
        texts = turns.decode(rm.tokenizer, ids, objective.end)
        # the job's written best-of-N rows (its top by J per λ) are among the redraw's first samples: the same draws
        drawn = set(_body(found.ids[_jobs_share(summary["best_of_n"]["samples"], order)], objective.end))
        same = set(_body(_job_samples(rows, direction), objective.end)) <= drawn
        mine = [r for r in rows if r["direction"] == direction and r["method"] == "search"]
        bodies = [turns.tokens(r, objective.end) for r in ids]
        ends_of = _ends_of(rm, target, objective.end, bodies)
        caps = [(c, False) for c in summary["at_judge_ppl"]]
        caps += [(c, True) for c in summary.get("at_judge_ppl_complete", [])]  # answers that end, on both sides
        for cap, complete in caps:
            if complete:  # the job's search best among its answers that end
                best = None if cap["search"] is None else sign * cap["search"]
            else:
                best = max((sign * float(r["reward"]) for r in mine if float(r["judge_ppl"]) <= cap["cap"]),
                           default=None)
            # a search with no row under the cap is reached by best-of-N's first sample under it (it was written
            # censored at --multiples, the search's best possible score); with neither, there is nothing to compare
            k = _first_reaching(judge, prompt, texts, gain, -np.inf if best is None else best, cap["cap"],
                                ends_of if complete else None)
            multiplier = None if best is None and k is None else args.multiples if k is None else k / budget
            out.append({"model": model, "seed": seed, "direction": direction, "cap": cap["cap"],
                        "complete_only": complete,
                        "search": cap["search"], "best_of_n": cap["best_of_n"], "delta_sd": cap["delta_sd"],
                        "samples_to_reach": k, "multiplier": multiplier, "censored": best is not None and k is None,
                        "search_forwards": budget, "prefix_is_the_jobs_best_of_n": same,
                        "seconds": round(time.perf_counter() - started, 1)})
            print(json.dumps(out[-1]), flush=True)
    return out


def _csv(path: Path) -> list[dict]:
    import csv

    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _body(ids, end) -> list[str]:
    return [" ".join(map(str, turns.tokens(r, end))) for r in ids]


def _job_samples(rows, direction):  # the CSV keeps only best-of-N's top rows: compared as a set of distinct ids
    return [[int(t) for t in r["ids"].split()] for r in rows if r["direction"] == direction
            and r["method"] == "best_of_n"]


def _jobs_share(samples: int, order: np.ndarray) -> np.ndarray:
    """Indices (into best_of_n's concatenated streams) of the samples the job's own best-of-N drew: the first
    `samples` of the interleaved order, each stream's prefix."""
    return np.sort(order[:samples])


def _interleaved(count: int, streams: int) -> np.ndarray:
    """best_of_n concatenates each temperature's stream (equal shares, the first count % streams one longer):
    the order taking one sample of each stream in turn, so that a prefix of k is best-of-N at a budget of k."""
    shares = [count // streams + (k < count % streams) for k in range(streams)]
    starts = np.concatenate([[0], np.cumsum(shares)[:-1]])
    return np.asarray([starts[s] + i for i in range(max(shares)) for s in range(streams) if i < shares[s]])


def _first_reaching(judge, prompt: str, texts: list[str], gain: np.ndarray, best: float, cap: float,
                    ends_of=None) -> int | None:
    """The count of samples (in order) up to the first whose gain reaches `best` at judge perplexity ≤ cap (and,
    with `ends_of`, that ends the turn)."""
    candidates = np.flatnonzero(gain >= best)
    for start in range(0, len(candidates), JUDGE_BATCH):
        part = candidates[start : start + JUDGE_BATCH]
        ppl = judge_perplexities(judge, prompt, [texts[i] for i in part], end_of_turn=True)
        hit = part[ppl <= cap]
        if ends_of is not None and len(hit):
            hit = hit[ends_of(hit)]
        if len(hit):
            return int(hit[0]) + 1
    return None


def _ends_of(rm, target, end: int, bodies: list[list[int]]):
    """Whether the RM's own LM (the job's prior) ends the turn after each of the samples `index`."""
    return lambda index: greedy_continuations(rm, target.prefix, end, [bodies[i] for i in index], max_new=1)[0]


def _geometric_ci(values: list[float]) -> tuple[float, float, float]:
    """The geometric mean and a 95% t-interval on the logs (NaN under 2 seeds). A bootstrap over 3 seeds gave their
    range: each resample is all one seed with probability 1/27, above 2.5%."""
    logs = np.log(np.asarray(values, np.float64))
    if len(logs) < 2:
        return float(np.exp(logs.mean())), np.nan, np.nan
    half = stats.t.ppf(0.975, len(logs) - 1) * logs.std(ddof=1) / np.sqrt(len(logs))
    return float(np.exp(logs.mean())), float(np.exp(logs.mean() - half)), float(np.exp(logs.mean() + half))


def multiplier(args) -> None:
    out, found = Path(args.out), []
    for model in args.models.split(","):
        for seed in args.seeds:
            folder = _job(model, seed, args, out / f"{model}-s{seed}")
            found += _multiples(model, seed, args, folder)
    summary = []
    for key in sorted({(r["model"], r["direction"], r["cap"] if r["cap"] in (30.0, 100.0) else "median",
                        r.get("complete_only", False)) for r in found}, key=str):
        mine = [r for r in found
                if (r["model"], r["direction"], r.get("complete_only", False)) == (*key[:2], key[3])
                and (r["cap"] == key[2] or (key[2] == "median" and r["cap"] not in (30.0, 100.0)))]
        neither = [r for r in mine if r["multiplier"] is None]  # no row under the cap for either method
        mine = [r for r in mine if r["multiplier"] is not None]
        geo, low, high = _geometric_ci([r["multiplier"] for r in mine]) if mine else (np.nan,) * 3
        summary.append({"model": key[0], "direction": key[1], "cap": key[2], "complete_only": key[3],
                        "seeds": len(mine), "left_out_neither_answered": len(neither),
                        "multipliers": [r["multiplier"] for r in mine], "censored": sum(r["censored"] for r in mine),
                        "geometric_mean": geo,
                        "ci95": [low, high] if not any(r["censored"] for r in mine) else [None, None],
                        "delta_sd": [r["delta_sd"] for r in mine]})
        which = " (complete answers)" if key[3] else ""
        # a censored seed's multiplier is a lower bound, and so is the mean; the interval then means nothing (a
        # larger censored value widens it downwards too)
        censored = summary[-1]["censored"]
        interval = (f"no interval: {censored} censored" if censored else
                    f"95% t-interval on the logs {low:.2f}-{high:.2f}")
        print(f"{key[0]} {key[1]} cap {key[2]}{which}: multiplier {'>= ' if censored else ''}{geo:.2f}x ({interval}; "
              "seeds "
              f"{[round(r['multiplier'], 2) for r in mine]}, {summary[-1]['censored']} censored at "
              f"{args.multiples}x); search lead {[None if d is None else round(d, 2) for d in summary[-1]['delta_sd']]}"
              " SD", flush=True)
    (out / "multiplier.json").write_text(json.dumps({"runs": found, "summary": summary, "args": vars(args)},
                                                    indent=1))


def truncation(args) -> None:
    out, results = Path(args.out), []
    out.mkdir(parents=True, exist_ok=True)
    names = list(prompt_lib.resolve_prompts(["prompts54"], []).items())[: args.prompts]
    for model in args.models.split(","):
        rm = load_for_job(RunOptions(model=model, out=str(out)))
        for name, text in names:
            target = make_target(rm, text)
            prior = Prior.of(rm, target.prefix)
            end = turns.end_of_turn(target.suffix, rm.tokenizer, model)
            banned = banned_tokens(rm, rm.config.vocab_size, FluentConfig().gcg())
            ids, _ = sample_responses(rm, prior.cache, prior.first, banned, args.samples, args.num_tokens, 0)
            reward = score_responses(rm, target.cache, target.suffix_ids, ids, 64).astype(np.float64)
            vocab = min(rm.config.vocab_size, len(rm.tokenizer))
            tokens = np.random.default_rng(0).choice(vocab, min(2048, vocab), replace=False)
            single = score_responses(rm, target.cache, target.suffix_ids, tokens[:, None].astype(np.int32), 256)
            done = complete_responses(rm, rm, text, ids.tolist())
            gain = (reward - done.completed_reward) / float(np.std(single, ddof=1))
            ends = done.ends_turn
            results.append({"model": model, "prompt": name, "samples": len(ids), "mean_gain_sd": float(gain.mean()),
                            "median_gain_sd": float(np.median(gain)),
                            "gain_sd_not_ending": float(gain[~ends].mean()) if (~ends).any() else None,
                            "gain_sd_ending": float(gain[ends].mean()) if ends.any() else None,
                            "share_ending": float(ends.mean()), "end_of_turn": end})
            print(json.dumps(results[-1]), flush=True)
        for_model = [r for r in results if r["model"] == model]
        print(f"{model}: mean truncation gain {np.mean([r['mean_gain_sd'] for r in for_model]):+.2f} SD over "
              f"{len(for_model)} prompts", flush=True)
    (out / "truncation.json").write_text(json.dumps({"prompts": results, "args": vars(args)}, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("multiplier", "truncation"))
    parser.add_argument("--out", required=True)
    parser.add_argument("--models", default=MODELS)
    parser.add_argument("--seeds", type=lambda s: [int(v) for v in s.split(",")], default=[0, 1, 2])
    parser.add_argument("--forwards", type=int, default=2000)
    parser.add_argument("--lambdas", type=lambda s: [float(v) for v in s.split(",")], default=[0.0, 0.25, 1.0, 4.0])
    parser.add_argument("--num_tokens", type=int, default=8)
    parser.add_argument("--prompt", default="greatest")
    parser.add_argument("--multiples", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=10)
    parser.add_argument("--samples", type=int, default=128)
    args = parser.parse_args()
    {"multiplier": multiplier, "truncation": truncation}[args.mode](args)


if __name__ == "__main__":
    main()
