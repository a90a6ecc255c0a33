"""The Bradley–Terry objective. A trained reward model is written as a Hugging Face folder by the one writer every
job uses, rmjax.loading.export.save_hf_folder (importable from here too)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rmjax.loading.export import HF_FOLDER_FILES, save_hf_folder

__all__ = ["HF_FOLDER_FILES", "bradley_terry_loss", "save_hf_folder"]


def bradley_terry_loss(r_chosen: jax.Array, r_rejected: jax.Array, label: jax.Array) -> jax.Array:
    """Mean of -[y log σ(d) + (1 - y) log σ(-d)], d = r_chosen - r_rejected (y = 1: hard labels)."""
    d = r_chosen - r_rejected
    return -jnp.mean(label * jax.nn.log_sigmoid(d) + (1.0 - label) * jax.nn.log_sigmoid(-d))
