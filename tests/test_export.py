"""experiments.export: any loadable model written as a Hugging Face folder that transformers scores as rmjax does."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers

from rmjax.loading import fingerprint, load
from rmjax.loading.export import EXPORT_RECORD, run_export
from rmjax.scoring.texts import TextScorer
from tests import cli, inproc, tiny, tolerance

PROMPT = "What, in one word, is the greatest thing ever?"
TEXTS = ["Love", "Ice cream", "a quiet morning"]


def _files(folder) -> dict:
    """Every file of `folder` with its bytes and modification time: what a rerun must leave as it is."""
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.iterdir()) if p.is_file()}


def _transformers_rewards(folder, prompt: str, texts: list[str]) -> tuple[list[float], list[np.ndarray]]:
    """The rewards transformers gives each conversation, read with its own classes from the exported folder alone
    (AutoTokenizer's chat template, AutoModelForSequenceClassification's forward), and each conversation's ids."""
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(str(folder), dtype=torch.float32,
                                                                         attn_implementation="eager").eval()
    rewards, sequences = [], []
    for text in texts:
        conv = tok.apply_chat_template([{"role": "user", "content": prompt}, {"role": "assistant", "content": text}],
                                       tokenize=False)
        ids = np.asarray([tok(conv, add_special_tokens=False).input_ids], np.int32)
        with torch.no_grad():
            rewards.append(float(hf(input_ids=torch.from_numpy(ids).long()).logits[0, 0]))
        sequences.append(ids)
    return rewards, sequences


@pytest.mark.parametrize("builtin", [False, True], ids=["tiny-folder", "elo-rm-smollm2-135m"])
def test_export_writes_a_folder_transformers_scores_as_rmjax(rm_folder, tmp_path, builtin):
    """Issue 45: no job exported a builtin or loaded model as a Hugging Face folder (only train_rm --export). Now
    `export --model=SPEC --out=DIR` writes one and prints it; transformers, reading only that folder, gives each
    conversation the reward rmjax gives it on the model as loaded from SPEC (a tiny checkpoint folder, and the
    builtin default RM: a GGUF backbone plus a shipped head)."""
    spec, out = "elo-rm-smollm2-135m" if builtin else str(rm_folder), tmp_path / "hf"
    proc = cli.ok(cli.run("export", f"--model={spec}", f"--out={out}"))
    assert proc.stdout.strip().splitlines()[-1] == f"Hugging Face folder: {out}"
    model = load(spec)
    ours = TextScorer(model, PROMPT).score(TEXTS)
    theirs, sequences = _transformers_rewards(out, PROMPT, TEXTS)
    for got, ref, ids in zip(ours, theirs, sequences, strict=True):
        assert abs(float(got) - ref) <= tolerance.rewards_atol(model.params, model.config, ids), (got, ref)
    record = json.loads((out / EXPORT_RECORD).read_text())
    assert record["identity"] == {"job": "export", "model": fingerprint(spec), "dtype": "float32"}
    # what the model was trained on travels with it (a builtin RM's recipe: the Elo data; a plain folder: none)
    assert (record["recipe"] or {}).get("elo") == ("builtin" if builtin else None)


def test_export_reuses_its_own_folder_and_refuses_another_without_overwrite(rm_folder, tmp_path, monkeypatch,
                                                                            capsys):
    """Issue 45 (export job): the same model's finished export is kept as it is, saying so; another model's is
    refused in one line before anything loads, and replaced with --overwrite; the model's own folder is never an
    output (--overwrite would delete it before it loads). In-process, as the entry point calls run_export."""
    out = tmp_path / "hf"
    assert run_export(inproc.options(rm_folder, out)) == out
    before = _files(out)
    _, other = tiny.save_reward_model_with_tokenizer(tmp_path / "other", seed=3)
    with monkeypatch.context() as patch:
        inproc.no_weights_read(patch)
        capsys.readouterr()
        assert run_export(inproc.options(rm_folder, out)) == out
        assert f"--out={out}: reused (written " in capsys.readouterr().err
        inproc.refused(lambda: run_export(inproc.options(other, out)), f"--out={out}", "different model.weights",
                       "--overwrite")
        inproc.refused(lambda: run_export(inproc.options(rm_folder, rm_folder, overwrite=True)), "model's own folder")
    assert _files(out) == before  # neither the reuse nor the refusal touched a file
    run_export(inproc.options(other, out, overwrite=True))
    assert json.loads((out / EXPORT_RECORD).read_text())["identity"]["model"] == fingerprint(str(other))
    from safetensors.numpy import load_file

    written, source = load_file(str(out / "model.safetensors")), load_file(str(other / "model.safetensors"))
    assert sorted(written) == sorted(source)
    for key, value in source.items():
        np.testing.assert_array_equal(written[key], value)


def test_a_bfloat16_export_says_bfloat16(rm_folder, tmp_path):
    """export --dtype=bfloat16 wrote bfloat16 weights under a config.json saying float32 (the dtype it was read
    in): transformers, loading with the config's dtype, would take them as another precision than they are."""
    from safetensors import safe_open

    out = tmp_path / "hf"
    run_export(inproc.options(rm_folder, out, dtype="bfloat16"))
    config = json.loads((out / "config.json").read_text())
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        embed = f.get_slice("model.embed_tokens.weight").get_dtype()
    assert embed == "BF16" and config["dtype"] == "bfloat16"
    assert config.get("torch_dtype", "bfloat16") == "bfloat16"
