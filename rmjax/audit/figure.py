"""The audit's figure: one panel per battery, each contrast's effect with its 95% CI, and its null beside it (the
length-only prediction as a cross; for a shuffled-label null the ± band chance reaches), so an effect that its null
explains is seen as one."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from rmjax.analysis.plots import _inches, _save, plt
from rmjax.audit import stats


def effects(table: pd.DataFrame, nulls: Sequence[str], path: str | Path) -> Path:
    """audit.csv's rows as horizontal intervals; filled dots survive Holm's correction (p_holm < stats.ALPHA);
    `nulls`: each row's null kind ("length" or "shuffled")."""
    table = table.assign(null_kind=list(nulls))
    batteries = list(dict.fromkeys(table["battery"]))
    labels = [f"{r.axis}: {r.contrast}" for r in table.itertuples()]
    heights = [max(1.2, 0.28 * (table["battery"] == b).sum() + 0.6) for b in batteries]
    fig, axes = plt.subplots(len(batteries), 1, figsize=(6 + _inches(labels, 8), sum(heights)),
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    for ax, battery in zip(axes[:, 0], batteries, strict=True):
        part = table[table["battery"] == battery].reset_index(drop=True)
        y = np.arange(len(part))[::-1]
        shuffled = (part["null_kind"] == "shuffled").to_numpy()
        for yi, r, band in zip(y, part.itertuples(), shuffled, strict=True):
            if band:
                ax.fill_betweenx([yi - 0.35, yi + 0.35], -abs(r.null_effect), abs(r.null_effect), color="0.85",
                                 zorder=0)
            else:
                ax.plot([r.null_effect], [yi], "x", color="tab:red", zorder=3)
        ax.errorbar(part["effect"], y, xerr=[part["effect"] - part["ci_low"], part["ci_high"] - part["effect"]],
                    fmt="none", ecolor="black", capsize=2, zorder=2)
        kept = part["p_holm"] < stats.ALPHA
        ax.scatter(part["effect"][kept], y[kept.to_numpy()], color="black", zorder=4, s=16)
        ax.scatter(part["effect"][~kept], y[~kept.to_numpy()], facecolor="white", edgecolor="black", zorder=4, s=16)
        ax.axvline(0, color="0.5", linewidth=0.8)
        ax.set_yticks(y, [f"{r.axis}: {r.contrast}" for r in part.itertuples()], fontsize=8)
        ax.set_title(battery, fontsize=10, loc="left")
    axes[-1, 0].set_xlabel("effect (reward difference, 95% bootstrap CI over items); x: length-only null, "
                           f"grey: shuffled-label null; filled: p_holm < {stats.ALPHA:g}", fontsize=8)
    return _save(fig, path)
