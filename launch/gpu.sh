#!/usr/bin/env bash
# Run one rmjax job on a multi-GPU host over ssh: copy the repo, install jax[cuda12], bring a checkpoint,
# run with candidates over all GPUs (--mesh in the job), collect results.
#
# launch/gpu.sh --host=user@gpu-box \
#     --checkpoint=/data/Skywork-Reward-Llama-3.1-8B-v0.2 \
#     --job="experiments.sweep --model=/tmp/ckpt --prompts=paper1 --dtype=bfloat16 --mesh=data:8,model:1 --out=results/s.csv" \
#     [--results=results/] [--dry-run]
#
# --checkpoint: a local folder (rsync'd to the host) or remote:PATH (already on the host, used in place).
set -euo pipefail

HOST="" CHECKPOINT="" JOB="" RESULTS="results/" DRY=0
for arg in "$@"; do
  case "$arg" in
    --host=*) HOST="${arg#*=}" ;; --checkpoint=*) CHECKPOINT="${arg#*=}" ;; --job=*) JOB="${arg#*=}" ;;
    --results=*) RESULTS="${arg#*=}" ;; --dry-run) DRY=1 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "unknown argument: $arg (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$HOST" ] || { echo "--host is required (see --help)" >&2; exit 2; }
[ -n "$JOB" ] || { echo "--job is required (see --help)" >&2; exit 2; }

run() { if [ "$DRY" = 1 ]; then printf '+ %s\n' "$*"; else "$@"; fi; }
REPO="$(cd "$(dirname "$0")/.." && pwd)"

run rsync -az --exclude=.venv --exclude=.cache --exclude=results --exclude=runs "$REPO/" "$HOST:rmjax/"
run ssh "$HOST" "cd rmjax && python3 -m venv .venv && .venv/bin/pip install -q -r requirements.txt 'jax[cuda12]' && .venv/bin/pip install -q --no-deps -e ."
if [ -n "$CHECKPOINT" ] && [[ "$CHECKPOINT" != remote:* ]]; then
  run rsync -az "$CHECKPOINT/" "$HOST:/tmp/ckpt/"
fi
run ssh "$HOST" "cd rmjax && HF_HUB_OFFLINE=1 .venv/bin/python -m $JOB"
run mkdir -p "$RESULTS"
run rsync -az "$HOST:rmjax/results/" "$RESULTS"
