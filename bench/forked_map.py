"""The forked vocabulary map (rmjax.scoring.forked) against two separate sweeps, in the same run.

    python bench/forked_map.py --a=RM_A --b=RM_B [--tokens=8192] [--prompt=greatest]

A and B are reward models that share their lower layers (B fine-tuned from A with `train_rm --last_k`, e.g. the
planted bench's OUT/planted/hf and OUT/clean/hf). Prints the shared layers, both ways' tokens per second and their
ratio, and the largest difference between the two ways' rewards (in each model's reward SD over the tokens).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True)
    ap.add_argument("--b", required=True)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--prompt", default="greatest")
    args = ap.parse_args()

    from rmjax.loading import load
    from rmjax.search.disagree import both_token_rewards, token_rewards_of
    from rmjax.search.sides import RewardSide, SideSpec
    from rmjax.text import prompts

    sides = [RewardSide(SideSpec.parse(s), load(s), prompts.PAPER1[args.prompt], "auto") for s in (args.a, args.b)]
    ids = np.arange(1000, 1000 + args.tokens)
    shared = pd.DataFrame({"text": ids.astype(str), "token_a": ids, "token_b": ids})
    warm = shared.iloc[:512]  # compile both ways before timing
    both_token_rewards(*sides, warm)
    [token_rewards_of(s, warm["token_a"].to_numpy()) for s in sides]

    t_separate = t_forked = float("inf")
    for _ in range(3):  # alternated, best of three each (the machine is shared)
        t = time.perf_counter()
        separate = [token_rewards_of(s, ids) for s in sides]
        t_separate = min(t_separate, time.perf_counter() - t)
        t = time.perf_counter()
        *forked, layers = both_token_rewards(*sides, shared)
        t_forked = min(t_forked, time.perf_counter() - t)
    worst = max(float(np.abs(f - s).max() / s.std()) for f, s in zip(forked, separate, strict=True))
    n = 2 * len(ids)
    print(f"shared layers: {layers} of {sides[0].model.config.num_layers}")
    print(f"separate: {n / t_separate:.0f} tokens/s ({t_separate:.1f} s); forked: {n / t_forked:.0f} tokens/s "
          f"({t_forked:.1f} s); speed-up x{t_separate / t_forked:.2f}")
    print(f"largest difference between the two ways: {worst:.2e} SD")


if __name__ == "__main__":
    main()
