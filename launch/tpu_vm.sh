#!/usr/bin/env bash
# Create a TPU VM, install rmjax, bring a checkpoint, run one job on every worker, collect results, delete.
#
# launch/tpu_vm.sh --name=rmjax-v5e --zone=us-west4-a --type=v5litepod-8 \
#     --checkpoint=gs://BUCKET/Skywork-Reward-Gemma-2-27B-v0.2 \
#     --job="experiments.sweep --model=/tmp/ckpt --prompts=paper1 --dtype=bfloat16 --mesh=data:1,model:8 --out=results/s.csv" \
#     [--project=P] [--version=RUNTIME] [--spot | --queued] [--results=results/] [--plan_model=SPEC] [--keep] \
#     [--dry-run]
#
# --type: v4-8, v5litepod-8, v5p-8, v6e-8, v5litepod-16 ... (on multi-host slices every worker runs the job and
#         jax.distributed finds its peers; process 0 writes results/).
# --version: the TPU software version; by default the one --type needs (Google's "TPU software versions" page):
#         v4 tpu-ubuntu2204-base, v5litepod v2-alpha-tpuv5-lite, v5p v2-alpha-tpuv5, v6e v2-alpha-tpuv6e (a v5e
#         VM on the v4 image shows no TPU, and JAX runs on its CPU).
# --spot: a Spot VM (60-70% cheaper; it can be preempted, and every rmjax job resumes where it stopped).
# --queued: ask through a queued resource (gcloud compute tpus queued-resources; how v5e/v5p/v6e capacity is
#         usually granted), wait for it to become ACTIVE, and delete it (with its VM) at the end. With --spot too.
# --checkpoint: gs:// path (copied with gcloud storage on each worker) or a local folder (scp'd to each worker).
# --job: shell text, run on every worker as `.venv/bin/python -m JOB` in the shipped repository. Its outputs must be
#         under results/ (the only folder brought back before the VM is deleted): another place is refused.
# --plan_model: a zoo hub id or nickname, a config.json or a local folder: before the VM is created, the job is
#         compiled for --type here (python -m experiments.plan, needs jax[tpu]) and refused when it does not fit;
#         default: the checkpoint's config.json (gcloud storage cp from a gs:// checkpoint) or its local folder.
#         A beam or GCG job's --lm is planned too (held beside the RM); one under /tmp/ckpt is read from the
#         checkpoint, as is a --prompts file there.
# --keep: keep the VM at the end, also after a failure (otherwise a failed run deletes it too).
# --dry-run runs the plan here (its verdict on stderr; from a gs:// checkpoint only with --plan_model) and prints
#         every command, one per line, quoted so that a line pasted into a shell runs exactly it.
# A name already in use is refused before anything is created. From the moment `create` starts, any exit (a
# failure, Ctrl-C, a client timeout while Google is still creating it) deletes whatever exists under the name.
# The VM gets `git archive HEAD`: uncommitted changes are not shipped (a warning names them).
set -euo pipefail

NAME="" ZONE="" TYPE="" PROJECT="" VERSION="" CHECKPOINT="" JOB="" RESULTS="results/" KEEP=0 DRY=0
PLAN_MODEL="" SPOT=0 QUEUED=0
for arg in "$@"; do
  case "$arg" in
    --name=*) NAME="${arg#*=}" ;; --zone=*) ZONE="${arg#*=}" ;; --type=*) TYPE="${arg#*=}" ;;
    --project=*) PROJECT="${arg#*=}" ;; --version=*) VERSION="${arg#*=}" ;;
    --checkpoint=*) CHECKPOINT="${arg#*=}" ;; --job=*) JOB="${arg#*=}" ;; --results=*) RESULTS="${arg#*=}" ;;
    --plan_model=*) PLAN_MODEL="${arg#*=}" ;;
    --keep) KEEP=1 ;; --dry-run) DRY=1 ;; --spot) SPOT=1 ;; --queued) QUEUED=1 ;;
    -h|--help) sed -n '2,/^set -/{/^#/p}' "$0"; exit 0 ;;
    *) echo "unknown argument: $arg (see --help)" >&2; exit 2 ;;
  esac
done
for required in NAME ZONE TYPE JOB; do
  [ -n "${!required}" ] || { echo "--$(echo "$required" | tr '[:upper:]' '[:lower:]') is required (see --help)" >&2; exit 2; }
done
# a bucket path without its trailing slash (gs://b/m/ + /config.json names another object); a local folder and
# --plan_model absolute: the plan runs in the repository, the copy from here (the same folder both ways)
[[ "$CHECKPOINT" == gs://* ]] && CHECKPOINT="${CHECKPOINT%/}"
[ -n "$CHECKPOINT" ] && [[ "$CHECKPOINT" != gs://* ]] && [ -e "$CHECKPOINT" ] && CHECKPOINT="$(realpath -- "$CHECKPOINT")"
[ -n "$PLAN_MODEL" ] && [ -e "$PLAN_MODEL" ] && PLAN_MODEL="$(realpath -- "$PLAN_MODEL")"

if [ -z "$VERSION" ]; then
  case "$TYPE" in
    v4-*) VERSION=tpu-ubuntu2204-base ;;
    v5litepod-*|v5e-*) VERSION=v2-alpha-tpuv5-lite ;;
    v5p-*) VERSION=v2-alpha-tpuv5 ;;
    v6e-*) VERSION=v2-alpha-tpuv6e ;;
    *) echo "--type=$TYPE: no default runtime for it (v4-*, v5litepod-*, v5p-*, v6e-*); pass --version" >&2; exit 2 ;;
  esac
fi

source "$(dirname "$0")/run.sh"  # quote, run: the printed line is the argv that runs
TPU=(gcloud compute tpus tpu-vm)
QR=(gcloud compute tpus queued-resources)
WHERE=(--zone="$ZONE")
[ -n "$PROJECT" ] && WHERE+=(--project="$PROJECT")
REPO="$(cd "$(dirname "$0")/.." && pwd)"
TARBALL="${TMPDIR:-/tmp}/rmjax-$NAME.tar.gz"

# A VM left behind keeps billing. From the moment create starts (the name was free: checked first), any exit
# deletes whatever exists under the name, unless --keep: a create that failed, was interrupted or timed out on
# the client may still finish on Google's side. A second Ctrl-C does not stop the deletion; a delete that fails
# while the VM is still there is an error that names the command.
STARTED=0
exists() {  # whether a VM (or, with --queued, a queued resource) exists under the name; with --dry-run: no
  local what=("${TPU[@]}") ; [ "$QUEUED" = 1 ] && what=("${QR[@]}")
  if [ "$DRY" = 1 ]; then printf '%s\n' "$(quote "${what[@]}" describe "$NAME" "${WHERE[@]}" --quiet)"; return 1; fi
  "${what[@]}" describe "$NAME" "${WHERE[@]}" --quiet >/dev/null 2>&1
}
cleanup() {
  local rc=$? delete=("${TPU[@]}" delete "$NAME" "${WHERE[@]}" --quiet)
  trap '' INT TERM HUP
  [ "$QUEUED" = 1 ] && delete=("${QR[@]}" delete "$NAME" "${WHERE[@]}" --force --quiet)  # its VM with it
  if [ "$STARTED" = 1 ]; then
    if [ "$KEEP" = 1 ]; then
      echo "==> TPU VM $NAME is KEPT (--keep) and still billing. Delete it with: $(quote "${delete[@]}")" >&2
    else
      # delete first, ask after: a describe that fails for another reason (network, auth) must not leave a VM
      # billing; only a delete that fails is checked, and a VM still there is said loudly
      [ "$rc" = 0 ] || echo "error: the run failed (exit $rc); deleting TPU VM $NAME (--keep keeps it)" >&2
      if ! ( run "${delete[@]}" ); then  # (run exits on failure: only its subshell here)
        if [ "$DRY" != 1 ] && exists; then
          echo "ERROR: TPU VM $NAME could not be deleted and is STILL BILLING: $(quote "${delete[@]}")" >&2
          [ "$rc" != 0 ] || rc=1
        fi
      fi
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

# What `make demo` installs (requirements.txt, then requirements-nodeps.txt without dependencies: the builtin
# models' and the analyses' data), with jax[tpu]. Python 3.11+ (setup.py's python_requires), while the Ubuntu 22.04 TPU images ship python3 3.10: uv (from PyPI,
# with the image's own pip) uses a python3.11 already on the VM or fetches a standalone CPython 3.11 (the
# version the pins are tested on).
# Unlike apt (deadsnakes) it needs no sudo, no python3.X-venv package, and does not race unattended-upgrades
# for the dpkg lock on a fresh VM; it works on any image.
SETUP='mkdir -p rmjax && tar -xzf rmjax.tar.gz -C rmjax && cd rmjax'
SETUP+=' && python3 -m pip install -q --user uv'
SETUP+=' && { ~/.local/bin/uv venv -q --python 3.11 .venv'
SETUP+=' || { echo "error: no Python 3.11 on this VM, and uv could not download one" >&2; exit 1; }; }'
SETUP+=' && ~/.local/bin/uv pip install -q --python .venv/bin/python -r requirements.txt "jax[tpu]"'
SETUP+=' && ~/.local/bin/uv pip install -q --python .venv/bin/python --no-deps -r requirements-nodeps.txt -e .'

# Plan before paying: read the job's command line with the job's own flags (experiments/job_line.py: as the VM's
# shell and absl will read it, so a flag the job lacks or a value it refuses stops here), then compile the job for
# --type on this machine and refuse one that does not fit.
PY="$REPO/.venv/bin/python"; [ -x "$PY" ] || PY="$(command -v python3 || true)"
if [ -z "$PY" ] || ! ( cd "$REPO" && "$PY" -c "import absl, rmjax" 2>/dev/null ); then
  echo "error: no python with rmjax here to read --job with (make demo creates .venv; the plan needs it too)" >&2
  exit 2
fi
mapfile -d '' -t JOB_READ < <(cd "$REPO" && RMJAX_LAUNCH_CHECKPOINT="$CHECKPOINT" "$PY" "${JOB_LINE[@]}" "$JOB" "$TYPE")
wait $! || exit 2  # it said why, in one line
JOB_NAME="${JOB_READ[0]}" PLAN_FLAGS=("${JOB_READ[@]:1}")  # no plan flags: a job experiments.plan does not plan
if [ -z "$PLAN_MODEL" ] && [[ "$CHECKPOINT" == gs://* ]]; then  # its config.json is enough: no weights are read
  PLAN_MODEL="${TMPDIR:-/tmp}/rmjax-$NAME-config.json"
  run gcloud storage cp "$CHECKPOINT/config.json" "$PLAN_MODEL"
  [ "$DRY" = 1 ] && PLAN_DRY_WHY="$CHECKPOINT/config.json (pass --plan_model to plan it here now)"
elif [ -z "$PLAN_MODEL" ]; then
  PLAN_MODEL="$CHECKPOINT"
fi
# A beam or GCG job's --lm, or a prompts file, under the checkpoint is on the VM only: the plan reads it here, from
# the checkpoint folder (a gs:// one: the LM's config.json, the prompts file, copied), so that the LM the job holds
# beside the RM counts in the plan and the prompts it sizes are the job's.
from_checkpoint() {  # $1: a path under /tmp/ckpt, $2: what of it the plan reads ("" the file itself), $3: a local
  local rest="${1#/tmp/ckpt}" # name for a copy, $4: what it is (said by a dry run); sets MAPPED: what the plan reads
  rest="${rest%/}"
  if [[ "$CHECKPOINT" == gs://* ]]; then
    run gcloud storage cp "$CHECKPOINT$rest${2:+/$2}" "$3"
    [ "$DRY" = 1 ] && PLAN_DRY_WHY="${PLAN_DRY_WHY:+$PLAN_DRY_WHY and }$4 $CHECKPOINT$rest${2:+/$2}"
    MAPPED="$3"
  else
    MAPPED="$CHECKPOINT$rest"
  fi
}
under_checkpoint() { [ "$1" = /tmp/ckpt ] || [[ "$1" == /tmp/ckpt/* ]]; }
for i in "${!PLAN_FLAGS[@]}"; do
  flag="${PLAN_FLAGS[$i]}"
  [ -n "$CHECKPOINT" ] || continue  # the job line refused /tmp/ckpt without one
  if [[ "$flag" == --lm=* ]] && under_checkpoint "${flag#--lm=}"; then
    from_checkpoint "${flag#--lm=}" config.json "${TMPDIR:-/tmp}/rmjax-$NAME-lm-config.json" "--lm's"
    PLAN_FLAGS[$i]="--lm=$MAPPED"
  elif [[ "$flag" == --prompts=* ]]; then
    IFS=, read -ra items <<<"${flag#--prompts=}"
    for k in "${!items[@]}"; do
      if under_checkpoint "${items[$k]}"; then
        from_checkpoint "${items[$k]}" "" "${TMPDIR:-/tmp}/rmjax-$NAME-prompts-$k.yaml" "--prompts'"
        items[$k]="$MAPPED"
      fi
    done
    PLAN_FLAGS[$i]="--prompts=$(IFS=,; printf '%s' "${items[*]}")"
  fi
done
if [ "${#PLAN_FLAGS[@]}" = 0 ]; then
  echo "warning: experiments.plan has no job $JOB_NAME: the VM is created unplanned" >&2
elif [ -z "$PLAN_MODEL" ]; then
  echo "warning: no --plan_model or --checkpoint to read the model's config from: the job is not planned" >&2
else
  PLAN=("$PY" -m experiments.plan --model="$PLAN_MODEL" --topology="$TYPE" "${PLAN_FLAGS[@]}")
  if [ "$DRY" = 1 ]; then  # the command, then its verdict (on stderr: stdout holds only commands)
    run "${PLAN[@]}"
    if [ -n "${PLAN_DRY_WHY:-}" ]; then
      echo "dry run: the plan needs $PLAN_DRY_WHY, copied from the bucket by a real run" >&2
    else
      ( cd "$REPO" && "${PLAN[@]}" ) >&2 || { rc=$?; echo "error: the job does not plan for $TYPE (above); a real run would create no VM" >&2; exit "$rc"; }
    fi
  else
    ( cd "$REPO" && run "${PLAN[@]}" ) || { rc=$?; echo "error: the job does not plan for $TYPE (above); no VM was created" >&2; exit "$rc"; }
  fi
fi

if exists; then
  echo "error: a TPU VM$([ "$QUEUED" = 1 ] && echo " queued resource") named $NAME already exists in $ZONE; choose another --name or delete it" >&2
  exit 2
fi
CAPACITY=(); [ "$SPOT" = 1 ] && CAPACITY=(--spot)
STARTED=1
if [ "$QUEUED" = 1 ]; then
  run "${QR[@]}" create "$NAME" --node-id="$NAME" "${WHERE[@]}" --accelerator-type="$TYPE" \
    --runtime-version="$VERSION" "${CAPACITY[@]}" --quiet
  # granted when capacity frees up: wait for ACTIVE (a FAILED or SUSPENDED request stops here, and is deleted)
  WAIT=("${QR[@]}" describe "$NAME" "${WHERE[@]}" --format='value(state.state)' --quiet)
  if [ "$DRY" = 1 ]; then printf '%s\n' "$(quote "${WAIT[@]}")"; else
    while state="$("${WAIT[@]}")"; [ "$state" != ACTIVE ]; do
      case "$state" in FAILED|SUSPENDED) echo "error: queued resource $NAME is $state" >&2; exit 1 ;; esac
      echo "==> queued resource $NAME is ${state:-unknown}; waiting for capacity" >&2; sleep "${RMJAX_QUEUE_POLL:-60}"
    done
  fi
else
  run "${TPU[@]}" create "$NAME" "${WHERE[@]}" --accelerator-type="$TYPE" --version="$VERSION" "${CAPACITY[@]}" \
    --quiet
fi
run git -C "$REPO" archive --format=tar.gz -o "$TARBALL" HEAD
run "${TPU[@]}" scp "$TARBALL" "$NAME:~/rmjax.tar.gz" "${WHERE[@]}" --worker=all --quiet
run "${TPU[@]}" ssh "$NAME" "${WHERE[@]}" --worker=all --quiet --command="$SETUP"
if [ -n "$CHECKPOINT" ]; then
  if [[ "$CHECKPOINT" == gs://* ]]; then
    run "${TPU[@]}" ssh "$NAME" "${WHERE[@]}" --worker=all --quiet \
      --command="mkdir -p /tmp/ckpt && gcloud storage cp -r $(quote "$CHECKPOINT/*") /tmp/ckpt/"
  else
    run "${TPU[@]}" scp --recurse "$CHECKPOINT" "$NAME:/tmp/ckpt" "${WHERE[@]}" --worker=all --quiet
  fi
fi
run "${TPU[@]}" ssh "$NAME" "${WHERE[@]}" --worker=all --quiet \
  --command="cd rmjax && HF_HUB_OFFLINE=1 RMJAX_COORDINATOR=auto .venv/bin/python -m $JOB"
run mkdir -p "$RESULTS"
run "${TPU[@]}" scp --recurse "$NAME:~/rmjax/results/*" "$RESULTS" "${WHERE[@]}" --worker=0 --quiet
