"""Bad inputs raise errors that name the file and the fix."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from rmjax import nn
from rmjax.errors import CheckpointError, TokenizerMismatchError, UnsupportedModelError
from rmjax.loading import load
from rmjax.loading.hf import load_hf_model_folder
from tests import tiny


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny.save_hf_model(tiny.build_hf_model("llama3", num_labels=1), tmp_path_factory.mktemp("m"))


@pytest.fixture()
def copy(folder, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(folder, out)
    return out


def test_unknown_spec_names_the_fix():
    with pytest.raises(FileNotFoundError, match="rmjax never downloads.*huggingface-cli download"):
        load("Skywork/Not-A-Local-Folder")


def test_an_empty_spec_or_several_models_where_one_is_taken_say_so(folder):
    """--model= read as the current folder ("no model.safetensors in ."); --model=A,B as a hub id to download."""
    from rmjax.errors import UsageError

    with pytest.raises(UsageError, match="--model is empty"):
        load("")
    with pytest.raises(UsageError, match="this job takes one model"):
        load(f"{folder},{folder}")


def test_missing_config(copy):
    (copy / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"config\.json not found"):
        load_hf_model_folder(copy, require_tokenizer=False)


def test_a_train_rm_workdir_given_as_a_model_is_named_with_its_fix(tmp_path):
    """--model=WORKDIR (train_rm's checkpoints, no config.json) advised copying config.json from the original
    Hugging Face repository (helper-159); a workdir's model is its export."""
    from rmjax.loading import config_of

    workdir = tmp_path / "w1"
    (workdir / "checkpoints").mkdir(parents=True)
    (workdir / "run.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=f"{workdir} is a train_rm workdir, not a model folder: rerun its "
                       "train_rm command with --export=FOLDER"):
        config_of(str(workdir))


def test_unsupported_architecture(copy):
    cfg = json.loads((copy / "config.json").read_text())
    cfg["architectures"], cfg["model_type"] = ["MistralForCausalLM"], "mistral"
    (copy / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match=r"config\.json: architecture MistralForCausalLM .*not supported"):
        load_hf_model_folder(copy, require_tokenizer=False)


def test_no_weights(copy):
    (copy / "model.safetensors").unlink()
    (copy / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"no model\.safetensors.*safe_serialization=True"):
        load_hf_model_folder(copy, require_tokenizer=False)


def test_missing_shard(copy):
    (copy / "model.safetensors").unlink()  # read before an index beside it, as transformers reads it
    index = {"metadata": {}, "weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors",
                                            "score.weight": "model-00002-of-00002.safetensors"}}
    (copy / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"missing: model-00001-of-00002\.safetensors.*every shard"):
        load_hf_model_folder(copy, require_tokenizer=False)


def test_causal_lm_weights_under_reward_config(tmp_path):
    lm = tiny.save_hf_model(tiny.build_hf_model("llama3"), tmp_path)
    cfg = json.loads((lm / "config.json").read_text())
    cfg["architectures"] = ["LlamaForSequenceClassification"]
    (lm / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"missing parameters score.*needs `score\.weight`"):
        load_hf_model_folder(lm, require_tokenizer=False)


def test_missing_tokenizer(copy):
    with pytest.raises(CheckpointError, match=r"no tokenizer files.*Copy them"):
        load_hf_model_folder(copy)


def test_tokenizer_larger_than_embedding(copy):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(tiny.VOCAB + 10)}
    fast = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t0")))
    fast.save_pretrained(str(copy))
    with pytest.raises(TokenizerMismatchError, match=rf"tokenizer has {tiny.VOCAB + 10} tokens.*{tiny.VOCAB} rows"):
        load_hf_model_folder(copy)


def test_matching_tokenizer_loads(copy):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(tiny.VOCAB)}
    fast = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t0")))
    fast.save_pretrained(str(copy))
    assert len(load_hf_model_folder(copy).tokenizer) == tiny.VOCAB


def test_another_models_smaller_tokenizer_is_refused(copy):
    """A tokenizer of fewer tokens than the embedding passed the size check, though config.json's end-of-sequence
    id is not one of its tokens (a Llama 3 RM given SmolLM2's tokenizer scored, exit 0): every id it gives names
    another token in this model."""
    import json

    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    raw = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**raw, "eos_token_id": [2, tiny.VOCAB - 1]}))
    vocab = {f"t{i}": i for i in range(tiny.VOCAB // 2)}
    fast = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t0")))
    fast.save_pretrained(str(copy))
    with pytest.raises(TokenizerMismatchError, match=rf"eos_token_id {tiny.VOCAB - 1} is not a token of this "
                                                     rf"tokenizer \({tiny.VOCAB // 2} tokens\)"):
        load_hf_model_folder(copy)


def test_another_models_tokenizer_holding_the_configs_ids_is_refused_by_its_bos(copy):
    """A fault hunt: a smaller tokenizer whose size still covers config.json's bos, eos and pad ids loaded silently
    (SmolLM2's tokenizer on a Gemma RM: config's bos 2 is its <|im_end|>). Its own beginning-of-text token is
    another id than config.json's, which names the mismatch."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(tiny.VOCAB // 2)}
    fast = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t0")),
                                   bos_token="t5")
    fast.save_pretrained(str(copy))
    with pytest.raises(TokenizerMismatchError, match=r"bos_token_id 1 is 't1' in this tokenizer, whose own "
                                                     r"beginning-of-text token is 't5' \(id 5\)"):
        load_hf_model_folder(copy)
    fast = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t0")),
                                   bos_token="t1")
    fast.save_pretrained(str(copy))  # the same tokenizer with config.json's bos loads
    assert load_hf_model_folder(copy).tokenizer.bos_token_id == 1
    raw = json.loads((copy / "config.json").read_text())  # a legacy -1 names no token: nothing to compare
    (copy / "config.json").write_text(json.dumps({**raw, "bos_token_id": -1}))
    assert load_hf_model_folder(copy).tokenizer.bos_token_id == 1


def test_bad_dtype(copy):
    with pytest.raises(ValueError, match="dtype 'int8' not supported"):
        load_hf_model_folder(copy, dtype="int8", require_tokenizer=False)


def test_bfloat16_load_keeps_float32_scores(folder):
    from tests import jitted as M

    f32 = load_hf_model_folder(folder, require_tokenizer=False)
    bf16 = load_hf_model_folder(folder, dtype="bfloat16", require_tokenizer=False)
    assert nn.get(bf16.params, "layers.q").dtype == np.dtype("bfloat16")
    ids, mask = tiny.random_batch(seed=7, batch=4, length=10, padding="right")
    a = np.asarray(M.rewards(f32.params, f32.config, ids, mask))
    b = np.asarray(M.rewards(bf16.params, bf16.config, ids, mask))
    assert b.dtype == np.float32
    assert np.abs(a - b).max() < 0.05 * np.abs(a).max() + 0.05


def test_a_file_the_run_cannot_read_is_one_line(tmp_path):
    """An unreadable config.json, tokenizer or weights file ended in a PermissionError traceback (status 1). Every
    entry point's runner now says which file, in one line (status 2). Root reads any file, so the error is raised
    as `open` raises it for a user who cannot."""
    import subprocess
    import sys

    code = ("import errno\nfrom experiments import cli\n"
            "def main(argv):\n"
            "    raise PermissionError(errno.EACCES, 'Permission denied', '/models/rm/config.json')\n"
            "cli.run(main)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == ("error: cannot read or write /models/rm/config.json: Permission denied; fix its "
                                   "permissions (or give another path), then rerun the same command.")


def test_a_path_name_past_the_file_systems_limit_is_one_line(rm_folder, tmp_path):
    """helper-143: a file or folder name over 255 bytes (OSError ENAMETOOLONG) ended in a traceback wherever a job
    first touched the path: score's --out, a sweep's --out of 246-255 bytes (its figure's record, before the name
    check), --model, --texts_file. Each now stops in one line naming the path, before any weights load."""
    from tests import cli

    long = "a" * 300
    procs = cli.run_each(
        ("score", f"--model={rm_folder}", "--texts=a", f"--out={tmp_path / long}.csv"),
        ("sweep", f"--model={rm_folder}", "--limit=8", f"--out={tmp_path / ('b' * 248)}.csv"),
        ("score", f"--model={tmp_path / long}", "--texts=a"),
        ("score", f"--model={rm_folder}", f"--texts_file={tmp_path / long}.txt"))
    for proc in procs:
        line = cli.user_error(proc, "File name too long", "give a shorter path")
        assert "characters)" in line or len(line) < 200, line
