"""Loading score tables (their models labelled by rmjax.analysis.model_metadata) and aligning models by decoded string.

Models have different tokenizers and even one tokenizer's rows need not come in the same order,
so everything that compares models joins on the decoded string (`token_decoded`, or `text` for
tables of scored texts), never on the row index.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd

from rmjax.analysis.model_metadata import model_label
from rmjax.errors import InputFileError, MissingFileError, UsageError
from rmjax.runs import results, stages

TOKEN_KEYS = results.KEY_COLUMNS


@dataclass(frozen=True)
class ScoreTable:
    """One model's scores: key columns plus one float column per prompt."""

    model: str  # label used in tables and figures (nickname when the metadata knows the model)
    source: str  # model name from the .meta.json beside the CSV, else the file stem
    frame: pd.DataFrame
    string_column: str  # "token_decoded" or "text"
    path: Path | None = None
    # strings of the rows --roundtrip_only left out: tokens the sweep scored that a conversation tokenizes otherwise
    left_out: frozenset[str] = frozenset()

    @property
    def prompts(self) -> list[str]:
        return results.value_columns(self.frame)

    @property
    def strings(self) -> pd.Series:
        return self.frame[self.string_column]

    @cached_property
    def normalized(self) -> np.ndarray:
        """Each string stripped and lower-cased: the form joined to word lists."""
        return np.array([s.strip().lower() for s in self.strings.to_numpy(dtype=object)], dtype=object)


# what --scores reads (beam results: rmjax.analysis.beams); score_texts: a score result's kind before issue 23
SCORE_KINDS = ("sweep", "score", "score_texts")
LOGPROB_KINDS = ("logprobs", "next_token_logprobs")  # what --implicit_* read (the second: before issue 23)
BARE = "not written by rmjax, e.g. the published RMs' tables"  # why a table without .meta.json is read at all


def read_table(path: str | Path, kinds: Sequence[str] = SCORE_KINDS, flag: str = "--scores",
               bare: bool = True) -> tuple[pd.DataFrame, str]:
    """A score/log-prob table (token schema) or a scored-text table (`text, <prompts>`), NA parsing off.

    An rmjax result is read only when its .meta.json proves it whole and of one of `kinds`; a table without
    one (the published RMs') only where `bare`, with a warning. A table with NaN/Inf scores (written with
    --allow_nonfinite) is refused, naming its rows."""
    path = Path(path)
    results.checked_input(path, kinds, flag, bare=BARE if bare else None)
    try:
        with open(path, encoding="utf-8") as f:
            header = f.readline()
        if header.lstrip().startswith(('"text"', "text")):
            frame, string_column = results.read_scores_csv(path), "text"
        else:
            frame, string_column = results.read_scores_csv(path), "token_decoded"
    except (ValueError, UnicodeDecodeError, pd.errors.ParserError) as error:
        raise InputFileError(f"{path}: not a readable score table ({' '.join(str(error).split())[:200]}).") from None
    missing = [c for c in TOKEN_KEYS if c not in frame.columns] if string_column == "token_decoded" else []
    if missing:
        raise UsageError(f"{path}: not a score table (missing columns {missing}); expected "
                         "token_id, token_name, token_decoded, <one column per prompt> or text, <prompts>.")
    ids = frame.get("token_id") if string_column == "token_decoded" else None
    if ids is not None and not (pd.api.types.is_integer_dtype(ids) and (ids >= 0).all()):
        # 'x' or '' stopped a top-bottom table in a traceback, and '1.5' was written there as 1: as written
        ids = pd.read_csv(path, usecols=["token_id"], dtype=str, keep_default_na=False)["token_id"]
        bad_ids = ids[~ids.str.fullmatch(r"[0-9]+")]
        if len(bad_ids):
            raise InputFileError(f"{path}: token_id {bad_ids.iloc[0]!r} (row {bad_ids.index[0] + 1}) is not a token "
                                 f"id; {len(bad_ids)} row(s) have no whole non-negative number there.")
    if ids is not None and frame["token_id"].duplicated().any():  # a table without .meta.json is not digest-checked
        twice = frame["token_id"][frame["token_id"].duplicated()]
        raise InputFileError(f"{path}: token_id {twice.iloc[0]} is in {int((frame['token_id'] == twice.iloc[0]).sum())}"
                             f" rows ({twice.nunique()} id(s) repeated); a sweep scores each token once, so its rows "
                             "would count twice. Remove the repeated rows (a table appended to itself?).")
    values = frame[results.value_columns(frame)].to_numpy(np.float64)
    bad = ~np.isfinite(values).all(axis=1)
    if bad.any():
        rows = frame[bad].head(5)
        label = (lambda r: f"token {r['token_id']} {r['token_decoded']!r}") if string_column == "token_decoded" \
            else (lambda r: f"text {r['text']!r}")
        raise InputFileError(
            f"{path}: {int(bad.sum())} rows have NaN/Inf scores (first: "
            f"{'; '.join(label(r) for _, r in rows.iterrows())}); it was written with --allow_nonfinite. Fix the "
            "model and rerun the sweep, or sweep the other tokens alone (--vocab_file or --token_ids without them; "
            "a table edited by hand no longer matches its .meta.json).")
    return frame, string_column


def source_model(path: str | Path) -> str | None:
    """The model the .meta.json beside the CSV names, as the job was given it (None without one)."""
    meta = results.read_meta(Path(path))
    model = meta.get("model") if meta is not None else None
    return model if isinstance(model, str) and model else None


def model_name(model: str, parts: int = 1) -> str:
    """A model's label: a builtin name as it is, a folder or GGUF file by its last `parts` path parts (a .gguf
    suffix dropped), so one model gets one label however its path was written."""
    if not ("/" in model or model.startswith((".", "~")) or model.endswith(".gguf")):
        return model
    path = Path(model.rstrip("/"))
    name = "/".join([*path.parent.parts[max(0, len(path.parent.parts) - parts + 1):], path.name])
    return name[:-len(".gguf")] if name.endswith(".gguf") else name


def source_name(path: str | Path) -> str:
    """Model name: the `model_name` of the model the .meta.json beside the CSV names, else the file's stem."""
    model = source_model(path)
    return Path(path).stem if model is None else model_name(model)


def distinct_names(models: Sequence[str | None], names: list[str]) -> list[str]:
    """`names` with the models that share one but are not one model (/x/a/model and /x/b/model) named by more of
    their paths, until they differ."""
    names = list(names)
    for parts in range(2, 64):
        clash = [i for i, name in enumerate(names) if models[i] is not None and len(
            {models[j] for j, other in enumerate(names) if other == name}) > 1]
        if not clash:
            break
        for i in clash:
            names[i] = model_name(models[i], parts)
    return names


def candidate_subset(path: str | Path | None) -> str | None:
    """How a token sweep's rows were chosen where they are not its model's whole vocabulary (--limit, --token_ids,
    --vocab_file), from its .meta.json: its statistics are over those tokens only. None for a whole-vocabulary
    sweep, another kind of table or one without a .meta.json."""
    meta = results.read_meta(Path(path)) if path is not None else None
    identity = meta.get("identity") if isinstance(meta, dict) else None
    subset = stages.sweep_subset(identity if isinstance(identity, dict) else None)
    chosen = [f"--limit={value}" if key == "limit" else f"--{key}" for key, value in subset.items()]
    count = meta.get("n_candidates") if chosen else None
    return (" and ".join(chosen) + (f": {count:,} tokens" if isinstance(count, int) else "")) if chosen else None


def source_prompts(path: str | Path | None) -> dict[str, str]:
    """Prompt name -> prompt text, from the `prompts` of the .meta.json beside the CSV ({} without one)."""
    if path is None:
        return {}
    meta = results.read_meta(path)
    prompts = meta.get("prompts") if meta is not None else None
    if not isinstance(prompts, dict):
        return {}
    return {str(name): text for name, text in prompts.items() if isinstance(text, str)}


def _companions(found: Sequence[Path]) -> set[str]:
    """Names of the CSVs that a result's .meta.json records beside itself (a beam's .completions.csv): part of
    that result, not a table of their own."""
    names: set[str] = set()
    for path in found:
        files = (results.read_meta(path) or {}).get("files")
        if isinstance(files, dict):
            names.update(key for key in files if key != path.name and "/" not in key)
    return names


def expand_paths(spec: str | Path | Sequence[str | Path]) -> list[Path]:
    """Score CSVs from a directory (every *.csv in it), a file, or a list/comma-separated mix of both."""
    items = spec.split(",") if isinstance(spec, str) else [spec] if isinstance(spec, Path) else list(spec)
    paths: list[Path] = []
    for item in items:
        item = Path(str(item).strip())
        if item.is_dir():
            found = sorted(p for p in item.glob("*.csv") if p.is_file())
            companions = _companions(found)  # once per folder: each reads every .meta.json there
            paths += [p for p in found if p.name not in companions]
        elif item.is_file():
            paths.append(item)
        else:
            raise MissingFileError(f"score table or directory {item} not found.")
    if not paths:
        raise MissingFileError(f"no *.csv score tables in {spec}.")
    return paths


def roundtrip_rows(frame: pd.DataFrame, string_column: str, path: Path) -> pd.DataFrame:
    """Only the rows whose token-mode sequence is what a real conversation gives (`roundtrip` = 1).
    Scored-text tables are real conversations already and are kept whole."""
    if string_column == "text":
        return frame
    if results.ROUNDTRIP not in frame.columns:
        raise UsageError(f"{path}: no roundtrip column (written by the published pipeline or an older rmjax); "
                         "rerun the sweep with this rmjax, or drop --roundtrip_only.")
    kept = frame[frame[results.ROUNDTRIP] == 1].reset_index(drop=True)
    if kept.empty:  # every statistic of it would be NaN (moments, ranks), reported as if computed
        raise InputFileError(f"{path}: --roundtrip_only leaves none of its {len(frame)} rows (no token has roundtrip "
                             f"= 1), so prompts {', '.join(results.value_columns(frame))} have no score to analyze; "
                             "drop --roundtrip_only or leave this table out.")
    return kept


def load_score_tables(spec: str | Path | Sequence[str | Path], metadata: pd.DataFrame | None = None,
                      roundtrip_only: bool = False, kinds: Sequence[str] = SCORE_KINDS, flag: str = "--scores",
                      bare: bool = True) -> list[ScoreTable]:
    """Every score table in `spec`, labelled by nickname when `metadata` knows the model, in the
    metadata's order (then the others in file order); with `roundtrip_only`, only the tokens a real
    conversation produces."""
    tables = []
    for path in expand_paths(spec):
        frame, string_column = read_table(path, kinds, flag, bare)
        whole = frozenset(frame[string_column])
        if roundtrip_only:
            frame = roundtrip_rows(frame, string_column, path)
        tables.append((path, frame, string_column, whole - frozenset(frame[string_column])))
    models = [source_model(path) for path, *_ in tables]
    sources = distinct_names(models, [source_name(path) for path, *_ in tables])
    tables = [ScoreTable(model_label(source, metadata, model), source, frame, string_column, path, left_out)
              for source, model, (path, frame, string_column, left_out) in zip(sources, models, tables, strict=True)]
    if metadata is not None:
        position = {nickname: i for i, nickname in enumerate(metadata["nickname"])}
        tables.sort(key=lambda t: position.get(t.model, len(position)))
    tables = _told_apart(tables)
    labels = [t.model for t in tables]
    duplicated = sorted({label for label in labels if labels.count(label) > 1})
    if duplicated:
        raise UsageError(f"several score tables are for the same model {duplicated}; pass one file per model: "
                         "sweep a model once with all its prompts (--prompts=a,b,…) for one table of them, or "
                         "analyze each table on its own.")
    _refuse_copies(tables)
    stages.same_prompt_texts([(flag, t.path) for t in tables])  # one prompt name, one text, in every table
    return tables


def _told_apart(tables: list[ScoreTable]) -> list[ScoreTable]:
    """Tables whose models were typed alike (`--model=rm` in two folders) but whose records name different model
    contents are different models: each named by its table's path too. Tables of one content stay alike (refused
    as one model's, by the caller)."""
    def content(table: ScoreTable) -> str | None:
        identity = (results.read_meta(table.path) or {}).get("identity") if table.path is not None else None
        model = identity.get("model") if isinstance(identity, dict) else None
        if not isinstance(model, dict):
            return None  # how a version of rmjax read the weights ("reading") is no other model
        return json.dumps({k: v for k, v in model.items() if k != "reading"}, sort_keys=True)

    contents = [content(t) for t in tables]  # each record read once
    out = []
    for table in tables:
        alike = [c for t, c in zip(tables, contents, strict=True) if t.model == table.model]
        apart = len(alike) > 1 and None not in alike and len(set(alike)) == len(alike)
        out.append(replace(table, model=f"{table.model} ({table.path})") if apart else table)
    return out


def _refuse_copies(tables: Sequence[ScoreTable]) -> None:
    """Two tables of the same rows and scores are one model's result twice (a copy without its .meta.json): as two
    models they agree perfectly (tau 1) and weigh double in every mean."""
    seen: dict[tuple, Path | None] = {}
    for table in tables:
        key = (len(table.frame), tuple(table.frame.columns),
               int(pd.util.hash_pandas_object(table.frame, index=False).sum()))
        if key in seen:
            raise UsageError(f"{seen[key]} and {table.path} hold the same rows and scores: one model's result given "
                             "twice (a copy?); pass it once.")
        seen[key] = table.path


def slugify(text: str, max_length: int = 60) -> str:
    """File-name friendly form of a prompt or model name."""
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")[:max_length].rstrip("_") or "x"


def file_parts(names: Iterable[str], clashes: Callable[[str], bool] | None = None) -> dict[str, str]:
    """Each prompt or model name -> the part of the file names it gets, one to one, so no table replaces another.

    A name keeps its slug when no other name of the set has that slug (or the name is the slug itself:
    `a_b` beside `a-b`); the others get the slug plus `-` and 8 hex digits of the name's sha256 (a bare slug
    never holds `-`). `clashes` marks slugs that the family's prefix would turn into another output's name
    (e.g. `bigtwo_` + `checkpoints`); those are hashed too."""
    names = list(dict.fromkeys(names))
    by_slug: dict[str, list[str]] = {}
    for name in names:
        by_slug.setdefault(slugify(name), []).append(name)
    parts = {}
    for slug, group in by_slug.items():
        for name in group:
            plain = (len(group) == 1 or name == slug) and not (clashes and clashes(slug))
            digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
            parts[name] = slug if plain else f"{slug}-{digest}"
    return parts


def common_prompts(tables: Sequence[ScoreTable]) -> list[str]:
    """Prompt columns every table has, in the first table's order."""
    shared = set.intersection(*(set(t.prompts) for t in tables))
    return [p for p in tables[0].prompts if p in shared]


def unique_strings(table: ScoreTable) -> set[str]:
    """Decoded strings that occur exactly once in this model's table."""
    counts = table.strings.value_counts()
    return set(counts.index[counts == 1])


def shared_vocabulary(tables: Sequence[ScoreTable]) -> list[str]:
    """Decoded strings present in every model, minus any string duplicated within some model (sorted)."""
    return sorted(set.intersection(*(unique_strings(t) for t in tables)))


def aligned_scores(tables: Sequence[ScoreTable], prompt: str, vocabulary: Sequence[str]) -> pd.DataFrame:
    """Scores on `vocabulary` (strings unique within each model), one column per model, joined by string."""
    columns = {}
    for t in tables:
        series = t.frame.set_index(t.string_column)[prompt]
        series = series[~series.index.duplicated(keep=False)]
        aligned = series.reindex(list(vocabulary))
        if aligned.isna().any():
            missing = list(aligned.index[aligned.isna()][:5])
            raise UsageError(f"{t.model}: no unique score for strings {missing} of the shared vocabulary.")
        columns[t.model] = aligned.to_numpy(np.float64)
    return pd.DataFrame(columns, index=pd.Index(list(vocabulary), name="token_decoded"))


def dedupe_keep_max(table: ScoreTable, prompts: Sequence[str]) -> pd.DataFrame:
    """One row per decoded string, each prompt column holding the highest value over its duplicates."""
    return table.frame.groupby(table.string_column, sort=True)[list(prompts)].max()


COLLAPSE_MODES = ("none", "max", "mean")


def collapse_variants(points: pd.DataFrame, how: str, word: str = "word", score: str = "score") -> pd.DataFrame:
    """One observation per normalized word (`word`), or every variant token with 'none'.

    'none' counts `love`, ` love`, `Love` and ` LOVE` as four observations (what the papers' tables
    list); 'max' keeps the variant with the highest score; 'mean' averages the variants' numeric
    columns (the other columns are the same for every variant of a word, e.g. its category)."""
    if how not in COLLAPSE_MODES:
        raise UsageError(f"--collapse_variants={how}: must be one of {', '.join(COLLAPSE_MODES)}.")
    if how == "none" or points.empty:
        return points.reset_index(drop=True)
    if how == "max":
        best = points.sort_values(score, ascending=False, kind="stable").drop_duplicates(word)
        return best.sort_values(word, kind="stable").reset_index(drop=True)
    numeric = [c for c in points.columns if c != word and pd.api.types.is_numeric_dtype(points[c])]
    first = [c for c in points.columns if c not in numeric and c != word]
    merged = points.groupby(word, sort=True, as_index=False).agg({**{c: "mean" for c in numeric},
                                                                  **{c: "first" for c in first}})
    return merged[list(points.columns)]
