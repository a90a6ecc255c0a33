"""Issue 42, security: nothing planted beside an output or inside a model folder makes rmjax write, delete or
run what it should not.

- Lock files (`OUT.lock`) are never followed: a planted symlink, dangling link, directory, FIFO or hard link
  there is refused in one line (exit 2) and the file it points to is left as it was (the job does not work
  around it: a link where rmjax keeps its lock is someone's mistake or attack, and the user decides). One
  mechanism, `rmjax.runs.locks.hold`, serves every job's output lock, train_rm's workdir lock and the GGUF
  conversion lock; each is tested through the function that takes it.
- A model folder whose config.json or tokenizer_config.json has an `auto_map` naming code is refused before
  anything is parsed or imported (except a ported head's own modeling file, which rmjax replaces and never
  imports); even past that check, transformers is never allowed to run folder code.
- A shard index naming files outside the folder is refused before any weight is read.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys

import pytest

from rmjax.errors import CheckpointError, LockedError
from rmjax.runs import locks
from tests import cli
from tests.cli import VICTIM_TEXT


def _plant(lock, target):
    lock.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, lock)
    return lock


# --- locks -----------------------------------------------------------------------------------------------


def test_job_lock_symlink_refuses_the_job_and_spares_its_target(rm_folder, tmp_path, victim):
    """A sweep whose `s.csv.lock` is a planted symlink used to truncate, overwrite, then delete the victim
    (exit 0). Now: exit 2, one line naming the link and saying to remove it; the victim is unchanged."""
    out = tmp_path / "run" / "s.csv"
    lock = _plant(tmp_path / "run" / "s.csv.lock", victim)
    line = cli.user_error(cli.run("sweep", f"--model={rm_folder}", f"--out={out}", "--token_ids=10,11"),
                          str(lock), "symbolic link", "remove it")
    assert "rm " in line
    assert victim.read_text() == VICTIM_TEXT and lock.is_symlink() and not out.exists()


def _claim_output(out):
    from rmjax.runs.claims import claim

    with claim(out, {"job": "test"}):
        pass


def _claim_workdir(workdir):
    from rmjax.train.workdir import claim_workdir

    with claim_workdir(workdir, {"job": "test"}, overwrite=False):
        pass


class _Stop(Exception):
    pass


def _convert_gguf(tmp_path, monkeypatch):
    """The GGUF conversion's lock path (cache/converted/NAME-DIGEST.lock) and a function taking it: the first
    call learns where the conversion would go (the real conversion replaced by a recorder)."""
    from rmjax.loading import gguf_file

    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF not really")
    cache = tmp_path / "cache"
    seen = []

    def record(path, tmp):
        seen.append(tmp)
        raise _Stop  # only the path was wanted

    monkeypatch.setattr(gguf_file, "gguf_to_hf_folder", record)
    with pytest.raises(_Stop):
        gguf_file.cached_hf_folder(gguf, cache)
    (partial,) = seen
    out = partial.with_name(partial.name.removesuffix(".partial"))
    return out.with_name(out.name + ".lock"), lambda: gguf_file.cached_hf_folder(gguf, cache)


def _sites(tmp_path, monkeypatch):
    """(lock file, a call that takes it) for each kind of lock."""
    out, workdir = tmp_path / "job" / "s.csv", tmp_path / "train" / "workdir"
    return {
        "job output": (out.with_name("s.csv.lock"), lambda: _claim_output(out)),
        "train_rm workdir": (workdir.with_name("workdir.lock"), lambda: _claim_workdir(workdir)),
        "gguf conversion": _convert_gguf(tmp_path, monkeypatch),
    }


SITES = ["job output", "train_rm workdir", "gguf conversion"]


@pytest.mark.parametrize("site", SITES)
def test_symlink_lock_refused_target_unchanged(tmp_path, monkeypatch, victim, site):
    lock, take = _sites(tmp_path, monkeypatch)[site]
    _plant(lock, victim)
    with pytest.raises(LockedError, match="symbolic link.*remove it"):
        take()
    assert victim.read_text() == VICTIM_TEXT and lock.is_symlink()


@pytest.mark.parametrize("site", SITES)
def test_dangling_lock_link_creates_nothing(tmp_path, monkeypatch, site):
    lock, take = _sites(tmp_path, monkeypatch)[site]
    target = tmp_path / "elsewhere" / "created-by-rmjax"
    target.parent.mkdir()
    _plant(lock, target)
    with pytest.raises(LockedError, match="symbolic link"):
        take()
    assert not target.exists() and lock.is_symlink()


@pytest.mark.parametrize("kind", ["directory", "fifo", "hard link"])
def test_lock_path_that_is_no_plain_file_is_refused(tmp_path, victim, kind):
    """Other things planted at the lock's name: a directory or FIFO (used to end in a traceback), a hard link
    to a victim file (used to be truncated and overwritten like the symlink's target)."""
    out = tmp_path / "s.csv"
    lock = locks.lock_path(out)
    if kind == "directory":
        lock.mkdir()
    elif kind == "fifo":
        os.mkfifo(lock)
    else:
        os.link(victim, lock)
    with pytest.raises(LockedError, match="remove it"):
        with locks.hold(out):
            pass
    assert victim.read_text() == VICTIM_TEXT and os.path.lexists(lock)


def test_lock_of_a_symlinked_output_lies_beside_the_real_file(tmp_path):
    """A symlinked --out and its target are one output: one lock, beside the target (analyze's --out too, which
    does not go through paths.real_path); the link's own name gets no lock file."""
    real = tmp_path / "real" / "out"
    real.parent.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    with locks.hold(link) as lock:
        assert lock == real.with_name("out.lock") and lock.is_file() and not lock.is_symlink()
        assert not os.path.lexists(tmp_path / "link.lock")
        with pytest.raises(LockedError, match="already holds"):
            with locks.hold(real):
                pass
    assert not os.path.lexists(lock)


# --- remote code -----------------------------------------------------------------------------------------


def _with_code(src, folder, file, marker):
    """A copy of `src` whose `file` maps a class to `evil.py`, which writes `marker` if it is ever imported."""
    shutil.copytree(src, folder)
    (folder / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n"
                                    "from transformers import PreTrainedTokenizerFast as EvilTokenizer\n"
                                    "from transformers import LlamaConfig as EvilConfig\n")
    raw = json.loads((folder / file).read_text())
    if file == "tokenizer_config.json":
        raw["auto_map"] = {"AutoTokenizer": ["evil.EvilTokenizer", None]}
        raw["tokenizer_class"] = "EvilTokenizer"  # no transformers class of that name: the [y/N] prompt
    else:
        raw["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForSequenceClassification": "evil.Evil"}
    (folder / file).write_text(json.dumps(raw))
    return folder


@pytest.mark.parametrize("file", ["tokenizer_config.json", "config.json"])
def test_folder_with_code_refused_before_anything_loads_even_after_y(rm_folder, tmp_path, file):
    """A sweep on a folder that brings its own tokenizer code, with "y" on stdin: transformers used to ask
    "[y/N]" and then import the folder's code. Now: exit 2, one line, before any weight; the code never ran."""
    marker = tmp_path / "MARKER"
    model = _with_code(rm_folder, tmp_path / "model", file, marker)
    proc = subprocess.run(cli.command("sweep", f"--model={model}", f"--out={tmp_path / 's.csv'}", "--token_ids=10"),
                          cwd=cli.REPO, env=cli.subprocess_env(), input="y\ny\n", capture_output=True, text=True,
                          timeout=600)
    cli.user_error(proc, f"{model / file}: its auto_map names code", "evil.", "runs no code",
                   "supported architecture")
    assert not marker.exists()


def test_every_loader_path_refuses_auto_map(rm_folder, tmp_path, monkeypatch):
    """The folder loader, the fingerprint, peek/config_of and the tokenizer reader: one check, before config or
    weights are parsed (a weight read would fail the test)."""
    from rmjax import loading
    from rmjax.loading import hf, safetensors_io

    monkeypatch.setattr(safetensors_io, "read_header", lambda path: pytest.fail(f"weights read: {path}"))
    model = _with_code(rm_folder, tmp_path / "model", "config.json", tmp_path / "MARKER")
    for call in (lambda: loading.load(str(model)), lambda: loading.peek(str(model)),
                 lambda: loading.fingerprint(str(model)), lambda: loading.config_of(str(model)),
                 lambda: hf.load_hf_model_folder(model), lambda: hf.load_tokenizer(model, None)):
        with pytest.raises(CheckpointError, match="auto_map names code of its own"):
            call()
    assert not (tmp_path / "MARKER").exists()


def test_transformers_never_allowed_to_run_folder_code(rm_folder, tmp_path, monkeypatch):
    """The second wall: with the auto_map check bypassed, transformers is still told trust_remote_code=False
    (it used to ask, and "y" on stdin ran the code)."""
    from rmjax import hf_config
    from rmjax.loading import hf

    monkeypatch.setattr(hf, "refuse_remote_code", lambda folder: None, raising=False)  # absent before the fix
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))
    model = _with_code(rm_folder, tmp_path / "model", "tokenizer_config.json", tmp_path / "MARKER")
    with pytest.raises(CheckpointError, match="cannot be read"):
        hf.load_tokenizer(model, hf_config.load_config_file(model / "config.json"))
    assert not (tmp_path / "MARKER").exists()


PORTED_AUTO_MAP = {"AutoModelForSequenceClassification": "modeling_custom.LlamaForRewardModelWithGating"}


@pytest.mark.parametrize("architecture,auto_map,refused", [
    ("LlamaForRewardModelWithGating", PORTED_AUTO_MAP, False),  # ArmoRM as published: rmjax ports its head
    ("LlamaForSequenceClassification", PORTED_AUTO_MAP, True),  # a plain architecture whose class is swapped
    ("LlamaForRewardModelWithGating", {**PORTED_AUTO_MAP, "AutoTokenizer": ["tok.T", None]}, True),
    ("LlamaForCausalLM", {"AutoTokenizer": [None, None]}, False),  # names no code
])
def test_auto_map_of_a_ported_head_is_no_foreign_code(tmp_path, architecture, auto_map, refused):
    """The published ArmoRM/QRM/URM configs map their architecture to the authors' modeling file, which rmjax
    replaces by its port (rmjax/heads.py) and never imports: they still load. Any other code is refused."""
    from rmjax.loading.hf import refuse_remote_code

    (tmp_path / "config.json").write_text(json.dumps({"architectures": [architecture], "auto_map": auto_map}))
    if refused:
        with pytest.raises(CheckpointError, match="runs no code"):
            refuse_remote_code(tmp_path)
    else:
        refuse_remote_code(tmp_path)


# --- shard index -----------------------------------------------------------------------------------------


def _sharded_outside(rm_folder, tmp_path, name_of):
    """A copy of the tiny model whose index names one shard by `name_of(path of a real shard outside)`: a
    loadable safetensors file (the model's own weights) sits outside the folder."""
    outside = tmp_path / "x" / "model.safetensors"
    outside.parent.mkdir()
    shutil.copy(rm_folder / "model.safetensors", outside)
    model = shutil.copytree(rm_folder, tmp_path / "a" / "b" / "model")
    (model / "model.safetensors").unlink()
    from safetensors import safe_open

    with safe_open(str(outside), "np") as f:
        keys = list(f.keys())
    index = {"metadata": {}, "weight_map": dict.fromkeys(keys, name_of(outside, model))}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    return model


OUTSIDE = {
    "relative ..": lambda outside, model: os.path.relpath(outside, model),
    "absolute": lambda outside, model: str(outside),
}


@pytest.mark.parametrize("how", list(OUTSIDE))
def test_index_pointing_outside_the_folder_is_refused_before_any_read(rm_folder, tmp_path, monkeypatch, how):
    """`../../x/model.safetensors` or `/abs/x/model.safetensors` in the index used to be loaded (exit 0)."""
    from rmjax import loading
    from rmjax.loading import hf, safetensors_io

    model = _sharded_outside(rm_folder, tmp_path, OUTSIDE[how])
    monkeypatch.setattr(safetensors_io, "read_header", lambda path: pytest.fail(f"weights read: {path}"))
    for call in (lambda: hf.load_hf_model_folder(model), lambda: loading.fingerprint(str(model))):
        with pytest.raises(CheckpointError, match=r"model\.safetensors\.index\.json: shard .* lies outside the folder"):
            call()


def test_index_outside_refused_by_the_entry_point(rm_folder, tmp_path):
    model = _sharded_outside(rm_folder, tmp_path, OUTSIDE["relative .."])
    cli.user_error(cli.run("sweep", f"--model={model}", f"--out={tmp_path / 's.csv'}", "--token_ids=10"),
                   "index.json: shard", "lies outside the folder")


BAD_NAMES = [("", "not a file name"), ("a\0b.safetensors", "not a file name"), (7, "not a file name"),
             ("sub/model.safetensors", "not a file directly in the folder"), ("config.json", "not a .safetensors")]


@pytest.mark.parametrize("name,why", BAD_NAMES, ids=[repr(n) for n, _ in BAD_NAMES])
def test_index_names_that_are_no_shard_file_are_refused(rm_folder, tmp_path, name, why):
    model = shutil.copytree(rm_folder, tmp_path / "model")
    (model / "sub").mkdir()
    (model / "model.safetensors").rename(model / "sub" / "model.safetensors")  # beside the index it would be read
    index = {"weight_map": {"score.weight": name}}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    from rmjax.loading.safetensors_io import checkpoint_files

    with pytest.raises(CheckpointError, match=why):
        checkpoint_files(model)


@pytest.mark.parametrize("weight_map", [[], ["model.safetensors"], {}, "model.safetensors", None])
def test_index_weight_map_of_the_wrong_shape_is_refused(rm_folder, tmp_path, weight_map):
    model = shutil.copytree(rm_folder, tmp_path / "model")
    (model / "model.safetensors").unlink()  # read before an index beside it, as transformers reads it
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    from rmjax.loading.safetensors_io import checkpoint_files

    with pytest.raises(CheckpointError, match="not a valid shard index"):
        checkpoint_files(model)


def test_a_weights_file_that_is_no_regular_file_is_refused(rm_folder, tmp_path):
    """A directory named like a weights file used to end in a traceback (IsADirectoryError); a FIFO would have
    blocked the read forever."""
    from rmjax.loading.safetensors_io import checkpoint_files

    model = shutil.copytree(rm_folder, tmp_path / "model")
    (model / "model.safetensors").rename(model / "weights.safetensors")  # no model.safetensors: every one is read
    (model / "extra.safetensors").mkdir()
    with pytest.raises(CheckpointError, match="extra.safetensors: not a regular file"):
        checkpoint_files(model)
    (model / "extra.safetensors").rmdir()
    (model / "model.safetensors").mkdir()  # the checkpoint's own file
    with pytest.raises(CheckpointError, match="model.safetensors: not a regular file"):
        checkpoint_files(model)
