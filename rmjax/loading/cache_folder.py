"""Where rmjax keeps what it derives from checkpoints (converted GGUF folders, file digests, compiled programs, plans):
a module of its own, below both the registry of model specs and the fingerprints that read it."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """Where converted models live: $RMJAX_CACHE_DIR, else .cache/ of the source checkout."""
    env = os.environ.get("RMJAX_CACHE_DIR")
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parents[2]
    if (repo / "setup.py").is_file():
        return repo / ".cache" / "rmjax"
    return Path.home() / ".cache" / "rmjax"
