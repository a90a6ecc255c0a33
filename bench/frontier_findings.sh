#!/bin/bash
# Issue 25 findings (BUILD_NOTES, Search: the frontier's findings): both default RMs, prompt greatest,
# 8-token responses, λ in {0, 0.25, 1, 4}, the default budget, one job per direction (5-10 minutes each on
# 2 CPU cores). Further arguments go to every job (e.g. --seed=1, --noshare).
set -e
cd "$(dirname "$0")/.."
R=${1:-results/frontier}
shift || true
for m in elo-rm-smollm2-135m elo-rm-gemma3-270m; do
  for d in optimal pessimal; do
    .venv/bin/python -m experiments.frontier --model=$m --prompts=greatest --num_tokens=8 --lambdas=0,0.25,1,4 \
        --direction=$d --out=$R/$m-$d "$@"
  done
done
