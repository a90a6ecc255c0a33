"""ModelConfig: every architectural constant of a Llama/Gemma checkpoint (read from its config.json by
rmjax.hf_config).

Gemma 1/2/3 and Llama 3.x differ only in the fields of this dataclass; the numerics core in
`rmjax.nn.ops` / `rmjax.model` branches on these fields, never on a family name.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from rmjax.heads import HeadConfig


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
    activation: str  # silu | gelu_tanh | gelu (exact)
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


def embedding_scale(cfg: ModelConfig) -> float:
    return math.sqrt(cfg.hidden_size) if cfg.scale_embeddings else 1.0
