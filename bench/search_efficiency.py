"""Search measured in forwards (issue 25): on the findings' 500-noun space, N = 2 (|S|² = 250,000 sequences, whose
exhaustive ranking this bench computes once and caches), how many forwards each method needs to find the
exhaustive optimum, for both default RMs, both directions and 5 seeds.

Methods, each stopped at --budget forwards (default 25,000, 1/10 of exhaustive search) or when it reaches rank 1:
- `gcg`: GCG from its default start (the first noun, repeated), search width 128, top-k 64;
- `beam`: the beam with K = --beam_k (the largest K whose two levels fit the budget; deterministic: one run
  stands for every seed);
- `beam+gcg`: GCG seeded from the best 8 of a K = 8 beam;
- `search`: rmjax.search.fluent at λ = 0. The 500 nouns are a small set, which puts it in its exact coordinate
  steps; `--exact_limit` below 500 (e.g. 0) takes the gradient path instead, as on a whole vocabulary: gradient
  swaps, prior swaps, redrawn tails and merges are what must find the optimum (issue 43). Its responses are whole
  turns of 1 or 2 tokens, so its ground truth is the best of the 500 single tokens and the 250,000 pairs (the
  exhaustive CSV's depths 1 and 2); GCG's and the beam's is the best pair.
Forwards follow BUILD_NOTES 'Forwards' (rmjax.search.objective): every call's positions over N + S (the RM; the
prior's over N), a gradient 3x, padding rows free. GCG and the beam are counted by wrapping their scoring calls.

python bench/search_efficiency.py [--budget=25000] [--seeds=5] [--first_seed=0] [--exact_limit=1024] \
    [--models=elo-rm-smollm2-135m,elo-rm-gemma3-270m] [--methods=gcg,beam,beam+gcg,search]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CHECKPOINTS = (500, 1000, 2500, 5000, 10000, 25000)


class Reached(Exception):
    """The run found the exhaustive optimum: no need to spend the rest."""


def exhaustive(model: str, folder: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the 500 candidate ids, their N = 2 scores [500, 500], their single-token scores [500]) of `model` for
    `greatest`, computed once with experiments.beam --exhaustive (resumable) and cached."""
    from rmjax.runs import results

    words = folder / "words500.txt"
    if not words.is_file():
        subprocess.run([sys.executable, str(REPO / "bench" / "nouns.py"), str(words)], check=True, cwd=REPO)
    out = folder / model / "exhaustive2.csv"
    if not results.meta_path(out).is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "experiments.beam", f"--model={model}", "--prompts=greatest",
                        f"--vocab_file={words}", "--depth=2", "--exhaustive", "--direction=optimal", "--top=250000",
                        "--show=1", f"--out={out}"], check=True, cwd=REPO)
    whole = results.read_beam_csv(out)
    df = whole[whole.depth == 2]
    ids = np.asarray(df.ids.tolist(), np.int64)
    cands = np.unique(ids)
    where = {t: i for i, t in enumerate(cands.tolist())}
    table = np.full((len(cands), len(cands)), np.nan)
    table[[where[a] for a in ids[:, 0]], [where[b] for b in ids[:, 1]]] = df["greatest"].to_numpy(np.float64)
    assert np.isfinite(table).all(), "the exhaustive CSV does not cover |S|^2 sequences"
    ones = whole[whole.depth == 1]
    single = np.full(len(cands), np.nan)
    single[[where[i[0]] for i in ones.ids]] = ones["greatest"].to_numpy(np.float64)
    assert np.isfinite(single).all(), "the exhaustive CSV does not cover |S| single tokens"
    return cands, table, single


class Ranks:
    """A response's rank among the ground truth's (1: the optimum): the pairs, and with `single` the single tokens
    too (whole turns: a 1-token response is its token then `end`)."""

    def __init__(self, cands: np.ndarray, table: np.ndarray, direction: str, single: np.ndarray | None = None,
                 end: int | None = None):
        self.where = {t: i for i, t in enumerate(cands.tolist())}
        self.table, self.single, self.end = table, single, end
        self.sign = 1.0 if direction == "optimal" else -1.0
        pool = table.ravel() if single is None else np.concatenate([table.ravel(), single])
        self.sorted = np.sort(-self.sign * pool)

    def __call__(self, ids) -> int:
        first = self.where[int(ids[0])]
        if self.single is not None and int(ids[1]) == self.end:
            value = -self.sign * self.single[first]
        else:
            value = -self.sign * self.table[first, self.where[int(ids[1])]]
        return int(np.searchsorted(self.sorted, value, side="left")) + 1


class Counter:
    """Forwards of GCG and the beam, counted from their scoring calls' arguments."""

    def __init__(self, tail: int, n: int = 2):
        self.tail, self.n, self.spent = tail, n, Fraction(0)

    def add(self, positions: int) -> None:
        self.spent += Fraction(int(positions), self.n + self.tail)

    def install(self) -> None:
        from rmjax.search import beam, gcg

        def wrap(module, name, positions):
            real = getattr(module, name)

            def call(*args, **kwargs):
                self.add(positions(*args, **kwargs))
                return real(*args, **kwargs)
            setattr(module, name, call)

        def variants(model, extended, suffix, current, v, rows, **_):
            return sum(self.n - next((j for j in range(self.n) if row[j] != current[j]), self.n - 1) + len(suffix)
                       for row in np.asarray(v).tolist())

        # the beam's start-up estimate times two warm-up batches: not search work, not counted (nor run)
        beam._estimate = lambda *a, **k: {"candidates": 0, "per_depth": [], "resumed": 0, "seconds": 0.0,
                                          "candidates_per_second": None}
        for module in (gcg, beam):
            wrap(module, "score_responses", lambda m, c, s, r, b: np.shape(r)[0] * (np.shape(r)[1] + self.tail))
            wrap(module, "extend_prefix", lambda m, c, x: np.size(x))
        wrap(gcg, "score_variants", variants)
        wrap(gcg, "reward_gradient_on_device", lambda t, ids: 3 * (len(ids) + self.tail))


def run_gcg(target, cands, direction, seed, budget, counter, rank, init=()) -> list[tuple[float, int]]:
    from rmjax.search import gcg
    from rmjax.search.gcg_config import GCGConfig

    cfg = GCGConfig(num_tokens=2, steps=10**6, direction=direction, seed=seed, token_ids=tuple(cands.tolist()),
                    retokenize_filter=False, init=tuple(init))
    search = gcg._begin([target], cfg, None)
    curve = [(float(counter.spent), rank(search.buffer[0][1]))]
    for step in range(10**6):
        if counter.spent >= budget or curve[-1][1] == 1:
            break
        search.step(step)
        curve.append((float(counter.spent), rank(search.buffer[0][1])))
    return curve


def run_beam(model, cands, direction, k, counter, rank) -> tuple[list[tuple[float, int]], np.ndarray]:
    from rmjax.search.beam import BeamConfig, beam_search

    result = beam_search(model, {"greatest": _prompt()}, BeamConfig(depth=2, beam=k, direction=direction, top=8),
                         cands, progress_every=1e9)
    best = next(f for f in result.found if f.depth == 2)
    return [(float(counter.spent), rank(best.ids[0]))], best.ids


def run_search(model, target, cands, direction, seed, budget, rank, exact_limit: int) -> list[tuple[float, int]]:
    from rmjax.search import fluent
    from rmjax.search.objective import Forwards, Objective, Prior

    banned = np.ones(model.config.vocab_size, bool)
    banned[cands] = False
    forwards = Forwards(budget, 2 + len(target.suffix), 2)
    forwards.charge(len(target.prefix))
    objective = Objective(target, Prior.of(model, target.prefix), 0.0, 1.0 if direction == "optimal" else -1.0, 0.0,
                          forwards)
    curve = [(float(forwards.spent), len(cands) ** 2)]

    def progress(latest):
        curve.append((latest[0], rank(latest[2])))
        if curve[-1][1] == 1:
            raise Reached

    try:
        fluent.fluent_search(objective, fluent.FluentConfig(num_tokens=2, seed=seed, exact_limit=exact_limit), banned,
                             [], progress)
    except Reached:
        pass
    return curve


def _prompt() -> str:
    from rmjax.text import prompts

    return prompts.PAPER1["greatest"]


def best_at(curve, forwards: float) -> int | None:
    seen = [r for f, r in curve if f <= forwards]
    return min(seen) if seen else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=int, default=25000)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--first_seed", type=int, default=0, help="seeds first_seed .. first_seed + seeds - 1")
    ap.add_argument("--beam_k", type=int, default=48)
    ap.add_argument("--exact_limit", type=int, default=1024,
                    help="the search's exact mode up to this many candidates; below 500 it takes the gradient path")
    ap.add_argument("--models", default="elo-rm-smollm2-135m,elo-rm-gemma3-270m")
    ap.add_argument("--methods", default="gcg,beam,beam+gcg,search")
    ap.add_argument("--cache", default=str(REPO / ".cache" / "rmjax" / "bench"))
    args = ap.parse_args()

    from rmjax.loading import load
    from rmjax.parallel.distributed import quiet_absent_tpu
    from rmjax.search import turns
    from rmjax.search.gcg import make_target

    quiet_absent_tpu()
    runs = {m: [] for m in args.methods.split(",")}  # method -> [(model, direction, seed, curve)]
    started = time.perf_counter()
    for name in args.models.split(","):
        cands, table, single = exhaustive(name, Path(args.cache))
        model = load(name)
        target = make_target(model, _prompt())
        counter = Counter(len(target.suffix))
        counter.install()
        for direction in ("optimal", "pessimal"):
            rank = Ranks(cands, table, direction)
            end = turns.end_of_turn(target.suffix, model.tokenizer, name)
            turn_rank = Ranks(cands, table, direction, single, end)  # the search's: whole turns of 1 or 2 tokens
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                for method in runs:
                    counter.spent = Fraction(len(target.prefix), 2 + len(target.suffix))  # the prompt's prefill
                    tick = time.perf_counter()
                    if method == "gcg":
                        curve = run_gcg(target, cands, direction, seed, args.budget, counter, rank)
                    elif method == "beam":
                        if seed != args.first_seed:
                            curve = runs[method][-1][3]  # deterministic: the same run
                        else:
                            curve, _ = run_beam(model, cands, direction, args.beam_k, counter, rank)
                    elif method == "beam+gcg":
                        beam_curve, seeds = run_beam(model, cands, direction, 8, counter, rank)
                        init = [model.tokenizer.decode(ids.tolist()) for ids in seeds]
                        curve = beam_curve + run_gcg(target, cands, direction, seed, args.budget, counter, rank, init)
                    else:
                        curve = run_search(model, target, cands, direction, seed, args.budget, turn_rank,
                                           args.exact_limit)
                    runs[method].append((name, direction, seed, curve))
                    reached = [f for f, r in curve if r == 1]
                    at = f" at {reached[0]:,.0f} forwards" if reached else ""
                    print(f"{name} {direction} seed {seed} {method}: best rank {min(r for _, r in curve)}{at} "
                          f"({time.perf_counter() - tick:.0f} s)", flush=True)
    print(f"\n{len(runs)} methods x {len(next(iter(runs.values())))} runs, budget {args.budget:,} forwards "
          f"({time.perf_counter() - started:.0f} s)")
    header = "method     reach rank 1   median / worst forwards to rank 1   median best rank at " + \
        " ".join(f"{c:>6,}" for c in CHECKPOINTS)
    print(header)
    for method, items in runs.items():
        firsts = [next((f for f, r in c if r == 1 and f <= args.budget), None) for *_, c in items]
        hit = [f for f in firsts if f is not None]
        median = f"{np.median(hit):,.0f}" if hit else "-"
        worst = f"{max(hit):,.0f}" if len(hit) == len(firsts) else f"> {args.budget:,}"  # a run that never reached
        median = f"{median} / {worst}"
        at = []
        for checkpoint in CHECKPOINTS:
            values = [best_at(c, checkpoint) for *_, c in items]
            values = [v for v in values if v is not None]
            at.append(f"{np.median(values):>6,.0f}" if values else f"{'-':>6}")
        print(f"{method:<10} {len(hit):>3} / {len(items):<3}     {median:>20}                 {' '.join(at)}")


if __name__ == "__main__":
    main()
