"""The completion check in a search's plan: a tied reward model, or the job's --lm, completes its written responses
(beam, GCG), a greedy decode whose every step reads logits over the whole vocabulary. A plan without it said a job
fit that then ran out of memory after its search, at its end; one without the --lm, loaded beside the RM for the
whole job, counted one model of two."""

from __future__ import annotations

import dataclasses
import math

import jax
import pytest

from rmjax.plan import chips
from rmjax.plan.planner import compile_option
from rmjax.plan.shapes import BeamShape, GcgShape
from rmjax.plan.spec import model_config
from rmjax.text.chat import split_chat
from tests import inproc, tiny
from tests.test_plan import ALIGNED, _matmul_params, _reward_config


def _one_device() -> jax.sharding.Mesh:
    import numpy as np

    return jax.sharding.Mesh(np.asarray(jax.devices("cpu")[:1]).reshape(1, 1), ("data", "model"))


def _greedy_calls(monkeypatch) -> list[tuple[int, int, tuple]]:
    """The job's greedy decodes, each (prefix cache width, cap, ids' shape), from a spy on the builder it calls."""
    from rmjax.search import completion

    made, real = [], completion.greedy_call

    def spy(cfg, mesh, prefix_width, max_new):
        call = real(cfg, mesh, prefix_width, max_new)

        def counted(params, cache, ids, mask, end):
            made.append((prefix_width, max_new, tuple(ids.shape)))
            return call(params, cache, ids, mask, end)

        return counted

    monkeypatch.setattr(completion, "greedy_call", spy)
    return made


@pytest.fixture(scope="module")
def tied_rm(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tied") / "rm"
    return tiny.save_reward_model_with_tokenizer(folder, tie_word_embeddings=True)[1]


def test_a_tied_rms_beam_plan_completes_what_the_job_completes(tied_rm, tmp_path, monkeypatch):
    """The job's own greedy calls (counted by a spy on the builder it calls) against the plan's: as many calls, the
    same rows, widths, prefix cache and cap. Depth 2, beam 4, one direction over 30 candidates: 30 + 4 x 30 written
    rows, 100 of depth 2 checked (CHECKED_ROWS), 130 responses in batches of 64: 3 calls."""
    from rmjax.search.beam import BeamConfig
    from rmjax.search.beam_job import BeamSpec, run_beam

    made = _greedy_calls(monkeypatch)
    candidates = tuple(range(1000, 1030))
    run_beam(BeamSpec(inproc.options(tied_rm, tmp_path / "beam.csv"), inproc.prompts("greatest"),
                      BeamConfig(depth=2, beam=4, direction="optimal"), candidates))
    assert len(made) == 3

    cfg, tokenizer = model_config(str(tied_rm))
    split = split_chat(tokenizer, inproc.prompts("greatest")["greatest"], "auto")
    shape = BeamShape(prompts=1, prefix_tokens=len(split.prefix), suffix_tokens=len(split.suffix),
                      candidates=len(candidates), depth=2, beam=4, direction="optimal")
    assert shape.written_responses() == 130
    mesh = _one_device()
    planned = {c.name: c for c in shape.calls(cfg, "float32", mesh, 64)}
    complete = planned["complete"]
    assert complete.count == len(made)
    prefix_width, max_new, rows = made[0]
    assert complete.args[1].k.shape[2] == prefix_width  # the prefix cache the job prefilled
    assert complete.args[2].shape == rows  # the first (fullest) batch's rows and width
    assert complete.loop_trips == max_new - 1
    assert planned["completed_score_texts"].count == math.ceil(130 / 256)


def test_an_untied_rm_plans_no_completion_and_gcg_completes_its_buffer():
    """An untied RM's job skips the check (no LM head without --lm), so its plan has none; a tied one's GCG plan
    scores and completes the buffer (8 sequences by default) once per prompt."""
    shape = GcgShape(prompts=2, prefix_tokens=40, suffix_tokens=5, num_tokens=8, steps=10, search_width=64,
                     eval_batch_size=256)
    mesh = _one_device()
    untied = [c.name for c in shape.calls(_reward_config(**ALIGNED), "float32", mesh, 256)]
    assert untied == ["prefill", "gradient", "append_kv", "score_variants"]
    tied = {c.name: c for c in shape.calls(_reward_config(**ALIGNED, tie_word_embeddings=True), "float32", mesh, 256)}
    assert tied["complete"].count == 2 and tied["complete"].args[2].shape == (8, 16)
    assert tied["score_responses"].count == 2 and tied["score_responses"].args[2].shape == (8, 8)


def test_a_tied_rms_gcg_plan_scores_and_completes_the_buffer_the_job_keeps(tied_rm, tmp_path, monkeypatch):
    """The plan planned the default buffer of 8 whatever --buffer_size said, and not its scoring before the check.
    The job's own calls (spies on the builders it calls) against the plan's, at --buffer_size=20: one scoring call
    of 32 rows (20 rounded up to a power of two) after the prompt's cache, and one greedy call of 20 rows."""
    from rmjax.scoring import prefix
    from rmjax.search import gcg_job
    from rmjax.search.gcg_config import GCGConfig

    greedy, scored, inside = _greedy_calls(monkeypatch), [], []
    real_scorer, real_score = prefix.batch_scorer, gcg_job.score_responses

    def scorer_spy(cfg, mesh, cache_width, *args, **kwargs):
        call = real_scorer(cfg, mesh, cache_width, *args, **kwargs)

        def counted(params, cache, rows, *rest):
            if inside:  # the buffer's scoring, not the search's
                scored.append((cache_width, tuple(rows.shape)))
            return call(params, cache, rows, *rest)

        return counted

    def score_spy(*args, **kwargs):
        inside.append(True)
        try:
            return real_score(*args, **kwargs)
        finally:
            inside.pop()

    monkeypatch.setattr(prefix, "batch_scorer", scorer_spy)
    monkeypatch.setattr(gcg_job, "score_responses", score_spy)
    config = GCGConfig(num_tokens=2, steps=4, search_width=32, topk=16, buffer_size=20, seed=0)
    result = gcg_job.run_gcg(gcg_job.GcgSpec(inproc.options(tied_rm, tmp_path / "gcg.json"), inproc.prompts("greatest"),
                                             config))
    assert len(result.buffer) == 20 and len(greedy) == 1 and len(scored) == 1

    from rmjax.plan.spec import plan_inputs

    # as experiments.plan --buffer_size=20 builds it
    cfg, _, shape, _ = plan_inputs(str(tied_rm), "v5e-1", "gcg", num_tokens=2, steps=4, search_width=32,
                                   buffer_size=20)
    assert shape.buffer_size == 20
    planned = {c.name: c for c in shape.calls(cfg, "float32", _one_device(), 256)}
    plan_scored = planned["score_responses"]
    assert plan_scored.count == len(scored)
    assert (plan_scored.args[1].k.shape[2], plan_scored.args[2].shape) == scored[0] == (scored[0][0], (32, 2))
    assert planned["complete"].count == len(greedy) and planned["complete"].args[2].shape == greedy[0][2]


def test_the_completion_is_costed_with_its_logits_and_every_decode_step():
    """On v5e:2x2 (data 2, model 2): the decode's peak holds at least its float32 logits over the vocabulary for a
    chip's rows, and its FLOPs count every step: the layers' products over the 64 rows' 16 prefilled positions and
    one position a row at each of the 31 steps after the first (and the logits of all 32), split over the 4 chips.
    Counted as XLA counts a while loop (its body once), it was 36% of that."""
    cfg = _reward_config(**ALIGNED, tie_word_embeddings=True)
    shape = BeamShape(prompts=1, prefix_tokens=40, suffix_tokens=5, candidates=100, depth=2, beam=4)
    option = compile_option(cfg, "bfloat16", chips.parse_slice("v5e:2x2"), 2, 2, shape, 64)
    complete = next(c for c in option.costs if c.name == "complete")
    rows = 64 // 2  # a chip's rows of a batch over data 2
    assert complete.peak_bytes >= rows * cfg.vocab_size * 4 // 2  # logits, the vocabulary over model 2 at most
    positions = 64 * 16 + 64 * 31
    least = 2 * positions * _matmul_params(cfg) + 2 * 64 * 32 * cfg.hidden_size * cfg.vocab_size
    assert complete.flops * 4 >= 0.95 * least


def test_a_beam_plan_with_lm_decodes_with_the_lm_and_holds_both_models(rm_folder, lm_folder, tmp_path, monkeypatch):
    """The plan had no --lm: an untied RM's beam with --lm (the completion check of an RM that ties no LM head, as
    Llama's) was planned with no check and without the LM, which the job loads beside the RM for the whole run. The
    job's own greedy calls (a spy) against the plan's: the LM's calls as many, of the same rows and prefix (the LM's
    own template makes it longer than the RM's: sized by the RM's, it was planned at 64 of the job's 224 positions);
    the LM's weights (bytes of the loaded LM) beside each of the RM's calls, and the RM's (bytes of the loaded RM)
    beside the LM's."""
    import jax.numpy as jnp

    from rmjax.errors import UsageError
    from rmjax.loading import load
    from rmjax.plan.cost import shard_bytes
    from rmjax.plan.spec import plan_inputs
    from rmjax.search.beam import BeamConfig
    from rmjax.search.beam_job import BeamSpec, run_beam
    from tests import cli

    lm_folder = cli.copy_folder(lm_folder, tmp_path / "lm")  # the same tokenizer, a longer template
    template = lm_folder / "chat_template.jinja"
    template.write_text("{{ 'Think it through, step by step. ' * 24 }}" + template.read_text())
    made = _greedy_calls(monkeypatch)
    run_beam(BeamSpec(inproc.options(rm_folder, tmp_path / "beam.csv"), inproc.prompts("greatest"),
                      BeamConfig(depth=2, beam=4, direction="optimal"), tuple(range(1000, 1030)), lm=str(lm_folder)))
    assert len(made) == 3  # 130 responses in batches of 64

    cfg, _, shape, _ = plan_inputs(str(rm_folder), "v5e-1", "beam", limit=30, depth=2, beam=4, direction="optimal",
                                   lm=str(lm_folder))
    assert shape.lm_prefix_tokens > shape.prefix_tokens
    assert shape.candidates == 30
    planned = shape.calls(cfg, "float32", _one_device(), 64)
    by_name = {c.name: c for c in planned}
    complete = by_name["complete"]
    assert complete.count == len(made) and (complete.args[1].k.shape[2], complete.args[2].shape) == made[0][::2]

    def loaded_bytes(folder) -> int:
        return sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(load(str(folder)).params)
                   if isinstance(a, jax.Array | jnp.ndarray))

    lm_bytes, rm_bytes = loaded_bytes(lm_folder), loaded_bytes(rm_folder)
    assert shard_bytes(complete.weights) == lm_bytes != rm_bytes
    for call in planned:
        theirs = {"complete": rm_bytes, "completion_prefill": rm_bytes}.get(call.name, lm_bytes)
        assert shard_bytes(call.beside) == theirs, call.name
    # with several prompts, the longest one's prefix in the LM's own template (split_chat on its tokenizer)
    from rmjax.loading import config_and_tokenizer

    texts = {"short": "Hi?", "long": "Name, in one word and after long thought, the greatest thing there ever was?"}
    _, _, several, _ = plan_inputs(str(rm_folder), "v5e-1", "beam", prompts=(), limit=30,
                                   extra_prompts=[f"{k}={v}" for k, v in texts.items()], lm=str(lm_folder))
    lm_tokenizer = config_and_tokenizer(str(lm_folder))[1]
    assert several.lm_prefix_tokens == max(len(split_chat(lm_tokenizer, t, "auto").prefix) for t in texts.values())
    # refused as the job refuses it: an LM without an LM head
    with pytest.raises(UsageError, match="has no LM head"):
        plan_inputs(str(rm_folder), "v5e-1", "beam", limit=30, lm=str(rm_folder))
    # and an LM of another tokenizer (the builtin Gemma 3 RM ties its LM head), by the job's own message
    other = "elo-rm-gemma3-270m"
    with pytest.raises(UsageError, match="has another tokenizer than") as planned_refusal:
        plan_inputs(str(rm_folder), "v5e-1", "beam", limit=30, lm=other)
    with pytest.raises(UsageError, match="has another tokenizer than") as job_refusal:
        run_beam(BeamSpec(inproc.options(rm_folder, tmp_path / "other.csv"), inproc.prompts("greatest"),
                          BeamConfig(depth=2, beam=4, direction="optimal"), tuple(range(1000, 1030)), lm=other))
    assert str(planned_refusal.value) == str(job_refusal.value)


def test_a_plan_with_lm_states_the_rms_weights_and_reads_both_checkpoints():
    """With an --lm the plan's per-chip weights were the larger model's (the LM's decode call), and the host side
    read the RM's checkpoint alone. On v5e:2x2 (one host of 4 chips) the host reads every byte of both: the LM's
    bytes are its declared parameters' (zoo.abstract_params), counted apart from the plan."""
    import numpy as np

    from rmjax import zoo
    from rmjax.hf_config import config_from_hf
    from rmjax.plan.planner import plan

    rm = _reward_config(**ALIGNED)
    raw = tiny.hf_config("llama3", **ALIGNED).to_dict() | {"architectures": ["LlamaForCausalLM"]}
    lm = config_from_hf(raw | {"num_hidden_layers": 2 * rm.num_layers})  # larger: the max of both was shown
    shape = BeamShape(prompts=1, prefix_tokens=40, suffix_tokens=5, candidates=100, depth=2, beam=4)
    piece, mesh = chips.parse_slice("v5e:2x2"), {"data": 2, "model": 2}
    alone = plan(rm, "bfloat16", piece, "beam", shape, mesh, 64, log=lambda *_: None)
    both = plan(rm, "bfloat16", piece, "beam", dataclasses.replace(shape, lm=lm), mesh, 64, log=lambda *_: None)
    assert both["per_chip_bytes"]["weights"] == alone["per_chip_bytes"]["weights"]
    lm_bytes = sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize
                   for a in jax.tree.leaves(zoo.abstract_params(lm, jax.numpy.bfloat16)))
    added = both["host"]["checkpoint_bytes_per_host"] - alone["host"]["checkpoint_bytes_per_host"]
    assert added == lm_bytes, (added, lm_bytes)
    # and loading it: its bytes at least on the host's RAM peak (an upper bound, both loads added)
    assert both["host"]["host_ram_peak_bytes"] - alone["host"]["host_ram_peak_bytes"] >= lm_bytes
    assert both["per_chip_bytes"]["total"] > alone["per_chip_bytes"]["total"]
