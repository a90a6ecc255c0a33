"""The vocabulary map's batch (`disagree --batch_size`, a side's single-token rewards) at other sizes against the
CPU plan's 256, in the same run.

    python bench/map_batch.py [--model=elo-rm-smollm2-135m] [--batches=256,1024] [--tokens=8192] [--prompt=greatest]

Each batch size is timed twice, the sizes alternating, after one compile each. Prints tokens per second per size,
the ratio to the first size, and the largest reward difference between the sizes (the same rewards: rounding only).
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="elo-rm-smollm2-135m")
    ap.add_argument("--batches", default="256,1024")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--prompt", default="greatest")
    args = ap.parse_args()

    from rmjax.loading import load
    from rmjax.search.sides import RewardSide, SideSpec
    from rmjax.text import prompts

    batches = [int(b) for b in args.batches.split(",")]
    model = load(args.model)
    sides = {b: RewardSide(SideSpec.parse(args.model), model, prompts.PAPER1[args.prompt], "auto", b)
             for b in batches}
    ids = np.arange(1000, 1000 + args.tokens)
    for b, side in sides.items():
        side.token_rewards(ids[:b])  # compile
    seconds = {b: [] for b in batches}
    rewards = {}
    for _ in range(2):
        for b, side in sides.items():
            start = time.perf_counter()
            rewards[b] = side.token_rewards(ids)
            seconds[b].append(time.perf_counter() - start)
    first = batches[0]
    for b in batches:
        rate = args.tokens / min(seconds[b])
        print(f"batch {b}: {rate:.0f} tokens/s (best of 2), {min(seconds[first]) / min(seconds[b]):.2f}x batch "
              f"{first}; largest reward difference {np.abs(rewards[b] - rewards[first]).max():.2e}")


if __name__ == "__main__":
    main()
