"""What a training run is: its settings, the checks on them before any weight loads, and the identity its
checkpoints depend on. Light (no orbax, no model): the plan reads it too."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from rmjax import checks
from rmjax.checks import setting
from rmjax.errors import UsageError
from rmjax.parallel import batching
from rmjax.train.data import Pairs


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    trainable: str = setting("head", "head: frozen backbone (features computed once); last_k: last K layers + "
                             "head; full: all but the embeddings.", ("head", "last_k", "full"))
    last_k: int = setting(2, "Layers trained with --trainable=last_k.")
    steps: int = setting(300, "Optimizer steps.")
    batch_size: int = setting(64, "Pairs per step.")
    learning_rate: float = setting(1e-3, "Peak learning rate (AdamW, warmup + cosine).")
    warmup_steps: int = setting(20, "Linear warmup steps.")
    weight_decay: float = setting(0.0, "AdamW weight decay.")
    clip_norm: float = setting(1.0, "Global gradient-norm clip.")
    checkpoint_every: int = setting(50, "Checkpoint (and held-out evaluation) interval.")
    keep_checkpoints: int | None = setting(None, "Keep only the last K checkpoints (default: all, for analysis "
                                           "along training).")
    seed: int = setting(0, "Seed of the head init, data split and batch order.")
    template: str = setting("auto", "Chat template use.", ("auto", "chat", "plain"))
    feature_batch_size: int = setting(256, "Responses per batch when computing frozen-backbone features.")
    fsdp: bool = setting(False, "Shard the trained weights and Adam's moments over the mesh's data axis too (FSDP): "
                         "each chip keeps 1/data of them, and XLA gathers a layer's weights where they are used.")
    remat: bool = setting(False, "Recompute each decoder layer's activations in the backward pass instead of keeping "
                          "them (less memory for about a third more compute).")

    def __post_init__(self):
        checks.validate(self, {
            "trainable": checks.one_of("head", "last_k", "full"), "last_k": checks.POSITIVE,
            "steps": checks.POSITIVE, "batch_size": checks.POSITIVE, "learning_rate": checks.GREATER_THAN_ZERO,
            "warmup_steps": checks.NON_NEGATIVE, "weight_decay": checks.NON_NEGATIVE,
            "clip_norm": checks.GREATER_THAN_ZERO, "checkpoint_every": checks.POSITIVE,
            "keep_checkpoints": checks.POSITIVE, "feature_batch_size": checks.POSITIVE,
            "template": checks.one_of("auto", "chat", "plain"),
        })


# experiments.train_rm's defaults for TrainConfig (real runs), which differ from the dataclass's (tests' small runs).
COMMAND_LINE_DEFAULTS = dict(steps=1500, batch_size=256, learning_rate=1e-2, warmup_steps=100, checkpoint_every=250)


# Settings that do not change the trained parameters: a run may resume with other values.
NOT_IN_IDENTITY = ("checkpoint_every", "keep_checkpoints", "feature_batch_size")


def train_identity(model_fingerprint: dict, dtype: str, train: Pairs, heldout: Pairs, cfg: TrainConfig) -> dict:
    """What a training run's checkpoints depend on (rmjax.runs.claims): base model, data, every setting."""
    config = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in NOT_IN_IDENTITY}
    if cfg.trainable != "last_k":
        del config["last_k"]  # unused
    for off in ("fsdp", "remat"):  # off, a run's identity is what it was before these settings existed
        if not config[off]:
            del config[off]
    master = {"master": "float32"} if needs_master(cfg, dtype) else {}  # its checkpoints hold the master copy
    if cfg.warmup_steps == 0:  # a run from before this rule warmed up one step at rate 0: not this run
        master["warmup"] = "none: the peak rate from step 1"
    return {"job": "train_rm", "model": model_fingerprint, "dtype": dtype, "train": train.digest(),
            "heldout": heldout.digest(), "config": config, "checkpoint_format": CHECKPOINT_FORMAT, **master}


def needs_master(cfg: TrainConfig, dtype: str) -> bool:
    """Trained layers held in a narrower dtype than float32 (the score head is float32 in every dtype)."""
    return cfg.trainable != "head" and dtype != "float32"


# 2: trainable nnx state + optimizer nnx state (issue 13); 1 (unmarked): {params, opt_state} of every weight.
# A workdir of another format is refused (naming `checkpoint_format`), never restored into the wrong tree.
CHECKPOINT_FORMAT = 2


def check_batch_on_mesh(cfg: TrainConfig, mesh: jax.sharding.Mesh | None) -> None:
    """Each step's pairs are split evenly over `data`: refuse a batch size it does not divide (before loading)."""
    check_batch_on_data(cfg, batching.data_shards(mesh))


def check_batch_on_data(cfg: TrainConfig, data: int | None) -> None:
    """`check_batch_on_mesh` for a data axis of size `data` (None: not known from the flags, --mesh=data:-1): also
    from the flags alone, where a launch reads the job's line."""
    if data is not None and cfg.batch_size % data:
        raise UsageError(f"--batch_size={cfg.batch_size}: each step's pairs are split over the mesh's data axis of "
                         f"size {data}; use a multiple of {data} (e.g. {batching.bucket(cfg.batch_size, data)}).")


def check_sharding_settings(cfg: TrainConfig, mesh: jax.sharding.Mesh | None) -> None:
    """--fsdp and --remat that would change nothing are refused, not recorded in the run's identity as used: both
    act on trained layers (head-only training has none), and FSDP splits over a data axis (none without --mesh)."""
    check_sharding_on_data(cfg, batching.data_shards(mesh))


def check_sharding_on_data(cfg: TrainConfig, data: int | None) -> None:
    """`check_sharding_settings` for a data axis of size `data` (None: not known from the flags, --mesh=data:-1):
    also from the flags alone, where a launch reads the job's line."""
    if cfg.trainable == "head" and (cfg.fsdp or cfg.remat):
        raise UsageError("--fsdp and --remat act on trained layers, and --trainable=head trains none (its features "
                         "are computed once); leave them out.")
    if cfg.fsdp and data == 1:
        raise UsageError("--fsdp splits the trained weights over the mesh's data axis, and this run has none of size "
                         "> 1; give --mesh=data:N,... or leave --fsdp out.")


def check_batch_size(batch_size: int, pairs: int) -> None:
    """A step takes `batch_size` of the `pairs` training pairs: more would take some pair twice in every step (and,
    huge, exhaust the host building the step's indices). Refused before loading by the job and by its plan. (A step
    that straddles two epochs may still hold a pair twice, once from each: `batch_indices`.)"""
    if batch_size > pairs:
        raise UsageError(f"--batch_size={batch_size} is more than the {pairs} training pairs (a step would take some "
                         f"pair more than once); use --batch_size={pairs} or less.")


def check_heldout(heldout: Pairs) -> None:
    """Held-out accuracy counts the pairs whose label prefers one side (a label of 0.5 is a tie: neither order is
    right): a held-out set of ties only has no accuracy. Refused before loading (run_training)."""
    if len(heldout) and not np.any(np.asarray(heldout.label) != 0.5):
        raise UsageError(f"all {len(heldout)} held-out pairs have label 0.5 (a tie), so held-out accuracy is "
                         "undefined; give held-out pairs that prefer one response (label other than 0.5).")


def check_last_k(cfg: TrainConfig, config, source: str) -> None:
    """--last_k past the model's layers, refused (from its config, before the weights load: run_training)."""
    if cfg.trainable == "last_k" and cfg.last_k > config.num_layers:
        raise UsageError(f"--last_k={cfg.last_k}: {source} has {config.num_layers} layers; give at most that.")


def frozen_layers(cfg: TrainConfig, num_layers: int) -> int:
    """The decoder layers below the trained ones (a SplitStack's lower part): `last_k`'s others; none when every
    layer trains (`full`, `last_k` of them all) or none does (`head`, whose features are computed once)."""
    return num_layers - cfg.last_k if cfg.trainable == "last_k" and cfg.last_k < num_layers else 0
