"""Score tables in the published schema, written so every token survives a round trip.

`token_id, token_name, token_decoded, <one column per prompt>`; rmjax's sweeps add a key column
`roundtrip` after `token_decoded` (1 where the token-mode sequence is what a real conversation
tokenizes to, see `rmjax.textscore.roundtrip_mask`). Tokens such as `None`, `NaN`,
`null`, `,`, `"` or a newline are quoted by the csv module and read back with NA parsing off
(the reference analysis lost `None`/`NaN` tokens by reading them as missing values).
"""

from __future__ import annotations

import csv
import json
import os
import platform
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

KEY_COLUMNS = ["token_id", "token_name", "token_decoded"]
ROUNDTRIP = "roundtrip"
TEXT = "text"
# Key columns of a beam / exhaustive result (rmjax.beam): one row per sequence.
BEAM_KEY_COLUMNS = ["depth", "direction", "rank", "ids", "tokens", "decoded"]
# Columns that are never a prompt's values (what a prompt may not be called).
NON_VALUE_COLUMNS = (*KEY_COLUMNS, ROUNDTRIP, TEXT, *BEAM_KEY_COLUMNS)


def write_rows(f, rows: Iterable[list]) -> None:
    # Quote every string: QUOTE_MINIMAL would leave a lone "\r" token unquoted and split the row.
    writer = csv.writer(f, lineterminator="\n", quoting=csv.QUOTE_NONNUMERIC)
    for row in rows:
        writer.writerow([float(f"{v:.9g}") if isinstance(v, float | np.floating) else v for v in row])


def write_table(path: str | Path, keys: dict[str, list], values: dict[str, np.ndarray]) -> Path:
    """CSV of key columns (ids, strings) then float columns, written atomically."""
    path = Path(path)
    names = [*keys, *values]
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: duplicate column names {sorted({n for n in names if names.count(n) > 1})}.")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8", newline="") as f:
        write_rows(f, [list(keys) + list(values)])
        cols = [np.asarray(c, np.float64) for c in values.values()]
        key_rows = zip(*keys.values(), strict=True)
        write_rows(f, ([*k, *(float(c[i]) for c in cols)] for i, k in enumerate(key_rows)))
    tmp.replace(path)
    return path


def write_scores_csv(
    path: str | Path,
    token_ids: np.ndarray,
    names: list[str],
    decoded: list[str],
    columns: dict[str, np.ndarray],
    roundtrip: np.ndarray | None = None,
) -> Path:
    keys = {"token_id": [int(t) for t in token_ids], "token_name": names, "token_decoded": decoded}
    if roundtrip is not None:
        keys[ROUNDTRIP] = [int(bool(r)) for r in roundtrip]
    return write_table(path, keys, columns)


def value_columns(df: pd.DataFrame) -> list[str]:
    """The prompt (value) columns of a score or text table."""
    return [c for c in df.columns if c not in NON_VALUE_COLUMNS]


def read_scores_csv(path: str | Path) -> pd.DataFrame:
    """Read a score (or scored-text) table with every token kept as a string (no NA conversion); the
    value columns as float64, `roundtrip` (when present) as int."""
    df = pd.read_csv(
        path,
        keep_default_na=False,
        na_filter=False,
        dtype={"token_name": str, "token_decoded": str, TEXT: str},
        encoding="utf-8",
    )
    for col in value_columns(df):
        df[col] = df[col].astype(np.float64)
    if ROUNDTRIP in df.columns:
        df[ROUNDTRIP] = df[ROUNDTRIP].astype(np.int64)
    return df


def is_beam_csv(path: str | Path) -> bool:
    with open(path, encoding="utf-8") as f:
        return f.readline().startswith('"depth","direction","rank"')


def read_beam_csv(path: str | Path) -> pd.DataFrame:
    """A beam CSV with `ids` as tuples of ints, `tokens` as lists and `decoded` as the decoded string."""
    df = pd.read_csv(path, keep_default_na=False, na_filter=False, encoding="utf-8",
                     dtype={"direction": str, "ids": str, "tokens": str, "decoded": str})
    df["ids"] = [tuple(int(i) for i in s.split()) for s in df["ids"]]
    df["tokens"] = [json.loads(s) for s in df["tokens"]]
    df["decoded"] = [json.loads(s) for s in df["decoded"]]
    for col in value_columns(df):
        df[col] = df[col].astype(np.float64)
    return df


def meta_path(path: str | Path) -> Path:
    path = Path(path)
    return path.with_name(path.stem + ".meta.json")


def environment() -> dict:
    import jax

    import rmjax

    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "rmjax": rmjax.__version__,
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
    }


def json_safe(value):
    """NaN and ±Inf as null (JSON has no such numbers; a bare NaN breaks strict readers)."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, float | np.floating):
        return float(value) if np.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value


def atomic_write_text(path: str | Path, text: str) -> Path:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path


def dump_json(value, path: str | Path) -> Path:
    """Strict JSON (no NaN), written atomically."""
    return atomic_write_text(Path(path), json.dumps(json_safe(value), indent=2, default=str, allow_nan=False))


def write_meta(path: str | Path, **fields) -> Path:
    """Summary beside a result: what ran (its identity), on what, how long, how fast. Written last: a result
    whose .meta.json is there is complete."""
    record = {"written": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **fields, "environment": environment()}
    return dump_json(record, meta_path(path))
