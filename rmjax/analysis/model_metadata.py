"""The models' metadata (--models_yaml: nickname, base model, family, size, RewardBench rank) and finding a
table's model in it by HF id, nickname or a file-name form of the id."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from rmjax.errors import InputFileError, UsageError
from rmjax.text import yamlfile


def parameters_in_billions(size: str | float | int | None) -> float:
    """'27B' -> 27.0, '270M' -> 0.27; a bare number is taken as billions."""
    if size is None:
        return float("nan")
    if isinstance(size, int | float) and not isinstance(size, bool) and np.isfinite(size) and size > 0:
        return float(size)
    # one decimal number ('1.2.3B' passed `[0-9.]+` and ended in float()'s traceback)
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([KMBT]?)\s*", str(size), flags=re.IGNORECASE)
    if not match:
        raise UsageError(f"cannot read a parameter count from size {size!r} (expected e.g. 8B or 270M).")
    scale = {"": 1.0, "K": 1e-6, "M": 1e-3, "B": 1.0, "T": 1e3}[match.group(2).upper()]
    if float(match.group(1)) == 0:
        raise UsageError(f"a parameter count of {size!r} is none; give the model's size (e.g. 8B or 270M).")
    return float(match.group(1)) * scale


def _size(path: Path, name: str, size) -> float:
    try:
        return parameters_in_billions(size)
    except UsageError as error:
        raise InputFileError(f"{path}: model {name!r}: {error}") from None


def _text(path: Path, name: str, entry: dict, key: str) -> str:
    """A text field of a model's entry: left empty (`base_model:`, YAML's null) it is not given. str() made null
    the text 'None', and the models with no base model one family of that name."""
    value = entry.get(key)
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise InputFileError(f"{path}: model {name!r} has {key} {value!r}; write a name or leave it out.")
    return str(value).strip()


def load_model_metadata(path: str | Path) -> pd.DataFrame:
    """Nickname, base model, developer (HF org of `name`), parameters (billions) and RewardBench rank.

    Indexed by the HF model id `name`, in the YAML's order.
    """
    path = Path(path)
    entries = yamlfile.load(path, InputFileError)  # a key given twice is refused, not its first value dropped
    if isinstance(entries, dict):
        entries = entries.get("models", list(entries.values()))
    if not isinstance(entries, list) or not all(isinstance(e, dict) and e.get("name") for e in entries):
        raise InputFileError(f"{path}: expected a list of models, each with at least `name` (and nickname, "
                             "base_model, size, reward_bench_rank).")
    rows = []
    for entry in entries:
        name = str(entry["name"])
        rank = entry.get("reward_bench_rank")
        if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int | float)):
            raise InputFileError(f"{path}: model {name!r} has reward_bench_rank {rank!r}; write a number or leave "
                                 "it out.")
        rows.append({
            "name": name,
            "nickname": str(entry.get("nickname") or name),
            "base_model": _text(path, name, entry, "base_model"),
            "family": _text(path, name, entry, "family"),
            "developer": name.split("/")[0] if "/" in name else "",
            "parameters_b": _size(path, name, entry.get("size")),
            "reward_bench_rank": float(rank) if rank is not None else np.nan,
        })
    for column in ("name", "nickname"):  # models are found and labelled by these: one model each
        seen: set[str] = set()
        twice = [v for v in (r[column].lower() for r in rows) if v in seen or seen.add(v)]
        if twice:
            raise InputFileError(f"{path}: {column} {twice[0]!r} is given to two models; give each model its own "
                                 f"{column}.")
    return pd.DataFrame(rows).set_index("name", drop=False)


def _aliases(name: str, nickname: str) -> set[str]:
    short = name.split("/")[-1]
    return {a.lower() for a in (name, nickname, short, name.replace("/", "_"), name.replace("/", "--"),
                                name.replace("/", "__"))}


def find_model(source: str, metadata: pd.DataFrame | None, model: str | None = None) -> pd.Series | None:
    """The metadata row whose HF id, nickname or file-name form of the id equals `source`; first the row whose
    full id `model` (the job's model, a path) ends with. A name two rows share (orgA/RM-8B, orgB/RM-8B) is refused
    rather than given the first row's label, developer and size."""
    if metadata is None:
        return None
    if model:
        path = model.rstrip("/").lower()
        full = [row for _, row in metadata.iterrows() if "/" in row["name"]
                and (path == row["name"].lower() or path.endswith("/" + row["name"].lower()))]
        if len(full) == 1:
            return full[0]
    key = source.lower()
    rows = [row for _, row in metadata.iterrows() if key in _aliases(row["name"], row["nickname"])]
    if len(rows) > 1:
        raise InputFileError(f"model {model or source!r} matches {' and '.join(r['name'] for r in rows)} in "
                             "--models_yaml by name; keep it in a folder named by its full id (ORG/NAME) or give "
                             "each model a distinct nickname.")
    return rows[0] if rows else None


def model_label(source: str, metadata: pd.DataFrame | None, model: str | None = None) -> str:
    row = find_model(source, metadata, model)
    return source if row is None else str(row["nickname"])


def metadata_for(labels: Sequence[str], metadata: pd.DataFrame | None) -> pd.DataFrame | None:
    """Metadata rows in the order of `labels` (indexed by label), or None unless every model is known."""
    if metadata is None:
        return None
    rows = [find_model(label, metadata) for label in labels]
    if any(r is None for r in rows):
        return None
    return pd.DataFrame(rows).set_index(pd.Index(list(labels), name="model"))
