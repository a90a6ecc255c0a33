"""A reward model made from a causal LM: its backbone with a new (seeded) or given one-label score head.

Used by training (a new head) and by the builtin reward models (a committed head), so it lives with
loading and training imports it, never the other way round.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from rmjax import nn
from rmjax.errors import UsageError
from rmjax.loading.identity import array_digest, derived
from rmjax.model import Model
from rmjax.parallel.distributed import replicated

SEQUENCE_CLASSIFIERS = {
    "llama": "LlamaForSequenceClassification",
    "gemma": "GemmaForSequenceClassification",
    "gemma2": "Gemma2ForSequenceClassification",
    "gemma3_text": "Gemma3TextForSequenceClassification",
}


def init_score_head(hidden_size: int, seed: int = 0, std: float = 0.02) -> np.ndarray:
    """[hidden, 1] float32, as transformers initializes `score` (normal, initializer_range)."""
    return (np.random.default_rng(seed).normal(0.0, std, size=(hidden_size, 1))).astype(np.float32)


def new_head_fingerprint(lm_fingerprint: dict | None, seed: int) -> dict | None:
    """Fingerprint of the LM with a freshly initialized score head (seed): a training run's starting point."""
    return None if lm_fingerprint is None else derived(lm_fingerprint, score_init_seed=seed)


def reward_config(lm_config):
    """The config of a one-label reward model made from an LM of this config."""
    return lm_config.replace(num_labels=1, architecture=SEQUENCE_CLASSIFIERS[lm_config.model_type])


def reward_model_from_lm(lm: Model, score: np.ndarray | None = None, seed: int = 0, source: str | None = None) -> Model:
    """The LM's backbone with a (new or given) one-label score head; the LM head is dropped."""
    cfg = reward_config(lm.config)
    head = init_score_head(cfg.hidden_size, seed) if score is None else np.asarray(score, np.float32)
    if head.shape != (cfg.hidden_size, 1):
        raise UsageError(f"score head has shape {head.shape}, expected ({cfg.hidden_size}, 1).")
    weights = {k: v for k, v in nn.flat(lm.params).items() if not k.startswith("lm_head.")}
    placed = jnp.asarray(head) if lm.mesh is None else replicated(head, lm.mesh)
    params = nn.from_flat(cfg, {**weights, "score.kernel": placed})
    raw = {k: v for k, v in lm.raw_config.items() if k not in ("num_labels", "id2label", "label2id")}
    raw.update(architectures=[cfg.architecture], id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0})
    if lm.config.model_type == "gemma3_text":
        raw["model_type"] = "gemma3_text"
    fp = (new_head_fingerprint(lm.fingerprint, seed) if score is None
          else None if lm.fingerprint is None else derived(lm.fingerprint, head=array_digest(head)))
    return dataclasses.replace(lm, config=cfg, params=params, raw_config=raw, source=source or lm.source,
                               output_column=0).stamp(fp)
