"""Memory estimates for the published models: a 27B model fits on 8 x 16 GB chips only when sharded."""

from __future__ import annotations

import pytest

from rmjax import zoo
from rmjax.scoring import memory

GIB = 2**30


def _cfg(nickname):
    return zoo.architecture_config(next(e for e in zoo.ZOO if e.nickname == nickname))


def test_unsharded_param_bytes_equal_eval_shape():
    cfg = _cfg("S-Gem-27B-v0.2")
    abstract = zoo.abstract_params(cfg)
    import jax

    nbytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(abstract))
    assert memory.param_bytes(cfg, "bfloat16", 1) == nbytes


def test_27b_needs_tensor_parallelism_on_16gb_chips():
    cfg = _cfg("S-Gem-27B-v0.2")
    with pytest.raises(memory.DoesNotFitError, match="--mesh=data:D,model:M"):
        memory.pick_batch_size(cfg, "bfloat16", prefix_len=64, positions=3, device_bytes=16 * GIB, backend="tpu")
    est = memory.pick_batch_size(cfg, "bfloat16", prefix_len=64, positions=3, data_shards=1, model_shards=8,
                                 device_bytes=16 * GIB, backend="tpu")
    assert 6 * GIB < est.params_bytes < 8 * GIB  # 27.2e9 * 2 bytes / 8, plus replicated norms
    assert est.batch_size >= 64 and est.total_bytes <= 0.8 * 16 * GIB
    assert "per device: params" in est.describe()


def test_larger_batches_cost_more_and_8b_fits_one_80gb_gpu():
    cfg = _cfg("S-Lla-8B-v0.2")
    small = memory.estimate(cfg, "bfloat16", 64, 2, 64, device_bytes=80 * GIB, backend="gpu")
    big = memory.estimate(cfg, "bfloat16", 64, 2, 512, device_bytes=80 * GIB, backend="gpu")
    assert big.batch_bytes == pytest.approx(8 * small.batch_bytes, rel=0.01)
    assert big.params_bytes == small.params_bytes
    assert memory.pick_batch_size(cfg, "bfloat16", 64, 2, device_bytes=80 * GIB, backend="gpu").batch_size >= 256


def test_bfloat16_on_the_cpu_counts_the_float32_copy_and_says_float32_is_smaller():
    cfg = _cfg("S-Lla-8B-v0.2")
    on_cpu = memory.estimate(cfg, "bfloat16", 64, 2, 64, backend="cpu")
    embedding, score = cfg.vocab_size * cfg.hidden_size * 2, cfg.hidden_size * cfg.num_labels * 4  # score: float32
    assert on_cpu.upcast_bytes == 2 * (on_cpu.params_bytes - embedding - score)
    # an LM whose head is its embedding table reads the table in a matmul: copied too
    from rmjax.hf_config import config_from_hf
    from tests import tiny

    lm = config_from_hf(tiny.hf_config("gemma3").to_dict() | {"architectures": ["Gemma3ForCausalLM"]})
    assert lm.tie_embeddings and not lm.is_reward_model
    assert memory.upcast_bytes(lm, "bfloat16", 1, "cpu") == 2 * memory.param_bytes(lm, "bfloat16", 1)
    assert memory.estimate(cfg, "bfloat16", 64, 2, 64, backend="tpu").upcast_bytes == 0
    with pytest.raises(memory.DoesNotFitError, match="--dtype=float32 takes less memory on the CPU"):
        memory.pick_batch_size(cfg, "bfloat16", 64, 2, device_bytes=32 * GIB, backend="cpu")


def test_plan_picks_or_refuses_a_batch():
    from rmjax.hf_config import config_from_hf
    from tests import tiny

    raw = tiny.hf_config("llama3", num_labels=1).to_dict() | {"architectures": ["LlamaForSequenceClassification"]}
    cfg = config_from_hf(raw)
    est = memory.plan(cfg, "bfloat16", 64, 2, None)  # CPU: host RAM per device, batch capped at 256
    assert est.batch_size == 256 and est.total_bytes <= 0.8 * memory.device_memory_bytes()
    with pytest.raises(memory.DoesNotFitError, match="smaller --batch_size"):
        memory.plan(cfg, "bfloat16", 64, 2, None, batch_size=10**9)


@pytest.mark.parametrize("lm", [None, "smollm2-135m-instruct"], ids=["own prior", "separate prior"])
def test_an_rm_that_is_its_own_prior_counts_the_float32_copy_of_its_tied_table(monkeypatch, lm):
    """The default SmolLM2 RM ties its embeddings: as its own prior (the frontier's default) its forward computes LM
    logits from the table, which a CPU in bfloat16 copies to float32 beside the other layers' copies. The table was
    not counted (an RM only gathers from it). Reference: every bfloat16 weight (all but the float32 score head) in
    float32, from the config's shapes; with a separate prior, the prior's own copy (an LM: its table too)."""
    from rmjax.loading import config_of
    from rmjax.runs.options import RunOptions
    from rmjax.search import fluent
    from rmjax.search.frontier_checks import PromptChecks

    cfg = config_of("elo-rm-smollm2-135m")
    assert cfg.tie_embeddings and cfg.is_reward_model
    score = cfg.hidden_size * cfg.num_labels * 4
    weights = memory.param_bytes(cfg, "bfloat16", 1)
    every_copy = 2 * (weights - score)
    options = RunOptions(model="elo-rm-smollm2-135m", out="unused", dtype="bfloat16")
    checks = PromptChecks(options, fluent.FluentConfig(num_tokens=3), lm, None)
    held = weights if lm is None else weights + memory.param_bytes(config_of(lm), "bfloat16", 1)
    monkeypatch.setattr(memory.jax, "default_backend", lambda: "cpu")
    monkeypatch.setattr(memory, "device_memory_bytes", lambda: held + every_copy)
    checks.weights("frontier job")  # exactly room
    monkeypatch.setattr(memory, "device_memory_bytes", lambda: held + every_copy - 1)
    with pytest.raises(memory.DoesNotFitError, match="frontier job holds"):
        checks.weights("frontier job")
