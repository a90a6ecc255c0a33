"""Beam sweep figures in one run: per-candidate cost at depth 2 and 3 vs depth 1, two-token candidates/s vs the
published pipeline extended to two tokens, and the GCG step vs bench/gcg_vs_reference.py's PyTorch step.

Model: the SmolLM2-135M-shaped reward model of bench/sweep_vs_reference.py (f32, random weights, real tokenizer
and chat template). The beam runs `--n` random candidate tokens with beam `--beam`, optimal direction, after a
compiling run of the same shapes. The reference decodes each pair, puts it in the chat template, re-tokenizes
with padding and scores batches of 64 with transformers.

python bench/beam.py [--n=4096] [--beam=2] [--n_ref=256] [--batch_size=256] [--gcg_steps=3]
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

from bench import gcg_vs_reference, sweep_vs_reference  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=4096, help="candidate tokens (the set S)")
    ap.add_argument("--beam", type=int, default=2)
    ap.add_argument("--n_ref", type=int, default=256, help="two-token sequences scored by the reference")
    ap.add_argument("--batch_size", type=int, default=256)
    ap.add_argument("--gcg_steps", type=int, default=3, help="0 skips the GCG comparison")
    args = ap.parse_args()

    from rmjax.loading import load
    from rmjax.loading.registry import cache_dir
    from rmjax.search.beam import BeamConfig, beam_search

    folder = sweep_vs_reference.build_model(cache_dir() / "bench" / "smollm2-135m-shaped-rm")
    model = load(str(folder))
    prompts = {"p": sweep_vs_reference.SHORT}
    tokens = np.random.default_rng(0).permutation(49152)[: args.n]
    cfg = BeamConfig(depth=3, beam=args.beam, top=args.n_ref, direction="optimal")
    beam_search(model, prompts, cfg, tokens[: args.batch_size], batch_size=args.batch_size,
                progress_every=1e9)  # compiles every shape the measured run uses
    result = beam_search(model, prompts, cfg, tokens, batch_size=args.batch_size, progress_every=1e9)
    per = {lv["depth"]: lv["seconds"] / lv["candidates"] for lv in result.levels}
    pairs = next(f for f in result.found if f.depth == 2)
    ref, t_ref = sweep_vs_reference.reference_scores(folder, sweep_vs_reference.SHORT, pairs.ids[: args.n_ref])
    rate_ours, rate_ref = 1.0 / per[2], len(ref) / t_ref

    decoded = model.tokenizer.batch_decode(pairs.ids[: args.n_ref].tolist())
    same = [i for i, d in enumerate(decoded)
            if model.tokenizer(d, add_special_tokens=False).input_ids == pairs.ids[i].tolist()]
    err = np.abs(pairs.scores[: args.n_ref, 0][same] - ref[same]).max() if same else float("nan")
    print(f"model: SmolLM2-135M-shaped Llama RM, f32; |S| = {args.n} candidate tokens, beam {args.beam}, "
          f"batch {args.batch_size}, {os.cpu_count()} CPU cores")
    for depth in (1, 2, 3):
        lv = result.levels[depth - 1]
        print(f"depth {depth}: {lv['candidates']:>6} candidates ({lv['partials']} partials) in {lv['seconds']:6.1f} s "
              f"= {1e3 * per[depth]:.2f} ms each (ratio to depth 1: {per[depth] / per[1]:.2f})")
    print(f"two-token candidates/s: rmjax beam {rate_ours:.1f}, reference (decode -> template -> re-tokenize -> "
          f"batch 64, transformers) {rate_ref:.1f} ({len(ref)} in {t_ref:.1f} s): speed-up {rate_ours / rate_ref:.1f}x")
    print(f"max |beam - reference| on {len(same)} of {len(ref)} pairs that re-tokenize to themselves: {err:.2e}")
    if args.gcg_steps:
        start = time.perf_counter()
        g = gcg_vs_reference.measure(steps=args.gcg_steps)
        print(f"GCG step (elo-rm-smollm2-135m, N=8, width 128, top-k 64; median of {args.gcg_steps}): rmjax "
              f"{g['ours']:.2f} s, PyTorch reference {g['theirs']:.2f} s: speed-up {g['theirs'] / g['ours']:.1f}x "
              f"({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
