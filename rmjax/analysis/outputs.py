"""Where an analysis writes: one folder per analysis, each file listed in analysis.json as it is written,
so a later `--overwrite` removes exactly those files and never a file of the user's."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from rmjax import results
from rmjax.errors import OutputExistsError
from rmjax.outputs import check_writable
from rmjax.results import dump_json


def write_frame(path: str | Path, frame: pd.DataFrame) -> Path:
    """A DataFrame through `results.write_table`: text/int/bool columns as keys, float columns as values
    (so tokens such as `None` or `NaN` stay strings when read back with NA parsing off)."""
    keys: dict[str, list] = {}
    values: dict[str, np.ndarray] = {}
    for column in frame.columns:
        series = frame[column]
        if pd.api.types.is_float_dtype(series):
            values[str(column)] = series.to_numpy(np.float64)
        else:
            keys[str(column)] = [v.item() if isinstance(v, np.generic) else v for v in series.tolist()]
    return results.write_table(path, keys, values)


def markdown(frame: pd.DataFrame, digits: int = 3) -> str:
    """A small DataFrame as a Markdown table (no extra dependency)."""
    def cell(v) -> str:
        if isinstance(v, float | np.floating):
            return f"{v:.{digits}g}" if abs(v) < 1e-3 and v != 0 else f"{v:.{digits}f}"
        return str(v).replace("|", "\\|").replace("\n", "\\n")

    lines = ["| " + " | ".join(map(str, frame.columns)) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines)


MANIFEST = "analysis.json"  # the files an analysis wrote into its folder (what --overwrite may remove)


def prepare_folder(out: Path, overwrite: bool) -> None:
    """An analysis writes into an empty folder, or with --overwrite into one holding only an earlier
    analysis's files (which are removed first, so no stale table or figure survives)."""
    check_writable(out, folder=True)
    present = sorted(p.name for p in out.iterdir())
    if not present:
        return
    if not overwrite:
        raise OutputExistsError(f"--out={out} is not empty ({len(present)} files, e.g. {present[0]}); pass "
                                "--overwrite to replace an earlier analysis there, or choose a new folder.")
    manifest = out / MANIFEST
    try:
        ours = set(json.loads(manifest.read_text()).get("files", [])) | {MANIFEST} if manifest.is_file() else set()
    except (ValueError, AttributeError):
        ours = set()  # unreadable: nothing there is known to be ours
    # a crash may leave the manifest's own temp file (results.atomic_write_text)
    ours |= {n for n in present if n.startswith(f".{MANIFEST}.") and n.endswith(".tmp")}
    foreign = [name for name in present if name not in ours]
    if foreign:
        raise OutputExistsError(f"--out={out} holds files no rmjax analysis wrote ({', '.join(foreign[:3])}"
                                f"{', …' if len(foreign) > 3 else ''}); --overwrite replaces only an earlier "
                                "analysis: choose a new folder.")
    for name in present:
        (out / name).unlink()


class Outputs:
    """Collects what a run wrote (listed in analysis.json as it goes) and the report's lines."""

    def __init__(self, out: str | Path, overwrite: bool = False):
        self.out = Path(out)
        prepare_folder(self.out, overwrite)
        self.tables: dict[str, str] = {}
        self.figures: dict[str, str] = {}
        self.lines: list[str] = []
        self.skipped: list[str] = []
        self.headline: dict = {}
        self.files: list[str] = []

    def wrote(self, path: str | Path, complete: bool = False) -> str:
        self.files.append(Path(path).name)
        dump_json({"files": self.files, "complete": complete}, self.out / MANIFEST)
        return str(path)

    def table(self, name: str, frame: pd.DataFrame) -> pd.DataFrame:
        self.tables[name] = self.wrote(write_frame(self.out / f"{name}.csv", frame))
        return frame

    def matrix(self, name: str, matrix: pd.DataFrame) -> pd.DataFrame:
        self.table(name, matrix.rename_axis("model").reset_index())
        return matrix

    def figure(self, name: str, draw: Callable[..., Path], *args, **kwargs) -> None:
        self.figures[name] = self.wrote(draw(*args, path=self.out / f"{name}.png", **kwargs))

    def say(self, *lines: str) -> None:
        self.lines.extend(lines)

    def skip(self, reason: str) -> None:
        self.skipped.append(reason)
