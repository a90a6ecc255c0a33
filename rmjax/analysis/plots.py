"""Figures (matplotlib, Agg backend, PNG). Each function draws one figure from tables the analysis
modules computed and returns the path it wrote."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from rmjax.runs.atomic import save_figure  # noqa: E402
from rmjax.text.visible import figure_text, wrap  # noqa: E402

PALETTE = plt.get_cmap("tab10")
MEDIAN = {"color": "black", "linewidth": 2}  # a median line: black on any box or violin colour


def name_label(name: str, width: int = 44) -> str:
    """A model or prompt name as a (rotated) tick label: one line of at most `width` characters, cut in the middle
    (…) so that names alike up to a suffix (…-8B-v0.2, …-27B-v0.2) stay apart; the full name is in the CSV."""
    name = str(name)
    head = (width - 1) // 2
    return name if len(name) <= width else name[:head] + "…" + name[len(name) - (width - 1 - head):]


def _inches(labels, fontsize: float = 10) -> float:
    """The length of the longest of `labels` on a figure, in inches (DejaVu Sans: about 0.6 em a character)."""
    return max((len(line) for label in labels for line in str(label).split("\n")), default=0) * 0.6 * fontsize / 72


def _save(fig: plt.Figure, path: str | Path) -> Path:
    """The figure with every text on it: a tight bounding box (a title, colorbar label or rotated long label
    that reaches past the canvas grows the image rather than being cut)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # glyphs missing from the default font (CJK tokens, emoji)
        fig.tight_layout()
        save_figure(fig, path, dpi=120, bbox_inches="tight", pad_inches=0.1)
    plt.close(fig)
    return path


def quantile_sketch(values: np.ndarray, size: int = 2000) -> np.ndarray:
    """`size` evenly spaced quantiles (min and max included): the same distribution, cheap to smooth."""
    values = np.asarray(values, np.float64)
    return values if len(values) <= size else np.quantile(values, np.linspace(0.0, 1.0, size))


def violin(distributions: dict[str, np.ndarray], title: str, path: str | Path) -> Path:
    """Violins of each model's score distribution (the density of a 2000-quantile sketch of it)."""
    labels = [name_label(m) for m in distributions]
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(distributions) + 2), 3.5 + 0.7 * _inches(labels)))
    data = [quantile_sketch(v) for v in distributions.values()]
    parts = ax.violinplot(data, showmedians=True, showextrema=True)
    for i, body in enumerate(parts["bodies"]):
        body.set_facecolor(PALETTE(i % 10))
        body.set_alpha(0.6)
    parts["cmedians"].set(color=MEDIAN["color"], linewidth=MEDIAN["linewidth"])
    for name in ("cbars", "cmins", "cmaxes"):
        parts[name].set_color("0.4")
    ax.set_xticks(range(1, len(data) + 1), labels, rotation=45, ha="right")
    ax.set_ylabel("score")
    ax.set_title(wrap(title, fig.get_figwidth()))
    ax.legend(handles=[Line2D([], [], **MEDIAN, label="median"), Line2D([], [], color="0.4", label="min to max")],
              fontsize=7, bbox_to_anchor=(1.01, 1), loc="upper left")
    return _save(fig, path)


def heatmap(matrix: pd.DataFrame, title: str, path: str | Path, vmin: float | None = None,
            vmax: float | None = None, cmap: str = "viridis", fmt: str = "{:.2f}") -> Path:
    rows, cols = matrix.shape
    xlabels, ylabels = [name_label(c) for c in matrix.columns], [wrap(i, 4.0, 10) for i in matrix.index]
    fig, ax = plt.subplots(figsize=(max(4.5, 0.7 * cols + 2.5 + _inches(ylabels)),
                                    max(4, 0.6 * rows + 2 + 0.7 * _inches(xlabels))))
    values = matrix.to_numpy(np.float64)
    image = ax.imshow(values, vmin=vmin, vmax=vmax, cmap=cmap, aspect="auto")
    ax.set_xticks(range(cols), xlabels, rotation=45, ha="right")
    ax.set_yticks(range(rows), ylabels)
    if max(rows, cols) <= 16:
        middle = np.nanmean(values)
        for i in range(values.shape[0]):
            for j in range(values.shape[1]):
                if not np.isfinite(values[i, j]):  # e.g. a --scores model without a column for this prompt
                    continue
                ax.text(j, i, fmt.format(values[i, j]), ha="center", va="center", fontsize=7,
                        color="white" if values[i, j] < middle else "black")
    fig.colorbar(image, ax=ax, shrink=0.8)
    ax.set_title(wrap(title, fig.get_figwidth()))
    return _save(fig, path)


def mds_scatter(coords: pd.DataFrame, groups: dict[str, str] | None, title: str, path: str | Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 5))
    names = sorted(set((groups or {}).values()))
    for model, (x, y) in coords[["x", "y"]].iterrows():
        group = (groups or {}).get(model)
        color = PALETTE(names.index(group) % 10) if group in names else "tab:gray"
        ax.scatter(x, y, color=color, s=40)
        ax.annotate(str(model), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    for i, name in enumerate(names):
        ax.scatter([], [], color=PALETTE(i % 10), label=name)
    if names:
        ax.legend(title="base model", fontsize=8)
    ax.set_xlabel("MDS 1")
    ax.set_ylabel("MDS 2")
    ax.set_title(wrap(title, fig.get_figwidth()))
    return _save(fig, path)


def matrix_panels(matrices: dict[str, pd.DataFrame], title: str, path: str | Path) -> Path:
    """Several model x model matrices side by side (the RSA theoretical matrices)."""
    fig, axes = plt.subplots(1, len(matrices), figsize=(4.2 * len(matrices), 4.4), squeeze=False)
    for ax, (name, matrix) in zip(axes[0], matrices.items(), strict=True):
        ax.imshow(matrix.to_numpy(np.float64), vmin=0, vmax=1, cmap="magma")
        labels = [name_label(c) for c in matrix.columns]
        ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=6)
        ax.set_yticks(range(len(labels)), labels, fontsize=6)
        ax.set_title(name.replace("_", " "), fontsize=9)
    fig.suptitle(wrap(title, fig.get_figwidth()))
    return _save(fig, path)


PANEL = 3.6  # inches: the width of one panel of a _grid


def _grid(n: int) -> tuple[plt.Figure, np.ndarray]:
    cols = min(n, 4)
    rows = int(np.ceil(n / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(PANEL * cols, 3.3 * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.axis("off")
    return fig, axes.flat


def framing_scatter(pairs: dict[str, tuple[np.ndarray, np.ndarray]], best: str, worst: str,
                    path: str | Path) -> Path:
    fig, axes = _grid(len(pairs))
    for ax, (model, (b, w)) in zip(axes, pairs.items(), strict=False):
        ax.scatter(b, w, s=2, alpha=0.3, rasterized=True)
        ax.set_title(wrap(model, PANEL, 9), fontsize=9)
        ax.set_xlabel(wrap(f"{best} score", PANEL, 8), fontsize=8)
        ax.set_ylabel(wrap(f"{worst} score", PANEL, 8), fontsize=8)
    fig.suptitle(wrap(f"Framing: {best} vs {worst}", fig.get_figwidth()))
    return _save(fig, path)


def sentiment_scatter(points: dict[str, pd.DataFrame], title: str, path: str | Path) -> Path:
    """Score against AFINN-111 value per model (jittered), with the positive and negative fits."""
    fig, axes = _grid(len(points))
    rng = np.random.default_rng(0)
    for ax, (model, frame) in zip(axes, points.items(), strict=False):
        ax.scatter(frame["sentiment"] + rng.uniform(-0.15, 0.15, len(frame)), frame["score"], s=5, alpha=0.4,
                   rasterized=True)
        for valence, part in (("positive", frame[frame.sentiment > 0]), ("negative", frame[frame.sentiment < 0])):
            if len(part) > 2 and part.sentiment.nunique() > 1:
                slope, intercept = np.polyfit(part.sentiment, part.score, 1)
                xs = np.array([part.sentiment.min(), part.sentiment.max()])
                ax.plot(xs, intercept + slope * xs, lw=2, label=f"{valence}: {slope:.3f}")
        ax.set_xlabel("AFINN-111 sentiment", fontsize=8)
        ax.set_ylabel("score", fontsize=8)
        ax.set_title(wrap(model, PANEL, 9), fontsize=9)
        if ax.get_legend_handles_labels()[0]:  # no fit (too few points of one valence): no legend to draw
            ax.legend(fontsize=7)
    fig.suptitle(wrap(title, fig.get_figwidth(), 10), fontsize=10)
    return _save(fig, path)


def slope_plot(slopes: pd.DataFrame, group_columns: Sequence[str], slope: str, se: str, title: str,
               ylabel: str, path: str | Path) -> Path:
    """One dot per model in each group (± its standard error), with the mean over models ± its standard error
    (black diamond, named in the legend)."""
    groups = list(slopes.groupby(list(group_columns), sort=False))
    models = list(dict.fromkeys(slopes["model"]))
    fig, ax = plt.subplots(figsize=(max(5, 1.3 * len(groups) + 3), 4.5))
    for x, (_, part) in enumerate(groups):
        offsets = np.linspace(-0.25, 0.25, len(models)) if len(models) > 1 else np.zeros(1)
        for i, model in enumerate(models):
            row = part[part.model == model]
            if len(row):
                ax.errorbar(x + offsets[i], row[slope].iloc[0], yerr=row[se].iloc[0], fmt="o", ms=4,
                            color=PALETTE(i % 10), alpha=0.8, label=model if x == 0 else None)
        values = part[slope].dropna().to_numpy()
        if len(values):
            sem = values.std(ddof=1) / np.sqrt(len(values)) if len(values) > 1 else 0.0
            ax.errorbar(x + 0.4, values.mean(), yerr=sem, fmt="D", color="black", ms=7,
                        label="mean over models ± SE" if x == 0 else None)
    ax.axhline(0, color="gray", lw=0.8)
    labels = [" / ".join(name_label(k, 32) for k in (key if isinstance(key, tuple) else (key,))) for key, _ in groups]
    ax.set_xticks(range(len(groups)), labels, rotation=30, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(wrap(title, fig.get_figwidth()))
    ax.legend(fontsize=7, bbox_to_anchor=(1.02, 1), loc="upper left")
    return _save(fig, path)


def rank_trajectories(ranks: pd.DataFrame, columns: Sequence[str], column_labels: Sequence[str],
                      items: Sequence[tuple[str, str]], title: str, path: str | Path) -> Path:
    """Rank of selected items under humans and each model (log scale, rank 1 at the top)."""
    fig, ax = plt.subplots(figsize=(max(8, 0.9 * len(columns) + 4), 6))
    colormaps = {"human_top": plt.get_cmap("Blues"), "human_bottom": plt.get_cmap("Reds"),
                 "model_first": plt.get_cmap("Greens")}
    counts = {g: sum(1 for _, gg in items if gg == g) for g in colormaps}
    seen = dict.fromkeys(colormaps, 0)
    by_name = ranks.set_index("name")
    for name, group in items:
        seen[group] += 1
        color = colormaps[group](0.45 + 0.5 * seen[group] / max(counts[group], 1))
        values = [by_name.loc[name, c] for c in columns]
        ax.plot(range(len(columns)), values, marker="o", color=color,
                label=f"{figure_text(name, 30)} (#{by_name.loc[name, 'human_rank']:.0f})")
    ax.set_yscale("log")
    ax.invert_yaxis()
    labels = ["\n".join(map(name_label, str(c).split("\n"))) for c in column_labels]  # model \n (its rho)
    ax.set_xticks(range(len(columns)), labels, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("rank (1 = best, log scale)")
    ax.set_title(wrap(title, fig.get_figwidth(), 10), fontsize=10)
    ax.legend(fontsize=7, bbox_to_anchor=(1.02, 1), loc="upper left")
    return _save(fig, path)


def diverging_bars(table: pd.DataFrame, label: str, value: str, title: str, path: str | Path) -> Path:
    """Horizontal bars, positive green and negative purple (items humans rank higher / lower)."""
    ordered = table.sort_values(value)
    fig, ax = plt.subplots(figsize=(7, max(4, 0.22 * len(ordered) + 1)))
    colors = ["tab:green" if v > 0 else "tab:purple" for v in ordered[value]]
    ax.barh(range(len(ordered)), ordered[value], color=colors)
    ax.set_yticks(range(len(ordered)), [figure_text(str(s), 32) for s in ordered[label]], fontsize=7)
    ax.axvline(0, color="black", lw=0.8)
    ax.set_xlabel(value.replace("_", " "))
    ax.set_title(wrap(title, fig.get_figwidth(), 10), fontsize=10)
    return _save(fig, path)


def bigtwo_boxes(points: dict[str, pd.DataFrame], title: str, path: str | Path) -> Path:
    """Agency vs communion score percentiles (1 = top of the table) per model; medians black (an orange median on
    the orange agency box could not be seen), named in the legend."""
    labels = [name_label(m) for m in points]
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(points) + 2), 3.5 + 0.7 * _inches(labels)))
    for i, frame in enumerate(points.values()):
        for offset, category, color in ((-0.18, "agency", "tab:orange"), (0.18, "communion", "tab:blue")):
            values = frame.loc[frame.category == category, "percentile"].to_numpy()
            if len(values):
                box = ax.boxplot(values, positions=[i + offset], widths=0.3, patch_artist=True, showfliers=False,
                                 medianprops=MEDIAN)
                box["boxes"][0].set_facecolor(color)
    ax.scatter([], [], color="tab:orange", marker="s", label="agency")
    ax.scatter([], [], color="tab:blue", marker="s", label="communion")
    ax.plot([], [], **MEDIAN, label="median")
    ax.set_xticks(range(len(points)), labels, rotation=45, ha="right")
    ax.set_ylabel("score percentile in the model's table\n(1 = top)")
    ax.set_title(wrap(title, fig.get_figwidth()))
    ax.legend(fontsize=8, bbox_to_anchor=(1.02, 1), loc="upper left")
    return _save(fig, path)


def checkpoint_lines(frame: pd.DataFrame, path: str | Path) -> Path:
    """Median agency and communion rank per training step, one panel per prompt."""
    prompts = list(dict.fromkeys(frame["prompt"]))
    fig, axes = _grid(len(prompts))
    for ax, prompt in zip(axes, prompts, strict=False):
        part = frame[frame.prompt == prompt]
        ax.plot(part.step, part.median_rank_agency, marker="o", color="tab:orange", label="agency")
        ax.plot(part.step, part.median_rank_communion, marker="o", color="tab:blue", label="communion")
        ax.invert_yaxis()
        ax.set_xlabel("training step")
        ax.set_ylabel("median rank (1 = best)")
        ax.set_title(wrap(prompt, PANEL, 9), fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle("Big Two ranks across checkpoints")
    return _save(fig, path)


def top_bottom_bars(table: pd.DataFrame, label: str, value: str, title: str, path: str | Path) -> Path:
    """Top (positive) and bottom rows of a top/bottom table as one bar chart."""
    ordered = pd.concat([table[table.side == "top"], table[table.side == "bottom"].iloc[::-1]])
    fig, ax = plt.subplots(figsize=(7, max(4, 0.22 * len(ordered) + 1)))
    ax.barh(range(len(ordered)), ordered[value], color=["tab:green" if s == "top" else "tab:red"
                                                         for s in ordered.side])
    ax.set_yticks(range(len(ordered)), [figure_text(str(s), 24) for s in ordered[label]], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(value)
    ax.set_title(wrap(title, fig.get_figwidth(), 10), fontsize=10)
    return _save(fig, path)


def frontier_scatter(rows: list[dict], fronts: dict[tuple[str, str], list[dict]], path: str | Path,
                     samples: list[dict] | None = None) -> Path:
    """Reward against judge perplexity (log scale), one panel per direction: the search's rows coloured by λ,
    best-of-N's in grey, each method's Pareto front (`fronts`: best-of-N's over its samples); with `samples`
    (every best-of-N sample, light grey), the summary's best-of-N numbers too: its most rewarding sample and its
    median judge perplexity."""
    directions = list(dict.fromkeys(r["direction"] for r in rows))
    fig, axes = plt.subplots(1, len(directions), figsize=(6.5 * len(directions), 5), squeeze=False)
    lambdas = sorted({r["lambda"] for r in rows})
    for ax, direction in zip(axes[0], directions, strict=True):
        mine = [r for r in rows if r["direction"] == direction]
        base = [r for r in mine if r["method"] == "best_of_n"]
        drawn = [r for r in samples or () if r["direction"] == direction]
        if drawn:  # every sample: best-of-N's front runs through them, not only through its written rows
            ax.scatter([r["judge_ppl"] for r in drawn], [r["reward"] for r in drawn], s=5, c="0.85",
                       label=f"best-of-N samples ({len(drawn)})", rasterized=True)
        ax.scatter([r["judge_ppl"] for r in base], [r["reward"] for r in base], s=14, c="0.6",
                   label="best-of-N, written rows")
        for k, lam in enumerate(lambdas):
            found = [r for r in mine if r["method"] == "search" and r["lambda"] == lam]
            ax.scatter([r["judge_ppl"] for r in found], [r["reward"] for r in found], s=18, color=PALETTE(k),
                       label=f"search, λ={lam:g}")
        for method, style in (("search", "k-"), ("best_of_n", "k:")):
            front = sorted(fronts.get((direction, method), []), key=lambda r: r["judge_ppl"])
            ax.plot([r["judge_ppl"] for r in front], [r["reward"] for r in front], style, lw=1,
                    label=f"Pareto front, {method.replace('_', '-')}")
        if drawn:
            best = drawn[0]  # sample_rows: the most rewarding (by direction) first
            ax.scatter([best["judge_ppl"]], [best["reward"]], s=90, marker="*", c="k", zorder=5,
                       label=f"best-of-N best of {len(drawn)} samples")
            ax.axvline(float(np.median([r["judge_ppl"] for r in drawn])), color="0.4", ls="--", lw=0.8,
                       label="best-of-N median judge perplexity")
        ax.set_xscale("log")
        ax.set_xlabel("judge perplexity (lower: more fluent)")
        ax.set_ylabel("reward")
        ax.set_title(f"{direction}: {'higher' if direction == 'optimal' else 'lower'} reward is the goal")
        ax.legend(fontsize=7)
    return _save(fig, path)


def disagreement_scatter(rows: list[dict], maps: dict[str, pd.DataFrame], path: str | Path, cap: float) -> Path:
    """z_A against z_B, one panel per prompt: the vocabulary map's single tokens in grey (when computed), the
    written rows by method (colour) and direction (marker), the line z_A = z_B, and each method's most
    disagreeing row at judge perplexity ≤ cap per direction starred, its most disagreeing complete answer there
    (ends_turn) circled by a diamond: the two comparisons the summary prints (a star is often a fragment)."""
    prompts = list(dict.fromkeys(r["prompt"] for r in rows))
    fig, axes = plt.subplots(1, len(prompts), figsize=(6 * len(prompts), 5.5), squeeze=False)
    markers, colours = {"a_over_b": "^", "b_over_a": "v"}, {"search": PALETTE(0), "best_of_n": PALETTE(1)}
    for ax, prompt in zip(axes[0], prompts, strict=True):
        if prompt in maps:
            m = maps[prompt]
            ax.scatter(m["z_b"], m["z_a"], s=2, c="0.8", label=f"single tokens ({len(m)})", rasterized=True)
        mine = [r for r in rows if r["prompt"] == prompt]
        for direction, marker in markers.items():
            for method, colour in colours.items():
                found = [r for r in mine if (r["direction"], r["method"]) == (direction, method)]
                if not found:
                    continue
                ax.scatter([r["z_b"] for r in found], [r["z_a"] for r in found], s=18, marker=marker, color=colour,
                           label=f"{method.replace('_', '-')}, {direction.replace('_', ' ')}")
                fluent, sign = [r for r in found if r["judge_ppl"] <= cap], 1.0 if direction == "a_over_b" else -1.0
                if fluent:
                    best = max(fluent, key=lambda r: sign * r["gap"])
                    ax.scatter([best["z_b"]], [best["z_a"]], s=140, marker="*", color=colour, edgecolors="k",
                               zorder=5)
                whole = [r for r in fluent if r["ends_turn"]]  # the summary's complete-answer comparison
                if whole:
                    best = max(whole, key=lambda r: sign * r["gap"])
                    ax.scatter([best["z_b"]], [best["z_a"]], s=110, marker="D", facecolors="none",
                               edgecolors=colour, linewidths=1.6, zorder=6)
        lo, hi = ax.get_xlim()[0], ax.get_xlim()[1]
        ax.plot([lo, hi], [lo, hi], "k--", lw=0.8, label="z_A = z_B")
        ax.set_xlabel("z_B (SDs of side B's single-token rewards)")
        ax.set_ylabel("z_A (SDs of side A's single-token rewards)")
        ax.set_title(f"{prompt}: ★ most disagreeing at judge perplexity ≤ {cap:g}, ◇ of complete answers")
        ax.legend(fontsize=7)
    return _save(fig, path)
