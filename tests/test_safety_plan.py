"""Issue 42: a model config is checked in one place (config_from_hf), whatever file it comes from, and a plan
refuses what its job would refuse, by the job's own checks, before anything compiles.

Each refusal is one line `error: …` with status 2 and no traceback. The plan's refusals come from
rmjax.plan.spec.plan_inputs, which experiments.plan calls with its flags before `plan` compiles anything: they are
checked in-process (tests/inproc.py `refused`, as the entry point would print them); what only the command does (its
flag parser, its --out check) runs as the command, where "before anything compiles" is read off the plan's output:
it prints one `plan: data:…` line per mesh it has compiled.
"""

from __future__ import annotations

import json
import math
import re

import pytest

from rmjax.errors import CheckpointError, UsageError
from rmjax.hf_config import config_from_hf, load_config_file
from rmjax.plan.chips import parse_slice
from tests import cli, inproc, tiny
from tests.cli import run, run_each, user_error

ARCHITECTURES = {"llama3": "LlamaForSequenceClassification", "gemma2": "Gemma2ForSequenceClassification",
                 "gemma3": "Gemma3TextForSequenceClassification"}


def _raw(name: str = "llama3", **changes) -> dict:
    """A tiny reward model's config.json (as transformers writes it), with `changes`."""
    raw = tiny.hf_config(name, num_labels=1).to_dict()
    raw["architectures"] = [ARCHITECTURES[name]]
    raw.update(changes)
    return raw


def _config_file(tmp_path, name: str = "llama3", **changes):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_raw(name, **changes)))
    return path


# (family, field, value, what the one line says of it): every value no model can have
BAD_FIELDS = [
    ("llama3", "num_hidden_layers", True, "num_hidden_layers=true must be an integer >= 1"),
    ("llama3", "num_hidden_layers", 4.5, "num_hidden_layers=4.5 must be an integer >= 1"),
    ("llama3", "num_hidden_layers", 4.0, "num_hidden_layers=4.0 must be an integer >= 1"),
    ("llama3", "num_hidden_layers", 0, "num_hidden_layers=0 must be an integer >= 1"),
    ("llama3", "num_hidden_layers", -1, "num_hidden_layers=-1 must be an integer >= 1"),
    ("llama3", "hidden_size", -64, "hidden_size=-64 must be an integer >= 1"),
    ("llama3", "hidden_size", "64", 'hidden_size="64" must be an integer >= 1'),
    ("llama3", "intermediate_size", 0, "intermediate_size=0 must be an integer >= 1"),
    ("llama3", "head_dim", 0, "head_dim=0 must be an integer >= 1"),
    ("llama3", "vocab_size", 0, "vocab_size=0 must be an integer >= 1"),
    ("llama3", "num_attention_heads", 0, "num_attention_heads=0 must be an integer >= 1"),
    ("llama3", "num_key_value_heads", 0, "num_key_value_heads=0 must be an integer >= 1"),
    ("llama3", "num_key_value_heads", 3, "num_key_value_heads=3 does not divide num_attention_heads=4"),
    ("llama3", "max_position_embeddings", 0, "max_position_embeddings=0 must be an integer >= 1"),
    ("llama3", "rms_norm_eps", 0, "rms_norm_eps=0 must be a finite number > 0"),
    ("llama3", "rms_norm_eps", -1e-6, "rms_norm_eps=-1e-06 must be a finite number > 0"),
    ("llama3", "rms_norm_eps", math.inf, "rms_norm_eps=Infinity must be a finite number > 0"),
    ("llama3", "rope_parameters", {"rope_type": "default", "rope_theta": 0},
     "rope_parameters.rope_theta=0 must be a finite number > 0"),
    ("llama3", "num_labels", 0, "num_labels=0 must be an integer >= 1"),
    ("gemma2", "sliding_window", 0, "sliding_window=0 must be an integer >= 1"),
    ("gemma2", "attn_logit_softcapping", 0, "attn_logit_softcapping=0 must be a finite number > 0"),
    ("gemma2", "final_logit_softcapping", -30.0, "final_logit_softcapping=-30.0 must be a finite number > 0"),
    ("gemma2", "query_pre_attn_scalar", 0, "query_pre_attn_scalar=0 must be a finite number > 0"),
]


@pytest.mark.parametrize("name, field, value, says", BAD_FIELDS,
                         ids=[f"{n}-{f}={v!r}" for n, f, v, _ in BAD_FIELDS])
def test_config_from_hf_refuses_a_value_no_model_can_have(name, field, value, says):
    with pytest.raises(CheckpointError) as refused:
        config_from_hf(_raw(name, **{field: value}), source="where/config.json")
    message = str(refused.value)
    assert message.startswith("where/config.json: ") and says in message, message
    assert "\n" not in message


def test_config_from_hf_refuses_head_dim_0_from_too_few_hidden_units():
    """No head_dim given: hidden_size // num_attention_heads is 0 (a ZeroDivisionError before)."""
    raw = _raw(hidden_size=2)
    del raw["head_dim"]
    with pytest.raises(CheckpointError, match="hidden_size=2 is less than num_attention_heads=4"):
        config_from_hf(raw)


def test_config_from_hf_names_a_missing_field_and_a_nested_one():
    raw = _raw()
    del raw["num_hidden_layers"]
    with pytest.raises(CheckpointError, match="no num_hidden_layers"):
        config_from_hf(raw)
    # Gemma 3's multimodal config keeps the text model in text_config: the line names the path to the field
    outer = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
             "text_config": _raw("gemma3", num_hidden_layers=0)}
    with pytest.raises(CheckpointError, match=r"text_config\.num_hidden_layers=0 must be an integer >= 1"):
        config_from_hf(outer)


def test_valid_configs_still_build(tmp_path):
    """The checks refuse nothing a real config has: every tiny family, a v4-style file and the zoo's architectures."""
    from rmjax import zoo

    for name in ARCHITECTURES:
        cfg = load_config_file(_config_file(tmp_path, name))
        assert cfg.num_layers == 4 and cfg.num_heads % cfg.num_kv_heads == 0
    assert load_config_file(_config_file(tmp_path, "gemma2")).sliding_window == 4
    for entry in zoo.ZOO:
        assert zoo.architecture_config(entry).num_layers > 0


def test_loading_a_folder_refuses_a_bad_config_in_one_line(rm_folder, tmp_path, monkeypatch):
    """Heads that the KV heads do not divide: a traceback from the first forward before; now one line, before any
    weight loads (`sweep --model=FOLDER --limit=4`, in-process)."""
    from rmjax.search.sweep import SweepSpec, run_sweep
    from tests.cli import copy_folder

    folder = copy_folder(rm_folder, tmp_path / "model")
    raw = json.loads((folder / "config.json").read_text())
    raw["num_key_value_heads"] = 3
    (folder / "config.json").write_text(json.dumps(raw))
    inproc.no_weights_read(monkeypatch)
    inproc.refused(lambda: run_sweep(SweepSpec(inproc.options(folder, tmp_path / "out.csv"), inproc.prompts(),
                                               limit=4)),
                   "num_key_value_heads=3 does not divide num_attention_heads=4", str(folder / "config.json"))
    assert not (tmp_path / "out.csv").exists()


def test_gguf_metadata_goes_through_the_same_checks(tmp_path):
    """A GGUF file whose metadata says 0 layers is refused from its metadata, naming the file, before any tensor is
    converted (it became a config.json of 0 layers before)."""
    import gguf

    from rmjax.loading.gguf_file import hf_config_from_gguf, read_gguf

    path = tmp_path / "bad.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in (("embedding_length", 64), ("feed_forward_length", 96), ("block_count", 0),
                       ("attention.head_count", 4), ("attention.head_count_kv", 2), ("vocab_size", 96),
                       ("context_length", 512)):
        writer.add_uint32(f"llama.{key}", value)
    writer.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(CheckpointError) as refused:
        hf_config_from_gguf(read_gguf(path), path)
    assert f"{path} (GGUF metadata): num_hidden_layers=0 must be an integer >= 1" in str(refused.value)


# --- plans refuse what their job refuses, before compiling -------------------------------------------------------


def _plan_command_refused(*flags: str, says: tuple[str, ...] = ()) -> str:
    """`python -m experiments.plan --topology=v5e:2x2 FLAGS`: one line, and no mesh compiled."""
    return _refused_before_compiling(run("plan", "--topology=v5e:2x2", *flags), says)


def _refused_before_compiling(proc, says: tuple[str, ...]) -> str:
    """A finished `experiments.plan` (tests.cli.run or run_each): one error line naming `says`, no mesh compiled."""
    line = user_error(proc, *says)
    assert "plan: data:" not in proc.stdout, proc.stdout  # no mesh was compiled
    return line


def _plan_refused(config, job: str, says: tuple[str, ...] = (), **flags) -> str:
    """experiments.plan --model=CONFIG --topology=v5e:2x2 --job=JOB --FLAG=value... as its main calls plan_inputs,
    refused before `plan` would compile anything (no refusal here depends on --texts, whose default differs)."""
    from rmjax.plan.spec import plan_inputs

    return inproc.refused(lambda: plan_inputs(str(config), "v5e:2x2", job, **flags), *says)


@pytest.mark.parametrize("field, value, says", [("num_hidden_layers", 4.5, "num_hidden_layers=4.5"),
                                                ("intermediate_size", 0, "intermediate_size=0"),
                                                ("num_key_value_heads", 3, "num_key_value_heads=3 does not divide")])
def test_plan_refuses_a_config_no_model_can_have(tmp_path, field, value, says):
    config = _config_file(tmp_path, **{field: value})
    _plan_refused(config, "sweep", limit=64, says=(str(config), says))


@pytest.mark.parametrize("job, flags, says", [
    ("sweep", {}, ("needs 73 positions", "context is 40", "Shorten the prompt")),  # 64 prefix + 1 + 8 suffix tokens
    # (no tokenizer); a prompt that leaves room names the response's length as the fix (it said "shorten the prompt")
    ("beam", {"prefix_tokens": 30, "depth": 3}, ("--depth=3", "leaving 2 for the response", "--depth=2")),
    ("gcg", {"prefix_tokens": 30}, ("--num_tokens=8", "leaving 2 for the response")),
    ("score", {"prefix_tokens": 30}, ("needs 46 positions", "Give a response of at most 2 tokens")),
])
def test_plan_refuses_a_context_shorter_than_the_jobs_positions(tmp_path, job, flags, says):
    config = _config_file(tmp_path, max_position_embeddings=40)
    _plan_refused(config, job, limit=64, says=says, **flags)


def test_plan_refuses_the_exhaustive_beams_the_job_refuses(tmp_path):
    """The job refuses an exhaustive depth-3 beam whose partials cannot fit the host, and one over the whole
    vocabulary; the plan compiled both (and said 0.01 GiB per chip)."""
    config = _config_file(tmp_path, vocab_size=1 << 20)
    _plan_refused(config, "beam", exhaustive=True, depth=3, limit=(1 << 20) - 1,
                  says=("--exhaustive --depth=3 over 1,048,575 candidates", "partial responses", "this host has"))
    _plan_refused(config, "sweep", limit=1 << 20, says=("--limit=1048576 keeps all 1,048,576 candidates",))
    _plan_refused(config, "beam", exhaustive=True, depth=2, says=("--exhaustive enumerates", "--limit"))


@pytest.mark.parametrize("job, batch, says", [
    ("sweep", 1000000000000, ("--batch_size=1000000000000 is more than the 64 candidates",)),
    ("inspect", 1000000000000, ("--batch_size=1000000000000 is more than the 1024 path points",)),
])
def test_plan_refuses_a_batch_size_past_what_one_call_holds(tmp_path, job, batch, says):
    config = _config_file(tmp_path)
    _plan_refused(config, job, limit=64, batch_size=batch, says=says)
    if job == "sweep":  # --batch_size=1e12, no integer: absl's flag parser refuses it in one line, nothing compiled
        _plan_command_refused(f"--model={config}", "--job=sweep", "--limit=64", "--batch_size=1e12",
                              says=("--batch_size=1e12",))


def test_plan_refuses_an_out_that_is_a_folder_before_compiling(tmp_path):
    """--out a folder; and a fault hunt: --overwrite wrote the plan over the model's own config.json (a folder's file
    likewise). Both commands in one interpreter (tests.cli.run_each)."""
    folder = tmp_path / "plans"
    folder.mkdir()
    config = _config_file(tmp_path)
    into_folder, onto_config = run_each(*(("plan", "--topology=v5e:2x2", f"--model={config}", "--job=sweep",
                                           "--limit=64", f"--out={out}", "--overwrite") for out in (folder, config)))
    _refused_before_compiling(into_folder, (f"--out={folder} is a directory",))
    _refused_before_compiling(onto_config, ("inside the model this plan reads",))
    assert json.loads(config.read_text())["architectures"]


def test_a_head_only_training_plan_holds_the_backbone_on_the_chip():
    """A fault hunt: a head-only train_rm step reads features, no backbone, so its compiled peak left the weights
    out and a 27B (50.7 GiB in bfloat16) "fit" one 15.75 GiB v5e chip at 0.11 GiB, exit 0; its feature pass holds
    every weight on the chip. Refused now, as a sweep of it is (the TPU compiler's own count: over 100 GiB, the
    weights and a feature batch's activations), naming slices with room for it: its 50.7 GiB of weights over at
    least 4 chips of 16 GiB or more."""
    line = user_error(run("plan", "--model=Skywork/Skywork-Reward-Gemma-2-27B-v0.2", "--topology=v5e-1",
                          "--job=train_rm", "--trainable=head", "--dtype=bfloat16"), "a v5e chip has 15.75 GiB")
    needed = float(re.search(r"needs (?:over )?([\d.]+) GiB per chip", line)[1])
    assert needed >= 50.7, line
    fits = re.findall(r"(v\w+)-(\d+) \(--mesh=data:(\d+),model:(\d+)", line)
    assert fits and all(int(data) * int(model) >= 4 for _, _, data, model in fits), line


def test_a_compile_refused_in_terabytes_is_a_plan_that_does_not_fit(monkeypatch):
    """The TPU compiler states what it would need in G or T (train_rm at --batch_size=10^12: '236.47T'); a T
    escaped as a traceback."""
    from rmjax.plan import chips, planner
    from rmjax.plan.calls import Call
    from rmjax.plan.cost import CompileRefused

    class Shape:
        def calls(self, cfg, dtype, mesh, batch):
            return [Call("step", None, (), 1)]

    def refuse(*args):
        raise CompileRefused("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
                             "temporaries (236.47T) exceeds available HBM (15.75G).")

    monkeypatch.setattr(planner, "mesh_on", lambda *args: None)
    monkeypatch.setattr(planner, "cost_of", refuse)
    option = planner.compile_option(None, "bfloat16", chips.parse_slice("v5e:2x2"), 4, 1, Shape(), 1 << 40)
    assert option.refused_bytes == int(236.47 * 2**40)


def test_a_score_batch_past_the_texts_plans_the_rows_the_job_uses():
    """The score job pads a batch only to the next power of two of its texts (rmjax.scoring.texts: 100 texts on 4
    data chips, 128 rows, whatever --batch_size); the plan laid out --batch_size rows (10^12: an int32 overflow)."""
    from rmjax.plan import calls, chips

    piece = chips.parse_slice("v5e:2x2")
    made = calls.score_calls(config_from_hf(_raw()), "float32", chips.mesh_on(piece, 4, 1), prompts=1,
                             prefix_tokens=40, suffix_tokens=5, texts=100, text_tokens=6, batch_size=10**12)
    score = made[-1]
    assert score.name == "score_texts" and score.count == 1
    assert score.args[2].shape == (128, 12)  # 6 text + 5 suffix tokens in 4-token buckets


@pytest.mark.parametrize("topology", ["v5e:0x0", "v4:1x0x2", "v6e:0x4"])
def test_a_topology_with_a_zero_dimension_is_no_slice(topology):
    """v5e:0x0 was taken as a slice of 0 chips and refused later as 'no mesh of v5e:0x0 splits the batch of None'."""
    with pytest.raises(UsageError, match=f"--topology={topology}: expected a TPU slice"):
        parse_slice(topology)


def test_the_plan_refuses_what_train_rm_and_the_sweeps_memory_planner_refuse(tmp_path):
    """The plan said "fits" (and the launcher created a VM) for runs the job then refused on it: train_rm's batch
    not divisible by the data axis, --fsdp with head-only training or without a data axis, and a sweep's explicit
    --batch_size that XLA fits but the job's own memory planner (which the job checks it against) does not.
    Each is refused before anything compiles (no `plan: data:…` compile line)."""
    from rmjax.plan.planner import plan
    from rmjax.plan.spec import plan_inputs

    config = _config_file(tmp_path)
    logged = []
    for (settings, fsdp, says) in (
            (dict(trainable="last_k", batch_size=100, mesh="data:8,model:1"), "auto", "use a multiple of 8"),
            (dict(trainable="head", batch_size=64), "true", "--trainable=head trains none"),
            (dict(trainable="full", batch_size=64, mesh="data:1,model:8"), "true", "none of size > 1")):
        cfg, piece, shape, mesh = plan_inputs(str(config), "v5e-8", "train_rm", n_train=1000, sequence_tokens=32,
                                              **settings)
        args = (cfg, "bfloat16", piece, "train_rm", shape, mesh)
        inproc.refused(lambda args=args, fsdp=fsdp: plan(*args, log=logged.append, fsdp=fsdp), says)
    assert not logged
    cfg, piece, shape, mesh = plan_inputs("Skywork/Skywork-Reward-Llama-3.1-8B-v0.2", "v5e-8", "sweep",
                                          mesh="data:1,model:8", batch_size=40960)
    inproc.refused(lambda: plan(cfg, "bfloat16", piece, "sweep", shape, mesh, batch_size=40960, log=logged.append),
                   "fits no batch by the memory planner")
    assert logged and all("the job's memory planner refuses it" in line for line in logged), logged


def test_the_plan_refuses_a_model_its_scoring_job_refuses(rm_folder, lm_folder, tmp_path):
    """helper-152: plan sized a sweep of a causal LM, of a 3-label classifier with no --output_column, and with an
    --output_column past a 1-output head (exit 0, a launch --dry-run went through); each job refuses them from the
    config. Now the plan does, with the job's words; train_rm still plans a causal LM (it adds the head), a zoo
    backbone is a shape given a one-label head, and --output_column=N names a classifier's column."""
    from rmjax.plan.spec import plan_inputs

    three = cli.copy_folder(rm_folder, tmp_path / "three")
    config = json.loads((three / "config.json").read_text())
    (three / "config.json").write_text(json.dumps({**config, "num_labels": 3,
                                                   "id2label": {"0": "a", "1": "b", "2": "c"}}))
    for model, flags, says in ((lm_folder, {}, "has no score head"),
                               (three, dict(column_chosen=False), "score head of 3 outputs"),
                               (rm_folder, dict(output_column=2), "--output_column=2")):
        for job in ("sweep", "score", "inspect"):
            inproc.refused(lambda m=model, j=job, f=flags: plan_inputs(str(m), "v5e-1", j, **f), *says.split("|"))
    plan_inputs(str(lm_folder), "v5e-1", "train_rm", n_train=100, batch_size=8)
    plan_inputs("llama-3.1-8b", "v5e-8", "sweep", mesh="data:1,model:8")
    assert plan_inputs(str(three), "v5e-1", "sweep", output_column=2, column_chosen=True)[0].num_outputs == 3


@pytest.mark.parametrize("saved, run", [("float32", "bfloat16"), ("bfloat16", "float32")])
def test_the_plan_counts_the_checkpoint_bytes_the_file_holds(rm_folder, tmp_path, saved, run):
    """helper-152: a float32 checkpoint planned for a bfloat16 run was said to read half its bytes (0.5 GiB of a
    1.0 GiB file; the RAM bound under by as much), a bfloat16 one at float32 twice. Each host reads the file's
    bytes: on one chip, all of them, here equal to the safetensors data (its size less the header)."""
    import torch
    import transformers

    from rmjax import nn
    from rmjax.loading.safetensors_io import read_header
    from rmjax.plan.chips import parse_slice
    from rmjax.plan.host import host_side
    from rmjax.plan.spec import model_config, stored_itemsize

    folder = tmp_path / saved
    model = transformers.AutoModelForSequenceClassification.from_pretrained(rm_folder, dtype=getattr(torch, saved))
    model.save_pretrained(folder, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (rm_folder / name).exists():
            (folder / name).write_bytes((rm_folder / name).read_bytes())
    file = folder / "model.safetensors"
    data = file.stat().st_size - read_header(file)[1]
    cfg, _ = model_config(str(folder))
    run_bytes = sum(d.size * (4 if d.float32 or run == "float32" else 2) for d in nn.declarations(cfg).values())
    host = host_side(cfg, run, parse_slice("v5e-1"), 1, run_bytes, stored_itemsize(str(folder)))
    # every byte of the file is a declared weight here: equal but for int() of a float64 product (a byte at most)
    assert abs(host["checkpoint_bytes_per_host"] - data) <= 1, (host["checkpoint_bytes_per_host"], data)


def test_a_gguf_or_builtin_is_read_as_its_float32_conversion():
    """helper-153: a .gguf file or builtin name is read by the loader from its conversion, dequantized to float32:
    the plan assumed the run's dtype (half the bytes at bfloat16). The conversion's own headers say float32."""
    from rmjax.loading import cache_dir
    from rmjax.loading.gguf_file import cached_hf_folder
    from rmjax.loading.registry import resolve
    from rmjax.plan.spec import stored_itemsize

    kind, gguf_path = resolve("smollm2-135m-instruct")
    assert kind == "gguf"
    converted = cached_hf_folder(gguf_path, cache_dir())
    assert stored_itemsize(str(converted)) == 4  # from the safetensors headers of what the loader reads
    for spec in ("smollm2-135m-instruct", "elo-rm-smollm2-135m", str(gguf_path)):
        assert stored_itemsize(spec) == 4, spec


def test_a_training_plan_says_when_train_rm_would_refuse_its_steps_at_the_default_warmup(tmp_path):
    """plan takes no --warmup_steps (it changes no memory or time), so `plan --job=train_rm --steps=10` planned a
    command train_rm refuses (--steps at or below its default --warmup_steps, 100): the plan now says so, naming
    the flag to give. Above the warmup it says nothing. (Both runs stop at the batch check, before compiling.)"""
    config = _config_file(tmp_path)
    short, default = run_each(
        ("plan", f"--model={config}", "--job=train_rm", "--trainable=head", "--n_train=50", "--steps=100"),
        ("plan", f"--model={config}", "--job=train_rm", "--trainable=head", "--n_train=50", "--steps=101"))
    assert ("note: train_rm refuses --steps=100 with its default --warmup_steps=100 (the learning rate would never "
            "peak): unless it is given one, run it with --warmup_steps below 100, e.g. --warmup_steps=10.") \
        in short.stderr, short.stderr
    assert "warmup" not in default.stderr, default.stderr
    for done in (short, default):  # the note is no refusal: the plan goes on to its own checks
        assert "--batch_size=256 is more than the 50 training pairs" in done.stderr, done.stderr
