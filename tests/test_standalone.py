"""The repository stands alone: a clone of the committed HEAD with nothing beside it runs the README's commands on
the data it ships (rmjax/data), a wheel carries that data to pip installs, and `--elo=builtin` names it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests import cli

GREATEST = "What, in one word, is the greatest thing ever"
GREATEST_SLUG = "what_in_one_word_is_the_greatest_thing_ever"


def _clone(tmp_path: Path) -> Path:
    """The committed HEAD, cloned into an empty folder: whatever a path outside it would name is absent."""
    if not (cli.REPO / ".git").exists():
        pytest.skip("not a git checkout")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(cli.REPO), str(clone)], check=True, capture_output=True, timeout=120)
    assert [p.name for p in tmp_path.iterdir()] == ["clone"]
    return clone


def _run_in(clone: Path, job: str, *flags: str) -> subprocess.CompletedProcess:
    # The clone's own code and data (PYTHONPATH, working directory); models convert into the clone's .cache.
    env = {k: v for k, v in cli.subprocess_env(PYTHONPATH=str(clone)).items() if k != "RMJAX_CACHE_DIR"}
    return cli.ok(subprocess.run(cli.command(job, *flags), cwd=clone, env=env, capture_output=True, text=True,
                                 timeout=600))


def test_a_clone_with_nothing_beside_it_runs_a_readme_sweep_and_analyze_elo_builtin(tmp_path):
    clone = _clone(tmp_path)
    out = clone / "results"
    _run_in(clone, "sweep", "--model=elo-rm-smollm2-135m", "--prompts=greatest", "--limit=64", "--top=3",
            f"--out={out / 'sweep.csv'}")
    assert len(pd.read_csv(out / "sweep.csv")) == 64
    _run_in(clone, "analyze", "--elo=builtin", f"--out={out / 'analysis'}")
    shipped = pd.read_csv(clone / "rmjax" / "data" / "elo" / f"{GREATEST}.csv", keep_default_na=False)
    ranks = pd.read_csv(out / "analysis" / f"elo_ranks_{GREATEST_SLUG}.csv", keep_default_na=False)
    assert sorted(ranks["name"]) == sorted(shipped["name"])  # every shipped item, read from the clone's own copy
    for name in ("report.md", "elo_human_agreement.csv", "elo_cross_prompt_tau.csv", "elo_spearman_to_human.png"):
        assert (out / "analysis" / name).is_file(), name
    # --models_yaml defaults to the clone's reward_models.yaml: the published models go by its nicknames.
    models = yaml.safe_load((clone / "rmjax" / "data" / "reward_models.yaml").read_text())
    published = pd.read_csv(out / "analysis" / "elo_human_agreement.csv").query("source == 'published'")
    assert set(published["model"]) == {m["nickname"] for m in models}


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
    cli.user_error(cli.run("train_rm", "--elo=builtin:What is love", "--steps=1", f"--workdir={tmp_path}"),
                   "--elo=builtin:What is love", f'"builtin:{GREATEST}"')
