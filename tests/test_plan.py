"""Compiling jobs for a TPU slice on this CPU machine (issue 24): the jobs' own calls compile for v5e:2x2, the
per-chip weights are the declared ones split over `model`, the TPU program does the CPU program's FLOPs, and a
model that cannot fit is refused in one line."""

from __future__ import annotations

import dataclasses
import json
import math
import re

import jax
import numpy as np
import pytest

from rmjax import nn
from rmjax.hf_config import config_from_hf
from rmjax.parallel import sharding
from rmjax.plan import calls, chips, cost
from rmjax.plan.planner import compile_option, plan
from rmjax.plan.shapes import BeamShape, GcgShape, SweepShape, TrainShape
from tests import tiny
from tests.cli import ok, run, run_each, user_error

SLICE = chips.parse_slice("v5e:2x2")


# dimensions in TPU tiles (multiples of 128), as real models have: the chip then pads almost nothing
ALIGNED = dict(hidden_size=256, intermediate_size=512, head_dim=128, num_attention_heads=4, num_key_value_heads=2,
               vocab_size=512)


def _reward_config(name: str = "llama3", **overrides):
    raw = tiny.hf_config(name, num_labels=1, **overrides).to_dict()
    raw["architectures"] = [{"llama3": "LlamaForSequenceClassification",
                             "gemma2": "Gemma2ForSequenceClassification"}[name]]
    return config_from_hf(raw)


def _declared_per_chip(cfg, dtype_bytes: int, model_shards: int, prefix: str = "") -> int:
    """Every declared weight's bytes (those whose path starts with `prefix`), split over `model` where one of its
    axes goes there and divides evenly."""
    total = 0
    for d in (d for name, d in nn.declarations(cfg).items() if name.startswith(prefix)):
        size = d.size * (4 if d.float32 else dtype_bytes)
        split = any(sharding.RULES.get(a) == "model" and n % model_shards == 0 for a, n in zip(d.axes, d.shape,
                                                                                                strict=True) if a)
        total += size // model_shards if split else size
    return total


def test_slice_names_and_devices():
    assert chips.parse_slice("v5e-8").topology == "v5e:2x4"
    assert chips.parse_slice("v4-8").topology == "v4:2x2x1"  # v4 counts cores: 8 cores, 4 chips
    assert chips.parse_slice("v5p-8").chips == 4
    assert len(chips.devices(chips.parse_slice("v4-8"))) == 4  # one device a chip (megacore)
    assert {d.platform for d in chips.devices(SLICE)} == {"tpu"}


@pytest.mark.parametrize("name", ["llama3", "gemma2"])
def test_sweep_compiles_for_v5e_with_the_declared_weights_per_chip(name):
    cfg = _reward_config(name, **ALIGNED)
    shape = SweepShape(prompts=2, prefix_tokens=40, suffix_tokens=5, candidates=1000)
    option = compile_option(cfg, "bfloat16", SLICE, 2, 2, shape, batch_size=64)
    assert option.weights_bytes == _declared_per_chip(cfg, 2, 2)
    prefill, score = option.costs
    assert (prefill.count, score.count) == (2, 2 * math.ceil(1000 / 64))
    width = 64  # 40 prompt tokens in 32-token buckets
    kv = 2 * cfg.num_layers * width * (cfg.num_kv_heads // 2) * cfg.head_dim * 2
    read = cfg.hidden_size * 2 if nn.read_pad_id(cfg) is not None else 0  # the prompt's read point (bf16), whole
    assert read and option.cache_bytes == kv + width * (4 + 1) + read  # K/V split over model; positions, valid whole
    # XLA's own count of the scoring call's inputs on one chip (weights, cache, one batch, the suffix), which on the
    # TPU includes its tile padding: little, with dimensions in whole tiles
    inputs = option.weights_bytes + option.cache_bytes + 32 * 4 + 5 * 4
    assert inputs <= score.argument_bytes <= 1.01 * inputs
    # the scan over layers counted per trip: FLOPs of L layers, not one (the only matmul outside the scan is the
    # score head's, 2·B·H FLOPs, against a layer's projections and MLP at 6 positions a row: under 0.1% of it)
    assert score.flops == pytest.approx(score.xla_flops * cfg.num_layers, rel=0.01)


def test_cpu_compile_takes_exactly_the_declared_bytes():
    """Without tiles to pad, XLA's argument bytes per device are the plan's shard bytes to the byte."""
    cfg = _reward_config()
    cpu_mesh = jax.sharding.Mesh(np.asarray(jax.devices("cpu")[:4]).reshape(2, 2), ("data", "model"))
    _, score = calls.sweep_calls(cfg, "bfloat16", cpu_mesh, prompts=1, prefix_tokens=40, suffix_tokens=5,
                                 candidates=1000, batch_size=64)
    assert cost.shard_bytes(score.weights) == _declared_per_chip(cfg, 2, 2)
    assert cost.cost_of(score.name, score.call, score.args, 1).argument_bytes == cost.shard_bytes(score.args)


def test_tpu_program_does_the_flops_of_the_cpu_program():
    """The same call with the same shardings compiled for the CPU's devices and for the TPU slice: XLA counts the
    same work per device (so the plan compiles the job's function, not a stand-in)."""
    cfg = _reward_config()
    shape = SweepShape(prompts=1, prefix_tokens=40, suffix_tokens=5, candidates=512)
    on_tpu = calls.sweep_calls(cfg, "bfloat16", chips.mesh_on(SLICE, 2, 2), **_sweep_kwargs(shape))
    cpu_mesh = jax.sharding.Mesh(np.asarray(jax.devices("cpu")[:4]).reshape(2, 2), ("data", "model"))
    on_cpu = calls.sweep_calls(cfg, "bfloat16", cpu_mesh, **_sweep_kwargs(shape))
    for tpu_call, cpu_call in zip(on_tpu, on_cpu, strict=True):
        tpu_cost = cost.cost_of(tpu_call.name, tpu_call.call, tpu_call.args, 1)
        cpu_cost = cost.cost_of(cpu_call.name, cpu_call.call, cpu_call.args, 1)
        assert tpu_cost.xla_flops == pytest.approx(cpu_cost.xla_flops, rel=0.05), tpu_call.name


def _sweep_kwargs(shape: SweepShape) -> dict:
    return dict(prompts=shape.prompts, prefix_tokens=shape.prefix_tokens, suffix_tokens=shape.suffix_tokens,
                candidates=shape.candidates, batch_size=64)


@pytest.mark.parametrize("trainable", ["head", "last_k", "full"])
def test_training_step_compiles_for_v5e(trainable):
    cfg = _reward_config()
    shape = TrainShape(trainable, 1, steps=10, batch_size=8, pairs=100, responses=50, sequence_tokens=24)
    if trainable == "head":  # its feature pass runs each response's 8 tokens after the 16-token prompt prefix
        shape = dataclasses.replace(shape, responses=300, prefix_tokens=16, text_tokens=8)
    # the head's plans in bfloat16 (its float32 feature pass, six MXU passes a product, took the TPU compiler twice
    # as long: 25.7 s alone, not 13.6); the trained layers' in float32 (bfloat16 compiled them no faster), so
    # float32 training plans stay tested
    dtype, width = ("bfloat16", 2) if trainable == "head" else ("float32", 4)
    result = plan(cfg, dtype, SLICE, "train_rm", shape, {"data": 2, "model": 2}, log=lambda *_: None)
    *before, step = result["calls"]
    assert step["name"] == "train_step" and step["count"] == 10 and step["flops"] > 0
    # last_k: the loaded stack, and a copy of the layer it trains (nn.SplitStack), as train_rm holds them
    trained_copy = _declared_per_chip(cfg, width, 2, "layers.") // cfg.num_layers if trainable == "last_k" else 0
    assert result["per_chip_bytes"]["weights"] == _declared_per_chip(cfg, width, 2) + trained_copy
    # a head-only step reads features, no backbone, but the feature pass before it holds the weights on the chip
    # (a fault hunt: a 27B head-only run "fit" one v5e chip, 0.11 GiB per chip beside 50.7 GiB of weights)
    assert result["per_chip_bytes"]["total"] >= result["per_chip_bytes"]["weights"]
    if trainable == "head":
        # and takes its time: the plan left it out (the 10 steps on a 300 x H matrix are next to nothing). 300
        # responses in 256-row batches: 2 calls, each at least every layer's matmuls at 256 rows x 8 positions, a
        # chip's share of 4
        prefill, features = before
        assert (prefill["name"], prefill["count"], features["name"], features["count"]) == \
            ("prefill", 1, "features", 2)
        assert features["flops"] >= 2 * _matmul_params(cfg) * 256 * 8 / 4
        assert features["flops"] > 100 * step["flops"]
        assert result["per_chip_bytes"]["total"] > result["per_chip_bytes"]["weights"]
        # always after the cached prefix, as the job runs it (a prefix past --sequence_tokens once planned whole
        # conversations without it): 20 response tokens and a 4-token tail, at any prefix
        for prefix in (16, 80):
            longer = plan(cfg, dtype, SLICE, "train_rm",
                          dataclasses.replace(shape, prefix_tokens=prefix, text_tokens=20, suffix_tokens=4),
                          {"data": 2, "model": 2}, log=lambda *_: None)["calls"]
            assert [(c["name"], c["count"]) for c in longer] == [("prefill", 1), ("features", 2), ("train_step", 10)]
            assert longer[1]["flops"] >= 2 * _matmul_params(cfg) * 256 * 24 / 4
    else:
        assert not before
    if trainable == "last_k":  # two scanned stacks (3 frozen layers, 1 trained): each counted per layer
        assert step["flops"] > 1.3 * step["xla_flops_scan_once"]
        # as train_rm runs it, 2 prompts' 16-token prefixes through the frozen layers once: the 3 frozen layers
        # then see 8 tokens a row, not 24, and the trained one the prefixes once a step: about 0.4 of the FLOPs
        # (200 distinct responses, more than 10 steps' 160 rows); with 50, their states below the trained layer
        # are computed once too and a step runs the trained layer alone: about 0.2
        ratios = []
        for responses in (200, 50):
            split = plan(cfg, dtype, SLICE, "train_rm",
                         dataclasses.replace(shape, prompts=2, prefix_tokens=16, responses=responses),
                         {"data": 2, "model": 2}, log=lambda *_: None)
            ratios.append(split["calls"][0]["flops"] / step["flops"])
        assert 0.3 < ratios[0] < 0.5 and 0.1 < ratios[1] < 0.3, ratios
        # more prompts than a step's 8 pairs: the job trains on whole sequences, and the plan compiles that
        many = plan(cfg, dtype, SLICE, "train_rm", dataclasses.replace(shape, prompts=9, prefix_tokens=16),
                    {"data": 2, "model": 2}, log=lambda *_: None)
        assert many["calls"][0]["flops"] == step["flops"]
    if trainable == "full":  # every layer trains: 2 prompts' 16-token prefixes once a step and the 8 tokens after
        # them, 2·16 + 2·8·8 = 160 token rows against 2·8·24 = 384 (0.42 of the matmuls); no states kept (there are
        # no frozen layers) however few the distinct responses
        flops = [plan(cfg, dtype, SLICE, "train_rm",
                      dataclasses.replace(shape, prompts=2, prefix_tokens=16, responses=responses),
                      {"data": 2, "model": 2}, log=lambda *_: None)["calls"][0]["flops"] for responses in (200, 50)]
        assert flops[0] == flops[1] and 0.35 < flops[0] / step["flops"] < 0.5, flops


def test_an_fsdp_plan_tries_no_mesh_without_a_data_axis():
    """train_rm refuses --fsdp where the data axis is 1 (nothing to split over); the mesh search tried data:1,model:4
    with --fsdp and chose it for an 8B full fine-tune on v5p-8, naming a run the job refuses. On one chip, asked for
    --fsdp, the plan says why it cannot, as the job would."""
    from rmjax.errors import UsageError
    from rmjax.plan.planner import choose

    cfg = _reward_config()
    shape = TrainShape("full", 1, steps=10, batch_size=8, pairs=100, responses=50, sequence_tokens=24, fsdp=True)
    said = []
    option, _ = choose(cfg, "float32", SLICE, shape, None, None, log=said.append)
    tried = re.findall(r"data:(\d+),model:\d+ batch", " ".join(said))
    assert option.data > 1 and tried and "1" not in tried, said
    with pytest.raises(UsageError, match="no mesh of .* has one of size > 1"):
        choose(cfg, "float32", chips.parse_slice("v5e:1x1"), shape, None, None, log=lambda *_: None)


def test_a_scan_is_counted_once_per_trip():
    """XLA counts a scan body once; the plan's count is the matmuls' FLOPs, 2·M·N·K per layer per trip."""
    from rmjax.compiled import REPLICATED, compiled

    def stack(cfg, x, w):
        return jax.lax.scan(lambda h, wi: (jax.numpy.tanh(h @ wi), None), x, w)[0]

    mesh = chips.mesh_on(SLICE, 4, 1)
    call = compiled(stack, _reward_config(), mesh, (REPLICATED, REPLICATED), REPLICATED)
    x = jax.ShapeDtypeStruct((256, 512), jax.numpy.bfloat16, sharding=jax.NamedSharding(mesh, jax.P()))
    w = jax.ShapeDtypeStruct((10, 512, 512), jax.numpy.bfloat16, sharding=x.sharding)
    counted = cost.cost_of("stack", call, (x, w), 1)
    assert counted.xla_flops == pytest.approx(2 * 256 * 512 * 512, rel=0.02)  # one trip: XLA's count
    assert counted.flops == pytest.approx(10 * 2 * 256 * 512 * 512, rel=0.02)


def test_a_tpu_compile_is_kept_and_the_same_program_reads_it_back_without_compiling(tmp_path, monkeypatch):
    """A deviceless TPU compile takes tens of seconds and jax's cache cannot load it: the plan keeps XLA's numbers
    under a key of the program, the chips and the compiler. The same program reads them back, compiling nothing, at
    the same cost; another program, other chips, other compiler flags or a torn entry compile; a refusal is kept
    too; a CPU compile is not."""
    from rmjax.compiled import REPLICATED, compiled

    monkeypatch.setenv("RMJAX_CACHE_DIR", str(tmp_path))
    compiles, real = [], jax.stages.Lowered.compile
    monkeypatch.setattr(jax.stages.Lowered, "compile", lambda self, *a, **k: compiles.append(1) or real(self, *a, **k))

    def cost_of(piece, rows):
        mesh = piece if isinstance(piece, jax.sharding.Mesh) else chips.mesh_on(piece, 4, 1)
        call = compiled(lambda cfg, x, w: x @ w, _reward_config(), mesh, (REPLICATED, REPLICATED), REPLICATED)
        x = jax.ShapeDtypeStruct((rows, 512), "bfloat16", sharding=jax.NamedSharding(mesh, jax.P()))
        return cost.cost_of("product", call, (x, jax.ShapeDtypeStruct((512, 512), "bfloat16", sharding=x.sharding)),
                            1)

    first, again = cost_of(SLICE, 256), cost_of(SLICE, 256)
    assert len(compiles) == 1 and not first.kept and again.kept
    assert dataclasses.replace(again, kept=False) == first
    assert cost_of(SLICE, 128).xla_flops == pytest.approx(first.xla_flops / 2) and len(compiles) == 2
    assert not cost_of(chips.parse_slice("v6e-4"), 256).kept and len(compiles) == 3
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_tpu_example_flag=true")  # the compiler's flags are in the key
    assert not cost_of(SLICE, 256).kept and len(compiles) == 4
    monkeypatch.delenv("LIBTPU_INIT_ARGS")
    for entry in (tmp_path / "plans").glob("*.json"):
        entry.write_text(entry.read_text(encoding="utf-8")[:100], encoding="utf-8")
    assert cost_of(SLICE, 256) == first and len(compiles) == 5
    for _ in range(2):  # 16 GiB of input on a 15.75 GiB chip: refused by the compiler, then by the kept entry
        with pytest.raises(cost.CompileRefused, match="RESOURCE_EXHAUSTED"):
            cost_of(SLICE, 2**24)
    assert len(compiles) == 6
    entries = sorted((tmp_path / "plans").glob("*.json"))
    cpu = jax.sharding.Mesh(np.asarray(jax.devices("cpu")[:1]).reshape(1, 1), ("data", "model"))
    assert not cost_of(cpu, 256).kept and sorted((tmp_path / "plans").glob("*.json")) == entries  # not kept


@pytest.mark.parametrize("dtype,passes", [("bfloat16", 1), ("float32", 6)])
def test_a_float32_product_costs_six_mxu_passes(dtype, passes):
    """Every compiled call runs at "highest", where a TPU makes a float32 product from six bf16 passes (XLA's own
    estimate for the product below on v5e: 5.8x the bf16 one): the plan's compute time counts them."""
    from rmjax.compiled import REPLICATED, compiled

    mesh = chips.mesh_on(SLICE, 4, 1)
    call = compiled(lambda cfg, x, w: x @ w, _reward_config(), mesh, (REPLICATED, REPLICATED), REPLICATED)
    x = jax.ShapeDtypeStruct((256, 512), dtype, sharding=jax.NamedSharding(mesh, jax.P()))
    counted = cost.cost_of("product", call, (x, jax.ShapeDtypeStruct((512, 512), dtype, sharding=x.sharding)), 1)
    assert counted.flops == pytest.approx(2 * 256 * 512 * 512, rel=0.02) and counted.mxu_passes == passes
    chip = chips.CHIPS["v5e"]
    assert counted.terms(chip)["compute"] == pytest.approx(passes * counted.flops / chip.peak_flops)


def test_plan_picks_a_mesh_writes_the_plan_and_refuses_what_cannot_fit(tmp_path):
    config = tmp_path / "config.json"
    raw = tiny.hf_config("llama3", num_labels=1).to_dict()
    raw["architectures"] = ["LlamaForSequenceClassification"]
    config.write_text(json.dumps(raw))
    out = tmp_path / "plan.json"
    ok(run("plan", f"--model={config}", "--topology=v5e:2x2", "--job=sweep", f"--out={out}"))
    written = json.loads(out.read_text())
    assert written["chips"] == 4 and written["mesh"]["data"] * written["mesh"]["model"] == 4
    assert "fastest by realistic time" in written["why"] and written["predicted_seconds"] > 0
    assert written["per_chip_bytes"]["total"] <= written["hbm_bytes"]
    assert written["predicted_seconds"] == written["realistic_seconds"] >= written["lower_bound_seconds"] > 0
    assert written["accelerator_type"] == "v5litepod-4" and written["usd_on_demand"] > written["usd_spot"] > 0
    assert written["usd_on_demand"] == pytest.approx(written["realistic_seconds"] / 3600 * 4 * 1.20)
    # and a 70B-shaped model in float32 on four 16 GiB chips (in one interpreter: tests.cli.run_each)
    big = tmp_path / "big.json"
    raw.update(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
               num_key_value_heads=8, head_dim=128, vocab_size=128256)
    big.write_text(json.dumps(raw))
    exists, too_big = run_each(("plan", f"--model={config}", "--topology=v5e:2x2", f"--out={out}"),
                               ("plan", f"--model={big}", "--topology=v5e:2x2", "--job=sweep", "--dtype=float32",
                                f"--out={out}.big"))
    user_error(exists, "exists", "--overwrite")
    user_error(too_big, "15.75 GiB", "Cheapest that fit by estimate", "v5litepod-")
    assert not (tmp_path / "plan.json.big").exists()


@pytest.mark.parametrize("where, dtype", [("tpu", "bfloat16"), ("cpu", "bfloat16"), ("cpu", "float32")])
def test_the_jobs_memory_planner_agrees_with_xla_within_15_percent(where, dtype):
    """The estimate every sweep and beam prints before loading (rmjax.scoring.memory) against XLA's memory
    analysis of the compiled sweep call, for a real 2B architecture (on the CPU, bfloat16 weights get a float32
    copy: 2.6x the estimate before it counted that)."""
    from rmjax import zoo
    from rmjax.scoring import memory

    cfg = zoo.architecture_config(next(e for e in zoo.ZOO if e.nickname == "R-Gem-2B"))
    devices = chips.devices(chips.parse_slice("v5e-8")) if where == "tpu" else jax.devices("cpu")[:8]
    mesh = jax.sharding.Mesh(np.asarray(devices).reshape(2, 4), ("data", "model"))
    made = calls.sweep_calls(cfg, dtype, mesh, prompts=1, prefix_tokens=64, suffix_tokens=8, candidates=1024,
                             batch_size=1024)
    xla = max(cost.cost_of(c.name, c.call, c.args, 1).peak_bytes for c in made)
    planned = memory.estimate(cfg, dtype, 64, 9, 1024, 2, 4, backend=where)
    assert planned.total_bytes == pytest.approx(xla, rel=0.15)


def test_a_sweep_batchs_memory_after_a_long_prefix_is_mostly_its_attention_scores():
    """After a 4,096-token prefix most of a sweep batch's memory is attention: float32 scores over the prefix's
    keys, and their exponentials beside them. The estimate's batch bytes (what the sweep sizes its batch by) against
    XLA's scratch for the compiled sweep call on the CPU: not less (the batch would not fit), at most 15% more.
    Counting the scores once fell 20% under XLA's; at 64 tokens of prefix they are a few percent of the batch,
    which the total-memory test above cannot tell."""
    from rmjax import zoo
    from rmjax.scoring import memory

    cfg = zoo.architecture_config(next(e for e in zoo.ZOO if e.nickname == "R-Gem-2B"))
    mesh = jax.sharding.Mesh(np.asarray(jax.devices("cpu")[:8]).reshape(2, 4), ("data", "model"))
    _, score = calls.sweep_calls(cfg, "float32", mesh, prompts=1, prefix_tokens=4096, suffix_tokens=8,
                                 candidates=1024, batch_size=1024)
    width = score.args[1].k.shape[2]
    xla = cost.cost_of(score.name, score.call, score.args, 1).temp_bytes
    planned = memory.estimate(cfg, "float32", width, 9, 1024, 2, 4, backend="cpu")
    scores = 1024 // 2 * 9 * cfg.num_heads // 4 * (width + 9) * 4  # one float32 array of them, per device
    assert scores > 0.25 * xla  # they are what this test is about
    assert xla <= planned.batch_bytes <= 1.15 * xla, (planned.batch_bytes, xla)


def _matmul_params(cfg) -> int:
    """Weights a position's forward multiplies by (every layer's projections; not the embedding or head)."""
    return sum(d.size for p, d in nn.declarations(cfg).items() if p.startswith("layers.") and len(d.shape) > 2)


def test_gcg_step_compiles_for_v5e():
    """A GCG step's calls: the gradient (a forward and a backward to the one-hot inputs over the response and
    suffix, then the one-hot gradient [N, V]) at least does those matmuls' FLOPs, counted over every layer."""
    cfg = _reward_config(**ALIGNED)
    shape = GcgShape(prompts=2, prefix_tokens=40, suffix_tokens=5, num_tokens=8, steps=10, search_width=64,
                     eval_batch_size=256)
    option = compile_option(cfg, "bfloat16", SLICE, 2, 2, shape, 256)
    names = [c.name for c in option.costs]
    assert names == ["prefill", "gradient", "append_kv", "score_variants"]
    counts = {c.name: c.count for c in option.costs}
    assert counts["prefill"] == 2 and counts["gradient"] == counts["append_kv"] == 2 * 10
    grad = option.costs[1]
    positions = 8 + 5
    lower = 2 * 2 * _matmul_params(cfg) * positions + 2 * 8 * cfg.hidden_size * cfg.vocab_size
    assert grad.flops * 4 >= 0.95 * lower  # per chip: the work is split over 4 chips at most
    assert option.weights_bytes == _declared_per_chip(cfg, 2, 2)


def test_beam_compiles_every_level_with_the_jobs_counts():
    """Depth 2, K=4, both directions over 100 candidates: depth 1 scores them once after the prompt; depth 2
    extends 2 x 4 partials (8 rows a forward) and scores the 100 candidates after each."""
    cfg = _reward_config()
    shape = BeamShape(prompts=1, prefix_tokens=40, suffix_tokens=5, candidates=100, depth=2, beam=4)
    option = compile_option(cfg, "float32", SLICE, 2, 2, shape, 64)
    counts = {c.name: c.count for c in option.costs}
    assert counts == {"prefill": 1, "score_depth1": 2, "extend_depth2": 1, "row_depth2": 8, "score_depth2": 8 * 2}


def test_score_and_logprobs_compile_for_v5e():
    """Text scoring: a prefill per prompt and the texts in batches after it; log-probs: one forward of the LM with
    its vocabulary-wide head, whose output is prompts x vocab float32 on every chip."""
    from rmjax.plan.shapes import LogprobsShape, ScoreShape

    cfg = _reward_config(**ALIGNED)
    score = compile_option(cfg, "bfloat16", SLICE, 2, 2, ScoreShape(3, 40, 5, texts=1000, text_tokens=6,
                                                                    batch_size=256), 256)
    assert {c.name: c.count for c in score.costs} == {"prefill": 3, "score_texts": 3 * 4}
    lm = config_from_hf(tiny.hf_config("llama3", **ALIGNED).to_dict() | {"architectures": ["LlamaForCausalLM"]})
    (logprobs,) = compile_option(lm, "bfloat16", SLICE, 4, 1, LogprobsShape(3, 40), 3).costs
    assert logprobs.output_bytes >= 3 * lm.vocab_size * 4


def test_memory_planner_weights_match_the_placed_shards_with_more_model_chips_than_kv_heads():
    """`model:4` over 2 KV heads: K/V projections stay whole on every chip, as the loader places them."""
    from rmjax.scoring import memory

    cfg = _reward_config(**ALIGNED)
    assert cfg.num_kv_heads == 2
    mesh = jax.sharding.Mesh(np.asarray(jax.devices("cpu")[:8]).reshape(2, 4), ("data", "model"))
    placed = cost.shard_bytes(calls.abstract_params(cfg, "bfloat16", mesh))
    assert memory.param_bytes(cfg, "bfloat16", 4) == placed == _declared_per_chip(cfg, 2, 4)


def test_inspect_compiles_for_v5e_with_the_jobs_counts():
    """Two responses of 12 tokens: the lens and curve once, 65 path points in rounds of 16 per response, and the
    patching of every position of the embeddings and of 3 components x 4 layers, plus 2, in rounds of 32."""
    from rmjax.plan.shapes import InspectShape

    cfg = _reward_config()
    option = compile_option(cfg, "float32", SLICE, 2, 2, InspectShape(items=2, tokens=12, steps=64, batch_size=16),
                            16)
    counts = {c.name: c.count for c in option.costs}
    assert counts == {"lens": 1, "token_curve": 1, "attribution_path": 2 * 5, "patching_donor": 1,
                      "patching": math.ceil((12 * (1 + 3 * 4) + 2) / 32)}


def test_collectives_are_read_from_the_hlo_with_their_loops_trips():
    """A 10-layer scan of matmuls whose contracting dimension is split over 4 chips: each trip all-reduces its
    [256, 512] bf16 result (262,144 bytes) over the 4; the result is gathered once after the loop."""
    mesh = chips.mesh_on(SLICE, 1, 4)

    def stack(x, w):
        return jax.lax.scan(lambda h, wi: (jax.numpy.tanh(h @ wi), None), x, w)[0]

    split = jax.NamedSharding(mesh, jax.P(None, "model"))
    x = jax.ShapeDtypeStruct((256, 512), jax.numpy.bfloat16, sharding=split)
    w = jax.ShapeDtypeStruct((10, 512, 512), jax.numpy.bfloat16,
                             sharding=jax.NamedSharding(mesh, jax.P(None, "model", None)))
    compiled = jax.jit(stack, out_shardings=jax.NamedSharding(mesh, jax.P())).trace(x, w).lower().compile()
    found = {(c.kind, c.bytes, c.group, c.times) for c in cost.collectives(compiled.as_text())}
    assert ("all-reduce", 256 * 512 * 2, 4, 10) in found
    reduce = cost.Collective("all-reduce", 256 * 512 * 2, 4, 10)
    assert reduce.seconds(1e9) == pytest.approx(10 * 2 * 3 / 4 * 256 * 512 * 2 / 1e9)  # a ring: 2(n-1)/n


def test_only_slices_cloud_tpu_sells_are_planned():
    """v5e:3x3 was planned as "v5litepod-9", v6e:16x32 as "v6e-512" (the pod has 256 chips), v5p-2 and v4-4 (the
    smallest sold are v5p-8 and v4-8) and a 3-D v5e were named and priced too."""
    from rmjax.errors import UsageError

    for name in ("v5e:3x3", "v5e:2x2x2", "v6e:16x32", "v6e:1x2", "v5p-2", "v4-4", "v4:1x1x1", "v5p:2x2"):
        with pytest.raises(UsageError, match="slice table has no such"):
            chips.parse_slice(name)
    assert [chips.parse_slice(n).accelerator_type for n in ("v5e:2x4", "v4:2x2x1", "v5p-8", "v6e-256", "v5e-1")] == [
        "v5litepod-8", "v4-8", "v5p-8", "v6e-256", "v5litepod-1"]
    # slices past 128 chips that Cloud TPU sells (v5p-512 was refused as no slice), by their default shapes
    assert [chips.parse_slice(n).topology for n in ("v5p-512", "v4-1024", "v5p-12288", "v4-8192", "v4:8x8x16")] == [
        "v5p:4x8x8", "v4:8x8x8", "v5p:16x16x24", "v4:16x16x16", "v4:8x8x16"]
    for name in ("v4-12288", "v5p-16384", "v5p:16x16x32"):
        with pytest.raises(UsageError, match="slice table has no such"):
            chips.parse_slice(name)


@pytest.mark.parametrize("topology", ["v5e-1", "v6e-1"])
def test_one_chip_slices_plan_like_the_others(topology, tmp_path):
    """libtpu's host bounds for a one-chip slice. A batch of 64 given: the default's 128 compiles 2.4 s longer,
    and picking a batch is another test's."""
    config = tmp_path / "config.json"
    raw = tiny.hf_config("llama3", num_labels=1).to_dict() | {"architectures": ["LlamaForSequenceClassification"]}
    config.write_text(json.dumps(raw))
    ok(run("plan", f"--model={config}", f"--topology={topology}", "--job=sweep", "--batch_size=64",
           f"--out={tmp_path / 'p.json'}"))
    written = json.loads((tmp_path / "p.json").read_text())
    assert written["chips"] == 1 and written["accelerator_type"] == topology.replace("v5e", "v5litepod")
    assert written["collective_seconds"] == 0


def test_an_8b_sweep_on_v6e_8_is_compute_bound_near_its_flops_at_peak(tmp_path):
    """2 x parameters x positions at peak is the least a sweep can take; the plan's lower bound must be that to
    within 20% (the head, attention to the prefix and padding are the rest), and compute-bound."""
    from rmjax import zoo

    out = tmp_path / "p.json"
    ok(run("plan", "--model=Skywork/Skywork-Reward-Llama-3.1-8B-v0.2", "--topology=v6e-8", "--job=sweep",
           "--prompts=greatest", "--dtype=bfloat16", "--mesh=data:8,model:1", "--batch_size=4096", f"--out={out}"))
    p = json.loads(out.read_text())
    cfg = zoo.architecture_config(next(e for e in zoo.ZOO if e.nickname == "S-Lla-8B-v0.2"))
    params = sum(d.size for name, d in nn.declarations(cfg).items() if "embed" not in name)
    candidates = cfg.vocab_size
    floor = 2 * params * p["positions_per_candidate"] * candidates / (8 * chips.CHIPS["v6e"].peak_flops)
    assert p["bound"] == "compute" and p["lower_bound_seconds"] == pytest.approx(floor, rel=0.2)
    assert p["realistic_seconds"] > p["lower_bound_seconds"]


def test_a_70b_on_one_v5e_chip_is_refused_naming_cloud_accelerator_types():
    user_error(run("plan", "--model=llama-3.1-70b", "--topology=v5e-1", "--job=sweep", "--dtype=bfloat16",
                   "--prompts=greatest"), "v5litepod-1", "Cheapest that fit by estimate", "/h on demand")


def test_a_training_plan_turns_to_fsdp_when_the_replicated_state_does_not_fit(tmp_path):
    """A full fine-tune of a 1.4B-parameter shape on v5litepod-4: its 2.7 GB of bfloat16 weights with their float32
    master and Adam's two float32 moments (17.5 GiB) cannot sit whole on each 15.75 GiB chip; split over `data`
    (FSDP) they fit. With FSDP forbidden the refusal counts that state in the slices it names. (88 narrow layers,
    not 6 of 4096: the layers are one scan, and the TPU compile is 22 s cold, not 51; FSDP fits without remat, so
    the plan compiles one variant, not two.)"""
    config = tmp_path / "config.json"
    raw = tiny.hf_config("llama3", num_labels=1).to_dict() | {"architectures": ["LlamaForSequenceClassification"]}
    raw.update(hidden_size=1024, intermediate_size=3584, num_hidden_layers=88, num_attention_heads=8,
               num_key_value_heads=8, head_dim=128, vocab_size=32768)
    config.write_text(json.dumps(raw))
    flags = [f"--model={config}", "--topology=v5e-4", "--job=train_rm", "--trainable=full", "--dtype=bfloat16",
             "--mesh=data:4,model:1", "--batch_size=8", "--sequence_tokens=32", "--n_train=100"]
    out = tmp_path / "p.json"
    said = ok(run("plan", *flags, f"--out={out}"))
    p = json.loads(out.read_text())
    assert p["assumed"]["fsdp"] and "does not fit without FSDP" in p["why"]
    # the flags train_rm needs for it are said (its defaults are off; a plan that needed remat said only its mesh)
    assert f"batch 8 with --fsdp{' --remat' if p['assumed']['remat'] else ''};" in said.stdout, said.stdout
    assert p["per_chip_bytes"]["total"] <= p["hbm_bytes"] and p["collective_seconds"] > 0
    # a refusal's "cheapest that fit" counts the trained weights, gradients, Adam's two moments and (bfloat16) the
    # float32 master: each slice it names holds 2 + 2 + 4 + 4 + 4 = 16 bytes a trained parameter across its chips
    # (at most 80% of their HBM used), with FSDP and remat
    from rmjax.plan.planner import _smallest_fit
    from rmjax.plan.spec import plan_inputs

    cfg, _, shape, _ = plan_inputs(str(config), "v5e-4", "train_rm", trainable="full", batch_size=8,
                                   sequence_tokens=32, n_train=100)
    trained = sum(d.size for name, d in nn.declarations(cfg).items() if "embed" not in name)
    frozen = sum(d.size for name, d in nn.declarations(cfg).items() if "embed" in name)
    # the replicated variant is not compiled: its weights and Adam state alone (each trained weight, its float32
    # master and Adam's two moments: 2 + 4 + 4 + 4 bytes; the frozen embeddings 2) pass the chip's HBM. That lower
    # bound stays under XLA's own figure for the variant the plan compiled and chose
    alone = f"{(trained * 14 + frozen * 2) / 2**30:.1f} GiB"
    assert alone == "17.5 GiB"  # over the chip's 15.75
    assert said.stdout.count(f"its weights and optimizer state alone take {alone} per chip") == 1, said.stdout
    chosen = dataclasses.replace(shape, fsdp=True, remat=p["assumed"]["remat"])
    assert 0 < chosen.resident_bytes(cfg, "bfloat16", 4, 1) <= p["per_chip_bytes"]["total"]
    named = _smallest_fit(cfg, "bfloat16", shape)
    # the bound's parts: frozen embeddings whole on a chip (model:1); with FSDP each trained weight, its float32
    # master and Adam's two moments (2 + 4 + 4 + 4 bytes) split over the 4 chips
    assert chosen.resident_bytes(cfg, "bfloat16", 4, 1) == int(frozen * 2 + trained * 14 / 4)
    for name in (part.split(" (")[0] for part in named.removeprefix("Cheapest that fit by estimate: ").split("), ")):
        piece = chips.parse_slice(name)
        assert piece.chips * 0.8 * piece.chip.hbm_bytes >= 16 * trained, named
    assert "--remat" in named and "data:1,model:1 --fsdp" not in named and "data:1,model:4 --fsdp" not in named
    # only flags train_rm takes for that run: no --fsdp without a data axis, neither for head-only training
    assert shape.per_chip_estimate(cfg, "bfloat16", 8, 2)[1] == "--mesh=data:4,model:2 --fsdp --remat"
    assert shape.per_chip_estimate(cfg, "bfloat16", 8, 8)[1] == "--mesh=data:1,model:8 --remat"
    _, _, head, _ = plan_inputs(str(config), "v5e-4", "train_rm", trainable="head", batch_size=8, n_train=100)
    assert head.per_chip_estimate(cfg, "bfloat16", 8, 2)[1] == "--mesh=data:4,model:2"
    # --responses' default is what train_rm --elo=builtin keeps, counted here from the shipped data: a head-only
    # run's features of the training and the held-out pairs' responses (it counted the training items alone),
    # last_k's states of the training pairs' responses
    from rmjax.train.data import elo_csv, elo_pairs

    def distinct(*parts) -> int:
        return len({(p, r) for part in parts for p, c, j in zip(part.prompt, part.chosen, part.rejected, strict=True)
                    for r in (c, j)})

    train, held = elo_pairs(elo_csv("builtin"), 20000, 4000, seed=0)
    assert distinct(train, held) <= head.responses <= distinct(train, held) * 1.01
    _, _, last, _ = plan_inputs(str(config), "v5e-4", "train_rm", trainable="last_k", batch_size=8, n_train=100)
    assert distinct(train) <= last.responses <= distinct(train) * 1.01
    # --sequence_tokens' default: the prompts' prefix and 32 response tokens (a fixed 64 left a 64-token prefix none)
    assert last.prefix_tokens > 0 and last.sequence_tokens == last.prefix_tokens + 32
    # a head-only run's feature pass is sized by --text_tokens, the others' steps by --sequence_tokens: the other
    # is refused, not ignored
    head_only, full = run_each(("plan", *flags[:3], "--trainable=head", "--sequence_tokens=32"),
                               ("plan", *flags[:3], "--trainable=full", "--text_tokens=9"))
    user_error(head_only, "--sequence_tokens: plan --job=train_rm --trainable=head does not read it")
    user_error(full, "--text_tokens: plan --job=train_rm --trainable=full does not read it")


def test_each_host_reads_its_chips_shards_of_the_checkpoint():
    """v5p-16: 8 chips on 2 hosts of 4. With model:8 each host's chips hold half of every split weight and all of
    each replicated one; the peak adds the largest weight in float32."""
    from rmjax.plan.host import host_side

    cfg = _reward_config("llama3", **ALIGNED)
    split = replicated = 0
    for d in nn.declarations(cfg).values():
        size = d.size * (4 if d.float32 else 2)
        if any(sharding.RULES.get(a) == "model" and n % 8 == 0 for a, n in zip(d.axes, d.shape, strict=True) if a):
            split += size
        else:
            replicated += size
    side = host_side(cfg, "bfloat16", chips.parse_slice("v5p-16"), 8, _declared_per_chip(cfg, 2, 8))
    assert (side["hosts"], side["chips_per_host"]) == (2, 4)
    assert side["checkpoint_bytes_per_host"] == pytest.approx(replicated + split / 2, abs=1)
    largest = max(d.size for d in nn.declarations(cfg).values())
    assert side["host_ram_peak_bytes"] == pytest.approx(replicated + split / 2 + 4 * largest, abs=1)
    assert side["fits_host_ram"] and side["host_ram_bytes"] == 448 * 10**9
    # a multi-host v6e slice is made of 4-chip VMs (ct6e-standard-4t, 720 GB), not of the single host's 8
    side = host_side(cfg, "bfloat16", chips.parse_slice("v6e-16"), 8, _declared_per_chip(cfg, 2, 8))
    assert (side["hosts"], side["chips_per_host"], side["host_ram_bytes"]) == (4, 4, 720 * 10**9)
    assert side["checkpoint_bytes_per_host"] == pytest.approx(replicated + split / 2, abs=1)
    side = host_side(cfg, "bfloat16", chips.parse_slice("v6e-8"), 8, _declared_per_chip(cfg, 2, 8))
    assert (side["hosts"], side["chips_per_host"], side["host_ram_bytes"]) == (1, 8, 1440 * 10**9)


def test_fsdp_and_remat_change_the_training_step():
    """--fsdp and --remat act on the step train_rm runs (the plan's calls build it as train_rm does, through
    trainable_part and Steps): split over data:4, each chip's arguments hold a quarter of every trained weight and
    of Adam's two moments (3 x the trained float32 bytes, less a quarter), and with remat the traced step
    recomputes each layer (a remat in the scan body, saving nothing); with FSDP alone, only what is not a matmul's
    output (the gathered weights among it: saved, they were a copy of every layer's); with neither, nothing. No
    compile: shapes and the jaxpr."""
    from rmjax.plan import calls as plan_calls

    cfg = _reward_config(**ALIGNED)
    trained = 4 * sum(d.size for name, d in nn.declarations(cfg).items() if "embed" not in name)
    mesh = chips.mesh_on(SLICE, 4, 1)
    made = {}
    for fsdp, remat in ((False, False), (True, False), (True, True)):
        (made[fsdp, remat],) = plan_calls.train_calls(cfg, "float32", mesh, trainable="full", last_k=1, steps=1,
                                                      batch_size=32, pairs=64, responses=1, sequence_tokens=64,
                                                      fsdp=fsdp, remat=remat)
    whole, split = (cost.shard_bytes(made[key].args) for key in ((False, False), (True, False)))
    assert whole - split == pytest.approx((3 / 4) * 3 * trained, rel=0.01)

    def policies(call) -> set[str]:
        return set(re.findall(r"policy=(\S+)", str(call.call.trace(*call.args).jaxpr)))

    assert policies(made[True, True]) == {"None"}
    assert policies(made[True, False]) == {"DotsSaveable(only_if_no_batch_dims=True)"}
    assert policies(made[False, False]) == set()


def test_the_plan_refuses_a_logprobs_prompt_exactly_where_the_job_does(lm_folder, tmp_path):
    """A fault hunt: the plan counted a logprobs prompt's prefix and template tail, the job one response token more,
    so a prompt filling the context was planned and then refused by the job. A log-prob reads the prefix alone: both
    now accept a prompt whose prefix and tail fill the context exactly, and both refuse one token more."""
    from rmjax.errors import RmjaxError
    from rmjax.loading import config_and_tokenizer
    from rmjax.plan.spec import plan_inputs
    from rmjax.scoring.logprobs import LogprobsSpec, run_logprobs
    from rmjax.text.chat import split_chat
    from tests import inproc

    cfg, tokenizer = config_and_tokenizer(str(lm_folder))

    def used(text: str) -> int:
        split = split_chat(tokenizer, text, "auto", None, 0)
        return len(split.prefix) + len(split.suffix)

    context = cfg.max_position_embeddings
    fits = next(t for n in range(400, 520) for t in ("word " * n + "end", "word " * n + "it", "word " * n)
                if used(t) == context)  # the prefix and tail fill the context: no room for a response token
    over = fits + " word word"
    assert used(over) > context
    def accepted(attempt) -> bool:
        try:
            attempt()
        except RmjaxError:
            return False
        return True

    for name, text in (("fits", fits), ("over", over)):
        planned = accepted(lambda t=text: plan_inputs(str(lm_folder), "v5e-1", "logprobs", prompts=(),
                                                      extra_prompts=[f"p={t}"]))
        ran = accepted(lambda t=text, n=name: run_logprobs(
            LogprobsSpec(inproc.options(lm_folder, tmp_path / f"{n}.csv"), {"p": t})))
        assert [planned, ran] == [name == "fits"] * 2, (name, planned, ran, used(text))
