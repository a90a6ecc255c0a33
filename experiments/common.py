"""Flags shared by the model-running entry points, and how a job starts (`start`) and gets them (`options`).

An entry point parses and checks its flags, builds its job's spec with `options(out)` and makes one call
(`rmjax.search.sweep.run_sweep`, …), which claims the output once and loads the model only after every check
that can run before the weights; entry points end through `run` (experiments.cli).
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from absl import flags
from absl import logging as absl_logging

from experiments.cli import run  # noqa: F401  (entry points call common.run)
from rmjax.errors import UsageError
from rmjax.loading.registry import BUILTIN_GGUF, BUILTIN_RMS

if TYPE_CHECKING:
    from rmjax.runs.options import RunOptions

DEFAULT_RM = "elo-rm-smollm2-135m"
DEFAULT_LM = "smollm2-135m-instruct"
MODEL = flags.DEFINE_string(
    "model", DEFAULT_RM,
    "Model spec: a checkpoint folder, a .gguf file, or a builtin name. Builtin reward models: "
    f"{', '.join(BUILTIN_RMS)}; builtin causal LMs (for logprobs and train_rm): {', '.join(BUILTIN_GGUF)}.")
DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Parameter dtype.")
MESH = flags.DEFINE_string("mesh", "", "Device mesh, e.g. data:8,model:1 (default: no mesh, one device).")
PROMPTS = flags.DEFINE_list("prompts", ["greatest"],
                            "Builtin prompt names (greatest, best, worst, any of the 54-prompt set), "
                            "sets (paper1, prompts54) or YAML files of name: text.")
PROMPT = flags.DEFINE_multi_string("prompt", [], "Extra prompt as name=text (repeatable).")
TEMPLATE = flags.DEFINE_enum("template", "auto", ["auto", "chat", "plain"],
                             "chat: the tokenizer's chat template; plain: 'User: {p}\\nAssistant:' "
                             "(base models); auto: chat when the tokenizer has one.")
SYSTEM_PROMPT = flags.DEFINE_string("system_prompt", None,
                                    "The system message of every conversation (chat templates only). Unset: the "
                                    "template's own behaviour (SmolLM2's injects 'You are a helpful AI assistant "
                                    "named SmolLM, trained by Hugging Face'); --system_prompt='' gives an empty "
                                    "system turn. Recorded in .meta.json and part of the result's identity "
                                    "(train_rm refuses it: it trains on the template's own system turn).")
COORDINATOR = flags.DEFINE_string("coordinator", None,
                                  "Multi-host: coordinator host:port of jax.distributed (or $RMJAX_COORDINATOR).")
NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Multi-host: number of processes.", lower_bound=1)
OUTPUT_COLUMN = flags.DEFINE_integer(
    "output_column", 0, "Which reward-head output to use: 0 the preference score; with a multi-objective head "
    "(ArmoRM, QRM, URM) 1.. the objectives (URM: 1 is μ_helpfulness, what loading it without remote code "
    "reports). A linear head of several outputs (a classifier) has no default: name its reward's column. Jobs "
    "of a causal LM or the whole model (logprobs, train_rm, export) refuse it.",
    lower_bound=0)
PROCESS_ID = flags.DEFINE_integer("process_id", None, "Multi-host: this process's index (0 writes the results).",
                                  lower_bound=0)
OVERWRITE = flags.DEFINE_bool("overwrite", False,
                              "Replace an existing result at the output path. Without it a result of another run is "
                              "refused, and a finished result of the same inputs is reused.")
ALLOW_NONFINITE = flags.DEFINE_bool("allow_nonfinite", False,
                                    "Write NaN/Inf scores instead of stopping (they are counted in .meta.json); "
                                    "the audit refuses it (its statistics need every reward finite).")
COMPILE_CACHE = flags.DEFINE_bool("compile_cache", True,
                                  "Keep compiled XLA programs in the model cache's xla/ folder (.cache/rmjax/xla, or "
                                  "$RMJAX_CACHE_DIR/xla): a later job with the same shapes skips their compilation.")


# Entry points that run a language model rather than a reward head (logprobs, train_rm) declare these as
# their key flags instead of adopting the whole module, so their --help does not offer --output_column.
LM_FLAGS = ("model", "dtype", "mesh", "prompts", "prompt", "template", "coordinator", "num_processes", "process_id",
            "overwrite", "allow_nonfinite", "compile_cache")


class _TextListParser(flags.ListParser):
    """absl's list parser strips each item, so `--texts=" love"` scored 'love': a response is kept as typed
    (csv quoting still puts a comma inside one). A line break is part of its response, quoted or not (the csv
    module refused one unquoted, asking about "universal-newline mode")."""

    def parse(self, argument):
        if isinstance(argument, list) or not argument:
            return list(argument or [])
        free = (chr(c) for c in range(0xE000, 0xF900) if chr(c) not in argument)  # private-use stand-ins
        stand_in = {brk: next(free) for brk in "\r\n" if brk in argument}
        marked = argument
        for brk, mark in stand_in.items():
            marked = marked.replace(brk, mark)
        try:
            texts = next(csv.reader([marked], strict=True))
            for brk, mark in stand_in.items():
                texts = [t.replace(mark, brk) for t in texts]
            return texts
        except csv.Error as e:
            raise ValueError(f"Unable to parse the value {argument!r} as a comma-separated list: {e}") from e


def define_texts(name: str, default: list[str] | None, help_text: str) -> flags.FlagHolder:
    """A comma-separated list of response texts, each kept exactly (spaces at its ends are part of the response)."""
    return flags.DEFINE(_TextListParser(), name, default, help_text, serializer=flags.CsvListSerializer(","))


def note_edge_spaces(flag: str, texts: list[str]) -> None:
    """A response with a space at an end is kept so (a template may read it: ChatML does, Llama 3's and Gemma's
    trim it): said once, so that `--texts=a, b` is not read as 'b' without a word."""
    edged = [t for t in texts if t != t.strip()]
    if edged:
        shown = ", ".join(repr(t) for t in edged[:3]) + (" …" if len(edged) > 3 else "")
        print(f"{flag}: {len(edged)} response{'s' * (len(edged) != 1)} with a space at an end, kept as typed "
              f"(a chat template that trims responses drops it): {shown}.", file=sys.stderr)


def resolved_prompts() -> dict[str, str]:
    """--prompts and --prompt as name -> text (a name rmjax does not have, or a bad YAML file, is refused)."""
    from rmjax.text import prompts as prompt_lib

    return prompt_lib.resolve_prompts(PROMPTS.value, PROMPT.value)


def checked_prompts() -> dict[str, str] | None:
    """`resolved_prompts` for a job's check_flags, or None where a --prompts YAML file is not on this machine: a
    launch reads the job's line here, and a GPU host may hold the file (main reads it there, first thing)."""
    if any(name.endswith((".yaml", ".yml")) and not Path(name).is_file() for name in PROMPTS.value or ()):
        return None
    return resolved_prompts()


def checked_result_prompts() -> dict[str, str] | None:
    """`checked_prompts`, each name checked as the jobs that write a table of one column per prompt check it (a name
    may not be a key column of the result: rmjax.text.prompts.check_prompt_names)."""
    from rmjax.runs.results import NON_VALUE_COLUMNS
    from rmjax.text.prompts import check_prompt_names

    prompts = checked_prompts()
    if prompts is not None:
        check_prompt_names(prompts, NON_VALUE_COLUMNS)
    return prompts


def check_out(out: str | None, file: bool = False) -> None:
    """--out as the job refuses it from the flags alone: empty (`options`), or, for a `file` output, ending in a
    separator as a folder does (the claim's rmjax.runs.paths.refuse_folder_name); where a launch reads its line too."""
    from rmjax.runs.paths import refuse_empty_out, refuse_folder_name

    refuse_empty_out(out)
    if file and out:
        refuse_folder_name(out)


def mesh_data_size() -> int | None:
    """The data axis --mesh gives (1 without --mesh; None for data:-1, the devices the job will find)."""
    from rmjax.parallel.mesh_spec import parse_mesh_spec

    size = parse_mesh_spec(MESH.value)["data"] if MESH.value else 1
    return None if size == -1 else size


def refuse_empty_responses(flag: str, texts: list[str], instead: str = "") -> None:
    """A blank item of a response list is a stray comma, not a response to score or inspect."""
    blank = next((t for t in texts if not t.strip()), None)
    if blank is not None:  # spaces alone are no response either, and are not two commas in a row
        what = (f"a response of only whitespace ({blank!r})" if blank else
                "an empty response (two commas in a row, or one at an end)")
        raise UsageError(f"{flag}={','.join(texts)} has {what}; remove it{instead}.")


def refuse_output_column(job: str) -> None:
    """An LM job has no reward outputs: a given --output_column is a mistake, not something to ignore."""
    if OUTPUT_COLUMN.value:
        raise UsageError(f"--output_column={OUTPUT_COLUMN.value}: {job} has no reward head outputs to choose "
                         "from; leave --output_column out.")


def refuse_given(job: str, names: tuple[str, ...], why: str) -> None:
    """Flags a job takes with the shared ones but never reads: given on the command line, refused, not ignored
    (nor recorded as if they had been used)."""
    given = [n for n in names if flags.FLAGS[n].present]
    if given:
        raise UsageError(f"--{given[0]}: {job} {why}; leave {', '.join('--' + n for n in given)} out.")


def refuse_blank_models(*names: str) -> None:
    """A second model flag (--lm, --judge) given as spaces, or as several models, is refused as the model lookup
    refuses --model, by its own name (the lookup named --model; `--lm=` leaves it unset)."""
    from rmjax.loading.registry import check_one_spec

    for name in names:
        value = flags.FLAGS[name].value
        if isinstance(value, str) and value:
            check_one_spec(value, f"--{name}")


def refuse_system_prompt(job: str, why: str) -> None:
    """A job that renders no scored conversation of its own: a given --system_prompt is refused, not ignored."""
    if SYSTEM_PROMPT.value is not None:
        raise UsageError(f"--system_prompt: {job} {why}; leave --system_prompt out.")


def _mesh_spec_is_valid(spec: str) -> bool:
    from rmjax.parallel.mesh_spec import parse_mesh_spec

    if not spec:
        return True
    try:
        parse_mesh_spec(spec)
    except ValueError as error:
        raise flags.ValidationError(str(error)) from None
    return True


flags.register_validator("mesh", _mesh_spec_is_valid)


def quiet_logs() -> None:
    """Warnings and errors only (JAX's backend probing and orbax are chatty at INFO)."""
    absl_logging.set_verbosity(absl_logging.WARNING)


_mesh: list = []


def start():
    """Once per job, before anything touches a device: logs, multi-host initialization, the mesh
    (checked against the devices there are), the compilation cache. Returns the mesh (None without --mesh)."""
    if not _mesh:
        from rmjax.parallel import distributed, sharding

        quiet_logs()
        several = distributed.initialize(COORDINATOR.value, NUM_PROCESSES.value, PROCESS_ID.value)
        if several and not MESH.value:  # each process would load the model and compute the whole job alone, unsaid
            import jax

            if jax.process_count() > 1:
                raise UsageError(f"{jax.process_count()} processes and no --mesh: each would compute the whole job "
                                 f"alone; give --mesh=data:D,model:M over all {jax.device_count()} devices.")
        try:
            _mesh.append(sharding.make_mesh(MESH.value) if MESH.value else None)
        except ValueError as error:
            raise UsageError(f"--mesh={MESH.value}: {error}") from None
        if COMPILE_CACHE.value:
            from rmjax.compiled import keep_compilations
            from rmjax.loading.registry import cache_dir

            keep_compilations(cache_dir() / "xla")
    return _mesh[0]


def options(out: str, **files: str | None) -> RunOptions:
    """The shared flags as the library's RunOptions for a job writing `out` (after `start`: the mesh is one).
    The files the command line names (a model file, --prompts YAML files, and `files`: flag name -> path, such as
    texts_file) go with it as inputs that no output may be. An empty --out is refused: it named the working folder
    (`audit --out=` began writing its files there)."""
    from rmjax.runs.options import RunOptions
    from rmjax.runs.paths import refuse_empty_out

    refuse_empty_out(out)

    named = [("--model", m) for m in (MODEL.value or "").split(",")]
    named += [("--prompts", p) for p in PROMPTS.value or ()] + [(f"--{k}", v) for k, v in files.items() if v]
    inputs = tuple((flag, path) for flag, path in named  # a model's folder too (a prompt name is not a path)
                   if path and (Path(path).is_file() or flag == "--model" and Path(path).is_dir()))
    return RunOptions(model=MODEL.value, out=out, dtype=DTYPE.value, mesh=start(), template=TEMPLATE.value,
                      output_column=OUTPUT_COLUMN.value, output_column_given=OUTPUT_COLUMN.present,
                      overwrite=OVERWRITE.value,
                      allow_nonfinite=ALLOW_NONFINITE.value, inputs=inputs, system_prompt=SYSTEM_PROMPT.value)


if __name__ == "__main__":
    from experiments import not_a_job

    not_a_job(__spec__.name)
