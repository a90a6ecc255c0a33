"""Flags shared by the model-running entry points and the one way they load a model.

Outputs are claimed (`claim_output`: writable, locked, not another run's) and every flag checked
before the model loads; entry points end through `run` (experiments.cli).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

from absl import flags
from absl import logging as absl_logging

from experiments.cli import run  # noqa: F401  (entry points call common.run)
from rmjax.config import ModelConfig
from rmjax.errors import UsageError
from rmjax.loading.registry import BUILTIN_GGUF, BUILTIN_RMS

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
COORDINATOR = flags.DEFINE_string("coordinator", None,
                                  "Multi-host: coordinator host:port of jax.distributed (or $RMJAX_COORDINATOR).")
NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Multi-host: number of processes.", lower_bound=1)
OUTPUT_COLUMN = flags.DEFINE_integer(
    "output_column", 0, "Which reward-head output to use: 0 the preference score; with several labels or a "
    "multi-objective head (ArmoRM, QRM, URM) 1.. the objectives (URM: 1 is μ_helpfulness, what loading it "
    "without remote code reports).", lower_bound=0)
PROCESS_ID = flags.DEFINE_integer("process_id", None, "Multi-host: this process's index (0 writes the results).",
                                  lower_bound=0)
OVERWRITE = flags.DEFINE_bool("overwrite", False,
                              "Replace an existing result at the output path. Without it a result of another run is "
                              "refused, and a finished result of the same inputs is reused.")
ALLOW_NONFINITE = flags.DEFINE_bool("allow_nonfinite", False,
                                    "Write NaN/Inf scores instead of stopping (they are counted in .meta.json).")


# Entry points that run a language model rather than a reward head (logprobs, train_rm) declare these as
# their key flags instead of adopting the whole module, so their --help does not offer --output_column.
LM_FLAGS = ("model", "dtype", "mesh", "prompts", "prompt", "template", "coordinator", "num_processes", "process_id",
            "overwrite", "allow_nonfinite")


def refuse_output_column(job: str) -> None:
    """An LM job has no reward outputs: a given --output_column is a mistake, not something to ignore."""
    if OUTPUT_COLUMN.value:
        raise UsageError(f"--output_column={OUTPUT_COLUMN.value}: {job} has no reward head outputs to choose "
                         "from; leave --output_column out.")


def _mesh_spec_is_valid(spec: str) -> bool:
    from rmjax.parallel.sharding import parse_mesh_spec

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
    (checked against the devices there are). Returns the mesh (None without --mesh)."""
    if not _mesh:
        from rmjax.parallel import distributed, sharding

        quiet_logs()
        distributed.initialize(COORDINATOR.value, NUM_PROCESSES.value, PROCESS_ID.value)
        try:
            _mesh.append(sharding.make_mesh(MESH.value) if MESH.value else None)
        except ValueError as error:
            raise UsageError(f"--mesh={MESH.value}: {error}") from None
    return _mesh[0]


def fingerprint(spec: str | None = None) -> dict:
    """The content fingerprint of --model (or `spec`) without loading it."""
    from rmjax.loading import fingerprint as of_spec

    start()
    return of_spec(spec or MODEL.value)


@contextlib.contextmanager
def claim_output(out: str, identity: dict, **kwargs) -> Iterator:
    """rmjax.runs.claims.claim for --out with --overwrite; says so when a finished result is reused."""
    from rmjax.runs.claims import claim

    start()
    with claim(out, identity, overwrite=OVERWRITE.value, **kwargs) as decision:
        if decision.reuse:
            print(f"{out} is already complete for these inputs (same model content, prompts and settings): "
                  "reusing it; pass --overwrite to recompute.", file=sys.stderr)
        yield decision


def check_output_column(cfg: ModelConfig, column: int, source: str) -> int:
    """`column` when the model has that reward output, else a UsageError naming the range."""
    if not 0 <= column < cfg.num_outputs:
        raise UsageError(f"--output_column={column}: {source} has {cfg.num_outputs} reward outputs "
                         f"(0..{cfg.num_outputs - 1}).")
    return column


def check_template(tokenizer) -> None:
    """The chat template as --template uses it: one that jinja cannot compile, or a missing one with
    --template=chat, is a one-line error (before the weights load where the tokenizer comes without them)."""
    from rmjax.text.chat import check_template as check

    if TEMPLATE.value != "plain":
        check(tokenizer, TEMPLATE.value)


def check_model_template(spec: str | None = None) -> None:
    """`check_template` for a checkpoint folder's tokenizer, before any weight is read (no-op for GGUF and
    builtin models, whose tokenizer comes with the weights)."""
    from rmjax.loading import peek

    start()
    peeked = peek(spec or MODEL.value) if TEMPLATE.value != "plain" else None
    if peeked is not None and peeked[1] is not None:
        check_template(peeked[1])


def load_model(spec: str | None = None, before_weights: Callable | None = None):
    """Load `spec` (default --model) on --mesh; `before_weights(config, tokenizer, mesh)` runs first when
    the config can be read without the weights (checkpoint folders), else right after loading. The chat
    template is checked at the same point (`check_template`)."""
    import jax

    from rmjax.loading import load, peek

    mesh = start()
    spec = spec or MODEL.value
    peeked = peek(spec) if before_weights is not None or TEMPLATE.value != "plain" else None
    early = peeked is not None and peeked[1] is not None  # a checkpoint folder: checked before its weights
    if early:
        check_template(peeked[1])
        if before_weights is not None:
            before_weights(*peeked, mesh)
    model = load(spec, dtype=DTYPE.value, mesh=mesh)
    if not early:
        check_template(model.tokenizer)
        if before_weights is not None:
            before_weights(model.config, model.tokenizer, mesh)
    if OUTPUT_COLUMN.value:
        model.output_column = check_output_column(model.config, OUTPUT_COLUMN.value, model.source)
    if model.weight_bytes:
        print(f"process {jax.process_index()}: loaded {model.source} in {model.load_seconds:.1f} s, read "
              f"{model.weight_bytes_read / 2**20:.1f} of {model.weight_bytes / 2**20:.1f} MiB of weights "
              "(its devices' shards)", file=sys.stderr)
    return model
