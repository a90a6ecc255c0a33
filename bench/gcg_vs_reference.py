"""GCG step time: rmjax vs a PyTorch GCG step (transformers), same model, N, search_width, topk, in one run.

The model is the default reward model `elo-rm-smollm2-135m` (SmolLM2-135M backbone + EloEverything
head), exported once as a Hugging Face folder so transformers runs exactly the same weights.
The PyTorch step is the nanoGCG recipe without a prefix cache (as in the reference fork): gradient
of the reward w.r.t. the one-hot response through inputs_embeds over the whole conversation,
top-k per position, `search_width` random single swaps, all evaluated as full sequences; its [N, V]
gradient is argsorted on the host. rmjax keeps the gradient on the device (top-k and sampling there).
Both sides run with the retokenization filter off; their random swaps come from different generators.

python bench/gcg_vs_reference.py [--steps=5] [--num_tokens=8] [--search_width=128] [--topk=64]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
PROMPT = "What, in one word, is the greatest thing ever?"


def exported_model(folder: Path) -> Path:
    from rmjax.loading import load
    from rmjax.train.rm import save_hf_folder

    if not (folder / "config.json").is_file():
        save_hf_folder(load("elo-rm-smollm2-135m"), folder)
    return folder


class TorchGCG:
    def __init__(self, folder: Path, prefix, suffix, batch: int = 64):
        import torch
        import transformers

        torch.set_num_threads(os.cpu_count() or 1)  # as many as JAX uses
        self.torch = torch
        self.model = transformers.AutoModelForSequenceClassification.from_pretrained(
            str(folder), dtype=torch.float32, attn_implementation="sdpa").eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.embed = self.model.get_input_embeddings().weight
        self.prefix, self.suffix, self.batch = torch.tensor(prefix), torch.tensor(suffix), batch

    def grad(self, ids: np.ndarray) -> np.ndarray:
        torch = self.torch
        one_hot = torch.nn.functional.one_hot(torch.from_numpy(ids).long(), self.embed.shape[0]).float()
        one_hot.requires_grad_()
        embeds = torch.cat([self.embed[self.prefix], one_hot @ self.embed, self.embed[self.suffix]])
        reward = self.model(inputs_embeds=embeds[None]).logits[0, 0]
        reward.backward()
        return one_hot.grad.numpy()

    def rewards(self, cands: np.ndarray) -> np.ndarray:
        torch = self.torch
        n = len(cands)
        full = torch.cat([self.prefix.expand(n, -1), torch.from_numpy(cands).long(), self.suffix.expand(n, -1)], 1)
        out = []
        with torch.no_grad():
            for s in range(0, n, self.batch):
                out.append(self.model(input_ids=full[s : s + self.batch]).logits[:, 0].numpy())
        return np.concatenate(out)


def reference_candidates(current: np.ndarray, grad: np.ndarray, topk: int, width: int, rng) -> np.ndarray:
    """The reference's sampling: the [N, V] gradient on the host, argsorted, one random top-k swap per candidate."""
    top = np.argsort(grad, axis=1)[:, :topk]
    cands = np.repeat(current[None], width, axis=0)
    positions = rng.integers(0, len(current), size=width)
    cands[np.arange(width), positions] = top[positions, rng.integers(0, topk, size=width)]
    return cands


def run_torch(tg: TorchGCG, init: np.ndarray, banned: np.ndarray, args) -> tuple[float, float, list[float]]:
    rng = np.random.default_rng(0)
    current, best = init.copy(), float(tg.rewards(init[None])[0])
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        g = -tg.grad(current)
        g[:, banned] = np.inf
        # each distinct candidate once, as rmjax's filter_candidates: ~113 of 128 here (scoring the repeats was
        # 12% more work on this side, not speed)
        cands = np.unique(reference_candidates(current, g, args.topk, args.search_width, rng), axis=0)
        r = tg.rewards(cands)
        if r.max() > best:
            best, current = float(r.max()), cands[r.argmax()]
        times.append(time.perf_counter() - start)
    return float(np.median(times)), best, times


def measure(steps: int = 5, num_tokens: int = 8, search_width: int = 128, topk: int = 64) -> dict:
    """Median step times of both (rmjax after its compiling step) and the best rewards they reach."""
    from rmjax.loading import load
    from rmjax.loading.registry import cache_dir
    from rmjax.search.gcg import gcg, make_target
    from rmjax.search.gcg_config import GCGConfig
    from rmjax.search.gcg_swaps import disallowed_ids

    folder = exported_model(cache_dir() / "bench" / "elo-rm-smollm2-135m-hf")
    model = load(str(folder))
    target = make_target(model, PROMPT)
    cfg = GCGConfig(num_tokens=num_tokens, steps=steps + 1, search_width=search_width, topk=topk, n_replace=1,
                    retokenize_filter=False, forbid_revisits=False, seed=0)
    res = gcg([target], cfg)  # step 1 includes compilation
    step_times = np.diff([0.0] + [h["seconds"] for h in res.history])[1:]
    banned = disallowed_ids(model.tokenizer, model.config.vocab_size, False, False)
    init = np.asarray(model.tokenizer(" x" * num_tokens, add_special_tokens=False).input_ids[:num_tokens])
    tg = TorchGCG(folder, target.prefix, target.suffix)
    args = argparse.Namespace(steps=steps, search_width=search_width, topk=topk)
    theirs, their_best, _ = run_torch(tg, init, banned, args)
    return {"prefix": len(target.prefix), "ours": float(np.median(step_times)), "theirs": theirs,
            "ours_candidates": float(np.mean([h["candidates"] for h in res.history[1:]])),
            "ours_best": res.history[steps - 1]["reward"], "their_best": their_best,
            "start": float(tg.rewards(init[None])[0])}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--num_tokens", type=int, default=8)
    ap.add_argument("--search_width", type=int, default=128)
    ap.add_argument("--topk", type=int, default=64)
    args = ap.parse_args()
    m = measure(args.steps, args.num_tokens, args.search_width, args.topk)
    print(f"model: elo-rm-smollm2-135m (f32), prompt prefix {m['prefix']} tokens, N={args.num_tokens}, "
          f"search_width={args.search_width}, topk={args.topk}, n_replace=1, {os.cpu_count()} CPU cores")
    print(f"PyTorch GCG step (transformers, no prefix cache): {m['theirs']:.2f} s (median of {args.steps})")
    print(f"rmjax GCG step (jit, prefix cache):               {m['ours']:.2f} s (median of {args.steps}, after "
          "compile)")
    print(f"speed-up: {m['theirs'] / m['ours']:.1f}x (each side scores the distinct candidates of its draw; "
          f"rmjax's mean {m['ours_candidates']:.0f} a step)")
    print(f"best reward after {args.steps} steps: rmjax {m['ours_best']:.4f}, PyTorch {m['their_best']:.4f} "
          f"(start {m['start']:.4f})")


if __name__ == "__main__":
    main()
