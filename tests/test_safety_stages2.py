"""Issue 42: every stage that reads an earlier result (frontier --sweep, inspect --from_sweep, beam --from_sweep,
gcg --init_from, analyze) reads it only when it was made with the same model content, settings and prompt texts
(rmjax.runs.stages), and records the sha1 of what it read in its own .meta.json. Each test fails on the code before
the fix. The jobs run in-process as their entry points call them (tests/inproc.py): the stage check is the jobs'
own; analyze's refusal runs as the command, its one line and status being the point there."""

from __future__ import annotations

import hashlib
import json

import pytest

from rmjax.runs import results
from rmjax.search.beam import BeamConfig
from rmjax.search.beam_job import BeamSpec, run_beam
from rmjax.search.sweep import SweepSpec, run_sweep
from tests import cli, inproc, tiny

OTHER_TEXT = "What, in one word, is the worst thing ever?"  # scored under the name `greatest`


@pytest.fixture(scope="module")
def sweeps(rm_folder, tmp_path_factory):
    """Finished sweeps of `greatest` (the first 60 tokens): this RM's, another RM's (same architecture and
    tokenizer, other weights), and this RM's of another text under the name `greatest`."""
    root = tmp_path_factory.mktemp("sweeps")
    _, other = tiny.save_reward_model_with_tokenizer(root / "other_rm", seed=5)
    made = {"ours": (rm_folder, inproc.prompts("greatest")), "other_model": (other, inproc.prompts("greatest")),
            "other_text": (rm_folder, inproc.prompts(greatest=OTHER_TEXT))}  # --prompts= --prompt=greatest=...
    for name, (model, prompts) in made.items():
        run_sweep(SweepSpec(inproc.options(model, root / f"{name}.csv"), prompts, limit=60))
    return {name: root / f"{name}.csv" for name in made}


def _sha1(path) -> str:
    return hashlib.sha1(path.read_bytes()).hexdigest()


def _meta(path) -> dict:
    return json.loads(results.meta_path(path).read_text())


def _frontier(rm_folder, lm_folder, out, sweep):
    """frontier --prompts=greatest --lambdas=0 --direction=optimal --forwards=40 --num_tokens=2 --samples=4 --beam=2
    --proposals=4 --search_width=8 --topk=4 --top=2 --front_rows=0 --sweep=SWEEP."""
    from rmjax.search.fluent import FluentConfig
    from rmjax.search.frontier_job import FrontierConfig, FrontierSpec, run_frontier

    return run_frontier(FrontierSpec(
        inproc.options(rm_folder, out), inproc.prompts("greatest"),
        FrontierConfig(lambdas=(0.0,), direction="optimal", forwards=40, top=2, front_rows=0),
        FluentConfig(num_tokens=2, samples=4, beam=2, proposals=4, search_width=8, topk=4),
        lm=str(lm_folder), judge=str(lm_folder), sweep=str(sweep)))


def test_frontier_reads_only_a_sweep_of_its_rm_and_prompt_and_records_its_digest(rm_folder, lm_folder, sweeps,
                                                                                  tmp_path, monkeypatch):
    """reward_z's yardstick from --sweep: another RM's sweep and a sweep of another text under the prompt's name were
    taken (reward_z against the wrong rewards, exit 0); now each is one line, before any model loads. A sweep of this
    RM and prompt is read, and its sha1 is in frontier.csv.meta.json."""
    out = tmp_path / "f"
    with monkeypatch.context() as patch:
        inproc.no_weights_read(patch)
        inproc.refused(lambda: _frontier(rm_folder, lm_folder, out, sweeps["other_model"]), "--sweep",
                       "model.weights")
        inproc.refused(lambda: _frontier(rm_folder, lm_folder, out, sweeps["other_text"]), "--sweep",
                       "prompts.greatest", OTHER_TEXT)
    assert not (out / "frontier.csv").exists()
    _frontier(rm_folder, lm_folder, out, sweeps["ours"])
    recorded = _meta(out / "frontier.csv")["inputs"]["--sweep"]
    assert recorded == {"path": str(sweeps["ours"]), "sha1": _sha1(sweeps["ours"])}


def test_inspect_reads_only_a_ranking_of_its_model_and_prompt_and_records_its_digest(rm_folder, sweeps, tmp_path,
                                                                                     monkeypatch):
    """inspect --from_sweep took another model's ranking, or one of another prompt text (its best and worst, so the
    patching map's clean and donor, were another run's); now each is one line, before the model loads. The sweep
    it reads is recorded in reward_lens.csv.meta.json by its sha1."""
    from rmjax.inspect.job import InspectSpec, run_inspect

    out = tmp_path / "i"

    def inspect(sweep):  # inspect --prompts=greatest --steps=2 --top=1 --ig_max_evaluations=8 --from_sweep=SWEEP
        (prompt,) = inproc.prompts("greatest").items()
        return run_inspect(InspectSpec(inproc.options(rm_folder, out), prompt, source=str(sweep), top=1, steps=2,
                                       max_evaluations=8, source_flag="--from_sweep"))

    with monkeypatch.context() as patch:
        inproc.no_weights_read(patch)
        inproc.refused(lambda: inspect(sweeps["other_model"]), "--from_sweep", "model.weights")
        inproc.refused(lambda: inspect(sweeps["other_text"]), "--from_sweep", "prompts.greatest")
    assert not (out / "reward_lens.csv").exists()
    inspect(sweeps["ours"])
    recorded = _meta(out / "reward_lens.csv")["inputs"]["--from_sweep"]
    assert recorded == {"path": str(sweeps["ours"]), "sha1": _sha1(sweeps["ours"])}


def test_analyze_refuses_one_prompt_name_for_two_texts(sweeps, tmp_path):
    """Two models' columns named `greatest` but scored for different texts were compared as one prompt; now refused
    in one line naming both files. Tables of one text under one name load as before."""
    from rmjax.analysis import data

    err = inproc.refused(lambda: inproc.analyze(tmp_path / "a", scores=(str(sweeps["other_model"]),
                                                                      str(sweeps["other_text"])),
                                                models_yaml=None, frequencies=None),
                         "'greatest'", OTHER_TEXT, "other_model.csv", "other_text.csv")
    assert "cannot be compared" in err
    assert not (tmp_path / "a").exists() or not any((tmp_path / "a").iterdir())
    assert len(data.load_score_tables([sweeps["ours"], sweeps["other_model"]])) == 2


def test_beam_and_gcg_record_what_they_read_and_gcg_refuses_another_tokenizers_beam(rm_folder, sweeps, tmp_path,
                                                                                     monkeypatch):
    """beam --from_sweep and gcg --init_from record the sha1 of their input under `inputs` as frontier and inspect
    do; gcg refuses, before the weights load, a beam whose token ids are another tokenizer's (same vocabulary
    size, so no id was out of range: the starts were silently other tokens)."""
    from rmjax.search.gcg_config import GCGConfig
    from rmjax.search.gcg_job import GcgSpec, run_gcg

    def beam(model, out, **spec):  # beam --prompts=greatest --limit=60 --depth=2 --beam=2 --top=4
        return run_beam(BeamSpec(inproc.options(model, out), inproc.prompts("greatest"),
                                 BeamConfig(depth=2, beam=2, top=4, allow_special=True), limit=60, **spec))

    def gcg(init_from, out):  # gcg --prompts=greatest --num_tokens=2 --steps=1 --search_width=4 --topk=4
        # --buffer_size=2 --noretokenize_filter --allow_special --init_from=BEAM
        return run_gcg(GcgSpec(inproc.options(rm_folder, out), inproc.prompts("greatest"), GCGConfig(
            num_tokens=2, steps=1, search_width=4, topk=4, buffer_size=2, retokenize_filter=False,
            allow_special=True, init_from=str(init_from))))

    ours = tmp_path / "b.csv"
    beam(rm_folder, ours, from_sweep=str(sweeps["ours"]))
    assert _meta(ours)["inputs"]["--from_sweep"] == {"path": str(sweeps["ours"]), "sha1": _sha1(sweeps["ours"])}
    gcg(ours, tmp_path / "g.json")
    assert _meta(tmp_path / "g.json")["inputs"]["--init_from"] == {"path": str(ours), "sha1": _sha1(ours)}

    swapped = cli.copy_folder(rm_folder, tmp_path / "swapped")
    tokenizer = json.loads((swapped / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    vocab["a"], vocab["b"] = vocab["b"], vocab["a"]
    (swapped / "tokenizer.json").write_text(json.dumps(tokenizer))
    foreign = tmp_path / "foreign.csv"
    beam(swapped, foreign)
    inproc.no_weights_read(monkeypatch)
    inproc.refused(lambda: gcg(foreign, tmp_path / "g2.json"), "--init_from", "model.tokenizer")
