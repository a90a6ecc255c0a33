"""--system_prompt: the system message of every scored conversation, part of the result's identity."""

from __future__ import annotations

import numpy as np
import pytest

from rmjax.runs import results
from rmjax.search.sweep import SweepSpec, run_sweep
from tests import cli, inproc, tolerance
from tests import jitted as M

PROMPT = "What, in one word, is the greatest thing ever?"  # --prompts=greatest
TOKENS = (504, 3180, 2683)


def _reference(model, messages: list[dict]) -> float:
    """transformers' own rendering of the conversation, tokenized, and one full forward."""
    text = model.tokenizer.apply_chat_template(messages, tokenize=False)
    ids = np.asarray([model.tokenizer(text, add_special_tokens=False).input_ids], np.int32)
    return float(np.asarray(M.rewards(model.params, model.config, ids, np.ones_like(ids, bool)))[0, 0]), ids.shape[1]


def test_system_prompt_is_each_conversations_system_turn_and_recorded(rm_folder, tmp_path, monkeypatch):
    """Issue 45: SmolLM2's template injected its default system prompt ("You are a helpful AI assistant named
    SmolLM…") into every scored conversation, unsaid, with no flag to set it. Each score is now a full forward of
    the template rendered by transformers with that system message; .meta.json records it and the template's own
    head; a run with another system prompt neither resumes nor reuses the result."""
    from rmjax.loading import load

    model = load(str(rm_folder))
    default_out, own_out = tmp_path / "default.csv", tmp_path / "own.csv"
    run_sweep(SweepSpec(inproc.options(rm_folder, default_out), inproc.prompts(), TOKENS, batch_size=3))
    run_sweep(SweepSpec(inproc.options(rm_folder, own_out, system_prompt="Answer as a pirate."), inproc.prompts(),
                        TOKENS, batch_size=3))
    for out, system in ((default_out, None), (own_out, "Answer as a pirate.")):
        table = results.read_scores_csv(out)
        for token, got in zip(table["token_id"], table["greatest"], strict=True):
            messages = [{"role": "user", "content": PROMPT},
                        {"role": "assistant", "content": model.tokenizer.decode([int(token)])}]
            if system is not None:
                messages.insert(0, {"role": "system", "content": system})
            want, length = _reference(model, messages)
            assert abs(got - want) <= tolerance.any_rewards_atol(model.params, model.config, length + 8)
        meta = results.read_meta(out)
        assert meta["system_prompt"] == system
        assert (system or "You are a helpful AI assistant named SmolLM") in meta["chat_template_head"]
    default, own = (results.read_scores_csv(p)["greatest"].to_numpy() for p in (default_out, own_out))
    assert np.abs(default - own).max() > 1e-4  # the flag changed what was scored
    inproc.no_weights_read(monkeypatch)
    inproc.refused(lambda: run_sweep(SweepSpec(inproc.options(rm_folder, own_out, system_prompt="Be brief."),
                                               inproc.prompts(), TOKENS, batch_size=3)),
                   "already exists", "system_prompt", "--overwrite")


@pytest.fixture(scope="module")
def system_prompt_runs(rm_folder, tmp_path_factory):
    """{job: (process, its folder)} of each job given --system_prompt where it cannot apply, all in one interpreter
    (tests.cli.run_each)."""
    dirs = {job: tmp_path_factory.mktemp(job) for job in ("sweep", "train_rm", "export")}
    flags = {"sweep": ("--template=plain", f"--out={dirs['sweep'] / 's.csv'}"),
             "train_rm": (f"--workdir={dirs['train_rm'] / 'w'}", "--elo=builtin"),
             "export": (f"--out={dirs['export'] / 'e'}",)}
    procs = cli.run_each(*[(job, f"--model={rm_folder}", "--system_prompt=Be brief.", *flags[job]) for job in dirs])
    return {job: (proc, dirs[job]) for job, proc in zip(dirs, procs, strict=True)}


@pytest.mark.parametrize("job", ["sweep", "train_rm", "export"])
def test_system_prompt_refused_where_it_cannot_apply(system_prompt_runs, job):
    """With --template=plain there is no system turn; train_rm and export render with the template's own: each is
    one line before any weight loads, never a flag silently ignored."""
    proc, folder = system_prompt_runs[job]
    cli.user_error(proc, "--system_prompt")
    assert not list(folder.iterdir())


def test_inspect_scores_the_conversation_with_its_system_prompt(rm_folder, tmp_path):
    """Inspect tokenized its responses before loading, with a tokenizer that had not been given --system_prompt:
    its rewards were of conversations without it. Each reward now equals transformers' rendering with it."""
    from rmjax.inspect.job import InspectSpec, run_inspect
    from rmjax.loading import load

    model = load(str(rm_folder))
    responses = ("Love", "War and peace")
    summary = run_inspect(InspectSpec(inproc.options(rm_folder, tmp_path / "inspect", system_prompt="Be a pirate."),
                                      ("greatest", PROMPT), responses=responses, steps=4, max_evaluations=8))
    for response, got in zip(responses, summary["reward"], strict=True):
        want, length = _reference(model, [{"role": "system", "content": "Be a pirate."},
                                          {"role": "user", "content": PROMPT},
                                          {"role": "assistant", "content": response}])
        assert abs(got - want) <= tolerance.any_rewards_atol(model.params, model.config, length + 8), (response, got)


def test_a_system_prompt_stays_with_its_job(rm_folder):
    """Loads of one tokenizer share one object, and --system_prompt was set on it: every later job of the process
    (a library caller's, a test's) rendered that system prompt too. Each job now holds its own copy."""
    from rmjax.loading.for_job import job_fingerprint, load_for_job
    from rmjax.loading.identity import model_fingerprint
    from rmjax.text.chat import system_prompt_of

    pirate_options = inproc.options(rm_folder, None, system_prompt="Answer as a pirate.")
    plain_options = inproc.options(rm_folder, None)
    pirate, plain = load_for_job(pirate_options), load_for_job(plain_options)
    assert system_prompt_of(pirate.tokenizer) == "Answer as a pirate." and system_prompt_of(plain.tokenizer) is None
    assert model_fingerprint(pirate) == job_fingerprint(pirate_options)
    assert model_fingerprint(plain) == job_fingerprint(plain_options)


@pytest.mark.parametrize("kind", ["drops", "raises"])
def test_a_template_that_drops_or_refuses_the_system_turn(rm_folder, tmp_path, monkeypatch, kind):
    """A fault hunt: a chat template that skips system messages scored every conversation without the
    --system_prompt, which .meta.json recorded as used (exit 0, the numbers those without it); one that raises on a
    system turn (Gemma's) advised --template=plain, which --system_prompt then refuses. Both refused before any
    weight, naming the fix that applies."""
    from tests import cli

    folder = cli.copy_folder(rm_folder, tmp_path / "rm")
    skip = ("{% if m['role'] != 'system' %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}"
            if kind == "drops" else "{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
            "{% endif %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n")
    (folder / "chat_template.jinja").write_text("{% for m in messages %}" + skip + "{% endfor %}"
                                                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    out = tmp_path / "s.csv"
    run_sweep(SweepSpec(inproc.options(folder, tmp_path / "plain_run.csv"), inproc.prompts(), TOKENS, batch_size=3))
    inproc.no_weights_read(monkeypatch)
    expected = (["drops the system turn", "'Answer as a pirate.'", "leave --system_prompt out"] if kind == "drops"
                else ["failed on a system + user + assistant conversation", "leave --system_prompt out"])
    inproc.refused(lambda: run_sweep(SweepSpec(inproc.options(folder, out, system_prompt="Answer as a pirate."),
                                               inproc.prompts(), TOKENS, batch_size=3)), *expected)
    assert not out.exists()
