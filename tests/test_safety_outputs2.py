"""Outputs, third round (issue 42): a file at a companion's path that no rmjax run of the output wrote is never
written over unasked, a job refuses the batch size its plan refuses (before its model loads), and --overwrite of a
training folder deletes only what the run wrote there.

Each test failed on the code before its fix: a resumed sweep drew its figure over a foreign OUT.png (and a fresh
one refused it naming the CSV, which did not exist); inspect had no bound on its batch and train_rm none on its
batch either (both ran out of memory, after loading); --overwrite deleted a training workdir or export folder whole,
whatever it held.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from rmjax.errors import OutputExistsError, UsageError
from rmjax.runs import results
from rmjax.runs.chunks import ChunkStore, store_dir
from rmjax.runs.options import RunOptions
from rmjax.search.sweep import SweepSpec, plot_path, run_sweep
from tests import cli, inproc, tiny

PROMPT = "What, in one word, is the greatest thing ever?"
FOREIGN = b"\x89PNG a figure of the user's, not of this sweep"
HUGE = "1000000000000"


@pytest.fixture(scope="module")
def rm(tmp_path_factory):
    """The tiny reward model's folder (with the SmolLM2 tokenizer and chat template)."""
    return tiny.save_reward_model_with_tokenizer(tmp_path_factory.mktemp("rm") / "rm")[1]


def _sweep(folder, out, **settings) -> SweepSpec:
    options = {k: settings.pop(k) for k in ("overwrite",) if k in settings}
    return SweepSpec(RunOptions(model=str(folder), out=str(out), **options), {"greatest": PROMPT}, **settings)


def test_a_resumed_sweep_refuses_a_figure_no_run_of_it_drew(rm, tmp_path, monkeypatch):
    """The resume decision returned before looking at the companions: a foreign OUT.png was drawn over at the end of
    the resumed run. Now it is refused (the saved chunks kept), and the resume goes on once it is moved away."""
    out, png = tmp_path / "s.csv", plot_path(tmp_path / "s.csv")
    spec = _sweep(rm, out, limit=48, chunk_size=16, batch_size=8, plot=True)
    real, calls = ChunkStore.write, []

    def killed_at_second_chunk(self, name, scores):
        calls.append(name)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self, name, scores)

    with monkeypatch.context() as patch:
        patch.setattr(ChunkStore, "write", killed_at_second_chunk)
        with pytest.raises(KeyboardInterrupt):
            run_sweep(spec)
    png.write_bytes(FOREIGN)
    with pytest.raises(OutputExistsError, match=f"{png} already exists and no rmjax run of --out={out} wrote it"):
        run_sweep(spec)
    assert png.read_bytes() == FOREIGN and not out.exists()
    assert sorted(p.name for p in store_dir(out).glob("chunk-*")) == ["chunk-0000000000.npy"]
    png.unlink()
    run_sweep(spec)
    assert json.loads(results.meta_path(out).read_text())["resumed_candidates"] == 16
    assert results.recorded(out, png)


def test_a_fresh_sweep_refuses_a_foreign_figure_in_one_line_and_overwrite_replaces_it(rm, tmp_path):
    """No result and no saved progress, a foreign OUT.png: refused naming it (the old line named the CSV, which did
    not exist); --overwrite replaces it with the sweep's own figure. (`sweep --limit=8 --plot`, in-process.)"""
    out, png = tmp_path / "s.csv", plot_path(tmp_path / "s.csv")
    png.write_bytes(FOREIGN)
    inproc.refused(lambda: run_sweep(_sweep(rm, out, limit=8, batch_size=8, plot=True)), str(png), "no rmjax run of",
                   "--overwrite")
    assert png.read_bytes() == FOREIGN and not out.exists()
    run_sweep(_sweep(rm, out, limit=8, batch_size=8, plot=True, overwrite=True))
    assert png.read_bytes() != FOREIGN and results.recorded(out, png)


def test_a_companion_is_written_over_only_when_its_output_records_it(tmp_path):
    """The rule every job's companions share (a GCG steps CSV, a frontier's figure): one recorded, byte for byte, in
    the output's .meta.json is the run's own; any other file there is refused unless --overwrite, which removes it."""
    from rmjax.runs.claims import claim

    out, steps = tmp_path / "g.json", tmp_path / "g.steps.csv"
    steps.write_text("theirs\n")
    with pytest.raises(OutputExistsError, match=f"{steps} already exists and no rmjax run"):
        with claim(out, {"job": "gcg", "steps": 1}, owned=[steps]):
            pass
    assert steps.read_text() == "theirs\n"
    with claim(out, {"job": "gcg", "steps": 1}, owned=[steps], overwrite=True):
        assert not steps.exists()
    out.write_text("{}")
    steps.write_text("ours\n")
    results.write_meta(out, files=[steps], kind="gcg", identity={"job": "gcg", "steps": 1})
    with pytest.raises(OutputExistsError, match="holds the result of a run with different steps"):
        with claim(out, {"job": "gcg", "steps": 2}, owned=[steps]):  # its own companion: the usual refusal
            pass
    steps.write_text("changed\n")
    with pytest.raises(OutputExistsError, match=f"{steps} already exists"):
        with claim(out, {"job": "gcg", "steps": 2}, owned=[steps]):
            pass


def test_a_result_its_record_does_not_describe_is_refused_as_such(tmp_path):
    """An --overwrite run of a job without saved progress (score, logprobs) killed between its new result and its
    record leaves the new file beside the old run's .meta.json: a rerun of either run is refused, naming the
    mismatch and --overwrite, and not as a finished result of the old run's inputs."""
    from rmjax.runs.claims import claim

    out, old, new = tmp_path / "s.csv", {"job": "score", "model": "a"}, {"job": "score", "model": "b"}
    out.write_text("token,a\n")
    results.write_meta(out, kind="score", identity=old)
    with pytest.raises(OutputExistsError, match="holds the result of a run with different model"):
        with claim(out, new):  # the record describes the file: the usual refusal
            pass
    out.write_text("token,b\n")  # the new run's result, written; its record never was
    for identity in (new, old):
        with pytest.raises(OutputExistsError, match="does not match its s.csv.meta.json") as refused:
            with claim(out, identity):
                pass
        assert "--overwrite" in str(refused.value) and "holds the result of" not in str(refused.value)
    assert out.read_text() == "token,b\n"
    # an older record listing its files without digests says nothing of the file: the usual refusal
    record = json.loads(results.meta_path(out).read_text())
    results.meta_path(out).write_text(json.dumps({**record, "files": [out.name]}))
    with pytest.raises(OutputExistsError, match="holds the result of a run with different model"):
        with claim(out, new):
            pass


def test_inspect_refuses_the_batch_its_plan_refuses_before_loading(rm, tmp_path, monkeypatch):
    """inspect padded each call to --batch_size path points with no bound (10^12: out of memory after loading);
    its plan refused past 1024. Both refuse by one check now, before anything loads. (`inspect --responses=love,war
    --batch_size=HUGE`, in-process: a run that went on would fail at its first weight read, tests/inproc.py.)"""
    from rmjax.inspect.job import InspectSpec, run_inspect
    from rmjax.plan.spec import plan_inputs

    inproc.no_weights_read(monkeypatch)
    line = inproc.refused(lambda: run_inspect(InspectSpec(
        inproc.options(rm, tmp_path / "i"), next(iter(inproc.prompts("greatest").items())), responses=("love", "war"),
        batch_size=int(HUGE))), f"--batch_size={HUGE}", "1024 path points")
    assert not (tmp_path / "i").exists()
    with pytest.raises(UsageError) as planned:
        plan_inputs(str(rm), "v5e:2x2", "inspect", batch_size=int(HUGE))
    assert line == f"error: {planned.value}"


def _pairs(path, n: int = 48):
    """Preference pairs whose split by item leaves both a training and a held-out part (tests/test_safety_resume)."""
    nouns = ["apple", "river", "house", "music", "dog", "book", "tree", "city", "light", "stone", "garden", "road"]
    rng = np.random.default_rng(4)
    pd.DataFrame({"prompt": "Which is better?", "chosen": [f"good {x}" for x in rng.choice(nouns, n)],
                  "rejected": [f"bad {x}" for x in rng.choice(nouns, n)]}).to_csv(path, index=False)
    return path


def test_train_rm_refuses_a_batch_past_its_training_pairs_before_loading(lm_folder, tmp_path, monkeypatch):
    """train_rm built a step of --batch_size indices with no bound (10^12: out of memory after loading). It and its
    plan refuse a batch past the training pairs by one check, before anything loads. (`train_rm --pairs=…
    --batch_size=HUGE`, in-process: a run that went on would fail at its first weight read, tests/inproc.py.)"""
    from rmjax.plan.spec import plan_inputs
    from rmjax.train.recipe import load_pairs

    pairs = _pairs(tmp_path / "p.csv")
    train = load_pairs(str(pairs), None, 1, 1, False, 0)[0]
    inproc.no_weights_read(monkeypatch)
    line = inproc.refused(lambda: inproc.train_rm(lm_folder, pairs=pairs, batch_size=int(HUGE),
                                                  workdir=tmp_path / "w"),
                          f"--batch_size={HUGE}", f"the {len(train)} training pairs")
    assert not (tmp_path / "w").exists()
    with pytest.raises(UsageError) as planned:
        plan_inputs(str(lm_folder), "v5e:2x2", "train_rm", batch_size=int(HUGE), n_train=len(train))
    assert line == f"error: {planned.value}"


def test_train_rm_refuses_a_pair_past_the_context_and_a_head_out_folder_before_loading(lm_folder, tmp_path,
                                                                                        monkeypatch):
    """A fault hunt: --trainable=last_k (and full) trained on a conversation longer than the model's context (512
    positions here) without a word, and the head refused it only after loading; --head_out=dir/ wrote a file `dir`."""
    pairs = _pairs(tmp_path / "p.csv")
    long = tmp_path / "long.csv"
    long.write_text(pairs.read_text() + f"Which is better?,{'word ' * 600},bad stone\n")
    inproc.no_weights_read(monkeypatch)
    for trainable in ("last_k", "head"):
        inproc.refused(lambda trainable=trainable: inproc.train_rm(lm_folder, pairs=long, trainable=trainable,
                                                                   batch_size=8, workdir=tmp_path / "w"),
                       "more than", "context of 512", "shorten or drop that pair")
    inproc.refused(lambda: inproc.train_rm(lm_folder, pairs=pairs, workdir=tmp_path / "w", batch_size=8,
                                           head_out=f"{tmp_path / 'heads'}/"), "--head_out=", "ends in a separator")
    assert not (tmp_path / "w").exists() and not (tmp_path / "heads").exists()


def test_an_export_trained_on_the_plain_format_reads_plain_under_auto(lm_folder, tmp_path):
    """A fault hunt: an export of a --template=plain run kept the base's chat template, so --template=auto (every
    job's default) scored it in a format it was not trained on. Now the export carries no chat template: auto reads
    the same token ids as plain (the export's weights are the trained ones: test_train's saved-folder test)."""
    from rmjax.loading import load
    from rmjax.scoring.texts import TextScorer
    from rmjax.text.chat import has_chat_template

    pairs = _pairs(tmp_path / "p.csv")
    inproc.train_rm(lm_folder, pairs=pairs, steps=2, batch_size=8, template="plain", workdir=tmp_path / "w",
                    export=tmp_path / "hf")
    model = load(str(tmp_path / "hf"))
    assert not has_chat_template(model.tokenizer) and has_chat_template(load(str(lm_folder)).tokenizer)
    texts = ["good apple", "bad road"]
    auto, plain = (TextScorer(model, "Which is better?", t) for t in ("auto", "plain"))
    assert auto.token_ids(texts) == plain.token_ids(texts)
    np.testing.assert_array_equal(auto.score(texts, 8), plain.score(texts, 8))


def _tree(folder) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_overwrite_of_a_training_folder_deletes_only_what_the_run_wrote(lm_folder, tmp_path):
    """--overwrite deleted a workdir or an export folder whole when an rmjax run had made it, a user's files in it
    too. A folder holding a file its run did not write is refused, naming it, with nothing deleted (not even the
    workdir's checkpoints before the export's refusal); one holding only the run's files is replaced, the export
    inside the workdir as the usage line has it. (train_rm's run_training, in-process.)"""
    work = tmp_path / "work"
    pairs = _pairs(tmp_path / "p.csv")

    def train_rm(**settings):
        return inproc.train_rm(lm_folder, pairs=pairs, steps=2, checkpoint_every=2, batch_size=8, workdir=work,
                               export=work / "hf", **settings)

    train_rm(learning_rate=0.05)
    for mine in (work / "hf" / "notes.txt", work / "notes.txt"):
        mine.write_text("the user's")
        before = _tree(work)
        inproc.refused(lambda: train_rm(learning_rate=0.02, overwrite=True),
                       "--overwrite would delete", f"holds {mine},", "no rmjax job wrote")
        assert _tree(work) == before
        mine.unlink()
    train_rm(learning_rate=0.02, overwrite=True)
    assert json.loads((work / "run.json").read_text())["identity"]["config"]["learning_rate"] == 0.02
    summary = json.loads((work / "hf" / "rmjax_training.json").read_text())
    assert summary["config"]["learning_rate"] == 0.02


def test_a_workdir_holding_only_the_runs_other_outputs_is_a_new_one(tmp_path):
    """All of a run's outputs are decided before its workdir records the run: a refusal of a later output leaves
    the export folder inside the workdir created and empty, and the rerun still finds a new workdir, not a folder of
    the user's. Only the run's own files are cleared by --overwrite; its export inside is its own claim's."""
    from rmjax.runs.claims import Output, claim_all
    from rmjax.train.workdir import WORKDIR_FILES, start_workdir, workdir_output

    work = tmp_path / "work"
    (work / "hf").mkdir(parents=True)
    with claim_all([workdir_output(work, {"job": "train_rm", "run": 1}, False, beside=[work / "hf"])]) as (claimed,):
        assert not claimed.reuse and not claimed.remove
        start_workdir(work, {"job": "train_rm", "run": 1}, claimed)
    (work / "checkpoints" / "2").mkdir(parents=True)
    (work / "hf" / "theirs.txt").write_text("kept")
    with claim_all([Output(work, {"job": "train_rm", "run": 2}, overwrite=True, meta=work / "run.json",
                           folder=WORKDIR_FILES, flag="--workdir", beside=(work / "hf",))]) as (claimed,):
        assert sorted(p.name for p in claimed.remove) == ["checkpoints", "run.json"]
    assert sorted(p.name for p in work.iterdir()) == ["hf"] and (work / "hf" / "theirs.txt").read_text() == "kept"


# A figure drawn with the file-size limit (RLIMIT_FSIZE; Python ignores SIGXFSZ) below its size: as on a full disk.
_FIGURE_UNDER_LIMIT = (
    "import resource, sys\n"
    "from rmjax.analysis import plots\n"
    "fig, ax = plots.plt.subplots(figsize=(6, 4)); ax.plot(range(100), [i * i for i in range(100)])\n"
    "resource.setrlimit(resource.RLIMIT_FSIZE, (2000, resource.RLIM_INFINITY))\n"
    "plots._save(fig, sys.argv[1])\n")


def test_a_figure_cut_by_a_full_disk_leaves_the_old_one_and_no_temp_file(tmp_path):
    """savefig wrote straight to the figure's name, so a full disk left a cut PNG there (and replaced a good one);
    now the figure is written beside it and renamed only once whole."""
    png = tmp_path / "figure.png"
    old = b"\x89PNG an earlier, whole figure"
    png.write_bytes(old)
    proc = subprocess.run([sys.executable, "-c", _FIGURE_UNDER_LIMIT, str(png)], cwd=cli.REPO, env=cli.subprocess_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and f"File too large: '{png}'" in proc.stderr, proc.stderr[-2000:]
    assert png.read_bytes() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["figure.png"]


def test_an_output_column_the_head_lacks_is_refused_before_overwrite_deletes_anything(rm, tmp_path, monkeypatch):
    """A fault hunt: `score --overwrite --output_column=3` on a one-output head deleted the earlier result, read the
    weights, and only then refused the column (as did inspect). The config says it first."""
    from rmjax.scoring.texts import ScoreSpec, run_score

    out = tmp_path / "s.csv"
    run_score(ScoreSpec(inproc.options(rm, out), inproc.prompts("greatest"), ("love",), z_sample=0))
    before = out.read_bytes()
    with monkeypatch.context() as patch:
        inproc.no_weights_read(patch)
        inproc.refused(lambda: run_score(ScoreSpec(inproc.options(rm, out, overwrite=True, output_column=3),
                                                   inproc.prompts("greatest"), ("love", "war"), z_sample=0)),
                       "--output_column=3", "has 1 reward outputs")
    assert out.read_bytes() == before and results.meta_path(out).is_file()


def test_a_run_refused_or_stopped_after_its_claim_keeps_the_result_overwrite_would_replace(rm_folder, tmp_path,
                                                                                           monkeypatch):
    """--overwrite deleted the old result at the claim, before checks that run after it (an id outside the
    vocabulary, a batch larger than the candidates: beam, gcg and the frontier have their own), so a typo cost a
    finished result. It is now kept whole until the new one is written; a stopped --overwrite run leaves it too, and
    the resume that finishes it leaves none of it beside the new result (its figure included)."""
    out = tmp_path / "s.csv"
    run_sweep(SweepSpec(inproc.options(rm_folder, out), inproc.prompts(), limit=16, batch_size=8, plot=True))
    old = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    assert {"s.csv", "s.csv.meta.json", plot_path(out).name} <= set(old)
    again = inproc.options(rm_folder, out, overwrite=True)
    inproc.refused(lambda: run_sweep(SweepSpec(again, inproc.prompts(), token_ids=(5, 6, 10**6))),
                   "outside the vocabulary")
    inproc.refused(lambda: run_sweep(SweepSpec(again, inproc.prompts(), limit=8, batch_size=64)), "more than")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == old
    real_write, writes = ChunkStore.write, []

    def stop_at_the_second(self, start, scores):
        if writes:
            raise KeyboardInterrupt
        writes.append(start)
        real_write(self, start, scores)

    monkeypatch.setattr(ChunkStore, "write", stop_at_the_second)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(SweepSpec(again, inproc.prompts(), limit=24, batch_size=8, chunk_size=8))
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == old
    monkeypatch.setattr(ChunkStore, "write", real_write)
    # the old flags reuse the old result, and leave the stopped run's saved progress to its own rerun
    run_sweep(SweepSpec(inproc.options(rm_folder, out), inproc.prompts(), limit=16, batch_size=8, plot=True))
    assert (store_dir(out) / "chunk-0000000000.npy").is_file()
    run_sweep(SweepSpec(inproc.options(rm_folder, out), inproc.prompts(), limit=24, batch_size=8, chunk_size=8))
    assert len(pd.read_csv(out)) == 24 and not plot_path(out).exists()
    assert json.loads(results.meta_path(out).read_text())["resumed_candidates"] == 8


def test_a_name_whose_record_the_file_system_would_refuse_is_refused_first(rm_folder, tmp_path, monkeypatch):
    """A 240-byte --out took the whole sweep, then its .meta.json's temp name passed the 255-byte limit: a
    traceback, a CSV without its record, and a rerun that did the same. Refused now before anything is written."""
    long = tmp_path / ("b" * 236 + ".csv")
    inproc.no_weights_read(monkeypatch)
    inproc.refused(lambda: run_sweep(SweepSpec(inproc.options(rm_folder, long), inproc.prompts(), limit=8)),
                   "240 bytes", "give a name of at most")
    assert not list(tmp_path.iterdir())


def test_the_sweep_replaces_only_a_figure_it_draws_or_its_result_recorded(rm_folder, tmp_path):
    """Without --plot the sweep draws no figure, yet --overwrite deleted a user's own s.csv.png. Now that name is
    the run's only when it draws one, or when the result it replaces recorded one (then it goes with that result)."""
    out = tmp_path / "s.csv"
    run_sweep(SweepSpec(inproc.options(rm_folder, out), inproc.prompts(), limit=8))
    plot_path(out).write_bytes(b"mine")
    run_sweep(SweepSpec(inproc.options(rm_folder, out, overwrite=True), inproc.prompts(), limit=16))
    assert plot_path(out).read_bytes() == b"mine" and len(pd.read_csv(out)) == 16
    run_sweep(SweepSpec(inproc.options(rm_folder, out, overwrite=True), inproc.prompts(), limit=8, plot=True))
    assert results.recorded(out, plot_path(out))  # drawn over it: --overwrite asked, and the run draws one there
    run_sweep(SweepSpec(inproc.options(rm_folder, out, overwrite=True), inproc.prompts(), limit=16))
    assert not plot_path(out).exists()  # the replaced result's figure, not left beside the new one
