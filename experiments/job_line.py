"""Read a launch's --job with the job's own flags, here, before a machine is paid for.

python -m experiments.job_line "experiments.sweep --prompts=paper1 --mesh data:1,model:8 --out=results/s.csv" [TYPE]

launch/tpu_vm.sh once turned the job's words into the plan's flags in shell, and got quoting, `--flag value`,
negative numbers and absl's boolean spellings wrong in turn; a flag the job does not have failed only on the VM.
Here absl reads the words as the job on the remote host will (the job's module defines its flags) and the job's
settings are checked as the job checks them (its config builders and `check_flags`), so what the job would refuse
from its flags stops the launch here; so does an output outside results/, the one folder the launch brings back, and,
with a TPU TYPE, a job with no --mesh on a slice of several chips (it would use one) and an input file the VM would
not have (not in the repository's HEAD nor under /tmp/ckpt, the checkpoint). Prints, NUL-separated, the
job's name and then, for a job experiments.plan plans, the plan's flags for this run: the job-specific sizes with
the job's own values (its defaults too, so the plan sizes the run the job will make) and the shared flags given.
A refused line: one `error: --job: …` line, exit 2.
"""

from __future__ import annotations

import importlib
import os
import re
import shlex
import sys
from pathlib import Path

from absl import flags

SHARED = ("prompts", "prompt", "dtype", "mesh", "template")  # the plan's and the job's (experiments.common)
# Each planned job's flags that size its run: the job's flag -> the plan's. Counts are in `_derived`.
SIZES: dict[str, dict[str, str]] = {
    "sweep": {"limit": "limit", "batch_size": "batch_size"},
    "beam": {name: name for name in ("limit", "batch_size", "depth", "beam", "direction", "exhaustive", "lm")},
    "gcg": {"num_tokens": "num_tokens", "search_width": "search_width", "steps": "steps",
            "eval_batch_size": "batch_size", "buffer_size": "buffer_size", "lm": "lm"},
    "score": {"batch_size": "batch_size"},
    "audit": {"batteries": "batteries", "batch_size": "batch_size"},
    "logprobs": {},
    "inspect": {"steps": "ig_steps", "batch_size": "batch_size"},
    "train_rm": {name: name for name in ("trainable", "last_k", "steps", "batch_size", "n_train", "n_heldout",
                                         "checkpoint_every", "fsdp", "remat")},
}
# Where each job writes (train_rm's --workdir, by default under runs/train_rm/, holds its checkpoints and summary).
OUTPUTS = ("out", "workdir", "export", "head_out")
FILE_OUT_JOBS = ("sweep", "score", "beam", "gcg", "logprobs", "plan")  # the others' --out is a folder
COLLECTED = "results"  # what the launch scripts bring back; a TPU VM is deleted with everything else on it
# What a job reads from files: a TPU VM has only the repository's HEAD (git archive) and the checkpoint.
INPUTS = ("from_sweep", "from_beam", "sweep", "init_from", "texts_file", "vocab_file", "pairs", "heldout_pairs", "elo",
          "scores", "audits", "disagreements", "bigtwo_checkpoints", "bigtwo_dictionary", "implicit_chosen",
          "implicit_reference", "models_yaml", "frequencies", "prompts", "model", "lm", "judge")
CHECKPOINT = "/tmp/ckpt"  # where launch/tpu_vm.sh puts --checkpoint on every worker (gpu.sh a local one)
LAUNCH_CHECKPOINT = "RMJAX_LAUNCH_CHECKPOINT"  # the launch scripts' --checkpoint, set by them
HELP = ("help", "helpshort", "helpfull", "helpxml", "only_check_args")  # absl's: the job would print and stop
_OPERATOR = re.compile(r"[;&|<>()\n]+")


def _fail(message: str) -> None:
    print(f"error: --job: {message}", file=sys.stderr)
    sys.exit(2)


def job_words(line: str) -> list[str]:
    """The words the remote shell passes to `python -m`: up to a redirection, `;`, `&&`, `|` or a line's end
    (another command's, or the shell's; a backslash before it continues the line), comments dropped; a file
    descriptor written against its redirection (`2>&1`) goes too."""
    lexer = shlex.shlex(line.replace("\\\n", ""), posix=True, punctuation_chars="();<>|&\n")
    lexer.whitespace_split, lexer.commenters = True, ""  # shlex would cut `a#b`; the shell's comment starts a word
    lexer.whitespace = " \t\r"  # a newline ends the command (quoted, it is part of a word)
    words = list(lexer)
    cut = next((i for i, word in enumerate(words) if _OPERATOR.fullmatch(word) or word.startswith("#")), len(words))
    if cut < len(words) and words[cut][0] in "<>" and cut and words[cut - 1].isdigit() and \
            re.search(rf"(^|\s){words[cut - 1]}[<>]", line):
        cut -= 1
    return words[:cut]


def _job_name(first: str, experiments: Path) -> str:
    """A typo would have failed on the remote host, after paying for it: experiments.NAME, an entry point (it
    ends by running its main through experiments.cli, as every job does)."""
    name = first.removeprefix("experiments.")
    source = experiments / f"{name}.py"
    if not (first.startswith("experiments.") and name.isidentifier() and source.is_file()
            and re.search(r"^\s+(common|cli)\.run\(main\)$", source.read_text(), re.M)):
        _fail(f"rmjax has no job {name} (give experiments.NAME, NAME one of experiments/*.py's jobs)")
    return name


def _as_flag(name: str, value: object) -> list[str]:
    if isinstance(value, bool):
        return [f"--{name}={str(value).lower()}"]
    if isinstance(value, list) and name == "prompt":  # repeatable: one flag each
        return [f"--{name}={item}" for item in value]
    if isinstance(value, list):
        return [f"--{name}={','.join(value)}"]
    return [f"--{name}={value}"]


def _derived(job: str, values: flags.FlagValues) -> list[str]:
    """Sizes the plan takes as counts, where the job's flags give them (a --texts_file is on the remote host)."""
    if job == "score" and values.texts and not values.texts_file:
        return [f"--texts={len(values.texts)}"]
    if job == "inspect" and values.responses:
        return [f"--items={len(values.responses)}"]
    if job == "inspect" and (values.from_sweep or values.from_beam):
        return [f"--items={2 * values.top}"]  # its --top best and --top worst
    return []


def _normal_paths(name: str, value):
    """An --lm or --prompts file path as the launcher compares it with /tmp/ckpt (`/tmp//ckpt/p.yaml`, `./` inside)."""
    if name == "lm" and isinstance(value, str) and value.startswith("/"):
        return os.path.normpath(value)
    if name == "prompts" and isinstance(value, list):
        return [os.path.normpath(v) if v.startswith("/") else v for v in value]
    return value


def plan_flags(job: str, values: flags.FlagValues) -> list[str]:
    """The plan's flags for a job whose command line `values` has parsed."""
    out = [f"--job={job}"]
    for name in SHARED:
        if values[name].present:
            out += _as_flag(name, _normal_paths(name, values[name].value))
    sizes = {name: _normal_paths(name, values[name].value) for name in SIZES[job]}
    if job in ("sweep", "beam") and values.token_ids:  # the candidates: the ids given (and of them --limit's first)
        sizes["limit"] = min(sizes["limit"] or len(values.token_ids), len(values.token_ids))
    for name, value in sizes.items():
        if value is not None:
            out += _as_flag(SIZES[job][name], value)
    return out + _derived(job, values)


def _a_file_output(job: str, name: str) -> bool:
    """Whether the job's output flag `name` names a file (a folder job's --out, a workdir or an export: a folder,
    whose files results/* brings back)."""
    return name == "head_out" or (name == "out" and job in FILE_OUT_JOBS)


def _refuse_uncollected(job: str, values: flags.FlagValues) -> None:
    """An output outside results/ stays on the remote host, and on a TPU VM is deleted with it: the paid-for run's
    result lost. train_rm must bring back what it trained (its workdir, export or head)."""
    written = {name: values[name].value for name in OUTPUTS if name in values and values[name].value}
    for name, path in written.items():
        parts = Path(os.path.normpath(path)).parts
        if parts == (COLLECTED,) and _a_file_output(job, name):  # a sweep wrote a file `results`, unfetched
            _fail(f"--{name}={path} is the {COLLECTED}/ folder itself, and the launch brings back what is inside it; "
                  f"give --{name}={COLLECTED}/NAME.")
        if Path(path).is_absolute() or parts[:1] != (COLLECTED,):
            _fail(f"--{name}={path} is outside {COLLECTED}/, and the launch brings back only {COLLECTED}/ (a TPU VM is "
                  f"deleted with the rest); give --{name}={COLLECTED}/….")
    if job == "train_rm" and not written:
        _fail(f"train_rm would keep its checkpoints and summary in runs/train_rm/ and export nothing, and the launch "
              f"brings back only {COLLECTED}/; give --workdir={COLLECTED}/…, --export={COLLECTED}/… or "
              f"--head_out={COLLECTED}/….")


def _a_file(name: str, value: str) -> bool:
    """Whether a value of input flag `name` names a file or folder (not a builtin, a prompt or a model name)."""
    if name in ("model", "lm", "judge"):
        return value.startswith(("/", ".", "~")) or value.endswith(".gguf")
    if name == "prompts":
        return value.endswith((".yaml", ".yml"))
    return value not in ("", "builtin") and not value.startswith("builtin:")  # --elo's shipped files


def _under_checkpoint(path: str) -> bool:
    """Whether `path` is the launch's checkpoint folder or inside it (not /tmp/ckptX, which is neither)."""
    path = os.path.normpath(path)
    return path == CHECKPOINT or path.startswith(CHECKPOINT + "/")


def _input_files(values: flags.FlagValues):
    """(flag, value) of every input the job reads from a file or folder (`_a_file`)."""
    for name in INPUTS:
        if name not in values or not values[name].present or not values[name].value:
            continue
        given = values[name].value
        yield from ((name, item) for item in (given if isinstance(given, list) else [given]) if _a_file(name, item))


def _refuse_absent_checkpoint(values: flags.FlagValues, checkpoint: str) -> None:
    """A launch copies its --checkpoint to /tmp/ckpt: without one (or with gpu.sh's remote:PATH, read in place) a
    job reading /tmp/ckpt reads what an earlier run left there, or nothing, on the paid-for machine."""
    remote = checkpoint.removeprefix("remote:") if checkpoint.startswith("remote:") else None
    if checkpoint and (remote is None or _under_checkpoint(remote)):  # a host holding it at /tmp/ckpt itself
        return
    for name, item in _input_files(values):
        if _under_checkpoint(item):
            fix = (f"the host reads --checkpoint={checkpoint} in place: give the job --{name}="
                   f"{checkpoint.removeprefix('remote:')}{os.path.normpath(item)[len(CHECKPOINT):]}" if checkpoint else
                   "no --checkpoint is given to copy there: give the launch --checkpoint=FOLDER")
            _fail(f"--{name}={item} is under {CHECKPOINT}, the launch's copy of its --checkpoint, and {fix}.")


def _refuse_unshipped(values: flags.FlagValues, repo: Path) -> None:
    """A TPU VM gets `git archive HEAD` and the checkpoint at /tmp/ckpt: an input elsewhere (a sweep in results/,
    which git ignores, or a file of this machine's) is not there, and the job would stop on the VM once it is paid
    for and set up."""
    import subprocess

    for name, item in _input_files(values):
        if not _under_checkpoint(item):
            relative = os.path.relpath(os.path.abspath(os.path.expanduser(item)), repo)
            tracked = not relative.startswith("..") and subprocess.run(
                ["git", "-C", str(repo), "ls-tree", "-r", "--name-only", "HEAD", "--", relative],
                capture_output=True, text=True).stdout.strip()
            if not tracked:
                _fail(f"--{name}={item} would not be on the TPU VM: it gets the repository's HEAD (git archive) and "
                      f"the checkpoint at {CHECKPOINT}, and {item} is in neither; commit it, or put it in the "
                      f"--checkpoint folder and give its path under {CHECKPOINT}.")


def _refuse_one_chip(job: str, tpu_type: str) -> None:
    """Without --mesh a job runs on one device: on a slice of several chips the rest are paid for and idle (and
    on a multi-host slice the job stops at start)."""
    from rmjax.errors import UsageError
    from rmjax.plan.chips import parse_slice

    try:
        chips = parse_slice(tpu_type).chips
    except UsageError:
        return  # a type the plan does not know: it says so where it plans
    if chips > 1 and "mesh" in flags.FLAGS and not flags.FLAGS.mesh:
        _fail(f"experiments.{job} has no --mesh, so it would run on one of {tpu_type}'s {chips} chips; give it "
              f"--mesh=data:D,model:M over all {chips} (python -m experiments.plan --topology={tpu_type} --job=… "
              "without --mesh picks one).")


def _refuse_processes(values: flags.FlagValues, tpu: bool) -> None:
    """The multi-process flags as the job checks them when it starts (rmjax.parallel.processes.check_processes),
    where the coordinator is known here: given on the line, or on a TPU VM $RMJAX_COORDINATOR=auto, which
    launch/tpu_vm.sh sets (a GPU host's environment is not known here; what it leaves unset is not refused)."""
    from rmjax.parallel.processes import check_processes

    if "coordinator" not in values:
        return
    coordinator = values.coordinator or ("auto" if tpu else None)
    if coordinator:
        check_processes(coordinator, values.num_processes, values.process_id)


def main(argv: list[str]) -> None:
    if len(argv) not in (2, 3):
        _fail("give the job's command line as one argument (and a TPU type)")
    try:
        words = job_words(argv[1])
    except ValueError:
        _fail(f"{argv[1]}: its quotes do not pair up")
    if not words:
        _fail("it is empty (give experiments.NAME and its flags)")
    job = _job_name(words[0], Path(__file__).parent)
    module = importlib.import_module(f"experiments.{job}")  # defines the job's flags, as on the remote host
    from experiments import config_flags
    from experiments.cli import flag_error
    from rmjax.errors import RmjaxError, one_line

    for name in HELP:  # app.run defines these; as plain switches here (absl's would print the help and exit)
        if name not in flags.FLAGS:
            flags.DEFINE_bool(name, False, "absl's", short_name="?" if name == "help" else None)
    error = flag_error(words)
    if error:
        _fail(f"experiments.{job} would refuse it: {error} "
              f"(python -m experiments.{job} --help lists its flags)")
    shown = [name for name in HELP if flags.FLAGS[name].value]
    if shown:
        _fail(f"experiments.{job} --{shown[0]} would print its help or only check its flags, and run nothing; "
              f"run python -m experiments.{job} --{shown[0]} here")
    if LAUNCH_CHECKPOINT in os.environ:  # the launch's --checkpoint ("" without one); first, as the next
        _refuse_absent_checkpoint(flags.FLAGS, os.environ[LAUNCH_CHECKPOINT])
    if len(argv) == 3:  # first: a config's check that a file exists reads this machine's disk, not the VM's
        _refuse_unshipped(flags.FLAGS, Path(__file__).resolve().parent.parent)
    try:
        for build in config_flags.builders(module):  # the job's settings, checked as the job checks them
            build()
        module.check_flags()  # and what else the job refuses from its flags alone
        if job != "plan":  # the plan starts no processes: it never reads these flags
            _refuse_processes(flags.FLAGS, len(argv) == 3)  # and as the job starts, before any device is touched
    except RmjaxError as refused:
        _fail(f"experiments.{job} would refuse it: {one_line(refused)}")
    _refuse_uncollected(job, flags.FLAGS)
    if len(argv) == 3:
        _refuse_one_chip(job, argv[2])
    sys.stdout.write("\0".join([job, *(plan_flags(job, flags.FLAGS) if job in SIZES else [])]))


if __name__ == "__main__":
    main(sys.argv)
