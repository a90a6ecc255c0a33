"""A forward sharded on 8 fake CPU devices (data x model mesh) equals the unsharded one."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from rmjax import nn
from rmjax.loading.hf import load_hf_model_folder
from rmjax.parallel import sharding
from tests import jitted as M
from tests import tiny, tolerance


def test_mesh_spec_parsing():
    assert sharding.parse_mesh_spec("data:8,model:1") == {"data": 8, "model": 1}
    assert sharding.make_mesh("data:-1,model:2").shape == {"data": 4, "model": 2}
    with pytest.raises(ValueError, match="needs 6 devices"):
        sharding.make_mesh("data:3,model:2")
    for spec in ("pipeline:2", "data:--1", "data:²", "data:+2"):  # '--1' and '²' reached int(): its own words
        with pytest.raises(ValueError, match="bad mesh spec"):
            sharding.parse_mesh_spec(spec)


@pytest.mark.parametrize("mesh_spec", ["data:4,model:2", "data:2,model:4"])
@pytest.mark.parametrize("name", ["llama3.2", "gemma2"])
def test_sharded_forward_equals_unsharded(tmp_path, name, mesh_spec):
    assert len(jax.devices()) == 8
    folder = tiny.save_hf_model(tiny.build_hf_model(name, num_labels=1), tmp_path)
    ref_model = load_hf_model_folder(folder, require_tokenizer=False)
    mesh = sharding.make_mesh(mesh_spec)
    model = load_hf_model_folder(folder, require_tokenizer=False, mesh=mesh)
    q = nn.get(model.params, "layers.q")
    assert q.sharding.spec == jax.sharding.PartitionSpec(None, None, "model", None)
    assert len({s.device for s in q.addressable_shards}) == 8
    ids, mask = tiny.random_batch(seed=5, batch=8, length=10, padding="left")
    ids_s = jax.device_put(ids, sharding.batch_sharding(mesh, 2))
    mask_s = jax.device_put(mask, sharding.batch_sharding(mesh, 2))
    got = M.rewards(model.params, model.config, ids_s, mask_s)
    ref = M.rewards(ref_model.params, ref_model.config, ids, mask)
    atol = tolerance.rewards_atol(ref_model.params, ref_model.config, ids, mask)  # partial sums over `model`
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref), atol=atol, rtol=0)
    lm_ref = load_hf_model_folder(
        tiny.save_hf_model(tiny.build_hf_model(name), tmp_path / "lm"), require_tokenizer=False
    )
    lm = load_hf_model_folder(tmp_path / "lm", require_tokenizer=False, mesh=mesh)
    got = M.logits(lm.params, lm.config, ids_s, mask_s)
    ref = M.logits(lm_ref.params, lm_ref.config, ids, mask)
    atol = tolerance.logits_atol(lm_ref.params, lm_ref.config, ids, mask)
    np.testing.assert_allclose(np.asarray(got)[mask], np.asarray(ref)[mask], atol=atol, rtol=0)


@pytest.mark.parametrize("mesh_spec", ["data:8,model:1", "data:1,model:8", "data:2,model:4", "data:4,model:2", None])
def test_each_slice_is_read_once(tmp_path, mesh_spec):
    """Devices share reads of the same slice and sharded params are read shard by shard, so a process
    reads each weight byte once (a multi-host process reads only its devices' shards: test_multihost). On
    data:D,model:M with both over 1, JAX asked for each model shard D times (read 2-4x, "read 24.9 of 12.5 MiB")."""
    hf = tiny.build_hf_model("llama3.1", num_labels=1)
    folder = tiny.save_hf_model(hf, tmp_path)
    mesh = sharding.make_mesh(mesh_spec) if mesh_spec else None
    model = load_hf_model_folder(folder, require_tokenizer=False, mesh=mesh)
    expected = sum(t.numel() * 4 for t in hf.state_dict().values())  # what transformers holds, in f32
    assert model.weight_bytes == expected
    assert model.weight_bytes_read == expected
    if mesh_spec == "data:1,model:8":
        shard = nn.get(model.params, "layers.gate").addressable_shards[0].data
        assert shard.shape[-1] == model.config.intermediate_size // 8


def test_sweep_scorer_declares_its_shardings(tmp_path):
    """Weights by their declared axes, the prefix cache with K/V heads over `model`, rows and rewards over
    `data`, and the activations pinned to rows over `data` (not left to GSPMD's guess from the weights)."""
    from rmjax import compiled
    from rmjax.scoring import prefix

    folder = tiny.save_hf_model(tiny.build_hf_model("llama3", num_labels=1), tmp_path)
    mesh = sharding.make_mesh("data:4,model:2")
    model = load_hf_model_folder(folder, mesh=mesh, require_tokenizer=False)
    cache = prefix.prefill_prefix(model, [5, 6, 7])
    assert cache.k.sharding.spec == jax.sharding.PartitionSpec(None, None, None, "model", None)
    suffix = jax.numpy.zeros((0,), jax.numpy.int32)
    out = prefix.score_responses(model, cache, suffix, np.arange(8, dtype=np.int32)[:, None] + 3, 8)
    scorer = compiled.made("_score_batch", mesh)[-1]  # the call the sweep ran, lowered again with its arguments
    lowered = scorer.lower(*scorer.example[0])
    assert lowered.as_text().count("sharding_constraint") >= 2  # embeddings, and each layer's residual (scan body)
    (params_in, cache_in, rows_in, _), _ = lowered.compile().input_shardings
    assert rows_in.spec == jax.sharding.PartitionSpec("data", None)
    assert params_in["layers"]["q"].get_value().spec == jax.sharding.PartitionSpec(None, None, "model", None)
    full = np.asarray([[5, 6, 7, t] for t in range(3, 11)], np.int32)
    ref = np.asarray(M.rewards(model.params, model.config, full, np.ones((8, 4), bool)))[:, 0]
    np.testing.assert_allclose(out, ref, atol=tolerance.rewards_atol(model.params, model.config, full), rtol=0)


def test_inspection_and_gcg_run_with_their_declared_shardings(tmp_path):
    """Lens, curve, attribution, patching and GCG's gradient and evaluation are compiled calls (rmjax.compiled) on
    the model's mesh: traced with the mesh set, so the activations' constraints apply, with the weights entering
    where their declarations put them and the cache's K/V heads over `model`; their numbers equal one device's."""
    from rmjax import compiled
    from rmjax.inspect.attribution import attribute
    from rmjax.inspect.lens import reward_lens, token_rewards
    from rmjax.inspect.patching import patching_map
    from rmjax.search.gcg import evaluate, make_target, reward_gradient

    folder = tiny.save_hf_model(tiny.build_hf_model("llama3", num_labels=1), tmp_path)
    mesh = sharding.make_mesh("data:4,model:2")
    one = load_hf_model_folder(folder, require_tokenizer=False)
    model = load_hf_model_folder(folder, mesh=mesh, require_tokenizer=False)
    seqs = [[5, 6, 7, 8, 9, 10], [5, 6, 7, 11, 12, 13]]
    atol = tolerance.any_rewards_atol(one.params, one.config, 6)
    np.testing.assert_allclose(reward_lens(model, seqs).lens, reward_lens(one, seqs).lens, atol=atol, rtol=0)
    np.testing.assert_allclose(token_rewards(model, seqs)[1], token_rewards(one, seqs)[1], atol=atol, rtol=0)
    ig = attribute(one, seqs[0], steps=4, batch_size=4, baseline="zero").integrated_gradients
    np.testing.assert_allclose(attribute(model, seqs[0], steps=4, batch_size=4, baseline="zero").integrated_gradients,
                               ig, atol=tolerance.grad_atol(ig, one.config, 6, one.config.hidden_size), rtol=0)
    np.testing.assert_allclose(patching_map(model, *seqs, batch_size=8).maps["mlp"],
                               patching_map(one, *seqs, batch_size=8).maps["mlp"], atol=atol, rtol=0)
    targets = [make_target(m, "", prefix=(5, 6, 7), suffix=(2,)) for m in (one, model)]
    grads = [reward_gradient(t, np.asarray([8, 9])) for t in targets]
    grad_atol = tolerance.grad_atol(grads[0], one.config, 6, one.config.vocab_size)
    np.testing.assert_allclose(grads[1], grads[0], atol=grad_atol, rtol=0)
    variants = np.asarray([[8, 9], [8, 10], [11, 9], [12, 13]], np.int32)
    np.testing.assert_allclose(*(evaluate([t], variants, 8, current=np.asarray([8, 9])) for t in targets[::-1]),
                               atol=atol, rtol=0)
    declared_q = jax.sharding.PartitionSpec(None, None, "model", None)
    for name in ("_lens", "_curve", "_rewards_and_grads", "_donor_reads", "_patched", "_grad_one_hot",
                 "_score_variants"):
        call = compiled.made(name, mesh)[-1]
        lowered = call.lower(*call.example[0])
        assert "sharding_constraint" in lowered.as_text(), name  # traced under the mesh
        params_in = lowered.compile().input_shardings[0][0]
        assert params_in["layers"]["q"].get_value().spec == declared_q, name
        if name in ("_grad_one_hot", "_score_variants"):
            cache_in = lowered.compile().input_shardings[0][1]
            assert cache_in.k.spec == jax.sharding.PartitionSpec(None, None, None, "model", None), name
    patched = compiled.made("_patched", mesh)[-1]
    where = patched.lower(*patched.example[0]).compile().input_shardings[0][-1]
    assert where.spec == jax.sharding.PartitionSpec("data", None)  # the patches of one call over `data`
