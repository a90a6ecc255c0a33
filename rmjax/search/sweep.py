"""Score every candidate response (default: every token of the vocabulary) for each prompt.

Token mode (exact): candidate i is `prefix + [token_i] + suffix`; the prefix K/V is computed once
per prompt and each batch runs only 1 + len(suffix) positions against it (broadcast, never
copied). Text mode (compatibility with the published CSVs): each token is decoded, placed in the
chat template and re-tokenized; see `rmjax.scoring.texts`. Every result says per token whether the
two agree (`roundtrip`): where they do not, token mode scores a sequence no conversation produces.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from rmjax.errors import OutputExistsError, PromptTooLongError, UsageError
from rmjax.loading.for_job import check_output_column, job_fingerprint, load_for_job
from rmjax.loading.identity import model_fingerprint
from rmjax.model import Model, require_reward_model
from rmjax.parallel import batching
from rmjax.parallel.distributed import barrier, is_main
from rmjax.runs import jobs, results
from rmjax.runs.chunks import open_store, resume_batch_size, saved_batch_size, store_dir
from rmjax.runs.options import RunOptions, claim_job
from rmjax.runs.paths import real_path
from rmjax.runs.progress import Progress
from rmjax.runs.results import array_sha1
from rmjax.scoring import finite, memory
from rmjax.scoring.context import prepare_prompt, score_tokens
from rmjax.scoring.prefix import PREFIX_BUCKET
from rmjax.scoring.texts import TextScorer
from rmjax.text import chat
from rmjax.text.candidates import (
    VocabLines,
    candidate_count,
    candidate_ids,
    check_token_ids,
    identity_of_candidates,
    read_vocab_file,
    refuse_two_candidate_sets,
    roundtrip_mask,
    single_token_ids,
)
from rmjax.text.prompts import check_prompt_names


def memory_plan(cfg, tokenizer, prompts: dict[str, str], template: str, dtype: str, mesh,
                batch_size: int | None = None, mode: str = "token", response_tokens: int = 1,
                response_flag: str = "--depth", saved: str | None = None, held: int = 0) -> memory.MemoryEstimate:
    """Per-device memory of this sweep (or of a beam's deepest level: the partial response joins the cached
    prefix) from the config and tokenizer alone, before weights load; picks the batch size when None,
    raises DoesNotFitError when the run cannot fit (PromptTooLongError when a prompt cannot, naming
    `response_flag` when the response of `response_tokens` > 1 is what overflows the context). `saved`: the
    progress a resume keeps `batch_size` from, `held` the other models' weights a job holds meanwhile (memory.plan)."""
    splits = [chat.split_chat(tokenizer, t, template) for t in prompts.values()]
    for split in splits:
        check_room(split.prompt, len(split.prefix), len(split.suffix), cfg.max_position_embeddings, response_tokens,
                   response_flag)
    prefix = batching.bucket(max(len(s.prefix) for s in splits) + response_tokens - 1, PREFIX_BUCKET)
    positions = 1 + max(len(s.suffix) for s in splits) if mode == "token" else 16  # text: re-tokenized tails
    return memory.plan(cfg, dtype, prefix, positions, mesh, batch_size, saved, held)


def check_room(prompt: str, prefix: int, suffix: int, context: int, response_tokens: int = 1,
               response_flag: str = "--depth") -> None:
    """Refuse a prompt whose templated prefix and suffix leave fewer than `response_tokens` of the model's `context`
    positions, naming `response_flag` when a response longer than one token is what overflows. Pure: sweep, beam
    and their plans (rmjax.plan.spec) share it."""
    room = context - prefix - suffix
    if room >= response_tokens:
        return
    if response_tokens > 1 and room > 0:
        raise PromptTooLongError(f"{response_flag}={response_tokens}: prompt {prompt[:40]!r} takes "
                                 f"{context - room} of the model's {context} positions (max_position_embeddings) "
                                 f"with its template, leaving {room} for the response; use {response_flag}={room} "
                                 "or less, or a shorter prompt.")
    chat.check_fits(prompt, prefix, response_tokens, suffix, context)  # raises: the prompt alone is too long


def check_batch_size(batch_size: int, candidates: int, mesh) -> None:
    """Refuse an explicit --batch_size beyond the candidates there are: every batch is padded to its size, so a
    batch of 10^6 for 64 candidates spends minutes and gigabytes on padding (or runs out of memory)."""
    most = batching.round_up(max(candidates, 1), mesh)
    if batch_size > most:
        raise UsageError(f"--batch_size={batch_size} is more than the {candidates:,} candidates there are to score "
                         f"(each batch is padded to its size); use --batch_size={most} or less, or 0 to pick one.")


def load_planned(options: RunOptions, prompts: dict[str, str], token_ids: Sequence[int] | None, batch_size: int = 0,
                 *, limit: int | None = None, mode: str = "token", response_tokens: int = 1,
                 given: Sequence | None = None, resumed: bool = False) -> tuple[Model, int]:
    """(model, batch size) of a job that scores candidates in batches (sweep, beam). Before the weights load
    (rmjax.loading.for_job.load_for_job): a model without a score head, a bad output column, `token_ids` outside
    the vocabulary and a prompt too long for the context are refused, the batch size is picked (`batch_size`,
    or the largest that fits when 0) and the memory plan printed; an explicit `batch_size` beyond the candidates
    (`given`, default `token_ids`, as `limit` keeps them) is refused too, but not the batch size a `resumed` run
    keeps from its progress (the memory plan may have picked it: a power of two past the candidates)."""
    plan = {}
    kept = resumed and saved_batch_size(options.out) is not None  # the batch is the saved progress's, not asked for

    def before_weights(cfg, tokenizer, mesh) -> None:
        require_reward_model(cfg, options.model)
        check_output_column(cfg, options.output_column, options.model, options.column_chosen)
        check_token_ids(token_ids or [], cfg.vocab_size, tokenizer)
        estimate = memory_plan(cfg, tokenizer, prompts, options.template, options.dtype, mesh, batch_size or None,
                               mode, response_tokens, saved=str(store_dir(options.out)) if kept else None)
        candidates = token_ids if given is None else given
        if isinstance(given, VocabLines):  # a --vocab_file with no single token is refused before the weights
            candidates = single_token_ids(tokenizer, given, given.path, report=False)[0]
        count = candidate_count(cfg, tokenizer, candidates, limit)
        if batch_size and not kept:
            check_batch_size(batch_size, count, mesh)
        # a picked batch needs no more rows than the candidates (every batch is padded to its size)
        plan["batch_size"] = batch_size or min(estimate.batch_size,
                                               batching.rows_for(count, batching.data_shards(mesh)))
        if is_main():
            capped = (f"; batch {plan['batch_size']}: the {count:,} candidates need no more"
                      if plan["batch_size"] < estimate.batch_size else "")
            print(f"memory plan: {estimate.describe()}{capped}", file=sys.stderr)

    model = load_for_job(options, before_weights=before_weights)
    return model, plan["batch_size"]


def sweep_identity(model_fingerprint: dict, *, dtype: str, output_column: int, prompts: dict[str, str],
                   token_ids=None, limit: int | None = None, mode: str = "token", template: str = "auto",
                   text_add_special_tokens: bool = False, vocab_lines: list[str] | None = None) -> dict:
    """What a sweep's scores depend on (rmjax.runs.claims): computable before the model loads (a --vocab_file's
    lines stand for the ids the tokenizer makes of them)."""
    requested = None if token_ids is None else array_sha1(np.asarray(list(token_ids), np.int64))
    out = {"job": "sweep", "model": model_fingerprint, "dtype": dtype, "output_column": int(output_column),
           "prompts": dict(prompts), "token_ids": requested, "limit": limit, "mode": mode, "template": template,
           "text_add_special_tokens": bool(text_add_special_tokens) and mode == "text"}  # unused in token mode
    if vocab_lines is not None:
        out.update(token_ids=None, vocab_file=identity_of_candidates(None, vocab_lines))
    return out


def plot_path(out: str | Path) -> Path:
    return Path(out).with_name(Path(out).name + ".png")  # from the full name: x.csv and x.txt differ


def figure_path(out: str | Path) -> Path:
    """Where the histogram is written: `plot_path`, through a symlink as the claim locks it."""
    return real_path(plot_path(out))


@dataclasses.dataclass(frozen=True)
class SweepSpec:
    """A sweep as one value: the candidates (`token_ids`, else the vocabulary; `limit` keeps the first N), how
    each is scored (`mode`), the batches (`batch_size` 0: the largest the memory plan allows) and resumable
    chunks, and whether to draw the score histogram beside the CSV (`plot`)."""

    options: RunOptions
    prompts: dict[str, str]
    token_ids: tuple[int, ...] | None = None
    limit: int | None = None
    mode: str = "token"
    batch_size: int = 0
    chunk_size: int = 4096
    text_add_special_tokens: bool = False
    plot: bool = False
    vocab_file: str | None = None  # the single-token lines of this file, in place of token_ids


def run_sweep(spec: SweepSpec) -> Path:
    """The sweep job: identity (without loading the model) → claim options.out once → unless a finished result of
    the same inputs is there, load (checked and planned first: `load_planned`) and sweep → the CSV and its
    .meta.json (+ the histogram with `plot`). Returns the CSV's path."""
    o = spec.options
    _check_mode(spec.mode)
    check_prompt_names(spec.prompts, results.NON_VALUE_COLUMNS)
    refuse_two_candidate_sets(spec.token_ids, spec.vocab_file)
    lines = read_vocab_file(spec.vocab_file) if spec.vocab_file else None
    check_limit(o.model, spec.token_ids, lines, spec.limit, spec.vocab_file)
    identity = sweep_identity(job_fingerprint(o), dtype=o.dtype, output_column=o.output_column, prompts=spec.prompts,
                              token_ids=spec.token_ids, limit=spec.limit, mode=spec.mode, template=o.template,
                              text_add_special_tokens=spec.text_add_special_tokens, vocab_lines=lines)
    with claim_job(o, identity, owned=owned_figure(o.out, spec.plot), store=store_dir(o.out),
                   inputs={"--vocab_file": spec.vocab_file}) as job:
        if not job.reuse:  # a resume scores with its saved batch size, planned (refused if it does not fit) here
            asked = resume_batch_size(o.out, spec.batch_size) if job.claimed.resume else spec.batch_size
            model, batch_size = load_planned(o, spec.prompts, spec.token_ids, asked, limit=spec.limit, mode=spec.mode,
                                             given=lines, resumed=job.claimed.resume)
            ids = spec.token_ids if lines is None else single_token_ids(model.tokenizer, lines, spec.vocab_file)[0]
            sweep(model, spec.prompts, ids, limit=spec.limit, mode=spec.mode, batch_size=batch_size,
                  chunk_size=spec.chunk_size, template=o.template, out=o.out,
                  text_add_special_tokens=spec.text_add_special_tokens, allow_nonfinite=o.allow_nonfinite, job=job,
                  plot=spec.plot, vocab_lines=lines)
        elif spec.plot and is_main():
            reused_figure(job.out, figure_path(o.out))
    return Path(o.out)


def check_limit(model: str, token_ids, lines: VocabLines | None, limit: int | None, vocab_file: str | None) -> None:
    """A --limit that keeps every candidate changes nothing, and a --token_ids id past the vocabulary names no token:
    refused from the config and tokenizer before the claim (where --overwrite deletes an earlier result, and a
    finished one with it would be reused), and before any weight (a builtin or GGUF model's tokenizer comes with its
    weights: the check after loading took 19 s for Gemma 3 270M)."""
    if limit is None and token_ids is None:
        return
    from rmjax.loading import config_and_tokenizer

    config, tokenizer = config_and_tokenizer(model)
    ids = token_ids if lines is None else single_token_ids(tokenizer, lines, vocab_file, report=False)[0]
    if limit is None:
        candidate_ids(tokenizer, config.vocab_size, ids)
        return
    candidate_count(config, tokenizer, ids, limit)


def owned_figure(out: str | Path, plot: bool) -> list[Path]:
    """The histogram beside `out` is the run's to write or replace when it draws one, or when the result it would
    replace records one; else a file of that name is someone else's (--overwrite had deleted a user's own)."""
    png = plot_path(out)
    return [png] if plot or results.recorded(out, png) else []


def _draw(csv: Path, png: Path) -> None:
    from rmjax.runs.table_summary import plot_distributions

    plot_distributions(csv, png)


def reused_figure(csv: Path, png: Path) -> Path:
    """The figure of a reused sweep: the one its .meta.json records (proven unchanged by the claim, which checks
    every recorded file), else drawn now and recorded; a file at `png` that the result does not record is not
    its figure, and is refused rather than reported or overwritten."""
    if results.recorded(csv, png) and png.is_file() and not png.is_symlink():
        return png  # a recorded figure deleted since is drawn again
    if png.exists() or png.is_symlink():
        raise OutputExistsError(f"{png} is not the figure of {csv} (its {results.meta_path(csv).name} does not record "
                                "it): move it away to draw the figure there, or pass --overwrite to recompute both.")
    _draw(csv, png)
    results.record_files(csv, [png])
    return png


def _check_mode(mode: str) -> None:
    if mode not in ("token", "text"):
        raise UsageError(f"mode must be token or text, not {mode!r}")


def sweep(
    model: Model,
    prompts: dict[str, str],
    token_ids=None,
    *,
    limit: int | None = None,
    mode: str = "token",
    batch_size: int = 256,
    chunk_size: int = 4096,
    template: str = "auto",
    out: str | Path | None = None,
    progress_every: float = 5.0,
    text_add_special_tokens: bool = False,
    overwrite: bool = False,
    allow_nonfinite: bool = False,
    job: jobs.Job | None = None,
    plot: bool = False,
    vocab_lines: list[str] | None = None,
) -> pd.DataFrame:
    """Reward of every candidate for every prompt; resumable when `out` is given.

    Completed chunks go to `<out>.chunks/`; an interrupted run restarted with the same inputs
    (rmjax.runs.claims identity) continues after the last complete chunk, with the chunk and batch sizes it
    was saved with. The CSV (with `plot`, its histogram too) and its .meta.json appear only when all chunks are
    done; a finished result with the same identity is reused. `out` is claimed here unless `job` is its claim
    already (`run_sweep`). NaN/Inf scores stop it unless `allow_nonfinite`.
    """
    _check_mode(mode)
    check_prompt_names(prompts, results.NON_VALUE_COLUMNS)
    identity = sweep_identity(model_fingerprint(model), dtype=model.dtype, output_column=model.output_column,
                              prompts=prompts, token_ids=None if vocab_lines is not None else token_ids, limit=limit,
                              mode=mode, template=template, text_add_special_tokens=text_add_special_tokens,
                              vocab_lines=vocab_lines)
    guard = (jobs.claimed(job, out, identity, allow_nonfinite=allow_nonfinite, overwrite=overwrite,
                           owned=owned_figure(out, plot), store=store_dir(out))
             if out is not None else contextlib.nullcontext())
    with guard as job:
        if job is not None and job.reuse:
            if plot and is_main():
                reused_figure(job.out, figure_path(out))
            return results.read_scores_csv(out)  # proven whole by the claim (its digest)
        start_time = time.perf_counter()
        tokens = candidate_ids(model.tokenizer, model.config.vocab_size, token_ids, limit)
        _, names_all, decoded_all = chat.token_table(model.tokenizer, model.config.vocab_size)
        names, decoded = [names_all[i] for i in tokens], [decoded_all[i] for i in tokens]
        store = open_store(out, identity, chunk_size, batch_size) if out is not None else None
        batch_size = store.batch_size if store is not None else batch_size  # every row in one run's batches
        score, sequence = _scorer(model, prompts, mode, template, text_add_special_tokens, tokens, decoded, batch_size)

        def check(scores: np.ndarray, offset: int, what: str = "scores") -> dict | None:
            return finite.check(scores, what=what, columns=list(prompts), allow=allow_nonfinite,
                                row=lambda i: f"token {int(tokens[offset + i])} ({decoded[offset + i]!r})",
                                explain=lambda i, j: finite.diagnose(model, sequence(offset + i, j)))

        chunk_size = store.chunk_size if store is not None else chunk_size
        table, done_before = _scored_chunks(len(tokens), len(prompts), score, check, store, chunk_size,
                                            f"sweep {mode}", progress_every)
        nonfinite = check(table, 0)  # the record of the whole table, resumed chunks included
        roundtrip, per_prompt = roundtrip_mask(model.tokenizer, prompts, template, tokens, decoded,
                                               model.config.max_position_embeddings)
        df = pd.DataFrame({"token_id": tokens, "token_name": names, "token_decoded": decoded,
                           results.ROUNDTRIP: roundtrip.astype(np.int64)})
        for j, name in enumerate(prompts):
            df[name] = table[:, j]
        seconds = time.perf_counter() - start_time
        if job is not None:
            columns = {n: table[:, j] for j, n in enumerate(prompts)}
            scored = len(tokens) - done_before
            def write(path: Path) -> Path:
                results.write_scores_csv(path, tokens, names, decoded, columns, roundtrip)
                if plot:  # before .meta.json, which records it: a reuse then knows its own figure
                    _draw(path, figure_path(out))
                return path

            job.finish(
                write, allow_nonfinite=allow_nonfinite,
                **jobs.model_meta(model), architecture=model.config.architecture, prompts=prompts, mode=mode,
                template=template, n_candidates=len(tokens), resumed_candidates=done_before, batch_size=batch_size,
                roundtrip={"tokens": int(roundtrip.sum()), "of": len(tokens), "per_prompt": per_prompt},
                chunk_size=chunk_size, nonfinite=nonfinite, seconds=seconds,
                candidates_per_second=scored * len(prompts) / seconds if seconds > 0 else None,
            )
            if is_main():
                store.remove()  # after .meta.json: a crash in between leaves a complete result and spare chunks
        return df


def _scored_chunks(n: int, columns: int, score, check, store, chunk_size: int, label: str,
                   progress_every: float) -> tuple[np.ndarray, int]:
    """The [n, columns] table chunk by chunk: stored chunks read back (held to this run's `check`: a run with
    --allow_nonfinite may have stored them), the others scored, checked and stored. Also returns how many rows
    were read back."""
    starts = list(range(0, n, chunk_size))
    done = {s for s in starts if store is not None and store.has(s)}
    barrier("rmjax-sweep-resume")  # every process agrees on the chunks to skip before any is written
    done_before = sum(min(chunk_size, n - s) for s in done)
    progress = Progress(n, label, every=progress_every, done=done_before)
    if done_before:
        progress.update(0, force=True)
    chunks = []
    for s in starts:
        rows = range(s, min(s + chunk_size, n))
        if s in done:
            chunks.append(store.read(s, (len(rows), columns), lambda v, what, s=s: check(v, s, what)))
            continue
        scores = score(rows)
        check(scores, s)  # stops before a bad chunk is stored
        if store is not None and is_main():
            store.write(s, scores)
        chunks.append(scores)
        progress.update(len(rows))
    return (np.concatenate(chunks) if chunks else np.zeros((0, columns), np.float32)), done_before


def _scorer(model: Model, prompts: dict[str, str], mode: str, template: str, text_add_special_tokens: bool,
            tokens: np.ndarray, decoded: list[str], batch_size: int):
    """(score(rows) -> [len(rows), prompts], sequence(row, prompt) -> the full token ids it scored)."""
    if mode == "token":
        contexts = [prepare_prompt(model, n, t, template) for n, t in prompts.items()]
        return (lambda rows: np.stack([score_tokens(model, c, tokens[rows.start : rows.stop], batch_size)
                                       for c in contexts], axis=1),
                lambda row, col: contexts[col].split.ids_with([int(tokens[row])]))
    scorers = [TextScorer(model, t, template, text_add_special_tokens) for t in prompts.values()]
    return (lambda rows: np.stack([sc.score([decoded[i] for i in rows], batch_size) for sc in scorers], axis=1),
            lambda row, col: scorers[col].token_ids([decoded[row]])[0])


