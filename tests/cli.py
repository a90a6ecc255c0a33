"""Running the entry points as a user does (a subprocess) and checking how they end."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
# The entry points compile the same small programs again and again: a persistent XLA cache (git-ignored, beside
# the converted real models) lets a later subprocess load them instead. It changes no number: the same
# executable runs either way.
COMPILE_CACHE = {"JAX_COMPILATION_CACHE_DIR": str(REPO / ".cache" / "jax-tests"),
                 "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
ENV = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu", "HF_HUB_OFFLINE": "1",
       "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **COMPILE_CACHE}


def command(job: str, *flags: str) -> list[str]:
    return [sys.executable, "-m", f"experiments.{job}", *flags]


def run(job: str, *flags: str, cwd: Path = REPO, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(command(job, *flags), cwd=cwd, env={**ENV, **(env or {})}, capture_output=True, text=True,
                          timeout=600)


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


def edit_tensor(folder: Path, key: str, edit) -> None:
    """Change one tensor of `folder`'s model.safetensors (with the safetensors package, not rmjax)."""
    from safetensors.numpy import load_file, save_file

    path = folder / "model.safetensors"
    tensors = load_file(str(path))
    tensors[key] = edit(np.array(tensors[key]))
    save_file(tensors, str(path), metadata={"format": "pt"})
