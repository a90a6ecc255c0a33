"""Issue 42's second campaign, the attacker's half: files planted in an output folder, a model folder or an input
folder make no job write, delete or read outside what it owns, hang, fill memory, or serve a wrong number.

Each test fails on the code before its fix (see each docstring): temp files written through a planted link
(`atomic.fresh_file`), state files read from a FIFO (`atomic.read_json`), companions and locks resolved through
links (`paths.companion_path`, `locks._refuse_unless_lock`), linked stores and workdirs (`claims._decide`), chunks
that are not plain files (`chunks._plain`), YAML aliases (`yamlfile`), safetensors offsets, GGUF metadata past the end
of the file (`gguf_bounds`) and a GGUF conversion cache keyed without the file's content.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import threading
from pathlib import Path

import numpy as np
import pytest

from rmjax.errors import CheckpointError, LockedError, OutputExistsError, ResumeMismatchError, UsageError
from rmjax.runs import claims, identities, locks, results
from rmjax.runs.chunks import ChunkStore, store_dir
from tests import inproc
from tests.cli import VICTIM_TEXT

IDENTITY = {"job": "sweep", "model": {"weights": "w", "tokenizer": "t"}}


def _returns_within(fn, seconds: float = 20.0):
    """`fn()`'s result (or exception), or a failure when it blocks (a FIFO read never returns by itself)."""
    box: list = []

    def call():
        try:
            box.append(("value", fn()))
        except BaseException as error:  # noqa: BLE001 (handed to the test)
            box.append(("error", error))

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{fn} blocked for {seconds} s"
    kind, value = box[0]
    if kind == "error":
        raise value
    return value


def _unblock(fifo: Path) -> None:
    """Release a reader left blocked on `fifo` by the code before the fix (so no thread hangs at exit)."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


# --- temp files: never written through a planted link (before: the link's target was overwritten) ---------------


def test_a_temp_file_link_is_removed_not_written_through(tmp_path, victim):
    """Every atomic write (`.NAME.PID.tmp`: results, .meta.json, manifests) and a chunk's `tmp-chunk-…` removes a link
    planted at its temp name. Before: planting a link for every pid made any job overwrite the victim with its
    .meta.json and leave the .meta.json a link to it; a resumed store's chunk was written into the victim."""
    out = tmp_path / "run" / "x.json"
    out.parent.mkdir()
    (out.parent / f".x.json.{os.getpid()}.tmp").symlink_to(victim)
    results.dump_json({"a": 1}, out)
    assert victim.read_text() == VICTIM_TEXT and not out.is_symlink() and json.loads(out.read_text()) == {"a": 1}

    store = ChunkStore(tmp_path / "run" / "s.csv", IDENTITY, 4)
    (store.dir / "tmp-chunk-0000000000.npy").symlink_to(victim)
    store.write(0, np.ones((4, 1), np.float32))
    assert victim.read_text() == VICTIM_TEXT
    assert not (store.dir / "chunk-0000000000.npy").is_symlink() and store.load(0).sum() == 4


def test_a_training_log_temp_link_is_removed(tmp_path, victim):
    """train_rm's `eval_log.csv.tmp` in a resumed workdir: before, the log was written into the victim."""
    from rmjax.train.workdir import write_log

    log = tmp_path / "eval_log.csv"
    log.with_name("eval_log.csv.tmp").symlink_to(victim)
    write_log(log, [{"step": 1, "loss": 0.5}])
    assert victim.read_text() == VICTIM_TEXT and log.read_text().startswith("step,loss")


# --- state files: a FIFO is never read (before: the job hung) ----------------------------------------------------


def test_a_fifo_manifest_or_analysis_list_does_not_hang(tmp_path):
    """A FIFO at a chunk store's manifest.json (any job's claim and resume) or at analyze's analysis.json: before,
    reading it blocked forever (and a link to /dev/zero filled memory)."""
    from rmjax.analysis.files import prepare_folder

    store = tmp_path / "s.csv.chunks"
    store.mkdir()
    os.mkfifo(store / "manifest.json")
    analysis = tmp_path / "analysis"
    analysis.mkdir()
    os.mkfifo(analysis / "analysis.json")
    try:
        assert _returns_within(lambda: identities.read_meta_identity(store / "manifest.json")) is None
        with pytest.raises(OutputExistsError, match="chunks without a manifest"):
            _returns_within(lambda: claims.claim(tmp_path / "s.csv", IDENTITY, store=store).__enter__())
        with pytest.raises(OutputExistsError, match="holds files no rmjax analysis wrote"):
            _returns_within(lambda: prepare_folder(analysis, overwrite=True))
    finally:
        _unblock(store / "manifest.json")
        _unblock(analysis / "analysis.json")


def test_analyze_input_folders_skip_a_fifo(tmp_path):
    """--elo=DIR and --bigtwo_checkpoints=DIR list their folders: a FIFO named x.csv there hung analyze."""
    from rmjax.analysis.bigtwo import load_checkpoints
    from rmjax.analysis.elo import load_elo
    from rmjax.data import ELO_DIR

    elo = tmp_path / "elo"
    shutil.copytree(ELO_DIR, elo)
    os.mkfifo(elo / "zz.csv")
    steps = tmp_path / "steps"
    steps.mkdir()
    results.write_scores_csv(steps / "step_1.csv", np.arange(3), ["a", "b", "c"], ["a", "b", "c"],
                             {"greatest": np.array([0.1, 0.2, 0.3])})
    os.mkfifo(steps / "step_2.csv")
    try:
        assert len(_returns_within(lambda: load_elo(elo))) == 3
        assert [step for step, _ in _returns_within(lambda: load_checkpoints(steps))] == [1]
    finally:
        _unblock(elo / "zz.csv")
        _unblock(steps / "step_2.csv")


# --- companions and locks: a planted link is never resolved into someone's file ---------------------------------


def test_overwrite_removes_a_companion_link_not_its_target(rm_folder, tmp_path, victim):
    """`s.csv.png -> victim.txt` planted beside the output: `sweep --overwrite` used to delete victim.txt (the
    companion was resolved to its target, which --overwrite removed) and exit 0. Now the link itself is the
    companion: refused without --overwrite, removed (not followed) with it."""
    out = tmp_path / "run" / "s.csv"
    out.parent.mkdir()
    link = out.with_name("s.csv.png")
    link.symlink_to(victim)
    from rmjax.search.sweep import SweepSpec, run_sweep

    def sweep(overwrite: bool):  # `sweep --token_ids=10,11 --plot [--overwrite]`, in-process (tests/inproc.py):
        # the figure's name is the run's when it draws one (without --plot a file there is left alone)
        return run_sweep(SweepSpec(inproc.options(rm_folder, out, overwrite=overwrite), inproc.prompts(),
                                   token_ids=(10, 11), plot=True))

    inproc.refused(lambda: sweep(overwrite=False), str(link))
    sweep(overwrite=True)
    assert victim.read_text() == VICTIM_TEXT and not link.is_symlink() and out.is_file()


def test_a_recorded_link_is_not_a_companion(tmp_path, victim):
    """Saved progress to resume and a .meta.json that records the victim's digest (under the link's name and the
    target's) made the planted link count as the run's own figure: the resume was accepted, and the sweep then drew
    its figure through the link. A link is never recorded now."""
    out = tmp_path / "run" / "s.csv"
    out.parent.mkdir()
    png = out.with_name("s.csv.png")
    png.symlink_to(victim)
    ChunkStore(out, IDENTITY, 4)  # its manifest names this run: a resume
    record = results.file_record(victim)
    results.meta_path(out).write_text(json.dumps({"identity": IDENTITY, "files": {
        "s.csv.png": record, os.path.relpath(victim, out.parent): record}}))
    with pytest.raises(OutputExistsError, match="s.csv.png already exists"):
        with claims.claim(out, IDENTITY, owned=[png], store=store_dir(out)):
            pass
    assert victim.read_text() == VICTIM_TEXT


def test_a_lock_never_takes_over_a_file_of_someone_elses(tmp_path):
    """A link planted at an output's (or companion's) name puts the lock beside its target: `Gemfile -> …` made the
    job truncate, rewrite and then delete the user's Gemfile.lock, even when the job was refused. A file at a
    lock's name that is neither empty nor an rmjax lock record is refused now and left as it was."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "Gemfile").write_text("source 'x'\n")
    lock = project / "Gemfile.lock"
    lock.write_text(VICTIM_TEXT)
    with pytest.raises(LockedError, match="not a lock record"):
        with locks.hold(project / "Gemfile"):
            pass
    assert lock.read_text() == VICTIM_TEXT
    lock.write_text(json.dumps({"pid": 1, "host": "h", "since": "00:00:00"}))  # a killed run's record: taken over
    with locks.hold(project / "Gemfile"):
        pass
    assert not lock.exists()


def test_a_linked_chunk_store_is_refused(tmp_path):
    """`s.csv.chunks -> an empty folder elsewhere`: the run wrote its manifest and chunks there and left them. Now
    refused, with or without --overwrite, and nothing is written where it points."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "run" / "s.csv"
    out.parent.mkdir()
    store_dir(out).symlink_to(elsewhere)
    for overwrite in (False, True):
        with pytest.raises(OutputExistsError, match="is a link or a file"):
            with claims.claim(out, IDENTITY, overwrite=overwrite, store=store_dir(out)):
                pass
    assert not any(elsewhere.iterdir())


def test_a_link_in_a_training_workdir_is_refused(tmp_path):
    """A resumed workdir (its run.json naming this run) with `checkpoints -> elsewhere`: orbax wrote (and, with
    --keep_checkpoints, pruned) checkpoints where the link points."""
    from rmjax.train.workdir import workdir_output

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    workdir = tmp_path / "wd"
    workdir.mkdir()
    (workdir / "run.json").write_text(json.dumps({"identity": IDENTITY}))
    (workdir / "train_log.csv").write_text("step,loss\n")
    (workdir / "checkpoints").symlink_to(elsewhere)
    with pytest.raises(OutputExistsError, match="checkpoints is a link"):
        with claims.claim_all([workdir_output(workdir, IDENTITY, overwrite=False)]):
            pass


# --- chunks: only plain files are read ----------------------------------------------------------------------------


def test_a_chunk_that_is_not_a_plain_file_is_not_read(tmp_path, victim):
    """A resumed store whose `chunk-*.npy` is a FIFO (the beam lists chunks by name: reading it hung), a link (read
    the file it points to) or a header promising 10^12 floats (allocated: MemoryError, a traceback)."""
    store = ChunkStore(tmp_path / "s.csv", IDENTITY, 4)
    os.mkfifo(store.dir / "chunk-d1-p0-c0.npy")
    (store.dir / "chunk-0000000000.npy").symlink_to(victim)
    header = {"descr": "<f4", "fortran_order": False, "shape": (10**12,)}
    with open(store.dir / "chunk-0000000004.npy", "wb") as f:
        np.lib.format.write_array_header_1_0(f, header)
        f.write(b"\0" * 64)
    try:
        assert _returns_within(store.names) == {"0000000004"}
        assert not store.has(0)
        with pytest.raises(ResumeMismatchError, match="not a regular file"):  # a FIFO opened would block forever
            _returns_within(lambda: store.load("d1-p0-c0"))
        with pytest.raises(ResumeMismatchError, match="not a regular file"):
            store.load(0)
        with pytest.raises(ResumeMismatchError, match="delete .*chunk-0000000004.npy"):
            store.load(4)
    finally:
        _unblock(store.dir / "chunk-d1-p0-c0.npy")


# --- inputs: YAML aliases, safetensors offsets, GGUF metadata ------------------------------------------------------


def test_yaml_aliases_that_expand_past_a_million_values_are_refused(tmp_path):
    """A "billion laughs" prompt file: a few lines standing for 9^9 strings; the prompt check's message printed the
    value whole (the run hung, filling memory). Here 9^7 values, refused from the YAML before any value is built."""
    from rmjax.text.prompts import read_prompt_file

    levels = ['&a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    levels += [f"&{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]" for i in range(6)]
    path = tmp_path / "prompts.yaml"
    path.write_text(f"greatest: [{', '.join(levels)}]\n")
    with pytest.raises(UsageError, match="expand to more than 1,000,000 values") as refused:
        read_prompt_file(path)
    assert len(str(refused.value)) < 500
    path.write_text("greatest: &x [1, *x]\n")
    with pytest.raises(UsageError, match="refers to the value that contains it"):
        read_prompt_file(path)


def _safetensors(path: Path, offsets, shape, dtype="F32") -> Path:
    header = json.dumps({"w": {"dtype": dtype, "shape": shape, "data_offsets": offsets}}).encode()
    header += b" " * (-len(header) % 8)
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 64)
    return path


@pytest.mark.parametrize("offsets, shape", [([-64, 0], [16]), ([64, 0], [16]), ([0, 0], [2**32, 2**32]),
                                            ([0.5, 64.5], [16]), ([0, 64], [-4, -4]), ([0, 64], [True, 16])])
def test_safetensors_offsets_and_shapes_are_whole_and_in_order(tmp_path, offsets, shape):
    """A negative or inverted span, a shape whose product overflows int64 to the span's 0 bytes, float offsets: the
    header check let them through to a seek/reshape traceback (or a slice from the file's end)."""
    path = _safetensors(tmp_path / "model.safetensors", offsets, shape)
    from rmjax.loading.safetensors_io import read_header

    with pytest.raises(CheckpointError, match="corrupt safetensors header entry for 'w'"):
        read_header(path)


def test_gguf_metadata_array_past_the_end_is_refused_at_once(tmp_path):
    """An array of 2^21 bytes in a 100-byte GGUF: gguf's reader took one empty slice per element (2^60 looped until
    memory ran out). Refused from the bounds, naming the byte it needs."""
    from rmjax.loading.gguf_file import read_gguf

    def text(s: str) -> bytes:
        return struct.pack("<Q", len(s)) + s.encode()

    kv = text("general.architecture") + struct.pack("<I", 8) + text("llama")
    kv += text("x") + struct.pack("<IIQ", 9, 0, 2**21)
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 2) + kv)
    with pytest.raises(CheckpointError, match="metadata needs bytes up to"):
        read_gguf(path)


def test_gguf_conversion_cache_is_keyed_by_content(tmp_path, monkeypatch):
    """Another GGUF put at the same path with the same size and mtime (`cp -p`, an archive) was served the old
    file's conversion, under the new file's identity: a logprobs table of the old weights, exit 0."""
    from rmjax.loading import gguf_file

    made = []

    def convert(path, out):
        out.mkdir(parents=True)
        (out / "config.json").write_text(json.dumps({"from": path.read_bytes().hex()}))
        made.append(out)

    monkeypatch.setattr(gguf_file, "gguf_to_hf_folder", convert)
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF" + b"a" * 4096)
    first = gguf_file.cached_hf_folder(path, tmp_path / "cache")
    stat = path.stat()
    path.write_bytes(b"GGUF" + b"b" * 4096)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    second = gguf_file.cached_hf_folder(path, tmp_path / "cache")
    assert second != first and len(made) == 2
    assert json.loads((second / "config.json").read_text())["from"] == path.read_bytes().hex()


# --- JSON nested past Python's recursion limit: one line naming the file, not a traceback -------------------------


def _deep(path: Path, around: str = "{}") -> Path:
    path.write_text(around.replace("{}", "[" * 100_000 + "]" * 100_000))
    return path


def test_json_nested_too_deep_is_a_named_error(tmp_path):
    """A sweep's .meta.json (read by --from_sweep), a model's config.json and safetensors header, a pairs line:
    json raised RecursionError, which no handler took (a traceback, exit 1)."""
    from rmjax.errors import InputFileError
    from rmjax.hf_config import read_json_file
    from rmjax.loading.safetensors_io import read_header
    from rmjax.train.data import read_pairs

    table = tmp_path / "s.csv"
    table.write_text("x\n")
    _deep(results.meta_path(table))
    with pytest.raises(InputFileError, match="s.csv.meta.json is unreadable"):
        results.read_meta(table)
    with pytest.raises(CheckpointError, match="invalid JSON"):
        read_json_file(_deep(tmp_path / "config.json", '{"a": {}}'))
    header = ("[" * 100_000 + "]" * 100_000).encode()
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    with pytest.raises(CheckpointError, match="corrupt safetensors header"):
        read_header(tmp_path / "model.safetensors")
    with pytest.raises(InputFileError, match="line 1 nests"):
        read_pairs(_deep(tmp_path / "pairs.jsonl"))
