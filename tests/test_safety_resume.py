"""Resume and reuse only what the same inputs produced; never overwrite or share an output unasked.

Each test reproduces one way a result used to come out wrong with exit status 0 (issue 11: 1, 2, 4, 8). Where
the point is the job's library code (identities, claims, reuse) the job runs in-process, as its entry point would
(tests/inproc.py: an RmjaxError is the command's one `error:` line); killed runs, runs racing each other, byte
comparisons with a killed run's resume and --mesh on a device count run the entry points as a user does.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rmjax.search.sweep import SweepSpec, run_sweep
from tests import cli, inproc, tiny


def _pairs(path, adjective: str, n: int = 48):
    nouns = ["apple", "river", "house", "music", "dog", "book", "tree", "city", "light", "stone", "garden", "road"]
    rng = np.random.default_rng(len(adjective))
    a, b = rng.choice(nouns, n), rng.choice(nouns, n)
    pd.DataFrame({"prompt": "Which is better?", "chosen": [f"{adjective} {x}" for x in a],
                  "rejected": [f"bad {x}" for x in b]}).to_csv(path, index=False)
    return path


def test_train_rm_workdir_belongs_to_one_run(lm_folder, tmp_path, monkeypatch, capsys):
    """1: a workdir is continued only by the run that made it; the default workdir is per run. Each run is
    `train_rm --model=LM --steps=4 --checkpoint_every=2 --batch_size=8 --learning_rate=0.05 --pairs=… …` in-process
    (tests.inproc.train_rm); the refused ones stop before any weight is read."""
    first, other = _pairs(tmp_path / "a.csv", "good"), _pairs(tmp_path / "b.csv", "great")
    workdir = tmp_path / "work"
    base = dict(steps=4, checkpoint_every=2, batch_size=8, learning_rate=0.05)
    train = partial(inproc.train_rm, lm_folder)
    export = workdir / "hf"  # inside the workdir, as the usage line has it
    train(pairs=first, workdir=workdir, export=export, **base)
    summary = json.loads((workdir / "summary.json").read_text())
    assert (workdir / "hf" / "model.safetensors").is_file() and (workdir / "run.json").is_file()
    with monkeypatch.context() as patch:
        inproc.no_weights_read(patch)
        # Another run's data and learning rate into the same workdir: refused, naming both and the fixes.
        line = inproc.refused(partial(train, pairs=other, workdir=workdir, **{**base, "learning_rate": 0.5}),
                              "config.learning_rate", "train", "--overwrite", "--workdir")
        assert "heldout" in line  # the 10% held out of another file differ too
        # Another trainable part: named as such, not orbax's "partial_restore".
        inproc.refused(partial(train, pairs=first, workdir=workdir, trainable="full", **base), "config.trainable")
    assert json.loads((workdir / "summary.json").read_text()) == summary  # nothing was touched
    # The same command again finds its own finished run (the command says "already trained": none of its steps).
    again = train(pairs=first, workdir=workdir, export=export, **base)
    assert again.resumed_from == base["steps"]
    # --overwrite replaces an rmjax workdir, never a folder of the user's.
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "precious.txt").write_text("keep")
    with monkeypatch.context() as patch:
        inproc.no_weights_read(patch)
        inproc.refused(partial(train, pairs=first, workdir=mine, overwrite=True, **base),
                       "no rmjax run of this kind wrote")
    assert (mine / "precious.txt").read_text() == "keep"
    # Without --workdir a run gets a folder of its own (under runs/train_rm of the working directory), named from
    # the run's identity: another learning rate, another folder.
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    train(pairs=first, **base)
    made = re.search(r"workdir: (\S+)", capsys.readouterr().err).group(1)
    assert made.startswith("runs/train_rm/lm-") and (tmp_path / made / "summary.json").is_file()
    from rmjax.train.recipe import default_workdir, load_pairs, training_identity
    from rmjax.train.settings import TrainConfig

    train, heldout, _ = load_pairs(str(first), None, 20000, 4000, False, 0)  # the entry point's defaults
    dirs = [default_workdir(str(lm_folder), training_identity(str(lm_folder), train, heldout, TrainConfig(
        steps=4, checkpoint_every=2, batch_size=8, learning_rate=lr, warmup_steps=100))) for lr in (0.05, 0.02)]
    assert str(dirs[0]) == made and dirs[1] != dirs[0]


def _sweep_flags(model, out, *extra: str) -> list[str]:
    return [f"--model={model}", "--prompts=greatest", f"--out={out}", "--limit=2048", "--chunk_size=256",
            "--batch_size=64", "--top=2", *extra]


def _sweep(model, out) -> Path:
    """`sweep` with _sweep_flags(model, out), in-process."""
    return run_sweep(SweepSpec(inproc.options(model, out), inproc.prompts("greatest"), limit=2048, chunk_size=256,
                               batch_size=64))


def test_sweep_resume_checks_weights_and_template(rm_folder, tmp_path, monkeypatch):
    """2: a killed sweep is continued only with the same weights and chat template, byte for byte. The killed run
    and the resume are commands (one device each), compared byte for byte with the uninterrupted run; that one and
    the refused resumes run in-process (`_sweep`), the refused ones stopped before any weight is read."""
    model = cli.copy_folder(rm_folder, tmp_path / "model")
    clean = tmp_path / "clean.csv"
    _sweep(model, clean)
    out = tmp_path / "resumed.csv"
    chunks = out.with_name(out.name + ".chunks")
    done = tiny.kill_after_chunks(cli.command("sweep", *_sweep_flags(model, out)), out, 2, cwd=cli.REPO, env=cli.ENV)
    assert 2 <= done < 8 and not out.exists()
    # Another checkpoint of the same architecture under the same path.
    weights = (model / "model.safetensors").read_bytes()
    tiny.save_hf_model(tiny.build_hf_model("llama3", num_labels=1, seed=5, vocab_size=49152, pad_token_id=2,
                                           bos_token_id=1, eos_token_id=2), tmp_path / "other")
    (model / "model.safetensors").write_bytes((tmp_path / "other" / "model.safetensors").read_bytes())
    with monkeypatch.context() as patch:
        inproc.no_weights_read(patch)
        inproc.refused(partial(_sweep, model, out), "model.weights", "--overwrite", "--out")
    (model / "model.safetensors").write_bytes(weights)
    # One embedding row edited, far from either end of its tensor (the former fingerprint read 4 KiB at each end).
    cli.edit_tensor(model, "model.embed_tokens.weight",
                    lambda table: table + (np.arange(len(table))[:, None] == len(table) // 2).astype(table.dtype))
    with monkeypatch.context() as patch:
        inproc.no_weights_read(patch)
        inproc.refused(partial(_sweep, model, out), "model.weights", "--overwrite", "--out")
    (model / "model.safetensors").write_bytes(weights)
    # An edited chat template.
    template = (model / "chat_template.jinja").read_text()
    (model / "chat_template.jinja").write_text(template.replace("<|im_start|>assistant", "<|im_start|>Assistant"))
    with monkeypatch.context() as patch:
        inproc.no_weights_read(patch)
        inproc.refused(partial(_sweep, model, out), "model.tokenizer")
    assert len(list(chunks.glob("chunk-*.npy"))) == done  # the saved chunks were kept
    (model / "chat_template.jinja").write_text(template)
    resumed = cli.ok(cli.run("sweep", *_sweep_flags(model, out)))
    assert f"{done * 256:,}/2,048" in resumed.stderr
    assert out.read_bytes() == clean.read_bytes()


def test_finished_result_is_reused_and_another_is_refused(rm_folder, tmp_path, monkeypatch, capsys):
    """4: a full result is not replaced by a quick run; the same run is reused without loading the model. The
    sweeps (`sweep --model=RM --prompts=greatest --limit=300 --top=2`, then `--token_ids=1,2`) run in-process; the
    command's closing summary is rmjax.runs.table_summary's."""
    from rmjax.runs.table_summary import summarize_table

    out = tmp_path / "full.csv"

    def sweep(out, overwrite=False, **candidates):
        return run_sweep(SweepSpec(inproc.options(rm_folder, out, overwrite=overwrite), inproc.prompts("greatest"),
                                   **candidates))

    sweep(out, limit=300)
    csv, meta = out.read_bytes(), out.with_name("full.csv.meta.json").read_bytes()
    capsys.readouterr()
    with monkeypatch.context() as patch:
        inproc.no_weights_read(patch)
        again = sweep(out, limit=300)
    err = capsys.readouterr().err
    assert "reused (written " in err and "loaded" not in err and "top 2 tokens" in summarize_table(again, 2)
    recorded = json.loads(meta)  # issue 45: the old run's date and time, never passed off as just measured
    assert f"reused (written {recorded['written']}, took {recorded['seconds']:.1f} s)" in err
    assert f"at {recorded['written']}, computed in {recorded['seconds']:.1f} s" in summarize_table(again, 2)
    with monkeypatch.context() as patch:
        inproc.no_weights_read(patch)
        inproc.refused(partial(sweep, out, token_ids=(1, 2)), "already exists", "token_ids", "--overwrite")
    assert out.read_bytes() == csv and out.with_name("full.csv.meta.json").read_bytes() == meta
    sweep(out, overwrite=True, token_ids=(1, 2))
    assert pd.read_csv(out)["token_id"].tolist() == [1, 2]
    # A file at --out that no run of this kind wrote is not replaced either.
    stray = tmp_path / "notes.csv"
    stray.write_text("my notes\n")
    with monkeypatch.context() as patch:
        inproc.no_weights_read(patch)
        inproc.refused(partial(sweep, stray, token_ids=(1,)), "not a finished rmjax result")
    assert stray.read_text() == "my notes\n"


def test_builtin_model_result_is_reused(tmp_path, capsys):
    """The identity computed before loading equals the loaded model's for a builtin RM (GGUF backbone +
    committed head), so a finished result is found again (`sweep --model=elo-rm-smollm2-135m --limit=8`,
    in-process)."""
    spec = SweepSpec(inproc.options("elo-rm-smollm2-135m", tmp_path / "s.csv"), inproc.prompts(), limit=8)
    run_sweep(spec)
    assert "loaded elo-rm-smollm2-135m" in capsys.readouterr().err
    run_sweep(spec)
    assert "reused (written " in capsys.readouterr().err


def test_gcg_result_is_not_overwritten(rm_folder, tmp_path, monkeypatch, capsys):
    """`gcg --num_tokens=2 --steps=1 --search_width=8 --topk=8` (in-process): another seed is refused before any
    weight is read, the same run reused."""
    from rmjax.search.gcg_config import GCGConfig
    from rmjax.search.gcg_job import GcgSpec, run_gcg

    out = tmp_path / "gcg.json"

    def gcg(**settings):
        return run_gcg(GcgSpec(inproc.options(rm_folder, out), inproc.prompts(),
                               GCGConfig(num_tokens=2, steps=1, search_width=8, topk=8, **settings)))

    gcg()
    before = out.read_bytes()
    with monkeypatch.context() as patch:
        inproc.no_weights_read(patch)
        inproc.refused(partial(gcg, seed=1), "already exists", "config.seed")
    assert out.read_bytes() == before
    capsys.readouterr()
    gcg()
    assert "reused (written " in capsys.readouterr().err


def _score_table(path, seed: int):
    words = ["love", "hate", "money", "peace", "war", "music", "dog", "cat", "sun", "rain", "food", "art"]
    rng = np.random.default_rng(seed)
    pd.DataFrame({"token_id": range(len(words)), "token_name": words, "token_decoded": words,
                  "best": rng.normal(size=len(words)), "worst": rng.normal(size=len(words))}).to_csv(path, index=False)


def _analyze(out: Path, overwrite: bool = False, **settings) -> dict:
    """`analyze --n_boot=5 --n_permutations=5 --models_yaml= --out=OUT [--overwrite]` in-process (tests.inproc.analyze
    with --overwrite); `settings`: AnalysisConfig flags."""
    from rmjax import data as shipped
    from rmjax.analysis.report import run_analyses
    from rmjax.analysis.spec import AnalysisConfig

    cfg = AnalysisConfig(frequencies=str(shipped.BNC_FREQUENCIES), models_yaml=None, n_boot=5, n_permutations=5,
                         **settings)
    return run_analyses(cfg, out, overwrite=overwrite)


def test_analyze_replaces_only_its_own_files(tmp_path):
    """4: analyze refuses a non-empty --out; --overwrite removes exactly the earlier analysis's files (`_analyze`:
    the command in-process)."""
    scores = tmp_path / "scores"
    scores.mkdir()
    for i in range(2):
        _score_table(scores / f"model{i}.csv", i)
    out = tmp_path / "analysis"
    _analyze(out, scores=(str(scores),))
    first = {p.name for p in out.iterdir()}
    assert "paper1_framing_correlations.csv" in first and "report.md" in first
    elo = tmp_path / "elo"
    elo.mkdir()
    pd.DataFrame({"elo_rank": [1, 2, 3, 4], "elo_score": [1500, 1400, 1300, 1200], "name": ["a", "b", "c", "d"],
                  "elo_matches": [9, 9, 9, 9], "m1": [4, 3, 2, 1], "m2": [1, 3, 2, 4]}).to_csv(
        elo / "What is best.csv", index=False)
    inproc.refused(partial(_analyze, out, elo=str(elo)), "not empty", "--overwrite")
    _analyze(out, overwrite=True, elo=str(elo))
    second = {p.name for p in out.iterdir()}
    assert not any(name.startswith("paper1_") for name in second), "a stale table of the first run survived"
    assert "report.md" in second and "paper1" not in (out / "report.md").read_text()
    (out / "mine.txt").write_text("keep me")
    inproc.refused(partial(_analyze, out, overwrite=True, elo=str(elo)), "no rmjax analysis wrote", "mine.txt")
    assert (out / "mine.txt").read_text() == "keep me"


def _holds_lock(lock) -> bool:
    """Whether some process holds an flock on `lock`, read from /proc/locks (without touching the lock)."""
    try:
        inode = lock.stat().st_ino
    except FileNotFoundError:
        return False
    return any(line.split()[1] == "FLOCK" and line.split()[5].endswith(f":{inode}")
               for line in open("/proc/locks").read().splitlines() if len(line.split()) > 5)


def test_second_sweep_on_the_same_out_is_refused(rm_folder, tmp_path, monkeypatch):
    """8: two sweeps on one --out: the second says another run holds it; a killed holder blocks nothing. The
    first sweep is a command (another process, killed); the second, and the one after the kill, run in-process."""
    out = tmp_path / "s.csv"
    long_run = [f"--model={rm_folder}", "--prompts=paper1", f"--out={out}", "--chunk_size=4096", "--batch_size=64"]

    def sweep(**settings):  # sweep --model=RM --prompts=paper1 --out=OUT …, in-process
        return run_sweep(SweepSpec(inproc.options(rm_folder, out, overwrite=settings.pop("overwrite", False)),
                                   inproc.prompts("paper1"), **settings))

    first = subprocess.Popen(cli.command("sweep", *long_run), cwd=cli.REPO, env=cli.ENV, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not _holds_lock(tmp_path / "s.csv.lock") and time.time() < deadline:
        time.sleep(0.05)
    try:
        with monkeypatch.context() as patch:
            inproc.no_weights_read(patch)
            inproc.refused(partial(sweep, chunk_size=4096, batch_size=64), "another run holds", "s.csv.lock")
        assert first.poll() is None, "the first sweep must still be running"
    finally:
        first.kill()
        first.wait()
    # The lock died with its process (its file stays behind); --overwrite drops the killed run's chunks.
    sweep(limit=256, overwrite=True)  # sweep --model=RM --prompts=paper1 --out=OUT --limit=256 --overwrite
    assert len(pd.read_csv(out)) == 256


def test_concurrent_first_use_conversions_share_one(tmp_path):
    """8: two processes converting the same GGUF: one converts, the other waits and uses its result."""
    from rmjax.loading.registry import resolve

    gguf = resolve("smollm2-135m-instruct")[1]
    code = ("import sys; from pathlib import Path; from rmjax.loading.gguf_file import cached_hf_folder; "
            f"print(cached_hf_folder({str(gguf)!r}, Path(sys.argv[1])))")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "cache")], cwd=cli.REPO, env=cli.ENV,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e[-2000:] for _, e in outs]
    folders = {o.strip() for o, _ in outs}
    # (the conversion takes ~20 s, so the second process, started at once, waits for it)
    assert len(folders) == 1 and sum("waiting" in e for _, e in outs) <= 1
    folder = Path(folders.pop())
    assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()
    assert not list(folder.parent.glob("*.partial"))


def test_an_overwrite_of_another_kind_of_output_stopped_resumes_without_overwrite(tmp_path):
    """A disagreement's map-only run (result vocab_map.csv) with --overwrite over a search's folder (disagree.csv and
    its companions), stopped after saving progress, then rerun without --overwrite, was refused: no record of
    vocab_map.csv named the search's files, which only the stopped run had been given to replace. The claim now
    records them in the run's progress; the rerun resumes and replaces them, and still refuses a file changed since."""
    from rmjax.errors import OutputExistsError
    from rmjax.runs.chunks import ChunkStore, store_dir
    from rmjax.runs.jobs import job

    folder = tmp_path / "d"
    search, only_map = folder / "disagree.csv", folder / "vocab_map.csv"
    owned = {search: [only_map, folder / "vocab_map.csv.meta.json", folder / "disagree.png"],
             only_map: [search, folder / "disagree.png", folder / "disagree.csv.meta.json"]}

    def run(out, identity, overwrite=False, stop=False):
        with job(out, identity, overwrite=overwrite, owned=owned[out], store=store_dir(out)) as claimed:
            store = ChunkStore(out, identity, 1)
            if not store.has(0):
                store.write(0, np.zeros((1, 1), np.float32))
            if stop:
                raise KeyboardInterrupt
            if out == search:
                (folder / "disagree.png").write_bytes(b"figure")
            claimed.finish(lambda path: path.write_text(json.dumps(identity)) and path)
            store.remove()
        return claimed.claimed

    run(search, {"job": "d", "search": True})
    searched = {p.name: p.read_bytes() for p in folder.iterdir()}
    with pytest.raises(KeyboardInterrupt):
        run(only_map, {"job": "d", "search": False}, overwrite=True, stop=True)
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} == searched  # kept until replaced
    # a changed file is no longer the one the stopped run was given to replace
    (folder / "disagree.png").write_bytes(b"mine")
    with pytest.raises(OutputExistsError, match="disagree.png already exists"):
        run(only_map, {"job": "d", "search": False})
    (folder / "disagree.png").write_bytes(b"figure")
    with pytest.raises(OutputExistsError):  # nor are they another run's to replace
        run(only_map, {"job": "d", "search": False, "other": 1})
    assert run(only_map, {"job": "d", "search": False}).resume
    assert sorted(p.name for p in folder.iterdir()) == ["vocab_map.csv", "vocab_map.csv.meta.json"]


def test_a_record_whose_rename_a_kill_cut_off_still_lets_the_rerun_resume(tmp_path):
    """An --overwrite run SIGKILLed between writing its record of the old files (interrupted.json's temp) and
    renaming it left the record as the temp alone, and its rerun without --overwrite was refused (the old files
    were no run's). A whole temp now counts as the record; a cut one counts for nothing (the rerun refuses)."""
    from rmjax.errors import OutputExistsError
    from rmjax.runs import claims
    from rmjax.runs.chunks import ChunkStore, store_dir
    from rmjax.runs.jobs import job

    old, out = tmp_path / "disagree.csv", tmp_path / "vocab_map.csv"
    identity = {"job": "d", "search": False}

    def run(overwrite=False, stop=False):
        with job(out, identity, overwrite=overwrite, owned=[old], store=store_dir(out)) as claimed:
            store = ChunkStore(out, identity, 1)
            if not store.has(0):
                store.write(0, np.zeros((1, 1), np.float32))
            if stop:
                raise KeyboardInterrupt
            claimed.finish(lambda path: path.write_text("map") and path)
            store.remove()
        return claimed.claimed

    for cut in (True, False):
        old.write_text("an earlier search's result")
        with pytest.raises(KeyboardInterrupt):
            run(overwrite=True, stop=True)
        record = store_dir(out) / claims.INTERRUPTED
        text = record.read_text()
        record.unlink()  # what the kill left: the temp, written whole or cut short, never renamed
        (store_dir(out) / f".{claims.INTERRUPTED}.4242.tmp").write_text(text[: len(text) // 2] if cut else text)
        if cut:
            with pytest.raises(OutputExistsError, match="disagree.csv already exists"):
                run()
            shutil.rmtree(store_dir(out))
        else:
            assert run().resume
            assert sorted(p.name for p in tmp_path.iterdir()) == ["vocab_map.csv", "vocab_map.csv.meta.json"]


def test_a_record_of_replaceable_files_outlives_an_unused_store_and_pins_nothing(tmp_path, monkeypatch):
    """A fault hunt of the record above: (a) a run with no chunks (all its scores given) whose last write failed
    after a companion lost its record with the unused manifest, and its rerun refused the companion; (b) an
    --overwrite run killed after its claim left a store holding its record alone, where a later run refused after
    its load left its manifest, which refused the corrected rerun; (c) an old file the --overwrite claim could not
    read failed the claim."""
    from rmjax.errors import UsageError
    from rmjax.runs import claims, results
    from rmjax.runs.chunks import ChunkStore, store_dir
    from rmjax.runs.jobs import job

    out, companion = tmp_path / "beam.csv", tmp_path / "beam.completions.csv"

    def run(identity, overwrite=False, fail=None, owned=(companion,)):
        with job(out, identity, overwrite=overwrite, owned=owned, store=store_dir(out)) as claimed:
            ChunkStore(out, identity, 1)
            if fail == "check":
                raise UsageError("refused after the load")

            def write(path):
                companion.write_text(f"{identity}")
                if fail == "write":
                    raise OSError(28, "No space left on device")
                path.write_text(f"{identity}")
                return path

            claimed.finish(write)
            ChunkStore(out, identity, 1).remove()

    with pytest.raises(OSError):  # (a)
        run({"job": "b", "x": 1}, fail="write")
    run({"job": "b", "x": 1})
    assert out.read_text() == companion.read_text() == "{'job': 'b', 'x': 1}"
    # (b) what a kill right after an --overwrite claim leaves: the record of the old files, alone
    claims.record_interrupted(store_dir(out), {"job": "b", "x": 2}, out, [out, companion, results.meta_path(out)])
    with pytest.raises(UsageError):
        run({"job": "b", "x": 3}, overwrite=True, fail="check")
    run({"job": "b", "x": 4}, overwrite=True)
    assert out.read_text() == "{'job': 'b', 'x': 4}" and not store_dir(out).exists()
    real = results.file_record  # (c) an old file this process cannot read: left out of the record, not a failure

    def unreadable(path):
        if Path(path) == companion:
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(results, "file_record", unreadable)
    with pytest.raises(UsageError):
        run({"job": "b", "x": 5}, overwrite=True, fail="check")
    monkeypatch.setattr(results, "file_record", real)
    saved = json.loads((store_dir(out) / claims.INTERRUPTED).read_text())["files"]
    assert sorted(saved) == ["beam.csv", "beam.csv.meta.json"]


def test_train_rm_batch_must_split_over_the_data_axis(lm_folder, tmp_path):
    """A batch the mesh's data axis does not divide is refused before loading (it crashed after the features)."""
    pairs = _pairs(tmp_path / "a.csv", "good")
    cli.user_error(cli.run("train_rm", f"--model={lm_folder}", f"--pairs={pairs}", "--batch_size=6",
                           "--mesh=data:4,model:2", f"--workdir={tmp_path / 'w'}",
                           env={"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}),
                   "--batch_size=6", "multiple of 4")


def test_a_run_stopped_before_it_saves_anything_leaves_no_store(tmp_path):
    """A job refused after its load (the frontier's gate check) had made its store: the manifest pinned the refused
    flags, and the corrected rerun was refused as another run's progress. Fresh or after --overwrite cleared an
    earlier run's store, such a store goes; a store holding saved progress stays."""
    from rmjax.errors import UsageError
    from rmjax.runs.chunks import ChunkStore, store_dir
    from rmjax.runs.jobs import job

    out = tmp_path / "disagree.csv"
    first, refused_flags, corrected = ({"job": "test", "flag": f} for f in "ABC")

    def run(identity, overwrite=False, fail=True, save=False):
        with job(out, identity, overwrite=overwrite, store=store_dir(out)):
            store = ChunkStore(out, identity, 1)
            if save:
                store.write(0, np.zeros((1, 1), np.float32))
            if fail:
                raise UsageError("refused after the load")

    for overwrite in (False, True):
        if overwrite:  # an earlier run's saved progress, which --overwrite discards
            with pytest.raises(UsageError):
                run(first, save=True)
            assert ChunkStore(out, first, 1).has(0)
        with pytest.raises(UsageError):
            run(refused_flags, overwrite=overwrite)
        assert not store_dir(out).exists()
    with pytest.raises(UsageError):  # a run that saved something keeps it for its rerun
        run(corrected, save=True)
    run(corrected, fail=False)
