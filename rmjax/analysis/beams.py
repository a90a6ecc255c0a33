"""Beam / exhaustive N-token results (rmjax.search.beam) in the analysis: best and worst sequences per model and depth,
and how models agree on the sequences they share, aligned by decoded string (tokenizers differ)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from rmjax.analysis import data, model_metadata, stats
from rmjax.analysis.files import MODEL, Outputs, markdown
from rmjax.errors import InputFileError, UsageError
from rmjax.runs import results
from rmjax.text.visible import markdown_code


@dataclass(frozen=True)
class BeamTable:
    model: str
    frame: pd.DataFrame  # depth, direction, rank, ids, tokens, decoded, <prompts>
    path: Path

    @property
    def prompts(self) -> list[str]:
        return results.value_columns(self.frame)


def _is_beam(path: Path) -> bool:
    try:
        return results.is_beam_csv(path)
    except (UnicodeDecodeError, OSError):
        raise InputFileError(f"--scores={path} is not a text CSV (a binary file?); give a score table or beam "
                             "result.") from None


def split_paths(paths: Sequence[Path]) -> tuple[list[Path], list[Path]]:
    """(score tables, beam results) among the --scores files."""
    beams = [p for p in paths if _is_beam(p)]
    return [p for p in paths if p not in beams], beams


def load_beam_tables(paths: Sequence[Path], metadata: pd.DataFrame | None) -> list[BeamTable]:
    tables = []
    for path in paths:
        results.checked_input(path, ("beam",), "--scores")
        frame = results.read_beam_csv(path)
        values = frame[results.value_columns(frame)].to_numpy(np.float64)
        if not np.isfinite(values).all():
            raise InputFileError(f"{path}: NaN/Inf scores (written with --allow_nonfinite); rerun the beam.")
        tables.append(BeamTable(model_metadata.model_label(data.source_name(path), metadata, data.source_model(path)),
                                 frame, path))
    labels = [t.model for t in tables]
    twice = [t for t in tables if labels.count(t.model) > 1]
    if twice:  # their tables would share file names and their tau matrices a row
        raise UsageError(f"several beam results are for model {twice[0].model!r} "
                         f"({', '.join(str(t.path) for t in twice)}); pass one per model (the others in another run).")
    return tables


def scores_by_string(table: BeamTable, depth: int, prompt: str) -> pd.Series:
    """decoded string -> score at `depth` (both directions; the best score where two id sequences decode alike)."""
    rows = table.frame[table.frame["depth"] == depth]
    return rows.groupby("decoded")[prompt].max()


def tau_between(tables: Sequence[BeamTable], depth: int, prompt: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Kendall tau-b of every model pair on the strings both found (NaN under 3 shared), and how many they share."""
    labels = [t.model for t in tables]
    series = [scores_by_string(t, depth, prompt) for t in tables]
    own = [1.0 if len(s) >= stats.MIN_ITEMS and stats.ranks_something(s) else np.nan for s in series]
    tau = pd.DataFrame(np.diag(own), index=labels, columns=labels)
    shared = pd.DataFrame(np.diag([len(s) for s in series]), index=labels, columns=labels)
    for i, j in itertools.combinations(range(len(tables)), 2):
        common = series[i].index.intersection(series[j].index)
        shared.iloc[i, j] = shared.iloc[j, i] = len(common)
        pair = pd.DataFrame({"a": series[i][common], "b": series[j][common]})
        value = stats.kendall_tau_matrix(pair).iloc[0, 1] if len(common) >= stats.MIN_ITEMS else np.nan
        tau.iloc[i, j] = tau.iloc[j, i] = value
    return tau, shared


def _free_name(name: str, taken: Sequence[str]) -> str:
    """`name`, or `name` with underscores before it until no prompt has it (a prompt may be called `mean`)."""
    while name in taken:
        name = "_" + name
    return name


def beam_section(outputs: Outputs, tables: list[BeamTable], top: int) -> None:
    outputs.say("## N-token results (beam / exhaustive)", "")
    models = data.file_parts([t.model for t in tables], clashes=lambda slug: slug.startswith("kendall_tau"))
    for table in tables:
        mean = _free_name("mean", table.prompts)
        frame = table.frame.assign(**{mean: table.frame[table.prompts].mean(axis=1)})
        for (depth, direction), part in frame.groupby(["depth", "direction"], sort=True):
            shown = part.sort_values("rank").head(top)[["rank", "decoded", mean, *table.prompts]]
            outputs.table(f"beam_{models[table.model]}_depth{depth}_{direction}", shown)
            said = "mean" if mean == "mean" else f"{mean}: mean"
            listed = shown[["rank", "decoded", mean]].head(min(top, 10))
            outputs.say(f"{table.model}, {depth} tokens, {direction} ({said} over prompts; ␣: a space):", "",
                        markdown(listed.assign(decoded=listed["decoded"].map(markdown_code))), "")
    if len(tables) < 2:
        outputs.skip("beam Kendall tau: needs beam results of >= 2 models.")
        return
    prompts = [p for p in tables[0].prompts if all(p in t.prompts for t in tables)]
    outputs.skip_unshared("beam Kendall tau", {t.model: t.prompts for t in tables}, prompts,
                          "tau compares models on one prompt")
    if not prompts:
        return
    depths = sorted(set.intersection(*(set(t.frame["depth"]) for t in tables)))
    parts = data.file_parts(prompts, clashes=lambda slug: slug.endswith("_shared"))
    for depth, prompt in itertools.product(depths, prompts):
        tau, shared = tau_between(tables, depth, prompt)
        name = f"beam_kendall_tau_depth{depth}_{parts[prompt]}"
        outputs.matrix(name, tau)
        outputs.matrix(name + "_shared", shared)
        outputs.say(f"Kendall tau-b between models on the {depth}-token sequences both found for {prompt!r} "
                    f"(aligned by decoded string; how many they share: {name}_shared.csv):", "",
                    markdown(tau.rename_axis(MODEL).reset_index()), "")
