"""Search measured in forwards (issue 25): on the findings' 500-noun space, N = 2 (|S|² = 250,000 sequences, whose
exhaustive ranking this bench computes once and caches), how many forwards each method needs to find the
exhaustive optimum, for both default RMs, both directions and 5 seeds.

Methods, each stopped at --budget forwards (default 25,000, 1/10 of exhaustive search) or when it reaches rank 1:
- `gcg`: GCG from its default start (the first noun, repeated), search width 128, top-k 64;
- `beam`: the beam with K = --beam_k (default: per model, the largest K whose two levels fit the budget by the
  counter's rule, `largest_beam`; deterministic: one run per model and direction, counted once in the summary);
- `beam+gcg`: GCG seeded from the best 8 of a K = 8 beam;
- `search`: rmjax.search.fluent at λ = 0. The 500 nouns are a small set, which puts it in its exact coordinate
  steps; `--exact_limit` below 500 (e.g. 0) takes the gradient path instead, as on a whole vocabulary: gradient
  swaps, prior swaps, redrawn tails and merges are what must find the optimum (issue 43). Its responses are whole
  turns of 1 or 2 tokens, so its ground truth is the best of the 500 single tokens and the 250,000 pairs (the
  exhaustive CSV's depths 1 and 2); GCG's and the beam's is the best pair.
`--space=vocab` (issue 43): the search alone over the whole vocabulary (less special and non-ASCII tokens, as the
frontier searches it) at N = --num_tokens, in its gradient mode. No exhaustive ranking exists there (49k^N
sequences), so the ground truth is a beam over the same tokens (K = --truth_k per level, both directions, resumable,
cached): exact at depth 1, the best known whole turn of 1..N tokens beyond. A run reaches it when its best J is
within 1e-3 of the truth's (two float32 forwards along different paths: cached beam extension vs the search's
batched whole turns) or holds its ids; a run that goes past it by more has found a better turn than the beam.
Forwards follow BUILD_NOTES 'Forwards' (rmjax.search.objective): every call's positions over N + S (the RM; the
prior's over N: the jobs price them over N + 1, a whole turn, so here the search pays 1.5x for them at N = 2, a
handicap the figures kept), a gradient 3x, padding rows free. GCG and the beam are counted by wrapping their
scoring calls.

python bench/search_efficiency.py [--budget=25000] [--seeds=5] [--first_seed=0] [--exact_limit=1024] \
    [--models=elo-rm-smollm2-135m,elo-rm-gemma3-270m] [--methods=gcg,beam,beam+gcg,search]
python bench/search_efficiency.py --space=vocab --num_tokens=2 --truth_k=8 --budget=5000 --seeds=5 \
    --models=elo-rm-smollm2-135m
"""

from __future__ import annotations

import argparse
import json
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

    def __call__(self, ids, value: float | None = None) -> int:
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


def largest_beam(budget: int, candidates: int, prefix: int, tail: int, n: int = 2) -> int:
    """The largest K whose N = 2 beam over `candidates` tokens the Counter charges at most `budget` forwards: the
    prefill (prefix positions), depth 1 (each candidate and the suffix), K prefix extensions, depth 2 (K rows of
    each candidate and the suffix), all over N + `tail` positions. (K = 48, the old default, spent 74% of 25,000 on
    SmolLM2's RM and 49% on Gemma 3's: a baseline given less compute.)"""
    per_k = 1 + candidates * (1 + tail)
    room = budget * (n + tail) - prefix - candidates * (1 + tail)
    return max(1, room // per_k)


def run_beam(model, cands, direction, k, counter, rank) -> tuple[list[tuple[float, int]], np.ndarray]:
    from rmjax.search.beam import BeamConfig, beam_search

    result = beam_search(model, {"greatest": _prompt()}, BeamConfig(depth=2, beam=k, direction=direction, top=8),
                         cands, progress_every=1e9)
    best = next(f for f in result.found if f.depth == 2)
    return [(float(counter.spent), rank(best.ids[0]))], best.ids


def run_search(model, target, cands, direction, seed, budget, rank, exact_limit: int,
               n: int = 2) -> list[tuple[float, int]]:
    """The search's curve of (forwards, rank(latest J, its ids)), stopped at the budget or at rank 1."""
    from rmjax.search import fluent
    from rmjax.search.budget import Forwards
    from rmjax.search.objective import Objective
    from rmjax.search.terms import Prior

    banned = np.ones(model.config.vocab_size, bool)
    banned[cands] = False
    forwards = Forwards(budget, n + len(target.suffix), n)
    forwards.charge(len(target.prefix))
    objective = Objective(target, Prior.of(model, target.prefix), 0.0, 1.0 if direction == "optimal" else -1.0, 0.0,
                          forwards)
    curve = [(float(forwards.spent), len(cands) ** n)]

    def progress(latest):
        curve.append((latest[0], rank(latest[2], latest[1])))
        if curve[-1][1] == 1:
            raise Reached

    try:
        fluent.fluent_search(objective, fluent.FluentConfig(num_tokens=n, seed=seed, exact_limit=exact_limit), banned,
                             [], progress)
    except Reached:
        pass
    return curve


def vocab_truth(model, name: str, allowed: np.ndarray, n: int, k: int, folder: Path) -> dict:
    """Per direction, the best whole turn of 1..n tokens a beam of K over `allowed` finds: {"value": signed
    reward (J at λ = 0), "ids": its tokens, "per_depth": the best signed reward at each depth}. The beam's rows
    per depth are cached; a cached beam at least n deep serves (its depths up to n are those of a beam to n)."""
    from rmjax.runs.chunks import ChunkStore
    from rmjax.search.beam import BeamConfig, beam_search

    path = folder / name / f"vocab_beam_k{k}.json"
    key = {"model": name, "beam": k, "prompt": _prompt(), "allowed": len(allowed), "allowed_sum": int(allowed.sum())}
    saved = json.loads(path.read_text()) if path.is_file() else {}
    if saved.get("key") != key or saved.get("depth", 0) < n:
        path.parent.mkdir(parents=True, exist_ok=True)
        store = ChunkStore(folder / name / f"vocab_beam{n}_k{k}.csv", dict(key, depth=n), 4096, batch_size=256)
        result = beam_search(model, {"greatest": _prompt()}, BeamConfig(depth=n, beam=k, direction="both", top=1),
                             allowed, store=store)
        rows = [{"depth": f.depth, "direction": f.direction, "reward": float(f.scores[0, 0]),
                 "ids": f.ids[0].tolist()} for f in result.found]
        saved = {"key": key, "depth": n, "rows": rows}
        path.write_text(json.dumps(saved, indent=1))
    truth = {}
    for direction, sign in (("optimal", 1.0), ("pessimal", -1.0)):
        rows = sorted(((sign * r["reward"], r["depth"], r["ids"]) for r in saved["rows"]
                       if r["direction"] == direction and r["depth"] <= n), reverse=True)
        truth[direction] = {"value": rows[0][0], "ids": rows[0][2],
                            "per_depth": {str(d): round(v, 4) for v, d, _ in sorted(rows, key=lambda r: r[1])}}
    return truth


class Reach:
    """Rank 1 when a whole turn reaches the vocabulary ground truth (module docstring), else 2; remembers the
    best J seen, to tell how far short a run stopped or how far past the beam it went."""

    TOLERANCE = 1e-3

    def __init__(self, truth: dict, end: int):
        self.value, self.ids, self.end, self.best = truth["value"], list(truth["ids"]), end, -np.inf

    def __call__(self, ids, value: float) -> int:
        self.best = max(self.best, float(value))
        turn = [int(t) for t in ids if int(t) != self.end]
        return 1 if value >= self.value - self.TOLERANCE or turn == self.ids else 2


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
    ap.add_argument("--beam_k", type=int, default=0, help="0: per model, the largest K that fits --budget")
    ap.add_argument("--exact_limit", type=int, default=1024,
                    help="the search's exact mode up to this many candidates; below 500 it takes the gradient path")
    ap.add_argument("--models", default="elo-rm-smollm2-135m,elo-rm-gemma3-270m")
    ap.add_argument("--methods", default="gcg,beam,beam+gcg,search")
    ap.add_argument("--cache", default=str(REPO / ".cache" / "rmjax" / "bench"))
    ap.add_argument("--space", default="nouns", choices=("nouns", "vocab"),
                    help="the 500 nouns at N = 2 (exhaustive truth), or the whole vocabulary (the search alone)")
    ap.add_argument("--num_tokens", type=int, default=2, help="N, with --space=vocab")
    ap.add_argument("--truth_k", type=int, default=8, help="the ground-truth beam's K, with --space=vocab")
    args = ap.parse_args()
    if args.space == "vocab":
        return main_vocab(args)

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
        beam_k = args.beam_k or largest_beam(args.budget, len(cands), len(target.prefix), len(target.suffix))
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
                            curve, _ = run_beam(model, cands, direction, beam_k, counter, rank)
                            share = curve[-1][0] / args.budget
                            print(f"{name} {direction} beam K = {beam_k}: {curve[-1][0]:,.0f} forwards, "
                                  f"{share:.0%} of the budget", flush=True)
                            if share > 1:
                                print(f"  (past the budget: --beam_k={beam_k} is more than it buys)", flush=True)
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
        if method == "beam":  # deterministic: its seeds are copies of one run per model and direction
            items = list({(model, direction): (model, direction, seed, curve)
                          for model, direction, seed, curve in items}.values())
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


def main_vocab(args) -> None:
    """--space=vocab: the search's forwards to the beam's best whole turn over the whole vocabulary."""
    from rmjax.loading import load
    from rmjax.parallel.distributed import quiet_absent_tpu
    from rmjax.search import turns
    from rmjax.search.gcg import make_target
    from rmjax.search.gcg_config import GCGConfig
    from rmjax.search.gcg_start import banned_tokens

    quiet_absent_tpu()
    rows, started = [], time.perf_counter()
    for name in args.models.split(","):
        model = load(name)
        target = make_target(model, _prompt())
        allowed = np.flatnonzero(~banned_tokens(model, model.config.vocab_size, GCGConfig()))
        truth = vocab_truth(model, name, allowed, args.num_tokens, args.truth_k, Path(args.cache))
        end = turns.end_of_turn(target.suffix, model.tokenizer, name)
        for direction in ("optimal", "pessimal"):
            goal = truth[direction]
            print(f"{name} {direction}: the beam's best (K = {args.truth_k}) {goal['value']:+.4f} "
                  f"{model.tokenizer.decode(goal['ids'])!r}; per depth {goal['per_depth']}", flush=True)
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                tick, reach = time.perf_counter(), Reach(goal, end)
                curve = run_search(model, target, allowed, direction, seed, args.budget, reach, args.exact_limit,
                                   args.num_tokens)
                first = next((f for f, r in curve if r == 1), None)
                rows.append((name, direction, seed, first, reach.best - goal["value"]))
                at = f"reached at {first:,.0f} forwards" if first is not None else "not reached"
                print(f"{name} {direction} seed {seed}: {at}; best J − truth {reach.best - goal['value']:+.4f} "
                      f"({time.perf_counter() - tick:.0f} s)", flush=True)
    firsts = [r[3] for r in rows]
    hit = [f for f in firsts if f is not None]
    worst = f"{max(hit):,.0f}" if hit and len(hit) == len(firsts) else f"> {args.budget:,}"
    median = f"{np.median(hit):,.0f}" if hit else "-"
    past = sum(r[4] > Reach.TOLERANCE for r in rows)
    short = [r[4] for r in rows if r[3] is None]
    print(f"\nsearch, whole vocabulary, N = {args.num_tokens}, budget {args.budget:,} forwards, truth: beam K = "
          f"{args.truth_k} ({time.perf_counter() - started:.0f} s)")
    print(f"reached {len(hit)} / {len(rows)}; forwards to reach: median {median}, worst {worst}; went past the "
          f"beam's best in {past}; median shortfall of the others {np.median(short) if short else 0:+.4f}")


if __name__ == "__main__":
    main()
