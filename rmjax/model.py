"""A loaded model (config, params, tokenizer, where it came from) and the one refusal of a causal LM where a reward
head is needed. Its forwards are compiled calls (rmjax.compiled; rmjax.scoring.calls for the plain ones).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
from flax import nnx

from rmjax import nn
from rmjax.config import ModelConfig
from rmjax.errors import UsageError


@dataclasses.dataclass
class Model:
    """A loaded model: static config, parameters (possibly sharded), tokenizer. Loads of the same tokenizer files
    in one process share one tokenizer object (rmjax.loading.hf): copy it (`copy.deepcopy`) before changing it."""

    config: ModelConfig
    params: nnx.State  # the nnx state of `module` (rmjax.nn.Transformer)
    tokenizer: Any
    source: str
    dtype: str = "float32"
    mesh: jax.sharding.Mesh | None = None
    load_seconds: float = 0.0
    raw_config: dict = dataclasses.field(default_factory=dict)  # config.json as read (for saving)
    weight_bytes: int = 0  # the parameters' size in the loaded dtype
    weight_bytes_read: int = 0  # what this process read from disk for its own devices' shards
    fingerprint: dict | None = None  # {"weights", "tokenizer"} content digests (rmjax.loading.identity)
    fingerprint_of: tuple[int, int] | None = None  # id() of the params and tokenizer it describes
    output_column: int = 0  # which head output jobs read (a run option: --output_column), not architecture
    training: dict | None = None  # the training recipe the checkpoint records (rmjax.loading.registry), read at load

    def __post_init__(self):
        if self.fingerprint is not None and self.fingerprint_of is None:
            self.fingerprint_of = (id(self.params), id(self.tokenizer))

    def stamp(self, fingerprint: dict | None) -> Model:
        """Record the fingerprint of the current params and tokenizer (after loading or placing them)."""
        self.fingerprint, self.fingerprint_of = fingerprint, (id(self.params), id(self.tokenizer))
        return self

    @property
    def module(self) -> nn.Transformer:
        """The model as an nnx module sharing these params (nnx.display, nnx.state, per-layer calls)."""
        return nn.module(self.params, self.config)

    @property
    def chat_template(self) -> str | None:
        return getattr(self.tokenizer, "chat_template", None) if self.tokenizer is not None else None


def require_reward_model(cfg: ModelConfig, source: str, job: str = "scoring", output_column: int = 0,
                         chosen: bool = True) -> None:
    """The one refusal of a causal LM where a reward head is needed (before or after the weights load), and of an
    --output_column the head lacks: from the config, before a claim's --overwrite deletes an earlier result."""
    if not cfg.is_reward_model:
        arch = cfg.architecture or ("config.json names no architectures; a reward model's says e.g. "
                                    "LlamaForSequenceClassification")
        raise UsageError(f"{source} has no score head ({arch}); {job} needs a reward model "
                         "(*ForSequenceClassification). For a causal LM use experiments.logprobs.")
    check_output_column(cfg, output_column, source, chosen)


def check_output_column(cfg: ModelConfig, column: int, source: str, chosen: bool = True) -> int:
    """`column` when the model has that reward output, else a UsageError naming the range. A linear head of
    several outputs (a classifier: num_labels 2 or more, e.g. 'negative'/'positive') says nothing of which is a
    reward: its column 0 was read as the reward, unsaid. Unless `chosen` (--output_column given), refused."""
    if not 0 <= column < cfg.num_outputs:
        raise UsageError(f"--output_column={column}: {source} has {cfg.num_outputs} reward outputs "
                         f"(0..{cfg.num_outputs - 1}).")
    if not chosen and cfg.head is None and cfg.num_outputs > 1:
        raise UsageError(f"{source} has a score head of {cfg.num_outputs} outputs (num_labels {cfg.num_outputs} in "
                         "its config.json: a classifier), and which one is the reward is not said; name it with "
                         f"--output_column=N (0..{cfg.num_outputs - 1}; its config's id2label names each).")
    return column
