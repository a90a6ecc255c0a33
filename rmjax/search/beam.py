"""N-token responses: beam search over the whole vocabulary at every depth, and exhaustive enumeration.

Depth 1 is the vocabulary sweep. At depth d each kept partial response (d−1 tokens) gets one cache of
prompt prefix + partial, computed once per level in batched forwards, and every candidate token v is
scored as `prefix + partial + [v] + suffix` exactly as the sweep's token mode does (the same batch
scorer, one new position plus the suffix per candidate). The beam keeps, per direction, the K
partials whose mean reward over the prompts is highest (optimal) or lowest (pessimal); exhaustive mode
keeps every partial (all |S|^(d−1)), the ground truth beam and GCG are judged against.

Ties are broken by the order of the partials, then of the candidates, so a run and its resumed
continuation pick the same sequences.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
import time
from collections.abc import Iterator

import numpy as np

from rmjax import checks, heads, nn
from rmjax.checks import setting
from rmjax.errors import UsageError
from rmjax.model import Model
from rmjax.parallel import batching
from rmjax.parallel.distributed import barrier, is_main
from rmjax.runs.chunks import ChunkStore
from rmjax.runs.progress import Progress, duration
from rmjax.scoring import finite, memory
from rmjax.scoring.context import prepare_prompt
from rmjax.scoring.prefix import cache_row, extend_prefix, read_position, score_responses

PREFILL_ROWS = 8  # partial caches computed per forward (and held at once)


@dataclasses.dataclass(frozen=True)
class BeamConfig:
    depth: int = setting(2, "Response length N: sequences of 1..N tokens are searched, level by level.")
    beam: int = setting(64, "Partial responses kept per direction at each level (K).")
    direction: str = setting("both", "Which beam(s): the highest (optimal) or lowest (pessimal) mean reward.",
                             ("optimal", "pessimal", "both"))
    top: int = setting(100, "Sequences written per depth and direction.")
    exhaustive: bool = setting(False, "Score all |S|^d sequences of the candidate set S at every depth (no pruning; "
                               "--beam is refused). Give a small S with --token_ids or --vocab_file.")
    template: str = setting("auto", "Chat template use.", ("auto", "chat", "plain"))
    allow_special: bool = setting(False, "Keep special and byte tokens (`<|endoftext|>`, raw bytes) among the "
                                  "candidates; by default they are left out, as GCG and the frontier leave them out.")

    def __post_init__(self):
        checks.validate(self, {"depth": checks.POSITIVE, "beam": checks.POSITIVE, "top": checks.POSITIVE,
                               "direction": checks.one_of("optimal", "pessimal", "both"),
                               "template": checks.one_of("auto", "chat", "plain")})

    @property
    def directions(self) -> tuple[str, ...]:
        return ("optimal", "pessimal") if self.direction == "both" else (self.direction,)


@dataclasses.dataclass
class Found:
    """The sequences written for one (depth, direction), best first: ids [T, d], scores [T, prompts]."""

    depth: int
    direction: str
    ids: np.ndarray
    scores: np.ndarray


@dataclasses.dataclass
class BeamResult:
    found: list[Found]
    candidates: np.ndarray  # the candidate set S
    scored: int  # candidate sequences scored by this run (not resumed)
    resumed: int
    seconds: float
    levels: list[dict]
    estimate: dict  # the whole job as counted before it started: candidates, resumed, seconds, rate
    nonfinite: dict | None = None  # NaN/Inf scores written with allow_nonfinite (finite.check's record), resumed too


class _Best:
    """The `keep` best (sequence, scores) of one direction seen so far, merged chunk by chunk; ties go to the
    earlier partial, then the earlier candidate (a deterministic order whatever the chunking)."""

    def __init__(self, sign: float, keep: int, n_prompts: int, depth: int):
        self.sign, self.keep = sign, keep
        self.order = np.zeros((0, 2), np.int64)  # (partial index, candidate index)
        self.ids = np.zeros((0, depth), np.int64)
        self.scores = np.zeros((0, n_prompts), np.float32)

    def add(self, unit: int, first: int, ids: np.ndarray, scores: np.ndarray) -> None:
        order = np.stack([np.full(len(ids), unit), first + np.arange(len(ids))], axis=1)
        self.order = np.concatenate([self.order, order])
        self.ids = np.concatenate([self.ids, ids])
        self.scores = np.concatenate([self.scores, scores])
        objective = -self.sign * self.scores.astype(np.float64).mean(axis=1)
        keep = np.lexsort((self.order[:, 1], self.order[:, 0], objective))[: self.keep]
        self.order, self.ids, self.scores = self.order[keep], self.ids[keep], self.scores[keep]


def _units(cfg: BeamConfig, depth: int, candidates: np.ndarray, kept: dict[str, np.ndarray]) -> tuple[np.ndarray, dict]:
    """The partials scored at `depth` [U, depth-1] and, per direction, which of them it extends."""
    if depth == 1:
        return np.zeros((1, 0), np.int64), {d: np.asarray([0]) for d in cfg.directions}
    if cfg.exhaustive:
        units = np.asarray(list(itertools.product(candidates, repeat=depth - 1)), np.int64)
        return units, {d: np.arange(len(units)) for d in cfg.directions}
    rows = list(dict.fromkeys(tuple(r) for d in cfg.directions for r in kept[d].tolist()))
    index = {r: i for i, r in enumerate(rows)}
    units = np.asarray(rows, np.int64).reshape(len(rows), depth - 1)
    return units, {d: np.asarray([index[tuple(r)] for r in kept[d].tolist()]) for d in cfg.directions}


def _partial_caches(model: Model, contexts, units: np.ndarray,
                    needed: set[int] | None = None) -> Iterator[tuple[int, list]]:
    """(unit index, one batch-1 cache per prompt) for every partial (or those `needed`): each prompt's cache
    extended by PREFILL_ROWS partials per forward (their d−1 positions only; the prompt is never recomputed). The
    groups are fixed by index, the same whatever is `needed`: a partial's row in its forward changes how its cache
    rounds, and a resume that grouped only the partials left scored them up to 1e-5 apart from a straight run."""
    if units.shape[1] == 0:  # depth 1: the prompt's own cache
        yield 0, [ctx.cache for ctx in contexts]
        return
    rows = batching.round_up(min(PREFILL_ROWS, len(units)), model.mesh)
    for start in range(0, len(units), rows):
        group = units[start : start + rows]
        wanted = [i for i in range(len(group)) if needed is None or start + i in needed]
        if not wanted:
            continue
        padded = np.concatenate([group, np.repeat(group[-1:], rows - len(group), axis=0)])
        caches = [extend_prefix(model, ctx.cache, padded) for ctx in contexts]
        for i in wanted:
            yield start + i, [cache_row(model, c, i) for c in caches]


def beam_search(model: Model, prompts: dict[str, str], cfg: BeamConfig, candidates: np.ndarray, *,
                batch_size: int = 256, chunk_size: int = 4096, store: ChunkStore | None = None,
                allow_nonfinite: bool = False, progress_every: float = 5.0,
                depth1: np.ndarray | None = None) -> BeamResult:
    """Search level by level; with `store`, every chunk of scores is saved and a rerun continues from it.
    `depth1` [candidates, prompts]: depth 1's scores, already known (a sweep's: `depth1_scores`).

    Before the first forward it prints one estimate for the whole job (every depth and direction): the
    candidates `job_size` counts, less those on disk, at the rate of a warm-up batch timed after compiling.
    The progress line then counts and times the whole job, not one level."""
    start_time = time.perf_counter()
    candidates = np.asarray(candidates, np.int64)
    if not len(candidates):
        raise UsageError("the candidate set is empty.")
    if depth1 is not None and np.shape(depth1) != (len(candidates), len(prompts)):
        raise ValueError(f"depth1 holds {np.shape(depth1)} scores for {len(candidates)} candidates x {len(prompts)}")
    check_enumeration(cfg, len(candidates))
    contexts = [prepare_prompt(model, n, t, cfg.template, response_tokens=cfg.depth) for n, t in prompts.items()]
    allowed = set(candidates.tolist())
    for c in contexts:
        heads.check_search_keeps_gate(model.config.head, c.split.prefix, allowed.__contains__, cfg.depth,
                                      model.tokenizer, c.split.suffix)
    chunk_size = store.chunk_size if store is not None else chunk_size
    if store is not None and store.batch_size is not None:  # the batches its saved scores were computed in
        batch_size = store.batch_size
    sizes = job_size(cfg, len(candidates), from_sweep=depth1 is not None)
    estimate = _estimate(model, contexts, cfg, candidates, sizes, store, batch_size, chunk_size)
    progress = Progress(sum(sizes), "beam", every=progress_every, done=estimate["resumed"],
                        rate_hint=estimate["candidates_per_second"])
    kept: dict[str, np.ndarray] = {}
    found, levels, scored, resumed, bad = [], [], 0, 0, []
    for depth in range(1, cfg.depth + 1):
        given = depth == 1 and depth1 is not None
        units, extends = _units(cfg, depth, candidates, kept)
        keep = cfg.top if depth == cfg.depth or cfg.exhaustive else max(cfg.beam, cfg.top)
        best = {d: _Best(1.0 if d == "optimal" else -1.0, keep, len(prompts), depth) for d in cfg.directions}
        owners = {d: set(extends[d].tolist()) for d in cfg.directions}
        starts = range(0, len(candidates), chunk_size)
        total = 0 if given else len(units) * len(candidates)
        progress.total -= sizes[depth - 1] - total  # the partials the two beams share (see job_size)
        progress.label = f"beam, whole job; now depth {depth}/{cfg.depth}" + (" (exhaustive)" if cfg.exhaustive else "")
        # Every process agrees on the stored chunks before any is written (they skip the same forwards).
        on_disk = store.names() if store is not None else set()
        stored = {(u, s) for u in range(len(units)) for s in starts if _key(depth, u, s) in on_disk}
        done = sum(min(chunk_size, len(candidates) - s) for _, s in stored)
        barrier("rmjax-beam-resume")
        level_start = time.perf_counter()
        for u, caches in _cached_units(model, contexts, units, stored, starts):
            partial = units[u]
            for s in starts:
                cands = candidates[s : s + chunk_size]
                key = _key(depth, u, s)
                if given:
                    scores = depth1[s : s + chunk_size]
                    bad.append(_check(model, contexts, partial, cands, scores, allow_nonfinite))
                elif (u, s) in stored:  # held to this run's checks, as a fresh chunk
                    scores = store.read(key, (len(cands), len(prompts)), lambda v, what, p=partial, c=cands: bad.append(
                        _check(model, contexts, p, c, v, allow_nonfinite, what)))
                else:
                    scores = np.stack([score_responses(model, c, ctx.suffix, cands[:, None].astype(np.int32),
                                                       batch_size) for c, ctx in zip(caches, contexts, strict=True)],
                                      axis=1)
                    _read_past_pad(model, contexts, partial, cands, scores, batch_size)
                    bad.append(_check(model, contexts, partial, cands, scores, allow_nonfinite))
                    if store is not None and is_main():
                        store.write(key, scores)
                    scored += len(cands)
                    progress.update(len(cands))
                ids = np.concatenate([np.broadcast_to(partial, (len(cands), depth - 1)), cands[:, None]], axis=1)
                for d in cfg.directions:
                    if u in owners[d]:
                        best[d].add(u, s, ids, scores)
        resumed += done
        levels.append({"depth": depth, "partials": len(units), "candidates": total, "resumed": done,
                       "seconds": time.perf_counter() - level_start}
                      | ({"from_sweep": len(candidates)} if given else {}))
        for d in cfg.directions:
            found.append(Found(depth, d, best[d].ids[: cfg.top], best[d].scores[: cfg.top]))
            kept[d] = best[d].ids[: cfg.beam]
    return BeamResult(found, candidates, scored, resumed, time.perf_counter() - start_time, levels, estimate,
                      finite.merge(bad))


def _read_past_pad(model: Model, contexts: list, partial: np.ndarray, cands: np.ndarray, scores: np.ndarray,
                   batch_size: int) -> None:
    """A candidate that is the pad id, before a suffix the head does not read (nn.read_index), is read before it:
    its row's reward is the partial's own (+ suffix), which the prompt's cache scores (the partial's cache reads the
    prompt where nothing after it is read). Only with --allow_special (the pad id is special)."""
    pad = nn.read_pad_id(model.config)
    hit = np.flatnonzero(cands == pad) if pad is not None and len(partial) else []
    for j, ctx in enumerate(contexts):
        if len(hit) and read_position(ctx.split.suffix, pad) < 0:
            scores[hit, j] = score_responses(model, ctx.cache, ctx.suffix, np.asarray(partial, np.int32)[None],
                                             batch_size)[0]


PARTIAL_BYTES = 48  # + 48 per token: one enumerated partial (a tuple of numpy ints in a list, then its array row)


def check_candidate_set(cfg: BeamConfig, given: bool) -> None:
    """--exhaustive needs a small candidate set `given` (--token_ids, --vocab_file or --limit): refuse the whole
    vocabulary. Pure: the job and its plan (rmjax.plan.spec) share it."""
    if cfg.exhaustive and not given:
        raise UsageError("--exhaustive enumerates |S|^depth sequences: give a small candidate set S with --token_ids, "
                         "--vocab_file or --limit (the whole vocabulary is what the beam is for).")


def check_enumeration(cfg: BeamConfig, n: int) -> None:
    """--exhaustive holds all n^(depth-1) partials of its deepest level at once: refuse, before any forward, a
    candidate set or depth whose list cannot fit the host (it used to die of memory after the first levels)."""
    if not cfg.exhaustive or cfg.depth < 2:
        return
    limit = memory.host_memory_bytes()

    def need(m: int) -> int:
        return m ** (cfg.depth - 1) * (PARTIAL_BYTES + 48 * (cfg.depth - 1))

    if need(n) <= limit:
        return
    fits = memory.largest_fitting(lambda m: need(m) <= limit, n)
    raise memory.DoesNotFitError(
        f"--exhaustive --depth={cfg.depth} over {n:,} candidates enumerates {n ** (cfg.depth - 1):,} partial "
        f"responses at depth {cfg.depth} ({memory.gib(need(n))} to hold) but this host has {memory.gib(limit)}; use at "
        f"most {fits or 1:,} candidates (--limit, --token_ids, --vocab_file) or a smaller --depth.")


def _estimate(model: Model, contexts, cfg: BeamConfig, candidates: np.ndarray, sizes: list[int],
              store: ChunkStore | None, batch_size: int, chunk_size: int) -> dict:
    """The whole job's size and time, printed once before it starts: its batches (of every depth, less the chunks
    on disk) x the seconds of one batch for every prompt, timed after a compiling run of the same shape. Not
    counted: each depth's compilation and its partials' cache forwards (d-1 positions per partial, ~1/|S| of the
    level's work)."""
    n, rows = len(candidates), batching.round_up(batch_size, model.mesh)
    batches = {s: -(-min(chunk_size, n - s) // rows) for s in range(0, n, chunk_size)}  # per chunk, by first row
    on_disk = [int(k.rsplit("-c", 1)[1]) for k in (store.names() if store is not None else ())]  # first rows
    resumed = sum(min(chunk_size, n - s) for s in on_disk)
    todo = sum(size // n for size in sizes) * sum(batches.values()) - sum(batches[s] for s in on_disk)
    seconds_per_batch = 0.0
    if todo > 0:
        part = candidates[:rows, None].astype(np.int32)
        for _ in range(2):  # the first compiles
            tick = time.perf_counter()
            for ctx in contexts:
                score_responses(model, ctx.cache, ctx.suffix, part, batch_size)
            seconds_per_batch = time.perf_counter() - tick
    seconds = todo * seconds_per_batch
    rate = (sum(sizes) - resumed) / seconds if seconds > 0 else None
    if is_main():
        shared = len(cfg.directions) == 2 and not cfg.exhaustive
        parts = ", ".join(f"depth {d}: " + ("from the sweep" if d == 1 and not c else
                                            f"{'≤ ' if shared and d > 1 else ''}{c:,}") for d, c in enumerate(sizes, 1))
        timing = f" at {rate:,.1f} candidates/s (a warm-up batch of {rows}, timed after compiling)" if rate else ""
        print(f"beam: the whole job is {sum(sizes):,} candidates x {len(contexts)} prompt(s), every depth and "
              f"direction ({parts}); {resumed:,} on disk; estimate {duration(seconds)}{timing}",
              file=sys.stderr, flush=True)
    return {"candidates": sum(sizes), "per_depth": sizes, "resumed": resumed, "seconds": seconds,
            "candidates_per_second": rate}


def _cached_units(model: Model, contexts, units: np.ndarray, stored: set[tuple[int, int]], starts):
    """(unit, caches) for each partial; caches None when every chunk of the unit is already stored (no forward)."""
    pending = {u for u in range(len(units)) if not all((u, s) in stored for s in starts)}
    computed = _partial_caches(model, contexts, units, pending) if pending else iter(())
    for u in range(len(units)):
        yield u, (next(computed)[1] if u in pending else None)


def _key(depth: int, unit: int, start: int) -> str:
    return f"d{depth}-u{unit:09d}-c{start:010d}"


def _check(model: Model, contexts, partial: np.ndarray, cands: np.ndarray, scores: np.ndarray, allow: bool,
           what: str = "scores") -> dict | None:
    """finite.check of one chunk: raises on NaN/Inf unless `allow`, then returns the record for .meta.json."""
    def sequence(i: int) -> list[int]:
        return [*partial.tolist(), int(cands[i])]

    return finite.check(scores, what=what, columns=[c.name for c in contexts], allow=allow,
                        row=lambda i: f"response ids {sequence(i)}",
                        explain=lambda i, j: finite.diagnose(model, contexts[j].split.ids_with(sequence(i))))


def job_size(cfg: BeamConfig, n: int, from_sweep: bool = False) -> list[int]:
    """Candidates scored at each depth over |S| = n (depth 1 none `from_sweep`). Exact for one direction and for
    --exhaustive. With both, it assumes the two beams share no partial, which they do only where a level's best
    and worst overlap (fewer than 2K sequences, or tied means): a bound the progress line lowers as levels start."""

    def units(depth: int) -> int:
        if depth == 1:
            return 0 if from_sweep else 1
        return n ** (depth - 1) if cfg.exhaustive else len(cfg.directions) * min(cfg.beam, n ** (depth - 1))

    return [units(depth) * n for depth in range(1, cfg.depth + 1)]
