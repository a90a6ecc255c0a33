"""GPU check: rmjax's numerics at real model shapes against transformers on the same GPU, and sweep throughput.

python bench/gpu_check.py --out=DIR --tokenizer=FOLDER [--shapes=llama3.2-1b,gemma3-1b,gemma2-2b] [--layers=N]

Needs one CUDA GPU with jax[cuda] and torch (launch/gpu.sh). Builds random reward models in the published shapes
(vocabulary 49,152 so that SmolLM2's tokenizer in FOLDER serves: the embedding's size changes neither the
numerics nor the per-candidate compute), then for each:
- rewards of 32 random 128-token rows from transformers in float64 (the reference), float32 and bfloat16, and from
  rmjax in float32 and bfloat16, each as a job computes it and in a plain jit at JAX's default matmul precision
  (TF32 for float32 on a GPU): the error of each against the reference, in SDs of the reference rewards over rows;
and for the first shape in bfloat16, the full-vocabulary sweep (prefix-cached) against transformers on the same
candidates, both the published text pipeline and token ids with no prefix cache, with the ranks' agreement with a
float32 sweep. Every time is the best of three after an untimed run of the same shape (the text pipeline: after a
warm batch). Writes DIR/gpu_check.json after every stage (a run cut short keeps what it measured).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import sys
import time
import traceback
from pathlib import Path

import numpy as np

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch shares the GPU
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.sweep_vs_reference import SHORT, jax_matmul_peak, reference_scores, rmjax_rate  # noqa: E402

VOCAB = 49152
SPECIAL = dict(vocab_size=VOCAB, pad_token_id=2, bos_token_id=1, eos_token_id=2)
_LLAMA3_ROPE = dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                    original_max_position_embeddings=8192, rope_theta=500_000.0)
# (transformers config class, reward-model class, the published config's fields)
SHAPES = {
    "llama3.2-1b": ("LlamaConfig", "LlamaForSequenceClassification", dict(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, head_dim=64, rms_norm_eps=1e-5, tie_word_embeddings=True,
        max_position_embeddings=131072, rope_parameters=_LLAMA3_ROPE)),
    "gemma3-1b": ("Gemma3TextConfig", "Gemma3TextForSequenceClassification", dict(
        hidden_size=1152, intermediate_size=6912, num_hidden_layers=26, num_attention_heads=4,
        num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256, sliding_window=512, rms_norm_eps=1e-6,
        max_position_embeddings=32768, hidden_activation="gelu_pytorch_tanh",
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}})),
    "gemma2-2b": ("Gemma2Config", "Gemma2ForSequenceClassification", dict(
        hidden_size=2304, intermediate_size=9216, num_hidden_layers=26, num_attention_heads=8,
        num_key_value_heads=4, head_dim=256, query_pre_attn_scalar=256, sliding_window=4096,
        attn_logit_softcapping=50.0, final_logit_softcapping=30.0, rms_norm_eps=1e-6,
        hidden_activation="gelu_pytorch_tanh", max_position_embeddings=8192,
        rope_parameters={"rope_type": "default", "rope_theta": 10_000.0})),
}


def build(name: str, folder: Path, tokenizer: Path, layers: int | None, device: str, kind: str = "rm",
          seed: int = 0):
    """A random reward model of the shape `name` (transformers' own initialisation), saved in float32; with `kind`
    "lm", the causal LM of the same backbone (embeddings tied)."""
    import torch
    import transformers

    config_cls, model_cls, fields = SHAPES[name]
    if kind == "lm":
        model_cls = model_cls.replace("TextFor", "For").replace("ForSequenceClassification", "ForCausalLM")
    fields = dict(fields, **SPECIAL, num_labels=1)
    if layers:
        fields["num_hidden_layers"] = layers
    if name.startswith("gemma3"):
        n = fields["num_hidden_layers"]
        fields["layer_types"] = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(n)]
    config = getattr(transformers, config_cls)(**fields)
    torch.manual_seed(seed)
    with torch.device(device):
        model = getattr(transformers, model_cls)(config).eval()
    shutil.rmtree(folder, ignore_errors=True)
    model.save_pretrained(folder, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (tokenizer / f).is_file():
            shutil.copy(tokenizer / f, folder / f)
    return model


def torch_rewards(model, ids: np.ndarray, dtype, device: str) -> tuple[np.ndarray, float]:
    import torch

    model = model.to(dtype)
    x = torch.from_numpy(ids).to(device)
    best = float("inf")
    with torch.no_grad():
        model(input_ids=x)  # warm
        for _ in range(3):
            torch.cuda.synchronize() if device == "cuda" else None
            start = time.perf_counter()
            out = model(input_ids=x).logits[:, 0].double().cpu().numpy()
            best = min(best, time.perf_counter() - start)
    return out, best


def rmjax_rewards(model, ids: np.ndarray, raw_jit: bool) -> tuple[np.ndarray, float]:
    """rmjax's reward call as a job runs it, or (`raw_jit`) the same function in a plain jit at JAX's default
    matmul precision, to show what the library's precision setting changes."""
    import jax
    import jax.numpy as jnp

    from rmjax.scoring.calls import _rewards, rewards

    fn = jax.jit(functools.partial(_rewards, model.config)) if raw_jit else None
    x, m = jnp.asarray(ids), jnp.ones(ids.shape, bool)

    def call():
        return (fn(model.params, x, m) if raw_jit else rewards(model, x, m)).block_until_ready()

    call()
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        out = np.asarray(call())[:, 0].astype(np.float64)
        best = min(best, time.perf_counter() - start)
    return out, best


def numerics(name: str, folder: Path, args, device: str) -> dict:
    import torch

    from rmjax.loading import load

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    t0 = time.perf_counter()
    hf = build(name, folder, Path(args.tokenizer), args.layers, device)
    ids = np.random.default_rng(0).integers(3, VOCAB, size=(32, 128)).astype(np.int32)
    row = {"build_s": round(time.perf_counter() - t0, 1), "layers": hf.config.num_hidden_layers,
           "params_M": round(sum(p.numel() for p in hf.parameters()) / 1e6, 1)}
    hf.set_attn_implementation("eager")
    ref, _ = torch_rewards(hf, ids, torch.float64, device)
    sd = float(ref.std())
    row["reference_sd"] = sd
    seconds = {}
    results = {}
    try:
        hf.set_attn_implementation("sdpa")  # transformers' default where the architecture has it
    except ValueError:  # Gemma 2's soft cap: eager only
        hf.set_attn_implementation("eager")
    for label, dtype in (("transformers float32", torch.float32), ("transformers bfloat16", torch.bfloat16)):
        results[label], seconds[label] = torch_rewards(hf, ids, dtype, device)
    del hf
    torch.cuda.empty_cache() if device == "cuda" else None
    for dtype in ("float32", "bfloat16"):
        model = load(str(folder), dtype=dtype, require_tokenizer=False)
        for raw_jit in (False, True):
            label = f"rmjax {dtype}" + (", plain jit at JAX's default precision" if raw_jit else "")
            results[label], seconds[label] = rmjax_rewards(model, ids, raw_jit)
        del model
    for label, got in results.items():
        err = np.abs(got - ref)
        row[label] = {"max_err_sd": float(err.max() / sd), "rms_err_sd": float(np.sqrt((err**2).mean()) / sd),
                      "forward_ms": round(1e3 * seconds[label], 2)}
    return row


def sweep(folder: Path, args, device: str) -> dict:
    """Full-vocabulary sweep of the first shape: rmjax bf16 (prefix cache) against transformers bf16."""
    import scipy.stats
    import torch
    import transformers

    from rmjax.loading import load
    from rmjax.text import chat

    tokens = np.arange(VOCAB)[: args.n_sweep]
    model = load(str(folder), dtype="bfloat16")
    split = chat.split_chat(model.tokenizer, SHORT)
    ours, t_ours = rmjax_rate(model, SHORT, tokens, args.batch_size)
    del model
    model32 = load(str(folder), dtype="float32")
    ours32, t_ours32 = rmjax_rate(model32, SHORT, tokens, args.batch_size, repeats=1)
    del model32
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(
        str(folder), dtype=torch.bfloat16, attn_implementation="sdpa").to(device).eval()
    rows = np.array([split.ids_with([int(t)]) for t in tokens], np.int64)
    t_theirs = float("inf")
    with torch.no_grad():
        hf(input_ids=torch.from_numpy(rows[: args.batch_size]).to(device))  # a whole batch, untimed
        for _ in range(3):  # best of three, as rmjax's rate
            torch.cuda.synchronize() if device == "cuda" else None
            start, theirs = time.perf_counter(), []
            for s in range(0, len(rows), args.batch_size):
                x = torch.from_numpy(rows[s : s + args.batch_size]).to(device)
                theirs.append(hf(input_ids=x).logits[:, 0].float().cpu().numpy())
            t_theirs = min(t_theirs, time.perf_counter() - start)
    theirs = np.concatenate(theirs)
    del hf
    torch.cuda.empty_cache() if device == "cuda" else None
    _, t_text = reference_scores(folder, SHORT, tokens[: args.n_text], batch=256, device=device, dtype="bfloat16")
    sd = float(ours32.std())
    top = np.argsort(-ours32)[:100]
    return {
        "candidates": len(tokens), "positions_per_candidate": 1 + len(split.suffix), "prefix": len(split.prefix),
        "rmjax bf16 cand/s": len(tokens) / t_ours, "rmjax f32 cand/s": len(tokens) / t_ours32,
        "transformers bf16 token ids cand/s": len(tokens) / t_theirs,
        "transformers bf16 text pipeline cand/s": args.n_text / t_text,
        "bf16 vs f32 spearman": float(scipy.stats.spearmanr(ours, ours32).statistic),
        "transformers bf16 vs f32 spearman": float(scipy.stats.spearmanr(theirs, ours32).statistic),
        "bf16 max err sd": float(np.abs(ours - ours32).max() / sd),
        "transformers bf16 max err sd": float(np.abs(theirs - ours32).max() / sd),
        "bf16 top100 overlap": len(set(top) & set(np.argsort(-ours)[:100])),
        "transformers bf16 top100 overlap": len(set(top) & set(np.argsort(-theirs)[:100])),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokenizer", required=True, help="A folder with SmolLM2's tokenizer.json and template.")
    ap.add_argument("--shapes", default="llama3.2-1b,gemma3-1b,gemma2-2b")
    ap.add_argument("--layers", type=int, default=None, help="Fewer layers (a quick run on a CPU).")
    ap.add_argument("--n_sweep", type=int, default=VOCAB)
    ap.add_argument("--n_text", type=int, default=2048)
    ap.add_argument("--batch_size", type=int, default=1024)
    ap.add_argument("--skip_sweep", action="store_true")
    args = ap.parse_args()
    import jax
    import torch
    import transformers

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    report = {"jax": jax.__version__, "torch": torch.__version__, "transformers": transformers.__version__,
              "devices": [str(d) for d in jax.devices()],
              "torch_device": torch.cuda.get_device_name() if device == "cuda" else "cpu"}

    def save(key, fn):
        start = time.perf_counter()
        try:
            report[key] = fn()
        except Exception:  # a failed stage is reported, the next still runs
            report[key] = {"error": traceback.format_exc()[-3000:]}
        report[key + " seconds"] = round(time.perf_counter() - start, 1)
        (out / "gpu_check.json").write_text(json.dumps(report, indent=1))
        print(key, json.dumps(report[key], indent=1), flush=True)

    save("bf16 matmul peak TFLOP/s", lambda: jax_matmul_peak(n=8192 if device == "cuda" else 1024, dtype="bfloat16")
         / 1e3)
    shapes = args.shapes.split(",")
    work = Path(os.environ.get("TMPDIR", "/tmp")) / "rmjax-gpu-check"
    for i, name in enumerate(shapes):
        save(f"numerics {name}", lambda name=name: numerics(name, work / name, args, device))
        if i == 0 and not args.skip_sweep:
            save(f"sweep {name}", lambda name=name: sweep(work / name, args, device))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
