"""Issue 42: every stage that reads an earlier result (frontier --sweep, inspect --from_sweep, beam --from_sweep,
gcg --init_from, analyze) reads it only when it was made with the same model content, settings and prompt texts
(rmjax.runs.stages), and records the sha1 of what it read in its own .meta.json. Each test runs the entry points as
a user does and fails on the code before the fix."""

from __future__ import annotations

import hashlib
import json

import pytest

from rmjax.runs import results
from tests import cli, tiny

OTHER_TEXT = "What, in one word, is the worst thing ever?"  # scored under the name `greatest`


@pytest.fixture(scope="module")
def sweeps(rm_folder, tmp_path_factory):
    """Finished sweeps of `greatest` (the first 60 tokens): this RM's, another RM's (same architecture and
    tokenizer, other weights), and this RM's of another text under the name `greatest`."""
    root = tmp_path_factory.mktemp("sweeps")
    _, other = tiny.save_reward_model_with_tokenizer(root / "other_rm", seed=5)
    made = {"ours": (rm_folder, "--prompts=greatest"), "other_model": (other, "--prompts=greatest"),
            "other_text": (rm_folder, "--prompts=", f"--prompt=greatest={OTHER_TEXT}")}
    for name, (model, *prompt) in made.items():
        cli.ok(cli.run("sweep", f"--model={model}", *prompt, f"--out={root / name}.csv", "--limit=60"))
    return {name: root / f"{name}.csv" for name in made}


def _sha1(path) -> str:
    return hashlib.sha1(path.read_bytes()).hexdigest()


def _meta(path) -> dict:
    return json.loads(results.meta_path(path).read_text())


def _frontier(rm_folder, lm_folder, out, *flags):
    return cli.run("frontier", f"--model={rm_folder}", "--prompts=greatest", f"--lm={lm_folder}",
                   f"--judge={lm_folder}", f"--out={out}", "--lambdas=0", "--direction=optimal", "--forwards=40",
                   "--num_tokens=2", "--samples=4", "--beam=2", "--proposals=4", "--search_width=8", "--topk=4",
                   "--top=2", "--front_rows=0", *flags)


def test_frontier_reads_only_a_sweep_of_its_rm_and_prompt_and_records_its_digest(rm_folder, lm_folder, sweeps,
                                                                                  tmp_path):
    """reward_z's yardstick from --sweep: another RM's sweep and a sweep of another text under the prompt's name were
    taken (reward_z against the wrong rewards, exit 0); now each is one line, before any model loads. A sweep of this
    RM and prompt is read, and its sha1 is in frontier.csv.meta.json."""
    out = tmp_path / "f"
    cli.user_error(_frontier(rm_folder, lm_folder, out, f"--sweep={sweeps['other_model']}"), "--sweep",
                   "model.weights")
    cli.user_error(_frontier(rm_folder, lm_folder, out, f"--sweep={sweeps['other_text']}"), "--sweep",
                   "prompts.greatest", OTHER_TEXT)
    assert not (out / "frontier.csv").exists()
    cli.ok(_frontier(rm_folder, lm_folder, out, f"--sweep={sweeps['ours']}"))
    recorded = _meta(out / "frontier.csv")["inputs"]["--sweep"]
    assert recorded == {"path": str(sweeps["ours"]), "sha1": _sha1(sweeps["ours"])}


def test_inspect_reads_only_a_ranking_of_its_model_and_prompt_and_records_its_digest(rm_folder, sweeps, tmp_path):
    """inspect --from_sweep took another model's ranking, or one of another prompt text (its best and worst, so the
    patching map's clean and donor, were another run's); now each is one line, before the model loads. The sweep
    it reads is recorded in reward_lens.csv.meta.json by its sha1."""
    out = tmp_path / "i"
    inspect = ("inspect", f"--model={rm_folder}", "--prompts=greatest", f"--out={out}", "--steps=2", "--top=1",
               "--ig_max_evaluations=8")
    cli.user_error(cli.run(*inspect, f"--from_sweep={sweeps['other_model']}"), "--from_sweep", "model.weights")
    cli.user_error(cli.run(*inspect, f"--from_sweep={sweeps['other_text']}"), "--from_sweep", "prompts.greatest")
    assert not (out / "reward_lens.csv").exists()
    cli.ok(cli.run(*inspect, f"--from_sweep={sweeps['ours']}"))
    recorded = _meta(out / "reward_lens.csv")["inputs"]["--from_sweep"]
    assert recorded == {"path": str(sweeps["ours"]), "sha1": _sha1(sweeps["ours"])}


def test_analyze_refuses_one_prompt_name_for_two_texts(sweeps, tmp_path):
    """Two models' columns named `greatest` but scored for different texts were compared as one prompt; now refused
    in one line naming both files. Tables of one text under one name load as before."""
    from rmjax.analysis import data

    err = cli.user_error(cli.run("analyze", f"--scores={sweeps['other_model']},{sweeps['other_text']}",
                                 f"--out={tmp_path / 'a'}", "--models_yaml=", "--frequencies="),
                         "'greatest'", OTHER_TEXT, "other_model.csv", "other_text.csv")
    assert "cannot be compared" in err
    assert not (tmp_path / "a").exists() or not any((tmp_path / "a").iterdir())
    assert len(data.load_score_tables([sweeps["ours"], sweeps["other_model"]])) == 2


def test_beam_and_gcg_record_what_they_read_and_gcg_refuses_another_tokenizers_beam(rm_folder, sweeps, tmp_path):
    """beam --from_sweep and gcg --init_from record the sha1 of their input under `inputs` as frontier and inspect
    do; gcg refuses, before the weights load, a beam whose token ids are another tokenizer's (same vocabulary
    size, so no id was out of range: the starts were silently other tokens)."""
    beam = tmp_path / "b.csv"
    cli.ok(cli.run("beam", f"--model={rm_folder}", "--prompts=greatest", f"--out={beam}", "--limit=60", "--depth=2",
                   "--beam=2", "--top=4", f"--from_sweep={sweeps['ours']}"))
    assert _meta(beam)["inputs"]["--from_sweep"] == {"path": str(sweeps["ours"]), "sha1": _sha1(sweeps["ours"])}
    gcg = ("gcg", f"--model={rm_folder}", "--prompts=greatest", "--num_tokens=2", "--steps=1", "--search_width=4",
           "--topk=4", "--buffer_size=2", "--noretokenize_filter", "--allow_special")
    cli.ok(cli.run(*gcg, f"--init_from={beam}", f"--out={tmp_path / 'g.json'}"))
    assert _meta(tmp_path / "g.json")["inputs"]["--init_from"] == {"path": str(beam), "sha1": _sha1(beam)}

    swapped = cli.copy_folder(rm_folder, tmp_path / "swapped")
    tokenizer = json.loads((swapped / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    vocab["a"], vocab["b"] = vocab["b"], vocab["a"]
    (swapped / "tokenizer.json").write_text(json.dumps(tokenizer))
    foreign = tmp_path / "foreign.csv"
    cli.ok(cli.run("beam", f"--model={swapped}", "--prompts=greatest", f"--out={foreign}", "--limit=60",
                   "--depth=2", "--beam=2", "--top=4"))
    cli.user_error(cli.run(*gcg, f"--init_from={foreign}", f"--out={tmp_path / 'g2.json'}"), "--init_from",
                   "model.tokenizer")
