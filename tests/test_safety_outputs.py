"""Saved progress and outputs (issue 42): what a job writes is whole or absent, what it deletes is its own, what it
reports is what it computed.

Each test failed on the code before its fix: a short chunk write committed as complete, a frontier unit split over
two files, --overwrite deleting a chunk folder whatever it held, a reused sweep reporting a foreign figure, a resume
mixing batch sizes, and two mutants the suite let through (a sweep chunk stored before its NaN check, the CSV's
token_id column out of step with its rows).
"""

from __future__ import annotations

import io
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from rmjax.errors import NonFiniteError, OutputExistsError, ResumeMismatchError
from rmjax.runs import results
from rmjax.runs.chunks import ChunkStore, store_dir
from rmjax.runs.options import RunOptions
from rmjax.search.sweep import SweepSpec, plot_path, run_sweep
from tests import cli, inproc, tiny, tolerance

PROMPT = "What, in one word, is the greatest thing ever?"


@pytest.fixture(scope="module")
def rm(tmp_path_factory):
    """The tiny reward model (transformers' copy for the reference forwards) and its folder."""
    return tiny.save_reward_model_with_tokenizer(tmp_path_factory.mktemp("rm") / "rm")


@pytest.fixture(scope="module")
def nan_rm(rm, tmp_path_factory):
    """The tiny RM with a NaN embedding row: every response holding token 20 scores NaN."""
    model = cli.copy_folder(rm[1], tmp_path_factory.mktemp("nan") / "model")
    cli.edit_tensor(model, "model.embed_tokens.weight", lambda w: np.where(np.arange(len(w))[:, None] == 20, np.nan, w))
    return model


def _sweep(folder, out, **settings) -> SweepSpec:
    options = {k: settings.pop(k) for k in ("overwrite", "allow_nonfinite") if k in settings}
    return SweepSpec(RunOptions(model=str(folder), out=str(out), **options), {"greatest": PROMPT}, **settings)


def _chunks(out) -> list[str]:
    return sorted(p.name for p in store_dir(out).glob("*"))


# The sweep with the file-size limit (RLIMIT_FSIZE; Python ignores SIGXFSZ) set as its second chunk is written:
# the kernel stops that file at 400 bytes and write() reports no error, as on a full disk.
_SHORT_AFTER_FIRST_CHUNK = (
    "import resource, runpy, sys; import rmjax.runs.chunks as c; real = c.ChunkStore.write; n = []\n"
    "def write(self, name, scores):\n"
    "    n.append(name)\n"
    "    if len(n) == 2: resource.setrlimit(resource.RLIMIT_FSIZE, (400, resource.RLIM_INFINITY))\n"
    "    return real(self, name, scores)\n"
    "c.ChunkStore.write = write; runpy.run_module(sys.argv.pop(1), run_name='__main__')")


def test_a_short_chunk_write_fails_at_once_and_the_rerun_resumes(rm, tmp_path):
    """np.save does not raise on a short write: a full disk committed truncated chunks as complete, and the rerun
    the error advised refused them. Now a chunk is renamed into place only once its bytes are proven on disk."""
    out = tmp_path / "s.csv"
    flags = [f"--model={rm[1]}", "--prompts=greatest", f"--out={out}", "--limit=384", "--chunk_size=128",
             "--batch_size=64", "--top=1"]  # a chunk: 640 bytes
    proc = subprocess.run([sys.executable, "-c", _SHORT_AFTER_FIRST_CHUNK, "experiments.sweep", *flags], cwd=cli.REPO,
                          env=cli.subprocess_env(), capture_output=True, text=True, timeout=600)
    line = cli.user_error(proc, f"cannot write {store_dir(out) / 'chunk-0000000128.npy'}", "not saved",
                          "free space", "rerun", loaded=True)
    assert "chunk" in line
    assert _chunks(out) == ["chunk-0000000000.npy", "manifest.json"] and not out.exists()
    cli.ok(cli.run("sweep", *flags))
    clean = tmp_path / "clean.csv"  # the same flags' uninterrupted run, in-process (tests/inproc.py)
    run_sweep(SweepSpec(inproc.options(rm[1], clean), inproc.prompts("greatest"), limit=384, chunk_size=128,
                        batch_size=64))
    assert out.read_bytes() == clean.read_bytes()
    assert json.loads(results.meta_path(out).read_text())["resumed_candidates"] == 128


def test_a_silently_short_chunk_write_is_caught_by_its_read_back(tmp_path, monkeypatch):
    """A write that reports success and leaves the file short (np.save under the limit above did) is caught by the
    size and read-back checks: nothing under a chunk's name, no temp file left."""
    from rmjax.runs import chunks

    class HalfWritten(io.FileIO):
        def write(self, data):
            super().write(bytes(data)[: len(data) // 2])
            return len(data)

    store = ChunkStore(tmp_path / "u.csv", {"job": "test"}, 4)
    monkeypatch.setattr(chunks, "open", lambda path, mode: HalfWritten(path, mode.replace("b", "")), raising=False)
    with pytest.raises(OSError, match=r"only \d+ of its 160 bytes reached the disk.*not saved") as error:
        store.write(0, np.ones((8, 1), np.float32))
    assert error.value.filename == str(store.dir / "chunk-0000000000.npy")
    assert _chunks(tmp_path / "u.csv") == ["manifest.json"]


def test_a_frontier_unit_is_one_chunk_and_a_bad_one_is_named(rm, lm_folder, tmp_path, monkeypatch):
    """A frontier killed between a unit's two chunk writes left a store whose error named a file that did not exist
    (the unit's second). A unit is one chunk now: killed at any write, the rerun resumes byte for byte; and a
    damaged unit is refused naming the one file to delete, after which the rerun recomputes it. (The small frontier
    of test_safety_jobs: one λ, so two units, search and best-of-N.)"""
    import shutil

    from rmjax.search.frontier_job import csv_path, run_frontier
    from tests.test_safety_jobs import frontier_spec

    clean = tmp_path / "clean"
    run_frontier(frontier_spec(rm[1], lm_folder, clean))
    want = csv_path(clean).read_bytes()
    out = tmp_path / "f"
    inproc.killed_at_write(monkeypatch, 2, lambda: run_frontier(frontier_spec(rm[1], lm_folder, out)))
    assert _chunks(csv_path(out)) == ["chunk-u0000.npy", "manifest.json"]
    damaged = tmp_path / "d"
    shutil.copytree(out, damaged)
    run_frontier(frontier_spec(rm[1], lm_folder, out))
    assert csv_path(out).read_bytes() == want

    unit = store_dir(csv_path(damaged)) / "chunk-u0000.npy"
    unit.write_bytes(unit.read_bytes()[:-40])
    with pytest.raises(ResumeMismatchError, match=f"delete {unit} and rerun"):
        run_frontier(frontier_spec(rm[1], lm_folder, damaged))
    np.save(unit, np.zeros((3, 6)))  # readable, but not a unit
    with pytest.raises(ResumeMismatchError, match=f"{unit} is not a frontier unit.*delete {unit} and rerun"):
        run_frontier(frontier_spec(rm[1], lm_folder, damaged))
    unit.unlink()
    run_frontier(frontier_spec(rm[1], lm_folder, damaged))
    assert csv_path(damaged).read_bytes() == want


def test_overwrite_deletes_only_the_jobs_own_saved_progress(rm, tmp_path, monkeypatch):
    """--overwrite deleted OUT.chunks/ whatever it held (another job's finished result in it was lost). It refuses
    a chunk folder holding anything a job did not write, naming it; one holding only a job's files is cleared."""
    from rmjax.runs.claims import claim

    out = tmp_path / "s.csv"
    store = store_dir(out)
    store.mkdir()
    (store / "manifest.json").write_text('{"identity": {"job": "sweep", "model": "other"}, "chunk_size": 4}')
    np.save(store / "chunk-0000000000.npy", np.zeros((4, 1), np.float32))
    (store / "tmp-chunk-0000000004.npy").write_bytes(b"\x93NUMPY")
    (store / "theirs.csv").write_text("token_id,score\n1,2.5\n")
    with monkeypatch.context() as patch:  # `sweep --limit=8 --overwrite`, in-process: refused before loading
        inproc.no_weights_read(patch)
        inproc.refused(lambda: run_sweep(_sweep(rm[1], out, limit=8, overwrite=True)), "--overwrite would delete",
                       f"{store / 'theirs.csv'}", "no rmjax job wrote")
    assert _chunks(out) == ["chunk-0000000000.npy", "manifest.json", "theirs.csv", "tmp-chunk-0000000004.npy"]

    (store / "theirs.csv").unlink()
    with claim(out, {"job": "sweep", "model": "this"}, overwrite=True, store=store) as decision:
        assert not decision.reuse and not decision.resume
    assert not store.exists()


def test_a_reused_sweep_reports_only_the_figure_its_meta_records(rm, tmp_path):
    """A reused sweep with --plot reported whatever OUT.png was there as its figure. The figure is drawn before the
    .meta.json, which records its digest; a reuse reports it only when recorded (and unchanged, as the claim checks
    every recorded file), draws and records it when absent, and refuses a file it did not draw."""
    out = tmp_path / "s.csv"
    png = plot_path(out)
    run_sweep(_sweep(rm[1], out, limit=8, batch_size=8))
    png.write_bytes(b"not this sweep's figure")
    with pytest.raises(OutputExistsError, match=f"{png} is not the figure of {out}"):
        run_sweep(_sweep(rm[1], out, limit=8, batch_size=8, plot=True))
    assert png.read_bytes() == b"not this sweep's figure"
    png.unlink()
    run_sweep(_sweep(rm[1], out, limit=8, batch_size=8, plot=True))  # reused: drawn now and recorded
    assert json.loads(results.meta_path(out).read_text())["files"][png.name] == results.file_record(png)
    run_sweep(_sweep(rm[1], out, limit=8, batch_size=8, plot=True))  # reused with its recorded figure

    fresh = tmp_path / "fresh.csv"
    run_sweep(_sweep(rm[1], fresh, limit=8, batch_size=8, plot=True))
    assert json.loads(results.meta_path(fresh).read_text())["files"][plot_path(fresh).name] == \
        results.file_record(plot_path(fresh))
    plot_path(fresh).write_bytes(b"changed")
    with pytest.raises(OutputExistsError, match=r"does not match its fresh.csv.meta.json: fresh.csv.png has 7 bytes"):
        run_sweep(_sweep(rm[1], fresh, limit=8, batch_size=8, plot=True))
    # the figure a replaced result records is that result's to replace: --overwrite without --plot leaves no stale
    # figure of other inputs beside the new CSV
    again = tmp_path / "again.csv"
    run_sweep(_sweep(rm[1], again, limit=8, batch_size=8, plot=True))
    run_sweep(_sweep(rm[1], again, limit=16, batch_size=8, overwrite=True))
    assert not plot_path(again).exists() and len(results.read_scores_csv(again)) == 16


def test_a_resume_keeps_the_saved_batch_size(rm, tmp_path, monkeypatch, capsys):
    """A resume with another --batch_size mixed two programs' roundings and its .meta.json recorded only the last
    batch size. A resume keeps the saved one (said on stderr), the sweep's and the beam's: the CSV is the one an
    uninterrupted run with that batch size writes, and .meta.json records it."""
    from rmjax.search.beam import BeamConfig
    from rmjax.search.beam_job import BeamSpec, run_beam

    out, clean = tmp_path / "s.csv", tmp_path / "clean.csv"
    run_sweep(_sweep(rm[1], clean, limit=48, chunk_size=16, batch_size=4))
    inproc.killed_at_write(monkeypatch, 2, lambda: run_sweep(_sweep(rm[1], out, limit=48, chunk_size=16, batch_size=4)))
    capsys.readouterr()
    run_sweep(_sweep(rm[1], out, limit=48, chunk_size=16, batch_size=16))
    assert "with its batch size 4, not --batch_size=16" in capsys.readouterr().err
    assert out.read_bytes() == clean.read_bytes()
    meta = json.loads(results.meta_path(out).read_text())
    assert meta["batch_size"] == 4 and meta["resumed_candidates"] == 16

    def beam(path, batch_size):
        return BeamSpec(RunOptions(model=str(rm[1]), out=str(path)), {"greatest": PROMPT},
                        BeamConfig(depth=2, beam=2, top=3, allow_special=True), limit=24, batch_size=batch_size,
                        chunk_size=8)

    out, clean = tmp_path / "b.csv", tmp_path / "bclean.csv"
    run_beam(beam(clean, 4))
    inproc.killed_at_write(monkeypatch, 3, lambda: run_beam(beam(out, 4)))
    capsys.readouterr()
    run_beam(beam(out, 8))
    assert "with its batch size 4, not --batch_size=8" in capsys.readouterr().err
    assert out.read_bytes() == clean.read_bytes()
    assert json.loads(results.meta_path(out).read_text())["batch_size"] == 4


def test_a_resume_whose_saved_batch_does_not_fit_here_says_to_delete_the_progress(rm, tmp_path, monkeypatch):
    """A resume keeps its saved batch size, so a refusal that offered a smaller --batch_size led to the same refusal
    again. On a device too small for the saved batch of 64, it names the saved progress and the batch that fits once
    that is deleted (progress whose batch size is not recorded runs at the one asked for: there the fix is a smaller
    --batch_size); the rerun with it then writes what an uninterrupted run writes."""
    import shutil

    from rmjax.loading import config_of
    from rmjax.scoring import memory

    out, clean = tmp_path / "s.csv", tmp_path / "clean.csv"
    run_sweep(_sweep(rm[1], clean, limit=128, chunk_size=64, batch_size=8))
    inproc.killed_at_write(monkeypatch, 2,
                           lambda: run_sweep(_sweep(rm[1], out, limit=128, chunk_size=64, batch_size=64)))
    # room for a batch of 8 and not of 64 (the prefix bucket and positions bound the sweep's own: 64, 8)
    room = memory.estimate(config_of(str(rm[1])), "float32", 64, 8, 8, 1, 1, 10**12).total_bytes
    monkeypatch.setattr(memory, "device_memory_bytes", lambda: room)
    line = inproc.refused(lambda: run_sweep(_sweep(rm[1], out, limit=128, chunk_size=64, batch_size=8)),
                          f"the batch size 64 of the progress saved in {store_dir(out)}", f"delete {store_dir(out)}")
    fits = int(line.split("--batch_size=")[1].split(" ")[0])
    assert 8 <= fits < 64 and "use a smaller --batch_size" not in line
    # progress from before batch sizes were recorded runs at the one asked for: a smaller --batch_size is the fix
    manifest = store_dir(out) / "manifest.json"
    unrecorded = {k: v for k, v in json.loads(manifest.read_text()).items() if k != "batch_size"}
    manifest.write_text(json.dumps(unrecorded))
    line = inproc.refused(lambda: run_sweep(_sweep(rm[1], out, limit=128, chunk_size=64, batch_size=64)),
                          "with --batch_size=64 does not fit", f"use a smaller --batch_size: {fits} is the largest")
    assert "progress saved" not in line
    shutil.rmtree(store_dir(out))
    run_sweep(_sweep(rm[1], out, limit=128, chunk_size=64, batch_size=8))
    assert out.read_bytes() == clean.read_bytes()


def test_stored_nan_rows_are_held_to_the_resume_and_recorded_by_their_token(nan_rm, tmp_path, monkeypatch):
    """A run with --allow_nonfinite stored the chunk of tokens 16-23 (token 20 NaN) before it was killed: resumed
    without the flag it stops naming token 20; resumed with it, .meta.json records that one row by its token."""
    out = tmp_path / "s.csv"
    inproc.killed_at_write(monkeypatch, 4, lambda: run_sweep(_sweep(nan_rm, out, limit=48, chunk_size=8, batch_size=8,
                                                                    allow_nonfinite=True)))
    with pytest.raises(NonFiniteError, match=r"non-finite scores saved in .*chunks.* \(first: token 20 \("):
        run_sweep(_sweep(nan_rm, out, limit=48, chunk_size=8, batch_size=8))
    run_sweep(_sweep(nan_rm, out, limit=48, chunk_size=8, batch_size=8, allow_nonfinite=True))
    record = results.read_meta(out)["nonfinite"]
    assert record["values"] == record["rows"] == 1 and record["first"][0].startswith("token 20 "), record


def test_a_refused_sweep_leaves_no_nan_chunk(nan_rm, tmp_path):
    """Mutant that survived: a sweep (or beam) chunk stored before its NaN check; the run still failed, but left
    NaN chunks behind. Token 20 is in the third chunk: the first two are stored, the NaN one is not."""
    from rmjax.search.beam import BeamConfig
    from rmjax.search.beam_job import BeamSpec, run_beam

    out = tmp_path / "s.csv"
    with pytest.raises(NonFiniteError, match="token 20"):
        run_sweep(_sweep(nan_rm, out, limit=48, chunk_size=8, batch_size=8))
    beam_out = tmp_path / "b.csv"
    with pytest.raises(NonFiniteError, match=r"response ids \[20\]"):
        run_beam(BeamSpec(RunOptions(model=str(nan_rm), out=str(beam_out)), {"greatest": PROMPT},
                          BeamConfig(depth=2, beam=2, top=3, allow_special=True), limit=48, batch_size=8, chunk_size=8))
    for path in (out, beam_out):
        stored = sorted(store_dir(path).glob("chunk-*.npy"))
        for chunk in stored:
            assert np.isfinite(np.load(chunk)).all(), chunk
        assert len(stored) == 2 and not path.exists(), stored  # the chunks before the NaN one were stored


def test_unsorted_token_ids_are_written_row_by_row_with_their_scores(rm, tmp_path):
    """Mutant that survived: the CSV's token_id column written sorted, out of step with its score rows (every test
    passed ids ascending). Each row of a sweep of unsorted ids is held to a transformers forward of its own token
    in the conversation."""
    from rmjax.loading import load
    from rmjax.text import chat

    hf, folder = rm
    given = [17, 3, 250, 9, 48000, 120]
    out = tmp_path / "s.csv"
    run_sweep(_sweep(folder, out, token_ids=tuple(given), batch_size=4, chunk_size=4))
    table = results.read_scores_csv(out)
    assert table["token_id"].tolist() == given
    model = load(str(folder))
    split = chat.split_chat(model.tokenizer, PROMPT)
    full = np.asarray([split.ids_with([t]) for t in table["token_id"]], np.int32)
    with torch.no_grad():
        want = hf(input_ids=torch.from_numpy(full).long()).logits[:, 0].numpy()
    atol = tolerance.rewards_atol(model.params, model.config, full, np.ones_like(full, bool))
    np.testing.assert_allclose(table["greatest"].to_numpy(), want, atol=atol, rtol=0)
    assert np.abs(np.diff(want)).min() > 10 * atol  # distinct rewards: a row paired with another token would fail



def test_conversation_scoring_stops_at_a_nan_reward_whole_or_cached(nan_rm):
    """Mutant that survived: score_conversations (the audit's scorer) without its finite check returned NaN. A
    response holding token 20 after a prompt of two rows (scored whole) and after one of 16 (against its cached
    prefix): refused naming that row; allowed, NaN is at exactly the rows that hold token 20."""
    from rmjax.loading import load
    from rmjax.scoring.texts import CACHED_PROMPT_ROWS, score_conversations
    from rmjax.text.chat import Conversations

    model = load(str(nan_rm))
    few, many = "Who won?", PROMPT
    prompts = [few, few] + [many] * CACHED_PROMPT_ROWS
    responses = ["Ana did.", "$5"] + [f"Answer {i}." for i in range(CACHED_PROMPT_ROWS - 1)] + ["$"]
    holds = [20 in Conversations(model.tokenizer, p, "auto").token_ids([r])[0]
             for p, r in zip(prompts, responses, strict=True)]
    assert holds == [False, True] + [False] * (CACHED_PROMPT_ROWS - 1) + [True]
    with pytest.raises(NonFiniteError, match="'\\$5'"):
        score_conversations(model, prompts, responses)
    with pytest.raises(NonFiniteError, match="response '\\$'"):
        score_conversations(model, prompts[2:], responses[2:])
    got = score_conversations(model, prompts, responses, allow_nonfinite=True)
    assert np.isnan(got).tolist() == holds


def test_score_without_out_stops_at_a_nan_reward_of_a_text_or_of_its_z_sample(rm, nan_rm, tmp_path):
    """Mutants that survived: `score` without --out (printing, writing nothing) let a NaN reward through, of a text
    or of a token its z sample drew. Token 20 in a text; the first of the 16 tokens drawn (seed 0) for the z scale
    given a NaN row in a copy of the model."""
    from rmjax.scoring.texts import ScoreSpec, run_score

    def score(folder, texts):
        return run_score(ScoreSpec(RunOptions(model=str(folder), out=None), {"greatest": PROMPT}, texts,
                                   z_sample=16))

    with pytest.raises(NonFiniteError, match="text '\\$5'"):
        score(nan_rm, ("Love", "$5"))
    drawn = int(np.random.default_rng(0).choice(49152, 16, replace=False)[0])
    z_nan = cli.copy_folder(rm[1], tmp_path / "z_nan")
    cli.edit_tensor(z_nan, "model.embed_tokens.weight",
                    lambda w: np.where(np.arange(len(w))[:, None] == drawn, np.nan, w))
    with pytest.raises(NonFiniteError, match=f"token {drawn}"):
        score(z_nan, ("Love",))


@pytest.mark.optimized  # three scales over 49,152 tokens: cold 30.4 s quick-compiled, 12.1 s optimized
def test_a_z_scale_records_the_tokens_it_left_out_and_how_many_it_scored(nan_rm, rm, tmp_path):
    """A fault hunt (helper-108): `score --allow_nonfinite` left a NaN single-token reward out of its z-scale and
    recorded nothing ("nonfinite": null, though the refusal promises the count in .meta.json), and --z_sample above
    the vocabulary scored the vocabulary while .meta.json said only the number asked for. The NaN model's token 20
    is left out and counted, by its id; each scale names the tokens it was taken over: all 49,152."""
    from rmjax.scoring.texts import ScoreSpec, run_score

    vocab = 49152
    with pytest.raises(NonFiniteError, match="1 of 49152"):
        run_score(ScoreSpec(inproc.options(nan_rm, tmp_path / "refused.csv"), inproc.prompts("greatest"), ("Love",),
                            z_sample=10**6))
    for model, name, allow in ((nan_rm, "nan.csv", True), (rm[1], "clean.csv", False)):
        run_score(ScoreSpec(inproc.options(model, tmp_path / name, allow_nonfinite=allow), inproc.prompts("greatest"),
                            ("Love",), z_sample=10**6))
        meta = results.read_meta(tmp_path / name)
        sampled = meta["z_sampled"]["greatest"]
        assert sampled["values"] == vocab and [sampled["mean"], sampled["sd"]] == meta["z_scale"]["greatest"]
        left_out = sampled["nonfinite"]
        if allow:
            assert left_out["values"] == 1 and left_out["first"] == ["token 20 for 'reward'"], left_out
        else:
            assert left_out is None
