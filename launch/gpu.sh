#!/usr/bin/env bash
# Run one rmjax job on a multi-GPU host over ssh: copy the repo, install jax[cuda12], bring a checkpoint,
# run with candidates over all GPUs (--mesh in the job), collect results.
#
# launch/gpu.sh --host=user@gpu-box \
#     --checkpoint=/data/Skywork-Reward-Llama-3.1-8B-v0.2 \
#     --job="experiments.sweep --model=/tmp/ckpt --prompts=paper1 --dtype=bfloat16 --mesh=data:8,model:1 --out=results/s.csv" \
#     [--results=results/] [--dry-run]
#
# --checkpoint: a local folder (rsync'd to the host's /tmp/ckpt, which the job reads) or remote:PATH (already on
#         the host, read in place: the job names PATH itself; a job reading /tmp/ckpt then is refused).
# --job: shell text, run on the host as `.venv/bin/python -m JOB` in the copied repository. Its outputs must be
#         under results/ (the only folder brought back): another place is refused.
# --dry-run prints every command, one per line, quoted so that a line pasted into a shell runs exactly it.
# The host gets the working tree as it is (rsync), uncommitted changes included; it needs a Python 3.11+.
set -euo pipefail

HOST="" CHECKPOINT="" JOB="" RESULTS="results/" DRY=0
for arg in "$@"; do
  case "$arg" in
    --host=*) HOST="${arg#*=}" ;; --checkpoint=*) CHECKPOINT="${arg#*=}" ;; --job=*) JOB="${arg#*=}" ;;
    --results=*) RESULTS="${arg#*=}" ;; --dry-run) DRY=1 ;;
    -h|--help) sed -n '2,/^set -/{/^#/p}' "$0"; exit 0 ;;
    *) echo "unknown argument: $arg (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$HOST" ] || { echo "--host is required (see --help)" >&2; exit 2; }
[ -n "$JOB" ] || { echo "--job is required (see --help)" >&2; exit 2; }

source "$(dirname "$0")/run.sh"  # quote, run: the printed line is the argv that runs
REPO="$(cd "$(dirname "$0")/.." && pwd)"
# What the job would refuse (a job rmjax does not have, a flag it lacks, a bad value) is refused here, read by the
# job's own flags (experiments/job_line.py), where this checkout has its .venv: the host is paid for, and the
# set-up takes minutes. Without one, the job's name alone is checked.
if [ -x "$REPO/.venv/bin/python" ]; then
  ( cd "$REPO" && RMJAX_LAUNCH_CHECKPOINT="$CHECKPOINT" .venv/bin/python "${JOB_LINE[@]}" "$JOB" >/dev/null ) || exit 2
else
  read -r JOB_NAME _ <<<"$JOB"
  if [[ "$JOB_NAME" != experiments.* ]] || \
      ! grep -Eqs '^\s+(common|cli)\.run\(main\)$' "$REPO/experiments/${JOB_NAME#experiments.}.py"; then
    echo "error: --job: rmjax has no job ${JOB_NAME#experiments.} (give experiments.NAME, NAME one of experiments/*.py's jobs)" >&2
    exit 2  # `python -m <anything>` would run on the host
  fi
fi

# Python 3.11+ (setup.py's python_requires): the first new enough of these on the host. The host is not ours
# to install on, so without one the set-up stops and says so.
SETUP='cd rmjax && { PY=$(for p in python3.11 python3.12 python3.13 python3.14 python3; do'
SETUP+=' command -v $p >/dev/null && $p -c "import sys; sys.exit(sys.version_info < (3, 11))"'
SETUP+=' && { echo $p; break; }; done)'
SETUP+=' || { echo "error: rmjax needs Python 3.11+ and this host has none'
SETUP+=' (looked for python3.11 to python3.14, python3): install one" >&2; exit 1; }; }'
SETUP+=' && $PY -m venv .venv && .venv/bin/pip install -q -r requirements.txt "jax[cuda12]"'
SETUP+=' && .venv/bin/pip install -q --no-deps -r requirements-nodeps.txt -e .'  # as `make demo`, + jax[cuda12]

run rsync -az --exclude=.venv --exclude=.cache --exclude=results --exclude=runs "$REPO/" "$HOST:rmjax/"
run ssh "$HOST" "$SETUP"
if [ -n "$CHECKPOINT" ] && [[ "$CHECKPOINT" != remote:* ]]; then
  # --delete: a file of the last model copied here (an index of shards, a chat template) would be read as this one's
  run rsync -az --delete "$CHECKPOINT/" "$HOST:/tmp/ckpt/"
fi
run ssh "$HOST" "cd rmjax && HF_HUB_OFFLINE=1 .venv/bin/python -m $JOB"
run mkdir -p "$RESULTS"
run rsync -az "$HOST:rmjax/results/" "$RESULTS"
