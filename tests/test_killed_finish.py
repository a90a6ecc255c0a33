"""A run killed (SIGKILL: no `except`, no `finally`) in its final writes, after its result's companions and before
its .meta.json, resumes on the same command: a fault hunt found `sweep --plot` killed there refused its own figure
("s.csv.png already exists and no rmjax run of --out wrote it") until --overwrite, its chunks all on disk.

The killed run is the entry point as a user runs it, killed by the kernel where it would write .meta.json; the
resumed result is compared byte for byte with an uninterrupted run's (the same flags' run, in-process: tests/inproc.py;
--plot draws beside the CSV and leaves its bytes as they are)."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from tests import cli, inproc

# `python -m experiments.<job> FLAGS`, SIGKILLed by itself where the job writes its .meta.json (every file of the
# result before it is written)
_KILLED_AT_META = """
import os, runpy, signal, sys
job, sys.argv = sys.argv[1], ["-m", *sys.argv[2:]]
import rmjax.runs.results as results
results.write_meta = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
runpy.run_module("experiments." + job, run_name="__main__", alter_sys=True)
"""


def _killed_at_meta(job: str, *flags: str) -> None:
    proc = subprocess.run([sys.executable, "-c", _KILLED_AT_META, job, *flags], cwd=cli.REPO,
                          env=cli.subprocess_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]


@pytest.fixture(scope="module")
def clean(rm_folder, tmp_path_factory) -> bytes:
    """The CSV of an uninterrupted `sweep --prompts=greatest --limit=512 --chunk_size=256 --batch_size=64`, the
    flags of both resumed runs below."""
    from rmjax.search.sweep import SweepSpec, run_sweep

    out = tmp_path_factory.mktemp("clean") / "s.csv"
    run_sweep(SweepSpec(inproc.options(rm_folder, out), inproc.prompts("greatest"), limit=512, chunk_size=256,
                        batch_size=64))
    return out.read_bytes()


def test_a_sweep_killed_after_its_figure_resumes(rm_folder, clean, tmp_path):
    def flags(out):
        return [f"--model={rm_folder}", "--prompts=greatest", f"--out={out}", "--limit=512", "--chunk_size=256",
                "--batch_size=64", "--plot"]

    out = tmp_path / "killed" / "s.csv"
    out.parent.mkdir()
    _killed_at_meta("sweep", *flags(out))
    assert out.is_file() and (tmp_path / "killed" / "s.csv.png").is_file()  # written before the kill
    assert not (tmp_path / "killed" / "s.csv.meta.json").exists()
    cli.ok(cli.run("sweep", *flags(out)))  # refused its own figure before the fix
    assert out.read_bytes() == clean
    assert (tmp_path / "killed" / "s.csv.meta.json").is_file()
    assert not (tmp_path / "killed" / "s.csv.chunks").exists()
    rerun = cli.ok(cli.run("sweep", *flags(out)))  # finished: reused, not recomputed
    assert "reused" in rerun.stderr


def test_a_figure_no_run_wrote_is_refused_before_the_run_records_its_writes(rm_folder, tmp_path):
    """The record of what a run is about to write is made after its claim: a figure planted before the run is
    refused up front, never recorded as the run's, and left as it was."""
    out = tmp_path / "s.csv"
    flags = [f"--model={rm_folder}", "--prompts=greatest", f"--out={out}", "--limit=512", "--chunk_size=256",
             "--batch_size=64", "--plot"]
    (tmp_path / "s.csv.png").write_bytes(b"mine")
    cli.user_error(cli.run("sweep", *flags), "s.csv.png", "--overwrite")
    assert (tmp_path / "s.csv.png").read_bytes() == b"mine"


def test_a_temp_file_a_killed_write_left_goes_with_the_rerun(rm_folder, clean, tmp_path):
    """A run killed while its CSV's temp file was written (`.s.csv.<pid>.tmp`, renamed over s.csv when whole) left
    that temp, full-size, beside the resumed result for good. The rerun's result is the uninterrupted run's."""
    out = tmp_path / "s.csv"
    flags = [f"--model={rm_folder}", "--prompts=greatest", f"--out={out}", "--limit=512", "--chunk_size=256",
             "--batch_size=64"]
    killed_in_write = """
import contextlib, os, runpy, signal, sys
sys.argv = ["-m", *sys.argv[1:]]
import rmjax.runs.results as results
given = results.replacing
@contextlib.contextmanager
def replacing(path, *a, **k):
    with given(path, *a, **k) as tmp:
        yield tmp
        os.kill(os.getpid(), signal.SIGKILL)  # the CSV's temp is written, not yet renamed over it
results.replacing = replacing
runpy.run_module("experiments.sweep", run_name="__main__", alter_sys=True)
"""
    proc = subprocess.run([sys.executable, "-c", killed_in_write, *flags], cwd=cli.REPO, env=cli.subprocess_env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    left = sorted(p.name for p in tmp_path.glob(".s.csv.*.tmp"))
    assert len(left) == 1 and not out.exists()
    cli.ok(cli.run("sweep", *flags))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.csv", "s.csv.meta.json"]
    assert out.read_bytes() == clean
