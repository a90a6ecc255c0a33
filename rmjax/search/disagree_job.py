"""The disagreement job (issue 46): per prompt and direction, the frontier's search on the gap z_A − z_B (plus its
fluency term) and best-of-N at the same forwards, every written row re-scored by each side as `experiments.score`
scores a text, judged and completion-checked; optionally the vocabulary-wide map. Resumable unit by unit (a unit:
prompt, direction, method), then DIR/disagree.csv, DIR/vocab_map.csv, DIR/disagree.png and .meta.json.

a_over_b: responses side A rates far above side B (gap > 0 is the goal); b_over_a: the reverse. Side A must be a
reward model (the search's gradient is A's, in A's tokens); B a reward model or `implicit:CHOSEN:REFERENCE`.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

from rmjax import heads
from rmjax.errors import NonFiniteError, UsageError
from rmjax.loading import config_of
from rmjax.loading.for_job import job_fingerprint, load_for_job
from rmjax.model import Model, require_reward_model
from rmjax.parallel import batching
from rmjax.parallel.distributed import is_main
from rmjax.runs import results
from rmjax.runs.chunks import ChunkStore, open_store, store_dir
from rmjax.runs.options import claim_job, model_inputs
from rmjax.runs.progress import PhaseClock, Progress
from rmjax.scoring import finite, memory
from rmjax.search import disagree_out, frontier_checks, turns
from rmjax.search.baseline import best_of_n, distinct_samples
from rmjax.search.budget import BudgetSpent, Forwards
from rmjax.search.completion import require_prior_config, same_tokenizer
from rmjax.search.disagree import Disagreement, map_rewards, shared_strings, twin_map, vocab_map
from rmjax.search.disagree_config import DisagreeConfig, DisagreeSpec, parse_sides, refuse_column_read_as_lm
from rmjax.search.fluent import fluent_search
from rmjax.search.frontier_job import BEST_OF_N, OWN_PRIOR_DRAWS, default_judge, left_out
from rmjax.search.frontier_unit import search_rows
from rmjax.search.gcg import make_target
from rmjax.search.gcg_start import banned_tokens
from rmjax.search.gcg_swaps import RetokenizationCheck, disallowed_ids
from rmjax.search.objective import Objective
from rmjax.search.sides import Side, SideSpec, make_side, refuse_one_model
from rmjax.search.sweep import memory_plan
from rmjax.search.terms import Prior
from rmjax.text import chat

MAP_BATCH = 256  # the most --batch_size=0 picks: the memory plan counts the other models' weights, not their work


def folder_paths(folder: str | Path) -> dict[str, Path]:
    folder = Path(folder)
    return {"csv": folder / "disagree.csv", "map": folder / "vocab_map.csv", "png": folder / "disagree.png"}


def _check_configs(spec: DisagreeSpec, a: SideSpec, b: SideSpec) -> tuple[str, int]:
    """Every model's config read before any weight: side A (and B's RM) a reward model, the LMs with LM heads;
    the judge's spec and the map's batch size (_check_prompts)."""
    rm_config, column = config_of(a.models[0]), spec.options.output_column
    chosen = spec.options.column_chosen
    require_reward_model(rm_config, a.models[0], "the disagreement search's side A", column, chosen)
    refuse_column_read_as_lm(a, b, spec.lm, column)
    if b.implicit:
        for name, source in zip(("CHOSEN", "REFERENCE"), b.models, strict=True):
            if config_of(source).is_reward_model:  # as experiments.logprobs: an RM's backbone is no LM of its own
                raise UsageError(f"--models implicit {name}={source} is a reward model; the implicit reward is two "
                                 "causal LMs' log-prob difference: give a *ForCausalLM (the RM's base model, say).")
    else:
        require_reward_model(config_of(b.models[0]), b.models[0], "side B", column, chosen)
    judge = spec.judge or default_judge(rm_config)
    if spec.config.search:  # the map alone needs no prior and no judge
        for flag, source, given in (("--lm", spec.lm or a.models[0], bool(spec.lm)),
                                    ("--judge", judge, bool(spec.judge))):
            require_prior_config(config_of(source), source, flag, given)
    return judge, _check_prompts(spec, b, judge)


def _check_prompts(spec: DisagreeSpec, b: SideSpec, judge: str) -> int:
    """Every prompt against every model that reads it (side A, B's models, the prior, the judge: each one's context)
    and a budget that buys a candidate (each side's prefill, one sampled response scored by both sides), refused before
    loading, as the frontier's (frontier_checks.PromptChecks). The map alone reads one-token responses."""
    search = spec.search if spec.config.search else dataclasses.replace(spec.search, num_tokens=1)
    others = [(f"side B {m}", m, not b.implicit) for m in b.models]  # an implicit side's LMs: prompt, response, end
    prompt_checks = frontier_checks.PromptChecks(spec.options, search, spec.lm if spec.config.search else None,
                                           judge if spec.config.search else None, others,
                                           others_each=b.each, load_once=True, searches=spec.config.search)
    for text in spec.prompts.values():
        prompt_checks.check(text, spec.config.forwards if spec.config.search else None)
    # a side-B RM of side A's architecture may share its lower layers: the map then runs both in one forward
    # (rmjax.scoring.forked), on a CPU in bfloat16 with a float32 copy of each (counted whenever it may: whether
    # they share layers is known only from the weights)
    rm_config, o = prompt_checks.rm[0], spec.options
    forked = spec.config.vocab_map and not b.implicit and any(other[1] == rm_config for other in prompt_checks.others)
    copy = memory.upcast_bytes(rm_config, o.dtype, batching.model_shards(o.mesh)) if forked else 0
    held = sum(prompt_checks.weights("disagreement job", "a smaller side B" + (
        ", judge (--judge) or prior (--lm)" if spec.config.search else ""), at_once=2 * copy))
    held += copy  # beside either RM's own plan (its own copy in it): the other's, the same size
    return map_batch(spec, [prompt_checks.rm, *([] if b.implicit else [o[1:3] for o in prompt_checks.others])], held)


def map_batch(spec: DisagreeSpec, reward_models: list[tuple], weights: int = 0) -> int:
    """One-token responses per forward of the vocabulary map and the yardsticks: --batch_size held to each reward
    model's memory plan (the sweep's, beside the other models' part of `weights`, every held model's per-device
    bytes; DoesNotFitError names the batch that fits), or when 0 the largest batch every one fits, at most
    MAP_BATCH: the plan counts the other models' weights, not their activations (the forked map runs two RMs in
    one forward), so the pick stays within the size the map always ran at."""
    o = spec.options
    plans = [memory_plan(cfg, tokenizer, spec.prompts, o.template, o.dtype, o.mesh, spec.batch_size or None,
                         held=memory.beside(weights, cfg, o.dtype, o.mesh))
             for cfg, tokenizer in reward_models]
    return spec.batch_size or min(MAP_BATCH, *(plan.batch_size for plan in plans))


def disagree_identity(spec: DisagreeSpec, sides: tuple[SideSpec, SideSpec], judge: str) -> dict:
    o = spec.options
    fp = {m: job_fingerprint(o, m) for side in sides for m in side.models}
    refuse_one_model(sides, fp)
    # each model by its content, not the name typed (`rm`, `rm/`, an absolute path: one side; helper-159)
    return {"job": "disagree", "sides": [{"kind": "implicit" if s.implicit else "rm",
                                          "models": [fp[m] for m in s.models]} for s in sides],
            "lm": job_fingerprint(o, spec.lm) if spec.lm and spec.config.search else None,
            "judge": {"model": job_fingerprint(o, judge), "template": "its own"} if spec.config.search
            else None,
            "dtype": o.dtype, "output_column": int(o.output_column), "template": o.template,
            "prompts": dict(spec.prompts), "config": dataclasses.asdict(spec.config),
            "search": dataclasses.asdict(spec.search), "responses": "whole turns (issue 43)", "best_of_n": BEST_OF_N,
            "own_prior_draws": OWN_PRIOR_DRAWS,
            "side_b_paid": "once a text, and its prompt's prefill", **left_out(spec.config)}


def run_disagree(spec: DisagreeSpec) -> Path | None:
    """Checks and identity without loading → claim DIR → load both sides, the prior and the judge → per prompt:
    yardsticks, the vocabulary map, the units (resumable) → DIR's files and .meta.json. Returns DIR (None off the
    main process)."""
    if not spec.config.search:  # the map alone reads no prior: not loaded, not counted (the entry refuses --lm)
        spec = dataclasses.replace(spec, lm=None)
    o, cfg = spec.options, spec.config
    a, b = parse_sides(spec.models, cfg.b_gradient)
    if o.model != a.models[0]:
        raise UsageError(f"options.model ({o.model}) is not side A ({a.models[0]}).")
    judge, batch_size = _check_configs(spec, a, b)
    identity = disagree_identity(spec, (a, b), judge)
    paths = folder_paths(o.out)
    main = paths["csv"] if cfg.search else paths["map"]
    # all, written or not, and the other kind of run's record: a rerun leaves no earlier run's map or record
    other = paths["map"] if cfg.search else paths["csv"]
    owned = [p for p in paths.values() if p != main] + [results.meta_path(other)]
    with claim_job(o, identity, out=main, owned=owned, store=store_dir(main),
                   inputs=model_inputs(models=",".join(b.models), lm=spec.lm, judge=judge)) as job:
        if job.reuse:
            return Path(o.out)
        clock = PhaseClock()
        models = _load(spec, a, b)
        rm = models[a.models[0]]
        lm = models.get(spec.lm, rm) if spec.lm else rm
        same_tokenizer(rm, lm)
        # the judge reads its own template (judge_perplexities), whatever --template the sides read
        judging = dataclasses.replace(o, output_column=0, template="auto")
        judge_model = load_for_job(judging, judge) if cfg.search else None
        store = open_store(main, identity, 1)
        clock("load")
        ready = {name: _prepare(spec, models, a, b, rm, lm, name, text, batch_size)
                 for name, text in spec.prompts.items()}
        first = next(iter(ready.values()))
        twins = cfg.search and cfg.b_gradient and first.side_b.gradient_each > 0
        shared = _shared(first, cfg) if cfg.vocab_map or twins else None  # alike for every prompt
        for p in ready.values():
            p.token_map = twin_map(shared, rm.config.vocab_size) if twins else None
        clock("prepare")
        read_backs = {"a": {}, "b": {}}  # each side's masks over `shared`, by what a read-back rests on
        made = {name: _map_of(store, index, p, name, shared, read_backs) for index, (name, p)
                in enumerate(ready.items()) if cfg.vocab_map}
        readable, raw = ({name: m[k] for name, m in made.items()} for k in (0, 1))
        clock("vocab_map")
        # each side's single-token rewards over z_sample tokens a prompt: a minute or more before the search's first
        # line on a CPU (the default RMs'), shown as it goes
        sampled = Progress(len(ready), "disagree: yardsticks, single-token rewards on each side", unit="prompts",
                           every=10.0)
        sampled.update(0, force=True)
        for name, p in ready.items():
            p.z_a, p.z_b = _yardsticks(p, spec, readable.get(name), raw.get(name))
            sampled.update(1)
        clock("yardsticks")
        maps = {name: vocab_map(readable[name], raw[name], p.z_a, p.z_b, name, left_out=len(shared) -
                                len(readable[name])) for name, p in ready.items() if name in raw}
        units = _units(spec, ready, store) if cfg.search else []
        clock("search")
        table = disagree_out.rows(units, ready, judge_model, spec, clock) if cfg.search else []
        summary = disagree_out.summaries(table, units, maps, cfg)
        job.finish(lambda path: disagree_out.write(paths, table, maps, cfg), model=rm.source,
                   allow_nonfinite=o.allow_nonfinite,
                   sides=[{"spec": s.text, "models": [models[m].source for m in s.models]} for s in (a, b)],
                   lm=lm.source if cfg.search else None, judge=judge_model.source if cfg.search else None,
                   dtype=o.dtype, prompts=spec.prompts,
                   config=dataclasses.asdict(cfg), search=dataclasses.asdict(spec.search),
                   yardsticks={n: {"a": list(p.z_a), "b": list(p.z_b)} for n, p in ready.items()},
                   yardsticks_sampled={n: {"a": p.z_a.record(), "b": p.z_b.record()} for n, p in ready.items()},
                   units=[u.meta() for u in units], summary=summary, batch_size=batch_size,
                   seconds=sum(clock.seconds.values()), seconds_by_phase=clock.rounded())
        if is_main():
            store.remove()
            print(disagree_out.describe(summary, paths, cfg), file=sys.stderr)
    return Path(o.out)


def _load(spec: DisagreeSpec, a: SideSpec, b: SideSpec) -> dict[str, Model]:
    """Every distinct model once: reward models with the job's output column, LMs with none."""
    o, out = spec.options, {}
    lms = set(b.models if b.implicit else ()) | ({spec.lm} if spec.lm else set())
    for m in dict.fromkeys([*a.models, *b.models, *([spec.lm] if spec.lm else [])]):
        out[m] = load_for_job(dataclasses.replace(o, output_column=0) if m in lms else o, m)
    return out


@dataclasses.dataclass(eq=False)
class Ready:
    """A prompt made ready: both sides, A's target and prior, A's allowed tokens and the checks every candidate
    passes; then the sides' yardsticks (after the map, whose rewards they read)."""

    prompt: str
    side_a: Side
    side_b: Side
    target: object
    prior: Prior | None  # None for the map alone (--nosearch)
    banned: np.ndarray
    retokenize: list
    end: int
    plain: bool  # side A reads the plain template (Disagreement.content)
    token_map: np.ndarray | None = None  # Disagreement.token_map: B's gradient through the strings both share
    z_a: finite.Scale | None = None
    z_b: finite.Scale | None = None


def _prepare(spec: DisagreeSpec, models: dict[str, Model], a: SideSpec, b: SideSpec, rm: Model, lm: Model,
             name: str, text: str, batch_size: int = 256) -> Ready:
    o, cfg = spec.options, spec.config
    side_a, side_b = (make_side(s, models, text, o.template, batch_size) for s in (a, b))
    target = make_target(rm, text, o.template)
    end = turns.end_of_turn(target.suffix, rm.tokenizer, rm.source)
    prior = None if not cfg.search else Prior.of(
        lm, target.prefix if lm is rm else chat.split_chat(lm.tokenizer, text, o.template).prefix)
    gcg_cfg = spec.search.gcg(allow_non_ascii=cfg.allow_non_ascii, allow_special=cfg.allow_special,
                             template=o.template)
    banned = turns.banned_with_end(banned_tokens(rm.tokenizer, min(rm.config.vocab_size, lm.config.vocab_size),
                                                 gcg_cfg), end)
    heads.check_search_keeps_gate(rm.config.head, target.prefix, lambda i: i < len(banned) and not banned[i],
                                  spec.search.num_tokens, rm.tokenizer, target.suffix)
    check = RetokenizationCheck(chat.Conversations(rm.tokenizer, text, o.template), target.prefix, target.suffix)
    plain = chat.split_chat(rm.tokenizer, text, o.template).template == "plain"
    ready = Ready(text, side_a, side_b, target, prior, banned, [check], end, plain)
    ready.retokenize.append(_partner(ready, o.allow_nonfinite).round_trips)
    return ready


def _partner(p: Ready, allow: bool) -> Disagreement:
    return Disagreement(p.target.model.tokenizer, p.end, p.z_a, p.side_b, p.z_b, allow, p.plain, p.token_map)


def _shared(p: Ready, cfg: DisagreeConfig):
    """The strings both vocabularies read as one allowed token, each side by the job's --allow_special and
    --allow_non_ascii (B's were fixed off: the flags, recorded, changed nothing in the map)."""
    banned_b = disallowed_ids(p.side_b.tokenizer, p.side_b.vocab, allow_special=cfg.allow_special,
                              allow_non_ascii=cfg.allow_non_ascii)
    return shared_strings(p.side_a, p.side_b, p.banned, banned_b)


def _read_back(p: Ready, shared, done: dict[str, dict]):
    """The shared strings whose single-token sequence is, on each side, the string's own conversation after this
    prompt: token mode scores prefix + [id] + suffix, and a plain template reads 'love' as ' love' (a fault hunt:
    32% of the default pair's strings, B's 'love' +3.23 in the map against +3.68 as a text). `done`: each side's
    masks over `shared` after the prompts before (a prompt that reads tokens back as one of them reuses its mask)."""
    texts, ids_a, ids_b = shared["text"].tolist(), shared["token_a"].to_numpy(), shared["token_b"].to_numpy()
    keep = p.side_a.tokens_read_back(ids_a, texts, done["a"])
    if not (np.array_equal(ids_a, ids_b) and p.side_a.reads_like(p.side_b)):  # else B's mask is A's
        keep = keep & p.side_b.tokens_read_back(ids_b, texts, done["b"])
    return shared[keep].reset_index(drop=True)


def _map_of(store: ChunkStore, index: int, p: Ready, name: str, shared, read_backs: dict[str, dict]):
    """A prompt's map (the strings both sides read back, both sides' rewards), kept in the store as one chunk: a
    rerun after a crash reads it instead of reading back and scoring the whole shared vocabulary again."""
    key = f"m{index:04d}"
    if store.has(key):
        return _read_map(store, key, shared)
    readable = _read_back(p, shared, read_backs)
    ra, rb, layers = _map_rewards(p, name, readable)
    if is_main():
        rows = np.column_stack([readable["token_a"], readable["token_b"], ra, rb]).astype(np.float64)
        store.write(key, np.vstack([[len(rows), layers, np.nan, np.nan], rows]))
    return readable, (ra, rb, layers)


def _read_map(store: ChunkStore, key: str, shared):
    """A stored map, held to the shared strings of this run: its token pairs are those of the strings it kept, in
    their order."""
    packed = store.load(key)
    ok = packed.dtype == np.float64 and packed.ndim == 2 and packed.shape[1] == 4 and len(packed) >= 1 \
        and float(packed[0, 0]) == len(packed) - 1
    pairs = packed[1:, :2] if ok else np.zeros((0, 2))
    if ok and not (np.isfinite(pairs).all() and (pairs == np.round(pairs)).all()):
        ok = False
    stored = set(map(tuple, pairs.astype(np.int64).tolist()))
    keep = np.fromiter(((a, b) in stored for a, b in zip(shared["token_a"], shared["token_b"], strict=True)), bool,
                       len(shared))
    readable = shared[keep].reset_index(drop=True)
    if not ok or len(readable) != len(pairs) or not np.array_equal(
            readable[["token_a", "token_b"]].to_numpy(np.int64), pairs.astype(np.int64)):
        raise store.damaged(key, f"is not a vocabulary map of this run ({packed.dtype} of shape {packed.shape})")
    return readable, (packed[1:, 2].copy(), packed[1:, 3].copy(), int(packed[0, 1]))


def _map_rewards(p: Ready, name: str, shared):
    """Both sides' single-token rewards over the strings both vocabularies share as allowed single tokens."""
    if shared.empty:
        raise UsageError(f"the two sides share no allowed single-token string for prompt {name!r}: no vocabulary "
                         "map.")
    return map_rewards(p.side_a, p.side_b, shared, name)


def _yardsticks(p: Ready, spec: DisagreeSpec, shared, raw) -> tuple[finite.Scale, finite.Scale]:
    """Each side's yardstick (Side.yardstick), its sampled tokens' rewards read from the map where it scored them."""
    known = [None, None] if raw is None else [dict(zip(shared[column].tolist(), rewards.tolist(), strict=True))
                                              for column, rewards in (("token_a", raw[0]), ("token_b", raw[1]))]
    z_a, z_b = (side.yardstick(spec.config.z_sample, spec.options.allow_nonfinite, have)
                for side, have in zip((p.side_a, p.side_b), known, strict=True))
    return z_a, z_b


@dataclasses.dataclass
class Unit:
    """One (prompt, direction, method): its written rows (A's ids [W, N]; both sides' rewards as the search
    scored them), the forwards it spent and its time."""

    prompt: str
    direction: str
    method: str
    ids: np.ndarray
    reward_a: np.ndarray
    reward_b: np.ndarray
    forwards: float
    seconds: float

    def meta(self) -> dict:
        return {"prompt": self.prompt, "direction": self.direction, "method": self.method, "rows": len(self.ids),
                "forwards": self.forwards, "seconds": round(self.seconds, 3)}


def _units(spec: DisagreeSpec, ready: dict[str, Ready], store: ChunkStore) -> list[Unit]:
    cfg = spec.config
    plan = [(p, d, m) for p in spec.prompts for d in cfg.directions for m in cfg.method_names]
    progress = Progress(cfg.forwards * len(plan), "disagree", unit="forwards", every=10.0, warmup=True)
    units = []
    for index, (name, direction, method) in enumerate(plan):
        key = f"u{index:04d}"
        if store.has(key):
            units.append(_read(store, key, name, direction, method, spec.search.num_tokens))
            progress.resume(cfg.forwards)
            continue
        progress.label = f"disagree {index + 1}/{len(plan)}: {name} {direction}, {method.replace('_', '-')}"
        units.append(_compute(ready[name], spec, name, direction, method, progress))
        if is_main():
            _write(store, key, units[-1])
    return units


def _compute(p: Ready, spec: DisagreeSpec, name: str, direction: str, method: str, progress: Progress) -> Unit:
    cfg, search, started = spec.config, spec.search, time.perf_counter()
    n, tail = search.num_tokens, turns.rm_tail(p.target.suffix)
    forwards = Forwards(cfg.forwards, n + tail, n + 1)
    try:
        forwards.charge(len(p.target.prefix), len(p.prior.prefix) if p.prior.model is not p.target.model else 0,
                        p.side_b.prefill_forwards(n))  # side B's too: its prefix is cached once, as A's is
    except BudgetSpent:
        raise UsageError(f"--forwards={cfg.forwards} does not buy the prompt's prefill; give a larger "
                         "budget.") from None
    partner = _partner(p, spec.options.allow_nonfinite)
    sign = 1.0 if direction == "a_over_b" else -1.0
    objective = Objective(p.target, p.prior, cfg.lam, sign, cfg.repetition_penalty, forwards,
                          allow_nonfinite=spec.options.allow_nonfinite, partner=partner,
                          screen=cfg.screen if method == "search" or cfg.screen_best_of_n else 0)
    reported = [0.0]

    def tick(latest=None) -> None:
        progress.update(int(float(forwards.spent)) - int(reported[0]))
        reported[0] = float(forwards.spent)

    if method == "search":
        found = fluent_search(objective, search, p.banned, p.retokenize, tick)
    else:
        found = distinct_samples(best_of_n(objective, search, p.banned, p.retokenize))
    rows = search_rows(found, cfg.top, cfg.front_rows, sign, cfg.repetition_penalty)
    if not len(rows):
        raise NonFiniteError(f"{method} found no row to write for {name} {direction} (every sequence had a NaN/Inf "
                             "term or no text that round-trips in side B).")
    tick()
    progress.update(cfg.forwards - int(float(forwards.spent)))
    ids = found.ids[rows]
    scored = [partner.ledger[tuple(turns.tokens(r, p.end))] for r in ids.tolist()]
    ra, rb = (np.asarray([v[k] for v in scored], np.float64) for k in (0, 1))
    return Unit(name, direction, method, ids, ra, rb, float(found.spent), time.perf_counter() - started)


def _write(store: ChunkStore, key: str, u: Unit) -> None:
    """A unit as one chunk: a header [rows, forwards, seconds, NaN…], then its rows [ids, reward A, reward B]."""
    columns = np.column_stack([u.ids.astype(np.float64), u.reward_a, u.reward_b])
    header = np.full((1, columns.shape[1]), np.nan)
    header[0, :3] = len(columns), u.forwards, u.seconds
    store.write(key, np.vstack([header, columns]))


def _read(store: ChunkStore, key: str, name: str, direction: str, method: str, n: int) -> Unit:
    packed = store.load(key)
    ok = packed.dtype == np.float64 and packed.ndim == 2 and packed.shape[1] == n + 2 and len(packed) >= 2
    if not (ok and float(packed[0, 0]) == len(packed) - 1 and np.isfinite(packed[1:]).all()):
        raise store.damaged(key, f"is not a disagreement unit of this run ({packed.dtype} of shape {packed.shape})")
    rows = packed[1:]
    return Unit(name, direction, method, rows[:, :n].astype(np.int64), rows[:, n], rows[:, n + 1],
                float(packed[0, 1]), float(packed[0, 2]))
