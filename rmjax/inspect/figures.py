"""The inspect job's figures: reward lens, attribution strips (flagged where IG do not add up), patching maps."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rmjax.inspect.patching import COMPONENTS
from rmjax.runs.atomic import save_figure
from rmjax.text.visible import figure_text, wrap


def percent(x: float) -> str:
    """A ratio as a percentage: 1008.5%, 5.0%, 0.79%, 0.014%."""
    v = 100 * x
    return f"{v:.1f}%" if abs(v) >= 1 or v == 0 else f"{v:.2g}%"


def write_figures(out: Path, items, lens, attributions, patched, pair, col: int, tok) -> None:
    """lens.png, attribution.png and patching.png in `out`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = _Labels(tok)
    for draw, name in ((_lens_figure, "lens.png"), (_attribution_figure, "attribution.png"),
                       (_patching_figure, "patching.png")):
        fig = draw(plt, labels, items, lens, attributions, patched, pair, col)
        save_figure(fig, out / name, dpi=120, bbox_inches="tight")
        plt.close(fig)


class _Labels:
    """Text for a figure (rmjax.text.visible.figure_text): whitespace visible (␣ at the ends, \\n), characters the font
    has no glyph for (CJK, Bengali, ... with only DejaVu installed) written as escapes (\\u539f), not empty boxes."""

    def __init__(self, tok):
        self.tok = tok

    def __call__(self, text: str, cut: int | None = 30) -> str:
        return figure_text(text, cut)

    def token(self, t: int) -> str:
        return figure_text(self.tok.decode([t]))


def _lens_figure(plt, label, items, lens, attributions, patched, pair, col):
    import matplotlib.ticker

    fig, ax = plt.subplots(figsize=(7, 4))
    for b, item in enumerate(items):
        ax.plot(np.arange(lens.lens.shape[0]), lens.lens[:, b, col], marker=".", label=label(item.label))
    ax.set(xlabel="layer (0: embeddings)", ylabel="reward read from the residual stream", title="Reward lens")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.legend(fontsize=7)
    return fig


def _attribution_figure(plt, label, items, lens, attributions, patched, pair, col):
    """One strip per response, every token labelled in full (rotated; the figure grows with the conversation),
    its own colour scale and colorbar. A strip whose IG do not add up says so in red."""
    token = label.token
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
        fig.suptitle(wrap("Integrated gradients per token: NOT COMPLETE for " + ", ".join(label(f) for f in failed)
                          + " (their sums miss the reward difference; do not read them as its decomposition)",
                          fig.get_figwidth()), color="red", fontweight="bold")
    else:
        fig.suptitle(wrap("Integrated gradients per token (red: lowers, blue: raises the reward; the line: the "
                          "response starts)", fig.get_figwidth()))
    return fig


def _patching_figure(plt, label, items, lens, attributions, patched, pair, col):
    """Only the positions from the first one where clean and donor differ (before it both runs are the same and
    every patch gives the clean reward), labelled with their tokens (clean/donor where they differ)."""
    import matplotlib.ticker

    if patched is None:
        fig, ax = plt.subplots(figsize=(6, 1.5))
        ax.set_axis_off()
        ax.set_title("no patching (needs two responses of one token length)")
        return fig
    token = label.token
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
    return fig
