"""The Bradley–Terry objective and HF export of a trained reward model."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp

from rmjax import nn
from rmjax.loading.safetensors_io import save_file
from rmjax.loading.weights import to_hf_tensors
from rmjax.model import Model
from rmjax.parallel.distributed import is_main, to_host


def bradley_terry_loss(r_chosen: jax.Array, r_rejected: jax.Array, label: jax.Array) -> jax.Array:
    """Mean of -[y log σ(d) + (1 - y) log σ(-d)], d = r_chosen - r_rejected (y = 1: hard labels)."""
    d = r_chosen - r_rejected
    return -jnp.mean(label * jax.nn.log_sigmoid(d) + (1.0 - label) * jax.nn.log_sigmoid(-d))


# What `save_hf_folder` writes (rmjax.runs.claims.store_files): the weights (and safetensors_io's temp file), the
# config, and what a transformers tokenizer's save_pretrained writes: its config, special and added tokens, chat
# template files, a fast tokenizer's tokenizer.json, a slow one's vocabulary files.
HF_FOLDER_FILES = ("model.safetensors", "model.safetensors.tmp", "config.json", "tokenizer.json",
                   "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "chat_template.jinja",
                   "chat_template.json", "additional_chat_templates/", "tokenizer.model", "vocab.json", "vocab.txt",
                   "merges.txt", "spiece.model", "sentencepiece.bpe.model")


def save_hf_folder(model: Model, folder: str | Path) -> Path:
    """config.json + model.safetensors + tokenizer/chat template, loadable by rmjax and transformers
    (written by process 0)."""
    flat = {k: to_host(v) for k, v in nn.flat(model.params).items()}  # every process takes part in gathering
    if not is_main():
        return Path(folder)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(to_hf_tensors(flat, model.config), folder / "model.safetensors", metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(model.raw_config, indent=2))
    if model.tokenizer is not None:
        model.tokenizer.save_pretrained(str(folder))
    return folder
