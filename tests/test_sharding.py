"""A forward sharded on 8 fake CPU devices (data x model mesh) equals the unsharded one."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from rmjax import model as M
from rmjax import nn
from rmjax.loading.hf import load_hf_model_folder
from rmjax.parallel import sharding
from tests import tiny, tolerance


def test_mesh_spec_parsing():
    assert sharding.parse_mesh_spec("data:8,model:1") == {"data": 8, "model": 1}
    assert sharding.make_mesh("data:-1,model:2").shape == {"data": 4, "model": 2}
    with pytest.raises(ValueError, match="needs 6 devices"):
        sharding.make_mesh("data:3,model:2")
    with pytest.raises(ValueError, match="bad mesh spec"):
        sharding.parse_mesh_spec("pipeline:2")


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


@pytest.mark.parametrize("mesh_spec", ["data:8,model:1", "data:1,model:8", None])
def test_each_slice_is_read_once(tmp_path, mesh_spec):
    """Devices share reads of the same slice and sharded params are read shard by shard, so a process
    reads each weight byte once (a multi-host process reads only its devices' shards: test_multihost)."""
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
    from rmjax.parallel import batching
    from rmjax.scoring import prefix

    folder = tiny.save_hf_model(tiny.build_hf_model("llama3", num_labels=1), tmp_path)
    mesh = sharding.make_mesh("data:4,model:2")
    model = load_hf_model_folder(folder, mesh=mesh, require_tokenizer=False)
    cache = prefix.prefill_prefix(model, [5, 6, 7])
    assert cache.k.sharding.spec == jax.sharding.PartitionSpec(None, None, None, "model", None)
    scorer = prefix._batch_scorer(model.config, mesh, cache.k.shape[2], 0).__wrapped__
    rows = batching.place(np.arange(8, dtype=np.int32)[:, None] + 3, mesh)
    suffix = jax.numpy.zeros((0,), jax.numpy.int32)
    with jax.set_mesh(mesh):
        lowered = scorer.lower(model.params, cache, rows, suffix)
    assert lowered.as_text().count("sharding_constraint") >= 2  # embeddings, and each layer's residual (scan body)
    (params_in, cache_in, rows_in, _), _ = lowered.compile().input_shardings
    assert rows_in.spec == jax.sharding.PartitionSpec("data", None)
    assert params_in["layers"]["q"].get_value().spec == jax.sharding.PartitionSpec(None, None, "model", None)
    out = prefix.score_responses(model, cache, suffix, np.arange(8, dtype=np.int32)[:, None] + 3, 8)
    full = np.asarray([[5, 6, 7, t] for t in range(3, 11)], np.int32)
    ref = np.asarray(M.rewards(model.params, model.config, full, np.ones((8, 4), bool)))[:, 0]
    np.testing.assert_allclose(out, ref, atol=tolerance.rewards_atol(model.params, model.config, full), rtol=0)
