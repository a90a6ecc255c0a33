"""The implicit reward model between two causal LMs, made readable with the mixture-weighted log ratio.

r(x, y) = beta (log pi_B(y|x) - log pi_A(y|x)) + c(x) over single tokens is dominated by junk tokens
whose probabilities are tiny in both models, so tokens are ranked by

    MWLR = 1/2 (p + q) (log q - log p),   p = pi_A(y|x), q = pi_B(y|x),

which weights the log ratio by how much probability the two models give the token together.
Models with different tokenizers are compared on the decoded strings both have, each model first
reduced to one row per string (its highest log-prob).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from rmjax.analysis.data import ScoreTable, common_prompts, dedupe_keep_max
from rmjax.errors import UsageError


def mwlr(logp_a: np.ndarray, logp_b: np.ndarray) -> np.ndarray:
    """1/2 (p + q) (log q - log p) from log-probs of model A (p) and model B (q); > 0 where B prefers."""
    logp_a, logp_b = np.asarray(logp_a, np.float64), np.asarray(logp_b, np.float64)
    return 0.5 * (np.exp(logp_a) + np.exp(logp_b)) * (logp_b - logp_a)


def implicit_reward(table_a: ScoreTable, table_b: ScoreTable, prompts: Sequence[str] | None = None) -> pd.DataFrame:
    """MWLR per shared decoded string (rows, sorted) and prompt (columns), plus each model's log-prob
    as `<prompt>:logp_A` / `<prompt>:logp_B`."""
    prompts = list(prompts or common_prompts([table_a, table_b]))
    if not prompts:
        raise UsageError(f"{table_a.model} and {table_b.model} have no prompt column in common.")
    a = dedupe_keep_max(table_a, prompts)
    b = dedupe_keep_max(table_b, prompts)
    shared = a.index.intersection(b.index).sort_values()
    if len(shared) == 0:
        raise UsageError(f"{table_a.model} and {table_b.model} share no decoded string.")
    a, b = a.loc[shared], b.loc[shared]
    out = pd.DataFrame(index=pd.Index(shared, name="text"))
    for prompt in prompts:
        out[prompt] = mwlr(a[prompt].to_numpy(), b[prompt].to_numpy())
    for prompt in prompts:
        out[f"{prompt}:logp_A"] = a[prompt].to_numpy(np.float64)
        out[f"{prompt}:logp_B"] = b[prompt].to_numpy(np.float64)
    return out


def mwlr_columns(rewards: pd.DataFrame) -> list[str]:
    return [c for c in rewards.columns if not str(c).endswith((":logp_A", ":logp_B"))]


def implicit_table(rewards: pd.DataFrame, name: str) -> ScoreTable:
    """The MWLR columns as a scored-text table, so the Big Two analysis can run on the implicit RM."""
    prompts = mwlr_columns(rewards)
    frame = pd.DataFrame({"text": rewards.index.to_numpy(), **{p: rewards[p].to_numpy() for p in prompts}})
    return ScoreTable(name, name, frame, "text")


def implicit_top_bottom(rewards: pd.DataFrame, k: int = 20) -> pd.DataFrame:
    """Optimal (highest MWLR: B over A) and pessimal tokens per prompt; ties ordered by string."""
    rows = []
    for prompt in mwlr_columns(rewards):
        order = pd.DataFrame({"text": rewards.index.to_numpy(), "mwlr": rewards[prompt].to_numpy(),
                              "logp_A": rewards[f"{prompt}:logp_A"].to_numpy(),
                              "logp_B": rewards[f"{prompt}:logp_B"].to_numpy()})
        order = order.sort_values(["mwlr", "text"], ascending=[False, True], kind="mergesort")
        for side, part in (("top", order.head(k)), ("bottom", order.tail(k).iloc[::-1])):
            for position, (_, row) in enumerate(part.iterrows(), start=1):
                rows.append({"prompt": prompt, "side": side, "rank": position, "text": row["text"],
                             "mwlr": row["mwlr"], "logp_A": row["logp_A"], "logp_B": row["logp_B"]})
    return pd.DataFrame(rows)
