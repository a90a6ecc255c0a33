"""EloEverything: human Elo ratings of 7,530 items against the ten RMs' scores for each item.

Each CSV (`elo_rank, elo_score, name, elo_matches, <one column per model>`) is one prompt; its file
name is the prompt without the question mark. Items are joined across prompts by `name`.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from rmjax.analysis import stats
from rmjax.analysis.data import model_label, slugify
from rmjax.errors import MissingFileError, UsageError

HUMAN = "Human"
ITEM_COLUMNS = ["elo_rank", "elo_score", "name", "elo_matches"]


@dataclass(frozen=True)
class EloPrompt:
    prompt: str  # the question, with its question mark
    slug: str  # file-name friendly form of the prompt
    items: pd.DataFrame  # index: item name; columns elo_score, elo_rank, elo_matches
    scores: pd.DataFrame  # index: item name; one column per model (labelled)

    @property
    def models(self) -> list[str]:
        return list(self.scores.columns)


def load_elo(directory: str | Path, metadata: pd.DataFrame | None = None) -> list[EloPrompt]:
    """Every EloEverything CSV in `directory`, model columns renamed to nicknames when known."""
    paths = sorted(Path(directory).glob("*.csv"))
    if not paths:
        raise MissingFileError(f"no EloEverything *.csv files in {directory}.")
    prompts = []
    for path in paths:
        frame = pd.read_csv(path, keep_default_na=False, na_filter=False, dtype={"name": str}, encoding="utf-8")
        missing = [c for c in ITEM_COLUMNS if c not in frame.columns]
        if missing:
            raise UsageError(f"{path}: missing EloEverything columns {missing}.")
        if frame["name"].duplicated().any():
            raise UsageError(f"{path}: duplicated item names {list(frame['name'][frame['name'].duplicated()][:5])}.")
        frame = frame.set_index("name")
        model_columns = [c for c in frame.columns if c not in ITEM_COLUMNS]
        scores = frame[model_columns].astype(np.float64)
        scores.columns = [model_label(c, metadata) for c in model_columns]
        items = frame[["elo_score", "elo_rank", "elo_matches"]].astype(np.float64)
        prompts.append(EloPrompt(path.stem + "?", slugify(path.stem), items, scores))
    return prompts


def ranks_table(elo_prompt: EloPrompt) -> pd.DataFrame:
    """Per item: human Elo, z-score and rank, each model's score, z-score and rank (1 = best, ties
    averaged), and the median rank over the models only (humans excluded)."""
    human = elo_prompt.items["elo_score"].to_numpy(np.float64)
    out = pd.DataFrame({"name": elo_prompt.items.index, "human_elo_score": human,
                        "human_z": stats.z_scores(human), "human_rank": stats.descending_ranks(human)})
    model_ranks = []
    for model in elo_prompt.models:
        values = elo_prompt.scores[model].to_numpy(np.float64)
        ranks = stats.descending_ranks(values)
        model_ranks.append(ranks)
        out[f"{model}_score"] = values
        out[f"{model}_z"] = stats.z_scores(values)
        out[f"{model}_rank"] = ranks
    out["median_model_rank"] = np.median(np.stack(model_ranks), axis=0)
    out["median_model_rank_minus_human_rank"] = out["median_model_rank"] - out["human_rank"]
    return out


def tau_matrix(elo_prompt: EloPrompt) -> pd.DataFrame:
    """Kendall tau-b between humans (Elo score) and every model, over all items."""
    frame = pd.concat([elo_prompt.items["elo_score"].rename(HUMAN), elo_prompt.scores], axis=1)
    return stats.kendall_tau_matrix(frame)


def human_agreement(elo_prompts: Sequence[EloPrompt]) -> pd.DataFrame:
    """Kendall tau-b and Spearman rho of each model's scores with the human Elo scores, per prompt."""
    rows = []
    for ep in elo_prompts:
        human = ep.items["elo_score"].to_numpy(np.float64)
        for model in ep.models:
            values = ep.scores[model].to_numpy(np.float64)
            tau = scipy_stats.kendalltau(human, values, variant="b")
            rho = scipy_stats.spearmanr(human, values)
            rows.append({"prompt": ep.prompt, "model": model, "n_items": len(values),
                         "kendall_tau": float(tau.statistic), "kendall_p": float(tau.pvalue),
                         "spearman_rho": float(rho.statistic), "spearman_p": float(rho.pvalue)})
    return pd.DataFrame(rows)


def cross_prompt_tau(elo_prompts: Sequence[EloPrompt]) -> pd.DataFrame:
    """Kendall tau-b of each model with itself between every pair of prompts (items joined by name)."""
    rows = []
    for a, b in itertools.combinations(elo_prompts, 2):
        names = a.scores.index.intersection(b.scores.index)
        for model in a.models:
            if model not in b.models:
                continue
            tau = scipy_stats.kendalltau(a.scores.loc[names, model], b.scores.loc[names, model], variant="b")
            rows.append({"model": model, "prompt_a": a.prompt, "prompt_b": b.prompt, "n_items": len(names),
                         "kendall_tau": float(tau.statistic)})
    return pd.DataFrame(rows)


def human_vs_median_model(ranks: pd.DataFrame, k: int = 20) -> pd.DataFrame:
    """The k items humans rank most above and most below the median model rank (median over the
    models only; humans are not part of the median)."""
    diff = ranks["median_model_rank_minus_human_rank"]
    higher = ranks.loc[diff.sort_values(ascending=False, kind="mergesort").index[:k]]
    lower = ranks.loc[diff.sort_values(ascending=True, kind="mergesort").index[:k]]
    rows = []
    for direction, part in (("humans_rank_higher", higher), ("humans_rank_lower", lower)):
        for position, (_, row) in enumerate(part.iterrows(), start=1):
            rows.append({"direction": direction, "position": position, "name": row["name"],
                         "human_rank": row["human_rank"],
                         "median_model_rank (over models only)": row["median_model_rank"],
                         "median_model_rank_minus_human_rank": row["median_model_rank_minus_human_rank"]})
    return pd.DataFrame(rows)


def trajectory_items(ranks: pd.DataFrame, models: Sequence[str], n: int = 5) -> list[tuple[str, str]]:
    """(item, group) for the rank-trajectory plot: the human top n, the human bottom n, and every
    item some model ranks first (every tied item when several share a model's best score)."""
    by_human = ranks.sort_values("human_rank", kind="mergesort")
    chosen = [(name, "human_top") for name in by_human["name"].head(n)]
    chosen += [(name, "human_bottom") for name in by_human["name"].tail(n)]
    seen = {name for name, _ in chosen}
    for model in models:
        column = ranks[f"{model}_rank"]
        for first in ranks.loc[column == column.min(), "name"]:  # all of them when tied for first
            if first not in seen:
                chosen.append((first, "model_first"))
                seen.add(first)
    return chosen
