"""Paper 1 analyses on score tables: moments, top/bottom tokens, heterogeneity, RSA, sentiment,
frequency and framing. Each function returns a DataFrame; `report` writes them and draws the figures.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from rmjax.analysis import lexicons, stats
from rmjax.analysis.data import ScoreTable, collapse_variants
from rmjax.errors import UsageError


def moments_table(tables: Sequence[ScoreTable], prompts: Sequence[str], n_boot: int = 1000,
                  seed: int = 0) -> pd.DataFrame:
    """Mean, variance (ddof=0), skewness (biased) of each model's full score distribution, with
    95% percentile-bootstrap CIs."""
    rows = []
    for prompt in prompts:
        for t in tables:
            scores = t.frame[prompt].to_numpy(np.float64)
            rows.append({"prompt": prompt, "model": t.model, "n_tokens": len(scores),
                         **stats.bootstrap_moments(scores, n_boot=n_boot, seed=seed)})
    return pd.DataFrame(rows)


def _extreme(order: pd.DataFrame, k: int, top: bool) -> pd.DataFrame:
    """The k first rows of `order` sorted by (score desc, string, token id) for top, or the k last ones
    (lowest first) for bottom; only the rows that can make the cut are sorted."""
    scores = order["score"].to_numpy()
    if k < len(order):
        cut = np.partition(scores, len(scores) - k)[len(scores) - k] if top else np.partition(scores, k - 1)[k - 1]
        order = order[scores >= cut] if top else order[scores <= cut]
    ascending = [False, True, True] if top else [True, False, False]
    return order.sort_values(["score", "string", "token_id"], ascending=ascending, kind="mergesort").head(k)


def top_bottom_table(tables: Sequence[ScoreTable], prompts: Sequence[str], k: int = 20,
                     vocabulary: Sequence[str] | None = None) -> pd.DataFrame:
    """The k highest and k lowest scoring tokens per model and prompt, on the model's raw vocabulary
    or (when given) only on `vocabulary`. Ties are ordered by string, then token id."""
    rows = []
    keep = None if vocabulary is None else set(vocabulary)
    for t in tables:
        frame = t.frame if keep is None else t.frame[t.strings.isin(keep)]
        for prompt in prompts:
            order = pd.DataFrame({"string": frame[t.string_column].to_numpy(),
                                  "token_id": frame["token_id"].to_numpy() if "token_id" in frame else -1,
                                  "score": frame[prompt].to_numpy(np.float64)})
            n = len(order)
            for side in ("top", "bottom"):
                part = _extreme(order, k, side == "top")
                for position, (_, row) in enumerate(part.iterrows(), start=1):
                    rows.append({"prompt": prompt, "model": t.model, "side": side, "rank": position,
                                 "rank_in_vocabulary": position if side == "top" else n - position + 1,
                                 "vocabulary_size": n, "token_id": int(row["token_id"]),
                                 "token_decoded": row["string"], "score": float(row["score"])})
    columns = ["prompt", "model", "side", "rank", "rank_in_vocabulary", "vocabulary_size", "token_id",
               "token_decoded", "score"]
    frame = pd.DataFrame(rows, columns=columns)
    order = {p: i for i, p in enumerate(prompts)}
    return frame.sort_values("prompt", key=lambda c: c.map(order), kind="mergesort").reset_index(drop=True)


def heterogeneity(aligned: pd.DataFrame, rbo_p: float = 0.9, rbo_depth: int = 132) -> dict[str, pd.DataFrame]:
    """Model x model Kendall tau-b, Spearman rho, RBO and the affine-invariant EPIC distance on aligned scores
    (rows = shared strings)."""
    return {"kendall_tau": stats.kendall_tau_matrix(aligned),
            "spearman": stats.spearman_matrix(aligned),
            "rbo": stats.rbo_matrix(aligned, p=rbo_p, depth=rbo_depth),
            "epic_distance": stats.epic_distance_matrix(aligned)}


def rsa_table(tau: pd.DataFrame, metadata: pd.DataFrame, n_permutations: int = 10000,
              seed: int = 0) -> pd.DataFrame:
    """Spearman rho between the model dissimilarity 1 - tau and each theoretical similarity matrix,
    with a permutation p-value. A negative rho means models similar in theory are similar in behaviour."""
    dissimilarity = 1.0 - tau.to_numpy(np.float64)
    rows = []
    for name, theory in stats.theoretical_similarities(metadata.loc[list(tau.index)]).items():
        result = stats.rsa_permutation_test(dissimilarity, theory.to_numpy(), n_permutations, seed)
        rows.append({"theoretical_matrix": name, "spearman_rho": result["rho"], "p_value": result["p_value"],
                     "n_permutations": result["n_permutations"], "exact": result["exact"]})
    return pd.DataFrame(rows)


def sentiment_points(table: ScoreTable, prompt: str, afinn: dict[str, int], collapse: str = "none") -> pd.DataFrame:
    """Tokens of one model found in AFINN-111: token, word, sentiment, score (one row per token, or per
    word with collapse='max'/'mean')."""
    sentiment = lexicons.lookup(table.normalized, afinn, normalized=True)
    mask = ~np.isnan(sentiment)
    points = pd.DataFrame({"token_decoded": table.strings.to_numpy()[mask], "word": table.normalized[mask],
                           "sentiment": sentiment[mask], "score": table.frame[prompt].to_numpy(np.float64)[mask]})
    return collapse_variants(points, collapse)


def sentiment_regressions(tables: Sequence[ScoreTable], prompts: Sequence[str],
                          afinn: dict[str, int], collapse: str = "none") -> pd.DataFrame:
    """OLS slope (and SE) of score on AFINN value, separately for positive and negative words,
    per model and prompt."""
    rows = []
    for prompt in prompts:
        for t in tables:
            points = sentiment_points(t, prompt, afinn, collapse)
            for valence, part in (("positive", points[points.sentiment > 0]),
                                  ("negative", points[points.sentiment < 0])):
                fit = stats.ols(part.score.to_numpy(), {"sentiment": part.sentiment.to_numpy()})
                rows.append({"prompt": prompt, "model": t.model, "valence": valence, "collapse": collapse,
                             "n_tokens": len(part), "slope": fit.loc["sentiment", "coef"],
                             "se": fit.loc["sentiment", "se"], "intercept": fit.loc["intercept", "coef"]})
    return pd.DataFrame(rows)


FREQUENCY_SCALES = {
    "log_per_million": "log(BNC frequency per million words)",
    "zscore": "z-score of log(BNC frequency per million) over the regressed words",
}


def frequency_regressions(tables: Sequence[ScoreTable], prompts: Sequence[str], afinn: dict[str, int],
                          frequencies: dict[str, float], collapse: str = "none",
                          scale: str = "log_per_million") -> pd.DataFrame:
    """score ~ frequency + sentiment per model and prompt, over tokens whose normalized form is in the
    BNC list; words absent from AFINN-111 count as sentiment 0 (AFINN's own convention for unlisted
    words). `scale` (FREQUENCY_SCALES): the natural log of the BNC list's per-million frequency, or
    that log z-scored over the regressed words (the slope is then per standard deviation)."""
    if scale not in FREQUENCY_SCALES:
        raise UsageError(f"--frequency_scale={scale}: must be one of {', '.join(FREQUENCY_SCALES)}.")
    rows = []
    for prompt in prompts:
        for t in tables:
            freq = lexicons.lookup(t.normalized, frequencies, normalized=True)
            mask = ~np.isnan(freq)
            points = collapse_variants(pd.DataFrame({
                "word": t.normalized[mask], "score": t.frame[prompt].to_numpy(np.float64)[mask],
                "frequency": np.log(freq[mask]),
                "sentiment": np.nan_to_num(lexicons.lookup(t.normalized, afinn, normalized=True), nan=0.0)[mask],
            }), collapse)
            frequency = points.frequency.to_numpy()
            if scale == "zscore":
                if not stats.ranks_something(frequency):  # a computed SD may not be 0 (rounding)
                    raise UsageError(f"{t.model}: the log frequency of its {len(frequency)} regressed words has no "
                                     "spread to z-score; use --frequency_scale=log_per_million.")
                frequency = stats.z_scores(frequency)
            fit = stats.ols(points.score.to_numpy(), {"frequency": frequency, "sentiment": points.sentiment.to_numpy()})
            rows.append({"prompt": prompt, "model": t.model, "collapse": collapse, "frequency_scale": scale,
                         "n_tokens": len(points), "slope_frequency": fit.loc["frequency", "coef"],
                         "se_frequency": fit.loc["frequency", "se"],
                         "slope_sentiment": fit.loc["sentiment", "coef"], "se_sentiment": fit.loc["sentiment", "se"]})
    return pd.DataFrame(rows)


def framing_tables(tables: Sequence[ScoreTable], best: str = "best", worst: str = "worst",
                   k: int = 20) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(correlations, rankings): per model the best-vs-worst Pearson/Spearman/Kendall correlation,
    and the top/bottom k tokens of best+worst (good or bad answers to both) and best-worst (the
    valence axis), on each model's raw vocabulary with scores z-scored per prompt first, so the two
    framings weigh equally."""
    correlations, rankings = [], []
    for t in tables:
        b = stats.z_scores(t.frame[best].to_numpy(np.float64))
        w = stats.z_scores(t.frame[worst].to_numpy(np.float64))
        few = len(b) < stats.MIN_ITEMS  # two tokens: every correlation +-1
        tau = np.nan if few else float(scipy_stats.kendalltau(b, w, variant="b").statistic)
        correlations.append({"model": t.model, "n_tokens": len(b), "pearson": stats.pearson(b, w),
                             "spearman": np.nan if few else float(scipy_stats.spearmanr(b, w).statistic),
                             "kendall_tau": tau})
        for combination, values in ((f"{best}+{worst}", b + w), (f"{best}-{worst}", b - w)):
            combined = ScoreTable(t.model, t.source, pd.DataFrame({
                t.string_column: t.strings.to_numpy(), "combined": values,
                **({"token_id": t.frame["token_id"].to_numpy()} if "token_id" in t.frame else {})}),
                t.string_column)
            part = top_bottom_table([combined], ["combined"], k)
            part["combination"] = combination
            rankings.append(part.drop(columns="prompt"))
    ranking_frame = pd.concat(rankings, ignore_index=True).rename(columns={"score": "combined_z"})
    columns = ["combination", "model", "side", "rank", "token_id", "token_decoded", "combined_z"]
    return pd.DataFrame(correlations), ranking_frame[columns]
