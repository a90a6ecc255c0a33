"""Two real processes x 4 CPU devices (gloo collectives on localhost) give the same CSV as one process."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

from tests import cli, tiny

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cmd(folder: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "experiments.sweep", f"--model={folder}", "--prompts=greatest,worst",
            f"--out={out}", "--limit=640", "--batch_size=64", "--chunk_size=256", "--top=2", *extra]


def _atol(folder: Path, response_tokens: int) -> float:
    """The float32 bound (tests/tolerance.py) for rewards of the tiny model over greatest/worst + a response:
    the runs shard the same forward differently (partial sums over `model`), which only rounds differently."""
    from rmjax.loading import load
    from rmjax.text import chat, prompts
    from tests import tolerance

    model = load(str(folder))
    length = max(len(chat.split_chat(model.tokenizer, prompts.PAPER1[name]).ids_with([0] * response_tokens))
                 for name in ("greatest", "worst"))
    return tolerance.any_rewards_atol(model.params, model.config, length)


def test_resume_across_hosts(tmp_path):
    """A single-process sweep killed mid-run is finished by two processes sharding the model between them; the CSV
    equals a clean one-process run, and only process 0 reports and writes. (Data parallel across processes:
    test_two_process_beam_equals_one, through the same batch placement.)"""
    import json

    from rmjax.runs import results
    from rmjax.search.sweep import SweepSpec, run_sweep
    from tests import inproc

    _, folder = tiny.save_reward_model_with_tokenizer(tmp_path / "rm")
    env = cli.subprocess_env(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="4")
    limit = ["--limit=3072"]
    clean = tmp_path / "clean.csv"  # the same flags' uninterrupted run, in-process (tests/inproc.py)
    run_sweep(SweepSpec(inproc.options(folder, clean), inproc.prompts("greatest", "worst"), limit=3072,
                        batch_size=64, chunk_size=256))
    out = tmp_path / "resumed.csv"
    done = tiny.kill_after_chunks(_cmd(folder, out, *limit), out, 2, cwd=REPO, env=env)
    assert 2 <= done < 12 and not out.exists()
    port = _free_port()
    # Tensor parallel across the hosts: each process holds 4 of the 8 `model` shards and reads only those.
    procs = [subprocess.Popen(_cmd(folder, out, *limit, "--mesh=data:1,model:8", f"--coordinator=127.0.0.1:{port}",
                                   "--num_processes=2", f"--process_id={i}"),
                              cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    for i, (p, (_, err)) in enumerate(zip(procs, outs, strict=True)):
        assert p.returncode == 0, err[-3000:]
        read, total = map(float, re.search(rf"process {i}: .* read ([\d.]+) of ([\d.]+) MiB", err).groups())
        assert 0.3 * total < read < 0.7 * total, (read, total)  # vocab and MLP halves + replicated attention
    assert "top 2 tokens" in outs[0][0] and "top 2 tokens" not in outs[1][0]  # only process 0 reports
    meta = json.loads(results.meta_path(out).read_text())
    assert meta["resumed_candidates"] == done * 256
    assert meta["mesh"] == {"data": 1, "model": 8} and len(meta["environment"]["devices"]) == 8
    a, b = results.read_scores_csv(clean), results.read_scores_csv(out)
    assert a[["token_id", "token_name", "token_decoded"]].equals(b[["token_id", "token_name", "token_decoded"]])
    import numpy as np

    atol = _atol(folder, 1)
    np.testing.assert_allclose(b["greatest"], a["greatest"], atol=atol, rtol=0)
    np.testing.assert_allclose(b["worst"], a["worst"], atol=atol, rtol=0)


def test_two_process_beam_equals_one(tmp_path):
    """The beam on a data x model mesh over two processes (issue 14): the CSV equals one process's, only process 0
    writes and reports."""
    import numpy as np

    from rmjax.runs import results
    from rmjax.search.beam import BeamConfig
    from rmjax.search.beam_job import BeamSpec, run_beam
    from tests import inproc

    _, folder = tiny.save_reward_model_with_tokenizer(tmp_path / "rm")
    env = cli.subprocess_env(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="4")

    def cmd(out: Path, *extra: str) -> list[str]:
        return [sys.executable, "-m", "experiments.beam", f"--model={folder}", "--prompts=greatest,worst",
                f"--out={out}", "--depth=2", "--beam=4", "--top=8", "--batch_size=64", "--chunk_size=64",
                "--token_ids=" + ",".join(map(str, range(500, 628))), *extra]

    single = tmp_path / "single.csv"  # cmd's one-process run, in-process (tests/inproc.py)
    run_beam(BeamSpec(inproc.options(folder, single), inproc.prompts("greatest", "worst"),
                      BeamConfig(depth=2, beam=4, top=8), tuple(range(500, 628)), batch_size=64, chunk_size=64))
    multi = tmp_path / "multi.csv"
    port = _free_port()
    procs = [subprocess.Popen(cmd(multi, "--mesh=data:4,model:2", f"--coordinator=127.0.0.1:{port}",
                                  "--num_processes=2", f"--process_id={i}"),
                              cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    assert "depth 2 optimal:" in outs[0][0] and "depth 2 optimal:" not in outs[1][0]
    a, b = results.read_beam_csv(single), results.read_beam_csv(multi)
    assert a[results.BEAM_KEY_COLUMNS].equals(b[results.BEAM_KEY_COLUMNS])
    atol = _atol(folder, 2)
    for prompt in ("greatest", "worst"):
        np.testing.assert_allclose(b[prompt], a[prompt], atol=atol, rtol=0)


def test_processes_without_a_mesh_are_refused(tmp_path):
    """--num_processes=2 without --mesh: each process loaded the model and swept every candidate alone (exit 0,
    the second host's work thrown away). Both now stop in one line before loading."""
    _, folder = tiny.save_reward_model_with_tokenizer(tmp_path / "rm")
    env = cli.subprocess_env(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="4")
    port = _free_port()
    procs = [subprocess.Popen(_cmd(folder, tmp_path / "s.csv", f"--coordinator=127.0.0.1:{port}",
                                   "--num_processes=2", f"--process_id={i}"), cwd=REPO, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for i in range(2)]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 2, err
        assert "2 processes and no --mesh" in err and "over all 8 devices" in err
    assert not (tmp_path / "s.csv").exists()


_REREAD_SCRIPT = r"""
import sys
from pathlib import Path

import jax

jax.distributed.initialize(sys.argv[1], num_processes=2, process_id=int(sys.argv[2]))
from rmjax.errors import InputFileError
from rmjax.parallel.distributed import barrier
from rmjax.runs import jobs

words, folder = Path(sys.argv[3]), Path(sys.argv[4])
real = jobs._digest
for stage in ("claimed", "finish"):
    out = folder / f"{stage}.csv"
    with jobs.job(out, {"job": "test", "stage": stage}, reread={"--vocab_file": words}) as job:
        if jax.process_index() == 1:  # a save landed after process 0 read the file and before process 1 did
            jobs._digest = lambda path: "another content"
        try:
            if stage == "claimed":
                with jobs.claimed(job, out, job.identity, allow_nonfinite=False):
                    pass
            else:
                job.finish(lambda path: path.write_text("result") and path)
            print(stage, "went on", flush=True)
        except InputFileError as error:
            print(stage, "refused:", error, flush=True)
        jobs._digest = real
    barrier(stage)
"""


def test_a_reread_file_saved_between_two_processes_checks_stops_both(tmp_path):
    """A --vocab_file saved while the processes check it: process 1 sees the new content, process 0 the claimed one.
    Each process checked alone: process 1 stopped in `claimed` while process 0 waited in its next collective, and
    at the end process 0 (which writes) wrote, as process 1 never checked there. All processes now refuse
    together, and nothing is written."""
    words = tmp_path / "v.txt"
    words.write_text(" love\n")
    env = cli.subprocess_env(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="1")
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, "-c", _REREAD_SCRIPT, f"127.0.0.1:{port}", str(i), str(words),
                               str(tmp_path)], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for i in range(2)]
    try:
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, (said, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
        for stage in ("claimed", "finish"):
            assert f"{stage} refused: --vocab_file={words} was written with other content" in said, (said, err)
    assert not (tmp_path / "finish.csv").exists() and not (tmp_path / "claimed.csv").exists()
