"""The frontier job (issue 25): per prompt and direction, the search at each λ and best-of-N at the same budget,
every row judged, resumable unit by unit; then DIR/frontier.csv, DIR/frontier.png and .meta.json.

A unit is (prompt, direction, method, λ); best-of-N's samples serve every λ (J only re-ranks them). Each
finished unit is saved in the chunk store, its rows (ids, reward, prior log-prob, judge perplexity, round trip,
forwards) and its best-J history; a rerun reads finished units and computes the rest, so the CSV of a resumed
run is the CSV of one that never stopped.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np

from rmjax import checks, heads
from rmjax.checks import setting
from rmjax.errors import NonFiniteError, UsageError
from rmjax.loading import config_of
from rmjax.loading.for_job import job_fingerprint, load_for_job
from rmjax.model import Model, require_reward_model
from rmjax.parallel.distributed import is_main
from rmjax.runs import results, stages
from rmjax.runs.chunks import ChunkStore, open_store, store_dir
from rmjax.runs.options import RunOptions, claim_job, model_inputs
from rmjax.runs.progress import Progress
from rmjax.scoring import finite
from rmjax.scoring.judge import judge_perplexities
from rmjax.scoring.prefix import score_responses
from rmjax.search import frontier_checks, frontier_out, turns
from rmjax.search.baseline import best_of_n
from rmjax.search.budget import BudgetSpent, Forwards
from rmjax.search.completion import (
    complete_responses,
    greedy_continuations,
    require_prior_config,
    same_tokenizer,
)
from rmjax.search.fluent import FluentConfig, Found, fluent_search
from rmjax.search.frontier_unit import (
    Unit,
    check_counts,
    check_terms,
    read_unit,
    search_rows,
    search_seed,
    unit_label,
    write_unit,
)
from rmjax.search.gcg import Target, make_target
from rmjax.search.gcg_start import banned_tokens
from rmjax.search.gcg_swaps import RetokenizationCheck, survives
from rmjax.search.objective import Objective
from rmjax.search.terms import Prior
from rmjax.text import candidates as candidate_set
from rmjax.text import chat

# reward_z divides by the SD of the single-token rewards: one value has none (NaN), equal values one of 0 (±Inf)
Z_SAMPLE: checks.Rule = (lambda v: v >= 2, "an integer >= 2 (reward_z divides by the SD of that many single-token "
                                           "rewards)")


@dataclasses.dataclass(frozen=True)
class FrontierConfig:
    lambdas: tuple[float, ...] = setting((0.0, 0.25, 1.0, 4.0), "Fluency weights λ, one search each.")
    direction: str = setting("both", "Fluent and liked (optimal), fluent and disliked (pessimal), or both.",
                             ("optimal", "pessimal", "both"))
    forwards: int = setting(2000, "Forwards budget of each λ's search; best-of-N gets a direction's pool, "
                                   "len(lambdas) x forwards (see BUILD_NOTES 'Forwards'; 2,000 with four λ: about "
                                   "15 minutes a prompt and direction on 2 idle CPU cores).")
    repetition_penalty: float = setting(2.0, "ρ: the fluency term loses ρ x the share of repeating positions.")
    top: int = setting(8, "Rows written per direction, λ and method: the best by J.")
    front_rows: int = setting(64, "At λ > 0, search rows written besides the top: up to this many from the "
                                  "search's own Pareto layers (reward vs prior fluency, over every sequence it "
                                  "evaluated: its front, then the front of the rest, …), its frontier as best-of-N's "
                                  "samples are best-of-N's.")
    share: bool = setting(True, "Run each direction's searches from the largest λ down, each adding the rows the "
                                "larger λs' searches wrote to its own starts (a homotopy over λ, as EPO's population "
                                "spans it). Those rows were paid for by their own searches: a direction's search "
                                "still spends len(lambdas) x forwards in all.")
    z_sample: int = setting(2048, "Without --sweep: single tokens sampled (seeded) to estimate the reward's mean and "
                                  "SD for reward_z.")
    allow_non_ascii: bool = setting(False, "Allow non-ASCII tokens in responses.")
    allow_special: bool = setting(False, "Allow special and byte tokens (`<|endoftext|>`, raw bytes) in responses, "
                                  "as GCG's and the beam's --allow_special.")
    retokenize_filter: bool = setting(True, "Search only responses that re-tokenize to themselves in the template.")

    def __post_init__(self):
        object.__setattr__(self, "lambdas", tuple(float(v) for v in self.lambdas))
        checks.validate(self, {"forwards": checks.POSITIVE, "top": checks.POSITIVE, "z_sample": Z_SAMPLE,
                               "front_rows": checks.NON_NEGATIVE, "repetition_penalty": checks.NON_NEGATIVE,
                               "direction": checks.one_of("optimal", "pessimal", "both")})
        bad = [v for v in self.lambdas if not (v >= 0 and np.isfinite(v))]
        if not self.lambdas or bad or len(set(self.lambdas)) != len(self.lambdas):
            raise UsageError(f"--lambdas={','.join(map(str, self.lambdas))}: must be distinct finite numbers >= 0.")

    @property
    def directions(self) -> tuple[str, ...]:
        return ("optimal", "pessimal") if self.direction == "both" else (self.direction,)


@dataclasses.dataclass(frozen=True)
class FrontierSpec:
    """The job as one value: options.out is the output folder; `lm` the prior (None: the RM's own backbone),
    `judge` (None: the default of the other family), `sweep` a finished sweep CSV for reward_z."""

    options: RunOptions
    prompts: dict[str, str]
    config: FrontierConfig
    search: FluentConfig
    lm: str | None = None
    judge: str | None = None
    sweep: str | None = None


# How best-of-N draws and keeps its samples (part of each identity: a result of another rule is not reused): texts
# that round-trip, the whole budget (a short sample's change buys more), streams of their own.
BEST_OF_N = "round trip, whole budget, own streams, readable paid for"
# How the search's draws are paid for (part of each identity too): a start or a resampled tail drawn by the RM as its
# own prior costs its sampler's forward, as a best-of-N sample does (each had cost a prior forward and an RM one).
OWN_PRIOR_DRAWS = "own-prior starts and resampled tails at best-of-N's price"


def default_judge(rm_config) -> str:
    """Another family than the RM's: Gemma 3 270M for a Llama-family RM, SmolLM2 135M for a Gemma one."""
    return "smollm2-135m-instruct" if rm_config.model_type.startswith("gemma") else "gemma-3-270m"


def csv_path(folder: str | Path) -> Path:
    return Path(folder) / "frontier.csv"


def frontier_identity(spec: FrontierSpec, model_fp: dict, lm_fp: dict | None, judge_fp: dict) -> dict:
    """What the result depends on: each model by its content (`judge` and `rm/` and an absolute path are one judge;
    the name typed kept a killed run from resuming and analyze from pooling seeds: helper-159)."""
    o = spec.options
    return {"job": "frontier", "model": model_fp, "lm": lm_fp, "judge": {"model": judge_fp},
            "dtype": o.dtype, "output_column": int(o.output_column), "template": o.template,
            "prompts": dict(spec.prompts), "config": dataclasses.asdict(spec.config),
            "search": dataclasses.asdict(spec.search), "responses": "whole turns (issue 43)",
            "fluency": "mean token log-prob + end of turn at full weight", "best_of_n": BEST_OF_N,
            "own_prior_draws": OWN_PRIOR_DRAWS,
            "sweep": results.file_sha1(spec.sweep) if spec.sweep else None} | left_out(spec.config)


def left_out(cfg) -> dict:
    """The candidate rule's version for this job's settings (rmjax.text.candidates.left_out_rule)."""
    return candidate_set.left_out_rule(cfg.allow_non_ascii, cfg.allow_special)


def check_one_prompt(prompts: dict[str, str]) -> None:
    """The frontier runs one prompt per job: refused by the job and from its flags alone (a launch's line)."""
    if len(prompts) != 1:
        raise UsageError(f"the frontier runs one prompt per job ({len(prompts)} given: "
                         f"{', '.join(list(prompts)[:4])}); give a single prompt's name, or --prompts= with "
                         "--prompt.")


def run_frontier(spec: FrontierSpec) -> Path | None:
    """Checks and identity without loading a model → claim DIR/frontier.csv → load the RM, prior and judge (the
    prior's and judge's LM heads checked from their configs first) → units (resumable) → CSV, PNG, .meta.json."""
    o = spec.options
    check_one_prompt(spec.prompts)
    swept = _read_sweep(spec, job_fingerprint(o)) if spec.sweep else None  # before any model loads
    rm_config = config_of(o.model)
    require_reward_model(rm_config, o.model, "the frontier", o.output_column, o.column_chosen)
    judge = spec.judge or default_judge(rm_config)
    for name, source, given in (("--lm", spec.lm or o.model, bool(spec.lm)), ("--judge", judge, bool(spec.judge))):
        require_prior_config(config_of(source), source, name, given)
    frontier_checks.check_before_loading(spec, judge)  # context, budget, --sweep's yardstick
    identity = frontier_identity(spec, job_fingerprint(o), job_fingerprint(o, spec.lm) if spec.lm else None,
                                 job_fingerprint(o, judge))
    out = csv_path(o.out)
    with claim_job(o, identity, out=out, owned=[frontier_out.png_path(out), frontier_out.samples_path(out)],
                   store=store_dir(out),
                   inputs={"--sweep": spec.sweep} | model_inputs(lm=spec.lm, judge=judge)) as job:
        if job.reuse:
            return None
        rm = load_for_job(o)
        lm = rm if spec.lm is None else load_for_job(dataclasses.replace(o, output_column=0), spec.lm)
        judge_model = load_for_job(dataclasses.replace(o, output_column=0, template="auto"), judge)  # its own template
        same_tokenizer(rm, lm)
        store = open_store(out, identity, 1)
        units, scales = compute_units(rm, lm, judge_model, spec, store)
        rows = frontier_out.rows(units, spec.config, rm.tokenizer)
        _complete(rows, rm, lm, spec)
        summary = frontier_out.summaries(units, spec.config, rows)
        frontier_out.complete_at_caps(summary, units, _ends_of(lm, spec))
        samples = frontier_out.sample_rows(units, rm.tokenizer)
        job.finish(lambda path: frontier_out.write(path, rows, summary, samples), allow_nonfinite=o.allow_nonfinite,
                   model=rm.source, lm=lm.source,
                   judge=judge_model.source, dtype=rm.dtype, mesh=dict(rm.mesh.shape) if rm.mesh else None,
                   prompts=spec.prompts, config=dataclasses.asdict(spec.config),
                   search=dataclasses.asdict(spec.search), inputs=stages.recorded({"--sweep": swept}),
                   units=[u.meta() for u in units], summary=summary,
                   nonfinite=frontier_out.nonfinite_record(units),
                   yardsticks_sampled={name: scale.record() for name, scale in scales.items()},
                   forwards=sum(u.forwards for u in units),
                   forwards_per_second=sum(u.forwards for u in units) / max(sum(u.seconds for u in units), 1e-9))
        if is_main():
            store.remove()
            print(frontier_out.describe(summary, out), file=sys.stderr)
        return out


def _complete(rows: list[dict], rm: Model, lm: Model, spec: FrontierSpec) -> None:
    """The completion check of every written row (rmjax.search.completion: the prior continues it greedily to its
    end of turn, the RM scores the completed text), each distinct response once; a check, not a search: outside
    the forwards budget."""
    prompt = next(iter(spec.prompts.values()))
    distinct = list(dict.fromkeys(r["ids"] for r in rows))
    # after the search's last line: said as it starts and ends (a greedy decode of every row, up to 32 tokens each)
    progress = Progress(len(distinct), "frontier: completion check of the written rows", unit="responses")
    progress.update(0, force=True)
    done = complete_responses(rm, lm, prompt, [[int(t) for t in k.split()] for k in distinct], spec.options.template,
                              allow_nonfinite=spec.options.allow_nonfinite)
    progress.update(len(distinct))
    at = {k: i for i, k in enumerate(distinct)}
    for r in rows:
        i = at[r["ids"]]
        r.update(ends_turn=int(done.ends_turn[i]), completed_reward=float(done.completed_reward[i]),
                 completed_text=json.dumps(done.completed_text[i], ensure_ascii=False))


def _ends_of(lm: Model, spec: FrontierSpec):
    """Whether the prior's most likely next token after each response (token lists) ends the turn."""
    split = chat.split_chat(lm.tokenizer, next(iter(spec.prompts.values())), spec.options.template)
    end = turns.end_of_turn(split.suffix, lm.tokenizer, lm.source)
    return lambda responses: greedy_continuations(lm, split.prefix, end, responses, max_new=1)[0]


def _read_sweep(spec: FrontierSpec, model_fp: dict) -> stages.StageInput:
    """--sweep, refused in one line unless a token-mode sweep of this RM (content, dtype, output column, template)
    scored this prompt's text under its name: its column is reward_z's yardstick."""
    o = spec.options
    needs = stages.Needs(model=model_fp, dtype=o.dtype, output_column=o.output_column, template=o.template,
                         mode="token", prompts=spec.prompts)
    given = stages.read_input(spec.sweep, ("sweep",), "--sweep", needs,
                              why="its scores are not this RM's single-token rewards for this prompt, reward_z's "
                                  "yardstick; sweep this RM and prompt (or drop --sweep)")
    subset = stages.sweep_subset((given.meta or {}).get("identity"))
    chosen = [f"--{key}" for key in subset if key != "limit"]
    if chosen:  # reward_z is in SDs of the whole vocabulary's single-token rewards, not of a chosen few
        raise UsageError(f"--sweep={spec.sweep} scored a chosen set of tokens ({', '.join(chosen)}), and reward_z's "
                         "yardstick is the whole vocabulary's; sweep every token (or drop --sweep).")
    if "limit" in subset and is_main():
        print(f"--sweep={spec.sweep} scored only the vocabulary's first {subset['limit']:,} tokens: reward_z is in "
              "SDs of theirs.", file=sys.stderr)
    return given


def compute_units(rm: Model, lm: Model, judge: Model, spec: FrontierSpec, store: ChunkStore
                  ) -> tuple[list[Unit], dict[str, finite.Scale]]:
    """The plan's units, each computed or read back from `store`, and each prompt's reward_z yardstick (taken for
    every prompt, its units read back or not: its record, left-out values included, goes to .meta.json)."""
    cfg, search = spec.config, spec.search
    targets = {name: make_target(rm, text, spec.options.template) for name, text in spec.prompts.items()}
    scales = {name: _reward_scale(rm, targets[name], spec, name) for name in spec.prompts}
    lambdas = sorted(cfg.lambdas, reverse=True) if cfg.share else cfg.lambdas
    plan = [(p, d, m, lam) for p in spec.prompts for d in cfg.directions
            for m, lam in [*(("search", v) for v in lambdas), ("best_of_n", None)]]
    progress = Progress(sum(_budget(cfg, m) for *_, m, _ in plan), "frontier", unit="forwards", every=10.0,
                        warmup=True)
    units, ready = [], {}
    for index, (name, direction, method, lam) in enumerate(plan):
        key = f"u{index:04d}"
        if store.has(key):  # held to this run's finiteness rule, as a fresh unit (_finish)
            units.append(read_unit(store, key, name, direction, method, lam, search.num_tokens,
                               end_of_turn(rm, spec, name)))
            check_terms(rm.tokenizer, units[-1], spec.options.allow_nonfinite,
                         f"frontier terms saved in {store.dir / f'chunk-{key}.npy'}")
            check_counts(units[-1], spec.options.allow_nonfinite, store.dir / f"chunk-{key}.npy")
            progress.resume(_budget(cfg, method))  # as a computed unit counts: its whole budget
            continue
        progress.label = unit_label(name, direction, method, lam, index, len(plan))
        if name not in ready:
            ready[name] = _prepare(rm, lm, spec, name, targets[name], scales[name])
        seeds = _seeds([u for u in units if (u.prompt, u.direction, u.method) == (name, direction, "search")]
                       if cfg.share and method == "search" else [])
        units.append(_compute(ready[name], judge, spec, name, direction, method, lam, progress, seeds))
        if is_main():
            write_unit(store, key, units[-1])
    return units, scales


def _budget(cfg: FrontierConfig, method: str) -> int:
    """A unit's forwards: --forwards for each λ's search, all of them pooled for best-of-N (equal compute: a
    direction's searches spend len(lambdas) x --forwards together)."""
    return cfg.forwards * (len(cfg.lambdas) if method == "best_of_n" else 1)


def end_of_turn(rm: Model, spec: FrontierSpec, name: str) -> int:
    """The end-of-turn id of the RM's template for this prompt (rmjax.search.turns)."""
    split = chat.split_chat(rm.tokenizer, spec.prompts[name], spec.options.template)
    return turns.end_of_turn(split.suffix, rm.tokenizer, rm.source)


@dataclasses.dataclass
class _Prompt:
    target: Target
    prior: Prior
    banned: np.ndarray
    retokenize: list[RetokenizationCheck]
    z: finite.Scale


def _prepare(rm: Model, lm: Model, spec: FrontierSpec, name: str, target: Target, scale: finite.Scale) -> _Prompt:
    """A prompt's prior, allowed tokens and re-tokenization check, with its RM `target` and reward `scale`."""
    text, template = spec.prompts[name], spec.options.template
    end = turns.end_of_turn(target.suffix, rm.tokenizer, rm.source)
    if lm is not rm:
        split = chat.split_chat(lm.tokenizer, text, template)
        frontier_checks.require_same_end(end, lm.tokenizer, split.suffix, lm.source, rm.source)
    prior = Prior.of(lm, target.prefix if lm is rm else split.prefix)
    gcg_cfg = spec.search.gcg(allow_non_ascii=spec.config.allow_non_ascii, allow_special=spec.config.allow_special,
                             template=template)
    banned = turns.banned_with_end(banned_tokens(rm.tokenizer, min(rm.config.vocab_size, lm.config.vocab_size),
                                                 gcg_cfg), end)
    heads.check_search_keeps_gate(rm.config.head, target.prefix, lambda i: i < len(banned) and not banned[i],
                                  spec.search.num_tokens, rm.tokenizer, target.suffix)
    check = RetokenizationCheck(chat.Conversations(rm.tokenizer, text, template), target.prefix, target.suffix)
    return _Prompt(target, prior, banned, [check] if spec.config.retokenize_filter else [],
                   scale)


def _reward_scale(rm: Model, target: Target, spec: FrontierSpec, name: str) -> finite.Scale:
    """Mean and SD of the reward over single-token responses: the --sweep column, else z_sample tokens drawn
    with seed 0 from the vocabulary (not counted against any budget: a yardstick, not a search). Fewer than 2
    values or an SD of 0 is refused (finite.yardstick): reward_z would be NaN or ±Inf."""
    if spec.sweep:
        return frontier_checks.sweep_yardstick(spec.sweep, name, spec.options.allow_nonfinite)
    return finite.sampled_yardstick(
        min(rm.config.vocab_size, len(rm.tokenizer)), spec.config.z_sample,
        lambda tokens: score_responses(rm, target.cache, target.suffix_ids, tokens[:, None].astype(np.int32), 256),
        allow=spec.options.allow_nonfinite,
        fix="raise --z_sample or give a --sweep of this RM and prompt (an RM that scores every token alike gives "
            "reward_z no scale)")


def _seeds(earlier: list[Unit]) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The rows earlier searches of the same prompt and direction wrote (ids, reward, prior log-prob), in plan
    order: a later search goes on from them too (FrontierConfig.share)."""
    if not earlier:
        return None
    return tuple(np.concatenate([getattr(u, f) for u in earlier]) for f in ("ids", "reward", "prior_logp"))


def _compute(p: _Prompt, judge: Model, spec: FrontierSpec, name: str, direction: str, method: str,
             lam: float | None, progress: Progress,
             seeds: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> Unit:
    cfg, search, started = spec.config, spec.search, time.perf_counter()
    n, tail = search.num_tokens, turns.rm_tail(p.target.suffix)
    forwards = Forwards(_budget(cfg, method), n + tail, n + 1)
    # the prompt's prefill, once per model (the RM as its own prior: once)
    prior_prefix = len(p.prior.prefix) if p.prior.model is not p.target.model else 0
    try:
        forwards.charge(len(p.target.prefix), prior_prefix)
    except BudgetSpent:  # frontier_checks refuses this before loading; never an internal exception's traceback
        need = frontier_checks.minimum_forwards(len(p.target.prefix), tail, prior_prefix, n, search.start_share,
                                                frontier_checks.per_candidate(p.prior.model is p.target.model))
        raise UsageError(frontier_checks.budget_message(cfg.forwards, need)) from None
    sign = 1.0 if direction == "optimal" else -1.0
    objective = Objective(p.target, p.prior, lam or 0.0, sign, cfg.repetition_penalty, forwards,
                          allow_nonfinite=spec.options.allow_nonfinite)
    reported = [0.0]  # the prefill counts too: a unit adds up to its budget

    def tick(latest=None) -> None:
        progress.update(int(float(forwards.spent)) - int(reported[0]))
        reported[0] = float(forwards.spent)

    if method == "search":
        search = dataclasses.replace(search, seed=search_seed(search.seed, lam, cfg.lambdas))
        found = fluent_search(objective, search, p.banned, p.retokenize, tick, seeds)
        rows = search_rows(found, cfg.top, cfg.front_rows if lam else 0, sign, cfg.repetition_penalty)
    else:
        found = best_of_n(objective, search, p.banned, p.retokenize)
        rows = np.flatnonzero(np.isfinite(found.values.objective))  # all but those dropped (--allow_nonfinite)
        if not len(rows):
            raise NonFiniteError(f"best-of-N kept no sample to compare the search with: of {len(found.ids)} whose "
                                 "text round-trips, none has a finite reward and prior log-prob. Check the models for "
                                 "NaN, or the template (--noretokenize_filter keeps texts that do not round-trip).")
    tick()
    progress.update(_budget(cfg, method) - int(float(forwards.spent)))  # what a unit left: the line counts units
    unit = _finish(p, judge, spec, name, direction, method, lam, found, rows, time.perf_counter() - started)
    return dataclasses.replace(unit, swaps_skipped=objective.swaps_skipped,
                               candidates_dropped=objective.candidates_dropped)


def _finish(p: _Prompt, judge: Model, spec: FrontierSpec, name: str, direction: str, method: str,
            lam: float | None, found: Found, rows: np.ndarray, seconds: float) -> Unit:
    """The unit's rows with their report-only terms: the prior log-prob where the search did not run the prior
    (λ = 0), the judge's perplexity and the round trip; any NaN/Inf stops the job."""
    model = p.target.model
    ids, values, end = found.ids[rows], found.values, turns.end_of_turn(p.target.suffix, model.tokenizer,
                                                                         model.source)
    logp = values.prior_logp[rows].copy()
    missing = ~np.isfinite(logp)
    if missing.any():
        logp[missing] = p.prior.fluency_log_probs(ids[missing], end)
    tokenizer = p.target.model.tokenizer
    texts = turns.decode(tokenizer, ids, end)
    ppl = judge_perplexities(judge, spec.prompts[name], texts, end_of_turn=True)  # in the judge's own template
    check = RetokenizationCheck(chat.Conversations(tokenizer, spec.prompts[name], spec.options.template),
                                p.target.prefix, p.target.suffix)
    roundtrip = np.asarray([survives(check, turns.tokens(row, end)) for row in ids.tolist()])
    reward = values.reward[rows]
    history = np.asarray([(f, j) for f, j, _ in found.history], np.float64).reshape(-1, 2)
    unit = Unit(name, direction, method, lam, ids, reward.astype(np.float64), logp.astype(np.float64), ppl,
                roundtrip, float(found.spent), history, p.z, seconds, end=end)
    check_terms(tokenizer, unit, spec.options.allow_nonfinite, "frontier terms")  # before the unit is stored
    return unit
