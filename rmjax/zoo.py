"""The ten published reward models of the papers: ids, heads, and their architectures.

rmjax never downloads: a hub id resolves to a folder the user already has, under
$RMJAX_MODELS_DIR/<org>/<name>, or in the Hugging Face hub cache (models--org--name/snapshots/*).
The architecture configs let `jax.eval_shape` build each model at its real size for free.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx

from rmjax import nn
from rmjax.config import ModelConfig
from rmjax.errors import UsageError
from rmjax.hf_config import config_from_hf


@dataclasses.dataclass(frozen=True)
class ZooEntry:
    hf_id: str
    nickname: str
    backbone: str  # key of BACKBONES
    head: str  # score | urm | armorm | qrm
    dtype: str = "bfloat16"
    size: str = ""


_GEMMA2 = dict(model_type="gemma2", hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6, rope_theta=10_000.0,
               attn_logit_softcapping=50.0, final_logit_softcapping=30.0, sliding_window=4096,
               max_position_embeddings=8192, vocab_size=256_000, tie_word_embeddings=True)
_LLAMA31_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                 "original_max_position_embeddings": 8192}
BACKBONES = {
    "gemma-2-27b": dict(_GEMMA2, hidden_size=4608, intermediate_size=36864, num_hidden_layers=46,
                        num_attention_heads=32, num_key_value_heads=16, head_dim=128, query_pre_attn_scalar=144),
    "gemma-2-2b": dict(_GEMMA2, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                       num_attention_heads=8, num_key_value_heads=4, head_dim=256, query_pre_attn_scalar=256),
    "llama-3.1-8b": dict(model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, vocab_size=128_256, rms_norm_eps=1e-5,
                         rope_theta=500_000.0, rope_scaling=_LLAMA31_ROPE, max_position_embeddings=131_072,
                         tie_word_embeddings=False, hidden_act="silu"),
    "llama-3-8b": dict(model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=8, vocab_size=128_256, rms_norm_eps=1e-5,
                       rope_theta=500_000.0, max_position_embeddings=8192, tie_word_embeddings=False,
                       hidden_act="silu"),
    "llama-3.2-3b": dict(model_type="llama", hidden_size=3072, intermediate_size=8192, num_hidden_layers=28,
                         num_attention_heads=24, num_key_value_heads=8, head_dim=128, vocab_size=128_256,
                         rms_norm_eps=1e-5, rope_theta=500_000.0, max_position_embeddings=131_072,
                         rope_scaling=dict(_LLAMA31_ROPE, factor=32.0), tie_word_embeddings=True,
                         hidden_act="silu"),
    # no published RM of this size: a backbone to plan a 70B reward model on a TPU slice (experiments.plan)
    "llama-3.1-70b": dict(model_type="llama", hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                          num_attention_heads=64, num_key_value_heads=8, vocab_size=128_256, rms_norm_eps=1e-5,
                          rope_theta=500_000.0, rope_scaling=_LLAMA31_ROPE, max_position_embeddings=131_072,
                          tie_word_embeddings=False, hidden_act="silu"),
}
# Published parameter counts of the causal LMs (model cards), for the eval_shape checks.
PUBLISHED_LM_PARAMS = {"llama-3.1-70b": 70.6e9,
                       "gemma-2-27b": 27.2e9, "gemma-2-2b": 2.61e9, "llama-3.1-8b": 8.03e9, "llama-3-8b": 8.03e9,
                       "llama-3.2-3b": 3.21e9}

ZOO = [
    ZooEntry("nicolinho/QRM-Gemma-2-27B", "N-Gem-27B", "gemma-2-27b", "qrm", size="27B"),
    ZooEntry("Skywork/Skywork-Reward-Gemma-2-27B-v0.2", "S-Gem-27B-v0.2", "gemma-2-27b", "score", size="27B"),
    ZooEntry("Skywork/Skywork-Reward-Gemma-2-27B", "S-Gem-27B", "gemma-2-27b", "score", size="27B"),
    ZooEntry("Skywork/Skywork-Reward-Llama-3.1-8B-v0.2", "S-Lla-8B-v0.2", "llama-3.1-8b", "score", size="8B"),
    ZooEntry("nicolinho/QRM-Llama3.1-8B", "N-Lla-8B", "llama-3.1-8b", "qrm", size="8B"),
    ZooEntry("LxzGordon/URM-LLaMa-3.1-8B", "L-Lla-8B", "llama-3.1-8b", "urm", size="8B"),
    ZooEntry("Ray2333/GRM-Llama3-8B-rewardmodel-ft", "R-Lla-8B", "llama-3-8b", "score", size="8B"),
    ZooEntry("Ray2333/GRM-Llama3.2-3B-rewardmodel-ft", "R-Lla-3B", "llama-3.2-3b", "score", size="3B"),
    ZooEntry("RLHFlow/ArmoRM-Llama3-8B-v0.1", "F-Lla-8B-v0.1", "llama-3-8b", "armorm", size="8B"),
    ZooEntry("Ray2333/GRM-gemma2-2B-rewardmodel-ft", "R-Gem-2B", "gemma-2-2b", "score", size="2B"),
]
BY_ID = {e.hf_id: e for e in ZOO}
_CLASSIFIERS = {"gemma2": "Gemma2ForSequenceClassification", "llama": "LlamaForSequenceClassification"}
# Architecture names and head constants of the custom heads, as their config.json files carry them.
_HEADS = {
    "armorm": dict(architectures=["LlamaForRewardModelWithGating"], num_objectives=19, gating_hidden_dim=1024,
                   gating_n_hidden=3, gating_temperature=10),
    "qrm": dict(architectures=["LlamaForRewardModelWithGating31"], num_objectives=19, num_quantiles=19),
    "urm": dict(architectures=["LlamaForSequenceClassificationWithNormal_Weights"], num_labels=10),
}
_QRM_GEMMA = dict(architectures=["Gemma2ForRewardModelWithGating"], num_objectives=5, num_quantiles=19)


def architecture_config(entry: ZooEntry, num_labels: int = 1) -> ModelConfig:
    """The backbone with the entry's head: a `num_labels` score head, or its custom gated head."""
    raw = dict(BACKBONES[entry.backbone])
    raw["architectures"] = [_CLASSIFIERS[raw["model_type"]]]
    raw["num_labels"] = num_labels
    if entry.head in _HEADS:
        raw.update(_QRM_GEMMA if entry.head == "qrm" and raw["model_type"] == "gemma2" else _HEADS[entry.head])
    return config_from_hf(raw, source=entry.hf_id)


def abstract_params(cfg: ModelConfig, dtype=jnp.bfloat16) -> nnx.State:
    """The model's nnx state with ShapeDtypeStruct leaves (nnx.eval_shape: no memory used)."""
    return nnx.state(nn.abstract(cfg, dtype))


def count_params(params) -> int:
    return sum(int(x.size) for x in jax.tree.leaves(params))


def local_folder(hf_id: str) -> Path | None:
    """A folder holding `hf_id` already on this machine, or None."""
    org, _, name = hf_id.partition("/")
    roots = [Path(p) for p in os.environ.get("RMJAX_MODELS_DIR", "").split(os.pathsep) if p]
    for root in roots:
        for cand in (root / org / name, root / name):
            if (cand / "config.json").is_file():
                return cand
    hub = Path(os.environ.get("HF_HUB_CACHE", Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
                              / "hub"))
    repo = hub / f"models--{org}--{name}"
    main = repo / "refs" / "main"  # the revision the hub's own local lookup takes; other snapshots are older
    if main.is_file():
        folder = repo / "snapshots" / main.read_text().strip()
        if (folder / "config.json").is_file():
            return folder
        raise UsageError(f"{hf_id}: the Hugging Face cache's refs/main names {folder}, which holds no config.json; "
                         "download the model again or give its folder.")
    snapshots = sorted((repo / "snapshots").glob("*/config.json"))
    if len(snapshots) > 1:
        raise UsageError(f"{hf_id}: {len(snapshots)} snapshots in the Hugging Face cache ({repo}) and no refs/main "
                         "to say which is current; give the snapshot's folder as the model.")
    return snapshots[0].parent if snapshots else None
