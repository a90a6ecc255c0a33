"""The implicit reward model between two causal LMs, made readable with the mixture-weighted log ratio.

The orientation is named, never positional: the *chosen* model's log-prob minus the *reference*
model's, r(x, y) = beta (log pi_chosen(y|x) - log pi_reference(y|x)) + c(x) (DPO's reward for turning
the reference into the chosen model). Over single tokens that log ratio is dominated by junk tokens
whose probabilities are tiny in both models, so tokens are ranked by

    MWLR = 1/2 (p_c + p_r) (log p_c - log p_r),

which weights the log ratio by how much probability the two models give the token together: > 0
where the chosen model gives the token more probability. The second paper's table "Llama 3.2 3B ->
Gemma 2 2B" (Freedom optimal, ** and Love pessimal) is chosen = Llama, reference = Gemma. Models
with different tokenizers are compared on the decoded strings both have, each model first reduced
to one row per string (its highest log-prob).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from rmjax.analysis.data import ScoreTable, common_prompts, dedupe_keep_max
from rmjax.errors import UsageError

CHOSEN, REFERENCE = ":logp_chosen", ":logp_reference"


def mwlr(logp_chosen: np.ndarray, logp_reference: np.ndarray) -> np.ndarray:
    """1/2 (p_c + p_r) (log p_c - log p_r); > 0 where the chosen model gives the token more probability."""
    logp_c, logp_r = np.asarray(logp_chosen, np.float64), np.asarray(logp_reference, np.float64)
    return 0.5 * (np.exp(logp_c) + np.exp(logp_r)) * (logp_c - logp_r)


def implicit_reward(chosen: ScoreTable, reference: ScoreTable, prompts: Sequence[str] | None = None) -> pd.DataFrame:
    """MWLR (chosen over reference) per shared decoded string (rows, sorted) and prompt (columns), plus
    each model's log-prob as `<prompt>:logp_chosen` / `<prompt>:logp_reference`."""
    prompts = list(prompts or common_prompts([chosen, reference]))
    if not prompts:
        raise UsageError(f"{chosen.model} and {reference.model} have no prompt column in common.")
    named = [p for p in prompts if p.endswith((CHOSEN, REFERENCE))]
    if named:  # its MWLR column would be taken for another prompt's log-probs
        raise UsageError(f"prompt {named[0]!r} ends like the log-prob columns of implicit_rm.csv ({CHOSEN}, "
                         f"{REFERENCE}); rename it in the log-prob tables.")
    c = dedupe_keep_max(chosen, prompts)
    r = dedupe_keep_max(reference, prompts)
    shared = c.index.intersection(r.index).sort_values()
    if len(shared) == 0:
        raise UsageError(f"{chosen.model} and {reference.model} share no decoded string.")
    c, r = c.loc[shared], r.loc[shared]
    out = pd.DataFrame(index=pd.Index(shared, name="text"))
    for prompt in prompts:
        out[prompt] = mwlr(c[prompt].to_numpy(), r[prompt].to_numpy())
    for prompt in prompts:
        out[prompt + CHOSEN] = c[prompt].to_numpy(np.float64)
        out[prompt + REFERENCE] = r[prompt].to_numpy(np.float64)
    return out


def mwlr_columns(rewards: pd.DataFrame) -> list[str]:
    return [c for c in rewards.columns if not str(c).endswith((CHOSEN, REFERENCE))]


def implicit_table(rewards: pd.DataFrame, name: str) -> ScoreTable:
    """The MWLR columns as a scored-text table, so the Big Two analysis can run on the implicit RM."""
    prompts = mwlr_columns(rewards)
    frame = pd.DataFrame({"text": rewards.index.to_numpy(), **{p: rewards[p].to_numpy() for p in prompts}})
    return ScoreTable(name, name, frame, "text")


def implicit_top_bottom(rewards: pd.DataFrame, k: int = 20) -> pd.DataFrame:
    """Optimal (highest MWLR: the chosen model's favourites) and pessimal tokens per prompt; ties ordered
    by string."""
    rows = []
    for prompt in mwlr_columns(rewards):
        order = pd.DataFrame({"text": rewards.index.to_numpy(), "mwlr": rewards[prompt].to_numpy(),
                              "logp_chosen": rewards[prompt + CHOSEN].to_numpy(),
                              "logp_reference": rewards[prompt + REFERENCE].to_numpy()})
        order = order.sort_values(["mwlr", "text"], ascending=[False, True], kind="mergesort")
        for side, part in (("top", order.head(k)), ("bottom", order.tail(k).iloc[::-1])):
            for position, (_, row) in enumerate(part.iterrows(), start=1):
                rows.append({"prompt": prompt, "side": side, "rank": position, "text": row["text"],
                             "mwlr": row["mwlr"], "logp_chosen": row["logp_chosen"],
                             "logp_reference": row["logp_reference"]})
    return pd.DataFrame(rows)
