"""EloEverything: human Elo ratings of 7,530 items against the ten RMs' scores for each item.

Each CSV (`elo_rank, elo_score, name, elo_matches, <one column per model>`) is one prompt; its file
name is the prompt without the question mark. Items are joined across prompts by `name`.

Score tables given with `--scores` (sweeps, or experiments.score tables of texts) join the published
models: `add_score_tables` finds the column that scores each EloEverything prompt (by prompt text) and
the row that scores each item (`item_tokens`); a model scores only some items (those that are a single
token of its tokenizer), and every statistic of such a model is over the items it scores.
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
from rmjax.analysis.data import ScoreTable, file_parts, source_prompts
from rmjax.analysis.model_metadata import model_label
from rmjax.errors import InputFileError, MissingFileError, UsageError
from rmjax.runs import results
from rmjax.text import prompts as prompt_lib

HUMAN = "Human"
ITEM_COLUMNS = ["elo_rank", "elo_score", "name", "elo_matches"]
USER_MARK = " (--scores)"  # appended to a --scores model whose label is already a published model's
# Names that ranks_table and the tau matrices give columns of their own: no model may be called so.
RESERVED = (HUMAN, "human_elo", "median_model", "median_model_rank_minus_human", "model")
# How an item is found in a score table (item_tokens): the first three score it, the others do not.
MATCHED = ("exact", "leading_space", "text")
UNMATCHED = ("not_a_single_token", "not_roundtrip", "ambiguous", "absent")
MIN_ITEMS = stats.MIN_ITEMS  # an Elo file of fewer items is refused; a model scoring fewer of them gets NaN


@dataclass(frozen=True)
class EloPrompt:
    prompt: str  # the question, with its question mark
    slug: str  # file-name friendly form of the prompt
    items: pd.DataFrame  # index: item name; columns elo_score, elo_rank, elo_matches
    scores: pd.DataFrame  # index: item name; one column per model (labelled); NaN where a model has no score
    user_models: tuple[str, ...] = ()  # the columns that came from --scores (after the published ones)

    @property
    def models(self) -> list[str]:
        return list(self.scores.columns)


def load_elo(directory: str | Path, metadata: pd.DataFrame | None = None) -> list[EloPrompt]:
    """Every EloEverything CSV in `directory`, model columns renamed to nicknames when known."""
    paths = sorted(p for p in Path(directory).glob("*.csv") if p.is_file())  # a FIFO named x.csv would hang the read
    if not paths:
        raise MissingFileError(f"no EloEverything *.csv files in {directory}.")
    prompts = []
    parts = file_parts(p.stem for p in paths)  # `What is best` and `what is best?` get file names of their own
    for path in paths:
        try:
            frame = pd.read_csv(path, keep_default_na=False, na_filter=False, dtype={"name": str}, encoding="utf-8")
        except (ValueError, UnicodeDecodeError, pd.errors.ParserError) as error:
            raise InputFileError(f"--elo: {path} is not a readable CSV ({' '.join(str(error).split())[:200]}).") \
                from None
        missing = [c for c in ITEM_COLUMNS if c not in frame.columns]
        if missing:
            raise UsageError(f"{path}: missing EloEverything columns {missing}.")
        if len(frame) < MIN_ITEMS:  # one item: every tau, rho, p and z NaN, exit 0
            raise InputFileError(f"--elo: {path} has {len(frame)} item{'s' * (len(frame) != 1)}"
                                 f"{' (a header only)' if frame.empty else ''}; a rank correlation needs at least "
                                 f"{MIN_ITEMS}.")
        if frame["name"].duplicated().any():
            raise UsageError(f"{path}: duplicated item names {list(frame['name'][frame['name'].duplicated()][:5])}.")
        frame = frame.set_index("name")
        model_columns = [c for c in frame.columns if c not in ITEM_COLUMNS]
        labels = [model_label(c, metadata) for c in model_columns]
        reserved = [c for c, label in zip(model_columns, labels, strict=True)
                    if label.casefold() in {r.casefold() for r in RESERVED}]
        if reserved:  # its columns (e.g. human_z) would overwrite the tables' own ones
            raise UsageError(f"{path}: model column {reserved[0]!r} is named like a column the EloEverything tables "
                             f"make ({', '.join(RESERVED)}); rename that column.")
        twice = sorted({label for label in labels if labels.count(label) > 1})
        if twice:
            raise UsageError(f"{path}: several model columns are model {twice[0]!r} (by name or --models_yaml "
                             "nickname); keep one.")
        try:
            scores = frame[model_columns].astype(np.float64)
            items = frame[["elo_score", "elo_rank", "elo_matches"]].astype(np.float64)
        except ValueError as error:
            raise InputFileError(f"--elo: {path} has a value that is not a number ({error}).") from None
        # an item's human rating is never missing (a 'nan' cell made every statistic NaN, exit 0); a model's score
        # may be NaN (an item it did not score), never ±Inf (dropped from τ as unscored, unsaid)
        bad = [(column, frame.index[i]) for column, values in (*items.items(), *scores.items())
               for i in np.flatnonzero(~np.isfinite(values.to_numpy()) if column in items else np.isinf(values))]
        if bad:
            raise InputFileError(f"--elo: {path}: column {bad[0][0]!r} of item {bad[0][1]!r} is not a finite number "
                                 f"({len(bad)} such cells); fix or remove them.")
        scores.columns = labels
        prompts.append(EloPrompt(path.stem + "?", parts[path.stem], items, scores))
    return prompts


def _covered(values: np.ndarray, fn) -> np.ndarray:
    """`fn` over the finite values (the items a model scores), NaN elsewhere."""
    covered = np.isfinite(values)
    out = np.full(len(values), np.nan)
    if covered.any():
        out[covered] = fn(values[covered])
    return out


def ranks_table(elo_prompt: EloPrompt) -> pd.DataFrame:
    """Per item: human Elo, z-score and rank, each model's score, z-score and rank (1 = best, ties
    averaged), and the median rank over the published models only (humans excluded). A --scores model, or a
    published one that leaves items unscored, is z-scored and ranked among the items it scores (NaN elsewhere) and
    is not part of the median: its ranks run over fewer items, and the median of a NaN was NaN."""
    human = elo_prompt.items["elo_score"].to_numpy(np.float64)
    out = pd.DataFrame({"name": elo_prompt.items.index, "human_elo_score": human,
                        "human_z": stats.z_scores(human), "human_rank": stats.descending_ranks(human)})
    model_ranks = []
    for model in elo_prompt.models:
        values = elo_prompt.scores[model].to_numpy(np.float64)
        ranks = _covered(values, stats.descending_ranks)
        if model not in elo_prompt.user_models and np.isfinite(values).all():
            model_ranks.append(ranks)
        out[f"{model}_score"] = values
        out[f"{model}_z"] = _covered(values, stats.z_scores)
        out[f"{model}_rank"] = ranks
    out["median_model_rank"] = np.median(np.stack(model_ranks), axis=0) if model_ranks else np.nan
    out["median_model_rank_minus_human_rank"] = out["median_model_rank"] - out["human_rank"]
    return out


def tau_matrix(elo_prompt: EloPrompt) -> pd.DataFrame:
    """Kendall tau-b between humans (Elo score) and every model, over all items; a pair with a --scores
    model over the items both score."""
    frame = pd.concat([elo_prompt.items["elo_score"].rename(HUMAN), elo_prompt.scores], axis=1)
    complete = [c for c in frame.columns if frame[c].notna().all()]
    if len(complete) == len(frame.columns):
        return stats.kendall_tau_matrix(frame)
    matrix = stats.kendall_tau_matrix(frame[complete]).reindex(index=frame.columns, columns=frame.columns)
    for a, b in itertools.combinations(frame.columns, 2):
        if a not in complete or b not in complete:
            pair = stats.kendall_tau_matrix(frame[[a, b]].dropna())
            matrix.loc[a, b] = matrix.loc[b, a] = pair.iloc[0, 1]
    for column in frame.columns:
        matrix.loc[column, column] = 1.0 if stats.ranks_something(frame[column]) else np.nan
    return matrix


def elo_training(source: str) -> str | None:
    """The EloEverything data a model was trained on (its training recipe's `elo`: "builtin", "builtin:<prompt>"
    or a CSV), from a builtin RM's record, or a folder's rmjax_training.json (train_rm --export) or
    rmjax_export.json (experiments.export, which carries the recipe of what it exported); None when it records
    none (a published RM, or one trained on other pairs)."""
    import json
    from importlib import resources

    candidates = [resources.files("rmjax") / "builtin" / f"{source}.json", Path(source) / "rmjax_training.json",
                  Path(source) / "rmjax_export.json"]
    for record in candidates:
        try:
            recipe = json.loads(record.read_text()).get("recipe") or {}
        except (OSError, ValueError):
            continue
        return recipe.get("elo") or None
    return None


def table_training(table: ScoreTable) -> str | None:
    """The EloEverything data the table's model was trained on: what its .meta.json records (the model's recipe,
    read where the job loaded it, wherever that was run from); for a result written before the meta recorded it,
    `elo_training` of the model it names."""
    meta = results.read_meta(table.path) if table.path is not None else None
    if isinstance(meta, dict) and "training" in meta:
        recipe = meta["training"]
        return (recipe.get("elo") or None) if isinstance(recipe, dict) else None
    model = meta.get("model") if isinstance(meta, dict) else None
    return elo_training(model if isinstance(model, str) and model else table.source)


def human_agreement(elo_prompts: Sequence[EloPrompt], trained: dict[str, str | None] | None = None) -> pd.DataFrame:
    """Kendall tau-b and Spearman rho of each model's scores with the human Elo scores, per prompt, over
    the items the model scores (all of them for a published model); `source` is published or --scores;
    `trained_on_elo`: the EloEverything data the model was trained on (`trained[model]`, `table_training` of each
    --scores table by its label here; empty for none, and for every published model), whose τ is then partly
    in-sample."""
    trained = trained or {}
    rows = []
    for ep in elo_prompts:
        human = ep.items["elo_score"].to_numpy(np.float64)
        for model in ep.models:
            values = ep.scores[model].to_numpy(np.float64)
            covered = np.isfinite(values)
            tau, rho = _tau_and_rho(human[covered], values[covered])
            rows.append({"prompt": ep.prompt, "model": model,
                         "source": "--scores" if model in ep.user_models else "published",
                         "n_items": int(covered.sum()),
                         "kendall_tau": tau[0], "kendall_p": tau[1], "spearman_rho": rho[0], "spearman_p": rho[1],
                         "trained_on_elo": (trained.get(model) if model in ep.user_models else None) or ""})
    return pd.DataFrame(rows)


def _tau_and_rho(a: np.ndarray, b: np.ndarray) -> tuple[tuple[float, float], tuple[float, float]]:
    """((Kendall tau-b, p), (Spearman rho, p)); NaN over fewer than MIN_ITEMS items (two gave tau -1 or +1 beside
    the published models' thousands)."""
    if len(a) < MIN_ITEMS:
        return (np.nan, np.nan), (np.nan, np.nan)
    tau, rho = scipy_stats.kendalltau(a, b, variant="b"), scipy_stats.spearmanr(a, b)
    return (float(tau.statistic), float(tau.pvalue)), (float(rho.statistic), float(rho.pvalue))


def cross_prompt_tau(elo_prompts: Sequence[EloPrompt]) -> pd.DataFrame:
    """Kendall tau-b of each model with itself between every pair of prompts (items joined by name)."""
    rows = []
    for a, b in itertools.combinations(elo_prompts, 2):
        names = a.scores.index.intersection(b.scores.index)
        for model in a.models:
            if model not in b.models:
                continue
            pair = pd.concat([a.scores.loc[names, model], b.scores.loc[names, model]], axis=1).dropna()
            (tau, _), _ = _tau_and_rho(pair.iloc[:, 0].to_numpy(), pair.iloc[:, 1].to_numpy())
            rows.append({"model": model, "prompt_a": a.prompt, "prompt_b": b.prompt, "n_items": len(pair),
                         "kendall_tau": tau})
    return pd.DataFrame(rows)


def human_vs_median_model(ranks: pd.DataFrame, k: int = 20) -> pd.DataFrame:
    """The k items humans rank most above and most below the median model rank (median over the
    models only; humans are not part of the median)."""
    diff = ranks["median_model_rank_minus_human_rank"]
    # each side only its own sign: with few positive differences, negative ones filled "humans rank higher"
    higher = ranks.loc[diff[diff > 0].sort_values(ascending=False, kind="mergesort").index[:k]]
    lower = ranks.loc[diff[diff < 0].sort_values(ascending=True, kind="mergesort").index[:k]]
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


def all_models(elo_prompts: Sequence[EloPrompt]) -> list[str]:
    """Every model of any prompt, in order of first appearance (the published ones first)."""
    return list(dict.fromkeys(m for ep in elo_prompts for m in ep.models))


def _same_text(a: str, b: str) -> bool:
    return " ".join(a.split()) == " ".join(b.split())


def prompt_columns(table: ScoreTable, elo_prompts: Sequence[EloPrompt],
                   twins: dict[str, str] | None = None) -> dict[str, str]:
    """EloEverything prompt -> the table's column that scores it, matched by prompt text: the text the
    .meta.json beside the table gives for the column, else the builtin prompt of that name (greatest is
    'What, in one word, is the greatest thing ever?'), else the column name itself (which may then also
    be the file stem, without the question mark). Two columns of one prompt (two names of one text) serve as one
    where their rewards agree (`twins`: the second -> the first), and are refused where they differ."""
    declared = source_prompts(table.path)
    builtin = prompt_lib.builtin_prompts()
    out: dict[str, str] = {}
    for column in table.prompts:
        text = declared.get(column) or builtin.get(column)
        for ep in elo_prompts:
            if text:
                same = _same_text(text, ep.prompt)
            else:
                same = _same_text(column, ep.prompt) or _same_text(column, ep.prompt.removesuffix("?"))
            if same and ep.prompt in out:  # two names of one text (greatest, greatest_ever_one): the first serves
                # alike: within 1e-4 of the column's spread (float32 forwards of one conversation differ by far
                # less; another prompt's rewards by about the spread)
                first, second = (table.frame[c].to_numpy(np.float64) for c in (out[ep.prompt], column))
                if np.abs(first - second).max(initial=0.0) > 1e-4 * np.std(first):
                    raise InputFileError(f"{table.path or table.model}: columns {out[ep.prompt]!r} and {column!r} "
                                         f"both score the EloEverything prompt {ep.prompt!r}, with other rewards; "
                                         "keep the one you mean.")
                if twins is not None:
                    twins[column] = out[ep.prompt]
            elif same:
                out[ep.prompt] = column
    return out


def item_tokens(table: ScoreTable, names: Sequence[str]) -> pd.DataFrame:
    """Which row of `table` scores each EloEverything item as the whole response (the item text is what
    the published pipeline put in the template): columns name, match, row (-1: none), token_id (-1: none
    or a text table) and string (the row's decoded token or text).

    A table of scored texts (experiments.score): the row whose text is the item ('text'; else 'absent').
    A sweep (one token per row): the token that decodes to the item ('exact'), else the one that decodes
    to ' ' + item ('leading_space': what `Assistant: item` on the plain template and the chat templates
    that trim the response tokenize the item to). When the sweep has a `roundtrip` column only tokens with
    roundtrip = 1 count: the token is then exactly what the conversation with that response tokenizes to.
    Otherwise: 'not_a_single_token' (no row decodes to either: the item is several tokens, or a token the
    sweep did not score), 'not_roundtrip' (a token decodes to it, but a conversation tokenizes it
    otherwise) or 'ambiguous' (several rows decode to it: a table without a roundtrip column)."""
    frame = table.frame
    strings = frame[table.string_column].to_numpy(dtype=object)
    is_text = table.string_column == "text"
    eligible = np.ones(len(frame), bool)
    if not is_text and results.ROUNDTRIP in frame.columns:
        eligible = frame[results.ROUNDTRIP].to_numpy() == 1
    rows_of: dict[str, list[int]] = {}
    for i in np.flatnonzero(eligible):
        rows_of.setdefault(strings[i], []).append(int(i))
    present = set(strings) | table.left_out  # --roundtrip_only's rows: not_roundtrip, not missing
    variants = (("text", ""),) if is_text else (("exact", ""), ("leading_space", " "))
    ids = frame["token_id"].to_numpy(np.int64) if "token_id" in frame.columns else None
    out = []
    for name in names:
        match, row = None, -1
        for kind, prefix in variants:
            rows = rows_of.get(prefix + name, [])
            if len(rows) == 1:
                match, row = kind, rows[0]
            elif len(rows) > 1:
                match = "ambiguous"
            if match:
                break
        if match is None:
            match = "absent" if is_text else "not_roundtrip" if any(p + name in present for _, p in variants) \
                else "not_a_single_token"
        out.append({"name": name, "match": match, "row": row,
                    "token_id": int(ids[row]) if row >= 0 and ids is not None else -1,
                    "string": str(strings[row]) if row >= 0 else ""})
    return pd.DataFrame(out, columns=["name", "match", "row", "token_id", "string"])


@dataclass(frozen=True)
class ScoresAdded:
    prompts: list[EloPrompt]  # the EloEverything prompts with the --scores models as extra columns
    coverage: pd.DataFrame  # per (model, prompt): the column used and how many items each match kind found
    items: pd.DataFrame  # per (model, prompt, item): how the item was found (item_tokens)
    notes: list[str]  # renamed models, prompts without an EloEverything counterpart
    labels: list[str | None]  # each table's label in these tables (renamed past a published model's); None: not added


def add_score_tables(elo_prompts: Sequence[EloPrompt], tables: Sequence[ScoreTable]) -> ScoresAdded:
    """Each score table (--scores) as one more model of the EloEverything prompts its columns score (by
    prompt text, `prompt_columns`), with a score for the items one of its rows scores (`item_tokens`) and
    NaN for the others, which are counted in `coverage`. A model is labelled as in the score-table
    analyses (nickname, else the .meta.json model, else the file stem); a label that is already a
    published model's (or Human) gets USER_MARK appended, so the two are never mixed up."""
    taken = {m.casefold() for m in all_models(elo_prompts)}
    taken |= {name.casefold() for name in RESERVED}  # ranks_table's and the tau matrices' own columns
    prompts = {ep.prompt: ep for ep in elo_prompts}
    coverage, items, notes, labels = [], [], [], []
    for table in tables:
        labels.append(None)
        label = table.model
        if label.casefold() in taken:
            label += USER_MARK
            notes.append(f"{table.model} ({table.path or table.source}) is also a published model (or a reserved "
                         f"name) in the EloEverything tables; its --scores column is labelled {label!r}.")
        if label.casefold() in taken:
            raise UsageError(f"--scores model {table.model!r} ({table.path}): both {table.model!r} and {label!r} are "
                             "already models of the EloEverything tables; rename the score table.")
        twins: dict[str, str] = {}
        columns = prompt_columns(table, elo_prompts, twins)
        unused = [c for c in table.prompts if c not in columns.values() and c not in twins]
        if not columns:
            notes.append(f"{label} ({table.path or table.source}): none of its prompts ({', '.join(unused)}) is an "
                         "EloEverything prompt, so it is not in the EloEverything tables.")
            continue
        taken.add(label.casefold())
        labels[-1] = label
        if unused:
            notes.append(f"{label}: prompt columns {', '.join(unused)} are not EloEverything prompts (not used "
                         "there).")
        for twin, first in twins.items():
            notes.append(f"{label}: prompt column {twin} scores the prompt {first} does, alike; {first} is used.")
        if table.string_column != "text" and results.ROUNDTRIP not in table.frame.columns:
            notes.append(f"{label}: no roundtrip column, so items are matched by decoded string alone (exact, then "
                         "leading space) whatever the template; rerun the same sweep command with this rmjax to "
                         "add the column (no rescoring).")
        for prompt, column in columns.items():
            ep = prompts[prompt]
            found = item_tokens(table, list(ep.scores.index))
            values = table.frame[column].to_numpy(np.float64)
            row = found["row"].to_numpy()
            scores = ep.scores.copy()
            scores[label] = np.where(row >= 0, values[np.maximum(row, 0)], np.nan)
            prompts[prompt] = EloPrompt(ep.prompt, ep.slug, ep.items, scores, (*ep.user_models, label))
            counts = found["match"].value_counts()
            coverage.append({"model": label, "scores_file": str(table.path or table.source), "column": column,
                             "prompt": prompt, "n_items": len(found), "n_scored": int((row >= 0).sum()),
                             **{kind: int(counts.get(kind, 0)) for kind in (*MATCHED, *UNMATCHED)}})
            items.append(found.drop(columns="row").assign(model=label, prompt=prompt))
    item_frame = (pd.concat(items, ignore_index=True)[["model", "prompt", "name", "match", "token_id", "string"]]
                  if items else pd.DataFrame(columns=["model", "prompt", "name", "match", "token_id", "string"]))
    return ScoresAdded([prompts[ep.prompt] for ep in elo_prompts], pd.DataFrame(coverage), item_frame, notes, labels)
