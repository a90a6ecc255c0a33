"""Bradley–Terry training with optax, orbax checkpoints and exact resume.

Trainable part: `head` (the backbone is frozen, so its features are computed once with the
prefix cache and training is a logistic regression on them), `last_k` (the last K decoder
layers, the final norm and the head) or `full` (everything but the embeddings). The batch order
is a pure function of (seed, step), so a run resumed from a checkpoint replays exactly the
batches — and the loss curve — of an uninterrupted run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import signal
import threading
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx

from rmjax import nn
from rmjax.errors import NonFiniteError
from rmjax.loading.identity import model_fingerprint
from rmjax.model import Model
from rmjax.nn.layers import DecoderStack, SplitStack
from rmjax.parallel import batching, sharding
from rmjax.parallel.distributed import global_array, is_main
from rmjax.runs.identities import require_claimed
from rmjax.runs.progress import Progress
from rmjax.runs.results import dump_json
from rmjax.scoring import finite
from rmjax.scoring.texts import TextScorer
from rmjax.train import prefixed
from rmjax.train.data import Pairs
from rmjax.train.optimizer import make_optimizer
from rmjax.train.rm import bradley_terry_loss
from rmjax.train.settings import (
    TrainConfig,
    check_batch_on_mesh,
    check_batch_size,
    check_heldout,
    check_last_k,
    frozen_layers,
    train_identity,
)
from rmjax.train.step import Steps, feature_pair_rewards, pair_rewards_of, sequence_pair_rewards
from rmjax.train.workdir import RUN_FILE, claim_workdir, read_log, write_log


@dataclasses.dataclass
class TrainResult:
    model: Model | None  # None: a finished run reused without loading it (`reused`)
    history: list[dict]
    evals: list[dict]
    seconds: float
    steps_per_second: float
    resumed_from: int | None
    workdir: Path | None = None
    config: TrainConfig | None = None  # as trained (a resume keeps its saved --feature_batch_size)
    reused: dict | None = None  # the summary.json of the finished run found in the workdir (rmjax.train.recipe)
    export: Path | None = None  # the Hugging Face folder of the trained model (written now, or reused)


def batch_indices(n: int, batch_size: int, seed: int, step: int) -> np.ndarray:
    """Rows of step `step`: consecutive slices of per-epoch permutations (deterministic in seed, step). Each epoch
    takes every pair once; a step across an epoch's end takes its last pairs and the next epoch's first, which may
    repeat one of them (the recipe the default heads were trained with)."""
    out = []
    pos = step * batch_size
    while len(out) < batch_size:
        epoch, offset = divmod(pos, n)
        perm = np.random.default_rng([seed, epoch]).permutation(n)
        take = perm[offset : offset + batch_size - len(out)]
        out.extend(take.tolist())
        pos += len(take)
    return np.asarray(out)


class _Features:
    """Frozen-backbone features of every distinct (prompt, response), computed once."""

    def __init__(self, model: Model, pairs: list[Pairs], template: str, batch_size: int):
        by_prompt: dict[str, set[str]] = {}
        for p in pairs:
            for prompt, a, b in zip(p.prompt, p.chosen, p.rejected, strict=True):
                by_prompt.setdefault(prompt, set()).update((a, b))
        self.index, rows, self.texts = {}, [], []
        for prompt, texts in by_prompt.items():
            texts = sorted(texts)
            feats = TextScorer(model, prompt, template).features(texts, batch_size)
            for t, f in zip(texts, feats, strict=True):
                self.index[(prompt, t)] = len(rows)
                rows.append(f)
                self.texts.append((prompt, t))
        self.matrix = np.stack(rows).astype(np.float32)

    def pair_rows(self, p: Pairs) -> tuple[np.ndarray, np.ndarray]:
        c = np.asarray([self.index[(q, t)] for q, t in zip(p.prompt, p.chosen, strict=True)])
        r = np.asarray([self.index[(q, t)] for q, t in zip(p.prompt, p.rejected, strict=True)])
        return c, r


class _Sequences:
    """Token ids of every conversation, right-padded to one width (one compilation)."""

    def __init__(self, model: Model, pairs: Pairs, template: str):
        scorers = {q: TextScorer(model, q, template) for q in set(pairs.prompt)}
        chosen = [scorers[q].token_ids([t])[0] for q, t in zip(pairs.prompt, pairs.chosen, strict=True)]
        rejected = [scorers[q].token_ids([t])[0] for q, t in zip(pairs.prompt, pairs.rejected, strict=True)]
        width = max(len(s) for s in chosen + rejected)
        sides = [batching.pad_rows(seqs, width) for seqs in (chosen, rejected)]
        self.ids, self.mask = np.stack([ids for ids, _ in sides]), np.stack([mask for _, mask in sides])


def trainable_part(model: Model, cfg: TrainConfig) -> tuple[nn.Transformer, nnx.filterlib.Filter]:
    """A copy of the model as an nnx module, and the filter of what trains: `head` the score head;
    `last_k` the last K layers (a SplitStack's `upper`), the final norm and the head; `full` all but the
    embeddings. Everything else is frozen and gets no optimizer state."""
    module = model.module  # fresh variables on its arrays (which a consuming run donates)
    n = model.config.num_layers
    for _, part in nnx.iter_modules(module):
        if isinstance(part, DecoderStack):
            part.remat, part.fsdp = cfg.remat, cfg.fsdp
    if cfg.trainable == "head":
        return module, nnx.PathContains("score")
    if frozen_layers(cfg, n):
        module.layers = SplitStack.of(module.layers, frozen_layers(cfg, n))
        for part in (module.layers.lower, module.layers.upper):
            part.remat, part.fsdp = cfg.remat, cfg.fsdp
        return module, nnx.Any(nnx.PathContains("upper"), nnx.PathContains("final_norm"), nnx.PathContains("score"))
    return module, nnx.All(nnx.Param, nnx.Not(nnx.PathContains("embed")))


def trained_params(module: nn.Transformer, in_place: bool = False) -> nnx.State:
    """The module's state in the model's own layout (one decoder stack; `in_place`: a SplitStack joined into its
    lower stack's buffers, the loaded model's, which a consuming run gives up)."""
    if isinstance(module.layers, SplitStack):
        module.layers = module.layers.joined(in_place)
    return nnx.state(module)


def train_reward_model(
    model: Model, train: Pairs, heldout: Pairs, cfg: TrainConfig, workdir: str | Path, log=print,
    overwrite: bool = False, claimed: dict | None = None, consume: bool = False,
) -> TrainResult:
    """Train `model` (a reward model with a score head) on `train`; evaluate on `heldout`.

    `workdir` belongs to one run (model, data, settings: `train_identity`): the same call resumes it
    from its last checkpoint, another run's workdir is refused unless `overwrite` (which clears it).
    `claimed`: the identity under which the caller claimed `workdir` before the model loaded (run_training).
    `consume`: the steps train `model`'s own arrays, which it gives up (deleted: only the result holds weights), not
    a copy of them beside it (a full fine-tune held every layer twice).
    """
    check_last_k(cfg, model.config, model.source)
    check_batch_size(cfg.batch_size, len(train))
    check_heldout(heldout)
    check_batch_on_mesh(cfg, model.mesh)
    workdir = Path(workdir)
    identity = train_identity(model_fingerprint(model), model.dtype, train, heldout, cfg)
    if claimed is not None:
        require_claimed(claimed, identity, workdir)
        return _train(model, train, heldout, cfg, workdir, log, consume)
    with claim_workdir(workdir, identity, overwrite):
        return _train(model, train, heldout, cfg, workdir, log, consume)


HELD_BATCH = 64  # held-out pairs a call


def _objective(model: Model, train: Pairs, heldout: Pairs, cfg: TrainConfig, log):
    """(pair_rewards(module, data, idx) for the training step (rmjax.train.step), its training `data`,
    held_rewards(module) -> (chosen, rejected) rewards of the held-out pairs). A head-only run trains on cached final
    hidden states; the others on the responses after each prompt's prefix (rmjax.train.prefixed), where the
    conversations allow, `last_k`'s computed once below the trained layers; else on the token sequences."""
    start = time.perf_counter()
    on = functools.partial(pair_rewards_of, model.config, model.mesh)
    if cfg.trainable == "head":
        feats = _Features(model, [train, heldout], cfg.template, cfg.feature_batch_size)
        finite.check(feats.matrix, what="features (final hidden states)", allow=False,
                     columns=[f"hidden unit {j}" for j in range(feats.matrix.shape[1])],
                     row=lambda i: f"response {feats.texts[i][1]!r}")
        matrix = jnp.asarray(feats.matrix)
        log(f"features of {len(feats.matrix)} distinct responses in {time.perf_counter() - start:.1f} s")
        held = (matrix, *map(jnp.asarray, feats.pair_rows(heldout)))
        return (feature_pair_rewards, (matrix, *map(jnp.asarray, feats.pair_rows(train))),
                lambda m: on(m, feature_pair_rewards, held, np.arange(len(heldout))))
    n = model.config.num_layers
    frozen = frozen_layers(cfg, n)
    held_split = prefixed.prefixed_pairs(model, heldout, cfg.template, HELD_BATCH) if len(heldout) else None
    if held_split is not None:  # each evaluation runs the trained layers on each prefix once (and the frozen ones
        # where the responses' states do not fit): the whole conversations took 12 min a last_k run on the Elo pairs
        held_pairs = prefixed.prefixed_pair_rewards
        # as for one step over every held-out pair: their responses' states computed once wherever they fit
        held = prefixed.frozen_prefix_data(model, held_split, frozen, steps=1, batch_size=len(heldout))
        log(f"held-out pairs: {_prefixes(frozen, '' if held[-1] is None else ' and responses', ' once')}, in "
            f"{time.perf_counter() - start:.1f} s")
    else:
        held_seq, held_pairs = _Sequences(model, heldout, cfg.template), sequence_pair_rewards
        held = (jnp.asarray(held_seq.ids), jnp.asarray(held_seq.mask))

    def held_rewards(m: nn.Transformer):
        parts = [on(m, held_pairs, held, np.arange(i, min(i + HELD_BATCH, len(heldout))))
                 for i in range(0, len(heldout), HELD_BATCH)]
        return tuple(jnp.concatenate(side) for side in zip(*parts, strict=True))

    split = prefixed.prefixed_pairs(model, train, cfg.template, cfg.batch_size)
    if split is not None:  # the frozen layers see each prompt's template prefix once, the trained ones once a step,
        # not in every conversation
        data = prefixed.frozen_prefix_data(model, split, frozen, cfg.steps, cfg.batch_size)
        states = "" if data[-1] is None else f" and {len(data[-1][0])} distinct responses"
        log(f"{'' if frozen else 'training pairs: '}{_prefixes(frozen, states, '')} in "
            f"{time.perf_counter() - start:.1f} s; {split.prefixes.shape[1]} prefix and {split.responses.shape[2]} "
            "response tokens a row")
        return prefixed.prefixed_pair_rewards, data, held_rewards
    train_seq = _Sequences(model, train, cfg.template)
    return sequence_pair_rewards, (jnp.asarray(train_seq.ids), jnp.asarray(train_seq.mask)), held_rewards


def _prefixes(frozen: int, states: str, once: str) -> str:
    """How the pairs' prompt prefixes were computed, for the log."""
    if frozen:
        return f"prompt prefixes{states} through the {frozen} frozen layers{once}"
    return "split at their prompts' prefixes (every layer trains: a call runs each prefix once)"


def _evaluation(module: nn.Transformer, held_rewards, heldout: Pairs) -> dict:
    """Held-out accuracy (over the pairs whose label is not a tie) and Bradley–Terry loss; NaN/Inf rewards stop
    the run."""
    rc, rr = held_rewards(module)
    if not (np.isfinite(np.asarray(rc)).all() and np.isfinite(np.asarray(rr)).all()):
        raise NonFiniteError("held-out rewards are NaN/Inf; the run stops. Lower --learning_rate or --clip_norm, "
                             "or check the data and the model for NaN.")
    label = jnp.asarray(heldout.label)
    agree = jnp.where(label > 0.5, rc > rr, rc < rr)
    decisive = label != 0.5  # a tie (0.5) prefers neither order: not counted right or wrong (check_heldout)
    return {"heldout_accuracy": float(jnp.sum(agree & decisive) / jnp.sum(decisive)),
            "heldout_loss": float(bradley_terry_loss(rc, rr, label))}


def _restore(manager, module: nn.Transformer, optimizer: nnx.Optimizer, wrt, log, consume: bool = False
             ) -> int | None:
    """The latest checkpoint's step, its weights and optimizer state put back in place (None: a fresh run).
    The arrays the checkpoint replaces are deleted before it is read, not held beside its copy: the optimizer's fresh
    state (Adam's zero moments, the float32 master copy) always, being the run's own; the trained weights when the
    run consumes the model (`consume`; otherwise they are the caller's)."""
    step = manager.latest_step()
    if step is not None:
        target = _checkpoint(module, optimizer, wrt)
        where = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), target)
        for a in jax.tree.leaves(target if consume else target["optimizer"]):
            if not a.is_deleted():
                a.delete()
        del target
        restored = manager.restore(step, args=ocp.args.StandardRestore(where))
        nnx.update(module, restored["params"])
        nnx.update(optimizer, restored["optimizer"])
        log(f"resumed from checkpoint at step {step}")
    return step


def _kept_feature_batch(cfg: TrainConfig, workdir: Path, resuming: bool, log) -> TrainConfig:
    """A head-only run's features are computed once per run, in batches of --feature_batch_size, whose rounding
    the trained head inherits: a resume computes them in the batches its checkpoints were trained on (run.json
    records them), as a sweep's resume keeps its batch size; a run without checkpoints records its own."""
    if cfg.trainable != "head":
        return cfg
    try:
        run = json.loads((workdir / RUN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        run = None
    saved = run.get("feature_batch_size") if isinstance(run, dict) else None
    if resuming and isinstance(saved, int) and not isinstance(saved, bool) and saved >= 1:
        if saved != cfg.feature_batch_size:
            log(f"resuming {workdir} with its --feature_batch_size={saved}, not {cfg.feature_batch_size}: its "
                "checkpoints were trained on features computed in those batches (another size rounds differently)")
        return dataclasses.replace(cfg, feature_batch_size=saved)
    if isinstance(run, dict) and is_main():
        dump_json({**run, "feature_batch_size": cfg.feature_batch_size}, workdir / RUN_FILE)
    return cfg


def _train(model: Model, train: Pairs, heldout: Pairs, cfg: TrainConfig, workdir: Path, log,
           consume: bool) -> TrainResult:
    """Restore the workdir's last checkpoint, then run the steps after it. A run whose every step is checkpointed
    restores its weights and computes nothing else: no features, no sequences (train_rm's export of a finished
    run)."""
    start = time.perf_counter()
    manager = ocp.CheckpointManager(
        (workdir / "checkpoints").resolve(),
        options=ocp.CheckpointManagerOptions(max_to_keep=cfg.keep_checkpoints, create=True),
    )
    latest = manager.latest_step()
    cfg = _kept_feature_batch(cfg, workdir, latest is not None, log)
    if latest is not None and latest < cfg.steps:
        log(f"found a checkpoint at step {latest} in {workdir}: it is read once the training data are prepared")
    # The objective's data first, from the loaded model alone: computed beside Adam's moments and the trained weights'
    # FSDP shards or restored copies, they needed all of those at once.
    objective = _objective(model, train, heldout, cfg, log) if (latest or 0) < cfg.steps else None
    module, wrt = trainable_part(model, cfg)
    optimizer = nnx.Optimizer(module, make_optimizer(cfg, model.dtype), wrt=wrt)
    nnx.update(optimizer, on_mesh(nnx.state(optimizer), model.mesh))
    if cfg.fsdp:  # before restoring: a checkpoint is restored where its target lives
        nnx.update(module, sharding.shard_over_data(nnx.state(module, wrt), model.mesh))
        nnx.update(optimizer, sharding.shard_over_data(nnx.state(optimizer), model.mesh))
    if consume:  # the model's arrays the module no longer holds (the replicated originals of FSDP's shards)
        _give_up(model, module)
    resumed_from = _restore(manager, module, optimizer, wrt, log, consume)
    first = resumed_from or 0
    history = read_log(workdir / "train_log.csv", upto=first)
    evals = read_log(workdir / "eval_log.csv", upto=first)
    loop_seconds = 0.0
    if first < cfg.steps:
        loop_seconds = _run_steps(model, train, heldout, cfg, workdir, log, manager, (module, optimizer, wrt), first,
                                  history, evals, objective, consume)
    manager.wait_until_finished()
    steps_run = cfg.steps - first
    return TrainResult(
        # trained: its fingerprint no longer applies (fingerprint_of)
        model=dataclasses.replace(model, params=trained_params(module, in_place=consume)),
        history=history,
        evals=evals,
        seconds=time.perf_counter() - start,
        steps_per_second=steps_run / loop_seconds if loop_seconds > 0 else 0.0,
        resumed_from=resumed_from,
        config=cfg,
    )


def _run_steps(model: Model, train: Pairs, heldout: Pairs, cfg: TrainConfig, workdir: Path, log, manager,
               trained: tuple, first: int, history: list[dict], evals: list[dict], objective: tuple,
               consume: bool = False) -> float:
    """Steps `first`..cfg.steps on the `objective` (`_objective`: the features or sequences), each checkpoint with its
    held-out evaluation and logs; `history` and `evals` grow in place. Returns the seconds the steps took.
    `consume`: the steps donate the module's arrays themselves (which the loaded model shares), not copies of them."""
    module, optimizer, wrt = trained
    pair_rewards, data, held_rewards = objective
    steps = Steps(model.config, model.mesh, module, optimizer, wrt, pair_rewards, data, copy=not consume,
                  moving_shardings=_shardings(nnx.state((module, optimizer), nnx.Any(wrt, nnx.OptState)))
                  if cfg.fsdp and model.mesh is not None else None)
    progress = Progress(cfg.steps, "train", unit="steps", done=first)
    loop_start = time.perf_counter()
    for step in range(first, cfg.steps):
        idx = batch_indices(len(train), cfg.batch_size, cfg.seed, step)
        loss = steps(*(batching.place(a, model.mesh) for a in (idx, np.asarray(train.label[idx], np.float32))))
        if not np.isfinite(float(loss)):
            raise NonFiniteError(
                f"training loss is {float(loss)} at step {step + 1}; the run stops (checkpoints up to step "
                f"{manager.latest_step() or 0} in {workdir} are intact). Lower --learning_rate or --clip_norm, or "
                "check the data and the model for NaN.")
        history.append({"step": step + 1, "loss": float(loss)})
        progress.update(1)
        if (step + 1) % cfg.checkpoint_every == 0 or step + 1 == cfg.steps:
            steps.write_back()
            record = {"step": step + 1, **_evaluation(module, held_rewards, heldout)}
            evals.append(record)
            # Logs first, then the checkpoint: a resume trims the logs back to its checkpoint.
            if is_main():
                write_log(workdir / "train_log.csv", history)
                write_log(workdir / "eval_log.csv", evals)
            with _ctrl_c_after():  # a logged checkpoint is a durable one, and Ctrl-C waits for it
                manager.save(step + 1, args=ocp.args.StandardSave(_checkpoint(module, optimizer, wrt)))
                manager.wait_until_finished()
            log(f"step {step + 1}: loss {float(loss):.4f}, held-out accuracy {record['heldout_accuracy']:.3f}")
    return time.perf_counter() - loop_start


@contextlib.contextmanager
def _ctrl_c_after():
    """Ctrl-C held back while orbax writes a checkpoint: its KeyboardInterrupt comes once the save is whole, not
    inside orbax's wait (which logged the interrupt as a failed save, with tracebacks); a second Ctrl-C interrupts
    at once. Main thread only (signal handlers live there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.getsignal(signal.SIGINT)
    previous = signal.default_int_handler if previous is None else previous  # one not set from Python

    def hold(number, _frame):
        caught.append(number)
        if len(caught) > 1:  # a second Ctrl-C: a save that hangs (a stalled disk) is not waited for
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if len(caught) == 1 and callable(previous):
        previous(signal.SIGINT, None)  # Python's own handler: KeyboardInterrupt
    elif len(caught) == 1 and previous != signal.SIG_IGN:
        raise KeyboardInterrupt


def _give_up(model: Model, module: nn.Transformer) -> None:
    """Delete the loaded model's arrays that the trained module does not hold (its arrays are the run's now)."""
    held = {id(a) for a in jax.tree.leaves(nnx.state(module))}
    for a in jax.tree.leaves(model.params):
        if isinstance(a, jax.Array) and id(a) not in held and not a.is_deleted():
            a.delete()


def _shardings(state: nnx.State) -> nnx.State:
    return jax.tree.map(lambda x: x.sharding, state)


def on_mesh(state, mesh: jax.sharding.Mesh | None):
    """`state` with every leaf that lives off `mesh` (optax's step counts, made on device 0) replicated over it.

    Orbax restores each leaf where its target lives: a count committed to device 0 beside mesh-sharded weights
    cannot enter one jitted step ("incompatible devices"), so a fresh run and a resumed one must place it alike."""
    if mesh is None:
        return state
    devices = set(mesh.devices.flat)
    full = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

    def place(x):
        if not isinstance(x, jax.Array) or x.sharding.device_set == devices:
            return x
        return global_array(np.asarray(x), full)

    return jax.tree.map(place, state)


def _checkpoint(module: nn.Transformer, optimizer: nnx.Optimizer, wrt) -> dict:
    """What a checkpoint holds: the trainable weights and the optimizer's state (frozen weights come from
    the base model, which the workdir's identity pins)."""
    return {"params": nnx.state(module, wrt), "optimizer": nnx.state(optimizer)}
