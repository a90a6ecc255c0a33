"""Flags shared by the entry points and the one way they load a model."""

from __future__ import annotations

from absl import flags
from absl import logging as absl_logging

from rmjax import distributed, sharding
from rmjax.loading import Model, load

MODEL = flags.DEFINE_string("model", "smollm2-135m-instruct",
                            "Model spec: a checkpoint folder, a .gguf file, or a builtin name "
                            "(smollm2-135m-instruct, gemma-3-270m).")
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
NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Multi-host: number of processes.")
PROCESS_ID = flags.DEFINE_integer("process_id", None, "Multi-host: this process's index (0 writes the results).")


def quiet_logs() -> None:
    """Warnings and errors only (JAX's backend probing and orbax are chatty at INFO)."""
    absl_logging.set_verbosity(absl_logging.WARNING)


def load_model() -> Model:
    quiet_logs()
    distributed.initialize(COORDINATOR.value, NUM_PROCESSES.value, PROCESS_ID.value)
    mesh = sharding.make_mesh(MESH.value) if MESH.value else None
    return load(MODEL.value, dtype=DTYPE.value, mesh=mesh)
