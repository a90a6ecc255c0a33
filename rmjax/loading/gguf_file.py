"""GGUF files -> a Hugging Face-layout folder (config.json, safetensors, tokenizer), cached.

Dequantization is numpy-only (`gguf.quants.dequantize`). Each GGUF tensor maps to one HF key
with one transform (Llama q/k rows un-permuted from llama.cpp's interleaved RoPE layout, Gemma
norms stored as 1 + w); the HF folder then goes through the same weight rules as any
checkpoint, so both loaders produce the same parameter tree.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from rmjax.errors import CheckpointError, MissingFileError, UnsupportedModelError
from rmjax.hf_config import config_from_hf
from rmjax.loading.gguf_reader import GGUFContents, TruncatedError, read_contents
from rmjax.loading.gguf_tokenizer import check_special_ids, refuse_added_tokens, tokenizer_from_gguf
from rmjax.loading.identity import READING, content_digest
from rmjax.loading.safetensors_io import save_file
from rmjax.runs import locks
from rmjax.runs.results import package_version

_ARCHS = {
    "llama": ("LlamaForCausalLM", "llama"),
    "gemma": ("GemmaForCausalLM", "gemma"),
    "gemma2": ("Gemma2ForCausalLM", "gemma2"),
    "gemma3": ("Gemma3ForCausalLM", "gemma3_text"),
}


def _field(contents: GGUFContents, key: str, default=None):
    return contents.metadata.get(key, default)


def _unpermute(n_heads: int) -> Callable[[np.ndarray], np.ndarray]:
    """Undo llama.cpp's per-head interleaving of q/k rows (HF uses the half-split layout)."""

    def fn(w: np.ndarray) -> np.ndarray:
        rows, cols = w.shape
        return w.reshape(n_heads, rows // n_heads // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)

    return fn


def _minus_one(w: np.ndarray) -> np.ndarray:
    return w - 1.0


def _identity(w: np.ndarray) -> np.ndarray:
    return w


def hf_config_from_gguf(contents: GGUFContents, path: Path) -> dict:
    parts = _field(contents, "split.count", 1)
    if parts and int(parts) > 1:  # gguf-split: the other parts hold tensors this file only counts
        raise UnsupportedModelError(
            f"{path}: part {int(_field(contents, 'split.no', 0)) + 1} of {int(parts)} of a split GGUF; merge the parts "
            f"into one file (llama.cpp: `llama-gguf-split --merge {path.name} merged.gguf`) and give that.")
    arch = _field(contents, "general.architecture")
    if arch not in _ARCHS:
        raise UnsupportedModelError(
            f"{path}: GGUF architecture {arch!r} is not supported (supported: {', '.join(_ARCHS)})."
        )
    names = {t.name for t in contents.tensors}
    if "rope_freqs.weight" in names:
        raise UnsupportedModelError(
            f"{path}: GGUF files with a rope_freqs tensor (Llama 3.1+ rope scaling) are not supported; "
            "load the Hugging Face safetensors checkpoint instead."
        )
    # Sizes go into the config as the file has them: config_from_hf (below) checks every one, naming the file.
    a = lambda key, default=None: _field(contents, f"{arch}.{key}", default)  # noqa: E731
    hidden = a("embedding_length")
    heads = a("attention.head_count")
    vocab = a("vocab_size", len(contents.metadata.get("tokenizer.ggml.tokens", ())))
    eps = a("attention.layer_norm_rms_epsilon", 1e-6)
    cls, model_type = _ARCHS[arch]
    cfg = {
        "architectures": [cls],
        "model_type": model_type,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": a("feed_forward_length"),
        "num_hidden_layers": a("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": a("attention.head_count_kv", heads),
        "head_dim": a("attention.key_length", _quotient(hidden, heads)),
        "max_position_embeddings": a("context_length", 8192),
        "rms_norm_eps": float(np.float32(eps)) if _is_number(eps) else eps,  # stored as float32
        "tie_word_embeddings": "output.weight" not in names,
        "bos_token_id": _field(contents, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _field(contents, "tokenizer.ggml.eos_token_id"),
        "pad_token_id": _field(contents, "tokenizer.ggml.padding_token_id"),
    }
    theta = a("rope.freq_base")
    if arch == "llama":
        cfg["hidden_act"] = "silu"
        cfg["rope_theta"] = float(theta if theta is not None else 10_000.0)
    elif arch == "gemma":
        cfg["hidden_act"] = "gelu_pytorch_tanh"  # the field GemmaConfig reads (Gemma 2/3: hidden_activation)
        cfg["rope_theta"] = float(theta or 10_000.0)  # llama.cpp reads {arch}.rope.freq_base for every family
    else:
        cfg["hidden_activation"] = "gelu_pytorch_tanh"
    scaling = _rope_scaling(a, arch, path)
    if scaling:
        cfg["rope_scaling"] = scaling
    if arch == "gemma2":
        cfg["rope_theta"] = float(theta or 10_000.0)
        cfg["sliding_window"] = a("attention.sliding_window", 4096)
        cfg["attn_logit_softcapping"] = a("attn_logit_softcapping", 50.0)
        cfg["final_logit_softcapping"] = a("final_logit_softcapping", 30.0)
        cfg["query_pre_attn_scalar"] = _query_scalar(a, cfg, 46)  # the 27B: 46 layers, HF's 144
    if arch == "gemma3":
        # GGUF stores only the global base; the local base, window pattern and query scalar are
        # Gemma 3 constants (transformers' GGUF import uses the same defaults).
        cfg["rope_theta"] = float(theta or 1_000_000.0)
        cfg["rope_local_base_freq"] = 10_000.0
        cfg["sliding_window"] = a("attention.sliding_window", 512)
        cfg["sliding_window_pattern"] = 6
        cfg["query_pre_attn_scalar"] = _query_scalar(a, cfg, 62)  # the 27B: 62 layers, HF's 168
    check_special_ids(contents, path)  # the file's own tokens first: config_from_hf would blame a config.json
    config_from_hf(cfg, source=f"{path} (GGUF metadata)")  # refused now, before any tensor is converted
    return cfg


def _query_scalar(a, cfg: dict, layers_27b: int):
    """llama.cpp's query scale for Gemma 2 and 3, which GGUF does not store: 1/sqrt(n_embd / n_head) for the 27B
    (known by its layer count), 1/sqrt(head_dim) for every other size (256 for Gemma 2 2B/9B, Gemma 3 270M-12B)."""
    if a("block_count") == layers_27b:
        return _quotient(cfg["hidden_size"], cfg["num_attention_heads"])
    return cfg["head_dim"]


def _rope_scaling(a, arch: str, path: Path) -> dict | None:
    """`{arch}.rope.scaling.type` / `.factor` (or the older `rope.scale_linear`), as llama.cpp reads them (a factor
    without a type is linear), as HF's rope_scaling; None for no scaling. llama.cpp's convert writes them for
    Gemma 3 4B-27B (linear x8 on the global layers)."""
    factor = a("rope.scaling.factor", a("rope.scale_linear"))
    kind = a("rope.scaling.type", "linear")
    if kind == "none" or factor is None or factor in (0, 1):
        return None
    if kind != "linear":
        raise UnsupportedModelError(f"{path}: {arch}.rope.scaling.type={kind!r} is not supported (supported: none, "
                                    "linear); load the Hugging Face safetensors checkpoint instead.")
    return {"rope_type": "linear", "factor": float(np.float32(factor)) if _is_number(factor) else factor}


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _quotient(hidden, heads) -> int | None:
    """hidden // heads where both are positive integers; else None (config_from_hf refuses the bad one)."""
    ok = all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (hidden, heads))
    return hidden // heads if ok else None


def gguf_key_map(cfg: dict) -> list[tuple[str, str, Callable]]:
    """(GGUF name regex, HF key template, transform) for one architecture."""
    gemma = cfg["model_type"].startswith("gemma")
    sandwich = cfg["model_type"] in ("gemma2", "gemma3_text")
    norm = _minus_one if gemma else _identity
    q = _identity if gemma else _unpermute(cfg["num_attention_heads"])
    k = _identity if gemma else _unpermute(cfg["num_key_value_heads"])
    blk = r"blk\.(\d+)\."
    layer = "model.layers.{}."
    ffn_norm = "pre_feedforward_layernorm" if sandwich else "post_attention_layernorm"
    return [
        (r"token_embd\.weight", "model.embed_tokens.weight", _identity),
        (r"output_norm\.weight", "model.norm.weight", norm),
        (r"output\.weight", "lm_head.weight", _identity),
        (blk + r"attn_norm\.weight", layer + "input_layernorm.weight", norm),
        (blk + r"ffn_norm\.weight", layer + ffn_norm + ".weight", norm),
        (blk + r"post_attention_norm\.weight", layer + "post_attention_layernorm.weight", norm),
        (blk + r"post_ffw_norm\.weight", layer + "post_feedforward_layernorm.weight", norm),
        (blk + r"attn_q_norm\.weight", layer + "self_attn.q_norm.weight", norm),
        (blk + r"attn_k_norm\.weight", layer + "self_attn.k_norm.weight", norm),
        (blk + r"attn_q\.weight", layer + "self_attn.q_proj.weight", q),
        (blk + r"attn_k\.weight", layer + "self_attn.k_proj.weight", k),
        (blk + r"attn_v\.weight", layer + "self_attn.v_proj.weight", _identity),
        (blk + r"attn_output\.weight", layer + "self_attn.o_proj.weight", _identity),
        (blk + r"ffn_gate\.weight", layer + "mlp.gate_proj.weight", _identity),
        (blk + r"ffn_up\.weight", layer + "mlp.up_proj.weight", _identity),
        (blk + r"ffn_down\.weight", layer + "mlp.down_proj.weight", _identity),
    ]


def gguf_to_hf_folder(path: str | Path, out: Path) -> Path:
    """Convert a GGUF file into an HF-layout folder (float32 weights, tokenizer, template)."""

    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"{path}: no such GGUF file.")
    return _convert(path, out, time.perf_counter())


def _convert(path: Path, out: Path, start: float) -> Path:
    import gguf

    contents = read_gguf(path)
    cfg = hf_config_from_gguf(contents, path)
    tokenizer = tokenizer_from_gguf(contents, cfg["model_type"], path)
    rules = [(re.compile(p), key, fn) for p, key, fn in gguf_key_map(cfg)]
    tensors = {}
    for t in contents.tensors:
        for pattern, key, fn in rules:
            m = pattern.fullmatch(t.name)
            if m:
                try:
                    w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
                except NotImplementedError:  # gguf has no numpy dequantizer for some types (Q8_1, ...)
                    raise UnsupportedModelError(
                        f"{path}: tensor {t.name!r} is quantized as {t.tensor_type.name}, which the installed gguf "
                        f"{package_version('gguf')} cannot dequantize; use a GGUF of another quantization (Q8_0, "
                        "Q4_K, F16) or the Hugging Face safetensors checkpoint.") from None
                tensors[key.format(*m.groups())] = fn(w)
                break
        else:
            raise CheckpointError(f"{path}: GGUF tensor {t.name!r} has no mapping for {cfg['model_type']}.")
    _check_whole(tensors, cfg, path)
    refuse_added_tokens(tokenizer, contents, path)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt", "source": path.name})
    del tensors, contents
    tokenizer.save_pretrained(str(out))
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    (out / "rmjax_source.json").write_text(
        json.dumps({"gguf": str(path), "convert_seconds": time.perf_counter() - start}, indent=2)
    )
    return out


def read_gguf(path: Path) -> GGUFContents:
    """The metadata and tensor table of `path`; a truncated or corrupt file is an error naming it."""
    try:
        return read_contents(path)
    except TruncatedError as error:
        raise CheckpointError(f"{path}: {error}; download it again.") from None
    except (ValueError, OSError) as error:
        raise CheckpointError(f"{path}: not a readable GGUF file, probably truncated or corrupt "
                              f"({type(error).__name__}: {str(error)[:120]}); download it again.") from None


def _check_whole(tensors: dict[str, np.ndarray], cfg: dict, path: Path) -> None:
    """The converted tensors against the model the metadata describes, before anything is written: a tensor
    missing or of another size was found only when the converted folder loaded, named by the cache folder with a
    safetensors folder's fix, and the broken conversion stayed in the cache."""
    from rmjax import nn
    from rmjax.loading.weights import assemble

    model_cfg = config_from_hf(cfg, str(path))
    try:
        assemble(((key, lambda w=w: w) for key, w in tensors.items()), model_cfg, nn.declarations(model_cfg),
                 np.float32, str(path))
    except CheckpointError as error:
        said = str(error).removeprefix(f"{path}: ").split("; ")[0].replace("config.json", "its metadata")
        raise CheckpointError(f"{path}: this GGUF file is not the whole model its metadata describes ({said}); "
                              "convert it again with llama.cpp's convert_hf_to_gguf.py, or load the Hugging Face "
                              "folder instead.") from None


def cached_hf_folder(path: str | Path, cache_root: Path) -> Path:
    """The converted folder for `path`, converting on first use, keyed by file name, size, mtime, the content
    fingerprint that job identities record (another file put in its place with the same size and mtime, as `cp -p`
    leaves it, is converted anew, never served the old file's weights) and identity.READING (a folder an older
    reading converted is converted anew)."""
    path = Path(path).resolve()
    if not path.is_file():
        raise MissingFileError(f"{path}: no such GGUF file.")
    st = path.stat()
    key = f"{path}|{st.st_size}|{st.st_mtime_ns}|{content_digest(path)}|{READING}"
    digest = hashlib.sha1(key.encode()).hexdigest()[:12]
    out = cache_root / "converted" / f"{path.stem}-{digest}"
    if (out / "config.json").is_file():
        return out
    # One conversion at a time per file: a second process waits, then uses the first one's result.
    with locks.hold(out, wait=True, what=f"converting {path.name}"):
        if (out / "config.json").is_file():
            return out
        tmp = out.with_name(out.name + ".partial")
        if tmp.exists():
            shutil.rmtree(tmp)
        gguf_to_hf_folder(path, tmp)
        tmp.rename(out)
    return out
