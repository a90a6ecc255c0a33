"""Inspect throughput: reward lens + per-token curve + integrated gradients (64 steps) for 16 responses, rmjax vs
the same computed with transformers the way the PyTorch tools do (a forward with hidden states per response for
the lens, one forward per prefix for the curve as reward-bench's per_token_reward, one forward + backward per
IG step), in one run; per-response time ratio. Both keep the template's special tokens out of the IG path. IG is
compared by completeness (sum against R(x) − R(baseline)): rmjax's path is adaptive, the reference's uniform.

Model: the SmolLM2-135M-shaped reward model of bench/sweep_vs_reference.py (f32, random weights, real tokenizer
and chat template). rmjax runs all 16 responses after a compiling run; the reference runs `--n_ref` of them.

python bench/inspect_vs_reference.py [--n_ref=2] [--steps=64]
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

from bench import sweep_vs_reference  # noqa: E402

WORDS = ["love", "war", "hope", "music", "science", "freedom", "money", "death", "friendship", "chocolate", "art",
         "nature", "justice", "family", "knowledge", "peace"]


def reference(folder: Path, conversations: list[list[int]], starts: list[int], steps: int,
              special: set[int]) -> tuple[float, dict]:
    import torch
    import transformers

    torch.set_num_threads(os.cpu_count() or 1)  # as many as JAX uses
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        str(folder), dtype=torch.float32, attn_implementation="sdpa").eval()
    table = model.get_input_embeddings().weight.detach()
    pad = model.config.pad_token_id
    out = {"lens": [], "curve": [], "ig_sum": [], "completeness_gap": [], "ends": []}
    start = time.perf_counter()
    for ids, first in zip(conversations, starts, strict=True):
        x = torch.tensor([ids])
        with torch.no_grad():
            states = model.model(input_ids=x, output_hidden_states=True).hidden_states
            out["lens"].append([model.score(model.model.norm(h[0, -1])).item() for h in states[:-1]])
            # each prefix's reward as transformers gives it: its pooling reads before a trailing pad id (here the
            # pad id is <|im_end|>), as rmjax's curve does (nn.read_index)
            out["curve"].append([model(input_ids=x[:, : j + 1]).logits[0, 0].item() for j in range(first, len(ids))])
        emb = table[x[0]]
        keep = torch.tensor([i in special for i in ids])[:, None]  # as rmjax: the template's specials stay
        base = torch.where(keep, emb, table[pad].expand(len(ids), -1))
        total = torch.zeros_like(emb)
        for k in range(steps):
            point = (base + (k + 0.5) / steps * (emb - base)).clone().requires_grad_()
            model(inputs_embeds=point[None]).logits[0, 0].backward()
            total += point.grad
        out["ig_sum"].append(((emb - base) * total / steps).sum().item())
        with torch.no_grad():  # the path's two ends: completeness asks the IG sum to equal their difference
            ends = [model(inputs_embeds=e[None]).logits[0, 0].item() for e in (emb, base)]
        out["completeness_gap"].append(abs(out["ig_sum"][-1] - (ends[0] - ends[1])) / abs(ends[0] - ends[1]))
        out["ends"].append(ends)
    return time.perf_counter() - start, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n_ref", type=int, default=2, help="responses the reference runs")
    ap.add_argument("--steps", type=int, default=64)
    args = ap.parse_args()

    from rmjax.inspect.attribution import attribute
    from rmjax.inspect.job import items_from_texts
    from rmjax.inspect.lens import reward_lens, token_rewards
    from rmjax.loading import load
    from rmjax.loading.registry import cache_dir

    folder = sweep_vs_reference.build_model(cache_dir() / "bench" / "smollm2-135m-shaped-rm")
    model = load(str(folder))
    items = items_from_texts(model, sweep_vs_reference.SHORT, WORDS)
    seqs = [list(i.ids) for i in items]

    def ours():
        lens = reward_lens(model, seqs)
        curves = token_rewards(model, seqs)
        attrs = [attribute(model, s, steps=args.steps, batch_size=16) for s in seqs]
        return lens, curves, attrs

    ours()  # compiles
    start = time.perf_counter()
    lens, curves, attrs = ours()
    t_ours = time.perf_counter() - start
    n = args.n_ref
    t_ref, ref = reference(folder, seqs[:n], [i.start for i in items[:n]], args.steps,
                           set(model.tokenizer.all_special_ids))
    per_ours, per_ref = t_ours / len(seqs), t_ref / n
    err_lens = max(np.abs(lens.lens[:-1, b, 0] - np.asarray(ref["lens"][b])).max() for b in range(n))
    err_curve = max(np.abs(curves[b][items[b].start :, 0] - np.asarray(ref["curve"][b])).max() for b in range(n))
    # IG is judged by completeness (its sum against R(x) − R(baseline)), not against the reference's sum: rmjax
    # refines the path until the gap is within attribution.TOLERANCE, the reference keeps its uniform midpoints
    gaps = [a.relative_gap for a in attrs]
    evaluations = [a.evaluations for a in attrs]
    print(f"model: SmolLM2-135M-shaped Llama RM, f32, {len(seqs)} responses of ~{np.mean([len(s) for s in seqs]):.0f} "
          f"tokens, IG {args.steps} steps (pad baseline), {os.cpu_count()} CPU cores")
    print(f"rmjax (one batched forward for lens and curve, IG steps batched 16): {t_ours:.1f} s for {len(seqs)} = "
          f"{per_ours:.2f} s per response")
    print(f"transformers (forward per prefix, forward + backward per IG step): {t_ref:.1f} s for {n} = "
          f"{per_ref:.2f} s per response")
    print(f"speed-up per response: {per_ref / per_ours:.1f}x")
    # the same path: its two ends (the response and the pad baseline) score alike in both
    err_ends = max(abs(e) for b in range(n) for e in np.subtract([attrs[b].reward, attrs[b].baseline_reward],
                                                                  ref["ends"][b]))
    print(f"max |rmjax - transformers|: lens {err_lens:.2e}, curve {err_curve:.2e}, IG path ends {err_ends:.2e}")
    print(f"IG completeness gap |sum - (R(x) - R(baseline))| / |R(x) - R(baseline)|: rmjax max {max(gaps):.1%} "
          f"({min(evaluations)}-{max(evaluations)} gradient evaluations, adaptive), transformers "
          f"{', '.join(f'{g:.1%}' for g in ref['completeness_gap'])} ({args.steps} uniform midpoints) on the same "
          f"{n}; rmjax on those: {', '.join(f'{g:.1%}' for g in gaps[:n])}")


if __name__ == "__main__":
    main()
