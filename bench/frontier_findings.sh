#!/bin/bash
# Issue 25 findings (BUILD_NOTES "Fluent optimal and pessimal responses"): both default RMs, prompt greatest,
# 8-token responses, λ in {0, 0.25, 1, 4}, both directions, the default budget. About 10 minutes a direction on
# 2 CPU cores.
set -e
cd "$(dirname "$0")/.."
R=${1:-results/frontier}
for m in elo-rm-smollm2-135m elo-rm-gemma3-270m; do
  .venv/bin/python -m experiments.frontier --model=$m --prompts=greatest --num_tokens=8 --lambdas=0,0.25,1,4 \
      --direction=both --out=$R/$m
done
