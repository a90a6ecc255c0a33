"""GCG as a job: build the targets of loaded models, search, write JSON + per-step CSV + .meta.json."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

from rmjax.errors import UsageError
from rmjax.loading import config_and_tokenizer, config_of
from rmjax.loading.for_job import job_fingerprint, load_for_job
from rmjax.loading.identity import model_fingerprint
from rmjax.model import Model, require_reward_model
from rmjax.parallel.distributed import is_main
from rmjax.runs import jobs, results, stages
from rmjax.runs.options import RunOptions, claim_job, model_inputs
from rmjax.runs.results import array_sha1
from rmjax.scoring.memory import beside, weights_held
from rmjax.scoring.prefix import score_responses
from rmjax.search.completion import (
    COMPLETION_VALUES,
    MAX_NEW,
    check_completion_before_loading,
    check_written,
    completion_prior,
    gains_summary,
    require_prior_config,
    require_same_vocabulary,
)
from rmjax.search.gcg import GCGResult, Target, gcg, make_target
from rmjax.search.gcg_config import NOT_IN_IDENTITY, GCGConfig, check_search_width, search_plan
from rmjax.search.gcg_start import banned_tokens, check_starts, init_from_rows, read_init_from
from rmjax.text import candidates as candidate_set
from rmjax.text.candidates import check_token_ids, read_vocab_file, single_token_ids

BUFFER_BATCH_SIZE = 64  # rows a call when the buffer is scored again for its completion check


def gcg_identity(model_fingerprints: list[dict], *, dtype: str, output_column: int, prompts: dict[str, str],
                 cfg: GCGConfig, lm: dict | None = None) -> dict:
    config = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in NOT_IN_IDENTITY}
    if cfg.init_from:  # before any model loads: a partial or foreign file stops here
        stages.read_input(cfg.init_from, ("beam",), "--init_from")
    for name in ("init_from", "vocab_file"):  # what they hold, not their names (b.csv and ./b.csv are one input)
        if getattr(cfg, name):
            config[name] = {"sha1": _input_sha1(getattr(cfg, name))}
    # the set, not its order; absent when not given (the identities of runs from before the flag hold)
    config.pop("token_ids")
    if cfg.token_ids:
        ids = np.unique(np.asarray(cfg.token_ids, np.int64))
        config["token_ids"] = {"count": len(ids), "sha1": array_sha1(ids)}
    left_out = candidate_set.left_out_rule(cfg.allow_non_ascii, cfg.allow_special)
    return {"job": "gcg", "models": list(model_fingerprints), "dtype": dtype, "output_column": int(output_column),
            "prompts": dict(prompts), "config": config, "completion": {"lm": lm, "max_new": MAX_NEW}, **left_out}


def _input_sha1(path: str) -> str | None:
    try:
        return results.file_sha1(path)
    except OSError:
        return None  # gcg() names the missing file


def _reread_files(cfg: GCGConfig) -> dict[str, str | None]:
    """The input files GCG reads when it claims its output and again as it searches (their content is held to the
    claim's: rmjax.runs.jobs)."""
    return {"--init_from": cfg.init_from, "--vocab_file": cfg.vocab_file}


def steps_path(out: str | Path) -> Path:
    return Path(out).with_name(Path(out).name + ".steps.csv")  # from the full name: injective


def completions_path(out: str | Path) -> Path:
    return Path(out).with_name(Path(out).name + ".completions.csv")


@dataclasses.dataclass(frozen=True)
class GcgSpec:
    """A GCG job as one value: the search (`config`; its template and allow_nonfinite are options') over the mean
    reward of every model of options.model (comma-separated) and every prompt."""

    options: RunOptions
    prompts: dict[str, str]
    config: GCGConfig
    lm: str | None = None  # the completion check's LM when the RMs have no LM head of their own

    def __post_init__(self):
        o = self.options
        object.__setattr__(self, "config", dataclasses.replace(self.config, template=o.template,
                                                               allow_nonfinite=o.allow_nonfinite))


def model_specs(models: str) -> list[str]:
    """The RMs of --model (comma-separated; the objective is their mean): an empty item (`rm,` searched rm alone,
    unsaid) or a model given twice (weighted twice) refused in one line; also where a launch reads the flags."""
    specs = [s.strip() for s in models.split(",")]  # 'a, a' is a model twice
    if len(specs) > 1 and not all(specs):
        raise UsageError(f"--model={models}: an item is empty (a stray comma?); give each model once, separated by "
                         "commas.")
    repeated = sorted({s for s in specs if specs.count(s) > 1})
    if repeated:
        raise UsageError(f"--model names {repeated[0]} more than once; give each model once.")
    return specs


def run_gcg(spec: GcgSpec) -> GCGResult | None:
    """The GCG job: the search's inputs checked (--search_width, --init_from) and the identity computed without
    loading the models → claim options.out once → unless a finished result of the same inputs is there (None),
    load each model (its ids, context and memory checked before its weights: `plan_search`), search, write."""
    o, cfg = spec.options, spec.config
    check_search_width(cfg)  # by --topk alone now; by the tokens allowed once the vocabulary is checked
    # The input files are read here, not where the settings are checked: a launch checks those on another machine
    # than the one the job will run on (experiments/job_line.py), whose files are not this one's.
    if cfg.init_from:  # a file that is not a beam CSV of this search stops the job now
        init_from_rows(cfg)
    if cfg.vocab_file:  # a file that is missing or not UTF-8 too
        read_vocab_file(cfg.vocab_file)
    specs = model_specs(o.model)
    read = [config_and_tokenizer(s) for s in specs]  # before any weight loads: the kind of model, the vocabulary
    for s, (config, _) in zip(specs, read, strict=True):
        require_reward_model(config, s, "GCG", o.output_column, o.column_chosen)
    check_one_vocabulary([tokenizer for _, tokenizer in read], specs)
    fps = [job_fingerprint(o, s) for s in specs]
    held = [(f"the RM {s}", config) for s, (config, _) in zip(specs, read, strict=True)]
    if spec.lm:
        held.append((f"the prior --lm={spec.lm}", config_of(spec.lm)))
        require_prior_config(held[-1][1], spec.lm, "--lm")
        require_same_vocabulary(read[0][1], specs[0], config_and_tokenizer(spec.lm)[1], spec.lm)
    fix = "give a shorter prompt or a smaller --num_tokens" + ("" if spec.lm else
                                                              ", or a prior with a longer context (--lm)")
    for s in specs if not spec.lm else specs[:1]:  # each RM its own prior, else the one --lm
        check_completion_before_loading(o, s, spec.lm, spec.prompts.values(), cfg.template, cfg.num_tokens, fix)
    weights = 0  # every held model's, when several: each one's search is planned beside the others'
    if len(held) > 1:  # one model alone: its search plan, before its weights, names the fix
        weights = sum(weights_held(held, o.dtype, o.mesh, "GCG job",
                                   "fewer models (--model) or a smaller prior (--lm)"))
    identity = gcg_identity(fps, dtype=o.dtype, prompts=spec.prompts, output_column=o.output_column, cfg=cfg,
                            lm=job_fingerprint(o, spec.lm) if spec.lm else None)
    with claim_job(o, identity, owned=[steps_path(o.out), completions_path(o.out)],
                   inputs=_reread_files(cfg) | model_inputs(lm=spec.lm), reread=_reread_files(cfg)) as job:
        if job.reuse:
            return None

        def before_weights(config, tokenizer, mesh) -> None:
            # ids past a model's vocabulary (--token_ids, --init_from) stop the job before its weights load
            check_token_ids(cfg.token_ids or [], config.vocab_size, tokenizer)
            if cfg.vocab_file:  # none of its lines a single token: refused before the weights
                single_token_ids(tokenizer, read_vocab_file(cfg.vocab_file), cfg.vocab_file, report=False)
            if cfg.init_from:
                init_from_rows(cfg, config.vocab_size)
                read_init_from(cfg, fps)  # a beam of another tokenizer: after its ids are named if out of range
            plan_search(cfg, spec.prompts, o.dtype, config, tokenizer, mesh, beside(weights, config, o.dtype, mesh))
            check_starts(cfg, tokenizer, config.vocab_size, spec.prompts.values())  # --init that cannot survive

        models = [load_for_job(o, s, before_weights) for s in specs]
        lm = load_for_job(dataclasses.replace(o, output_column=0), spec.lm) if spec.lm else None
        return write_gcg(models, spec.prompts, cfg, o.out, job=job, lm=lm)


def plan_search(cfg: GCGConfig, prompts: dict[str, str], dtype: str, config, tokenizer, mesh, held: int = 0) -> None:
    """--num_tokens against the context, --search_width against what a step can sample, and the search's memory
    beside `held` (the other models' weights), checked for a model before its weights load
    (rmjax.search.gcg_config.search_plan); prints the plan."""
    if tokenizer is None:
        return  # make_target names the missing tokenizer
    if cfg.vocab_file or cfg.token_ids:  # the candidates a step samples from: the set, less what is banned in it
        check_search_width(cfg, int((~banned_tokens(tokenizer, config.vocab_size, cfg)).sum()))
    plan = search_plan(cfg, config, tokenizer, prompts, dtype, mesh, held)
    if is_main():
        print(f"memory plan: {plan.describe()}", file=sys.stderr)


def check_one_vocabulary(tokenizers: list, sources: list[str]) -> None:
    """GCG's candidates are one list of ids for every model: each model must read an id as the same token. Equal
    sizes were all that was checked (after loading), so a reordered vocabulary averaged two different responses'
    rewards."""
    first = tokenizers[0].get_vocab()
    for tokenizer, source in zip(tokenizers[1:], sources[1:], strict=True):
        if tokenizer.get_vocab() != first:
            raise UsageError(f"GCG over several models needs one vocabulary (each id the same token): {source}'s "
                             f"differs from {sources[0]}'s; search them one at a time.")


def write_gcg(models: list[Model], prompts: dict[str, str], cfg: GCGConfig, out: str | Path,
              overwrite: bool = False, job: jobs.Job | None = None, lm: Model | None = None) -> GCGResult | None:
    """Search with loaded models and write the result and the completion check of its buffer (`lm`, else each
    RM's own backbone if it ties its embeddings); None when a finished result with the same identity is reused.
    `out` is claimed here unless `job` is its claim already (`run_gcg`)."""
    check_one_vocabulary([m.tokenizer for m in models], [m.source for m in models])
    identity = gcg_identity([model_fingerprint(m) for m in models], dtype=models[0].dtype, prompts=prompts,
                            output_column=models[0].output_column, cfg=cfg,
                            lm=model_fingerprint(lm) if lm is not None else None)
    with jobs.claimed(job, out, identity, allow_nonfinite=cfg.allow_nonfinite, overwrite=overwrite,
                      owned=[steps_path(out), completions_path(out)],
                      reread=_reread_files(cfg)) as job:
        if job.reuse:
            return None
        inputs = {"--init_from": read_init_from(cfg, [model_fingerprint(m) for m in models]) if cfg.init_from
                  else None}
        targets = [make_target(m, text, cfg.template) for m in models for text in prompts.values()]
        log = (lambda msg: print(msg, file=sys.stderr, flush=True)) if is_main() else None
        result = gcg(targets, cfg, log=log)
        nonfinite = {key: count for key, count in (("candidates_dropped", result.nonfinite_candidates),
                                                    ("gradient_swaps_skipped", result.nonfinite_swaps)) if count}
        table, completion = _completions(targets, lm, prompts, result, cfg)

        def write(path: Path) -> Path:
            if table is not None:
                results.write_table(completions_path(path), *table)
            return _write(result, models[0].tokenizer.decode, cfg, path)

        job.finish(write, completion=completion, **jobs.model_meta(models[0]),
                   allow_nonfinite=cfg.allow_nonfinite,
                   models=[m.source for m in models], prompts=prompts, config=dataclasses.asdict(cfg),
                   inputs=stages.recorded(inputs), seconds=result.seconds, steps=len(result.history),
                   nonfinite=nonfinite or None,
                   seconds_per_step=result.seconds / max(len(result.history), 1))
        return result


def _completions(targets: list[Target], lm: Model | None, prompts: dict[str, str], result: GCGResult,
                 cfg: GCGConfig) -> tuple[tuple[dict, dict] | None, dict]:
    """The completion check of the buffer (best first) for each RM and prompt (check_written): the table's keys
    and values (`model, rank, ids` then the check's columns), or None when no RM has an LM to complete with, and
    the record for .meta.json (per model: its summary, or why it was skipped)."""
    buffer = [ids for _, ids in result.buffer]
    signs = np.full(len(buffer), 1.0 if cfg.direction == "optimal" else -1.0)
    keys: dict[str, list] = {k: [] for k in ("model", "rank", "ids", "prompt", "ends_turn", "completed_text")}
    values: dict[str, list] = {k: [] for k in COMPLETION_VALUES}
    record = {}
    models = [t.model for i, t in enumerate(targets) if all(u.model is not t.model for u in targets[:i])]
    for m in models:
        prior, skipped = completion_prior(m, lm)
        if prior is None:
            record[m.source] = {"skipped": skipped}
            if is_main():
                print(f"completion check of {m.source} {skipped}", file=sys.stderr)
            continue
        mine = [t for t in targets if t.model is m]
        rewards = np.stack([score_responses(m, t.cache, t.suffix_ids, np.asarray(buffer, np.int32), BUFFER_BATCH_SIZE)
                            for t in mine], axis=1)
        table = check_written(m, prior, prompts, buffer, rewards, signs, cfg.template, MAX_NEW, cfg.allow_nonfinite)
        keys["model"] += [m.source] * len(table["row"])
        keys["rank"] += [i + 1 for i in table["row"]]
        keys["ids"] += [" ".join(map(str, buffer[i])) for i in table["row"]]
        keys["prompt"] += table["prompt"]
        keys["ends_turn"] += table["ends_turn"]
        keys["completed_text"] += [json.dumps(t, ensure_ascii=False) for t in table["completed_text"]]
        for k in COMPLETION_VALUES:
            values[k] += table[k]
        record[m.source] = {"lm": prior.source, "max_new": MAX_NEW, "reward_units": "the RM's raw reward",
                            **gains_summary(table, [cfg.direction] * len(table["row"]))}
    if not keys["model"]:
        return None, record
    return (keys, {k: np.asarray(v, np.float64) for k, v in values.items()}), record


def _write(result: GCGResult, decode, cfg: GCGConfig, out: Path) -> Path:
    """The result JSON and the per-step CSV beside it."""
    results.dump_json({
        "best_ids": result.best_ids, "best_text": result.best_text, "best_reward": result.best_reward,
        "direction": cfg.direction,
        "buffer": [{"reward": r, "ids": ids, "text": decode(ids)} for r, ids in result.buffer],
        "history": result.history,
    }, out)
    keys = {"step": [h["step"] for h in result.history], "text": [h["text"] for h in result.history],
            "ids": [" ".join(map(str, h["ids"])) for h in result.history],
            "candidates": [h["candidates"] for h in result.history]}  # evaluated at that step
    results.write_table(steps_path(out), keys, {"reward": [h["reward"] for h in result.history],
                                                "seconds": [h["seconds"] for h in result.history]})
    return out
