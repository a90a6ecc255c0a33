"""Reading a transformers config.json into a ModelConfig (rmjax.config). Both formats are read: transformers 4.x
(`rope_theta` + `rope_scaling`, `rope_local_base_freq`, implied window patterns) and 5.x (`rope_parameters`,
`layer_types`)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rmjax.config import ModelConfig, RopeConfig
from rmjax.errors import CheckpointError, MissingFileError, RmjaxError, UnsupportedModelError
from rmjax.heads import ARCHITECTURES as CUSTOM_HEADS
from rmjax.heads import head_config

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



def read_json_file(path: str | Path, what: str = "file") -> Any:
    """A JSON file's value; invalid JSON is an error naming the file and where it breaks."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as error:  # RecursionError: nested too deep
        raise CheckpointError(f"{path}: invalid JSON in this {what} ({error}); restore it from the "
                              "checkpoint's original repository.") from None


def load_config_file(path: str | Path) -> ModelConfig:
    path = Path(path)
    if path.exists() and not path.is_file():
        raise CheckpointError(f"{path}: not a regular file (a folder?); a model folder needs the checkpoint's "
                              "config.json file (copy it from the original Hugging Face repository).")
    if not path.is_file():
        if (path.parent / "run.json").is_file() and (path.parent / "checkpoints").is_dir():  # train_rm's workdir
            raise MissingFileError(f"{path.parent} is a train_rm workdir, not a model folder: rerun its train_rm "
                                   "command with --export=FOLDER (a finished run exports without training again) "
                                   "and give that folder.")
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


def _token_ids(raw: dict, key: str, text: dict, source: str, several: bool = False) -> int | tuple[int, ...] | None:
    """A special token's id (`several`: or a list of them, as a tuple) from the top level, else text_config; an
    id written as "2" or 2.0 was taken, then blamed on the tokenizer files by transformers' own reading of it."""
    value = _first(raw, key, default=text.get(key))
    ids = value if several and isinstance(value, list) and value else [value]
    if value is not None and not all(isinstance(i, int) and not isinstance(i, bool) and i >= -1 for i in ids):
        raise CheckpointError(f"{source}: {key}={json.dumps(value)} must be an integer token id"
                              f"{' or a list of them' if several else ''} (or null); restore the config from the "
                              "checkpoint's original repository.")
    return tuple(value) if several and isinstance(value, list) else value


def _check_ids_in_embedding(source: str, vocab_size: int, **ids: int | tuple[int, ...] | None) -> None:
    """A special id past the embedding names no row: config.json is wrong, whatever the tokenizer (checked here,
    before transformers' own tokenizer read prints a warning of its own about it)."""
    for key, value in ids.items():
        for i in value if isinstance(value, tuple) else (value,):
            if i is not None and i >= vocab_size:
                raise CheckpointError(f"{source}: {key} {i} is past the model's embedding ({vocab_size} rows, "
                                      "vocab_size): the config is wrong, not the tokenizer; restore it from the "
                                      "checkpoint's original repository.")


_REQUIRED = object()

# transformers' config-class defaults (LlamaConfig, GemmaConfig, Gemma2Config, Gemma3TextConfig of the pinned 5.x)
# for the fields a config.json may leave out: transformers >= 4.5x writes only what differs from them (Gemma 3's
# text_config often lacks its heads and head_dim), and reads an absent field as the class default, so rmjax does
# too. An explicit null keeps its meaning (no soft cap; head_dim from hidden_size). hidden_size, intermediate_size
# and num_hidden_layers stay required: the weights fix them, and a config.json without them is a damaged one.
CLASS_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": dict(vocab_size=32_000, num_attention_heads=32, max_position_embeddings=2048, hidden_act="silu",
                  rope_theta=10_000.0),
    "gemma": dict(vocab_size=256_000, num_attention_heads=16, num_key_value_heads=16, head_dim=256,
                  max_position_embeddings=8192, hidden_act="gelu_pytorch_tanh", rope_theta=10_000.0, pad_token_id=0),
    "gemma2": dict(vocab_size=256_000, num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                   max_position_embeddings=8192, hidden_activation="gelu_pytorch_tanh", rope_theta=10_000.0,
                   query_pre_attn_scalar=256, sliding_window=4096, attn_logit_softcapping=50.0,
                   final_logit_softcapping=30.0, pad_token_id=0),
    "gemma3_text": dict(vocab_size=262_208, num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                        max_position_embeddings=131_072, hidden_activation="gelu_pytorch_tanh",
                        query_pre_attn_scalar=256, sliding_window=4096, pad_token_id=0),
}
# (the pad id matters: a classifier reads the reward before trailing pads, and Gemma's absent pad is 0, Llama's none)
# The field each family's MLP reads its activation from (transformers: Llama and Gemma 1 `hidden_act`, Gemma 2/3
# `hidden_activation`; the other one is ignored), and the names rmjax runs: ACT2FN's "gelu" is the exact (erf) GELU
# (rmjax ran the tanh approximation); only Gemma 1's config class turns "gelu" into the tanh approximation.
_ACTIVATION_FIELD = {"llama": "hidden_act", "gemma": "hidden_act", "gemma2": "hidden_activation",
                     "gemma3_text": "hidden_activation"}
_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh",
                "gelu_new": "gelu_tanh", "gelu": "gelu"}


def _activation(f: _Fields, family: str) -> str:
    """The activation the family's transformers MLP runs, from the field it reads (the other one is ignored)."""
    key = _ACTIVATION_FIELD[family]
    act = f.d.get(key)
    if family == "gemma" and act == "gelu":
        act = "gelu_pytorch_tanh"  # GemmaConfig: "gelu" of the official releases means the tanh approximation
    if act not in _ACTIVATIONS:
        raise UnsupportedModelError(f"{f.source}: {f.prefix}{key}={json.dumps(act)} is not supported (supported: "
                                    f"{', '.join(_ACTIVATIONS)}); rmjax runs only these activations.")
    return _ACTIVATIONS[act]


class _Fields:
    """A config dict's fields, each checked as it is read: a value of the wrong kind or range is refused in one
    line naming the file, the field and the value (never a traceback, never a model built on it)."""

    def __init__(self, d: dict, source: str, prefix: str = ""):
        self.d, self.source, self.prefix = d, source, prefix

    def within(self, key: str) -> _Fields:
        """The fields of the object at `key` (an absent or null one reads as empty)."""
        value = self.d.get(key)
        if value is not None and not isinstance(value, dict):
            self.refuse(key, value, "must be a JSON object")
        return _Fields(value or {}, self.source, f"{self.prefix}{key}.")

    def nonempty(self, key: str) -> bool:
        return bool(self.d.get(key))

    def refuse(self, key: str, value: Any, rule: str) -> None:
        shown = json.dumps(value) if isinstance(value, bool | int | float | str | type(None)) else repr(value)
        raise CheckpointError(f"{self.source}: {self.prefix}{key}={shown} {rule}; restore the config from the "
                              "checkpoint's original repository.")

    def get(self, *keys: str, default: Any = None) -> tuple[str, Any]:
        """(the first of `keys` set (not null), its value), or (keys[0], default)."""
        for key in keys:
            if self.d.get(key) is not None:
                return key, self.d[key]
        return keys[0], default

    def integer(self, *keys: str, default: Any = _REQUIRED, least: int = 1) -> int:
        """An integer >= `least` (not a bool, not 4.5 or 4.0, not a string)."""
        key, value = self.get(*keys, default=default)
        if value is _REQUIRED:
            raise CheckpointError(f"{self.source}: no {self.prefix}{key} (an integer >= {least}); restore the "
                                  "config from the checkpoint's original repository.")
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            self.refuse(key, value, f"must be an integer >= {least}")
        return value

    def number(self, *keys: str, default: Any = _REQUIRED) -> float:
        """A finite number > 0."""
        key, value = self.get(*keys, default=default)
        if value is _REQUIRED:
            raise CheckpointError(f"{self.source}: no {self.prefix}{key} (a number > 0); restore the config from "
                                  "the checkpoint's original repository.")
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
            self.refuse(key, value, "must be a finite number > 0")
        return float(value)

    def optional_number(self, key: str) -> float | None:
        """A finite number > 0, or None when absent or null."""
        return None if self.d.get(key) is None else self.number(key)


def _rope(top: _Fields, f: _Fields, theta_key: str, default_theta: float, max_position: int,
          nested: bool = False) -> RopeConfig:
    """One attention type's RoPE from `f`, its parameters' object (rope_parameters, rope_scaling or an entry of a
    nested rope_parameters): the base is its rope_theta, else `top`'s `theta_key`, else `default_theta`. One object
    for every layer (not `nested`) takes a top-level original_max_position_embeddings over its own, as transformers'
    standardize_rope_params does (Phi-3 style configs keep it there)."""
    kind = f.d.get("rope_type", f.d.get("type", "default"))
    if kind not in ("default", "linear", "llama3"):
        raise UnsupportedModelError(
            f"{f.source}: RoPE type {kind!r} is not supported (supported: default, linear, llama3)."
        )
    theta = f.number("rope_theta") if f.d.get("rope_theta") is not None else top.number(theta_key,
                                                                                          default=default_theta)
    return RopeConfig(
        theta=theta,
        kind=kind,
        # required where transformers requires them (its KeyError surfaced from the tokenizer's read, blamed on it)
        factor=f.number("factor") if kind != "default" else f.number("factor", default=1.0),
        low_freq_factor=f.number("low_freq_factor") if kind == "llama3" else 1.0,
        high_freq_factor=f.number("high_freq_factor") if kind == "llama3" else 4.0,
        # llama3 scaling without its own original length: the model's context (transformers does the same)
        original_max_position=top.integer("original_max_position_embeddings")
        if kind == "llama3" and not nested and top.d.get("original_max_position_embeddings") is not None else
        f.integer("original_max_position_embeddings", default=max_position if kind == "llama3" else 8192),
    )


def _refuse_flat_gemma3_rope(top: _Fields, params: _Fields) -> None:
    """Gemma3TextConfig reads only a rope_parameters nested by attention type: one flat object is ignored (global
    layers run default RoPE on the top-level rope_theta). Ignoring what it says would score another model than
    the file describes, and applying it would differ from transformers, so a flat object that asks for anything
    else is refused."""
    used = {"rope_type": "default", "type": "default", "rope_theta": top.number("rope_theta", default=1_000_000.0)}
    ignored = {key: value for key, value in params.d.items() if used.get(key, object()) != value}
    if ignored:
        raise UnsupportedModelError(
            f"{top.source}: {top.prefix}rope_parameters={json.dumps(params.d)} is one object for every layer, which "
            "transformers' Gemma 3 ignores (it reads rope_scaling, rope_theta, rope_local_base_freq and a "
            "rope_parameters nested by full_attention / sliding_attention); nest it under full_attention or move "
            "it to rope_scaling.")


def _rope_pair(top: _Fields, model_type: str, max_position: int) -> tuple[RopeConfig, RopeConfig]:
    """(global, local) RoPE configs from either config format."""
    params = top.within("rope_parameters")
    nested = "full_attention" in params.d or "sliding_attention" in params.d
    # v4 (and a flat v5 rope_parameters): one object, rope_scaling where it is set, else rope_parameters (transformers
    # reads `rope_scaling or rope_parameters`: with both, rope_scaling wins)
    flat = top.within("rope_scaling") if top.nonempty("rope_scaling") else params
    if model_type in ("gemma3_text", "gemma3"):
        if nested:  # Gemma3TextConfig updates full_attention's parameters with rope_scaling's
            full = params.within("full_attention")
            full = _Fields({**full.d, **top.within("rope_scaling").d}, full.source, full.prefix)
            glob = _rope(top, full, "rope_theta", 1_000_000.0, max_position, nested=True)
            local = _rope(top, params.within("sliding_attention"), "rope_local_base_freq", 10_000.0, max_position,
                          nested=True)
        else:  # v4: rope_theta + rope_scaling apply to global layers, rope_local_base_freq to local (transformers
            # makes them nested, so a top-level original length is not read)
            _refuse_flat_gemma3_rope(top, params)
            glob = _rope(top, top.within("rope_scaling"), "rope_theta", 1_000_000.0, max_position, nested=True)
            local = RopeConfig(theta=top.number("rope_local_base_freq", default=10_000.0))
        return glob, local
    default_theta = 10_000.0  # LlamaConfig, GemmaConfig and Gemma2Config all default to 1e4
    if top.nonempty("rope_scaling"):  # it replaces a nested rope_parameters too: one object for every layer
        nested = False
    elif nested and params.nonempty("full_attention"):
        flat = params.within("full_attention")
    rope = _rope(top, flat, "rope_theta", default_theta, max_position, nested=nested)
    return rope, rope


def _local_layers(f: _Fields, model_type: str, num_layers: int) -> tuple[bool, ...]:
    """Which layers attend within the sliding window. Only Gemma 2 and 3 window in transformers; Llama and Gemma 1
    ignore layer_types, so a file naming sliding layers there is refused rather than run either way."""
    types = f.d.get("layer_types")
    if model_type not in ("gemma2", "gemma3_text", "gemma3"):
        if isinstance(types, list) and "sliding_attention" in types:
            raise UnsupportedModelError(
                f"{f.source}: {f.prefix}layer_types names sliding_attention layers, which transformers' {model_type} "
                "never applies (every layer attends to every position); remove layer_types if the model was "
                "trained without a window, or load it as the architecture it was trained as.")
        return (False,) * num_layers
    if types:
        if not isinstance(types, list) or len(types) != num_layers:
            raise UnsupportedModelError(
                f"{f.source}: layer_types has {len(types) if isinstance(types, list) else '?'} entries for "
                f"{num_layers} layers."
            )
        unknown = sorted({str(t) for t in types} - {"sliding_attention", "full_attention"})
        if unknown:
            raise UnsupportedModelError(f"{f.source}: layer_types {', '.join(unknown)} are not supported (supported: "
                                        "sliding_attention, full_attention).")
        return tuple(t == "sliding_attention" for t in types)
    if model_type == "gemma2":  # local first: layer i is local iff i is even
        return tuple(i % 2 == 0 for i in range(num_layers))
    if model_type in ("gemma3_text", "gemma3"):
        pattern = f.integer("sliding_window_pattern", default=6)
        return tuple((i + 1) % pattern != 0 for i in range(num_layers))
    return (False,) * num_layers


def _check_head_fields(f: _Fields) -> None:
    """The gated heads' sizes (rmjax.heads reads them), checked where they are given."""
    for key in ("num_objectives", "num_quantiles", "gating_hidden_dim", "gating_block_modules"):
        if f.d.get(key) is not None:
            f.integer(key)
    if f.d.get("gating_n_hidden") is not None:
        f.integer("gating_n_hidden", least=0)
    f.optional_number("gating_temperature")


def config_from_hf(raw: dict, source: str = "config.json") -> ModelConfig:
    """Build a ModelConfig from a Hugging Face config dict (v4 or v5 format). Every path to a ModelConfig from a
    file (a folder's config.json, a GGUF file's metadata, the zoo's architectures, a plan's --model) comes here, and
    every size, count and constant is checked here: a value no model can have (0 layers, 4.5 layers, `true`, heads
    that the KV heads do not divide, an epsilon of 0) is a CheckpointError naming the file, field and value."""
    if not isinstance(raw, dict):
        raise CheckpointError(f"{source}: a model config must be a JSON object.")
    archs = raw.get("architectures") or []
    arch = archs[0] if isinstance(archs, list) and archs else ""
    model_type = raw.get("model_type", "")
    if model_type not in SUPPORTED_MODEL_TYPES or (arch and arch not in SUPPORTED_ARCHITECTURES):
        raise UnsupportedModelError(
            f"{source}: architecture {arch or '?'} (model_type {model_type or '?'}) is not supported. "
            f"rmjax runs {', '.join(sorted(SUPPORTED_ARCHITECTURES))}. Another custom head needs a port "
            "in rmjax/heads.py."
        )
    top = _Fields(raw, source)
    f = top.within("text_config") if model_type == "gemma3" and "text_config" in raw else top
    text = f.d
    if model_type == "gemma3":
        text = dict(text)
        text.setdefault("model_type", "gemma3_text")
        f = _Fields(text, source, f.prefix)
    if text.get("attention_bias") or text.get("mlp_bias"):
        raise UnsupportedModelError(f"{source}: attention_bias / mlp_bias are not supported.")
    if text.get("use_bidirectional_attention"):
        raise UnsupportedModelError(f"{source}: {f.prefix}use_bidirectional_attention=true (an encoder such as "
                                    "EmbeddingGemma) is not supported; rmjax runs causal decoders only.")
    family = text.get("model_type", model_type) if model_type == "gemma3" else model_type
    family = "gemma3_text" if family == "gemma3" else family
    if family not in CLASS_DEFAULTS:
        f.refuse("model_type", family, f"is not a text model rmjax runs ({', '.join(CLASS_DEFAULTS)})")
    text = {**CLASS_DEFAULTS[family], **text}  # absent fields only: a null stays null
    f = _Fields(text, source, f.prefix)
    hidden = f.integer("hidden_size")
    num_heads = f.integer("num_attention_heads")
    num_kv_heads = f.integer("num_key_value_heads", default=num_heads)
    if num_heads % num_kv_heads:
        f.refuse("num_key_value_heads", num_kv_heads, f"does not divide num_attention_heads={num_heads} (each "
                 "KV head serves a whole group of query heads)")
    if text.get("head_dim") is None and hidden < num_heads:
        f.refuse("hidden_size", hidden, f"is less than num_attention_heads={num_heads}, so head_dim (hidden_size // "
                 "num_attention_heads, no head_dim given) would be 0")
    head_dim = f.integer("head_dim", default=hidden // num_heads)
    num_layers = f.integer("num_hidden_layers")
    max_position = f.integer("max_position_embeddings")
    is_gemma = family.startswith("gemma")
    sandwich = family in ("gemma2", "gemma3_text")  # Gemma 2/3: query_pre_attn_scalar, soft caps, extra norms
    if sandwich:
        query_scale = f.number("query_pre_attn_scalar", default=256) ** -0.5
    else:
        query_scale = head_dim**-0.5
    activation = _activation(f, family)
    rope_global, rope_local = _rope_pair(f, family, max_position)
    local = _local_layers(f, family, num_layers)
    window = f.integer("sliding_window") if any(local) else None
    is_cls = arch.endswith("ForSequenceClassification")
    _check_head_fields(top)
    _check_head_fields(f)
    given_labels = top.integer("num_labels") if raw.get("num_labels") is not None else None
    head = head_config({**text, **raw}, arch, family)
    num_labels = head.score_width if head is not None else None
    if is_cls:
        # transformers' default is 2 labels and config.json then omits id2label.
        num_labels = given_labels or len(raw.get("id2label") or {}) or 2
    eos = _token_ids(raw, "eos_token_id", text, source, several=True)
    # the row a classifier reads ends before trailing pads of get_text_config().pad_token_id: a multimodal
    # Gemma 3's text_config's (absent: its class default, as every Gemma's), whatever the top level says
    multimodal = model_type == "gemma3" and "text_config" in raw
    pad = _token_ids({} if multimodal else raw, "pad_token_id", text, source)
    bos, vocab_size = _token_ids(raw, "bos_token_id", text, source), f.integer("vocab_size")
    _check_ids_in_embedding(source, vocab_size, bos_token_id=bos, eos_token_id=eos, pad_token_id=pad)
    return ModelConfig(
        model_type=family,
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=f.integer("intermediate_size"),
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        norm_eps=f.number("rms_norm_eps", default=1e-6),
        norm_plus_one=is_gemma,
        scale_embeddings=is_gemma,
        query_scale=query_scale,
        activation=activation,
        sandwich_norms=sandwich,
        qk_norm=family == "gemma3_text",
        # transformers: Gemma 2 caps attention logits, Gemma 3 ignores the field; both cap the LM's logits
        attn_softcap=f.optional_number("attn_logit_softcapping") if family == "gemma2" else None,
        # (a multimodal Gemma 3's LM logits are not capped: only Gemma3ForCausalLM's forward applies the cap)
        final_softcap=f.optional_number("final_logit_softcapping") if sandwich and not multimodal else None,
        local_layers=local,
        sliding_window=window,
        rope_global=rope_global,
        rope_local=rope_local,
        tie_embeddings=bool(
            _first(raw, "tie_word_embeddings", default=text.get("tie_word_embeddings", is_gemma))
        ),
        max_position_embeddings=max_position,
        num_labels=num_labels,
        head=head,
        pad_token_id=pad,
        bos_token_id=bos,
        eos_token_id=eos,
        architecture=arch,
    )
