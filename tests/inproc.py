"""Running a job in the test's own process, as its entry point would, for refusals and small runs whose point is
the job's library code (claims, stage inputs, config checks), not the command line: no Python start per case.

An entry point (experiments/*.py) only turns its flags into the job's spec and calls one `run_*` function; a user
error (`RmjaxError`) becomes one line `error: <one_line(error)>` with status 2 (experiments/cli.py). `refused` is
the in-process counterpart of `tests.cli.user_error`, and `no_weights_read` its `loaded=False`. What only the
command line does (flag parsing, the files `experiments.common.options` collects) stays tested through `tests.cli`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from rmjax.errors import RmjaxError, one_line
from rmjax.runs.options import RunOptions


def refused(call: Callable[[], object], *fragments: str) -> str:
    """`call()` ends in a user error (what the entry point prints as its one `error: …` line, status 2) naming
    every fragment; returns that line."""
    with pytest.raises(RmjaxError) as error:
        call()
    line = f"error: {one_line(error.value)}"
    for fragment in fragments:
        assert fragment in line, (fragment, line)
    return line


def no_weights_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """From now on, reading a checkpoint's tensors fails the test: what follows must stop before any weight loads
    (the in-process `loaded=False` of tests.cli.user_error)."""
    from rmjax.loading import safetensors_io

    def read(path, *args, **kwargs):
        raise AssertionError(f"a weight was read from {path}: the job did not stop before loading")

    monkeypatch.setattr(safetensors_io, "iter_tensors", read)


def train_config(**settings):
    """The TrainConfig experiments.train_rm builds from its flags (its command-line defaults, then `settings`)."""
    from rmjax.train.settings import COMMAND_LINE_DEFAULTS, TrainConfig

    return TrainConfig(**{**COMMAND_LINE_DEFAULTS, **settings})


def train_rm(model: str | Path, *, pairs: str | Path, heldout_pairs: str | Path | None = None,
             workdir: str | Path | None = None, export: str | Path | None = None, head_out: str | Path | None = None,
             overwrite: bool = False, mesh=None, **settings):
    """experiments.train_rm's main with --pairs (and --heldout_pairs): `settings` are TrainConfig flags, `mesh`
    the one --mesh builds."""
    from rmjax.train.recipe import train_from_data

    return train_from_data(str(model), train_config(**settings), pairs=str(pairs),
                           heldout_pairs=heldout_pairs and str(heldout_pairs), workdir=workdir, export=export,
                           head_out=head_out, overwrite=overwrite, mesh=mesh)


def options(model: str | Path, out: str | Path, **settings) -> RunOptions:
    """The shared flags (experiments.common.options) of a job on `model` writing `out`; `settings`: RunOptions
    fields (overwrite=True, allow_nonfinite=True, ...)."""
    return RunOptions(model=str(model), out=str(out), **settings)


def prompts(*names: str, **texts: str) -> dict[str, str]:
    """--prompts=names (default greatest) and --prompt=name=text, resolved as the entry points resolve them."""
    from rmjax.text.prompts import resolve_prompts

    return resolve_prompts(list(names) if names or texts else ["greatest"], [f"{k}={v}" for k, v in texts.items()])


def analyze(out: str | Path, **settings) -> dict:
    """experiments.analyze's main: `settings` are AnalysisConfig flags; --models_yaml and --frequencies default
    to the shipped files as on the command line (None: given empty)."""
    from rmjax import data as shipped
    from rmjax.analysis.spec import AnalysisConfig
    from rmjax.audit.compare import run_analyses_with_audits

    defaults = dict(models_yaml=str(shipped.REWARD_MODELS_YAML), frequencies=str(shipped.BNC_FREQUENCIES))
    return run_analyses_with_audits(AnalysisConfig(**{**defaults, **settings}), out, overwrite=False)


def interrupt_at_write(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    """The job is killed (KeyboardInterrupt) as its n-th chunk write starts: the ones before it are on disk."""
    from rmjax.runs.chunks import ChunkStore

    real, calls = ChunkStore.write, []

    def write(self, name, scores):
        calls.append(name)
        if len(calls) == n:
            raise KeyboardInterrupt
        return real(self, name, scores)

    monkeypatch.setattr(ChunkStore, "write", write)


def killed_at_write(monkeypatch: pytest.MonkeyPatch, n: int, job: Callable[[], object]) -> None:
    """`job()` killed as its n-th chunk write starts (interrupt_at_write, undone after): a crashed run's progress."""
    with monkeypatch.context() as patch:
        interrupt_at_write(patch, n)
        with pytest.raises(KeyboardInterrupt):
            job()


def interrupt_at_finish(monkeypatch: pytest.MonkeyPatch) -> None:
    """The job is killed (KeyboardInterrupt) the moment it would write its result: every chunk is on disk, no result
    nor .meta.json."""
    from rmjax.runs import jobs

    def finish(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(jobs.Job, "finish", finish)


def identity_on_axes(monkeypatch: pytest.MonkeyPatch, axes: tuple[str, ...]):
    """The audit job's identity battery narrowed to `axes` (its variants and contrasts), its other batteries as
    built: a test that reads a few axes does not score the other axes' thousands of conversations. Returns the
    narrowed battery."""
    import dataclasses

    from rmjax.audit import job

    real_build = job.battery_lib.build
    (identity,) = real_build(["identity"])
    narrowed = dataclasses.replace(identity, variants=tuple(v for v in identity.variants if v.axis in axes),
                                   contrasts=tuple(c for c in identity.contrasts if c.axis in axes))
    assert {v.axis for v in narrowed.variants} == set(axes) == {c.axis for c in narrowed.contrasts}, axes
    def build(names=job.battery_lib.BATTERIES, *rest):
        return [narrowed if b.name == "identity" else b for b in real_build(names, *rest)]

    monkeypatch.setattr(job.battery_lib, "build", build)
    return narrowed
