"""Read a launch's --job with the job's own flags, here, before a machine is paid for.

python -m experiments.job_line "experiments.sweep --prompts=paper1 --mesh data:1,model:8 --out=results/s.csv"

launch/tpu_vm.sh once turned the job's words into the plan's flags in shell, and got quoting, `--flag value`,
negative numbers and absl's boolean spellings wrong in turn; a flag the job does not have failed only on the VM.
Here absl reads the words as the job on the VM will (the job's module defines its flags), so what the job would
refuse stops the launch here. Prints, NUL-separated, the job's name and then, for a job experiments.plan plans,
the plan's flags for this run: the job-specific sizes with the job's own values (its defaults too, so the plan
sizes the run the job will make) and the shared flags given. A refused line: one `error: --job: …` line, exit 2.
"""

from __future__ import annotations

import importlib
import shlex
import sys
from pathlib import Path

from absl import flags

SHARED = ("prompts", "prompt", "dtype", "mesh", "template")  # the plan's and the job's (experiments.common)
# Each planned job's flags that size its run: the job's flag -> the plan's. Derived sizes are in `_derived`.
SIZES: dict[str, dict[str, str]] = {
    "sweep": {"limit": "limit", "batch_size": "batch_size"},
    "beam": {name: name for name in ("limit", "batch_size", "depth", "beam", "direction", "exhaustive")},
    "gcg": {"num_tokens": "num_tokens", "search_width": "search_width", "steps": "steps",
            "eval_batch_size": "batch_size"},
    "score": {"batch_size": "batch_size"},
    "logprobs": {},
    "inspect": {"steps": "ig_steps", "batch_size": "batch_size"},
    "train_rm": {name: name for name in ("trainable", "last_k", "steps", "batch_size", "n_train", "fsdp", "remat")},
}


def _fail(message: str) -> None:
    print(f"error: --job: {message}", file=sys.stderr)
    sys.exit(2)


def _job_name(first: str, experiments: Path) -> str:
    """A typo would have failed on the VM, after paying for it: experiments.NAME, an entry point with a main."""
    name = first.removeprefix("experiments.")
    source = experiments / f"{name}.py"
    if not (first.startswith("experiments.") and name.isidentifier() and source.is_file()
            and "__main__" in source.read_text()):
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
    """Sizes the plan takes as counts, where the job's flags give them."""
    if job == "score" and values["texts"].present:
        return [f"--texts={len(values.texts)}"]
    if job == "inspect" and values.responses:
        return [f"--items={len(values.responses)}"]
    if job == "inspect" and (values.from_sweep or values.from_beam):
        return [f"--items={2 * values.top}"]  # its --top best and --top worst
    return []


def plan_flags(job: str, values: flags.FlagValues) -> list[str]:
    """The plan's flags for a job whose command line `values` has parsed."""
    out = [f"--job={job}"]
    for name in SHARED:
        if values[name].present:
            out += _as_flag(name, values[name].value)
    for name, plan_name in SIZES[job].items():
        if values[name].value is not None:
            out += _as_flag(plan_name, values[name].value)
    return out + _derived(job, values)


def main(argv: list[str]) -> None:
    if len(argv) != 2:
        _fail("give the job's command line as one argument")
    try:
        words = shlex.split(argv[1])
    except ValueError:
        _fail(f"{argv[1]}: its quotes do not pair up")
    if not words:
        _fail("it is empty (give experiments.NAME and its flags)")
    job = _job_name(words[0], Path(__file__).parent)
    importlib.import_module(f"experiments.{job}")  # defines the job's flags, as on the VM
    from experiments.cli import flag_error

    error = flag_error([words[0], *words[1:]])
    if error:
        _fail(f"experiments.{job} would stop on the VM: {error}")
    planned = plan_flags(job, flags.FLAGS) if job in SIZES else []
    sys.stdout.write("\0".join([job, *planned]))


if __name__ == "__main__":
    main(sys.argv)
