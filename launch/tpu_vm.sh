#!/usr/bin/env bash
# Create a TPU VM, install rmjax, bring a checkpoint, run one job on every worker, collect results, delete.
#
# launch/tpu_vm.sh --name=rmjax-v5e --zone=us-west4-a --type=v5litepod-8 \
#     --checkpoint=gs://BUCKET/Skywork-Reward-Gemma-2-27B-v0.2 \
#     --job="experiments.sweep --model=/tmp/ckpt --prompts=paper1 --dtype=bfloat16 --mesh=data:1,model:8 --out=results/s.csv" \
#     [--project=P] [--version=tpu-ubuntu2204-base] [--results=results/] [--plan_model=SPEC] [--keep] [--dry-run]
#
# --type: v4-8, v5litepod-8, v6e-8, v5litepod-16 ... (on multi-host slices every worker runs the job and
#         jax.distributed finds its peers; process 0 writes results/).
# --checkpoint: gs:// path (copied with gsutil on each worker) or a local folder (scp'd to each worker).
# --job: shell text, run on every worker as `.venv/bin/python -m JOB` in the shipped repository.
# --plan_model: a zoo hub id or nickname, a config.json or a local folder: before the VM is created, the job is
#         compiled for --type here (python -m experiments.plan, needs jax[tpu]) and refused when it does not fit;
#         default: the checkpoint's config.json (gsutil cp from a gs:// checkpoint) or its local folder.
# --keep: keep the VM at the end, also after a failure (otherwise a failed run deletes it too).
# --dry-run prints every command, one per line, quoted so that a line pasted into a shell runs exactly it.
# The VM gets `git archive HEAD`: uncommitted changes are not shipped (a warning names them).
set -euo pipefail

NAME="" ZONE="" TYPE="" PROJECT="" VERSION="tpu-ubuntu2204-base" CHECKPOINT="" JOB="" RESULTS="results/" KEEP=0 DRY=0
PLAN_MODEL=""
for arg in "$@"; do
  case "$arg" in
    --name=*) NAME="${arg#*=}" ;; --zone=*) ZONE="${arg#*=}" ;; --type=*) TYPE="${arg#*=}" ;;
    --project=*) PROJECT="${arg#*=}" ;; --version=*) VERSION="${arg#*=}" ;;
    --checkpoint=*) CHECKPOINT="${arg#*=}" ;; --job=*) JOB="${arg#*=}" ;; --results=*) RESULTS="${arg#*=}" ;;
    --plan_model=*) PLAN_MODEL="${arg#*=}" ;;
    --keep) KEEP=1 ;; --dry-run) DRY=1 ;;
    -h|--help) sed -n '2,/^set -/{/^#/p}' "$0"; exit 0 ;;
    *) echo "unknown argument: $arg (see --help)" >&2; exit 2 ;;
  esac
done
for required in NAME ZONE TYPE JOB; do
  [ -n "${!required}" ] || { echo "--$(echo "$required" | tr '[:upper:]' '[:lower:]') is required (see --help)" >&2; exit 2; }
done

source "$(dirname "$0")/run.sh"  # quote, run: the printed line is the argv that runs
TPU=(gcloud compute tpus tpu-vm)
WHERE=(--zone="$ZONE")
[ -n "$PROJECT" ] && WHERE+=(--project="$PROJECT")
REPO="$(cd "$(dirname "$0")/.." && pwd)"
TARBALL="${TMPDIR:-/tmp}/rmjax-$NAME.tar.gz"

# A VM left behind by a failed job keeps billing: delete it on any exit once it exists, unless --keep.
CREATED=0
cleanup() {
  local rc=$? delete=("${TPU[@]}" delete "$NAME" "${WHERE[@]}" --quiet)
  if [ "$CREATED" = 1 ]; then
    if [ "$KEEP" = 1 ]; then
      echo "==> TPU VM $NAME is KEPT (--keep) and still billing. Delete it with: $(quote "${delete[@]}")" >&2
    else
      [ "$rc" = 0 ] || echo "error: the run failed (exit $rc); deleting TPU VM $NAME (--keep keeps it)" >&2
      run "${delete[@]}"
    fi
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT; trap 'exit 143' TERM; trap 'exit 129' HUP

if DIRTY="$(git -C "$REPO" status --porcelain | sed 's/^ *//')" && [ -n "$DIRTY" ]; then
  mapfile -t DIRTY <<<"$DIRTY"
  echo "warning: ${#DIRTY[@]} uncommitted change(s) will NOT be shipped (the VM gets git archive HEAD):" \
       "$(printf '%s; ' "${DIRTY[@]:0:5}")$([ "${#DIRTY[@]}" -le 5 ] || echo ...)" >&2
fi

# Python 3.11+ (setup.py's python_requires), while the Ubuntu 22.04 TPU images ship python3 3.10: uv (from PyPI,
# with the image's own pip) uses a python3.11 already on the VM or fetches a standalone CPython 3.11 (the
# version the pins are tested on).
# Unlike apt (deadsnakes) it needs no sudo, no python3.X-venv package, and does not race unattended-upgrades
# for the dpkg lock on a fresh VM; it works on any image.
SETUP='mkdir -p rmjax && tar -xzf rmjax.tar.gz -C rmjax && cd rmjax'
SETUP+=' && python3 -m pip install -q --user uv'
SETUP+=' && { ~/.local/bin/uv venv -q --python 3.11 .venv'
SETUP+=' || { echo "error: no Python 3.11 on this VM, and uv could not download one" >&2; exit 1; }; }'
SETUP+=' && ~/.local/bin/uv pip install -q --python .venv/bin/python -r requirements.txt "jax[tpu]"'
SETUP+=' && ~/.local/bin/uv pip install -q --python .venv/bin/python --no-deps -e .'

# Plan before paying: compile the job for --type on this machine and refuse one that does not fit.
read -ra JOB_WORDS <<<"$JOB"  # split on blanks, no glob expansion
JOB_NAME="${JOB_WORDS[0]#experiments.}"
if [ -z "$PLAN_MODEL" ] && [[ "$CHECKPOINT" == gs://* ]]; then  # its config.json is enough: no weights are read
  PLAN_MODEL="${TMPDIR:-/tmp}/rmjax-$NAME-config.json"
  run gsutil cp "$CHECKPOINT/config.json" "$PLAN_MODEL"
elif [ -z "$PLAN_MODEL" ]; then
  PLAN_MODEL="$CHECKPOINT"
fi
case "$JOB_NAME" in
  sweep|beam|gcg|score|logprobs|inspect|train_rm) ;;
  *) echo "warning: experiments.plan has no job $JOB_NAME: the VM is created unplanned" >&2; PLAN_MODEL="" ;;
esac
if [ -z "$PLAN_MODEL" ]; then
  echo "warning: no --plan_model or --checkpoint to read the model's config from: the job is not planned" >&2
else
  PLAN=(python -m experiments.plan --model="$PLAN_MODEL" --topology="$TYPE" --job="$JOB_NAME")
  for word in "${JOB_WORDS[@]:1}"; do  # the flags the plan shares with the jobs
    case "$word" in
      --prompts=*|--prompt=*|--dtype=*|--mesh=*|--batch_size=*|--limit=*|--template=*|--trainable=*|--last_k=*|\
      --steps=*|--n_train=*|--depth=*|--beam=*|--direction=*|--exhaustive*|--num_tokens=*|--search_width=*)
        PLAN+=("$word") ;;
    esac
  done
  PY="$REPO/.venv/bin/python"; [ -x "$PY" ] || PY=python3
  PLAN[0]="$PY"
  ( cd "$REPO" && run "${PLAN[@]}" ) || { rc=$?; echo "error: the job does not plan for $TYPE (above); no VM was created" >&2; exit "$rc"; }
fi

run "${TPU[@]}" create "$NAME" "${WHERE[@]}" --accelerator-type="$TYPE" --version="$VERSION"
CREATED=1
run git -C "$REPO" archive --format=tar.gz -o "$TARBALL" HEAD
run "${TPU[@]}" scp "$TARBALL" "$NAME:~/rmjax.tar.gz" "${WHERE[@]}" --worker=all
run "${TPU[@]}" ssh "$NAME" "${WHERE[@]}" --worker=all --command="$SETUP"
if [ -n "$CHECKPOINT" ]; then
  if [[ "$CHECKPOINT" == gs://* ]]; then
    run "${TPU[@]}" ssh "$NAME" "${WHERE[@]}" --worker=all \
      --command="mkdir -p /tmp/ckpt && gsutil -m cp -r $(quote "$CHECKPOINT/*") /tmp/ckpt/"
  else
    run "${TPU[@]}" scp --recurse "$CHECKPOINT" "$NAME:/tmp/ckpt" "${WHERE[@]}" --worker=all
  fi
fi
run "${TPU[@]}" ssh "$NAME" "${WHERE[@]}" --worker=all \
  --command="cd rmjax && HF_HUB_OFFLINE=1 RMJAX_COORDINATOR=auto .venv/bin/python -m $JOB"
run mkdir -p "$RESULTS"
run "${TPU[@]}" scp --recurse "$NAME:~/rmjax/results/*" "$RESULTS" "${WHERE[@]}" --worker=0
