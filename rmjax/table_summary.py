"""Human-readable summaries of result tables (top and bottom tokens per column)."""

from __future__ import annotations

import json
from pathlib import Path

from rmjax import results


def summarize_table(path: str | Path, k: int = 20, what: str = "score") -> str:
    df = results.read_scores_csv(path)
    meta_file = results.meta_path(path)
    meta = json.loads(meta_file.read_text()) if meta_file.is_file() else {}
    lines = []
    for col in results.value_columns(df):
        ranked = df.sort_values(col, ascending=False, kind="stable")
        for title, part in (("top", ranked.head(k)), ("bottom", ranked.tail(k).iloc[::-1])):
            lines.append(f"\n{title} {k} tokens by {what} for {col!r}:")
            for _, row in part.iterrows():
                lines.append(f"  {row[col]:>10.4f}  {row['token_id']:>7}  {row['token_decoded']!r}")
    seconds = meta.get("seconds")
    lines.append(
        f"\n{len(df)} tokens x {len(results.value_columns(df))} prompts written to {path}"
        + (f" (+ {meta_file.name})" if meta else "")
        + (f" in {seconds:.1f} s" if seconds is not None else "")
        + (f"; model load {meta['load_seconds']:.1f} s" if "load_seconds" in meta else "")
    )
    return "\n".join(lines)


def plot_distributions(path: str | Path, png: str | Path | None = None) -> Path:
    """Histogram of each prompt's scores over all candidates (PNG beside the CSV by default)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    df = results.read_scores_csv(path)
    png = Path(png) if png else Path(path).with_suffix(".png")
    cols = results.value_columns(df)
    fig, ax = plt.subplots(figsize=(7, 4))
    for col in cols:
        ax.hist(df[col], bins=120, alpha=0.6, label=col)
    ax.set_xlabel("reward")
    ax.set_ylabel("tokens")
    ax.set_title(f"Reward of each of {len(df):,} tokens as the whole response")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return png
