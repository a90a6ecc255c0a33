"""Capacity table of the published RMs: params, bf16 bytes, minimum chips per TPU generation, estimated
full-vocabulary sweep time from a measured FLOP efficiency.

python bench/zoo_table.py [--efficiency=0.69] [--prefix_len=64] [--positions=3]

The efficiency is the fraction of matmul peak a prefix-cached sweep reaches (69% on one H200 GPU in bf16,
bench/gpu_check.py; 88% on the 2-core CPU in f32, bench/sweep_vs_reference.py; none measured on a TPU); chips
are TPU v4, v5e and v6e with the published figures of rmjax.plan.chips.CHIPS.
For a compiled plan of one job on one slice, see experiments.plan. Minimum chips = the smallest power-of-two
`model` sharding whose per-chip memory (params + prefix cache + a batch of 64) fits in 80% of HBM.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))



def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--efficiency", type=float, default=0.69)
    ap.add_argument("--prefix_len", type=int, default=64)
    ap.add_argument("--positions", type=int, default=3)
    args = ap.parse_args()

    from rmjax import zoo
    from rmjax.plan.chips import CHIPS
    from rmjax.scoring import memory

    print("| model | params | bf16 bytes | min chips v4 / v5e / v6e | full-vocab sweep on 8 chips v4 / v5e / v6e |")
    print("|---|---|---|---|---|")
    for entry in zoo.ZOO:
        cfg = zoo.architecture_config(entry)
        n = zoo.count_params(zoo.abstract_params(cfg))
        chips, times = [], []
        for chip in (CHIPS["v4"], CHIPS["v5e"], CHIPS["v6e"]):
            need = None
            for shards in (1, 2, 4, 8, 16, 32):
                if cfg.num_heads % shards:
                    continue
                try:
                    memory.pick_batch_size(cfg, "bfloat16", args.prefix_len, args.positions, 1, shards,
                                           chip.hbm_bytes, largest=64, backend="tpu")
                    need = shards
                    break
                except memory.DoesNotFitError:
                    continue
            chips.append(str(need) if need else ">32")
            flop = 2 * cfg.non_embedding_params * args.positions * cfg.vocab_size
            times.append(flop / (8 * chip.peak_flops * args.efficiency))
        print(f"| {entry.nickname} ({entry.hf_id}) | {n / 1e9:.2f} B | {2 * n / 2**30:.1f} GiB | "
              f"{' / '.join(chips)} | {' / '.join(f'{t:.1f} s' for t in times)} |")


if __name__ == "__main__":
    main()
