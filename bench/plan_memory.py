"""The jobs' memory planner (rmjax.scoring.memory.estimate, printed before every sweep) against XLA's memory
analysis of the compiled sweep call, per chip, on a TPU slice (compiled here through libtpu) or this CPU.

python bench/plan_memory.py --topology=v5e-8 --models=R-Gem-2B,S-Lla-8B-v0.2,S-Gem-27B [--dtype=bfloat16]
python bench/plan_memory.py --topology=cpu --models=R-Gem-2B --dtype=float32
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--topology", default="v5e-8")
    ap.add_argument("--models", default="R-Gem-2B,S-Lla-8B-v0.2,S-Gem-27B")
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import numpy as np

    jax.config.update("jax_num_cpu_devices", 8)
    from rmjax.parallel.distributed import quiet_absent_tpu
    from rmjax.plan import calls, chips, cost
    from rmjax.plan.planner import _sweep_batch
    from rmjax.plan.shapes import SweepShape
    from rmjax.plan.spec import model_config
    from rmjax.scoring import memory

    quiet_absent_tpu()
    on_cpu = args.topology == "cpu"
    devices = jax.devices("cpu") if on_cpu else chips.devices(chips.parse_slice(args.topology))
    gib = 2**30
    print("| model | mesh | batch | planner GiB | XLA GiB | planner / XLA |")
    print("|---|---|---|---|---|---|")
    for name in args.models.split(","):
        cfg, _ = model_config(name)
        shape = SweepShape(1, 64, 8, cfg.vocab_size)
        for model in (m for m in (1, 2, 4, 8) if len(devices) % m == 0 and cfg.num_kv_heads % m == 0):
            data = len(devices) // model
            batch = 1024 if on_cpu else _sweep_batch(cfg, args.dtype, chips.parse_slice(args.topology), data, model,
                                                     shape)
            if batch is None:
                print(f"| {name} | data:{data},model:{model} | none fits | | | |")
                continue
            mesh = jax.sharding.Mesh(np.asarray(devices).reshape(data, model), ("data", "model"))
            made = calls.sweep_calls(cfg, args.dtype, mesh, prompts=1, prefix_tokens=64, suffix_tokens=8,
                                     candidates=batch, batch_size=batch)
            xla = max(cost.cost_of(c.name, c.call, c.args, 1).peak_bytes for c in made)
            planned = memory.estimate(cfg, args.dtype, 64, 9, batch, data, model,
                                      backend="cpu" if on_cpu else "tpu").total_bytes
            print(f"| {name} | data:{data},model:{model} | {batch} | {planned / gib:.3f} | {xla / gib:.3f} | "
                  f"{planned / xla:.3f} |", flush=True)


if __name__ == "__main__":
    main()
