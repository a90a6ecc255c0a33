"""Paper 2: where agency and communion words rank in each RM's scores (Big Two dictionaries).

Tokens are matched to stems after stripping and lower-casing; a token matched by stems of both
categories is left out. Ranks are within each model's whole table (1 = highest score); the
percentile (share of the table at or below the token's score, 1 = top) compares models whose
vocabularies differ in size. `collapse` ('none', 'max', 'mean': `data.collapse_variants`) decides
whether `love`, ` love` and `Love` are three observations (the papers' counting, which overstates
significance and weights large vocabularies more) or one per word.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from rmjax.analysis import lexicons, stats
from rmjax.analysis.data import ScoreTable, collapse_variants, common_prompts, read_table, roundtrip_rows
from rmjax.errors import MissingFileError, UsageError
from rmjax.runs.identities import changed_keys
from rmjax.runs.results import read_meta
from rmjax.runs.stages import recorded_template

AGENCY, COMMUNION = lexicons.AGENCY, lexicons.COMMUNION
Lexicon = dict[str, Sequence[str]] | lexicons.StemMatcher


def bigtwo_points(table: ScoreTable, prompt: str, lexicon: Lexicon,
                  category: np.ndarray | None = None, collapse: str = "none") -> pd.DataFrame:
    """Matched tokens of one model: string, word, category, score, rank and percentile in the whole
    table (one row per word unless collapse='none').

    `category` (from `lexicons.categorize`) saves matching the table again for each prompt."""
    scores = table.frame[prompt].to_numpy(np.float64)
    category = lexicons.categorize(table.normalized, lexicon, normalized=True) if category is None else category
    rank = stats.descending_ranks(scores)
    percentile = scipy_stats.rankdata(scores, method="max") / len(scores)
    mask = np.isin(category, [AGENCY, COMMUNION])
    points = pd.DataFrame({"token_decoded": table.strings.to_numpy()[mask], "word": table.normalized[mask],
                           "category": category[mask], "score": scores[mask], "rank": rank[mask],
                           "percentile": percentile[mask]})
    return collapse_variants(points, collapse)


def _compare(points: pd.DataFrame) -> dict[str, float]:
    agency = points[points.category == AGENCY]
    communion = points[points.category == COMMUNION]
    test = stats.mann_whitney(agency["percentile"].to_numpy(), communion["percentile"].to_numpy())
    return {"n_agency": len(agency), "n_communion": len(communion),
            "median_rank_agency": float(agency["rank"].median()) if len(agency) else np.nan,
            "median_rank_communion": float(communion["rank"].median()) if len(communion) else np.nan,
            "median_percentile_agency": float(agency["percentile"].median()) if len(agency) else np.nan,
            "median_percentile_communion": float(communion["percentile"].median()) if len(communion) else np.nan,
            "mann_whitney_u": test["u"], "p_value": test["p_value"], "rank_biserial": test["rank_biserial"]}


def bigtwo_comparison(tables: Sequence[ScoreTable], prompts: Sequence[str],
                      lexicon: Lexicon, collapse: str = "none") -> pd.DataFrame:
    """Per model and prompt: agency vs communion Mann-Whitney U (U for agency) and rank-biserial r
    (+1: every agency token above every communion token)."""
    matcher = lexicons.as_matcher(lexicon)
    categories = {t.model: lexicons.categorize(t.normalized, matcher, normalized=True) for t in tables}
    rows = []
    for prompt in prompts:
        for t in tables:
            points = bigtwo_points(t, prompt, lexicon, categories[t.model], collapse)
            rows.append({"prompt": prompt, "model": t.model, "collapse": collapse, **_compare(points),
                         "n_ambiguous_left_out": int((categories[t.model] == "ambiguous").sum())})
    return pd.DataFrame(rows)


def bigtwo_family_comparison(tables: Sequence[ScoreTable], prompts: Sequence[str],
                             lexicon: Lexicon, families: dict[str, str], collapse: str = "none") -> pd.DataFrame:
    """The same test per base-model family, pooling the tokens' within-model percentiles."""
    matcher = lexicons.as_matcher(lexicon)
    categories = {t.model: lexicons.categorize(t.normalized, matcher, normalized=True) for t in tables}
    rows = []
    for prompt in prompts:
        for family in sorted(set(families.values())):
            members = [t for t in tables if families.get(t.model) == family]
            points = pd.concat([bigtwo_points(t, prompt, lexicon, categories[t.model], collapse) for t in members],
                               ignore_index=True)
            rows.append({"prompt": prompt, "family": family, "models": ",".join(t.model for t in members),
                         "collapse": collapse,
                         **_compare(points)})
    return pd.DataFrame(rows)


def load_checkpoints(directory: str | Path, roundtrip_only: bool = False) -> list[tuple[int, ScoreTable]]:
    """`step_<N>.csv` score tables of one training run, sorted by step."""
    found = []
    for path in Path(directory).glob("step_*.csv"):
        match = re.fullmatch(r"step_(\d+)", path.stem)
        if match and path.is_file():  # a FIFO named step_1.csv would hang the read
            frame, string_column = read_table(path, flag="--bigtwo_checkpoints")
            if roundtrip_only:
                frame = roundtrip_rows(frame, string_column, path)
            found.append((int(match.group(1)), ScoreTable(path.stem, path.stem, frame, string_column, path)))
    if not found:
        raise MissingFileError(f"no step_<N>.csv score tables in {directory}.")
    steps = [step for step, _ in found]
    twice = sorted({step for step in steps if steps.count(step) > 1})
    if twice:  # e.g. step_1.csv and step_01.csv: two points for one step of the curve
        raise UsageError(f"--bigtwo_checkpoints={directory} has several tables for step {twice[0]} "
                         f"({', '.join(sorted(str(t.path.name) for s, t in found if s == twice[0]))}); keep one.")
    found.sort(key=lambda item: item[0])
    _one_run(directory, [table.path for _, table in found])
    return found


def _differs_by_step(key: str, identities: Sequence[dict]) -> bool:
    """What two checkpoints of one run differ in: the weights (their prompts are compared by same_prompt_texts),
    and a GGUF file's tokenizer, whose digest is the whole file's (rmjax.loading.identity), as its weights' is."""
    if key == "model.tokenizer":
        return all(isinstance(i.get("model"), dict) and i["model"].get("tokenizer") == i["model"].get("weights")
                   for i in identities)
    return key in ("model.weights", "prompts") or key.startswith("prompts.")


def _one_run(directory: str | Path, paths: Sequence[Path]) -> None:
    """The curve's points are one run's checkpoints scored alike: a table of another tokenizer, template, dtype,
    token set or reading drew one line through two models' ranks, exit 0 (a fault hunt)."""
    metas = {path.name: read_meta(path) or {} for path in paths}
    recorded = {name: meta.get("identity") for name, meta in metas.items()}
    known = {name: {**identity, "template": recorded_template(metas[name])}  # auto and chat: one rendering
             for name, identity in recorded.items() if isinstance(identity, dict)}
    if not known:
        return  # bare tables (the published ones): nothing records how they were scored
    first = next(iter(known))
    unknown = [name for name in recorded if name not in known]
    if unknown:
        raise UsageError(f"--bigtwo_checkpoints={directory}: {unknown[0]} records no identity (in a .meta.json beside "
                         f"it) and {first} does, so the two cannot be checked as one run's checkpoints scored alike; "
                         "score every checkpoint with experiments.sweep, or give only bare tables.")
    for name, identity in known.items():
        differ = [key for key in changed_keys(known[first], identity)
                  if not _differs_by_step(key, (known[first], identity))]
        if differ:
            raise UsageError(f"--bigtwo_checkpoints={directory}: {name} was scored with another {', '.join(differ)} "
                             f"than {first}; the curve needs one run's checkpoints scored alike (same tokenizer, "
                             "template, dtype and tokens): rescore it, or move it out of the folder.")


def bigtwo_checkpoints(steps: Sequence[tuple[int, ScoreTable]], lexicon: Lexicon,
                       prompts: Sequence[str] | None = None, collapse: str = "none") -> pd.DataFrame:
    """Per training step and prompt: median agency and communion ranks (and the test of `bigtwo_comparison`)."""
    prompts = list(prompts or common_prompts([t for _, t in steps]))
    rows = []
    for step, table in steps:
        category = lexicons.categorize(table.normalized, lexicon, normalized=True)
        for prompt in prompts:
            points = bigtwo_points(table, prompt, lexicon, category, collapse)
            rows.append({"step": step, "prompt": prompt, "collapse": collapse, **_compare(points)})
    return pd.DataFrame(rows)
