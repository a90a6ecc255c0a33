"""The one finiteness rule for every number a job writes, read (scores) or derived (z-scores, ratios,
hypervolumes, perplexities): a NaN or ±Inf in a CSV value or a JSON number stops the write in one line naming
the file, the column or field and the first row, unless the job runs with --allow_nonfinite.

The final writers (rmjax.runs.results: `write_table`, `dump_json`, so `write_meta` too) apply it, so a number no
earlier check looked at cannot reach a file silently. A job's --allow_nonfinite reaches them through
`nonfinite_allowed`, which rmjax.runs.jobs.Job.finish sets around its writes; a writer may also be told
directly. A table column in which NaN means "no value" (an analysis statistic that is undefined) is named so by
its writer (`no_value`); ±Inf is never "no value".
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from rmjax.errors import NonFiniteError

ALLOW_HINT = "pass --allow_nonfinite to write them anyway (counted in .meta.json)"
_ALLOWED: contextvars.ContextVar[bool] = contextvars.ContextVar("nonfinite_allowed", default=False)
_HAS_FLAG: contextvars.ContextVar[bool] = contextvars.ContextVar("nonfinite_flag", default=False)


@contextlib.contextmanager
def nonfinite_allowed(allow: bool, has_flag: bool = True) -> Iterator[None]:
    """Within the block the writers write NaN/Inf (JSON: null) when `allow`, and refuse them otherwise, naming
    --allow_nonfinite when the job `has_flag`."""
    token, flag = _ALLOWED.set(bool(allow)), _HAS_FLAG.set(bool(has_flag))
    try:
        yield
    finally:
        _ALLOWED.reset(token)
        _HAS_FLAG.reset(flag)


def allowed(allow_nonfinite: bool | None = None) -> bool:
    """A writer's own setting, or else (None) that of the job writing (`nonfinite_allowed`; False outside one)."""
    return _ALLOWED.get() if allow_nonfinite is None else bool(allow_nonfinite)


def _refuse(path: Path, what: str, count: int, first: str, told: bool) -> None:
    """`told`: the writer was given a job's --allow_nonfinite (or writes inside `nonfinite_allowed`), so the flag
    exists to name; analyze has none (its message named a flag it then refused as unknown)."""
    fix = f"fix the model or input, or {ALLOW_HINT}" if told or _HAS_FLAG.get() else "fix the input"
    raise NonFiniteError(f"{path.name}: {what} would hold {count} NaN/Inf value{'s' if count > 1 else ''} (first: "
                         f"{first}). {path.name} was not written: {fix}.")


# NaN/Inf values written where they were allowed, by resolved file path (this process): `write_meta` records them
# beside the result, so that a rerun without --allow_nonfinite does not reuse it (rmjax.runs.options).
_WRITTEN: dict[str, int] = {}


def written_nonfinite(path: str | Path) -> int:
    """NaN/Inf values this process last wrote to `path` where they were allowed (0: none, or not written here)."""
    return _WRITTEN.get(str(Path(path).resolve()), 0)


def _note_written(path: Path, count: int) -> None:
    _WRITTEN[str(Path(path).resolve())] = count


def require_finite_table(path: Path, keys: dict[str, list], values: dict[str, np.ndarray], *,
                         allow_nonfinite: bool | None = None, no_value: Iterable[str] = ()) -> None:
    """NonFiniteError naming the first column and row of a table's key and value columns holding NaN/Inf (NaN
    passes in a `no_value` column), unless non-finite values are allowed; then they are counted (`_WRITTEN`)."""
    allow, no_value, count = allowed(allow_nonfinite), set(no_value), 0
    label = next(iter(keys), None)
    for name, column in [*keys.items(), *values.items()]:
        if name in keys:  # ids and strings; a float key (the frontier's λ) is checked too
            bad = np.asarray([isinstance(v, float | np.floating) and not np.isfinite(v) for v in column], bool)
        else:
            column = np.asarray(column, np.float64)
            bad = np.isinf(column) if name in no_value else ~np.isfinite(column)
        count += int(bad.sum())
        if bad.any() and not allow:
            i = int(np.flatnonzero(bad)[0])
            where = f"row {i + 1}" + (f" ({label} {keys[label][i]!r})" if label not in (None, name) else "")
            _refuse(Path(path), f"column {name!r}", int(bad.sum()), f"{where}: {column[i]}",
                    allow_nonfinite is not None)
    _note_written(path, count)


def require_finite_json(path: Path, value, *, allow_nonfinite: bool | None = None) -> None:
    """NonFiniteError naming the first NaN/Inf number in a JSON value (its field path), unless allowed; then
    they are counted (`_WRITTEN`)."""
    found = list(nonfinite_numbers(value))
    if found and not allowed(allow_nonfinite):
        _refuse(Path(path), f"field {found[0][0]!r}", len(found), f"{found[0][0]} = {found[0][1]}",
                allow_nonfinite is not None)
    _note_written(path, len(found))


def nonfinite_numbers(value, at: str = "") -> Iterator[tuple[str, float]]:
    """(where, number) for each NaN/Inf float inside nested dicts, lists, tuples and arrays."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from nonfinite_numbers(v, f"{at}.{k}" if at else str(k))
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            yield from nonfinite_numbers(v, f"{at}[{i}]")
    elif isinstance(value, np.ndarray):
        yield from nonfinite_numbers(value.tolist(), at)
    elif isinstance(value, float | np.floating) and not np.isfinite(value):
        yield at or "value", float(value)
