"""Human-readable summaries of result tables (top and bottom tokens per column)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from rmjax.runs import atomic, results
from rmjax.text.visible import figure_text


def _prompt_texts(meta: dict) -> dict[str, str]:
    identity = meta.get("identity", meta)
    prompts = identity.get("prompts") if isinstance(identity, dict) else None
    return prompts if isinstance(prompts, dict) else {}


def summarize_table(path: str | Path, k: int = 20, what: str = "score") -> str:
    """Top and bottom `k` per column, each with its z-score and percentile within the column, so a number has
    a reference point; the prompt's text and how many tokens survive a real conversation's round trip."""
    df = results.read_scores_csv(path)
    meta_file = results.meta_path(path)
    meta = json.loads(meta_file.read_text()) if meta_file.is_file() else {}
    texts = _prompt_texts(meta)
    roundtrip = df[results.ROUNDTRIP].to_numpy() if results.ROUNDTRIP in df.columns else None
    lines = []
    for col in results.value_columns(df):
        column = df[col].to_numpy(np.float64)
        values = column[np.isfinite(column)]  # a run with --allow_nonfinite: statistics of the finite ones, said
        if not len(values):
            lines.append(f"\n{col!r}: no finite value in {len(column):,} tokens")
            continue
        # ddof 1: the estimator of every job's z-scores (rmjax.scoring.finite.yardstick, frontier's reward_z)
        mean, sd = float(values.mean()), float(values.std(ddof=1)) if len(values) > 1 else 0.0
        p1, p50, p99 = np.percentile(values, [1, 50, 99])
        lines.append(f"\n{col!r}" + (f": {texts[col]!r}" if col in texts else ""))
        left = f" ({len(column) - len(values):,} NaN/Inf left out)" if len(values) < len(column) else ""
        lines.append(f"  {len(values):,} tokens{left}: mean {mean:.4f}, sd {sd:.4f}; percentiles 1% {p1:.4f}, "
                     f"50% {p50:.4f}, 99% {p99:.4f}")
        ranked = df[np.isfinite(column)].sort_values(col, ascending=False, kind="stable")
        sorted_values = np.sort(values)
        shown = min(k, len(values))  # --top=0 prints the statistics alone; a short column says how many it has
        for title, part in (("top", ranked.head(shown)), ("bottom", ranked.tail(shown).iloc[::-1])) if shown else ():
            lines.append(f"{title} {shown} tokens by {what} (z: SDs from the mean; pct: share of tokens below):")
            for _, row in part.iterrows():
                # a constant column's computed sd is rounding (1.7e-17 for three 0.1s), not 0: its z is 0
                z = (row[col] - mean) / sd if sorted_values[-1] > sorted_values[0] else 0.0
                pct = 100.0 * np.searchsorted(sorted_values, row[col], side="left") / len(values)
                flag = "" if roundtrip is None or row[results.ROUNDTRIP] else "  (no round trip)"
                lines.append(f"  {row[col]:>10.4f}  z {z:>+6.2f}  pct {pct:>6.2f}  {row['token_id']:>7}  "
                             f"{row['token_decoded']!r}{flag}")
    if roundtrip is not None:
        lines.append(f"\nround trip: {int(roundtrip.sum()):,} of {len(df):,} tokens are what a real conversation "
                     "tokenizes to (column roundtrip = 1); the others are marked (no round trip).")
    seconds = meta.get("seconds")
    lines.append(
        f"\n{len(df)} tokens x {len(results.value_columns(df))} prompts written to {path}"
        + (f" (+ {meta_file.name})" if meta else "")
        + (f" at {meta['written']}" if "written" in meta else "")  # a reused result's own time, never passed off
        + (f", computed in {seconds:.1f} s" if seconds is not None else "")  # as this command's
        + (f"; model load {meta['load_seconds']:.1f} s" if "load_seconds" in meta else "")
    )
    return "\n".join(lines)


def _marked_rows(df, roundtrip: np.ndarray | None) -> np.ndarray:
    """Which tokens the figure may mark as top or bottom: those a real conversation produces (roundtrip = 1), or,
    in a table without that column, those whose decoded text is not a byte fragment (no U+FFFD)."""
    if roundtrip is not None:
        return roundtrip.astype(bool)
    return ~df["token_decoded"].str.contains("\ufffd", regex=False).to_numpy(bool)


def plot_distributions(path: str | Path, png: str | Path | None = None) -> Path:
    """Histogram of each prompt's scores over all candidates (PNG beside the CSV by default), the top and bottom
    token marked among the tokens that round trip (a byte fragment decodes to U+FFFD and no conversation contains
    it); the figure says how many it left unmarked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    df = results.read_scores_csv(path)
    png = Path(png) if png else Path(path).with_name(Path(path).name + ".png")
    cols = results.value_columns(df)
    marked = df[_marked_rows(df, df[results.ROUNDTRIP].to_numpy() if results.ROUNDTRIP in df.columns else None)]
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, col in enumerate(cols):
        _, _, patches = ax.hist(df[col], bins=120, alpha=0.6, label=figure_text(col, 40))
        color = patches[0].get_facecolor()
        if marked.empty:
            continue
        # The best and the worst token, marked where they fall.
        for row, side in ((marked.loc[marked[col].idxmax()], "top"), (marked.loc[marked[col].idxmin()], "bottom")):
            ax.axvline(row[col], color=color, linestyle="--", linewidth=1)
            ax.annotate(f"{side}: '{figure_text(row['token_decoded'], 30)}' {row[col]:.2f}", xy=(row[col], 1),
                        xycoords=("data", "axes fraction"), xytext=(0, -12 - 11 * i), textcoords="offset points",
                        ha="right" if side == "top" else "left", fontsize=7, color=color)
    ax.set_xlabel("reward")
    ax.set_ylabel("tokens")
    left = len(df) - len(marked)
    ax.set_title(f"Reward of each of {len(df):,} tokens as the whole response" + (
        f"\ntop and bottom marked among the {len(marked):,} tokens that round trip\n({left:,} "
        f"{'byte fragment or token' if left == 1 else 'byte fragments or tokens'} without a round trip not marked)"
        if left else ""), fontsize=10 if left else None)
    ax.legend(fontsize=7, bbox_to_anchor=(1.01, 1), loc="upper left")
    fig.tight_layout()
    atomic.save_figure(fig, png, dpi=120, bbox_inches="tight", pad_inches=0.1)
    plt.close(fig)
    return png
