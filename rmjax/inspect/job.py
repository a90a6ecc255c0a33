"""The inspect job: for one prompt and a few responses (given as text, or a sweep's / beam's best and worst), the
reward lens and direct contributions, per-token reward curves, attribution and activation patching, written as
CSVs, a .meta.json and PNG figures in one folder (load → compute → write, as every job)."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import numpy as np

from rmjax.errors import NonFiniteError, UsageError
from rmjax.inspect.attribution import MAX_EVALUATIONS, TOLERANCE, attribute
from rmjax.inspect.lens import reward_lens, token_rewards
from rmjax.inspect.patching import COMPONENTS, patching_map
from rmjax.loading.identity import model_fingerprint
from rmjax.model import Model
from rmjax.runs import jobs, results
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


def items_from_texts(model: Model, prompt: str, responses: list[str], template: str = "auto") -> list[Item]:
    """Responses as text: placed in the template and tokenized, as a real conversation is."""
    conv = Conversations(model.tokenizer, prompt, template, max_positions=model.config.max_position_embeddings)
    start = len(conv.prefix)
    return [Item(r, tuple(ids), start) for r, ids in zip(responses, conv.token_ids(responses), strict=True)]


def items_from_ids(model: Model, prompt: str, sequences: list[tuple[int, ...]], template: str = "auto") -> list[Item]:
    """Responses as token ids (a sweep's or beam's token-mode sequences): prefix + ids + suffix exactly."""
    split = chat.split_chat(model.tokenizer, prompt, template, model.config.max_position_embeddings)
    texts = [model.tokenizer.decode(list(s)) for s in sequences]
    # several sequences may decode alike (every lone byte token decodes to U+FFFD): their ids tell them apart
    return [Item(t if texts.count(t) == 1 else f"{t} [ids {' '.join(map(str, s))}]", tuple(split.ids_with(list(s))),
                 len(split.prefix)) for t, s in zip(texts, sequences, strict=True)]


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


def best_and_worst(path: str | Path, prompt_name: str, top: int, depth: int | None = None) -> list[tuple[int, ...]]:
    """The `top` best then the `top` worst sequences of a sweep CSV (by `prompt_name`) or a beam CSV (at `depth`,
    default its deepest: the optimal rows, then the pessimal ones, or the optimal ranking's tail without them);
    of a GCG result JSON, the first 2·`top` of its buffer. The file must be whole by its .meta.json."""
    results.checked_input(path, ("sweep", "beam", "gcg"), "--from_sweep")
    if str(path).endswith(".json"):  # a GCG result: its buffer, best first
        try:
            buffer = json.loads(Path(path).read_text())["buffer"]
        except (OSError, ValueError, KeyError, TypeError):
            raise UsageError(f"{path}: not a GCG result JSON (experiments.gcg writes one).") from None
        return [tuple(entry["ids"]) for entry in buffer[: 2 * top]]
    if results.is_beam_csv(path):
        df = results.read_beam_csv(path)
        level = df[df.depth == (depth or df.depth.max())]
        if level.empty:
            raise UsageError(f"{path} has no sequences of depth {depth} (depths {sorted(set(df.depth))}).")
        best = level[level.direction == "optimal"].sort_values("rank")
        worst = level[level.direction == "pessimal"].sort_values("rank", ascending=False)
        worst = worst if len(worst) else best
        return [tuple(ids) for ids in [*best.ids[:top], *worst.ids[-top:]]]
    df = results.read_scores_csv(path)
    if prompt_name not in df.columns:
        raise UsageError(f"{path} has no column for prompt {prompt_name!r} (it has {results.value_columns(df)}).")
    order = df.sort_values(prompt_name, ascending=False, kind="stable").token_id.tolist()
    return [(int(t),) for t in order[:top] + order[::-1][:top][::-1]]


def inspect_identity(model_fp: dict, *, dtype: str, output_column: int, prompt: str, items: list[Item],
                     steps: int, baseline: str, tolerance: float = TOLERANCE,
                     max_evaluations: int = MAX_EVALUATIONS) -> dict:
    return {"job": "inspect", "model": model_fp, "dtype": dtype, "output_column": int(output_column),
            "prompt": prompt, "responses": [list(i.ids) for i in items], "steps": steps, "baseline": baseline,
            "ig_tolerance": tolerance, "ig_max_evaluations": max_evaluations}


def percent(x: float) -> str:
    """A ratio as a percentage: 1008.5%, 5.0%, 0.79%, 0.014%."""
    v = 100 * x
    return f"{v:.1f}%" if abs(v) >= 1 or v == 0 else f"{v:.2g}%"


def ig_warning(label: str, a) -> str | None:
    """The loud line for an attribution that does not add up (None when it does)."""
    if a.converged:
        return None
    return (f"WARNING: integrated gradients of {label!r} do not add up: their sum {a.integrated_gradients.sum():+.4f} "
            f"vs R(x) - R(baseline) = {a.reward - a.baseline_reward:+.4f}, a relative gap of "
            f"{percent(a.relative_gap)} (tolerance {100 * a.tolerance:g}%) after {a.evaluations} gradient "
            f"evaluations. Do not read its per-token IG as a decomposition of the reward; try a larger "
            f"--ig_max_evaluations (this run spent {a.evaluations}) or more --steps to start from.")


def run_inspect(model: Model, prompt: str, items: list[Item], out: str | Path, *, steps: int = 64,
                baseline: str = "pad", overwrite: bool = False, batch_size: int = 16,
                allow_nonfinite: bool = False, tolerance: float = TOLERANCE,
                max_evaluations: int = MAX_EVALUATIONS) -> dict:
    """Compute everything for `items` and write it to folder `out`; the summary (also in .meta.json).
    Integrated gradients start from `steps` + 1 path points and are refined until their relative completeness
    gap is within `tolerance` or `max_evaluations` gradient evaluations are spent (rmjax.inspect.attribution)."""
    if len(items) < 1:
        raise UsageError("no responses to inspect.")
    items = distinct_labels(items)
    out = Path(out)
    identity = inspect_identity(model_fingerprint(model), dtype=model.dtype, output_column=model.output_column,
                                prompt=prompt, items=items, steps=steps, baseline=baseline, tolerance=tolerance,
                                max_evaluations=max_evaluations)
    with jobs.job(out / FILES[0], identity, "inspect", overwrite=overwrite, owned=[out / f for f in FILES[1:]]) as job:
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
            _figures(out, items, lens, attributions, patched, pair, col, tok)
            return path

        job.finish(write, **jobs.model_meta(model), prompt=prompt, steps=steps, baseline=baseline,
                   ig_tolerance=tolerance, ig_max_evaluations=max_evaluations, summary=summary,
                   seconds=time.perf_counter() - start)
        return summary


def _check_finite(model: Model, items, lens, curves, attributions, patched, allow: bool) -> list[str] | None:
    """NaN/Inf anywhere stops the job before anything is written (rmjax.scoring.finite names where a forward turns NaN);
    with `allow`, the names of the affected outputs for .meta.json."""
    arrays = {"reward lens": lens.lens, "direct contributions": np.concatenate([lens.attention, lens.mlp]),
              "token rewards": np.concatenate([c.ravel() for c in curves]),
              "attribution": np.concatenate([np.r_[a.grad_x_input, a.integrated_gradients] for a in attributions])}
    if patched is not None:
        arrays["patching"] = np.concatenate([m.ravel() for m in patched.maps.values()])
    bad = [name for name, values in arrays.items() if not np.isfinite(values).all()]
    if bad and allow:
        return bad
    if bad:
        where = finite.diagnose(model, list(items[0].ids))
        raise NonFiniteError(f"non-finite values in the {', '.join(bad)} of {[i.label for i in items]}{where}. "
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
    rows = [(item.label, p, t, tok.decode([t]), int(p >= item.start), curve[p, col])
            for item, curve in zip(items, curves, strict=True) for p, t in enumerate(item.ids)]
    _table(out / "token_rewards.csv", ["response", "position", "token_id", "token", "in_response"], ["reward"], rows)
    rows = [(item.label, p, t, tok.decode([t]), a.grad_x_input[p], a.integrated_gradients[p])
            for item, a in zip(items, attributions, strict=True) for p, t in enumerate(item.ids)]
    _table(out / "attribution.csv", ["response", "position", "token_id", "token"],
           ["grad_x_input", "integrated_gradients"], rows)
    rows = [] if patched is None else [
        (pair[0].label, pair[1].label, name, layer, p, values[layer, p])
        for name, values in patched.maps.items() for layer in range(values.shape[0]) for p in range(values.shape[1])]
    _table(out / "patching.csv", ["clean", "donor", "component", "layer", "position"], ["reward"], rows)


def _table(path: Path, keys: list[str], values: list[str], rows: list[tuple]) -> None:
    k = len(keys)
    results.write_table(path, {name: [r[i] for r in rows] for i, name in enumerate(keys)},
                        {name: np.asarray([r[k + j] for r in rows], np.float64) for j, name in enumerate(values)})


def _figures(out: Path, items, lens, attributions, patched, pair, col: int, tok) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401  (matplotlib.ticker.MaxNLocator)
    from matplotlib import font_manager, ft2font

    # Characters the figure font has no glyph for (CJK, Bengali, ... with only DejaVu installed) are written as
    # escapes (\u539f), not drawn as empty boxes.
    glyphs = ft2font.FT2Font(font_manager.findfont(font_manager.FontProperties())).get_charmap()

    def label(text: str, cut: int | None = 30) -> str:
        shown = "".join(c if ord(c) in glyphs else ascii(c)[1:-1] for c in repr(text)[1:-1][:cut])
        return shown.replace("$", r"\$")

    def token(t: int) -> str:
        return label(tok.decode([t]), None)

    fig, ax = plt.subplots(figsize=(7, 4))
    for b, item in enumerate(items):
        ax.plot(np.arange(lens.lens.shape[0]), lens.lens[:, b, col], marker=".", label=label(item.label))
    ax.set(xlabel="layer (0: embeddings)", ylabel="reward read from the residual stream", title="Reward lens")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.legend(fontsize=7)
    fig.savefig(out / "lens.png", dpi=120, bbox_inches="tight")
    plt.close(fig)

    # Attribution: one strip per response, every token labelled in full (rotated; the figure grows with the
    # conversation), its own colour scale and colorbar. A strip whose IG do not add up says so in red.
    longest = max(len(item.ids) for item in items)
    tick = max(max(len(token(t)) for t in item.ids) for item in items)
    row = 0.8 + 0.075 * min(tick, 40)  # strip + its rotated labels, inches
    fig, axes = plt.subplots(len(items), 1, figsize=(max(8.0, 0.2 * longest + 2.5), row * len(items) + 0.8),
                             squeeze=False, layout="constrained")
    failed = []
    for ax, item, a in zip(axes[:, 0], items, attributions, strict=True):
        scale = np.abs(a.integrated_gradients).max()
        scale = scale if np.isfinite(scale) and scale > 0 else 1.0
        im = ax.imshow(a.integrated_gradients[None], cmap="RdBu", vmin=-scale, vmax=scale, aspect="auto")
        ax.set_yticks([])
        ax.set_xticks(range(len(item.ids)), [token(t) for t in item.ids], fontsize=7, rotation=90)
        ax.axvline(item.start - 0.5, color="k", lw=0.8)  # the response starts here
        fig.colorbar(im, ax=ax, pad=0.01, fraction=0.03, label="IG")
        text = (f"{label(item.label)}: IG sum {a.integrated_gradients.sum():+.3f}, R(x) − R(baseline) "
                f"{a.reward - a.baseline_reward:+.3f}, gap {percent(a.relative_gap)} ({a.evaluations} gradients)")
        if a.converged:
            ax.set_title(text, fontsize=8, loc="left")
        else:
            failed.append(item.label)
            ax.set_title(f"DOES NOT ADD UP (tolerance {100 * a.tolerance:g}%): {text}", fontsize=8, loc="left",
                         color="red", fontweight="bold")
    if failed:
        fig.suptitle("Integrated gradients per token: NOT COMPLETE for " + ", ".join(label(f) for f in failed)
                     + " (their sums miss the reward difference; do not read them as its decomposition)",
                     color="red", fontweight="bold")
    else:
        fig.suptitle("Integrated gradients per token (red: lowers, blue: raises the reward; the line: the response "
                     "starts)")
    fig.savefig(out / "attribution.png", dpi=120, bbox_inches="tight")
    plt.close(fig)

    # Patching: only the positions from the first one where clean and donor differ (before it both runs are the
    # same and every patch gives the clean reward), labelled with their tokens (clean/donor where they differ).
    if patched is None:
        fig, ax = plt.subplots(figsize=(6, 1.5))
        ax.set_axis_off()
        ax.set_title("no patching (needs two responses of one token length)")
        fig.savefig(out / "patching.png", dpi=120, bbox_inches="tight")
        plt.close(fig)
        return
    clean, donor = pair[0].ids, pair[1].ids
    differ = np.flatnonzero(np.asarray(clean) != np.asarray(donor))
    first = int(differ[0]) if len(differ) else 0
    shown = range(first, len(clean))
    names = [f"{p} {token(c)}" if c == d else f"{p} {token(c)}\n/ {token(d)}"
             for p, c, d in zip(shown, clean[first:], donor[first:], strict=True)]
    lo = min(float(np.nanmin(v[:, first:])) for v in patched.maps.values())
    hi = max(float(np.nanmax(v[:, first:])) for v in patched.maps.values())
    panel = max(2.5, 0.3 * len(names) + 1.0)
    chars = max(len(line) for name in names for line in name.split("\n"))
    height = 4.5 + 0.075 * min(chars, 60)  # the maps + their rotated labels, inches
    fig, axes = plt.subplots(1, len(COMPONENTS), figsize=(panel * len(COMPONENTS) + 1.2, height), squeeze=False,
                             layout="constrained")
    for ax, name in zip(axes[0], COMPONENTS, strict=True):
        values = patched.maps[name][:, first:]
        bottom = 0 if name == "residual" else 1  # residual row 0: the embeddings; attention/mlp rows: layers 1..L
        im = ax.imshow(values, cmap="viridis", aspect="auto", origin="lower", vmin=lo, vmax=hi,
                       extent=(-0.5, len(names) - 0.5, bottom - 0.5, bottom + values.shape[0] - 0.5))
        ax.set_xticks(range(len(names)), names, fontsize=7, rotation=90)
        ax.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.set(title=name, xlabel="position and token", ylabel="layer (residual 0: embeddings)" if not bottom
               else "layer")
    fig.colorbar(im, ax=axes[0].tolist(), label="reward", pad=0.01)
    where = "" if not first else f",\npositions {first}–{len(clean) - 1}" if len(names) > 1 else \
        f",\nposition {first}"
    fig.suptitle(f"reward of {label(pair[0].label)!s} ({patched.clean_reward:+.3f}) with "
                 f"{label(pair[1].label)!s} ({patched.donor_reward:+.3f}) patched in{where}"
                 + (f" (before {first} both runs are the same)" if first else ""))
    fig.savefig(out / "patching.png", dpi=120, bbox_inches="tight")
    plt.close(fig)
