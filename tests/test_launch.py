"""The launch scripts print the right commands, in order, with --dry-run."""

from __future__ import annotations

import subprocess
from pathlib import Path

LAUNCH = Path(__file__).resolve().parents[1] / "launch"
JOB = "experiments.sweep --model=/tmp/ckpt --prompts=paper1 --mesh=data:1,model:8 --out=results/s.csv"


def _dry(script: str, *args: str) -> list[str]:
    out = subprocess.run(["bash", str(LAUNCH / script), *args, "--dry-run"], capture_output=True, text=True,
                         check=True).stdout
    return [line[2:] for line in out.splitlines() if line.startswith("+ ")]


def test_tpu_vm_dry_run():
    cmds = _dry("tpu_vm.sh", "--name=rm", "--zone=us-west4-a", "--type=v5litepod-8", "--project=p",
                "--checkpoint=gs://b/ckpt", f"--job={JOB}")
    assert cmds[0].startswith("gcloud compute tpus tpu-vm create rm --zone=us-west4-a --project=p "
                              "--accelerator-type=v5litepod-8")
    assert any("--worker=all" in c and "pip install" in c and "jax[tpu]" in c for c in cmds)
    assert any("gsutil -m cp -r 'gs://b/ckpt/*' /tmp/ckpt/" in c and "--worker=all" in c for c in cmds)
    run = next(c for c in cmds if f"-m {JOB}" in c)
    assert "--worker=all" in run
    def first(pred):
        return next(i for i, c in enumerate(cmds) if pred(c))

    steps = [first(lambda c: " create " in c), first(lambda c: "pip install" in c),
             first(lambda c: "gsutil" in c and "ckpt" in c), first(lambda c: f"-m {JOB}" in c),
             first(lambda c: "--worker=0" in c), first(lambda c: " delete " in c)]
    assert steps == sorted(steps) and len(set(steps)) == 6
    assert cmds[-1] == "gcloud compute tpus tpu-vm delete rm --zone=us-west4-a --project=p --quiet"
    kept = _dry("tpu_vm.sh", "--name=rm", "--zone=z", "--type=v4-8", f"--job={JOB}", "--keep")
    assert not any(" delete " in c for c in kept) and not any("ckpt" in c and "gsutil" in c for c in kept)


def test_gpu_dry_run_and_errors():
    cmds = _dry("gpu.sh", "--host=me@box", "--checkpoint=/data/rm", f"--job={JOB}")
    assert cmds[0].startswith("rsync -az --exclude=.venv") and cmds[0].endswith("me@box:rmjax/")
    assert "jax[cuda12]" in cmds[1] and cmds[2] == "rsync -az /data/rm/ me@box:/tmp/ckpt/"
    assert cmds[3] == f"ssh me@box cd rmjax && HF_HUB_OFFLINE=1 .venv/bin/python -m {JOB}"
    bad = subprocess.run(["bash", str(LAUNCH / "gpu.sh"), "--dry-run"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--host is required" in bad.stderr
