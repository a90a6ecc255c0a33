"""No compiled call holds a copy of the model's weights beside them (XLA's memory analysis of each call, compiled
on the CPU from abstract weights: nothing is allocated). A copy doubles what a model needs on a device, and the
memory plans (rmjax.scoring.memory, gcg_config.search_plan) count none. Found: the forked map and last_k
training's frozen prefix sliced the stack before the loop (a copy of those layers); GCG's gradient, integrated
gradients and training saved each layer's weights for the backward pass once a sharding constraint had touched
them (a copy of every layer's)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest

from rmjax.loading import config_of
from rmjax.parallel import sharding
from rmjax.plan import calls
from rmjax.scoring.memory import param_bytes

SMOLLM2 = "elo-rm-smollm2-135m"  # 30 layers of 13.5 MiB in float32: a copy is hundreds of MiB, an activation few


@pytest.fixture(scope="module")
def setting():
    cfg = config_of(SMOLLM2)
    mesh = sharding.make_mesh("data:1,model:1", jax.devices()[:1])
    layer_weights = param_bytes(cfg, "float32", 1) - cfg.vocab_size * cfg.hidden_size * 4
    return cfg, mesh, layer_weights


def _temp(call, args) -> int:
    return call.lower(*args).compile().memory_analysis().temp_size_in_bytes


def _job_calls(cfg, mesh) -> list:
    """Every compiled call of the inference jobs, at small sizes (activations of a few MiB)."""
    common = {"prompts": 1, "prefix_tokens": 40, "suffix_tokens": 3}
    return [
        *calls.sweep_calls(cfg, "float32", mesh, **common, candidates=64, batch_size=16),
        *calls.beam_calls(cfg, "float32", mesh, **common, candidates=64, batch_size=16, depth=2, beam=2,
                          direction="optimal", exhaustive=False),
        *calls.gcg_calls(cfg, "float32", mesh, **common, num_tokens=4, steps=1, search_width=16, eval_batch_size=8),
        *calls.score_calls(cfg, "float32", mesh, **common, texts=8, text_tokens=8, batch_size=4),
        *calls.logprobs_calls(cfg, "float32", mesh, prompts=1, prefix_tokens=40),
        *calls.inspect_calls(cfg, "float32", mesh, items=2, tokens=16, steps=2, batch_size=1),
    ]


@pytest.mark.parametrize("mesh_spec", ["data:1,model:1", "data:2,model:4"])
def test_no_job_call_holds_a_copy_of_the_layer_weights(setting, mesh_spec):
    """Before: GCG's gradient held 433 MiB of temp (28 now), the integrated-gradients path 925 MiB at a batch of 8
    (520, its activations). On a mesh, a device's share: the layer weights over `model` (a copy is at least that),
    the rows over `data` (activations of a few MiB, the residual stream whole on every `model` device)."""
    cfg, _, layer_weights = setting
    shape = dict(part.split(":") for part in mesh_spec.split(","))
    mesh = sharding.make_mesh(mesh_spec, jax.devices()[:int(shape["data"]) * int(shape["model"])])
    per_device = layer_weights / mesh.shape["model"]
    temps = {c.name: _temp(c.call, c.args) for c in _job_calls(cfg, mesh)}
    assert {"gradient", "attribution_path", "score_batch", "score_variants"} <= set(temps)
    over = {name: t for name, t in temps.items() if t >= per_device / 4}
    assert not over, (over, per_device)


def test_the_forked_step_and_the_frozen_prefix_read_the_stacked_weights_in_place(setting):
    """Both run a range of a stack's layers: the forked step each model's, last_k training's frozen prefix the
    layers below the trained ones. Before, SmolLM2-135M's forked step (fork at 15 of 30) held 627 MiB of temp, 1.5
    models' layer weights, and its frozen prefix (28 layers) 394 MiB; the one-model step 15 MiB. The forked step
    may exceed the one-model step by its second model's activations."""
    from rmjax.plan.calls import _array, _prefix
    from rmjax.scoring.forked import forked_scorer
    from rmjax.scoring.prefix import batch_scorer
    from rmjax.train.prefixed import lower_prefix

    cfg, mesh, layer_weights = setting
    params, width, _, cache = _prefix(cfg, "float32", mesh, 1, 40)
    rows, suffix = _array((64, 1), jnp.int32, mesh, "data"), _array((3,), jnp.int32, mesh)
    one = _temp(batch_scorer(cfg, mesh, width, 0), (params, cache, rows, suffix))
    forked = _temp(forked_scorer(cfg, mesh, width, cfg.num_layers // 2, 0, 0),
                   (params, params, cache, cache, rows, suffix))
    ids, mask = jax.ShapeDtypeStruct((8, 48), jnp.int32), jax.ShapeDtypeStruct((8, 48), jnp.bool_)
    frozen = _temp(jax.jit(functools.partial(lower_prefix, cfg, shared=cfg.num_layers - 2)), (params, ids, mask))
    assert one < layer_weights / 8  # the yardstick: no copy in the one-model step
    assert forked < 2 * one + layer_weights / 8, (forked, one, layer_weights)
    assert frozen < layer_weights / 8, (frozen, layer_weights)


@pytest.mark.parametrize("trainable", ["last_k", "full"])
def test_a_training_step_saves_no_copy_of_the_weights_it_does_not_train(setting, trainable):
    """A training step holds the trained weights' gradients and updates, and each layer's activations: not a copy
    of every layer's weights. Before, last_k's step (2 of 30 layers trained) held 211 MiB of temp, 130 now; full
    fine-tuning's 2,570 MiB, 1,760 now (gradients, Adam's updates and activations: the weights' 513 MiB and Adam's
    moments are its arguments)."""
    cfg, mesh, layer_weights = setting
    step = next(c for c in calls.train_calls(cfg, "float32", mesh, trainable=trainable, last_k=2, steps=1,
                                             batch_size=8, pairs=16, responses=32, sequence_tokens=32, prompts=2,
                                             prefix_tokens=20, text_tokens=8, suffix_tokens=3)
                if c.name == "train_step")
    temp = _temp(step.call, step.args)
    trained = layer_weights if trainable == "full" else layer_weights * 2 // cfg.num_layers
    # gradients, Adam's new moments and new weights of what trains (4x), and the activations the backward pass
    # reads: under an eighth of the layer weights for last_k, three quarters for full (every layer's: 140 MiB
    # here; a copy of the weights adds all of them)
    activations = layer_weights * (3 / 4 if trainable == "full" else 1 / 8)
    assert temp < 4 * trained + activations, (temp, trained, layer_weights)


def test_an_fsdp_step_without_remat_saves_no_gathered_copy_of_the_layers():
    """Under --fsdp each layer's weights are gathered over `data` inside the loop; the backward pass gathers them
    again rather than saving them (a copy of every layer's at the model axis' split). Before: 871 MiB of temp a
    device (SmolLM2-135M, full fine-tune, data:4,model:2), 261 now, 216 with --remat (which saves each layer's input
    alone). A gathered copy is half the layer weights a device (model:2); the bound allows a quarter of them more
    than --remat's temp, for the matmul outputs kept (45 MiB here)."""
    cfg = config_of(SMOLLM2)
    mesh = sharding.make_mesh("data:4,model:2", jax.devices()[:8])
    layer_weights = param_bytes(cfg, "float32", 1) - cfg.vocab_size * cfg.hidden_size * 4

    def temp(remat: bool) -> int:
        (step,) = calls.train_calls(cfg, "float32", mesh, trainable="full", last_k=2, steps=1, batch_size=8, pairs=16,
                                    responses=32, sequence_tokens=32, fsdp=True, remat=remat)
        return _temp(step.call, step.args)

    gathered = layer_weights / 2  # every layer's weights on a device of model:2
    assert temp(False) < temp(True) + gathered / 2, (temp(False), temp(True), gathered)
