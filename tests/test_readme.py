"""The README and the docs/ pages it links: their code runs as written (on the builtin default reward model), their
commands use flags their jobs have, and every link resolves."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import numpy as np

from tests import cli, tolerance

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"


def _pages() -> list[Path]:
    """The README and every docs/ page: where the documented code and commands now live (issue 45)."""
    return [README, *sorted(DOCS.glob("*.md"))]


def _python_blocks() -> list[str]:
    return [b for page in _pages() for b in re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)]


def _section(heading: str) -> str:
    """The text under the one heading (any level) named `heading`, up to the next heading of its level or above
    (a `# comment` inside a code block is no heading)."""
    found = []
    for page in _pages():
        level, lines, fenced = 0, [], False
        for line in page.read_text().splitlines(keepends=True):
            fenced ^= line.startswith("```")
            hashes = re.match(r"(#+) ", line) if not fenced and not line.startswith("```") else None
            if level and hashes and len(hashes.group(1)) <= level:
                found.append("".join(lines))
                level = 0
            if level:
                lines.append(line)
            if hashes and line[hashes.end():].strip() == heading:
                level, lines = len(hashes.group(1)), []
        if level:
            found.append("".join(lines))
    assert len(found) == 1, f"{len(found)} sections named {heading!r} in README.md and docs/"
    return found[0]


def _nnx_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", _section("The model is a Flax NNX module"), flags=re.S)


def test_readme_nnx_examples_run():
    import jax.numpy as jnp

    from tests import jitted as M

    blocks = _nnx_blocks()
    assert len(blocks) == 2
    ids = jnp.asarray([[1, 504, 3180, 2], [1, 2, 3, 4]], jnp.int32)
    mask = jnp.ones(ids.shape, bool)
    scope = {"ids": ids, "mask": mask}
    exec(blocks[0], scope)  # noqa: S102 - the README's own code
    rm, out, rewards = scope["rm"], scope["out"], scope["rewards"]
    assert out.residuals.shape == (rm.config.num_layers, 2, 4, rm.config.hidden_size)
    # The README's module is the library's model: the same eager computation gives the same bits; the
    # jitted entry point rounds differently (fusion, summation order: 5e-5 apart on one x86 CPU, issue 21),
    # so it is held to the float32 bound of a 30-layer forward (tests/tolerance.py).
    np.testing.assert_array_equal(np.asarray(rewards), np.asarray(M.module(rm.params, rm.config).rewards(ids, mask)))
    np.testing.assert_allclose(np.asarray(rewards), np.asarray(M.rewards(rm.params, rm.config, ids, mask)),
                               atol=tolerance.rewards_atol(rm.params, rm.config, ids, mask), rtol=0)
    assert scope["state"]["score"]["kernel"].get_metadata()["axes"] == ("embed", "labels")
    exec(blocks[1], scope)  # noqa: S102
    head, opt, step = scope["head"], scope["opt"], scope["step"]
    rng = np.random.default_rng(0)
    chosen = jnp.asarray(rng.normal(size=(8, rm.config.hidden_size)), jnp.float32)
    rejected = jnp.asarray(rng.normal(size=(8, rm.config.hidden_size)), jnp.float32)
    first = float(step(head, opt, chosen, rejected))
    for _ in range(20):
        last = float(step(head, opt, chosen, rejected))
    assert last < first  # the nnx optimizer trains the head
    before = np.asarray(rm.module.score.kernel[...])
    assert not np.allclose(np.asarray(head.kernel[...]), before)  # and never the loaded model's weights


def _readme_commands() -> list[tuple[str, set[str]]]:
    """(job, flags used) of every `python -m experiments.JOB …` command in the README and the docs/ pages,
    continuation lines joined."""
    text = "\n".join(page.read_text() for page in _pages()).replace("\\\n", " ")
    found = []
    for line in text.splitlines():
        for match in re.finditer(r"python -m experiments\.(\w+)(.*)", line):
            used = set()
            for word in shlex.split(match.group(2).split("`")[0]):
                if word in ("&&", ";", "|", ">", "done") or not word.startswith(("--", "[--")):
                    break
                used.update(re.findall(r"--(\w+)", word.split("=")[0]) if word.startswith("--") else
                            re.findall(r"--(\w+)", word))
            found.append((match.group(1), used))
    return found


def test_readme_commands_use_flags_their_job_has():
    """A README or docs/ command with a flag its entry point lacks fails for the first user who copies it."""
    import json
    import subprocess
    import sys

    commands = _readme_commands()
    assert len(commands) >= 10
    jobs = sorted({job for job, _ in commands})
    # One interpreter imports each entry point in turn and lists the flags absl then holds (what its --helpfull
    # prints), removing that job's own flags and modules before the next (one JAX start-up instead of twelve).
    listed = subprocess.run([sys.executable, "-c", _FLAGS_OF_EACH_JOB, *jobs], capture_output=True, text=True,
                            cwd=README.parent, env=cli.subprocess_env(), timeout=300)
    assert listed.returncode == 0, listed.stderr[-2000:]
    known = json.loads(listed.stdout.strip().splitlines()[-1])
    assert "score" not in jobs or "texts_file" in known["score"]  # the listing sees each job's own flags
    for job, used in commands:
        for flag in used:
            name = flag[2:] if flag.startswith("no") and flag[2:] in known[job] else flag  # --noX of a bool X
            assert name in known[job], f"docs: experiments.{job} has no --{flag}"


_FLAGS_OF_EACH_JOB = """
import importlib, json, sys
from absl import flags
import experiments
found = {}
for job in sys.argv[1:]:
    names, modules = set(flags.FLAGS), set(sys.modules)
    importlib.import_module("experiments." + job)
    found[job] = sorted(flags.FLAGS)
""" + cli.FORGET_JOB + """print(json.dumps(found))
"""


def test_readme_library_call_runs_as_written(tmp_path, monkeypatch):
    """The README's one-call job example writes what the sweep entry point writes (500 rows, kind `sweep`), each
    score the reward of a full forward of prompt + token + template suffix."""
    from rmjax.loading import load
    from rmjax.runs import results
    from rmjax.text import chat
    from tests import jitted as M

    (block,) = [b for b in _python_blocks() if "run_sweep(" in b]
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(block, scope)  # noqa: S102 - the README's own code
    table = results.read_scores_csv(scope["csv"])
    assert len(table) == 500 and results.read_meta(scope["csv"])["kind"] == "sweep"
    rm = load("elo-rm-smollm2-135m")
    split = chat.split_chat(rm.tokenizer, scope["PAPER1"]["greatest"])
    for token, got in zip(table["token_id"][:3], table["greatest"][:3], strict=True):
        ids = np.asarray([split.ids_with([int(token)])], np.int32)
        want = float(np.asarray(M.rewards(rm.params, rm.config, ids, np.ones_like(ids, bool)))[0, 0])
        assert abs(got - want) <= tolerance.rewards_atol(rm.params, rm.config, ids)


def test_importing_rmjax_silences_the_no_pytorch_advisory():
    """Issue 45: transformers' "PyTorch was not found" banner printed from the library and the bench scripts
    (the entry points already silenced it). Run where no torch is found, as from the runtime install."""
    import subprocess
    import sys

    code = "import sys; sys.modules['torch'] = None; {} import transformers; from transformers import AutoTokenizer"
    bare = subprocess.run([sys.executable, "-c", code.format("")], capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items() if k != "TRANSFORMERS_NO_ADVISORY_WARNINGS"})
    assert "PyTorch was not found" in bare.stderr  # the advisory this test is about is still what transformers does
    quiet = subprocess.run([sys.executable, "-c", code.format("import rmjax;")], capture_output=True, text=True,
                           env={k: v for k, v in os.environ.items() if k != "TRANSFORMERS_NO_ADVISORY_WARNINGS"})
    assert quiet.returncode == 0 and "PyTorch was not found" not in quiet.stderr, quiet.stderr


def test_readme_models_snippet_runs_as_written(rm_folder):
    """Issue 45: the "Models" snippet used `ids` and `mask` that it never defined. Run on a tiny RM with SmolLM2's
    tokenizer in float32 (its path and dtype swapped; the suite's 8 CPU devices take its data:4,model:2 mesh),
    each row's reward is a full forward's."""
    from tests import jitted as M

    (block,) = [b for b in _python_blocks() if "calls.rewards(" in b]
    block = (block.replace('"/path/to/Skywork-Reward-Llama-3.1-8B-v0.2"', repr(str(rm_folder)))
             .replace('"bfloat16"', '"float32"'))
    scope: dict = {}
    exec(block, scope)  # noqa: S102 - the README's own code
    rm, batch, scores = scope["rm"], scope["batch"], np.asarray(scope["scores"])
    assert scores.shape == (2, 1)
    for row, got in enumerate(scores[:, 0]):
        ids = batch.input_ids[row][batch.attention_mask[row].astype(bool)][None].astype(np.int32)
        want = float(np.asarray(M.rewards(rm.params, rm.config, ids, np.ones_like(ids, bool)))[0, 0])
        assert abs(got - want) <= tolerance.rewards_atol(rm.params, rm.config, ids)


def _links(page: Path) -> list[str]:
    """Every Markdown link target of `page` (inline links), code spans and blocks left out."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    return re.findall(r"\]\(([^)\s]+)\)", text)


def test_readme_is_a_first_read_that_links_every_docs_page():
    """Issue 45: the README was 836 dense lines, NNX internals before the commands a user runs next, and no docs/
    pages. Now: at most 300 lines, `make demo` and `make test` first, every docs/ page linked from it."""
    text = README.read_text()
    assert len(text.splitlines()) <= 300, len(text.splitlines())
    first_block = re.search(r"```\w*\n(.*?)```", text, flags=re.S).group(1)
    assert [line.split()[:2] for line in first_block.splitlines()] == [["make", "demo"], ["make", "test"]]
    pages = sorted(p.name for p in DOCS.glob("*.md"))
    assert {"models-and-loading.md", "sweeps.md", "search.md", "inspect.md", "analyses.md", "training.md",
            "launch.md", "safety.md", "outputs.md", "package-map.md"} <= set(pages)
    linked = {(README.parent / link.split("#")[0]).resolve() for link in _links(README)}
    assert [p for p in pages if (DOCS / p).resolve() not in linked] == []


def test_every_relative_link_in_readme_and_docs_resolves():
    """A link to a moved section or a renamed page is a dead end for a reader: each relative link names a file
    that exists (anchors are checked against the headings of the page they point to)."""
    broken = []
    for page in _pages():
        for link in _links(page):
            if re.match(r"[a-z]+:", link):  # http:, https:, mailto:
                continue
            path, _, anchor = link.partition("#")
            target = (page.parent / path).resolve() if path else page
            if not target.is_file():
                broken.append(f"{page.name}: {link}")
            elif anchor and target.suffix == ".md":
                slugs = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
                         for h in re.findall(r"^#+ (.*)$", target.read_text(), flags=re.M)}
                if anchor not in slugs:
                    broken.append(f"{page.name}: {link} (no such heading)")
    assert broken == []


def test_readme_job_commands_chain_on_files_made_before_them():
    """Issue 45: README examples named inputs nothing creates (`inspect --from_sweep=results/scores.csv`). Every
    input path a README job command reads (`--from_sweep`, `--sweep`, `--init_from`, `--scores`, `--model`,
    `--checkpoint`, …) under results/ or runs/ is a file an earlier README command says it writes."""
    from tests.test_readme_chain import readme_steps

    steps = readme_steps(README.read_text())
    assert len(steps) >= 10
    written: set[str] = set()
    for step in steps:
        for path in re.findall(r"--\w+=((?:results|runs)/[^\s\"']+)", step.command):
            if "--out=" + path in step.command or "--workdir=" + path in step.command or \
                    "--export=" + path in step.command:
                continue
            assert any(w == path or w.startswith(path.rstrip("/") + "/") for w in written), (step.command, path)
        written.update(step.writes)


def test_build_notes_are_by_subsystem_and_short():
    """Issue 45: BUILD_NOTES was a 2,157-line diary ordered by issue and sitting ("Tenth session (issue 25)")."""
    text = (README.parent / "BUILD_NOTES.md").read_text()
    assert len(text.splitlines()) <= 800
    assert re.findall(r"^## (.+)$", text, flags=re.M) == [
        "Model and numerics", "Loading", "Sweep", "Search", "Inspect", "Training", "Plans and launch", "Analyses",
        "Audit", "Safety of results", "The test suite"]
    assert not re.search(r"\b(session|sitting)s?\b", text, flags=re.I)
