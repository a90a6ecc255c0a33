"""The launch scripts: --dry-run prints, in order, the exact commands they run, each a valid shell line whose
remote command is one quoted argument; a failed TPU run deletes its VM (not with --keep); uncommitted edits
that the TPU VM will not get are named; the remote set-up gets a Python 3.11+."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

LAUNCH = Path(__file__).resolve().parents[1] / "launch"
JOB = "experiments.sweep --model=/tmp/ckpt --prompts=paper1 --mesh=data:1,model:8 --out=results/s.csv"
TPU = ["gcloud", "compute", "tpus", "tpu-vm"]


def _run(script: str, *args: str, env: dict | None = None, launch: Path = LAUNCH) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(launch / script), *args], capture_output=True, text=True, env=env)


def _valid_shell(line: str) -> None:
    check = subprocess.run(["bash", "-n", "-c", line], capture_output=True, text=True)
    assert check.returncode == 0, (line, check.stderr)


def _dry(script: str, *args: str, env: dict | None = None) -> list[list[str]]:
    """--dry-run's lines, each checked to be valid shell, as the argv a shell would run for it."""
    res = _run(script, *args, "--dry-run", env=env)
    assert res.returncode == 0, res.stderr
    for line in res.stdout.splitlines():
        _valid_shell(line)
    return [shlex.split(line) for line in res.stdout.splitlines()]


def _remote(argv: list[str]) -> list[str]:
    """The one argument a remote shell runs (gcloud's --command=, ssh's after the host), checked to be valid
    shell, split into words."""
    if argv[0] == "ssh":
        assert len(argv) == 3, argv
        cmd = argv[2]
    else:
        assert argv[-1].startswith("--command="), argv
        cmd = argv[-1].removeprefix("--command=")
    _valid_shell(cmd)
    return shlex.split(cmd)


def _fake(bin_dir: Path, name: str, log: Path, fail_on: str = "") -> None:
    """A stand-in NAME on PATH that appends its argv to LOG and exits 3 when its arguments contain FAIL_ON."""
    bin_dir.mkdir(exist_ok=True)
    script = f'#!/bin/sh\nfor a in {name} "$@"; do printf "%s\\037" "$a"; done >> {log}\necho >> {log}\n'
    if fail_on:
        script += f'case "$*" in *{shlex.quote(fail_on)}*) exit 3 ;; esac\n'
    (bin_dir / name).write_text(script)
    (bin_dir / name).chmod(0o755)


def _logged(log: Path) -> list[list[str]]:
    return [line.split("\x1f")[:-1] for line in log.read_text().split("\n")[:-1]] if log.exists() else []


def test_tpu_vm_dry_run():
    where = ["--zone=us-west4-a", "--project=p"]
    cmds = _dry("tpu_vm.sh", "--name=rm", "--zone=us-west4-a", "--type=v5litepod-8", "--project=p",
                "--checkpoint=gs://b/ckpt", f"--job={JOB}", env={**os.environ, "TMPDIR": "/tmp"})
    # the plan first, from the checkpoint's config.json alone (issue 24)
    assert cmds[0] == ["gsutil", "cp", "gs://b/ckpt/config.json", "/tmp/rmjax-rm-config.json"]
    assert cmds[1][1:5] == ["-m", "experiments.plan", "--model=/tmp/rmjax-rm-config.json", "--topology=v5litepod-8"]
    cmds = cmds[2:]
    assert cmds[0] == [*TPU, "create", "rm", *where, "--accelerator-type=v5litepod-8",
                       "--version=tpu-ubuntu2204-base"]
    ssh = [c for c in cmds if c[:5] == [*TPU, "ssh"]]
    assert all(c[:-1] == [*TPU, "ssh", "rm", *where, "--worker=all"] for c in ssh)
    setup, ckpt, job = (_remote(c) for c in ssh)
    assert setup[:3] == ["mkdir", "-p", "rmjax"] and "jax[tpu]" in setup
    assert ckpt == ["mkdir", "-p", "/tmp/ckpt", "&&", "gsutil", "-m", "cp", "-r", "gs://b/ckpt/*", "/tmp/ckpt/"]
    assert job == ["cd", "rmjax", "&&", "HF_HUB_OFFLINE=1", "RMJAX_COORDINATOR=auto", ".venv/bin/python", "-m",
                   *JOB.split()]
    assert cmds.index(ssh[0]) < cmds.index(ssh[1]) < cmds.index(ssh[2])
    assert cmds[-2] == [*TPU, "scp", "--recurse", "rm:~/rmjax/results/*", "results/", *where, "--worker=0"]
    assert cmds[-1] == [*TPU, "delete", "rm", *where, "--quiet"]
    kept = _dry("tpu_vm.sh", "--name=rm", "--zone=z", "--type=v4-8", f"--job={JOB}", "--keep")
    assert not any("delete" in c for c in kept) and not any("gsutil" in " ".join(c) for c in kept)


def test_tpu_vm_setup_asks_for_python_311():
    cmds = _dry("tpu_vm.sh", "--name=rm", "--zone=z", "--type=v4-8", f"--job={JOB}")
    setup = _remote(next(c for c in cmds if c[:5] == [*TPU, "ssh"]))
    venv = setup.index("venv")
    assert setup[venv - 1].endswith("uv") and setup[venv + 1:venv + 5] == ["-q", "--python", "3.11", ".venv"]
    # The image's python3 (3.10 on Ubuntu 22.04) only installs uv; it never makes the venv.
    uv = setup.index("uv")
    assert [i for i, w in enumerate(setup) if w == "python3"] == [uv - 6]
    assert setup[uv - 6:uv + 1] == ["python3", "-m", "pip", "install", "-q", "--user", "uv"]
    assert "Python 3.11" in " ".join(setup)


def _fake_tpu(tmp_path: Path) -> tuple[Path, Path, dict, list[str]]:
    """(gcloud's log, the folder for a fake gcloud, an environment that runs it, tpu_vm.sh's arguments)."""
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "TMPDIR": str(tmp_path)}
    args = ["--name=rm", "--zone=z", "--type=v4-8", f"--job={JOB}", f"--results={tmp_path}/results"]
    return tmp_path / "gcloud.log", tmp_path / "bin", env, args


def test_tpu_vm_runs_what_it_prints(tmp_path):
    log, bin_dir, env, args = _fake_tpu(tmp_path)
    _fake(bin_dir, "gcloud", log)
    assert _run("tpu_vm.sh", *args, env=env).returncode == 0
    assert _logged(log) == [c for c in _dry("tpu_vm.sh", *args, env=env) if c[0] == "gcloud"]


def test_tpu_vm_deletes_the_vm_after_a_failure_unless_keep(tmp_path):
    log, bin_dir, env, args = _fake_tpu(tmp_path)
    delete = [*TPU, "delete", "rm", "--zone=z", "--quiet"]
    _fake(bin_dir, "gcloud", log, fail_on="-m experiments.sweep")
    failed = _run("tpu_vm.sh", *args, env=env)
    ran = _logged(log)
    assert failed.returncode == 3 and "-m experiments.sweep" in ran[-2][-1] and ran[-1] == delete
    assert "error: exit 3 from: gcloud" in failed.stderr and "deleting TPU VM rm" in failed.stderr

    log.unlink()
    kept = _run("tpu_vm.sh", *args, "--keep", env=env)
    assert kept.returncode == 3 and not any("delete" in c for c in _logged(log))
    assert f"rm is KEPT (--keep) and still billing. Delete it with: {shlex.join(delete)}" in kept.stderr

    log.unlink()  # a VM that was not created (e.g. the name is taken) is not deleted
    _fake(bin_dir, "gcloud", log, fail_on="create")
    assert _run("tpu_vm.sh", *args, env=env).returncode == 3 and [c[4] for c in _logged(log)] == ["create"]


def test_tpu_vm_warns_that_uncommitted_changes_are_not_shipped(tmp_path):
    repo = tmp_path / "repo"
    (repo / "launch").mkdir(parents=True)
    shutil.copy(LAUNCH / "tpu_vm.sh", repo / "launch")
    shutil.copy(LAUNCH / "run.sh", repo / "launch")
    (repo / "a.py").write_text("x = 1\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    for step in (["init", "-q"], ["add", "."], ["commit", "-qm", "c"]):
        subprocess.run([*git, *step], check=True)
    args = ["--name=rm", "--zone=z", "--type=v4-8", f"--job={JOB}", "--dry-run"]
    clean = _run("tpu_vm.sh", *args, launch=repo / "launch")
    assert clean.returncode == 0 and "uncommitted" not in clean.stderr
    (repo / "a.py").write_text("x = 2\n")
    (repo / "b.py").write_text("")
    dirty = _run("tpu_vm.sh", *args, launch=repo / "launch")
    [line] = [ln for ln in dirty.stderr.splitlines() if "uncommitted" in ln]
    assert dirty.returncode == 0 and "2 uncommitted change(s) will NOT be shipped" in line
    assert "M a.py" in line and "?? b.py" in line


def test_gpu_dry_run_and_errors():
    cmds = _dry("gpu.sh", "--host=me@box", "--checkpoint=/data/rm", f"--job={JOB}")
    assert cmds[0][:3] == ["rsync", "-az", "--exclude=.venv"] and cmds[0][-1] == "me@box:rmjax/"
    assert "jax[cuda12]" in _remote(cmds[1]) and cmds[2] == ["rsync", "-az", "/data/rm/", "me@box:/tmp/ckpt/"]
    assert _remote(cmds[3]) == ["cd", "rmjax", "&&", "HF_HUB_OFFLINE=1", ".venv/bin/python", "-m", *JOB.split()]
    bad = subprocess.run(["bash", str(LAUNCH / "gpu.sh"), "--dry-run"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--host is required" in bad.stderr


def _fake_gpu(tmp_path: Path, fail_on: str = "") -> tuple[Path, dict, list[str]]:
    """(the log of a fake ssh and rsync, an environment that runs them, gpu.sh's arguments)."""
    log, bin_dir = tmp_path / "remote.log", tmp_path / "bin"
    _fake(bin_dir, "rsync", log)
    _fake(bin_dir, "ssh", log, fail_on)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    return log, env, ["--host=me@box", f"--job={JOB}", f"--results={tmp_path}/results"]


def test_gpu_runs_what_it_prints(tmp_path):
    log, env, args = _fake_gpu(tmp_path)
    assert _run("gpu.sh", *args, env=env).returncode == 0
    assert _logged(log) == [c for c in _dry("gpu.sh", *args, env=env) if c[0] != "mkdir"]


def test_gpu_names_the_failed_step(tmp_path):
    _, env, args = _fake_gpu(tmp_path, fail_on="-m experiments.sweep")
    failed = _run("gpu.sh", *args, env=env)
    assert failed.returncode == 3
    assert f"error: exit 3 from: ssh me@box 'cd rmjax && HF_HUB_OFFLINE=1 .venv/bin/python -m {JOB}'" in failed.stderr


def test_gpu_setup_uses_a_python_311_or_says_there_is_none(tmp_path):
    setup = _dry("gpu.sh", "--host=me@box", f"--job={JOB}")[1][2]
    (tmp_path / "rmjax").mkdir()
    log, bin_dir = tmp_path / "python.log", tmp_path / "bin"
    bin_dir.mkdir()

    def python(name: str, version: tuple[int, int]) -> None:  # answers the version check, logs the rest
        (bin_dir / name).write_text(f'#!/bin/sh\n[ "$1" = -c ] && exit {int(version < (3, 11))}\n'
                                    f'echo "{name} $*" >> {log}\n')
        (bin_dir / name).chmod(0o755)

    def host() -> subprocess.CompletedProcess:  # the host's shell, seeing only the fake pythons
        return subprocess.run([shutil.which("bash"), "-c", setup], cwd=tmp_path, env={"PATH": str(bin_dir)},
                              capture_output=True, text=True)

    python("python3", (3, 10))
    old = host()
    assert old.returncode == 1 and "error: rmjax needs Python 3.11+ and this host has none" in old.stderr
    assert not log.exists()
    python("python3.12", (3, 12))
    host()
    assert log.read_text().splitlines()[0] == "python3.12 -m venv .venv"


def test_tpu_vm_plans_the_job_first_and_creates_no_vm_for_one_that_does_not_fit(tmp_path):
    """The plan for --type runs here before `create` (issue 24): its command carries the job's planning flags,
    and a job that cannot fit stops the script before any gcloud call."""
    import json

    from tests import tiny

    raw = tiny.hf_config("llama3", num_labels=1).to_dict() | {"architectures": ["LlamaForSequenceClassification"]}
    config = tmp_path / "config.json"
    config.write_text(json.dumps(raw))
    cmds = _dry("tpu_vm.sh", "--name=rm", "--zone=z", "--type=v5litepod-8", f"--job={JOB} --dtype=bfloat16",
                f"--plan_model={config}")
    assert cmds[0][1:] == ["-m", "experiments.plan", f"--model={config}", "--topology=v5litepod-8", "--job=sweep",
                           "--prompts=paper1", "--mesh=data:1,model:8", "--dtype=bfloat16"]
    assert cmds[1][:5] == [*TPU, "create"]
    # a 70B-shaped model in float32 on eight 16 GiB chips
    raw.update(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
               num_key_value_heads=8, head_dim=128, vocab_size=128256)
    config.write_text(json.dumps(raw))
    log, bin_dir, env, args = _fake_tpu(tmp_path)
    _fake(bin_dir, "gcloud", log)
    env = {**env, "JAX_PLATFORMS": "cpu"}
    res = _run("tpu_vm.sh", *args[:2], "--type=v5litepod-8",
               "--job=experiments.sweep --model=/tmp/ckpt --prompts=greatest --out=results/s.csv",
               f"--plan_model={config}", env=env)
    assert res.returncode == 2, res.stderr
    assert "Smallest that fits by estimate" in res.stderr and "no VM was created" in res.stderr
    assert _logged(log) == []
