"""Where an analysis writes: one folder per analysis, each file listed in analysis.json as it is written,
so a later `--overwrite` removes exactly those files and never a file of the user's. A run writes into a stage
folder inside it and moves its files in only once all are written: an input refused halfway (two score tables
with no prompt in common) neither removes an earlier analysis nor leaves half of a new one."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from rmjax.errors import OutputExistsError, UsageError
from rmjax.runs import atomic, results
from rmjax.runs.atomic import atomic_write_text
from rmjax.runs.paths import check_writable
from rmjax.runs.results import dump_json


def write_frame(path: str | Path, frame: pd.DataFrame) -> Path:
    """A DataFrame through `results.write_table`: text/int/bool columns as keys, float columns as values
    (so tokens such as `None` or `NaN` stay strings when read back with NA parsing off). An analysis statistic
    is NaN where it is undefined (a model without a score for an item, fewer than 3 shared strings, a rank-deficient
    regression): NaN in its float columns means "no value" (rmjax.runs.finiteness); an infinity is refused."""
    names = [str(c) for c in frame.columns]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:  # frame[column] would be two columns; write_table would refuse them anyway
        raise UsageError(f"{Path(path).name} would have two columns named {twice[0]!r} (a prompt or model named like "
                         "a column the analysis adds); rename that prompt or model.")
    keys: dict[str, list] = {}
    values: dict[str, np.ndarray] = {}
    for column in frame.columns:
        series = frame[column]
        if pd.api.types.is_float_dtype(series):
            values[str(column)] = series.to_numpy(np.float64)
        else:
            keys[str(column)] = [v.item() if isinstance(v, np.generic) else v for v in series.tolist()]
    return results.write_table(path, keys, values, no_value=values)


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
REPORT = "report.md"
MODEL = "model"  # the first column of a model x model matrix (so no model may be labelled so)
STAGE = ".analysis.partial"  # where a run writes until it has written everything (a killed run's is left there)


def _manifest(manifest: Path) -> tuple[list[str], bool] | None:
    """(the file names an analysis.json lists, whether that analysis finished), or None when there is none or it
    is not one (unreadable, or a file of the user's)."""
    listed = atomic.read_json(manifest)  # a FIFO or device at its name is never read (it would hang)
    if not isinstance(listed, dict) or not isinstance(listed.get("files"), list) or "complete" not in listed:
        return None
    return [name for name in listed["files"] if isinstance(name, str)], listed["complete"] is True


def _temp_of(name: str, ours: set[str]) -> bool:
    """A temp file a killed run left: atomic.replacing's `.<name>.<pid>.tmp` of a listed file (or the manifest),
    or check_writable's probe."""
    match = re.fullmatch(r"\.(.+)\.\d+\.tmp", name)
    return bool(match and match.group(1) in ours) or name.startswith(".rmjax-write-test-")


def prepare_folder(out: Path, overwrite: bool) -> list[str]:
    """An analysis writes into an empty folder, or with --overwrite into one holding only an earlier
    analysis's files: returned, to be removed once the new analysis is written, so that no stale table or figure
    survives it. A file is listed in analysis.json before it is written, so what a killed run left (a partial
    figure, a table's temp file, its stage) is known as its own."""
    check_writable(out, folder=True)
    present = sorted(p.name for p in out.iterdir())
    if not present:
        return []
    manifest = _manifest(out / MANIFEST)
    listed, unfinished = (None, False) if manifest is None else (manifest[0], not manifest[1])
    unfinished = unfinished or STAGE in present
    if not overwrite:
        what = ("an unfinished analysis (a killed run's: its analysis.json says complete: false, or its stage "
                f"{STAGE} is there)") if unfinished \
            else f"{len(present)} files, e.g. {present[0]}"
        raise OutputExistsError(f"--out={out} is not empty ({what}); pass --overwrite to replace an earlier analysis "
                                "there, or choose a new folder.")
    ours = set(listed or ()) | ({MANIFEST} if listed is not None else set())
    foreign = [name for name in present if not (name == STAGE and (out / name).is_dir() or (
        name in ours or _temp_of(name, ours | {MANIFEST})) and (out / name).is_file())]
    if foreign:
        raise OutputExistsError(f"--out={out} holds files no rmjax analysis wrote ({', '.join(foreign[:3])}"
                                f"{', …' if len(foreign) > 3 else ''}); --overwrite replaces only an earlier "
                                "analysis: choose a new folder.")
    return present


def _remove(out: Path, names: list[str]) -> None:
    for name in sorted(names, key=lambda n: n == MANIFEST):  # the list last: a kill here leaves it to go on
        if name == STAGE:
            shutil.rmtree(out / name)
        else:
            (out / name).unlink()


class Outputs:
    """Collects what a run writes (each file listed in analysis.json before it is written, `complete` true
    only once report.md is there) and the report's lines."""

    def __init__(self, out: str | Path, overwrite: bool = False):
        self.out = Path(out)
        self._earlier = prepare_folder(self.out, overwrite)
        self.stage = self.out / STAGE
        if STAGE in self._earlier:  # a killed run's
            self._earlier.remove(STAGE)
            shutil.rmtree(self.stage)
        self.stage.mkdir()
        self.tables: dict[str, str] = {}
        self.figures: dict[str, str] = {}
        self.lines: list[str] = []
        self.skipped: list[str] = []
        self.headline: dict = {}
        self.files: list[str] = []

    def claim(self, name: str) -> Path:
        """The path of output `name`, listed in analysis.json first. A name claimed twice in one run is refused:
        the second file would silently replace the first (two prompts or models with one file name)."""
        if name in self.files:
            raise UsageError(f"two outputs of this analysis would both be {self.out / name} (names of prompts, models "
                             "or EloEverything files that read alike); rename one of them.")
        self.files.append(name)
        dump_json({"files": self.files, "complete": False}, self.stage / MANIFEST)
        return self.stage / name

    def finish(self, text: str) -> Path:
        """report.md; then the earlier analysis removed, the stage's files moved in and analysis.json marked
        complete: a folder without that mark is a partial analysis."""
        atomic_write_text(self.claim(REPORT), text)
        _remove(self.out, self._earlier)
        dump_json({"files": self.files, "complete": False}, self.out / MANIFEST)
        for name in self.files:
            os.replace(self.stage / name, self.out / name)
        dump_json({"files": self.files, "complete": True}, self.out / MANIFEST)
        shutil.rmtree(self.stage)
        return self.out / REPORT

    def abandon(self) -> None:
        """A failed run's stage removed: the folder is as the run found it."""
        shutil.rmtree(self.stage, ignore_errors=True)

    def table(self, name: str, frame: pd.DataFrame) -> pd.DataFrame:
        if not len(frame.columns):  # nothing to tabulate (one prompt: no pair of prompts), not a 1-byte CSV that no
            self.skip(f"{name}.csv: nothing to tabulate from these inputs.")  # reader reads back
            return frame
        write_frame(self.claim(f"{name}.csv"), frame)
        self.tables[name] = str(self.out / f"{name}.csv")
        return frame

    def keyed_table(self, name: str, keys: dict[str, list], values: dict) -> None:
        """A table given as key and value columns (`results.write_table`)."""
        results.write_table(self.claim(f"{name}.csv"), keys, values)
        self.tables[name] = str(self.out / f"{name}.csv")

    def matrix(self, name: str, matrix: pd.DataFrame) -> pd.DataFrame:
        if MODEL in map(str, matrix.columns):  # reset_index would fail; inputs.load_inputs refuses such labels first
            raise UsageError(f"{name}: a model is labelled {MODEL!r}, the name of the matrix's first column; rename "
                             "it.")
        self.table(name, matrix.rename_axis(MODEL).reset_index())
        return matrix

    def figure(self, name: str, draw: Callable[..., Path], *args, **kwargs) -> None:
        draw(*args, path=self.claim(f"{name}.png"), **kwargs)
        self.figures[name] = str(self.out / f"{name}.png")

    def say(self, *lines: str) -> None:
        self.lines.extend(lines)

    def skip(self, reason: str) -> None:
        self.skipped.append(reason)

    def skip_unshared(self, what: str, prompts_of: dict[str, list[str]], kept: list[str], fix: str) -> None:
        """Say which of each input's prompts a comparison left out because another input lacks them: a prompt
        dropped without a word reads as a complete analysis."""
        for name, prompts in prompts_of.items():
            dropped = [p for p in prompts if p not in kept]
            if dropped:
                self.skip(f"{what}: {name}'s prompts {', '.join(dropped)} are not in every {what} table, so they are "
                          f"left out ({fix}).")
