"""How far each frontier job's search is from the hypervolume goal (1.5x best-of-N's), and how far any of the
given jobs' searches could take it (BUILD_NOTES, Search: the frontier).

    python bench/frontier_ceiling.py DIR [DIR ...]     # each DIR a finished `experiments.frontier` job

For each job and direction (a `--direction=both` job is two), against its own best-of-N hypervolume and reference
point from `.meta.json` (which count all of best-of-N's samples, not only the rows its CSV shows):
- `ratio`: the job's search / best-of-N, as the job reported it;
- `pooled`: every search row of the given jobs of the same RM, judge, prompt, direction and length, together:
  what the best of several runs (seeds, budgets, variants) would give against this best-of-N;
- `ceiling`: a front that held the most rewarding pooled search row's reward at every judge perplexity from the
  reference down to the lowest any written row of those jobs reached: no selection of the rows found can beat it;
- `needs`: the reward such a front would have to hold for 1.5x.
"""

from __future__ import annotations

import collections
import csv
import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rmjax.search import pareto  # noqa: E402

GOAL = 1.5


def _jobs(folder: Path) -> list[dict]:
    """One entry per direction of a finished job, its search rows and its summary's hypervolume."""
    if not (folder / "frontier.csv.meta.json").is_file():
        sys.exit(f"{folder}: not a finished frontier job (it has no frontier.csv.meta.json).")
    meta = json.loads((folder / "frontier.csv.meta.json").read_text())
    with open(folder / "frontier.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    out = []
    for direction, summary in meta["summary"].items():
        sign = 1.0 if direction == "optimal" else -1.0
        mine = [r for r in rows if r["direction"] == direction]
        search = [r for r in mine if r["method"] == "search"]
        key = (meta["model"], meta["judge"], tuple(sorted(meta["prompts"])), direction, meta["search"]["num_tokens"])
        out.append({"folder": f"{folder} {direction}", "key": key, "sign": sign, "hv": summary["hypervolume"],
                    "gain": np.asarray([sign * float(r["reward"]) for r in search]),
                    "ppl": np.asarray([float(r["judge_ppl"]) for r in search]),
                    "lowest_ppl": min(float(r["judge_ppl"]) for r in mine)})
    return out


def main(folders: list[str]) -> None:
    jobs = [job for f in folders for job in _jobs(Path(f))]
    pools = collections.defaultdict(list)
    for job in jobs:
        pools[job["key"]].append(job)
    for job in jobs:
        pool, hv, sign = pools[job["key"]], job["hv"], job["sign"]
        ref = (sign * hv["reference"]["reward"], hv["reference"]["judge_ppl"])
        gain, ppl = np.concatenate([j["gain"] for j in pool]), np.concatenate([j["ppl"] for j in pool])
        if not hv["best_of_n"]:  # no best-of-N sample beyond the reference point: no ratio is defined
            print(f"{job['folder']}: best-of-N's hypervolume is 0, so no ratio is defined (best search reward "
                  f"{sign * gain.max():.2f})")
            continue
        pooled = pareto.hypervolume(gain, ppl, ref) / hv["best_of_n"]
        width = math.log(ref[1] / min(j["lowest_ppl"] for j in pool))
        ceiling = (gain.max() - ref[0]) * width / hv["best_of_n"]
        needs = sign * (GOAL * hv["best_of_n"] / width + ref[0])
        print(f"{job['folder']}: ratio {hv['ratio']:.3f}, pooled over {len(pool)} jobs {pooled:.3f}, ceiling "
              f"{ceiling:.3f}; 1.5x needs reward {needs:.2f} at every perplexity (best found {sign * gain.max():.2f})")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
