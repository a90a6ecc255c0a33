"""The beam job: its identity and size, a finished sweep as depth 1, the search run resumably, the CSV written."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from rmjax.errors import UsageError
from rmjax.loading import config_and_tokenizer, config_of
from rmjax.loading.for_job import job_fingerprint, load_for_job
from rmjax.loading.identity import model_fingerprint
from rmjax.model import Model
from rmjax.parallel.distributed import is_main
from rmjax.runs import jobs, results, stages
from rmjax.runs.chunks import open_store, resume_batch_size, store_dir
from rmjax.runs.options import RunOptions, claim_job, model_inputs
from rmjax.runs.results import array_sha1
from rmjax.search.beam import BeamConfig, BeamResult, Found, beam_search, check_candidate_set, check_enumeration
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
from rmjax.search.sweep import check_limit, load_planned
from rmjax.text import candidates as candidate_set
from rmjax.text.candidates import candidate_ids
from rmjax.text.prompts import check_prompt_names


def beam_identity(model_fingerprint: dict, *, dtype: str, output_column: int, prompts: dict[str, str],
                  cfg: BeamConfig, candidates: str | None, limit: int | None = None,
                  from_sweep: str | None = None, lm: dict | None = None) -> dict:
    """What the result depends on; `candidates` identifies the requested set (None: the vocabulary),
    `limit` keeps its first N, `from_sweep` is the sha1 of the sweep CSV whose scores are depth 1 (both keys
    only when given, so the identity of a run without them is what it always was); `lm`: the fingerprint of the
    completion check's LM when it is not the RM (the check's table is an output)."""
    identity = {"job": "beam", "model": model_fingerprint, "dtype": dtype, "output_column": int(output_column),
                "prompts": dict(prompts), "config": dataclasses.asdict(cfg), "candidates": candidates,
                "completion": {"lm": lm, "max_new": MAX_NEW}}
    if not cfg.allow_special:  # which tokens the search left out (absent before the rule had a version)
        identity["left_out"] = candidate_set.LEFT_OUT
    if limit is not None:
        identity["limit"] = int(limit)
    if from_sweep is not None:
        identity["depth1_from_sweep"] = from_sweep
    return identity


CHECKED_ROWS = 100  # the completion check covers each depth and direction's best rows (an exhaustive CSV holds all)


def completions_path(out: str | Path) -> Path:
    return Path(out).with_name(Path(out).name + ".completions.csv")  # from the full name: injective


def sweep_needs(model_fp: dict, *, dtype: str, output_column: int, prompts: dict[str, str],
                template: str) -> stages.Needs:
    """What a sweep must have been run with to stand for this beam's depth 1: a token-mode sweep of the same model
    content, dtype, output column, template and prompt texts (more prompts and any candidates are fine:
    `depth1_scores` checks they cover ours)."""
    return stages.Needs(model=model_fp, dtype=dtype, output_column=output_column, template=template, mode="token",
                        prompts=prompts)


def read_sweep(path: str | Path, needs: stages.Needs) -> tuple[pd.DataFrame, stages.StageInput]:
    """The table of a finished sweep that can stand for this beam's depth 1 (`sweep_needs`, checked by the one
    stage-input check, rmjax.runs.stages.read_input), and what was read (path, sha1) for .meta.json. Another run's
    sweep, one without its .meta.json (unfinished), or a CSV that is not byte for byte what the sweep wrote, is
    refused in one line."""
    flag = f"--from_sweep={path}"
    given = stages.read_input(path, ("sweep",), "--from_sweep", needs,
                              why="its scores are not this beam's depth 1 (it needs a token-mode sweep of the same "
                                  "model content, dtype, output column, template and prompts)")
    table = results.read_scores_csv(path)
    counted = given.meta.get("n_candidates")
    if len(table) != counted:  # whole by its digest; a sweep's own count must agree too
        raise UsageError(f"{flag} holds {len(table)} rows where its .meta.json counts {counted}; rerun the sweep "
                         "(with --overwrite).")
    return table, given


def depth1_scores(table, candidates: np.ndarray, prompts: dict[str, str], path: str | Path = "") -> np.ndarray:
    """[len(candidates), prompts] float32 scores of the candidates in a sweep table (`read_sweep`): the sweep
    wrote each float32 score with 9 significant digits, so these are its scores bit for bit."""
    flag = f"--from_sweep={path}"
    column = table["token_id"]
    bad = [t for t in column.tolist() if isinstance(t, bool) or not isinstance(t, int) or t < 0]
    if bad:
        raise UsageError(f"{flag}: token_id {bad[0]!r} is not a token id (a non-negative integer); the CSV was "
                         "edited or is not a sweep's: rerun the sweep.")
    repeated = column[column.duplicated()].tolist()
    if repeated:  # one score per token: which of two rows would be a guess
        raise UsageError(f"{flag}: token ids {repeated[:5]} have more than one row; the CSV was edited or joined "
                         "from several sweeps: rerun the sweep.")
    row = {t: i for i, t in enumerate(column.tolist())}
    missing = [c for c in candidates.tolist() if c not in row]
    if missing:
        raise UsageError(f"--from_sweep={path} lacks {len(missing)} of the beam's {len(candidates)} candidates "
                         f"(first {missing[:5]}): sweep them too, or restrict the beam's (--limit, --token_ids).")
    return table[list(prompts)].to_numpy(np.float64)[[row[c] for c in candidates.tolist()]].astype(np.float32)


def write_csv(path: str | Path, found: list[Found], tokenizer, prompt_names: list[str]) -> Path:
    """`depth, direction, rank, ids, tokens, decoded, <prompt columns>`: ids space-separated, tokens a JSON list
    of token strings and decoded a JSON string (quoted like the sweep's CSV, so any token survives)."""
    rows = [(f.depth, f.direction, rank + 1, ids, scores) for f in found
            for rank, (ids, scores) in enumerate(zip(f.ids.tolist(), f.scores, strict=True))]
    keys = {"depth": [r[0] for r in rows], "direction": [r[1] for r in rows], "rank": [r[2] for r in rows],
            "ids": [" ".join(map(str, r[3])) for r in rows],
            "tokens": [json.dumps([t or "" for t in tokenizer.convert_ids_to_tokens(r[3])], ensure_ascii=False)
                       for r in rows],
            "decoded": [json.dumps(tokenizer.decode(r[3]), ensure_ascii=False) for r in rows]}
    values = {name: np.asarray([r[4][j] for r in rows], np.float64) for j, name in enumerate(prompt_names)}
    return results.write_table(path, keys, values)


@dataclasses.dataclass(frozen=True)
class BeamSpec:
    """A beam job as one value: the search (`config`; its template is options.template), the candidate set
    (`token_ids`, or the single-token lines of `vocab_file`, else the vocabulary; `limit` keeps the first N),
    `from_sweep` (a finished sweep CSV whose scores are depth 1), the batches (`batch_size` 0: the largest the
    memory plan allows) and resumable chunks."""

    options: RunOptions
    prompts: dict[str, str]
    config: BeamConfig
    token_ids: tuple[int, ...] | None = None
    vocab_file: str | None = None
    limit: int | None = None
    from_sweep: str | None = None
    batch_size: int = 0
    chunk_size: int = 4096
    lm: str | None = None  # the completion check's LM when the RM has no LM head of its own

    def __post_init__(self):
        object.__setattr__(self, "config", dataclasses.replace(self.config, template=self.options.template))


def run_beam(spec: BeamSpec) -> BeamResult | None:
    """The beam job: the candidate set and `from_sweep` checked and the identity computed without loading the
    model → claim options.out once → unless a finished result of the same inputs is there (None), load (checked
    and planned first: rmjax.search.sweep.load_planned), search (resumable) and write the CSV and .meta.json."""
    o, cfg = spec.options, spec.config
    check_prompt_names(spec.prompts, results.NON_VALUE_COLUMNS)
    lines, requested = _requested(spec)
    check_limit(o.model, spec.token_ids, lines, spec.limit, spec.vocab_file)
    fp, from_sweep = job_fingerprint(o), None
    if spec.lm:
        require_prior_config(config_of(spec.lm), spec.lm, "--lm")
    check_completion_before_loading(o, o.model, spec.lm, spec.prompts.values(), cfg.template, cfg.depth,
                                    "give a shorter prompt or a smaller --depth" + ("" if spec.lm else
                                    ", or a prior with a longer context (--lm)"))
    # the candidates (none but special tokens is refused) and --from_sweep (not this beam's depth 1, or lacking a
    # candidate: refused), before the model loads
    model_config, tokenizer = config_and_tokenizer(o.model)
    ids = spec.token_ids if lines is None else candidate_set.single_token_ids(tokenizer, lines, spec.vocab_file,
                                                                               report=False)[0]
    candidates = beam_candidates(tokenizer, model_config.vocab_size, cfg, ids, spec.limit, report=False)
    check_enumeration(cfg, len(candidates))  # --exhaustive's deepest level must fit the host
    if spec.lm:
        require_same_vocabulary(tokenizer, o.model, config_and_tokenizer(spec.lm)[1], spec.lm)
    if spec.from_sweep:
        table, given = read_sweep(spec.from_sweep, sweep_needs(fp, dtype=o.dtype, output_column=o.output_column,
                                                               prompts=spec.prompts, template=cfg.template))
        depth1_scores(table, candidates, spec.prompts, spec.from_sweep)
        from_sweep = given.sha1
    identity = beam_identity(fp, dtype=o.dtype, prompts=spec.prompts, cfg=cfg, output_column=o.output_column,
                             candidates=requested, limit=spec.limit, from_sweep=from_sweep,
                             lm=job_fingerprint(o, spec.lm) if spec.lm else None)
    with claim_job(o, identity, store=store_dir(o.out), owned=[completions_path(o.out)],
                   inputs={"--from_sweep": spec.from_sweep, "--vocab_file": spec.vocab_file} | model_inputs(lm=spec.lm)
                   ) as job:
        if job.reuse:
            return None
        # a resume scores with its saved batch size, planned (refused if it does not fit) before the weights load
        asked = resume_batch_size(o.out, spec.batch_size) if job.claimed.resume else spec.batch_size
        # each forward scores the candidates after one partial: a batch past those searched (special tokens left
        # out) is padding alone
        model, batch_size = load_planned(o, spec.prompts, candidates.tolist(), asked, response_tokens=cfg.depth,
                                         resumed=job.claimed.resume)
        lm = load_for_job(dataclasses.replace(o, output_column=0), spec.lm) if spec.lm else None
        ids, extra = spec.token_ids, {}
        if lines is not None:
            ids, extra["vocab_file"] = _vocab_ids(model, lines, spec.vocab_file)
        return write_beam(model, spec.prompts, cfg, ids, out=o.out, requested=requested, limit=spec.limit,
                          from_sweep=spec.from_sweep, batch_size=batch_size, chunk_size=spec.chunk_size,
                          allow_nonfinite=o.allow_nonfinite, extra_meta=extra, job=job, lm=lm)


def _requested(spec: BeamSpec) -> tuple[list[str] | None, str | None]:
    """(the lines of `vocab_file` or None, the candidate set as requested: part of the identity)."""
    candidate_set.refuse_two_candidate_sets(spec.token_ids, spec.vocab_file)
    lines = candidate_set.read_vocab_file(spec.vocab_file) if spec.vocab_file else None
    check_candidate_set(spec.config, spec.token_ids is not None or lines is not None or spec.limit is not None)
    return lines, candidate_set.identity_of_candidates(spec.token_ids, lines)


def _vocab_ids(model: Model, lines: list[str], path: str) -> tuple[np.ndarray, dict]:
    """The ids of the lines that are one token of the model's tokenizer, and their record for .meta.json."""
    ids, skipped = candidate_set.single_token_ids(model.tokenizer, lines, path)
    return ids, {"path": path, "lines": len(lines), "single_tokens": len(ids), "skipped": len(skipped),
                 "first_skipped": skipped[:10]}


def beam_candidates(tokenizer, vocab: int, cfg: BeamConfig, token_ids=None, limit: int | None = None,
                    report: bool = True) -> np.ndarray:
    """The ids a beam searches: `token_ids` or the vocabulary, its first `limit`, less special and byte tokens
    unless cfg.allow_special (saying how many left: never silently a smaller set). Needs no weights."""
    candidates = candidate_ids(tokenizer, vocab, token_ids, limit)
    if cfg.allow_special:
        return candidates
    left_out = candidate_set.special_or_byte(tokenizer, vocab)[candidates]
    if left_out.all():
        raise UsageError(f"all {len(candidates)} candidates are special or byte tokens: pass --allow_special to "
                         "search them, or give other tokens.")
    if report and left_out.any() and is_main():
        print(f"beam: {int(left_out.sum())} special/byte token{'s' * (int(left_out.sum()) != 1)} of "
              f"{len(candidates)} candidates left out (--allow_special keeps them).", file=sys.stderr)
    return candidates[~left_out]


def write_beam(model: Model, prompts: dict[str, str], cfg: BeamConfig, candidates: np.ndarray | None = None, *,
               out: str | Path, requested: str | None = None, limit: int | None = None,
               from_sweep: str | Path | None = None, batch_size: int = 256, chunk_size: int = 4096,
               overwrite: bool = False, allow_nonfinite: bool = False, extra_meta: dict | None = None,
               job: jobs.Job | None = None, lm: Model | None = None) -> BeamResult | None:
    """Search with a loaded model (resumable) and write the CSV, the completion check's table
    (`completions_path`, when an LM completes: `lm`, else the RM's own backbone if it ties its embeddings) and
    .meta.json; None when reused. `out` is claimed here unless `job` is its claim already (`run_beam`).
    `requested` identifies the candidate set as asked for (identity); default: `candidates`' ids, or the whole
    vocabulary. `limit` keeps its first N (as the sweep's --limit); `from_sweep`: a finished sweep CSV whose scores
    are depth 1."""
    if requested is None and candidates is not None:  # a library call's ids: the whole vocabulary's was reused
        requested = candidate_set.identity_of_candidates([int(t) for t in np.asarray(candidates).ravel()], None)
    candidates = beam_candidates(model.tokenizer, model.config.vocab_size, cfg, candidates, limit)
    depth1, extra_meta = None, dict(extra_meta or {})
    if from_sweep is not None:
        table, given = read_sweep(from_sweep, sweep_needs(model_fingerprint(model), dtype=model.dtype, prompts=prompts,
                                                          output_column=model.output_column, template=cfg.template))
        depth1 = depth1_scores(table, candidates, prompts, from_sweep)
        extra_meta["from_sweep"] = given.record()  # as before issue 42; `inputs` is every reader's record
        extra_meta["inputs"] = stages.recorded({"--from_sweep": given})
    identity = beam_identity(model_fingerprint(model), dtype=model.dtype, output_column=model.output_column,
                             prompts=prompts, cfg=cfg, candidates=requested, limit=limit,
                             from_sweep=extra_meta["from_sweep"]["sha1"] if from_sweep is not None else None,
                             lm=model_fingerprint(lm) if lm is not None else None)
    prior, skipped = completion_prior(model, lm)
    with jobs.claimed(job, out, identity, allow_nonfinite=allow_nonfinite, overwrite=overwrite, store=store_dir(out),
                      owned=[completions_path(out)]) as job:
        if job.reuse:
            return None
        store = open_store(out, identity, chunk_size, batch_size)
        batch_size = store.batch_size  # a resume keeps the batches its saved scores were computed in
        result = beam_search(model, prompts, cfg, candidates, batch_size=batch_size, chunk_size=chunk_size,
                             store=store, allow_nonfinite=allow_nonfinite, depth1=depth1)
        checked = (_completions(model, prior, prompts, result.found, cfg.template, allow_nonfinite)
                   if prior is not None else None)
        if skipped and is_main():
            print(f"completion check {skipped}", file=sys.stderr)

        def write(path: Path) -> Path:
            if checked is not None:
                results.write_table(completions_path(path), *checked[0])
            return write_csv(path, result.found, model.tokenizer, list(prompts))

        job.finish(write, completion=checked[1] if checked is not None else {"skipped": skipped},
                   allow_nonfinite=allow_nonfinite,
                   **jobs.model_meta(model), prompts=prompts, config=dataclasses.asdict(cfg),
                   candidate_set={"size": len(candidates), "sha1": array_sha1(candidates)},
                   candidates_scored=result.scored, resumed_candidates=result.resumed, levels=result.levels,
                   nonfinite=result.nonfinite,
                   estimate=result.estimate,
                   batch_size=batch_size, chunk_size=store.chunk_size, seconds=result.seconds,
                   candidates_per_second=result.scored * len(prompts) / result.seconds if result.seconds > 0 else None,
                   **(extra_meta or {}))
        if is_main():
            store.remove()
        return result


def _completions(model: Model, prior: Model, prompts: dict[str, str], found: list[Found], template: str,
                 allow_nonfinite: bool = False) -> tuple[tuple[dict, dict], dict]:
    """The completion check of each depth and direction's first CHECKED_ROWS written rows, for every prompt
    (rmjax.search.completion.check_written): the table's keys and values (`depth, direction, rank, ids` then the
    check's columns, one row per checked row and prompt) and its summary per direction for .meta.json."""
    rows = [(f.depth, f.direction, rank + 1, ids, scores) for f in found
            for rank, (ids, scores) in enumerate(zip(f.ids[:CHECKED_ROWS].tolist(), f.scores[:CHECKED_ROWS],
                                                     strict=True))]
    signs = np.asarray([1.0 if r[1] == "optimal" else -1.0 for r in rows])
    table = check_written(model, prior, prompts, [r[3] for r in rows], np.asarray([r[4] for r in rows]), signs,
                          template, MAX_NEW, allow_nonfinite)
    which = [rows[i] for i in table["row"]]
    keys = {"depth": [r[0] for r in which], "direction": [r[1] for r in which], "rank": [r[2] for r in which],
            "ids": [" ".join(map(str, r[3])) for r in which], "prompt": table["prompt"],
            "ends_turn": table["ends_turn"],
            "completed_text": [json.dumps(t, ensure_ascii=False) for t in table["completed_text"]]}
    values = {k: np.asarray(table[k], np.float64) for k in COMPLETION_VALUES}
    summary = {"lm": prior.source, "max_new": MAX_NEW, "rows_checked": f"the first {CHECKED_ROWS} of each depth "
               "and direction", "reward_units": "the RM's raw reward",
               "by_direction": gains_summary(table, [r[1] for r in which])}
    return (keys, values), summary


def summary(path: str | Path, n: int = 5) -> str:
    """The best n sequences of every depth and direction in a beam CSV, with their mean reward."""
    df = results.read_beam_csv(path)
    prompts = results.value_columns(df)
    lines = []
    for (depth, direction), part in df.groupby(["depth", "direction"], sort=True):
        lines.append(f"depth {depth} {direction}:")
        for _, row in part.head(n).iterrows():
            mean = float(row[prompts].mean())
            lines.append(f"  {row['rank']:>4}  {mean:+.4f}  {row['decoded']!r}  ids {list(row['ids'])}")
    return "\n".join(lines)
