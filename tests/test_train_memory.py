"""What a training run holds on its devices. train_rm's loaded model is its run's alone (`consume`): the steps train
its own arrays, the objective's data are computed before Adam's moments or any copy of the trained weights exist, and a
resume reads its checkpoint into the memory of the arrays it replaces. Each measured as the device buffers alive
(jax.live_arrays), against the same run on a copy of the model."""

from __future__ import annotations

import dataclasses
import gc

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from rmjax import nn
from rmjax.loading import load
from rmjax.loading.reward_head import reward_model_from_lm
from rmjax.parallel import sharding
from rmjax.train import loop
from rmjax.train.loop import train_reward_model
from rmjax.train.settings import TrainConfig
from rmjax.train.step import Steps
from tests.test_train import NOUNS, Crash, _separable, crash_at


def on_devices() -> int:
    """Bytes of the device buffers alive now, each once (a shard's view is a live array of its own)."""
    gc.collect()
    return sum({(s.device.id, s.data.unsafe_buffer_pointer()): s.data.nbytes
                for a in jax.live_arrays() for s in a.addressable_shards}.values())


def placed_bytes(tree) -> int:
    """Bytes of `tree`'s arrays on this process's devices, each buffer once."""
    return sum({(s.device.id, s.data.unsafe_buffer_pointer()): s.data.nbytes
                for a in jax.tree.leaves(tree) if isinstance(a, jax.Array) for s in a.addressable_shards}.values())


def base_model(lm, mesh: str | None, dtype: str):
    return load(lm.source, mesh=sharding.make_mesh(mesh) if mesh else None, dtype=dtype) \
        if mesh or dtype != "float32" else lm


def own_copy(base):
    """A reward model on arrays of its own: a consumed model's are deleted."""
    rm = reward_model_from_lm(base, seed=3)
    return dataclasses.replace(rm, params=jax.tree.map(jnp.copy, rm.params))


def trained_bytes(rm, trainable: str) -> int:
    """The trained weights' bytes as loaded (last_k=1: one layer of the stack, the final norm and the head)."""
    n = rm.config.num_layers
    return sum(s.data.nbytes * (1 if trainable == "full" or not key.startswith("layers.") else 1 / n)
               for key, a in nn.flat(rm.params).items() if "embed" not in key for s in a.addressable_shards)


# last_k in float32 is no case of its own: last_k in bfloat16 runs the same consuming path (the same Steps, the same
# in-place join; only the optimizer adds its float32 master) and fails with each fault that case failed with (always
# a copy, no donation, the objective beside Adam's moments, the stack joined into a copy), at margins of its own.
@pytest.mark.parametrize("trainable,mesh,dtype", [("full", None, "float32"), ("full", "data:4,model:2", "float32"),
                                                  ("last_k", None, "bfloat16")])
def test_a_consumed_model_trains_in_place(lm, tmp_path, monkeypatch, trainable, mesh, dtype):
    """No copy of the trained weights beside the model's own as the steps run (a full fine-tune held every layer
    twice: 6.5 GiB a chip for an 8B RM on v5p-8), and under --fsdp not the replicated originals either; and the
    objective's data computed from the loaded model alone (they were computed beside Adam's moments and FSDP's
    shards); and last_k's trained layers written back into the loaded stack, not into a copy of it. The same run,
    step for step, as on a copy."""
    base = base_model(lm, mesh, dtype)  # bfloat16: the float32 head's master copy was its own buffer (donated twice)
    train, held = _separable(NOUNS[:20], 64, 6), _separable(NOUNS[20:], 16, 7)
    cfg = TrainConfig(trainable=trainable, last_k=1, steps=2, batch_size=8, learning_rate=1e-2, checkpoint_every=2,
                      fsdp=mesh is not None)
    objective = loop._objective

    def run(consume: bool):
        rm = own_copy(base)
        before, at_steps, at_objective = on_devices(), [], []

        class Measured(Steps):  # what the devices hold as each step starts
            def __call__(self, *args):
                at_steps.append(on_devices())
                return super().__call__(*args)

        def measured_objective(*args, **kwargs):
            at_objective.append(on_devices())
            return objective(*args, **kwargs)

        monkeypatch.setattr(loop, "Steps", Measured)
        monkeypatch.setattr(loop, "_objective", measured_objective)
        result = train_reward_model(rm, train, held, cfg, tmp_path / str(consume), consume=consume,
                                    log=lambda *_: None)
        return rm, result, max(at_steps) - before, at_objective[0] - before, on_devices() - before

    copied_rm, copied, copied_extra, copied_objective, copied_end = run(False)
    rm, consumed, consumed_extra, consumed_objective, consumed_end = run(True)
    assert [h["loss"] for h in consumed.history] == [h["loss"] for h in copied.history]
    flat, reference = nn.flat(consumed.model.params), nn.flat(copied.model.params)
    for key in reference:
        np.testing.assert_array_equal(np.asarray(flat[key]), np.asarray(reference[key]), err_msg=key)
    trained = trained_bytes(copied_rm, trainable)
    assert copied_extra - consumed_extra >= trained, (copied_extra, consumed_extra, trained)
    # nothing beside the loaded model as the objective starts: not Adam's moments (twice the trained weights in
    # float32), not FSDP's shards of them, which the old order had made first
    assert copied_objective == consumed_objective == 0, (copied_objective, consumed_objective)
    # the trained model, once returned, holds the loaded model's buffers, not copies beside them (last_k's stack
    # was joined into a copy of the loaded one: every layer twice)
    assert copied_end - consumed_end >= trained_bytes(copied_rm, "full"), (copied_end, consumed_end)
    assert all(a.is_deleted() for key, a in nn.flat(rm.params).items() if key.startswith("score"))
    assert not any(a.is_deleted() for a in jax.tree.leaves(copied_rm.params))


@pytest.mark.parametrize("trainable,mesh,dtype", [("full", None, "float32"), ("full", "data:4,model:2", "float32"),
                                                  ("last_k", None, "bfloat16")])
def test_a_consumed_resume_reads_its_checkpoint_into_what_it_replaces(lm, tmp_path, monkeypatch, trainable, mesh,
                                                                        dtype):
    """A consumed run resumed from a checkpoint deletes the arrays the checkpoint replaces (the loaded trained weights,
    FSDP's shards of them, Adam's fresh moments) before reading it: held beside the restored copy, they were the
    trained weights and their optimizer state twice. The same steps after it as a resume on a copy. A resume on the
    caller's model (not consumed) deletes the optimizer's fresh state, its own, all the same."""
    base = base_model(lm, mesh, dtype)  # bfloat16: the float32 master copies are optimizer state, restored too
    train, held = _separable(NOUNS[:20], 64, 4), _separable(NOUNS[20:], 16, 5)
    cfg = TrainConfig(trainable=trainable, last_k=1, steps=2, batch_size=8, learning_rate=1e-2, checkpoint_every=1,
                      fsdp=mesh is not None)
    from rmjax.train import loop

    restore, checkpoint = ocp.CheckpointManager.restore, loop._checkpoint

    def resume(consume: bool):
        workdir = tmp_path / str(consume)
        with pytest.raises(Crash):  # killed after step 1's checkpoint
            train_reward_model(own_copy(base), train, held, cfg, workdir, consume=consume, log=crash_at(1))
        rm = own_copy(base)
        before, seen, targets = on_devices(), [], []

        def measured(self, *args, **kwargs):  # what the devices hold once the checkpoint is read
            restored = restore(self, *args, **kwargs)
            seen.append((on_devices(), placed_bytes(restored["params"]), placed_bytes(restored["optimizer"])))
            return restored

        def target(*args):  # the arrays the restore replaces (the first call: the fresh run's, before the steps)
            made = checkpoint(*args)
            targets.append({part: jax.tree.leaves(tree) for part, tree in made.items()})
            return made

        with monkeypatch.context() as patch:
            patch.setattr(ocp.CheckpointManager, "restore", measured)
            patch.setattr(loop, "_checkpoint", target)
            result = train_reward_model(rm, train, held, cfg, workdir, consume=consume, log=lambda *_: None)
        (then, params, state), = seen
        assert result.resumed_from == 1
        # the optimizer's fresh state is the run's own: gone before the checkpoint is read, consumed or not (a run
        # on the caller's model held Adam's zero moments and master copy beside the restored ones)
        assert all(a.is_deleted() for a in targets[0]["optimizer"])
        assert consume or not any(a.is_deleted() for a in jax.tree.leaves(rm.params))  # the caller's, kept
        return result, then - before, params, state

    copied, copied_extra, params, state = resume(False)
    consumed, consumed_extra, _, _ = resume(True)
    assert [h["loss"] for h in consumed.history] == [h["loss"] for h in copied.history]
    flat, reference = nn.flat(consumed.model.params), nn.flat(copied.model.params)
    for key in reference:
        np.testing.assert_array_equal(np.asarray(flat[key]), np.asarray(reference[key]), err_msg=key)
    # the consumed run deletes the loaded trained weights as well: held by the copy's run, they are its whole margin
    assert copied_extra - consumed_extra >= params, (copied_extra, consumed_extra, params)
    assert copied_extra - consumed_extra < params + state or mesh, (copied_extra, consumed_extra, params, state)


@pytest.mark.parametrize("trainable", ["last_k", "full"])
def test_the_plan_holds_the_held_out_data_the_run_holds(lm, tmp_path, monkeypatch, trainable):
    """train_rm makes its held-out data before the steps and holds them through all of them (last_k: each response's
    states below the trained layers): rmjax.plan counts them beside every step, bytes for bytes what the run's own
    held-out data hold (captured from the run, at its sizes), and evaluates them at each checkpoint. A plan without
    them (the one before) counted 0 bytes there."""
    from rmjax.plan import calls
    from rmjax.plan.cost import shard_bytes
    from rmjax.train import prefixed

    made = []
    real = prefixed.frozen_prefix_data

    def spy(model, split, shared, steps=0, batch_size=0):
        out = real(model, split, shared, steps, batch_size)
        made.append((split, out))
        return out

    monkeypatch.setattr(prefixed, "frozen_prefix_data", spy)
    rm = reward_model_from_lm(lm, seed=3)
    train, held = _separable(NOUNS[:20], 64, 6), _separable(NOUNS[20:], 16, 7)
    cfg = TrainConfig(trainable=trainable, last_k=1, steps=3, batch_size=8, checkpoint_every=2)
    train_reward_model(rm, train, held, cfg, tmp_path, log=lambda *_: None)
    (split, data), = [(s, d) for s, d in made if s.responses.shape[1] == len(held)]  # the held-out pairs'
    states = data[-1]
    assert (states is not None) == (trainable == "last_k")  # full: no frozen layer, no state to keep
    mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:1]).reshape(1, 1), ("data", "model"))
    prefix, response = split.prefixes.shape[1], split.responses.shape[2]
    planned = {c.name: c for c in calls.train_calls(
        rm.config, "float32", mesh, trainable=trainable, last_k=1, steps=3, batch_size=8, pairs=len(train),
        responses=64, sequence_tokens=prefix + response, prompts=len(split.prefixes), prefix_tokens=prefix,
        heldout_pairs=len(held), heldout_responses=len(states[0]) if states is not None else 32, checkpoint_every=2)}
    assert shard_bytes(planned["train_step"].beside) == placed_bytes(data) > 0
    assert planned["heldout_rewards"].count == 2  # steps 2 and 3, one call of 16 pairs each
