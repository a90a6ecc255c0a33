"""ModelConfig: every architectural constant of a Llama/Gemma checkpoint, read from its config.json.

Gemma 1/2/3 and Llama 3.x differ only in the fields of this dataclass; the numerics core in
`rmjax.nn.ops` / `rmjax.model` branches on these fields, never on a family name.
Both config formats are read: transformers 4.x (`rope_theta` + `rope_scaling`,
`rope_local_base_freq`, implied window patterns) and 5.x (`rope_parameters`, `layer_types`).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from rmjax.errors import CheckpointError, MissingFileError, RmjaxError, UnsupportedModelError
from rmjax.heads import ARCHITECTURES as CUSTOM_HEADS
from rmjax.heads import HeadConfig, head_config

# Causal-LM and sequence-classification classes per HF model_type.
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "LlamaForSequenceClassification": "llama",
    "GemmaForCausalLM": "gemma",
    "GemmaForSequenceClassification": "gemma",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma2ForSequenceClassification": "gemma2",
    "Gemma3ForCausalLM": "gemma3_text",
    "Gemma3TextForSequenceClassification": "gemma3_text",
    "Gemma3ForSequenceClassification": "gemma3",
    "Gemma3ForConditionalGeneration": "gemma3",
    **{arch: "gemma2" if arch.startswith("Gemma2") else "llama" for arch in CUSTOM_HEADS},
}
SUPPORTED_MODEL_TYPES = ("llama", "gemma", "gemma2", "gemma3_text", "gemma3")


@dataclasses.dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding of one attention type (local or global layers)."""

    theta: float
    kind: str = "default"  # default | linear | llama3
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Hashable (static under jit) description of one decoder-only model and its head."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    norm_eps: float
    norm_plus_one: bool  # Gemma: x * (1 + w) computed in f32; Llama: w * x after casting back
    scale_embeddings: bool  # Gemma: embeddings * sqrt(hidden), the scalar cast to the weight dtype
    query_scale: float
    activation: str  # silu | gelu_tanh
    sandwich_norms: bool  # Gemma 2/3: extra norms after attention and after the MLP
    qk_norm: bool  # Gemma 3: RMSNorm over head_dim on q and k before RoPE
    attn_softcap: float | None
    final_softcap: float | None  # applies to LM logits only, never to a reward head
    local_layers: tuple[bool, ...]  # True where the layer uses the sliding window and local RoPE
    sliding_window: int | None
    rope_global: RopeConfig
    rope_local: RopeConfig
    tie_embeddings: bool
    max_position_embeddings: int
    num_labels: int | None = None  # None: causal LM (no score head); width of the linear `score`
    head: HeadConfig | None = None  # gated heads of published RMs (ArmoRM, QRM, URM); None: linear
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    architecture: str = ""

    @property
    def is_reward_model(self) -> bool:
        return self.num_labels is not None

    @property
    def num_outputs(self) -> int:
        """Columns of `rewards`: the score head's outputs, or a gated head's score + objectives."""
        return self.head.num_outputs if self.head is not None else (self.num_labels or 0)

    @property
    def has_local_layers(self) -> bool:
        return any(self.local_layers)

    @property
    def non_embedding_params(self) -> int:
        """Parameter count of the decoder layers (what each token position multiplies through)."""
        h, d = self.hidden_size, self.head_dim
        attn = h * d * (2 * self.num_heads + 2 * self.num_kv_heads)
        mlp = 3 * h * self.intermediate_size
        return self.num_layers * (attn + mlp)

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)


def read_json_file(path: str | Path, what: str = "file") -> Any:
    """A JSON file's value; invalid JSON is an error naming the file and where it breaks."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{path}: invalid JSON in this {what} ({error}); restore it from the "
                              "checkpoint's original repository.") from None


def load_config_file(path: str | Path) -> ModelConfig:
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(
            f"{path} not found: a model folder needs the checkpoint's config.json "
            "(copy it from the original Hugging Face repository)."
        )
    raw = read_json_file(path, "model config")
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: a model config must be a JSON object.")
    try:
        return config_from_hf(raw, source=str(path))
    except (KeyError, TypeError, ValueError) as error:
        if isinstance(error, RmjaxError):
            raise
        raise CheckpointError(f"{path}: missing or invalid field ({type(error).__name__}: {error}); restore "
                              "config.json from the checkpoint's original repository.") from None


def _first(d: dict, *keys: str, default: Any = None) -> Any:
    for key in keys:
        if d.get(key) is not None:
            return d[key]
    return default


def _rope(params: dict | None, theta: float | None, default_theta: float) -> RopeConfig:
    params = dict(params or {})
    theta = params.get("rope_theta", theta if theta is not None else default_theta)
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ("default", "linear", "llama3"):
        raise UnsupportedModelError(
            f"RoPE type {kind!r} is not supported (supported: default, linear, llama3)."
        )
    return RopeConfig(
        theta=float(theta),
        kind=kind,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position=int(params.get("original_max_position_embeddings", 8192)),
    )


def _rope_pair(d: dict, model_type: str) -> tuple[RopeConfig, RopeConfig]:
    """(global, local) RoPE configs from either config format."""
    params = d.get("rope_parameters")
    nested = isinstance(params, dict) and (
        "full_attention" in params or "sliding_attention" in params
    )
    if model_type in ("gemma3_text", "gemma3"):
        if nested:
            glob = _rope(params.get("full_attention"), d.get("rope_theta"), 1_000_000.0)
            local = _rope(params.get("sliding_attention"), d.get("rope_local_base_freq"), 10_000.0)
        else:  # v4: rope_theta + rope_scaling apply to global layers, rope_local_base_freq to local
            glob = _rope(params or d.get("rope_scaling"), d.get("rope_theta"), 1_000_000.0)
            local = RopeConfig(theta=float(d.get("rope_local_base_freq", 10_000.0)))
        return glob, local
    if nested:
        params = params.get("full_attention")
    default_theta = 500_000.0 if model_type == "llama" else 10_000.0
    rope = _rope(params or d.get("rope_scaling"), d.get("rope_theta"), default_theta)
    if rope.kind == "llama3" and "original_max_position_embeddings" not in (
        params or d.get("rope_scaling") or {}
    ):
        rope = dataclasses.replace(rope, original_max_position=int(d["max_position_embeddings"]))
    return rope, rope


def _local_layers(d: dict, model_type: str, num_layers: int) -> tuple[bool, ...]:
    if d.get("layer_types"):
        types = d["layer_types"]
        if len(types) != num_layers:
            raise UnsupportedModelError(
                f"layer_types has {len(types)} entries for {num_layers} layers."
            )
        return tuple(t == "sliding_attention" for t in types)
    if model_type == "gemma2":  # local first: layer i is local iff i is even
        return tuple(i % 2 == 0 for i in range(num_layers))
    if model_type in ("gemma3_text", "gemma3"):
        pattern = int(d.get("sliding_window_pattern", 6))
        return tuple((i + 1) % pattern != 0 for i in range(num_layers))
    return (False,) * num_layers


def config_from_hf(raw: dict, source: str = "config.json") -> ModelConfig:
    """Build a ModelConfig from a Hugging Face config dict (v4 or v5 format)."""
    archs = raw.get("architectures") or []
    arch = archs[0] if archs else ""
    model_type = raw.get("model_type", "")
    if model_type not in SUPPORTED_MODEL_TYPES or (arch and arch not in SUPPORTED_ARCHITECTURES):
        raise UnsupportedModelError(
            f"{source}: architecture {arch or '?'} (model_type {model_type or '?'}) is not supported. "
            f"rmjax runs {', '.join(sorted(SUPPORTED_ARCHITECTURES))}. Another custom head needs a port "
            "in rmjax/heads.py."
        )
    text = raw.get("text_config", raw) if model_type == "gemma3" else raw
    if model_type == "gemma3":
        text = dict(text)
        text.setdefault("model_type", "gemma3_text")
    if text.get("attention_bias") or text.get("mlp_bias"):
        raise UnsupportedModelError(f"{source}: attention_bias / mlp_bias are not supported.")
    family = text.get("model_type", model_type) if model_type == "gemma3" else model_type
    hidden = int(text["hidden_size"])
    num_heads = int(text["num_attention_heads"])
    head_dim = int(_first(text, "head_dim", default=hidden // num_heads))
    num_layers = int(text["num_hidden_layers"])
    is_gemma = family.startswith("gemma")
    if family in ("gemma2", "gemma3_text"):
        query_scale = float(text.get("query_pre_attn_scalar", 256)) ** -0.5
    else:
        query_scale = head_dim**-0.5
    act = _first(text, "hidden_activation", "hidden_act", default="silu")
    if act in ("gelu_pytorch_tanh", "gelu_tanh", "gelu"):
        # Gemma 1 configs say "gelu" but transformers runs the tanh approximation.
        activation = "gelu_tanh"
    elif act == "silu":
        activation = "silu"
    else:
        raise UnsupportedModelError(f"{source}: activation {act!r} is not supported.")
    rope_global, rope_local = _rope_pair(text, family)
    local = _local_layers(text, family, num_layers)
    window = text.get("sliding_window") if any(local) else None
    is_cls = arch.endswith("ForSequenceClassification")
    head = head_config({**text, **raw}, arch, family)
    num_labels = head.score_width if head is not None else None
    if is_cls:
        # transformers' default is 2 labels and config.json then omits id2label.
        num_labels = int(raw.get("num_labels") or len(raw.get("id2label") or {}) or 2)
    eos = _first(raw, "eos_token_id", default=text.get("eos_token_id"))
    return ModelConfig(
        model_type=family,
        vocab_size=int(text["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(text["intermediate_size"]),
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=int(_first(text, "num_key_value_heads", default=num_heads)),
        head_dim=head_dim,
        norm_eps=float(_first(text, "rms_norm_eps", default=1e-6)),
        norm_plus_one=is_gemma,
        scale_embeddings=is_gemma,
        query_scale=query_scale,
        activation=activation,
        sandwich_norms=family in ("gemma2", "gemma3_text"),
        qk_norm=family == "gemma3_text",
        attn_softcap=text.get("attn_logit_softcapping") if family == "gemma2" else None,
        final_softcap=text.get("final_logit_softcapping") if family != "gemma" else None,
        local_layers=local,
        sliding_window=int(window) if window else None,
        rope_global=rope_global,
        rope_local=rope_local,
        tie_embeddings=bool(
            _first(raw, "tie_word_embeddings", default=text.get("tie_word_embeddings", is_gemma))
        ),
        max_position_embeddings=int(text.get("max_position_embeddings", 8192)),
        num_labels=num_labels,
        head=head,
        pad_token_id=_first(raw, "pad_token_id", default=text.get("pad_token_id")),
        bos_token_id=_first(raw, "bos_token_id", default=text.get("bos_token_id")),
        eos_token_id=tuple(eos) if isinstance(eos, list) else eos,
        architecture=arch,
    )


def embedding_scale(cfg: ModelConfig) -> float:
    return math.sqrt(cfg.hidden_size) if cfg.scale_embeddings else 1.0
