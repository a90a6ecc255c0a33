#!/usr/bin/env bash
# Create a TPU VM, install rmjax, bring a checkpoint, run one job on every worker, collect results, delete.
#
# launch/tpu_vm.sh --name=rmjax-v5e --zone=us-west4-a --type=v5litepod-8 \
#     --checkpoint=gs://BUCKET/Skywork-Reward-Gemma-2-27B-v0.2 \
#     --job="experiments.sweep --model=/tmp/ckpt --prompts=paper1 --dtype=bfloat16 --mesh=data:1,model:8 --out=results/s.csv" \
#     [--project=P] [--version=tpu-ubuntu2204-base] [--results=results/] [--keep] [--dry-run]
#
# --type: v4-8, v5litepod-8, v6e-8, v5litepod-16 ... (on multi-host slices every worker runs the job and
#         jax.distributed finds its peers; process 0 writes results/).
# --checkpoint: gs:// path (copied with gsutil on each worker) or a local folder (scp'd to each worker).
# --dry-run prints every command instead of running it.
set -euo pipefail

NAME="" ZONE="" TYPE="" PROJECT="" VERSION="tpu-ubuntu2204-base" CHECKPOINT="" JOB="" RESULTS="results/" KEEP=0 DRY=0
for arg in "$@"; do
  case "$arg" in
    --name=*) NAME="${arg#*=}" ;; --zone=*) ZONE="${arg#*=}" ;; --type=*) TYPE="${arg#*=}" ;;
    --project=*) PROJECT="${arg#*=}" ;; --version=*) VERSION="${arg#*=}" ;;
    --checkpoint=*) CHECKPOINT="${arg#*=}" ;; --job=*) JOB="${arg#*=}" ;; --results=*) RESULTS="${arg#*=}" ;;
    --keep) KEEP=1 ;; --dry-run) DRY=1 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "unknown argument: $arg (see --help)" >&2; exit 2 ;;
  esac
done
for required in NAME ZONE TYPE JOB; do
  [ -n "${!required}" ] || { echo "--$(echo "$required" | tr '[:upper:]' '[:lower:]') is required (see --help)" >&2; exit 2; }
done

run() { if [ "$DRY" = 1 ]; then printf '+ %s\n' "$*"; else "$@"; fi; }
TPU=(gcloud compute tpus tpu-vm)
WHERE=(--zone="$ZONE")
[ -n "$PROJECT" ] && WHERE+=(--project="$PROJECT")
REPO="$(cd "$(dirname "$0")/.." && pwd)"
TARBALL="/tmp/rmjax-$NAME.tar.gz"

run "${TPU[@]}" create "$NAME" "${WHERE[@]}" --accelerator-type="$TYPE" --version="$VERSION"
run git -C "$REPO" archive --format=tar.gz -o "$TARBALL" HEAD
run "${TPU[@]}" scp "$TARBALL" "$NAME:~/rmjax.tar.gz" "${WHERE[@]}" --worker=all
run "${TPU[@]}" ssh "$NAME" "${WHERE[@]}" --worker=all --command="mkdir -p rmjax && tar -xzf rmjax.tar.gz -C rmjax && cd rmjax && python3 -m venv .venv && .venv/bin/pip install -q -r requirements.txt 'jax[tpu]' && .venv/bin/pip install -q --no-deps -e ."
if [ -n "$CHECKPOINT" ]; then
  if [[ "$CHECKPOINT" == gs://* ]]; then
    run "${TPU[@]}" ssh "$NAME" "${WHERE[@]}" --worker=all --command="mkdir -p /tmp/ckpt && gsutil -m cp -r '$CHECKPOINT/*' /tmp/ckpt/"
  else
    run "${TPU[@]}" scp --recurse "$CHECKPOINT" "$NAME:/tmp/ckpt" "${WHERE[@]}" --worker=all
  fi
fi
run "${TPU[@]}" ssh "$NAME" "${WHERE[@]}" --worker=all --command="cd rmjax && HF_HUB_OFFLINE=1 RMJAX_COORDINATOR=auto .venv/bin/python -m $JOB"
run mkdir -p "$RESULTS"
run "${TPU[@]}" scp --recurse "$NAME:~/rmjax/results/*" "$RESULTS" "${WHERE[@]}" --worker=0
if [ "$KEEP" = 0 ]; then
  run "${TPU[@]}" delete "$NAME" "${WHERE[@]}" --quiet
fi
