"""Prompts, log-probs and the absl entry points."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from rmjax.data import DATA_DIR
from rmjax.loading import load
from rmjax.runs import results
from rmjax.scoring.logprobs import next_token_logprobs
from rmjax.text import prompts
from tests import tiny, tolerance

REPO = Path(__file__).resolve().parents[1]


def test_builtin_prompt_sets_match_the_papers_files():
    assert prompts.PAPER1 == yaml.safe_load((DATA_DIR / "prompts.yaml").read_text())
    assert prompts.factorial_prompts() == yaml.safe_load((DATA_DIR / "prompts54.yaml").read_text())


def test_resolve_prompts():
    got = prompts.resolve_prompts("greatest,best_world_please", ["mine=Is it good?"])
    assert got == {"greatest": prompts.PAPER1["greatest"],
                   "best_world_please": "What is the best thing in the world? Please answer in one word only.",
                   "mine": "Is it good?"}
    assert len(prompts.resolve_prompts("prompts54")) == 54
    with pytest.raises(ValueError, match="unknown prompt 'gretest'"):
        prompts.resolve_prompts("gretest")
    with pytest.raises(ValueError, match="names greatest more than once"):  # was kept once, unsaid
        prompts.resolve_prompts("greatest,best,greatest")
    assert "greatest" in prompts.resolve_prompts("paper1,greatest")  # a set and one of its names: alike, kept once


def test_next_token_logprobs_match_transformers(tmp_path):
    import shutil

    hf = tiny.build_hf_model("llama3", vocab_size=49152, pad_token_id=2, bos_token_id=1, eos_token_id=2)
    folder = tiny.save_hf_model(hf, tmp_path)
    src = tiny.smollm2_tokenizer_folder()
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(src / f, folder / f)
    model = load(str(folder))
    ps = {"greatest": prompts.PAPER1["greatest"], "other": "Name the best colour, in one word, please."}
    got = next_token_logprobs(model, ps)
    for name, text in ps.items():
        # the conversation up to the assistant's turn, as transformers' chat template renders it
        rendered = model.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                       add_generation_prompt=True)
        ids = model.tokenizer(rendered, add_special_tokens=False).input_ids
        with torch.no_grad():
            ref = torch.log_softmax(hf(input_ids=torch.tensor([ids])).logits[0, -1], -1).numpy()
        atol = tolerance.logprobs_atol(model.params, model.config, np.asarray([ids], np.int32))
        np.testing.assert_allclose(got[name], ref, atol=atol, rtol=0)


def test_score_entry_point(tmp_path):
    _, folder = tiny.save_reward_model_with_tokenizer(tmp_path / "rm")
    out = tmp_path / "texts.csv"
    proc = subprocess.run([sys.executable, "-m", "experiments.score", f"--model={folder}", "--prompts=greatest,worst",
                           "--texts=Love,None,NaN,a b", f"--out={out}"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    df = results.read_scores_csv(out)
    assert df["text"].tolist() == ["Love", "None", "NaN", "a b"]
    # independent reference: the whole templated conversation through a plain full forward
    from tests import jitted as M

    model = load(str(folder))
    for text, got in zip(df["text"], df["greatest"], strict=True):
        conv = model.tokenizer.apply_chat_template(
            [{"role": "user", "content": prompts.PAPER1["greatest"]}, {"role": "assistant", "content": text}],
            tokenize=False)
        ids = np.asarray([model.tokenizer(conv, add_special_tokens=False).input_ids], np.int32)
        ref = float(np.asarray(M.rewards(model.params, model.config, ids, np.ones_like(ids, bool)))[0, 0])
        assert abs(got - ref) <= tolerance.rewards_atol(model.params, model.config, ids)
    assert results.meta_path(out).is_file()
    # a Latin-1 byte on the command line reached the tokenizer as a lone surrogate: a TypeError traceback after the
    # output was claimed and the weights read (score, inspect --responses, logprobs --prompt alike)
    latin = tmp_path / "latin.csv"
    proc = subprocess.run([sys.executable, "-m", "experiments.score", f"--model={folder}".encode(),
                           b"--texts=caf\xe9,love", f"--out={latin}".encode()], cwd=REPO, capture_output=True)
    err = proc.stderr.decode()
    assert proc.returncode == 2 and "error: --texts=caf\\xe9,love: b'\\xe9' is not UTF-8 text" in err, err[-2000:]
    assert "Traceback" not in err and not latin.exists()


def test_sweep_plans_memory_before_loading_weights(tmp_path):
    """The estimate is printed (and a batch that cannot fit refused) before any weight is read."""
    _, folder = tiny.save_reward_model_with_tokenizer(tmp_path / "rm")
    base = [sys.executable, "-m", "experiments.sweep", f"--model={folder}", f"--out={tmp_path / 's.csv'}",
            "--limit=64", "--top=1"]
    proc = subprocess.run(base, cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr.index("memory plan: per device: params") < proc.stderr.index("process 0: loaded")
    # auto: the CPU cap of 256, and no more rows than the 64 candidates (each batch is padded to its size)
    assert '"batch_size": 64' in results.meta_path(tmp_path / "s.csv").read_text()
    assert "batch 64: the 64 candidates need no more" in proc.stderr
    # A batch that cannot fit is refused before loading: tests/test_safety_resume2.py (sizes refused up front).


def _default(help_text: str, flag: str) -> str:
    """The `(default: '…')` absl prints under `flag` in --help."""
    block = help_text.split(f"  {flag}:", 1)[1]
    return block.split("(default: '", 1)[1].split("'", 1)[0]


def test_help_lists_each_jobs_flags_and_default_model():
    """--help (absl's short help: the job's key flags) documents the shared flags, the flags generated from the
    config dataclasses, and the default model. sweep/beam/gcg/inspect/score used to default to a causal LM that
    they then refused after loading."""
    from rmjax.loading import BUILTIN_GGUF, BUILTIN_RMS
    from tests import cli

    own = {"sweep": "--mode", "beam": "--depth", "gcg": "--num_tokens", "inspect": "--responses",
           "score": "--texts_file", "logprobs": "--out", "train_rm": "--learning_rate", "analyze": "--scores",
           "export": "--out", "audit": "--batteries"}
    # Every job's `python -m experiments.JOB --help` in one interpreter (one JAX start-up instead of nine).
    helps = dict(zip(own, cli.run_each(*((job, "--help") for job in own)), strict=True))
    for job, flag in own.items():
        status, out = helps[job].returncode, helps[job].stdout
        assert status == 1, (job, status)  # absl's help exits with status 1
        assert f"\n{REPO / 'experiments' / job}.py:\n" in out, (job, out[:500])  # the job's own key flags
        assert flag in out, (job, flag)
        if job == "analyze":
            continue
        if job == "export":  # any model, as it is: no template or system prompt to choose
            assert "--model" in out and "--overwrite" in out and "--system_prompt" not in out
            continue
        for shared in ("--model", "--dtype", "--mesh", "--template"):
            assert shared in out, (job, shared)
        assert ("--system_prompt" in out) == (job != "train_rm"), job  # every job that renders a conversation
        if job in ("logprobs", "train_rm"):  # these run a causal LM
            assert _default(out, "--model") in BUILTIN_GGUF, job
            assert "--output_column" not in out, job  # reward-only: not offered where there is no reward head
            continue
        assert _default(out, "--model") in BUILTIN_RMS, job
        flat = " ".join(out.split())
        for name in (*BUILTIN_RMS, *BUILTIN_GGUF):
            assert name in flat, (job, name)


def test_logprobs_refuses_output_column_before_loading(tmp_path):
    from tests import cli

    cli.user_error(cli.run("logprobs", "--output_column=1", f"--out={tmp_path / 'lp.csv'}"), "--output_column=1")


def test_jobs_keep_their_compilations_in_the_model_cache(tmp_path):
    """start() points XLA's persistent cache at the model cache's xla/ folder (not with --nocompile_cache, not where
    JAX_COMPILATION_CACHE_DIR already says, not on a CPU process with several devices); a program compiled by one
    process is loaded by the next."""
    from tests.cli import COMPILE_CACHE, ENV

    env = {k: v for k, v in ENV.items() if k not in COMPILE_CACHE} | {"RMJAX_CACHE_DIR": str(tmp_path / "c")}
    probe = ("import sys, jax; from absl import flags; from experiments import common; flags.FLAGS(sys.argv); "
             "common.start(); print(jax.config.jax_compilation_cache_dir)")

    def cache_dir_of(*flags: str, **extra: str) -> str:
        proc = subprocess.run([sys.executable, "-c", probe, *flags], cwd=REPO, env=env | extra, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stdout.strip().splitlines()[-1]

    assert cache_dir_of() == str(tmp_path / "c" / "xla")
    assert cache_dir_of("--nocompile_cache") == "None"
    assert cache_dir_of(JAX_COMPILATION_CACHE_DIR=str(tmp_path / "mine")) == str(tmp_path / "mine")
    assert cache_dir_of(XLA_FLAGS="--xla_force_host_platform_device_count=2") == "None"
    hits = ("import sys, jax, jax.numpy as jnp; from pathlib import Path; from rmjax.compiled import "
            "keep_compilations; events = []; jax.monitoring.register_event_listener(lambda e, **k: events.append(e)); "
            "assert keep_compilations(Path(sys.argv[1]), min_seconds=0); jax.jit(lambda x: jnp.sin(x) @ x)"
            "(jnp.ones((4, 4))).block_until_ready(); print(events.count('/jax/compilation_cache/cache_hits'))")
    counts = [subprocess.run([sys.executable, "-c", hits, str(tmp_path / "x")], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=300) for _ in range(2)]
    first, second = (int(c.stdout.strip().splitlines()[-1]) for c in counts)
    assert first == 0 < second, counts[1].stderr[-2000:]


def test_test_subprocesses_compile_quickly_except_the_planner():
    """tests.cli.subprocess_env adds QUICK_COMPILE beside a device-count flag, once, and takes it out for `plan`
    (its TPU compiles would read it)."""
    from tests import cli

    devices = "--xla_force_host_platform_device_count=2"
    quick = list(cli.QUICK_COMPILE)
    assert quick == ["--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false"]
    assert cli.subprocess_env(XLA_FLAGS=devices)["XLA_FLAGS"].split() == [devices, *quick]
    assert cli.subprocess_env(XLA_FLAGS=f"{quick[1]} {devices}")["XLA_FLAGS"].split() == [quick[1], devices, quick[0]]
    assert cli.subprocess_env(quick=False, XLA_FLAGS=f"{devices} {' '.join(quick)}")["XLA_FLAGS"] == devices
    assert set(quick) <= set(cli.ENV["XLA_FLAGS"].split())


def _imported(stderr: str) -> set[str]:
    """The modules `python -X importtime` reports importing."""
    return {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines() if line.startswith("import time:")}


def test_a_job_imports_no_torch_and_one_refused_by_its_flags_no_transformers(rm_folder):
    """experiments/__init__.py: where torch is installed (here: a test extra), transformers' torch check runs with
    torch hidden when transformers is first imported. A job that loads a tokenizer imports no torch (2.2 s a start
    when it did); a job refused by its flags imports no transformers (1.2 s when the check ran at start-up)."""
    import importlib.util

    from tests.cli import command, subprocess_env

    assert importlib.util.find_spec("torch") is not None  # the premise: torch is there to be imported
    scored, refused = (subprocess.run([sys.executable, "-X", "importtime", *command(*job)[1:]], cwd=REPO,
                                      env=subprocess_env(), capture_output=True, text=True, timeout=600)
                       for job in (("score", f"--model={rm_folder}", "--prompts=greatest", "--texts=love"),
                                   ("sweep", "--model=/nonexistent", "--token_ids=1,x")))
    assert scored.returncode == 0, scored.stderr[-3000:]
    assert "'love'" in scored.stdout and "transformers" in _imported(scored.stderr)
    assert "torch" not in _imported(scored.stderr)
    assert refused.returncode == 2 and "--token_ids" in refused.stderr
    assert not {"transformers", "torch"} & _imported(refused.stderr)


def test_a_module_that_is_not_a_job_says_so():
    """`python -m experiments.candidates --anything` (a module of shared flags) ran nothing and exited 0, as if a
    job had finished. Every module of experiments/ is a job (it has a main) or refuses to run as one."""
    from tests import cli

    modules = sorted(p.stem for p in (REPO / "experiments").glob("*.py") if p.stem != "__init__")
    helpers = [m for m in modules if "\ndef main(" not in (REPO / "experiments" / f"{m}.py").read_text()]
    assert {"candidates", "common", "cli"} <= set(helpers) and "sweep" not in helpers, helpers
    running = {m: subprocess.Popen(cli.command(m, "--limit=3"), cwd=REPO, env=cli.ENV, text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE) for m in helpers}
    for module, proc in running.items():
        out, err = proc.communicate(timeout=120)
        line = cli.user_error(subprocess.CompletedProcess(proc.args, proc.returncode, out, err),
                              f"experiments.{module} is not a job", "python -m experiments.sweep")
        assert line and not out, (module, out)
