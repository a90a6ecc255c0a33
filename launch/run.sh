# Sourced by the launch scripts: one way to print and run a command. Needs DRY (1: print only).
# Shell-quote words: bare when safe, else single-quoted (readable where printf %q would backslash-escape), and
# --flag='value' rather than '--flag=value'.
quote() {
  local out=() a
  for a in "$@"; do
    if [[ "$a" =~ ^[A-Za-z0-9_@%+=:,./-]+$ ]]; then out+=("$a")
    elif [[ "$a" =~ ^(--[A-Za-z0-9-]+=)(.*)$ ]]; then out+=("${BASH_REMATCH[1]}$(quote "${BASH_REMATCH[2]}")")
    else out+=("'${a//\'/\'\\\'\'}'"); fi
  done
  printf '%s' "${out[*]}"
}
# The printed line is the quoted argv that runs, so --dry-run output is what would be executed.
run() {
  local line rc
  line="$(quote "$@")"
  if [ "$DRY" = 1 ]; then printf '%s\n' "$line"; return; fi
  printf '+ %s\n' "$line" >&2
  "$@" || { rc=$?; echo "error: exit $rc from: $line" >&2; exit "$rc"; }
}
# experiments/job_line.py's arguments to python: reads a launch's --job with the job's own flags. Not `-m`: under
# -m the experiments package imports transformers to hide torch from a job's tokenizers (0.6 s where torch is
# installed), which reading flags does not need.
JOB_LINE=(-c 'import sys; from experiments.job_line import main; main(sys.argv)')
