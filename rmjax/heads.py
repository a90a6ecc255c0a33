"""Custom reward heads of published RMs: ArmoRM, QRM (Llama 3.1 / Gemma 2) and URM.

All of them start from the same linear projection of the last token's hidden state that a
plain `*ForSequenceClassification` head computes (rmjax's `score` parameter); a small gating
network then weights those outputs. ArmoRM and QRM gate on the hidden state at the start of the
last "end of user turn → assistant header" token pattern (the prompt end, which the sweep's
cached prefix holds), URM on the last token itself. Outputs, float32, per row:
column 0 the preference score (what the published code returns as `score`/`logits[:, 0]`),
then the per-objective rewards (ArmoRM: raw regression outputs; QRM: quantile means after the
transform matrix; URM: the ten raw score outputs).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from rmjax.errors import CheckpointError, UsageError

# "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n" (Llama 3) and
# "<end_of_turn>\n<start_of_turn>model\n" (Gemma 2): where the published gates read the prompt.
GATE_PATTERNS = {"llama": (128009, 128006, 78191, 128007, 271), "gemma2": (107, 108, 106, 2516, 108)}
ARCHITECTURES = {
    "LlamaForRewardModelWithGating": "armo",
    "LlamaForRewardModelWithGating3": "qrm",
    "LlamaForRewardModelWithGating31": "qrm",
    "Gemma2ForRewardModelWithGating": "qrm",
    "LlamaForSequenceClassificationWithNormal_Weights": "urm",
}


@dataclasses.dataclass(frozen=True)
class HeadConfig:
    """Shape and constants of a gated head, read from config.json (defaults: the published code's)."""

    kind: str  # armo | qrm | urm
    num_objectives: int
    num_quantiles: int = 1
    gate_hidden: int = 1024
    gate_layers: int = 3  # hidden Linear layers before the output layer
    temperature: float = 10.0
    gate_bias: bool = True  # hidden Linear layers carry a bias (ArmoRM, URM); QRM's feed a BatchNorm
    batchnorm: bool = False
    block_modules: int = 1  # torch modules per hidden block in `gating.layers` (QRM: Linear, ReLU, BN[, Dropout])
    batchnorm_eps: float = 1e-5
    transform: bool = True  # a fixed `reward_transform_matrix` follows the regression (not in QRM-Gemma)
    pattern: tuple[int, ...] = ()  # empty: gate on the last token (URM)

    @property
    def score_width(self) -> int:
        """Columns of the linear projection (`score`) the gate weights."""
        return self.num_objectives * self.num_quantiles if self.kind != "urm" else 2 * self.num_objectives

    @property
    def num_outputs(self) -> int:
        return 1 + (self.score_width if self.kind == "urm" else self.num_objectives)


def head_config(raw: dict, arch: str, model_type: str) -> HeadConfig | None:
    kind = ARCHITECTURES.get(arch)
    if kind is None:
        return None
    if kind == "urm":
        labels = int(raw.get("num_labels") or len(raw.get("id2label") or {}) or 10)
        return HeadConfig("urm", num_objectives=labels // 2, gate_hidden=int(raw["hidden_size"]), gate_layers=2,
                          block_modules=2, temperature=1.0)  # fc = Linear, SELU, Linear, SELU, Linear
    quantiles = int(raw.get("num_quantiles") or 1) if kind == "qrm" else 1
    qrm = kind == "qrm"
    return HeadConfig(
        kind=kind,
        num_objectives=int(raw.get("num_objectives", 5 if model_type == "gemma2" else 19)),
        num_quantiles=quantiles,
        gate_hidden=int(raw.get("gating_hidden_dim", 1024)),
        gate_layers=int(raw.get("gating_n_hidden", 3)),
        temperature=float(raw.get("gating_temperature", 10)),
        gate_bias=not qrm,
        batchnorm=qrm,
        # Unverified for QRM-Gemma-2-27B (its modeling file was not available): Linear, ReLU, BN, Dropout.
        block_modules=int(raw.get("gating_block_modules", 4 if model_type == "gemma2" else 3)) if qrm else 1,
        transform=model_type != "gemma2",
        pattern=tuple(raw.get("gating_token_pattern") or GATE_PATTERNS.get(model_type, GATE_PATTERNS["llama"])),
    )


def gate_modules(head: HeadConfig) -> list[tuple[int, str, str]]:
    """(index in the torch Sequential/ModuleList, 'linear' | 'batchnorm', rmjax name) of each gate layer."""
    modules = []
    for i in range(head.gate_layers):
        modules.append((i * head.block_modules, "linear", f"gate{i}"))
        if head.batchnorm:
            modules.append((i * head.block_modules + 2, "batchnorm", f"bn{i}"))
    modules.append((head.gate_layers * head.block_modules, "linear", f"gate{head.gate_layers}"))
    return modules


def _gate(p: dict, head: HeadConfig, x: jax.Array) -> jax.Array:
    """Gate weights [B, objectives] from the gate's input hidden state [B, H]."""
    hi = jax.lax.Precision.HIGHEST
    for i in range(head.gate_layers + 1):
        x = jnp.matmul(x, p[f"gate{i}"], precision=hi)
        if f"gate{i}_bias" in p:
            x = x + p[f"gate{i}_bias"]
        if i == head.gate_layers:
            break
        x = jax.nn.selu(x) if head.kind == "urm" else jax.nn.relu(x)
        if head.batchnorm:  # eval-mode BatchNorm1d
            x = (x - p[f"bn{i}_mean"]) * jax.lax.rsqrt(p[f"bn{i}_var"] + head.batchnorm_eps)
            x = x * p[f"bn{i}_scale"] + p[f"bn{i}_shift"]
    if head.kind == "urm":
        return x
    return jax.nn.softmax(x / head.temperature, axis=-1) * p["logit_scale"][0]


def apply(p: dict, head: HeadConfig, scores: jax.Array, gate_input: jax.Array) -> jax.Array:
    """[B, num_outputs] float32 from the linear projection `scores` [B, score_width] and the gate input."""
    weights = _gate(p, head, gate_input.astype(jnp.float32))
    hi = jax.lax.Precision.HIGHEST
    if head.kind == "urm":
        means = scores.reshape(scores.shape[0], head.num_objectives, 2)[..., 0]  # (mean, spread) pairs
        return jnp.concatenate([jnp.sum(means * weights, axis=-1, keepdims=True), scores], axis=-1)
    per_objective = scores.reshape(scores.shape[0], head.num_objectives, head.num_quantiles).mean(axis=-1)
    adjusted = jnp.matmul(per_objective, p["transform"], precision=hi) if head.transform else per_objective
    score = jnp.sum(weights * adjusted, axis=-1, keepdims=True)
    # ArmoRM reports its raw regression outputs, QRM the transformed quantile means.
    return jnp.concatenate([score, adjusted if head.kind == "qrm" else per_objective], axis=-1)


def pattern_starts(head: HeadConfig, ids: jax.Array, mask: jax.Array) -> jax.Array:
    """[B, T]: at position j, the start of the last occurrence of the gate pattern among real tokens that ends at or
    before j (where the conversation cut after token j reads its gate); -1 where none does."""
    n, t = len(head.pattern), ids.shape[-1]
    if t < n:
        return jnp.full(ids.shape, -1, jnp.int32)
    real = jnp.where(mask.astype(bool), ids, -1)
    hit = jnp.ones(real[..., : t - n + 1].shape, bool)
    for k, token in enumerate(head.pattern):
        hit &= real[..., k : t - n + 1 + k] == token
    starts = jnp.where(hit, jnp.arange(t - n + 1), -1).astype(jnp.int32)
    ended = jnp.concatenate([jnp.full((*ids.shape[:-1], n - 1), -1, jnp.int32), starts], axis=-1)  # at s + n - 1
    return jax.lax.cummax(ended, axis=ended.ndim - 1)


def pattern_start(head: HeadConfig, ids: jax.Array, mask: jax.Array) -> jax.Array:
    """[B] start of the last occurrence of the gate pattern among real tokens; -1 where absent."""
    return pattern_starts(head, ids, mask)[..., -1]


def moves_gate(head: HeadConfig | None, prefix: list[int], continuation: list[int]) -> bool:
    """Whether an occurrence of a gated head's pattern ends inside `continuation` after `prefix`: then the gate
    is read there (its last occurrence), not at the cached prefix's (KVCache.gate_input), and the row needs a
    whole forward. A response text holding the pattern's special-token strings tokenizes to it, as transformers
    does."""
    if head is None or not head.pattern:
        return False
    n = len(head.pattern)
    ids = list(prefix)[max(0, len(prefix) - n + 1):] + list(continuation)
    return any(ids[j : j + n] == list(head.pattern) for j in range(len(ids) - n + 1))


def check_search_keeps_gate(head: HeadConfig | None, prefix: list[int], allowed, longest: int, tokenizer=None,
                            suffix=()) -> None:
    """Refuse a search whose responses (1 to `longest` tokens, each `allowed(id)`, then the template's `suffix`)
    could finish a gated head's pattern after `prefix` (moves_gate): the searches score from the cached prefix's
    gate, so such a response would be scored with another gate than its conversation has. Only --allow_special
    lets one (the pattern holds specials)."""
    if head is None or not head.pattern:
        return
    pattern, prefix, suffix = [int(t) for t in head.pattern], [int(t) for t in prefix], [int(t) for t in suffix]

    def fits(start: int, length: int) -> bool:  # an occurrence at `start` (relative to the response's first token)
        for i, token in enumerate(pattern):
            at = start + i
            if at < 0 and (len(prefix) + at < 0 or prefix[at] != token):
                return False
            if 0 <= at < length and not allowed(token):
                return False
            if at >= length and (at - length >= len(suffix) or suffix[at - length] != token):
                return False
        return True

    if not any(fits(start, length) for length in range(1, longest + 1)
               for start in range(1 - len(pattern), length + len(suffix))):
        return
    shown = repr(tokenizer.decode(pattern)) if tokenizer is not None else str(pattern)
    raise UsageError(f"the {head.kind} head gates on its pattern {shown}, and the search's tokens can write it into a "
                     "response, which would move the gate where the search does not read it: leave out its "
                     "special tokens (search without --allow_special, or name the tokens with --token_ids / "
                     "--vocab_file).")


def gate_input(head: HeadConfig, ids: jax.Array, mask: jax.Array, hidden: jax.Array) -> jax.Array:
    """Hidden state [B, H] at the gate pattern of each row; NaN rows where the pattern is missing."""
    return _rows_at(hidden, pattern_start(head, ids, mask)[:, None])[:, 0]


def prefix_gate_inputs(head: HeadConfig, ids: jax.Array, mask: jax.Array, hidden: jax.Array) -> jax.Array:
    """[B, T, H]: the gate input of each row cut after each of its tokens (NaN where the cut holds no pattern)."""
    return _rows_at(hidden, pattern_starts(head, ids, mask))


def _rows_at(hidden: jax.Array, starts: jax.Array) -> jax.Array:
    """hidden [B, T, H] at positions starts [B, K] in float32, NaN rows where a start is -1."""
    rows = jnp.take_along_axis(hidden, jnp.maximum(starts, 0)[..., None], axis=1).astype(jnp.float32)
    return jnp.where((starts >= 0)[..., None], rows, jnp.nan)


def require_pattern(head: HeadConfig | None, ids, what: str) -> None:
    """Fail early, naming the fix, when a prompt-gated head cannot find its gate token pattern."""
    if head is None or not head.pattern:
        return
    ids, n = list(np.asarray(ids).tolist()), len(head.pattern)
    if any(ids[j : j + n] == list(head.pattern) for j in range(len(ids) - n + 1)):
        return
    raise CheckpointError(
        f"{what}: the {head.kind} head gates on the hidden state at token pattern {list(head.pattern)} "
        "(end of the user turn + assistant header), which this prompt's tokens do not contain. Use the "
        "checkpoint's own chat template (--template=chat) and its own tokenizer."
    )
