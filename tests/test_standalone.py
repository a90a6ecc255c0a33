"""The repository stands alone: a wheel carries the data it ships (rmjax/data) to pip installs, and `--elo=builtin`
names it. That a clone of HEAD with nothing beside it runs a README sweep and `analyze --elo=builtin` from the
runtime install alone is `make smoke`, CI's first step (Makefile, runtime-smoke)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests import cli

GREATEST = "What, in one word, is the greatest thing ever"


def _clone(tmp_path: Path) -> Path:
    """The committed HEAD, cloned into an empty folder: whatever a path outside it would name is absent."""
    if not (cli.REPO / ".git").exists():
        pytest.skip("not a git checkout")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(cli.REPO), str(clone)], check=True, capture_output=True, timeout=120)
    assert [p.name for p in tmp_path.iterdir()] == ["clone"]
    return clone


def test_a_wheel_carries_the_data_and_its_licence(tmp_path):
    """A non-editable install has every tracked file of rmjax/data (package_data in setup.py)."""
    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("setuptools is not installed (the wheel is built offline, without build isolation)")
    clone = _clone(tmp_path)
    tracked = subprocess.run(["git", "-C", str(clone), "ls-files", "-z", "rmjax/data"], check=True,
                             capture_output=True, text=True).stdout.split("\0")
    tracked = {p for p in tracked if p}
    assert {"rmjax/data/LICENSE-elo-and-corpora.txt", "rmjax/data/reward_models.yaml",
            f"rmjax/data/elo/{GREATEST}.csv", "rmjax/data/corpora/1_1_all_alpha.txt"} <= tracked
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
                    "-w", str(tmp_path / "wheel"), str(clone)], check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "wheel").glob("rmjax-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        packed = {name: archive.read(name) for name in archive.namelist() if name.startswith("rmjax/data/")}
    assert set(packed) == tracked
    for name in tracked:  # byte for byte
        assert packed[name] == (clone / name).read_bytes(), name


def test_elo_builtin_names_the_shipped_files():
    from rmjax.data import DATA_DIR
    from rmjax.train.data import elo_csv, elo_pairs

    elo = DATA_DIR / "elo"
    assert elo_csv("builtin") == elo / f"{GREATEST}.csv"
    other = "What one single thing, person, or concept is the greatest ever"
    assert elo_csv(f"builtin:{other}?") == elo_csv(f"builtin:{other}") == elo / f"{other}.csv"
    assert elo_csv("elsewhere/builtin.csv") == Path("elsewhere/builtin.csv")
    # The default reward models' recipe records elo=builtin: the pairs it gives are those of the file itself.
    ours, theirs = elo_pairs("builtin", 300, 60, seed=0), elo_pairs(elo / f"{GREATEST}.csv", 300, 60, seed=0)
    for a, b in zip(ours, theirs, strict=True):
        assert (a.prompt, a.chosen, a.rejected, a.label.tolist()) == (b.prompt, b.chosen, b.rejected, b.label.tolist())
    assert ours[0].prompt[0] == f"{GREATEST}?"


def test_train_rm_refuses_an_unknown_builtin_elo_prompt_before_loading(tmp_path):
    cli.user_error(cli.run("train_rm", "--elo=builtin:What is love", "--steps=1", "--warmup_steps=0",
                           f"--workdir={tmp_path}"),
                   "--elo=builtin:What is love", f'"builtin:{GREATEST}"')
