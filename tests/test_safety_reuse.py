"""What a rerun reuses is whole, and what it cannot reuse it says how to recover without losing finished work.

Each test failed on the code before its fix: an export folder cut short or missing a file was "reused" with exit 0
(its record's digests were never read), a killed export could be neither reused nor replaced ("no rmjax run of this
kind wrote" files it wrote), train_rm's refusal of a half-written head advised --overwrite (which retrains), and a
sweep whose figure was deleted could not be reused or read by a later job (recomputing a vocabulary to redraw a
picture)."""

from __future__ import annotations

import json
import shutil

import pytest

from rmjax.errors import OutputExistsError
from rmjax.loading.export import EXPORT_RECORD, run_export
from rmjax.runs import results
from rmjax.search.sweep import SweepSpec, plot_path, run_sweep
from tests import inproc


def test_a_damaged_export_is_not_reused(rm_folder, tmp_path, monkeypatch):
    """`export --out=X` rerun after X/model.safetensors was cut to half, or X/tokenizer.json deleted."""
    out = tmp_path / "x"
    run_export(inproc.options(rm_folder, out))
    weights = out / "model.safetensors"
    whole = weights.read_bytes()
    weights.write_bytes(whole[: len(whole) // 2])
    inproc.no_weights_read(monkeypatch)
    inproc.refused(lambda: run_export(inproc.options(rm_folder, out)), "model.safetensors has", "cut short")
    weights.write_bytes(whole)
    tokenizer = (out / "tokenizer.json").read_bytes()
    (out / "tokenizer.json").unlink()
    inproc.refused(lambda: run_export(inproc.options(rm_folder, out)), "tokenizer.json is missing")
    (out / "tokenizer.json").write_bytes(tokenizer)
    assert run_export(inproc.options(rm_folder, out)) == out  # whole again: reused, nothing loaded


def test_an_export_killed_before_its_record_is_replaced_with_overwrite(rm_folder, tmp_path):
    """Killed after the weights, before rmjax_export.json (written last): both a rerun and --overwrite said the
    folder held files "no rmjax run of this kind wrote". The export marks its folder unfinished until the record is
    written: a rerun names the missing record, --overwrite replaces the folder. A folder of the same file names
    without the mark (a model the user saved) or with a file of the user's is never emptied."""
    out = tmp_path / "x"
    run_export(inproc.options(rm_folder, out))
    assert not (out / results.UNFINISHED).exists()
    (out / EXPORT_RECORD).unlink()
    (out / results.UNFINISHED).write_bytes(b"")  # where a kill before the record leaves it
    inproc.refused(lambda: run_export(inproc.options(rm_folder, out)), "not a finished rmjax result",
                   f"no {EXPORT_RECORD}", "--overwrite")
    run_export(inproc.options(rm_folder, out, overwrite=True))
    assert json.loads((out / EXPORT_RECORD).read_text())["files"]["model.safetensors"]
    (out / EXPORT_RECORD).unlink()
    names = sorted(p.name for p in out.iterdir())  # a saved model: the export's file names, no mark, no record
    for overwrite in (False, True):
        inproc.refused(lambda overwrite=overwrite: run_export(inproc.options(rm_folder, out, overwrite=overwrite)),
                       "no rmjax run of this kind wrote")
    assert sorted(p.name for p in out.iterdir()) == names
    (out / results.UNFINISHED).write_bytes(b"")
    (out / "notes.txt").write_text("mine")
    for overwrite in (False, True):
        inproc.refused(lambda overwrite=overwrite: run_export(inproc.options(rm_folder, out, overwrite=overwrite)),
                       "no rmjax run of this kind wrote")
    assert (out / "notes.txt").read_text() == "mine"


def test_train_rm_advises_deleting_a_half_written_head_not_retraining(lm_folder, tmp_path):
    """A run killed between head.safetensors and head.json: the refusal advised --overwrite, which deletes the
    finished workdir and trains again. It now names the file to delete; after that the rerun trains nothing. An
    export is checked against the files its record lists."""
    pairs, heldout = tmp_path / "pairs.csv", tmp_path / "heldout.csv"
    pairs.write_text("prompt,chosen,rejected\n" + "".join(f"Q{i},Love,Hate\n" for i in range(4)))
    heldout.write_text("prompt,chosen,rejected\nH,Gold,Dirt\n")
    head, work, export = tmp_path / "head.safetensors", tmp_path / "work", tmp_path / "hf"
    settings = dict(pairs=pairs, heldout_pairs=heldout, workdir=work, steps=2, batch_size=2, warmup_steps=1)
    inproc.train_rm(lm_folder, head_out=head, export=export, **settings)
    recorded = json.loads((export / "rmjax_training.json").read_text())["files"]
    assert sorted(recorded) == sorted(str(p.relative_to(export)) for p in export.rglob("*")
                                      if p.is_file() and p.name != "rmjax_training.json")
    head.with_suffix(".json").unlink()
    inproc.refused(lambda: inproc.train_rm(lm_folder, head_out=head, export=export, **settings),
                   f"Delete {head} and rerun", f"the training in {work} is reused", "no head.json")
    head.unlink()
    result = inproc.train_rm(lm_folder, head_out=head, export=export, **settings)
    assert result.reused and head.with_suffix(".json").is_file()  # the head rewritten from the last checkpoint
    (export / "config.json").write_text("{}")
    inproc.refused(lambda: inproc.train_rm(lm_folder, head_out=head, export=export, **settings),
                   "config.json has", f"Delete {export} and rerun")


def test_train_rm_killed_while_exporting_resumes_once_the_export_is_deleted(lm_folder, tmp_path):
    """A fault hunt: killed after its last checkpoint, while writing the export (summary.json not yet written),
    the rerun was refused with --overwrite as the only advice, which deletes every saved step and trains again. It
    now names the folder to delete; the rerun then trains nothing. A --pairs run records no Elo settings."""
    pairs, heldout = tmp_path / "pairs.csv", tmp_path / "heldout.csv"
    pairs.write_text("prompt,chosen,rejected\n" + "".join(f"Q{i},Love,Hate\n" for i in range(4)))
    heldout.write_text("prompt,chosen,rejected\nH,Gold,Dirt\n")
    work, export = tmp_path / "work", tmp_path / "hf"
    settings = dict(pairs=pairs, heldout_pairs=heldout, workdir=work, steps=2, batch_size=2, warmup_steps=1,
                    checkpoint_every=1, export=export)
    inproc.train_rm(lm_folder, **settings)
    summary = json.loads((work / "summary.json").read_text())
    assert "n_train" not in summary["recipe"] and "soft" not in summary["recipe"]  # (20000 and false, unused)
    (work / "summary.json").unlink()  # where the kill leaves it: every step saved, the export half written
    (export / "rmjax_training.json").unlink()
    (export / results.UNFINISHED).write_bytes(b"")
    inproc.refused(lambda: inproc.train_rm(lm_folder, **settings), f"Delete {export} and rerun",
                   f"resumes from its last checkpoint in {work}")
    shutil.rmtree(export)
    result = inproc.train_rm(lm_folder, **settings)
    assert result.resumed_from == 2 and (export / "rmjax_training.json").is_file()


def test_a_head_inside_the_export_folder_reruns(lm_folder, tmp_path):
    """--head_out inside --export: the export's record listed the head's lock file (there while it was written,
    gone after), so every rerun refused the export as damaged."""
    pairs, heldout = tmp_path / "pairs.csv", tmp_path / "heldout.csv"
    pairs.write_text("prompt,chosen,rejected\n" + "".join(f"Q{i},Love,Hate\n" for i in range(4)))
    heldout.write_text("prompt,chosen,rejected\nH,Gold,Dirt\n")
    export = tmp_path / "hf"
    settings = dict(pairs=pairs, heldout_pairs=heldout, workdir=tmp_path / "work", steps=2, batch_size=2,
                    warmup_steps=1, export=export, head_out=export / "head.safetensors")
    inproc.train_rm(lm_folder, **settings)
    recorded = json.loads((export / "rmjax_training.json").read_text())["files"]
    assert not [name for name in recorded if name.startswith("head")]
    assert inproc.train_rm(lm_folder, **settings).reused


def test_a_sweep_whose_figure_was_deleted_is_reused_and_read(rm_folder, tmp_path, capfd):
    """`sweep --plot`, the PNG deleted: the rerun and `beam --from_sweep` both refused the whole CSV as damaged."""
    out = tmp_path / "s.csv"

    def spec(**settings):
        return SweepSpec(inproc.options(rm_folder, out, **settings), inproc.prompts(), limit=8, batch_size=8,
                         plot=True)

    run_sweep(spec())
    plot_path(out).unlink()
    capfd.readouterr()
    run_sweep(spec())  # reused, the figure drawn again and recorded
    assert "was deleted; the result itself is whole and is reused" in capfd.readouterr().err
    assert json.loads(results.meta_path(out).read_text())["files"][plot_path(out).name] == \
        results.file_record(plot_path(out))
    plot_path(out).unlink()
    from rmjax.runs import stages

    stages.read_input(out, ("sweep",), "--from_sweep")  # a later job reads the whole CSV
    out.write_text(out.read_text().replace(",", ";", 1))
    with pytest.raises(OutputExistsError, match="s.csv has|changed after"):
        run_sweep(spec())


# The sweep sends itself SIGINT (what Ctrl-C sends) as its second chunk is written: deterministic, however fast.
# Python's own SIGINT handler is put back first: under pytest-xdist a subprocess inherits SIGINT ignored.
_CTRL_C_AT_SECOND_CHUNK = (
    "import os, runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler)\n"
    "import rmjax.runs.chunks as c; real = c.ChunkStore.write; n = []\n"
    "def write(self, name, scores):\n"
    "    n.append(name)\n"
    "    if len(n) == 2: os.kill(os.getpid(), signal.SIGINT)\n"
    "    return real(self, name, scores)\n"
    "c.ChunkStore.write = write; runpy.run_module(sys.argv.pop(1), run_name='__main__')")


def test_ctrl_c_ends_in_one_line_and_the_rerun_resumes(rm_folder, tmp_path):
    """SIGINT during a sweep printed a KeyboardInterrupt traceback (exit -2). It is one line now (exit 130), and the
    same command then finishes from the saved chunks."""
    import subprocess
    import sys

    from rmjax.runs.chunks import store_dir
    from tests import cli

    out = tmp_path / "s.csv"
    flags = (f"--model={rm_folder}", "--prompts=greatest", f"--out={out}", "--limit=384", "--chunk_size=128",
             "--batch_size=64")
    proc = subprocess.run([sys.executable, "-c", _CTRL_C_AT_SECOND_CHUNK, "experiments.sweep", *flags], cwd=cli.REPO,
                          env=cli.subprocess_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 130, proc.stderr
    assert "Traceback" not in proc.stderr and "interrupted: rerun the same command to continue" in proc.stderr
    assert not out.exists() and (store_dir(out) / "chunk-0000000000.npy").is_file()
    cli.ok(cli.run("sweep", *flags))
    assert out.is_file() and results.read_meta(out)["resumed_candidates"] >= 128


def test_ctrl_c_while_a_job_imports_is_one_line():
    """Ctrl-C in the second or so a job spends importing JAX and transformers printed a KeyboardInterrupt
    traceback. As a program (`python -m` sets argv[0] to "-m" while it imports the package) it is one line, exit
    130; once cli.run starts the job, its own handler says what was kept."""
    import subprocess
    import sys

    from tests import cli

    start = ("import os, signal, sys, time; signal.signal(signal.SIGINT, signal.default_int_handler)\n"
             "sys.argv[:1] = ['-m']; import experiments\n")
    during_imports = start + "os.kill(os.getpid(), signal.SIGINT); time.sleep(30)"
    in_the_job = start + ("from experiments import cli\n"
                          "cli.run(lambda argv: os.kill(os.getpid(), signal.SIGINT) or time.sleep(30))")
    for script, said in ((during_imports, "interrupted while starting: nothing was written"),
                         (in_the_job, "interrupted: rerun the same command to continue")):
        proc = subprocess.run([sys.executable, "-c", script], cwd=cli.REPO, env=cli.subprocess_env(),
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 130 and said in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
