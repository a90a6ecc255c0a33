"""Running the entry points as a user does (a subprocess) and checking how they end."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
# The entry points compile the same small programs again and again: a persistent XLA cache (git-ignored, beside
# the converted real models) lets a later subprocess load them instead. It changes no number: the same
# executable runs either way. Only for one-device processes: a multi-device CPU program with collectives, loaded
# back from the cache, hangs in its first collective (jax 0.10.2: "Expected 8 threads to join the rendezvous",
# then an abort), so processes given several devices compile their own.
COMPILE_CACHE = {"JAX_COMPILATION_CACHE_DIR": str(REPO / ".cache" / "jax-tests"),
                 "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}


# The tests compile hundreds of programs of tiny models, which take longer to compile than to run. Two XLA:CPU
# options halve a compile and then halve it again (BUILD_NOTES, The test suite): LLVM's backend optimisation off,
# and XLA:CPU's older loop-fusion emitters in place of its MLIR fusion emitters. The same HLO compiles either way;
# the jobs made the same decisions and wrote numbers within float32 rounding (bench/quick_compile.sh).
# conftest.py sets the same options in-process, for CPU programs only. Not for `plan` (its TPU compiles would read
# the flags too) nor for the README's commands (tests/test_readme_chain.py runs them as a user does).
QUICK_OPTIONS = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}
QUICK_COMPILE = tuple(f"--{name}={str(value).lower()}" for name, value in QUICK_OPTIONS.items())


def quick_compile(xla_flags: str) -> str:
    """`xla_flags` with each QUICK_COMPILE flag added (once)."""
    given = xla_flags.split()
    return " ".join([*given, *(f for f in QUICK_COMPILE if f not in given)])


def subprocess_env(base: dict | None = None, quick: bool = True, **extra: str) -> dict:
    """A subprocess environment: `base` (default ENV) with `extra`, without the compile cache when it gives the
    process several CPU devices (JAX_NUM_CPU_DEVICES or --xla_force_host_platform_device_count), with
    QUICK_COMPILE unless not `quick`."""
    merged = {**(ENV if base is None else base), **extra}
    flags = merged.get("XLA_FLAGS", "")
    merged["XLA_FLAGS"] = (quick_compile(flags) if quick
                           else " ".join(f for f in flags.split() if f not in QUICK_COMPILE))
    flag = re.search(r"--xla_force_host_platform_device_count=(\d+)", merged.get("XLA_FLAGS", ""))
    if int(merged.get("JAX_NUM_CPU_DEVICES", "1")) > 1 or (flag and int(flag.group(1)) > 1):
        merged = {k: v for k, v in merged.items() if k not in COMPILE_CACHE}
    return merged


ENV = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu", "HF_HUB_OFFLINE": "1",
       "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **COMPILE_CACHE,
       "XLA_FLAGS": quick_compile(os.environ.get("XLA_FLAGS", ""))}


def command(job: str, *flags: str) -> list[str]:
    return [sys.executable, "-m", f"experiments.{job}", *flags]


def run(job: str, *flags: str, cwd: Path = REPO, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(command(job, *flags), cwd=cwd, env=subprocess_env(quick=job != "plan", **(env or {})),
                          capture_output=True, text=True, timeout=600)


# Inside a loop over jobs in one interpreter: the flags and `experiments.*` modules the job's import added (since
# `names` and `modules` were taken) removed, so the next job defines its own.
FORGET_JOB = """    for name in set(flags.FLAGS) - names:
        delattr(flags.FLAGS, name)
    for module in set(sys.modules) - modules:
        if module.startswith("experiments."):
            del sys.modules[module]
            vars(experiments).pop(module.split(".")[1], None)
"""


# Several calls into the experiments package in one interpreter (one Python and JAX start-up instead of one each):
# `call` runs for each JSON case (`case`), with stdout and stderr captured and SystemExit's status kept, and the
# flags and modules it added removed before the next (as tests/test_readme.py's _FLAGS_OF_EACH_JOB). Prints
# [[exit status, stdout, stderr], ...].
_EACH_IN_ONE = """
import contextlib, io, json, runpy, sys, traceback
sys.argv = ["-m"]  # as under `python -m` while the experiments package is imported (experiments/__init__.py)
from absl import app, flags
import experiments
{prelude}
found = []
for case in json.loads(sys.stdin.read()):
    names, modules = set(flags.FLAGS), set(sys.modules)
    out, err, status = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            {call}
        except SystemExit as end:
            status = end.code if isinstance(end.code, int) else int(end.code is not None)
        except BaseException:
            traceback.print_exc()
            status = 1
    found.append([status, out.getvalue(), err.getvalue()])
""" + FORGET_JOB + """print(json.dumps(found))
"""


def in_one_interpreter(call: str, cases: list, prelude: str = "", cwd: Path = REPO) -> list[tuple[int, str, str]]:
    """(exit status, stdout, stderr) of the Python statement `call` for each JSON-able `case`, all in one
    interpreter (_EACH_IN_ONE); `prelude` runs once first."""
    import json

    code = _EACH_IN_ONE.format(prelude=prelude, call=call)
    proc = subprocess.run([sys.executable, "-c", code], input=json.dumps(cases), cwd=cwd, env=subprocess_env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [tuple(found) for found in json.loads(proc.stdout.strip().splitlines()[-1])]


def run_each(*commands: tuple[str, ...], cwd: Path = REPO) -> list[subprocess.CompletedProcess]:
    """`run(job, *flags)` of each (job, *flags) in `commands`, all in one interpreter, each as runpy runs a module
    under -m (sys.argv[0] its file): only for command lines refused before any model loads (a flag's bound or
    validator, a stray argument, a check of the flags)."""
    found = in_one_interpreter(
        'sys.argv = case; runpy.run_module("experiments." + case[0], run_name="__main__", alter_sys=True)',
        [list(c) for c in commands], prelude="app.define_help_flags()  # as the first app.run: kept across jobs",
        cwd=cwd)
    return [subprocess.CompletedProcess(command(*c), status, out, err)
            for c, (status, out, err) in zip(commands, found, strict=True)]


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def user_error(proc: subprocess.CompletedProcess, *fragments: str, loaded: bool = False) -> str:
    """A user error: status 2, one `error: …` line (no traceback), naming every fragment; with
    loaded=False, stopped before any model weight was read."""
    err = proc.stderr
    assert proc.returncode == 2, f"status {proc.returncode}: {err[-3000:]}"
    assert "Traceback" not in err, err[-3000:]
    lines = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1, err[-3000:]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    if not loaded:
        assert "loaded" not in err, err[-3000:]
    return lines[0]


def copy_folder(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def copy_without_chat_template(src: Path, dst: Path) -> Path:
    """A copy of a model folder whose tokenizer has no chat template (its file and tokenizer_config.json's entry gone):
    rmjax reads it in the plain format."""
    import json

    copy_folder(src, dst)
    (dst / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((dst / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (dst / "tokenizer_config.json").write_text(json.dumps(config))
    return dst


def edit_tensor(folder: Path, key: str, edit) -> None:
    """Change one tensor of `folder`'s model.safetensors (with the safetensors package, not rmjax)."""
    from safetensors.numpy import load_file, save_file

    path = folder / "model.safetensors"
    tensors = load_file(str(path))
    tensors[key] = edit(np.array(tensors[key]))
    save_file(tensors, str(path), metadata={"format": "pt"})


# What a planted link's target holds (the `victim` fixture, tests/conftest.py): a test asserts it is still there.
VICTIM_TEXT = "precious: must survive\n"


def edit_embedding_row(folder: Path, row: int, first: float, *, zero_rest: bool = False) -> None:
    """Set entry 0 of embedding row `row` of `folder`'s model to `first` (NaN, or a float32 that overflows once
    scaled), the rest of the row zeroed when asked: one token whose every use turns the model non-finite."""
    def edit(table: np.ndarray) -> np.ndarray:
        table = table.copy()
        if zero_rest:
            table[row] = 0.0
        table[row, 0] = first
        return table

    edit_tensor(folder, "model.embed_tokens.weight", edit)
