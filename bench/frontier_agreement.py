"""Do two reward models agree on what each other's frontier found? (BUILD_NOTES, Search: the frontier)

    python bench/frontier_agreement.py DIR [DIR ...] [--max_ppl=100] [--per_job=5]

Each DIR is a finished `experiments.frontier` job; each of its directions counts as one job. From each: its most
rewarding search rows
at judge perplexity <= --max_ppl (distinct texts, --per_job of them) and best-of-N's most rewarding row. Every
text is scored as text by each RM among the jobs (its own tokenization, the job's prompt and template), in SDs
of that RM's single-token rewards (the scale of the jobs' reward_z column). Prints each job's mean z under each
RM and Spearman's rho between the RMs over all the texts.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _jobs(folder: Path, max_ppl: float, per_job: int) -> list[dict]:
    """One entry per direction of a finished job."""
    if not (folder / "frontier.csv.meta.json").is_file():
        sys.exit(f"{folder}: not a finished frontier job (it has no frontier.csv.meta.json).")
    meta = json.loads((folder / "frontier.csv.meta.json").read_text())
    with open(folder / "frontier.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    return [_job(folder, meta, [r for r in rows if r["direction"] == d], max_ppl, per_job)
            for d in dict.fromkeys(r["direction"] for r in rows)]


def _job(folder: Path, meta: dict, rows: list[dict], max_ppl: float, per_job: int) -> dict:
    sign = 1.0 if rows[0]["direction"] == "optimal" else -1.0
    by_gain = sorted(rows, key=lambda r: -sign * float(r["reward"]))
    texts = []
    for r in by_gain:
        text = json.loads(r["text"])
        if r["method"] == "search" and float(r["judge_ppl"]) <= max_ppl and text not in texts:
            texts.append(text)
    texts = texts[:per_job] + [json.loads(next(r for r in by_gain if r["method"] == "best_of_n")["text"])]
    # reward_z = (reward - mean) / sd: two rows of different reward give the model's scale
    a = rows[0]
    b = next(r for r in rows if float(r["reward"]) != float(a["reward"]))
    sd = (float(a["reward"]) - float(b["reward"])) / (float(a["reward_z"]) - float(b["reward_z"]))
    mean = float(a["reward"]) - float(a["reward_z"]) * sd
    return {"name": f"{meta['model']} {rows[0]['direction']} ({folder})", "model": meta["model"],
            "prompts": meta["prompts"], "template": meta["identity"]["template"], "texts": texts,
            "methods": ["search"] * (len(texts) - 1) + ["best_of_n"], "scale": (mean, sd)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--max_ppl", type=float, default=100.0)
    ap.add_argument("--per_job", type=int, default=5)
    args = ap.parse_args()
    jobs = [job for d in args.dirs for job in _jobs(Path(d), args.max_ppl, args.per_job)]
    if len({(tuple(j["prompts"].items()), j["template"]) for j in jobs}) != 1:
        sys.exit("the jobs must share one prompt and template.")
    models = list(dict.fromkeys(j["model"] for j in jobs))

    from scipy.stats import spearmanr

    from rmjax.loading import load
    from rmjax.parallel.distributed import quiet_absent_tpu
    from rmjax.scoring.texts import score_texts

    quiet_absent_tpu()
    texts = [t for j in jobs for t in j["texts"]]
    (name, _), = jobs[0]["prompts"].items()
    z = {}
    for m in models:
        mean, sd = next(j["scale"] for j in jobs if j["model"] == m)
        z[m] = (score_texts(load(m), jobs[0]["prompts"], texts, jobs[0]["template"])[name] - mean) / sd
    at = 0
    for j in jobs:
        for method in ("search", "best_of_n"):
            rows = [at + i for i, k in enumerate(j["methods"]) if k == method]
            if not rows:
                print(f"{j['name']}, {method}: no row at judge perplexity <= {args.max_ppl:g}")
                continue
            print(f"{j['name']}, {method} ({len(rows)}): " + ", ".join(f"z under {m} {z[m][rows].mean():+.2f}"
                                                                        for m in models))
        for i, text in enumerate(j["texts"]):
            print(f"    {text!r}: " + ", ".join(f"{z[m][at + i]:+.2f}" for m in models))
        at += len(j["texts"])
    if len(models) == 2:
        rho = spearmanr(z[models[0]], z[models[1]])
        print(f"Spearman's rho between {models[0]} and {models[1]} over {len(texts)} texts: {rho.statistic:.2f} "
              f"(p = {rho.pvalue:.2f})")


if __name__ == "__main__":
    main()
