"""Flags shared by the entry points and the one way they load a model."""

from __future__ import annotations

import sys
from collections.abc import Callable

import jax
from absl import flags
from absl import logging as absl_logging

from rmjax import distributed, sharding
from rmjax.config import ModelConfig
from rmjax.loading import Model, load, peek

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
OUTPUT_COLUMN = flags.DEFINE_integer(
    "output_column", 0, "Which reward-head output to use: 0 the preference score; with several labels or a "
    "multi-objective head (ArmoRM, QRM, URM) 1.. the objectives (URM: 1 is μ_helpfulness, what loading it "
    "without remote code reports).")
PROCESS_ID = flags.DEFINE_integer("process_id", None, "Multi-host: this process's index (0 writes the results).")


def quiet_logs() -> None:
    """Warnings and errors only (JAX's backend probing and orbax are chatty at INFO)."""
    absl_logging.set_verbosity(absl_logging.WARNING)


def with_output_column(cfg: ModelConfig, column: int, source: str) -> ModelConfig:
    if not 0 <= column < cfg.num_outputs:
        raise ValueError(f"--output_column={column}: {source} has {cfg.num_outputs} reward outputs "
                         f"(0..{cfg.num_outputs - 1}).")
    return cfg.replace(reward_index=column)


_started: list[bool] = []


def load_model(spec: str | None = None, before_weights: Callable | None = None) -> Model:
    """Load `spec` (default --model) on --mesh; `before_weights(config, tokenizer, mesh)` runs first when
    the config can be read without the weights (checkpoint folders), else right after loading."""
    quiet_logs()
    if not _started:  # once per job, however many models it loads
        distributed.initialize(COORDINATOR.value, NUM_PROCESSES.value, PROCESS_ID.value)
        _started.append(True)
    spec = spec or MODEL.value
    mesh = sharding.make_mesh(MESH.value) if MESH.value else None
    peeked = peek(spec) if before_weights is not None else None
    if peeked is not None and peeked[1] is not None:
        before_weights(*peeked, mesh)
    model = load(spec, dtype=DTYPE.value, mesh=mesh)
    if before_weights is not None and (peeked is None or peeked[1] is None):
        before_weights(model.config, model.tokenizer, mesh)
    if OUTPUT_COLUMN.value:
        model.config = with_output_column(model.config, OUTPUT_COLUMN.value, model.source)
    if model.weight_bytes:
        print(f"process {jax.process_index()}: loaded {model.source} in {model.load_seconds:.1f} s, read "
              f"{model.weight_bytes_read / 2**20:.1f} of {model.weight_bytes / 2**20:.1f} MiB of weights "
              "(its devices' shards)", file=sys.stderr)
    return model
