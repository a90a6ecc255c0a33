"""Declarative map from Hugging Face checkpoint keys to rmjax parameter paths.

One rule per HF tensor: a key pattern, the parameter path, and one transform from the HF
layout (torch Linear: [out, in]) to rmjax's einsum layout. The safetensors and the GGUF
loaders both feed tensors through these rules, so both produce the same tree.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable

import numpy as np

from rmjax.config import ModelConfig
from rmjax.errors import CheckpointError
from rmjax.heads import gate_modules
from rmjax.nn import Declaration

Transform = Callable[[np.ndarray, ModelConfig], np.ndarray]

# Checkpoints nest the decoder under different prefixes (plain, multimodal Gemma 3, old exports).
_PREFIXES = ("model.language_model.", "language_model.model.", "language_model.", "model.")
_IGNORED = re.compile(r"^(vision_tower|multi_modal_projector|model\.vision_tower|model\.multi_modal_projector)\.")


def normalize_key(key: str) -> str | None:
    """Strip the decoder prefix; None for tensors rmjax does not use (vision tower)."""
    if _IGNORED.match(key):
        return None
    for prefix in _PREFIXES:
        if key.startswith(prefix):
            return key[len(prefix) :]
    return key


def _identity(w: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    return w


def _transpose(w: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    return w.T


def _heads_in(n_heads: Callable[[ModelConfig], int]) -> Transform:
    """[heads*head_dim, hidden] -> [hidden, heads, head_dim]."""
    return lambda w, cfg: w.T.reshape(cfg.hidden_size, n_heads(cfg), cfg.head_dim)


def _heads_out(w: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    """[hidden, heads*head_dim] -> [heads, head_dim, hidden]."""
    return w.T.reshape(cfg.num_heads, cfg.head_dim, cfg.hidden_size)


def _heads_in_inverse(w: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    return w.reshape(cfg.hidden_size, -1).T


def _heads_out_inverse(w: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    return w.reshape(-1, cfg.hidden_size).T


# Each forward transform's inverse (rmjax layout -> HF layout), for saving checkpoints.
_INVERSE = {_identity: _identity, _transpose: _transpose, _heads_out: _heads_out_inverse}
# The same, on shapes: the HF-layout shape a tensor must have, checked before its transform reshapes it.
_HF_SHAPE = {
    _identity: lambda shape: tuple(shape),
    _transpose: lambda shape: tuple(shape)[::-1],
    _heads_out_inverse: lambda shape: (shape[2], shape[0] * shape[1]) if len(shape) == 3 else None,
    _heads_in_inverse: lambda shape: (shape[1] * shape[2], shape[0]) if len(shape) == 3 else None,
}
# The config.json fields that size a tensor of each target (named when a tensor disagrees with them).
_SIZED_BY = {"layers.q": "num_attention_heads, head_dim, hidden_size", "layers.o": "num_attention_heads, head_dim, "
             "hidden_size", "layers.k": "num_key_value_heads, head_dim, hidden_size",
             "layers.v": "num_key_value_heads, head_dim, hidden_size", "embed.embedding": "vocab_size, hidden_size",
             "score.kernel": "num_labels, hidden_size"}


@dataclasses.dataclass(frozen=True)
class Rule:
    pattern: str  # regex over the normalized HF key; (?P<layer>...) marks stacked tensors
    target: str
    transform: Transform = _identity
    hf_key: str = ""  # the key to write when saving ({layer} filled in)

    @property
    def inverse(self) -> Transform:
        return _INVERSE.get(self.transform, _heads_in_inverse)

    def hf_shape(self, shape: tuple[int, ...]) -> tuple[int, ...] | None:
        """The HF-layout shape of a parameter (slice) of rmjax shape `shape`."""
        return _HF_SHAPE[self.inverse](shape)

    def match(self, key: str) -> re.Match | None:
        return re.fullmatch(self.pattern, key)


def _rule(pattern: str, target: str, transform: Transform = _identity) -> Rule:
    key = pattern.replace(r"layers\.(?P<layer>\d+)\.", "layers.{layer}.").replace("\\.", ".")
    prefix = "" if target.startswith(("score.", "lm_head.", "head.")) else "model."
    return Rule(pattern, target, transform, prefix + key)


def hf_rules(cfg: ModelConfig) -> list[Rule]:
    layer = r"layers\.(?P<layer>\d+)\."
    # Llama's `post_attention_layernorm` is the pre-MLP norm; Gemma 2/3 name that one
    # `pre_feedforward_layernorm` and use `post_attention_layernorm` after attention.
    post_attn_target = "layers.post_attn_norm" if cfg.sandwich_norms else "layers.mlp_norm"
    rules = [
        _rule(r"embed_tokens\.weight", "embed.embedding"),
        _rule(r"norm\.weight", "final_norm.scale"),
        _rule(layer + r"input_layernorm\.weight", "layers.attn_norm"),
        _rule(layer + r"post_attention_layernorm\.weight", post_attn_target),
        _rule(layer + r"self_attn\.q_proj\.weight", "layers.q", _heads_in(lambda c: c.num_heads)),
        _rule(layer + r"self_attn\.k_proj\.weight", "layers.k", _heads_in(lambda c: c.num_kv_heads)),
        _rule(layer + r"self_attn\.v_proj\.weight", "layers.v", _heads_in(lambda c: c.num_kv_heads)),
        _rule(layer + r"self_attn\.o_proj\.weight", "layers.o", _heads_out),
        _rule(layer + r"self_attn\.q_norm\.weight", "layers.q_norm"),
        _rule(layer + r"self_attn\.k_norm\.weight", "layers.k_norm"),
        _rule(layer + r"mlp\.gate_proj\.weight", "layers.gate", _transpose),
        _rule(layer + r"mlp\.up_proj\.weight", "layers.up", _transpose),
        _rule(layer + r"mlp\.down_proj\.weight", "layers.down", _transpose),
        _rule(r"score\.weight", "score.kernel", _transpose),
    ]
    if cfg.sandwich_norms:
        rules += [
            _rule(layer + r"pre_feedforward_layernorm\.weight", "layers.mlp_norm"),
            _rule(layer + r"post_feedforward_layernorm\.weight", "layers.post_mlp_norm"),
        ]
    if not cfg.tie_embeddings and not cfg.is_reward_model:
        rules.append(_rule(r"lm_head\.weight", "lm_head.kernel", _transpose))
    if cfg.head is not None:
        if cfg.head.kind != "urm":  # their projection is `regression_layer`, not `score`
            rules = [r for r in rules if r.target != "score.kernel"]
        rules += head_rules(cfg)
    return rules


def head_rules(cfg: ModelConfig) -> list[Rule]:
    """Gated heads: ArmoRM/QRM name their projection `regression_layer` and gate `gating.layers.i`;
    URM keeps `score` and gates with `weights.fc.i`."""
    head = cfg.head
    if head.kind == "urm":
        gate, rules = r"weights\.fc\.", []
    else:
        gate = r"gating\.layers\."
        rules = [
            _rule(r"regression_layer\.weight", "score.kernel", _transpose),
            _rule(r"reward_transform_matrix", "head.transform"),
            _rule(r"gating\.logit_scale", "head.logit_scale"),
        ]
    for index, kind, name in gate_modules(head):
        if kind == "linear":
            rules.append(_rule(gate + rf"{index}\.weight", f"head.{name}", _transpose))
            rules.append(_rule(gate + rf"{index}\.bias", f"head.{name}_bias"))
        else:
            for hf, ours in (("weight", "scale"), ("bias", "shift"), ("running_mean", "mean"), ("running_var", "var")):
                rules.append(_rule(gate + rf"{index}\.{hf}", f"head.{name}_{ours}"))
    return rules


# Tensors a checkpoint may carry that the chosen head does not use.
_UNUSED = re.compile(r"(lm_head\.weight|.*rotary_emb.*|.*embed_scale|.*num_batches_tracked)")


class LazyParam:
    """One rmjax parameter backed by memmapped checkpoint tensors (views after the rule's transform).

    Indexing reads and converts only the requested slice, so each device (and each process of a
    multi-host job) reads just its own shard from disk. Stacked layer parameters hold one view
    per layer. `bytes_read` counts what indexing has read, for the load report.
    """

    def __init__(self, shape: tuple[int, ...], dtype, stacked: bool):
        self.shape, self.dtype, self.stacked = tuple(shape), np.dtype(dtype), stacked
        self.parts: dict[int, np.ndarray] = {}
        self.bytes_read = 0

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * self.dtype.itemsize

    def __getitem__(self, index) -> np.ndarray:
        index = index if isinstance(index, tuple) else (index,)
        index = tuple(i for i in index if i is not Ellipsis)
        index += (slice(None),) * (self.ndim - len(index))
        if self.stacked:
            rows = range(self.shape[0])[index[0]]
            out = np.stack([np.asarray(self.parts[i][index[1:]], self.dtype) for i in rows])
        else:
            out = np.array(self.parts[0][index], self.dtype)  # a copy: never alias the memmap
        self.bytes_read += out.nbytes
        return out

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = self[...]
        return out if dtype is None else out.astype(dtype)


def assemble(
    tensors: Iterable[tuple[str, Callable[[], np.ndarray]]],
    cfg: ModelConfig,
    declared: dict[str, Declaration],
    dtype,
    source: str,
) -> dict[str, LazyParam]:
    """Route (hf_key, loader) pairs through the rules into lazily read parameters of `dtype`.

    Nothing is read here beyond headers (transforms are views of memmaps), except where a tied causal LM's
    checkpoint also holds an lm_head.weight (`_require_tied` compares the two); shapes are checked against the
    config. Reward heads are kept in float32.
    """
    rules = hf_rules(cfg)
    out: dict[str, LazyParam] = {}
    heads: dict[str, Callable[[], np.ndarray]] = {}  # a tied LM's embedding and a separate lm_head.weight beside it
    for raw_key, load in tensors:
        key = normalize_key(raw_key)
        if key is None:
            continue
        if cfg.tie_embeddings and not cfg.is_reward_model and key in ("lm_head.weight", "embed_tokens.weight"):
            heads[key] = load
        rule = next((r for r in rules if r.match(key)), None)
        if rule is None:
            if _UNUSED.fullmatch(key):
                continue
            raise CheckpointError(
                f"{source}: unexpected tensor {raw_key!r}; this checkpoint does not match its "
                "config.json architecture (check `architectures` and `model_type`)."
            )
        if rule.target not in declared:
            raise CheckpointError(f"{source}: tensor {raw_key!r} is not used by config {cfg.architecture}.")
        decl = declared[rule.target]
        target_dtype = decl.dtype(dtype)
        m = rule.match(key)
        stacked = "layer" in m.groupdict()
        i = int(m.group("layer")) if stacked else 0
        if stacked and i >= cfg.num_layers:
            raise CheckpointError(f"{source}: {raw_key!r} beyond num_hidden_layers={cfg.num_layers}.")
        expected = decl.shape[1:] if stacked else decl.shape
        # Checked in the file's layout, before the transform's reshape (which would end in numpy's traceback)
        raw, hf_expected = load(), rule.hf_shape(expected)
        if tuple(raw.shape) != hf_expected:
            fields = _SIZED_BY.get(rule.target, "its sizes")
            hint = " (num_labels in config.json must match score.weight)" if rule.target == "score.kernel" else ""
            raise CheckpointError(
                f"{source}: {raw_key!r} has shape {tuple(raw.shape)} but config.json ({fields}) implies "
                f"{hf_expected}{hint}; use the config.json saved with these weights."
            )
        value = rule.transform(raw, cfg)
        param = out.setdefault(rule.target, LazyParam(decl.shape, target_dtype, stacked))
        if i in param.parts:
            raise CheckpointError(f"{source}: two tensors give {rule.target}{f' of layer {i}' if stacked else ''} "
                                  f"(the second is {raw_key!r}); keep only the checkpoint's own weight files.")
        param.parts[i] = value
    if len(heads) == 2:
        _require_tied(heads["lm_head.weight"], heads["embed_tokens.weight"], source)
    missing = [p for p in declared if p not in out]
    partial = [p for p, lazy in out.items() if lazy.stacked and len(lazy.parts) != cfg.num_layers]
    if missing or partial:
        what = ", ".join(missing + [f"{p} (some layers)" for p in partial])
        hint = ""
        if "score.kernel" in missing:
            hint = (
                " A reward model needs `score.weight`; a causal-LM checkpoint loads with "
                "its *ForCausalLM architecture."
            )
        raise CheckpointError(
            f"{source}: missing parameters {what}; the checkpoint is incomplete (all shards "
            f"listed in model.safetensors.index.json must be present).{hint}"
        )
    return out


def _require_tied(head: Callable[[], np.ndarray], embed: Callable[[], np.ndarray], source: str,
                  rows: int = 4096) -> None:
    """A causal LM whose config ties its embeddings reads its LM head from the embedding table: a checkpoint's own
    lm_head.weight must be that table (compared a block of rows at a time), or transformers, which then keeps the
    checkpoint's head untied, and rmjax would score with two different heads."""
    a, b = head(), embed()
    same = a.shape == b.shape and all(np.array_equal(a[i : i + rows], b[i : i + rows]) for i in range(0, len(a), rows))
    if not same:
        raise CheckpointError(f"{source}: config.json ties the LM head to the embeddings (tie_word_embeddings), but "
                              "the checkpoint's lm_head.weight differs from them; set tie_word_embeddings to false "
                              "in config.json if this head is the model's own.")


def to_hf_tensors(flat: dict[str, np.ndarray], cfg: ModelConfig) -> dict[str, np.ndarray]:
    """rmjax parameters -> HF checkpoint tensors (the inverse of `assemble`)."""
    out = {}
    for rule in hf_rules(cfg):
        if rule.target not in flat:
            continue
        value = np.asarray(flat[rule.target])
        if "(?P<layer>" in rule.pattern:
            for i in range(cfg.num_layers):
                out[rule.hf_key.format(layer=i)] = np.ascontiguousarray(rule.inverse(value[i], cfg))
        else:
            out[rule.hf_key] = np.ascontiguousarray(rule.inverse(value, cfg))
    return out
