"""Every shell command of the README, in order, on a fresh clone of the committed HEAD, with the README's sizes
(`make readme-chain`, 28 min 48 s on 2 cores at 16d64e9, other work beside it). The chain itself is marked
`readme_chain` and deselected from the default run (pytest.ini): CI's suite has a 20-minute budget. The tests
that read the commands out of the README run by default."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
# Commands the chain does not run, and why (each must still be in the README: test_the_readme_lists_…).
SKIPPED = {"make test": "the CI suite (about 18 minutes): run inside this test it would run the suite within itself"}
# The install stamps of the Makefile: the clone's .venv is the checkout's, already installed, and make must not
# reinstall it because the clone's requirements files are newer than the stamps.
STAMPS = (".venv/.installed", ".venv/.installed-test")
# What the chain's environment drops: settings of this test run that a user's shell does not have.
TEST_ONLY_ENV = ("PYTHONPATH", "RMJAX_CACHE_DIR", "JAX_COMPILATION_CACHE_DIR",
                 "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES",
                 "JAX_NUM_CPU_DEVICES", "XLA_FLAGS", "PYTEST_XDIST_WORKER", "PYTEST_CURRENT_TEST")


@dataclasses.dataclass(frozen=True)
class Step:
    """One README command: its section's heading, the command (continuation lines joined), the files the README
    says it writes and the time the README gives it (the heading's `· ≈…`)."""

    section: str
    command: str
    writes: tuple[str, ...]
    time: str | None


def _writes(prose: str) -> tuple[str, ...]:
    """The results/ and runs/ paths of the paragraph that says what a command writes ("Writes …", "It writes…")."""
    found = re.search(r"\b(?:It w|W)rites\b", prose)
    if not found:
        return ()
    paragraph = re.split(r"\n\s*\n", prose[found.start():], maxsplit=1)[0]
    return tuple(re.findall(r"`((?:results|runs)/[^`\s]*[^`\s/])`", paragraph))


def readme_steps(text: str) -> list[Step]:
    """The shell commands of the README's ```sh blocks in order (other blocks are code or output). What the prose
    after a block, up to the next ```sh block, says it writes goes to the block's last command the chain runs."""
    steps: list[Step] = []
    parts = re.split(r"^```sh\n(.*?)^```\n", text, flags=re.S | re.M)
    for i in range(1, len(parts), 2):  # parts: prose, block, prose, block, …, prose
        block, after = parts[i], parts[i + 1]
        headings = re.findall(r"^#+ (.*)$", "".join(parts[:i:2]), flags=re.M)
        section = headings[-1] if headings else ""
        timed = re.search(r"·\s*(≈.*)$", section)
        commands = [re.sub(r"\s+", " ", c.strip()) for c in block.replace("\\\n", " ").splitlines() if c.strip()]
        run = [n for n, c in enumerate(commands) if _bare(c) not in SKIPPED]
        writes = _writes(after)
        for n, command in enumerate(commands):
            steps.append(Step(section, command, writes if run and n == run[-1] else (),
                              timed.group(1).strip() if timed else None))
    return steps


def _bare(command: str) -> str:
    """The command without a trailing `# comment`."""
    return re.sub(r"\s+#.*$", "", command)


def _as_run(command: str) -> str:
    """What the chain runs for a README command: make keeps the clone's (linked) .venv as installed."""
    if command.startswith("make "):
        return "make " + " ".join(f"-o {s}" for s in STAMPS) + " " + command[len("make "):]
    return command


def test_the_readme_lists_its_commands_in_chain_order():
    """The extraction the chain runs on: `make demo` first, then every job, each `python -m experiments.JOB`
    naming the files it writes, the skipped commands present."""
    steps = readme_steps(README.read_text())
    commands = [_bare(s.command) for s in steps]
    assert commands[:2] == ["make demo", "make test"]
    assert set(SKIPPED) <= set(commands)
    jobs = [re.match(r"python -m experiments\.(\w+)", c).group(1) for c in commands if c.startswith("python -m")]
    assert jobs == ["score", "inspect", "beam", "gcg", "frontier", "disagree", "audit", "logprobs", "analyze",
                    "train_rm", "export", "plan"]
    assert any(c.startswith("launch/tpu_vm.sh") and "--dry-run" in c for c in commands)
    assert steps[0].writes == ("results/demo/elo-rm-smollm2-135m_greatest.csv",
                               "results/demo/elo-rm-smollm2-135m_greatest.csv.meta.json",
                               "results/demo/elo-rm-smollm2-135m_greatest.csv.png")
    for step in steps:
        if step.command.startswith("python -m") and " --out=" in step.command and "experiments.score" not in \
                step.command:
            assert step.writes, f"the README says nothing of what `{step.command}` writes"
        if step.command.startswith(("python -m", "launch/")):
            assert step.time, f"no time for `{step.command}` in its heading"
    assert _as_run("make demo") == "make -o .venv/.installed -o .venv/.installed-test demo"


def test_readme_steps_parse_blocks_continuations_and_writes():
    """The parser on a small README: only ```sh blocks, continuation lines joined, the writes of the paragraph after
    a block given to its last command the chain runs (`make test` is skipped), the time taken from the heading."""
    text = ("# T\n```sh\nmake demo   # comment\nmake test\n```\nIt writes:\n- `results/a.csv`: a table;\n"
            "- `results/a.csv.png`\n\n`results/not.csv` is elsewhere.\n### Job · ≈2 min\n```sh\n"
            "python -m experiments.x --a=1 \\\n    --out=runs/y\n```\nWrites `runs/y/z.json` (a file),\n"
            "`runs/y/w.csv`.\n```python\nprint('not a command')\n```\n")
    steps = readme_steps(text)
    assert [s.command for s in steps] == ["make demo # comment", "make test",
                                          "python -m experiments.x --a=1 --out=runs/y"]
    assert [s.writes for s in steps] == [("results/a.csv", "results/a.csv.png"), (),
                                         ("runs/y/z.json", "runs/y/w.csv")]
    assert [s.time for s in steps] == [None, None, "≈2 min"]


def _clone(tmp_path: Path) -> Path:
    """The committed HEAD in an empty folder, with the checkout's installed .venv linked in (not reinstalled)."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    if not (REPO / ".venv" / "bin" / "python").exists():
        pytest.skip("no .venv: run `make demo` first")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True, capture_output=True, timeout=300)
    (clone / ".venv").symlink_to(REPO / ".venv")
    return clone


def _env(clone: Path) -> dict:
    """A user's shell after `. .venv/bin/activate` in the clone, and the clone's own code on the path."""
    env = {k: v for k, v in os.environ.items() if k not in TEST_ONLY_ENV}
    env.update(PATH=f"{clone / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(clone / ".venv"),
               PYTHONPATH=str(clone))
    return env


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


@pytest.mark.readme_chain
def test_every_readme_command_runs_in_order_on_a_fresh_clone(tmp_path):
    """Issue 45: no test ran the README's commands as a new user does. Each runs in the clone, in order, exits 0 and
    writes the files the README says; its wall time is printed beside the README's."""
    clone = _clone(tmp_path)
    env = _env(clone)
    where = subprocess.run(["python", "-c", "import rmjax, experiments; print(rmjax.__file__, experiments.__file__)"],
                           cwd=clone, env=env, capture_output=True, text=True, check=True).stdout.split()
    assert all(Path(p).is_relative_to(clone) for p in where), where  # the clone's code runs, not the checkout's
    steps = readme_steps((clone / "README.md").read_text())
    times = []
    for step in steps:
        if _bare(step.command) in SKIPPED:
            print(f"\nskipped: {step.command} ({SKIPPED[_bare(step.command)]})", flush=True)
            continue
        print(f"\n$ {step.command}", flush=True)
        start = time.perf_counter()
        proc = subprocess.run(["bash", "-c", _as_run(step.command)], cwd=clone, env=env, capture_output=True,
                              text=True, timeout=3600)
        seconds = time.perf_counter() - start
        times.append((step, seconds))
        print(f"  {_minutes(seconds)} (README: {step.time or 'no time given'})", flush=True)
        assert proc.returncode == 0, f"`{step.command}` exited {proc.returncode}:\n{proc.stderr[-4000:]}"
        missing = [w for w in step.writes if not (clone / w).exists()]
        assert missing == [], f"`{step.command}` did not write {missing}"
    print("\nREADME times measured on this machine (the heading's `· ≈…`):")
    for step, seconds in times:
        print(f"  {_minutes(seconds):>9}  README {step.time or '-':>8}  {step.section}")
