"""The inspect job: for one prompt and a few responses (given as text, or a sweep's / beam's best and worst), the
reward lens and direct contributions, per-token reward curves, attribution and activation patching, written as
CSVs, a .meta.json and PNG figures in one folder (load → compute → write, as every job)."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rmjax.errors import NonFiniteError, UsageError
from rmjax.inspect.attribution import (
    MAX_EVALUATIONS,
    TOLERANCE,
    attribute,
    check_batch_size,
    first_points,
    pad_baseline_id,
)
from rmjax.inspect.figures import percent, write_figures
from rmjax.inspect.lens import gated_from, reward_lens, token_rewards
from rmjax.inspect.patching import patching_map
from rmjax.loading.for_job import check_template, job_config_and_tokenizer, job_fingerprint, load_for_job
from rmjax.loading.identity import model_fingerprint
from rmjax.model import Model, require_reward_model
from rmjax.runs import jobs, results, stages
from rmjax.runs.options import RunOptions, claim_job
from rmjax.runs.paths import check_writable
from rmjax.runs.progress import Progress
from rmjax.scoring import finite
from rmjax.text import chat
from rmjax.text.chat import Conversations

FILES = ("reward_lens.csv", "token_rewards.csv", "attribution.csv", "patching.csv", "lens.png", "attribution.png",
         "patching.png")


@dataclasses.dataclass(frozen=True)
class Item:
    """One inspected response: its label (the decoded response) and the whole conversation's token ids."""

    label: str
    ids: tuple[int, ...]
    start: int  # position of the response's first token
    end: int  # one past its last: the template's end of turn that follows is not the response


def items_from_texts(model: Model, prompt: str, responses: list[str], template: str = "auto") -> list[Item]:
    """Responses as text: placed in the template and tokenized, as a real conversation is."""
    return _text_items(model.tokenizer, model.config.max_position_embeddings, prompt, responses, template)


def items_from_ids(model: Model, prompt: str, sequences: list[tuple[int, ...]], template: str = "auto") -> list[Item]:
    """Responses as token ids (a sweep's or beam's token-mode sequences): prefix + ids + suffix exactly."""
    return _id_items(model.tokenizer, model.config.max_position_embeddings, prompt, sequences, template)


def _text_items(tokenizer, context: int, prompt: str, responses: list[str], template: str) -> list[Item]:
    conv = Conversations(tokenizer, prompt, template, max_positions=context)
    prefix, suffix = list(conv.prefix), list(conv.split.suffix)
    items = []
    for response, ids in zip(responses, conv.token_ids(responses), strict=True):
        # a token merged across the template's edge ('\n' + a response's leading '\n\n') is the response's: its
        # span runs from the first position that differs from the prefix to the last that differs from the suffix
        start = _shared_length(ids, prefix)
        end = len(ids) - _shared_length(ids[start:][::-1], suffix[::-1])
        items.append(Item(response, tuple(ids), start, end))
    return _within_context(items, context)


def _shared_length(a: list[int], b: list[int]) -> int:
    """How many leading elements `a` and `b` share."""
    return next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def _id_items(tokenizer, context: int, prompt: str, sequences: list[tuple[int, ...]], template: str) -> list[Item]:
    split = chat.split_chat(tokenizer, prompt, template, context)
    texts = [tokenizer.decode(list(s)) for s in sequences]
    # several sequences may decode alike (every lone byte token decodes to U+FFFD): their ids tell them apart
    return _within_context([Item(t if texts.count(t) == 1 else f"{t} [ids {' '.join(map(str, s))}]",
                                 tuple(split.ids_with(list(s))), len(split.prefix), len(split.prefix) + len(s))
                            for t, s in zip(texts, sequences, strict=True)], context)


def _within_context(items: list[Item], context: int) -> list[Item]:
    """`items`, refused in one line (before the weights load) where a conversation is longer than the model's
    context: its lens, attribution and patching would come from positions the model never saw."""
    for item in items:
        chat.check_response_fits(item.label, len(item.ids), context, "; inspect a shorter response")
    return items


def distinct_labels(items: list[Item]) -> list[Item]:
    """Labels that identify, so every row of every table names one response: a response given twice is refused,
    and labels still alike get the conversation's ids from the response on."""
    seen: dict[tuple[int, ...], str] = {}
    for item in items:
        if item.ids in seen:
            raise UsageError(f"response {item.label!r} is given twice; inspect each response once.")
        seen[item.ids] = item.label
    labels = [i.label for i in items]
    return [dataclasses.replace(i, label=f"{i.label} [ids {' '.join(map(str, i.ids[i.start:]))}]")
            if labels.count(i.label) > 1 else i for i in items]


# What each flag reads: a beam given as --from_sweep (or a sweep as --from_beam) was read, and .meta.json recorded
# the wrong flag as the source.
SOURCE_KINDS = {"--from_sweep": ("sweep",), "--from_beam": ("beam", "gcg")}


def source_needs(model_fp: dict, *, dtype: str, output_column: int, template: str,
                 prompt: tuple[str, str]) -> stages.Needs:
    """What the run that ranked the responses must have used: this model's content, dtype, output column and
    template, token mode (inspect runs prefix + ids + suffix), and this prompt's text under its name."""
    return stages.Needs(model=model_fp, dtype=dtype, output_column=output_column, template=template, mode="token",
                        prompts=dict([prompt]))


def read_source(path: str | Path, flag: str = "--from_sweep", needs: stages.Needs | None = None) -> stages.StageInput:
    """A sweep, beam or GCG result to take responses from: whole by its .meta.json, and (given `needs`) ranked by
    this model for this prompt's text, else refused in one line (rmjax.runs.stages.read_input)."""
    return stages.read_input(path, SOURCE_KINDS[flag], flag, needs,
                             why="its best and worst are another run's (the patching map would take its clean and "
                                 "donor from them); inspect a result of this model and prompt")


def best_and_worst(path: str | Path, prompt_name: str, top: int, depth: int | None = None,
                   flag: str = "--from_sweep", needs: stages.Needs | None = None) -> list[tuple[int, ...]]:
    """The `top` best then the `top` worst sequences of a sweep CSV (by `prompt_name`) or a beam CSV (at `depth`,
    default its deepest: the optimal rows, then the pessimal ones, or the optimal ranking's tail without them);
    of a GCG result JSON of this one prompt and model, the first 2·`top` of its buffer, highest reward first. The
    file must be whole by its .meta.json (and made with what `needs` asks for: `read_source`)."""
    source = read_source(path, flag, needs)
    return _best_and_worst(source.path, prompt_name, top, depth, source.meta, flag)


def _best_and_worst(path: Path, prompt_name: str, top: int, depth: int | None, meta: dict | None = None,
                    flag: str = "--from_beam") -> list[tuple[int, ...]]:
    """The --top best and worst responses of an earlier result, refused when it holds fewer than 2 x --top distinct
    ones (the best and worst lists would overlap, or come up short, with exit 0)."""
    if depth is not None and not results.is_beam_csv(path):  # a GCG buffer or a sweep has one length: unread
        raise UsageError(f"--depth={depth} picks a level of a beam CSV; {path} is not one (its sequences have one "
                         "length); leave --depth out.")
    if str(path).endswith(".json"):  # a GCG result: its buffer, best first
        try:
            buffer = json.loads(Path(path).read_text())["buffer"]
        except (OSError, ValueError, KeyError, TypeError):
            raise UsageError(f"{path}: not a GCG result JSON (experiments.gcg writes one).") from None
        _one_target(path, meta, prompt_name, flag)
        kept = sorted(buffer[: 2 * top], key=lambda entry: -entry["reward"])  # a pessimal buffer: lowest first
        return _enough([tuple(entry["ids"]) for entry in kept], top, path, "its buffer")
    if results.is_beam_csv(path):
        df = results.read_beam_csv(path)
        level = df[df.depth == (depth or df.depth.max())]
        if level.empty:
            raise UsageError(f"{path} has no sequences of depth {depth} (depths {sorted(set(df.depth))}).")
        # by this prompt's own reward (a beam over several prompts ranks by their mean: its rank 1 was not this
        # prompt's best), the beam's rank breaking ties; the worst last
        keys = [prompt_name, "rank"] if prompt_name in level.columns else ["rank"]
        if prompt_name in level.columns:  # a NaN (--allow_nonfinite) sorted last: it was taken as the worst
            level = level[np.isfinite(level[prompt_name].to_numpy(np.float64))]
        best = level[level.direction == "optimal"].sort_values(keys, ascending=[False, True][-len(keys):],
                                                               kind="stable")
        worst = level[level.direction == "pessimal"].sort_values(keys, ascending=[False, False][-len(keys):],
                                                                 kind="stable")
        if not len(worst):  # one direction only: its best and its worst
            return _enough([tuple(ids) for ids in best.ids], top, path, f"depth {level.depth.iloc[0]}")
        if not len(best):  # pessimal only: ranked worst first, so its best is its last
            return _enough([tuple(ids) for ids in worst.ids], top, path, f"depth {level.depth.iloc[0]}")
        picks = [tuple(ids) for ids in [*best.ids[:top], *worst.ids[-top:]]]
        if min(len(best), len(worst)) < top:
            picks = []  # one direction keeps fewer than --top: refused, not inspected short
        return _enough(picks, top, path, f"depth {level.depth.iloc[0]} ({len(best)} optimal, {len(worst)} pessimal)")
    df = results.read_scores_csv(path)
    if prompt_name not in df.columns:
        raise UsageError(f"{path} has no column for prompt {prompt_name!r} (it has {results.value_columns(df)}).")
    df = df[np.isfinite(df[prompt_name].to_numpy(np.float64))]  # as the sweep's summary: a NaN is no worst token
    order = df.sort_values(prompt_name, ascending=False, kind="stable").token_id.tolist()
    return _enough([(int(t),) for t in order], top, path, f"its {len(order)} tokens")


def _one_target(path: Path, meta: dict | None, prompt_name: str, flag: str) -> None:
    """A GCG run over several prompts or models ranks its buffer by their mean reward, which it alone records:
    its first entries are not this prompt's best (as a several-prompt beam's rank 1 was not)."""
    identity = (meta or {}).get("identity") if isinstance((meta or {}).get("identity"), dict) else {}
    prompts, models = identity.get("prompts") or {}, identity.get("models") or []
    if len(prompts) > 1 or len(models) > 1:
        raise UsageError(f"{flag}={path}: that GCG run searched {len(prompts)} prompt(s) with {len(models)} model(s) "
                         f"and ranks its buffer by their mean reward, not by prompt {prompt_name!r}'s; inspect a GCG "
                         "run of this prompt and model alone, or give its texts with --responses.")


def _enough(ranked: list[tuple[int, ...]], top: int, path: Path, what: str) -> list[tuple[int, ...]]:
    """The first and last `top` of `ranked` (best first), or, when they would overlap or come up short, one line."""
    if len(ranked) < 2 * top or len(set(ranked)) < len(ranked):
        raise UsageError(f"--top={top} asks for the {top} best and {top} worst responses of {path}, but {what} "
                         f"{'hold' if what.startswith('its') else 'holds'} fewer distinct ones than {2 * top}; use a "
                         "smaller --top.")
    return ranked[:top] + ranked[len(ranked) - top:]


def inspect_identity(model_fp: dict, *, dtype: str, output_column: int, prompt: str, items: list[Item],
                     steps: int, baseline: str, tolerance: float = TOLERANCE,
                     max_evaluations: int = MAX_EVALUATIONS) -> dict:
    return {"job": "inspect", "model": model_fp, "dtype": dtype, "output_column": int(output_column),
            "prompt": prompt, "responses": [list(i.ids) for i in items], "steps": steps, "baseline": baseline,
            "ig_tolerance": tolerance, "ig_max_evaluations": max_evaluations} | (
                {} if dtype == "float32" else {"lens": "the last layer is the forward's reward"})  # bf16 read it off


def ig_warning(label: str, a) -> str | None:
    """The loud line for an attribution that does not add up (None when it does)."""
    if a.converged:
        return None
    advice = (f"try a larger --ig_max_evaluations (this run spent {a.evaluations}) or more --steps to start from"
              if a.tolerance > 0 else  # more evaluations need not meet it: floating-point sums round
              "--ig_tolerance=0 asks for an exact sum, which floating-point sums need not reach at any cap; give a "
              f"positive tolerance (the default is {100 * TOLERANCE:g}%)")
    return (f"WARNING: integrated gradients of {label!r} do not add up: their sum {a.integrated_gradients.sum():+.4f} "
            f"vs R(x) - R(baseline) = {a.reward - a.baseline_reward:+.4f}, a relative gap of "
            f"{percent(a.relative_gap)} (tolerance {100 * a.tolerance:g}%) after {a.evaluations} gradient "
            f"evaluations. Do not read its per-token IG as a decomposition of the reward; {advice}.")


@dataclasses.dataclass(frozen=True)
class InspectSpec:
    """An inspect job as one value: one prompt (name, text) and its responses, as text (`responses`) or the `top`
    best and worst of a finished sweep, beam (at `depth`) or GCG result (`source`); integrated gradients from
    `steps` path points refined to `tolerance` within `max_evaluations`. options.out is the folder."""

    options: RunOptions
    prompt: tuple[str, str]
    responses: tuple[str, ...] | None = None
    source: str | None = None
    top: int = 2
    depth: int | None = None
    steps: int = 64
    baseline: str = "pad"
    tolerance: float = TOLERANCE
    max_evaluations: int = MAX_EVALUATIONS
    batch_size: int = 16
    source_flag: str = "--from_sweep"  # the flag that gave `source`, for its messages and .meta.json


def check_settings(batch_size: int, tolerance: float, steps: int, max_evaluations: int) -> None:
    """The integrated gradients' settings, refused before anything loads by the job and from its flags alone (where
    a launch reads its line)."""
    check_batch_size(batch_size)  # what its plan refuses too
    if not math.isfinite(tolerance) or tolerance < 0:  # NaN refined to the cap, then failed to write
        raise UsageError(f"--ig_tolerance={tolerance}: give a finite number >= 0 (a relative gap).")
    first = first_points(steps)  # the path's first grid, all evaluated (an odd --steps rounds up a panel)
    if max_evaluations < first:  # it checked steps + 1: --steps=3 spent 5 of --ig_max_evaluations=4
        raise UsageError(f"--ig_max_evaluations={max_evaluations} is fewer than the --steps={steps} path's "
                         f"{first} points, which are all evaluated; give --ig_max_evaluations >= {first} or fewer "
                         "--steps.")


def run_inspect(spec: InspectSpec) -> dict:
    """The inspect job: the responses tokenized with the model's tokenizer and the identity computed without its
    weights → claim options.out once → unless a finished result of the same inputs is there, load, compute and
    write (`write_inspect`). Returns the summary (also in .meta.json)."""
    o, (name, text) = spec.options, spec.prompt
    check_settings(spec.batch_size, spec.tolerance, spec.steps, spec.max_evaluations)
    config, tokenizer = job_config_and_tokenizer(o)  # with its --system_prompt: the lengths the job will see
    require_reward_model(config, o.model, "inspect", o.output_column, o.column_chosen)
    # read (proven whole by its .meta.json, and ranked by this model for this prompt) before the model loads
    model_fp, sequences, source = job_fingerprint(o), None, None
    if spec.source:
        source = read_source(spec.source, spec.source_flag, source_needs(
            model_fp, dtype=o.dtype, output_column=o.output_column, template=o.template, prompt=spec.prompt))
        sequences = _best_and_worst(source.path, name, spec.top, spec.depth, source.meta, spec.source_flag)
    check_template(tokenizer, o.template)
    if spec.baseline == "pad":  # refused by the tokenizer, not after the weights load
        pad_baseline_id(tokenizer)
    context = config.max_position_embeddings
    items = (_text_items(tokenizer, context, text, list(spec.responses), o.template) if spec.responses is not None
             else _id_items(tokenizer, context, text, sequences or [], o.template))
    items = distinct_labels(_require_items(items))
    out = check_writable(o.out, "--out", folder=True)  # before the model loads, after the refusals of the input
    identity = inspect_identity(model_fp, dtype=o.dtype, output_column=o.output_column, prompt=text,
                                items=items, steps=spec.steps, baseline=spec.baseline, tolerance=spec.tolerance,
                                max_evaluations=spec.max_evaluations)
    with claim_job(o, identity, out=out / FILES[0], owned=[out / f for f in FILES[1:]],
                   inputs={spec.source_flag: spec.source} if spec.source else None) as job:
        if job.reuse:
            return json.loads(results.meta_path(out / FILES[0]).read_text())["summary"]
        return write_inspect(load_for_job(o), text, items, out, steps=spec.steps, baseline=spec.baseline,
                             batch_size=spec.batch_size, allow_nonfinite=o.allow_nonfinite, tolerance=spec.tolerance,
                             max_evaluations=spec.max_evaluations, job=job,
                             inputs=stages.recorded({spec.source_flag: source}))


def _require_items(items: list[Item]) -> list[Item]:
    """`items`, or a one-line error when the source gave no response to inspect."""
    if len(items) < 1:
        raise UsageError("no responses to inspect.")
    return items


def write_inspect(model: Model, prompt: str, items: list[Item], out: str | Path, *, steps: int = 64,
                  baseline: str = "pad", overwrite: bool = False, batch_size: int = 16,
                  allow_nonfinite: bool = False, tolerance: float = TOLERANCE,
                  max_evaluations: int = MAX_EVALUATIONS, job: jobs.Job | None = None,
                  inputs: dict | None = None) -> dict:
    """Compute everything for `items` with a loaded model and write it to folder `out`; the summary (also in
    .meta.json). `out` is claimed here unless `job` is its claim already (`run_inspect`). Integrated gradients
    start from `steps` + 1 path points and are refined until their relative completeness gap is within
    `tolerance` or `max_evaluations` gradient evaluations are spent (rmjax.inspect.attribution). `inputs`: the
    earlier results the responses came from, for .meta.json (rmjax.runs.stages.recorded)."""
    items = distinct_labels(_require_items(items))
    check_batch_size(batch_size)
    out = Path(out)
    identity = inspect_identity(model_fingerprint(model), dtype=model.dtype, output_column=model.output_column,
                                prompt=prompt, items=items, steps=steps, baseline=baseline, tolerance=tolerance,
                                max_evaluations=max_evaluations)
    with jobs.claimed(job, out / FILES[0], identity, allow_nonfinite=allow_nonfinite, overwrite=overwrite,
                      owned=[out / f for f in FILES[1:]]) as job:
        if job.reuse:
            return json.loads(results.meta_path(out / FILES[0]).read_text())["summary"]
        start = time.perf_counter()
        col = model.output_column
        lens = reward_lens(model, [list(i.ids) for i in items])
        curves = token_rewards(model, [list(i.ids) for i in items])
        progress = Progress(len(items), f"inspect: attribution (IG from {steps} steps to a gap of "
                            f"{100 * tolerance:g}%, at most {max_evaluations} gradients)", unit="responses")
        attributions = []
        for item in items:
            attributions.append(attribute(model, list(item.ids), steps=steps, baseline=baseline,
                                          batch_size=batch_size, tolerance=tolerance,
                                          max_evaluations=max_evaluations))
            progress.update(1)
        pair = (items[0], items[-1]) if len(items) > 1 and len(items[0].ids) == len(items[-1].ids) else None
        patched = patching_map(model, list(pair[0].ids), list(pair[1].ids), batch_size=2 * batch_size) \
            if pair else None
        nonfinite = _check_finite(model, items, lens, curves, attributions, patched, allow_nonfinite)
        summary = {
            "responses": [i.label for i in items], "reward": lens.reward[:, col].tolist(),
            "explained": lens.explained[:, col].tolist(),
            "ig_relative_gap": [a.relative_gap for a in attributions],
            "ig_evaluations": [a.evaluations for a in attributions],
            "ig_tolerance": tolerance,
            "ig_warnings": [w for i, a in zip(items, attributions, strict=True) if (w := ig_warning(i.label, a))],
            "patching": None if pair is None else {"clean": pair[0].label, "donor": pair[1].label},
            "patching_skipped": None if pair or len(items) < 2 else
            "the first and last responses differ in token length: patching needs one length",
            "nonfinite": nonfinite,
        }

        def write(path: Path) -> Path:
            tok = model.tokenizer
            _write_tables(out, items, lens, curves, attributions, patched, pair, col, tok)
            write_figures(out, items, lens, attributions, patched, pair, col, tok)
            return path

        job.finish(write, allow_nonfinite=allow_nonfinite, **jobs.model_meta(model), prompt=prompt, steps=steps,
                   baseline=baseline, ig_tolerance=tolerance, ig_max_evaluations=max_evaluations, inputs=inputs or {},
                   summary=summary, seconds=time.perf_counter() - start)
        return summary


def _check_finite(model: Model, items, lens, curves, attributions, patched, allow: bool) -> list[str] | None:
    """NaN/Inf anywhere stops the job before anything is written (rmjax.scoring.finite names where a forward turns NaN);
    with `allow`, the names of the affected outputs for .meta.json."""
    # a prompt-gated head has no score for a cut before its pattern: NaN there is "no value", not a fault
    curves = [c[gated_from(model, list(item.ids)):] for c, item in zip(curves, items, strict=True)]
    arrays = {"reward lens": lens.lens, "direct contributions": np.concatenate([lens.attention, lens.mlp]),
              "token rewards": np.concatenate([c.ravel() for c in curves]),
              "attribution": np.concatenate([np.r_[a.grad_x_input, a.integrated_gradients] for a in attributions])}
    if patched is not None:
        arrays["patching"] = np.concatenate([m.ravel() for m in patched.maps.values()])
    bad = [name for name, values in arrays.items() if not np.isfinite(values).all()]
    if bad and allow:
        return bad
    if bad:
        def whole(b: int) -> bool:  # the response's own values (it diagnosed the first response, finite or not)
            return all(np.isfinite(v).all() for v in (lens.lens[:, b], lens.attention[:, b], lens.mlp[:, b],
                                                      curves[b], attributions[b].grad_x_input,
                                                      attributions[b].integrated_gradients))
        first = next((b for b in range(len(items)) if not whole(b)), 0)
        where = finite.diagnose(model, list(items[first].ids))
        raise NonFiniteError(f"non-finite values in the {', '.join(bad)} of {[i.label for i in items]} (first: "
                             f"{items[first].label!r}){where}. "
                             f"Nothing was written: fix the model or the input, or {finite.ALLOW_HINT}.")
    return None


def _write_tables(out: Path, items, lens, curves, attributions, patched, pair, col: int, tok) -> None:
    layers = lens.attention.shape[0]
    rows = []
    for b, item in enumerate(items):
        rows += [(item.label, layer, "lens", lens.lens[layer, b, col]) for layer in range(layers + 1)]
        rows.append((item.label, 0, "embeddings", lens.embeddings[b, col]))
        for name, values in (("attention", lens.attention), ("mlp", lens.mlp)):
            rows += [(item.label, layer + 1, name, values[layer, b, col]) for layer in range(layers)]
    _table(out / "reward_lens.csv", ["response", "layer", "component"], ["reward"], rows)
    rows = [(item.label, p, t, tok.decode([t]), int(item.start <= p < item.end), curve[p, col])
            for item, curve in zip(items, curves, strict=True) for p, t in enumerate(item.ids)]
    _table(out / "token_rewards.csv", ["response", "position", "token_id", "token", "in_response"], ["reward"], rows,
           no_value=["reward"])  # NaN: a gated head's cut before its pattern (_check_finite checked the others)
    rows = [(item.label, p, t, tok.decode([t]), a.grad_x_input[p], a.integrated_gradients[p])
            for item, a in zip(items, attributions, strict=True) for p, t in enumerate(item.ids)]
    _table(out / "attribution.csv", ["response", "position", "token_id", "token"],
           ["grad_x_input", "integrated_gradients"], rows)
    # one numbering in every output (and figure): block k is layer k, from 1; the residual's layer 0 is the
    # embeddings, its layer k the stream after block k (the attention and MLP maps' row i is block i + 1)
    rows = [] if patched is None else [
        (pair[0].label, pair[1].label, name, layer + (name != "residual"), p, values[layer, p])
        for name, values in patched.maps.items() for layer in range(values.shape[0]) for p in range(values.shape[1])]
    _table(out / "patching.csv", ["clean", "donor", "component", "layer", "position"], ["reward"], rows)


def _table(path: Path, keys: list[str], values: list[str], rows: list[tuple], no_value: Sequence[str] = ()) -> None:
    k = len(keys)
    results.write_table(path, {name: [r[i] for r in rows] for i, name in enumerate(keys)},
                        {name: np.asarray([r[k + j] for r in rows], np.float64) for j, name in enumerate(values)},
                        no_value=no_value)


