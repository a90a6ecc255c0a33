"""The published RMs planned on TPU slices (experiments.plan, in process): fits or not, per-chip GiB, lower-bound
and realistic time, bound, mesh and on-demand dollars, as BUILD_NOTES' TPU tables (issues 24 and 44).

python bench/plan_table.py [--slices=v5e-8,v5p-8,v6e-8,v4-8] [--dtype=bfloat16]

Sweeps are the `paper1` prompts over the whole vocabulary, with a 64-token prefix and 8 template tokens after
the response (no tokenizer is read: the hub models are not on this machine). The times are a roofline lower bound
and an estimate at the assumed MFU (rmjax.plan.cost), not measurements.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--slices", default="v5e-8,v5p-8,v6e-8,v4-8")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--models", default="", help="comma-separated zoo nicknames (default: all ten)")
    ap.add_argument("--job", default="sweep", choices=["sweep", "train_rm"])
    ap.add_argument("--trainable", default="full")
    ap.add_argument("--config", default="", help="a config.json instead of the zoo")
    ap.add_argument("--steps", type=int, default=1, help="train_rm: optimizer steps priced")
    args = ap.parse_args()

    from rmjax import zoo
    from rmjax.parallel.distributed import quiet_absent_tpu
    from rmjax.plan.planner import PlanDoesNotFitError, plan
    from rmjax.plan.spec import plan_inputs

    quiet_absent_tpu()
    names = [args.config] if args.config else (args.models.split(",") if args.models else
                                                 [e.nickname for e in zoo.ZOO])
    slices = args.slices.split(",")
    print(f"| model | {' | '.join(slices)} |")
    print(f"|---|{'---|' * len(slices)}")
    for name in names:
        cells = []
        for topology in slices:
            cfg, piece, shape, _ = plan_inputs(name, topology, args.job, prompts=["paper1"], prefix_tokens=64,
                                               suffix_tokens=8, trainable=args.trainable, steps=args.steps)
            try:
                p = plan(cfg, args.dtype, piece, args.job, shape, log=lambda *_: None)
            except PlanDoesNotFitError as error:
                need = str(error).split(" needs ")[1].split(";")[0] if " needs " in str(error) else "no batch fits"
                cells.append(f"no ({need})")
                continue
            low, real = (_time(p[k]) for k in ("lower_bound_seconds", "realistic_seconds"))
            extra = " fsdp" if p["assumed"].get("fsdp") else ""
            extra += " remat" if p["assumed"].get("remat") else ""
            cells.append(f"{p['per_chip_bytes']['total'] / 2**30:.1f} GiB, {low} / {real}, {p['bound']} "
                         f"(d{p['mesh']['data']}m{p['mesh']['model']}{extra}, b{p['batch_size']}), "
                         f"${p['usd_on_demand']:.2f}")
        print(f"| {name} | {' | '.join(cells)} |", flush=True)


def _time(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h" if seconds >= 360 else f"{seconds:.1f} s"


if __name__ == "__main__":
    main()
