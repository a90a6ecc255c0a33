"""Score tables in the published schema, written so every token survives a round trip.

`token_id, token_name, token_decoded, <one column per prompt>`; rmjax's sweeps add a key column
`roundtrip` after `token_decoded` (1 where the token-mode sequence is what a real conversation
tokenizes to, see `rmjax.text.candidates.roundtrip_mask`). Tokens such as `None`, `NaN`,
`null`, `,`, `"` or a newline are quoted by the csv module and read back with NA parsing off
(the reference analysis lost `None`/`NaN` tokens by reading them as missing values).
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import platform
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from rmjax.errors import InputFileError, MissingFileError
from rmjax.runs.atomic import atomic_write_text, replacing
from rmjax.runs.finiteness import nonfinite_numbers, require_finite_json, require_finite_table, written_nonfinite

KEY_COLUMNS = ["token_id", "token_name", "token_decoded"]
ROUNDTRIP = "roundtrip"
TEXT = "text"
# Key columns of a beam / exhaustive result (rmjax.search.beam): one row per sequence.
BEAM_KEY_COLUMNS = ["depth", "direction", "rank", "ids", "tokens", "decoded"]
# Columns that are never a prompt's values (what a prompt may not be called).
NON_VALUE_COLUMNS = (*KEY_COLUMNS, ROUNDTRIP, TEXT, *BEAM_KEY_COLUMNS)


def write_rows(f, rows: Iterable[list]) -> None:
    # Quote every string: QUOTE_MINIMAL would leave a lone "\r" token unquoted and split the row.
    writer = csv.writer(f, lineterminator="\n", quoting=csv.QUOTE_NONNUMERIC)
    for row in rows:
        writer.writerow([float(f"{v:.9g}") if isinstance(v, float | np.floating) else v for v in row])


def write_table(path: str | Path, keys: dict[str, list], values: dict[str, np.ndarray], *,
                allow_nonfinite: bool | None = None, no_value: Iterable[str] = ()) -> Path:
    """CSV of key columns (ids, strings) then float columns, written atomically; a NaN/Inf anywhere stops it
    unless allowed (rmjax.runs.finiteness: `no_value` names columns in which NaN means "no value")."""
    path = Path(path)
    names = [*keys, *values]
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: duplicate column names {sorted({n for n in names if names.count(n) > 1})}.")
    require_finite_table(path, keys, values, allow_nonfinite=allow_nonfinite, no_value=no_value)
    path.parent.mkdir(parents=True, exist_ok=True)
    with replacing(path) as tmp, open(tmp, "w", encoding="utf-8", newline="") as f:
        write_rows(f, [list(keys) + list(values)])
        cols = [np.asarray(c, np.float64) for c in values.values()]
        key_rows = zip(*keys.values(), strict=True)
        write_rows(f, ([*k, *(float(c[i]) for c in cols)] for i, k in enumerate(key_rows)))
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


def check_header(path: str | Path) -> list[str]:
    """The header of a CSV, refused when a column repeats (pandas would silently rename the second `x.1`) or has
    no name."""
    try:
        with open(path, encoding="utf-8", newline="") as f:
            header = next(csv.reader(f), [])
    except (UnicodeDecodeError, csv.Error) as error:
        raise InputFileError(f"{path}: not a CSV table ({error}).") from None
    repeated = sorted({c for c in header if header.count(c) > 1})
    if repeated:
        raise InputFileError(f"{path}: column {', '.join(map(repr, repeated))} appears more than once; give each "
                             "prompt one column.")
    unnamed = [i + 1 for i, c in enumerate(header) if not c.strip()]
    if unnamed:  # pandas would call it `Unnamed: 0` and read it as a prompt's scores
        raise InputFileError(f"{path}: column {unnamed[0]} has no name (a row index written with the table, as "
                             "pandas' to_csv does by default?); remove it (to_csv(index=False)) or name the prompt.")
    return header


def read_scores_csv(path: str | Path) -> pd.DataFrame:
    """Read a score (or scored-text) table with every token kept as a string (no NA conversion); the
    value columns as float64, `roundtrip` (when present) as int."""
    check_header(path)
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
    check_header(path)
    df = pd.read_csv(path, keep_default_na=False, na_filter=False, encoding="utf-8",
                     dtype={"direction": str, "ids": str, "tokens": str, "decoded": str})
    df["ids"] = [tuple(int(i) for i in s.split()) for s in df["ids"]]
    df["tokens"] = [json.loads(s) for s in df["tokens"]]
    df["decoded"] = [json.loads(s) for s in df["decoded"]]
    for col in value_columns(df):
        df[col] = df[col].astype(np.float64)
    return df


def meta_path(path: str | Path) -> Path:
    """`x.csv` -> `x.csv.meta.json`: from the full name, so `x.csv` and `x.txt` never share one."""
    path = Path(path)
    return path.with_name(path.name + ".meta.json")


def package_version(name: str) -> str:
    """An installed package's version for a message ('?' when it is not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "?"


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
    """NaN and ±Inf as null (JSON has no such numbers; a bare NaN breaks strict readers); an array as its list (the
    writer's `default=str` wrote it as the text "[1.  2.5]")."""
    if isinstance(value, np.ndarray):
        return json_safe(value.tolist())
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, float | np.floating):
        return float(value) if np.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value


def dump_json(value, path: str | Path, *, allow_nonfinite: bool | None = None) -> Path:
    """Strict JSON, written atomically: a NaN/Inf number is refused (rmjax.runs.finiteness), or written as null
    where non-finite values are allowed."""
    require_finite_json(Path(path), value, allow_nonfinite=allow_nonfinite)
    return atomic_write_text(Path(path), json.dumps(json_safe(value), indent=2, default=str, allow_nan=False))


def write_meta(path: str | Path, files: Iterable[str | Path] = (), **fields) -> Path:
    """Summary beside a result: what ran (its identity), on what, how long, how fast, and a record (size, rows,
    sha256) of the result and of each of `files`, so a reader can prove they are whole. Written last: a result
    whose .meta.json is there is complete."""
    path = Path(path)
    listed = [p for p in dict.fromkeys([path, *map(Path, files)]) if p.is_file()]
    record = {"written": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **fields,
              "files": {_file_key(path, p): file_record(p) for p in listed},
              "environment": environment()}
    # NaN/Inf written under --allow_nonfinite, in any file or in this record (as null): a rerun reuses the
    # result only with the flag too (rmjax.runs.jobs.refuse_nonfinite_reuse)
    written = {_file_key(path, p): n for p in listed if (n := written_nonfinite(p))}
    if in_record := len(list(nonfinite_numbers(record))):
        written[_file_key(path, meta_path(path))] = in_record
    if written:
        record["nonfinite_written"] = written
    return dump_json(record, meta_path(path))


def reused_note(record: dict | None) -> str:
    """"reused (written DATE, took S s)" from a finished output's record (a .meta.json, an export's or a training
    run's: `written` or `written_at`, and `seconds`), so an old run's time is never read as now."""
    record = record if isinstance(record, dict) else {}
    seconds = record.get("seconds")
    took = f", took {seconds:.1f} s" if isinstance(seconds, int | float) else ""
    return f"reused (written {record.get('written_at') or record.get('written') or 'at an unrecorded time'}{took})"


def _file_key(result: Path, path: Path) -> str:
    """How a result's .meta.json names `path` (relative to the result's folder)."""
    return os.path.relpath(path, result.parent)


def recorded(result: str | Path, path: str | Path) -> bool:
    """Whether the .meta.json of `result` records `path` among its files (with its size and digest)."""
    files = (read_meta(result) or {}).get("files")
    return isinstance(files, dict) and _file_key(Path(result), Path(path)) in files


def record_files(result: str | Path, files: Iterable[str | Path]) -> Path:
    """Add a record (size, digest) of each of `files` to the .meta.json of a finished `result`, e.g. a figure
    drawn when the result was reused, so that a later reader can prove it is the one drawn from it."""
    result = Path(result)
    meta = read_meta(result)
    if meta is None or not isinstance(meta.get("files"), dict):
        raise RuntimeError(f"internal error: {result} has no .meta.json to record {list(map(str, files))} in.")
    meta["files"].update({_file_key(result, Path(p)): file_record(p) for p in files})
    return dump_json(meta, meta_path(result))


def csv_rows(path: str | Path) -> int:
    """Data rows of a CSV (a quoted newline inside a token does not end a row)."""
    with open(path, encoding="utf-8", newline="") as f:
        return max(sum(1 for _ in csv.reader(f)) - 1, 0)


def array_sha1(values: np.ndarray) -> str:
    """sha1 of an array's bytes: a candidate set or a list of ids in an identity."""
    return hashlib.sha1(np.ascontiguousarray(values).tobytes()).hexdigest()


def file_sha1(path: str | Path) -> str:
    """sha1 of a file's bytes: an input a result was computed from (a --from_sweep table, an --init_from file)."""
    return hashlib.sha1(Path(path).read_bytes()).hexdigest()


def file_record(path: str | Path) -> dict:
    path = Path(path)
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    record = {"bytes": path.stat().st_size, "sha256": digest.hexdigest()}
    if path.suffix == ".csv":
        try:
            record["rows"] = csv_rows(path)
        except (UnicodeDecodeError, csv.Error):
            pass
    return record


def damage(result: Path, meta: dict, record: Path | None = None) -> str | None:
    """What is wrong with `result` and the other files its .meta.json records (None when every one is as it
    was written). `record`: a folder result's record inside it (its files named relative to the folder). A
    deleted figure is no damage: the tables it draws are whole (`missing_figures`)."""
    meta_file = record if record is not None else meta_path(result)
    files = meta.get("files")
    if not isinstance(files, dict) or not files:
        return f"{meta_file.name} records no digest of its files (an older rmjax wrote it)"
    if record is None and result.name not in files:
        return f"{meta_file.name} records {', '.join(files)}, not {result.name} (it was copied or renamed)"
    for name, want in files.items():
        path = meta_file.parent / name
        if not path.is_file():
            if _is_figure(name) and not (path.exists() or path.is_symlink()):
                continue
            return f"{name} is missing"
        size = path.stat().st_size
        if not isinstance(want, dict) or size != want.get("bytes"):
            return f"{name} has {size} bytes where {want.get('bytes') if isinstance(want, dict) else '?'} " \
                   "were written (cut short or changed)"
        if file_record(path)["sha256"] != want.get("sha256"):
            return f"{name} changed after it was written (its sha256 differs)"
    return None


def _is_figure(name: str) -> bool:
    return name.lower().endswith((".png", ".pdf", ".svg"))


def missing_figures(result: Path, meta: dict) -> list[str]:
    """The figures `result`'s .meta.json records that were deleted since (its tables whole): a rerun reuses the
    result and says so, instead of refusing it as damaged (recomputing a whole vocabulary to redraw a picture)."""
    files = meta.get("files") if isinstance(meta, dict) else None
    folder = meta_path(result).parent
    return [name for name in (files if isinstance(files, dict) else {}) if _is_figure(name)
            and not ((folder / name).exists() or (folder / name).is_symlink())]


# Written into a folder output (an export) before its files and removed once its record is written: a folder that
# holds it and nothing its job does not write is that job's unfinished output, which --overwrite may replace (a
# folder without it or a record is a user's, e.g. a saved model, and is never emptied).
UNFINISHED = ".rmjax-unfinished"


def mark_unfinished(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / UNFINISHED).write_bytes(b"")


def mark_finished(folder: Path) -> None:
    (folder / UNFINISHED).unlink(missing_ok=True)


def folder_record(folder: Path, beside: Sequence[Path] = ()) -> dict:
    """Size and sha256 of every file in `folder` (a folder result: an export), by path inside it; what `beside`
    names (another output claimed on its own, and its lock) and the unfinished mark left out."""
    others = [Path(os.path.realpath(p)) for o in beside for p in (o, Path(o).with_name(Path(o).name + ".lock"))]
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != UNFINISHED
                   and not any(Path(os.path.realpath(p)) == o or o in Path(os.path.realpath(p)).parents
                               for o in others))
    return {str(p.relative_to(folder)): file_record(p) for p in files}


def read_meta(path: str | Path) -> dict | None:
    """The .meta.json beside result `path` (None without one; an unreadable one is an error)."""
    meta_file = meta_path(path)
    if not meta_file.is_file():
        return None
    try:
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError, RecursionError) as error:  # RecursionError: nested too deep
        raise InputFileError(f"{meta_file} is unreadable ({error}); rerun the job that wrote {Path(path).name}.") \
            from None
    if not isinstance(meta, dict):
        raise InputFileError(f"{meta_file} is not an rmjax .meta.json; rerun the job that wrote {Path(path).name}.")
    return meta


# A result's kind is its identity's "job" (rmjax.runs.jobs.Job.kind); rmjax before issue 23 wrote the last two
# kinds of score and logprobs results, which are still read.
_KIND_JOB = {"sweep": "experiments.sweep", "beam": "experiments.beam", "gcg": "experiments.gcg",
             "logprobs": "experiments.logprobs", "score": "experiments.score", "inspect": "experiments.inspect",
             "audit": "experiments.audit", "frontier": "experiments.frontier", "disagree": "experiments.disagree",
             "train_rm": "experiments.train_rm", "export": "experiments.export",
             "next_token_logprobs": "experiments.logprobs", "score_texts": "experiments.score"}


def checked_input(path: str | Path, kinds: Iterable[str], flag: str, bare: str | None = None) -> dict | None:
    """The .meta.json of an rmjax result another stage reads, after proving the file is whole and of an
    accepted kind: a partial, foreign or wrong-kind file stops the job in one line. `bare` allows a file
    without metadata (the README names where: e.g. the published RMs' tables) and says why in a warning;
    it returns None then."""
    path, kinds = Path(path), tuple(kinds)
    wanted = " or ".join(dict.fromkeys(f"an {_KIND_JOB.get(k, k)} result" for k in kinds))
    if path.is_dir():
        raise InputFileError(f"{flag}={path} is a folder; give {wanted}'s file.")
    if not path.is_file():
        raise MissingFileError(f"{flag}={path}: no such file.")
    meta = read_meta(path)
    if meta is None:
        if bare is None:
            raise InputFileError(f"{flag}={path} has no {meta_path(path).name}: it is not a finished rmjax result "
                                 f"(unfinished, or not written by rmjax); give {wanted}.")
        print(f"warning: {flag}={path} has no {meta_path(path).name} ({bare}): its completeness cannot be checked.",
              file=sys.stderr, flush=True)
        return None
    kind = meta.get("kind")
    if kind not in kinds:
        raise InputFileError(f"{flag}={path} is {'an ' + _KIND_JOB.get(kind, str(kind)) if kind else 'not an rmjax'}"
                             f" result, not {wanted}.")
    problem = damage(path, meta)
    if problem is not None:
        raise InputFileError(f"{flag}={path} does not match its {meta_path(path).name}: {problem}. Rerun the job that "
                             "wrote it (with --overwrite).")
    return meta
