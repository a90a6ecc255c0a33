"""Checkpoint loading: HF safetensors folders, GGUF files, builtin model names."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from rmjax.loading.registry import (
    BUILTIN_GGUF,
    BUILTIN_RMS,
    builtin_head_file,
    cache_dir,
    resolve,
    training_recipe,
)

if TYPE_CHECKING:
    import jax

    from rmjax.model import Model

# The loaders (JAX, transformers: about 1 s to import) are imported where a function needs them: an entry point
# imports this package for the builtin names in its flags' help, and refuses a bad flag before anything loads.

__all__ = ["BUILTIN_GGUF", "BUILTIN_RMS", "config_and_tokenizer", "config_of", "fingerprint", "load", "peek"]


def fingerprint(spec: str, system_prompt: str | None = None) -> dict:
    """Content fingerprint of a model spec without loading it: equal to `load(spec).fingerprint` (with a
    --system_prompt, to its `model_fingerprint` once the prompt is set on its tokenizer)."""
    from rmjax.loading.identity import derived, file_sha256, folder_fingerprint, gguf_fingerprint

    if system_prompt is not None:
        return fingerprint(spec) | {"system_prompt": system_prompt}
    if spec in BUILTIN_RMS:
        return derived(fingerprint(BUILTIN_RMS[spec]), head=file_sha256(builtin_head_file(spec)))
    kind, path = resolve(spec)
    return gguf_fingerprint(path) if kind == "gguf" else folder_fingerprint(path)


def peek(spec: str):
    """(config, tokenizer) of a checkpoint folder without reading weights; None for builtin and GGUF
    models (small, or converted during loading)."""
    from rmjax.hf_config import load_config_file
    from rmjax.loading.hf import load_tokenizer

    if spec in BUILTIN_RMS or spec in BUILTIN_GGUF:
        return None
    kind, path = resolve(spec)
    if kind != "hf":
        return None
    cfg = load_config_file(path / "config.json")
    return cfg, load_tokenizer(path, cfg, required=False)


def config_and_tokenizer(spec: str):
    """(config_of(spec), tokenizer) without reading weights: what tokenizing for the model needs before it loads
    (a builtin reward model: its backbone's tokenizer). The config is the loaded model's, so a check of the kind
    of model (reward or causal) reads the same from either function."""
    from rmjax.loading.hf import load_tokenizer

    cfg, path = _config_and_folder(BUILTIN_RMS.get(spec, spec))
    return config_of(spec, cfg), load_tokenizer(path, cfg)


def config_of(spec: str, backbone=None):
    """The config `load(spec)` gives, without reading weights or the tokenizer (a GGUF file is converted once and
    cached, as `load` does; a builtin reward model is its backbone's config, `backbone` when read already, with a
    reward head's)."""
    from rmjax.loading.reward_head import reward_config

    if spec in BUILTIN_RMS:
        return reward_config(backbone or _config_and_folder(BUILTIN_RMS[spec])[0])
    return backbone or _config_and_folder(spec)[0]


def _config_and_folder(spec: str):
    from rmjax.hf_config import load_config_file
    from rmjax.loading.gguf_file import cached_hf_folder

    kind, path = resolve(spec)
    if kind == "gguf":
        path = cached_hf_folder(path, cache_dir())
    return load_config_file(path / "config.json"), path


def load(
    spec: str,
    dtype: str = "float32",
    mesh: jax.sharding.Mesh | None = None,
    require_tokenizer: bool = True,
) -> Model:
    """Load a model from a folder, a GGUF file or a builtin name, params placed on `mesh`."""
    from rmjax.loading.gguf_file import cached_hf_folder
    from rmjax.loading.hf import load_hf_model_folder
    from rmjax.loading.identity import gguf_fingerprint

    start = time.perf_counter()
    if spec in BUILTIN_RMS:
        model = _load_builtin_rm(spec, dtype=dtype, mesh=mesh)
        model.load_seconds, model.training = time.perf_counter() - start, training_recipe(spec)
        return model
    kind, path = resolve(spec)
    source_fingerprint = None
    if kind == "gguf":
        source_fingerprint = gguf_fingerprint(path)
        path = cached_hf_folder(path, cache_dir())
    model = load_hf_model_folder(path, dtype=dtype, mesh=mesh, require_tokenizer=require_tokenizer,
                                 fingerprint=source_fingerprint)
    model.source, model.training = spec, training_recipe(spec)
    model.stamp(source_fingerprint or model.fingerprint)
    model.load_seconds = time.perf_counter() - start
    return model


def _load_builtin_rm(name: str, dtype: str, mesh) -> Model:
    """A default reward model: PyPI backbone + the committed score head (`rmjax/builtin/NAME.safetensors`)."""
    import numpy as np

    from rmjax.loading.identity import derived, file_sha256
    from rmjax.loading.reward_head import reward_model_from_lm
    from rmjax.loading.safetensors_io import iter_tensors

    head_file = builtin_head_file(name)
    (_, loader), = list(iter_tensors(head_file))
    lm = load(BUILTIN_RMS[name], dtype=dtype, mesh=mesh)
    rm = reward_model_from_lm(lm, score=np.asarray(loader()).T, source=name)  # placed on lm's mesh
    return rm.stamp(derived(lm.fingerprint, head=file_sha256(head_file)))
