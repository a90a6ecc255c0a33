#!/usr/bin/env bash
# The tests compile with tests/cli.py's QUICK_COMPILE flags (LLVM's backend optimisation off, XLA:CPU's older
# fusion emitters). This runs README-like jobs on the default models twice, with XLA's defaults and with those flags,
# and compares what they wrote: which text cells differ (a different decision) and how far apart the numbers are.
# Usage: bash bench/quick_compile.sh OUT [JOB...]
# (JOB: score sweep gcg disagree logprobs train; default all). About 12 min on 2 cores.
set -euo pipefail
out=${1:?usage: bench/quick_compile.sh OUT [JOB...]}; shift
jobs=${*:-score sweep gcg disagree logprobs train}
py=${PYTHON:-.venv/bin/python}
if [ -e "$out" ] && [ -n "$(ls -A "$out")" ]; then echo "error: $out is not empty; give a new folder" >&2; exit 2; fi
for job in $jobs; do
  case $job in score|sweep|gcg|disagree|logprobs|train) ;; *) echo "error: unknown job: $job" >&2; exit 2 ;; esac
done
quick=$($py -c "from tests.cli import QUICK_COMPILE; print(' '.join(QUICK_COMPILE))")  # the flags the tests use
for level in default quick; do
  if [ $level = quick ]; then export XLA_FLAGS=$quick; else export XLA_FLAGS=; fi
  o=$out/$level; mkdir -p "$o"
  for job in $jobs; do
    case $job in
      score) $py -m experiments.score --model=elo-rm-smollm2-135m --prompts=greatest --texts=Love,Money,Chocolate \
               --out="$o/score.csv" ;;
      sweep) $py -m experiments.sweep --model=elo-rm-smollm2-135m --prompts=paper1 --limit=3000 --out="$o/sweep_s.csv"
             $py -m experiments.sweep --model=elo-rm-gemma3-270m --prompts=greatest --limit=3000 --out="$o/sweep_g.csv" ;;
      gcg) $py -m experiments.gcg --model=elo-rm-smollm2-135m --prompts=greatest --num_tokens=3 --direction=optimal \
             --steps=8 --search_width=64 --topk=32 --seed=0 --out="$o/gcg.json" ;;
      disagree) $py -m experiments.disagree --models=elo-rm-smollm2-135m,elo-rm-gemma3-270m --prompts=greatest \
                  --num_tokens=6 --forwards=200 --direction=a_over_b --out="$o/disagree" ;;
      logprobs) $py -m experiments.logprobs --model=smollm2-135m-instruct --prompts=greatest --out="$o/logprobs.csv" ;;
      train) $py -m experiments.train_rm --model=smollm2-135m-instruct --elo=builtin --trainable=head --steps=30 \
               --warmup_steps=3 --workdir="$o/train" ;;
    esac > "$o/$job.log" 2>&1 || { echo "error: $job failed with $level compiles; see $o/$job.log" >&2; exit 1; }
  done
done
$py - "$out" <<'PY'
import csv, sys
from pathlib import Path

out = Path(sys.argv[1])
for a in sorted((out / "default").rglob("*.csv")):
    b = out / "quick" / a.relative_to(out / "default")
    rows_a, rows_b = list(csv.reader(a.open())), list(csv.reader(b.open()))
    timed = [i for i, name in enumerate(rows_a[0]) if name == "seconds"]  # wall time, not a result
    texts, numbers, worst = 0, 0, 0.0
    for ra, rb in zip(rows_a, rows_b):
        for x, y in (pair for i, pair in enumerate(zip(ra, rb)) if i not in timed and pair[0] != pair[1]):
            try:
                x, y = float(x), float(y)
            except ValueError:
                texts += 1
                continue
            numbers, worst = numbers + 1, max(worst, abs(x - y) / max(1.0, abs(x), abs(y)))
    print(f"{a.relative_to(out / 'default')}: {len(rows_a)} vs {len(rows_b)} rows, {texts} text cells differ, "
          f"{numbers} numbers differ, at most by {worst:.1e} (relative above 1, absolute below)")
PY
