"""experiments.export: any loadable model written as a Hugging Face folder that transformers scores as rmjax does."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
import transformers

from rmjax.loading import fingerprint, load
from rmjax.loading.export import EXPORT_RECORD, run_export, save_hf_folder
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
    # the options rmjax read the tokenizer with are not the model's settings (helper-152: they were written there)
    saved = json.loads((out / "tokenizer_config.json").read_text())
    assert not {"local_files_only", "is_local"} & saved.keys(), saved


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
    # --overwrite keeps the earlier export whole until the new model has loaded (a fault hunt: a load that failed,
    # or a Ctrl-C during it, left the folder empty)
    from rmjax.loading import for_job

    def fails(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(for_job, "load", fails)
        with pytest.raises(KeyboardInterrupt):
            run_export(inproc.options(other, out, overwrite=True))
    assert _files(out) == before
    # stopped inside the removal itself, the earlier export's record has gone first: the folder left is not reused
    # as that export (its weights half deleted) and is marked unfinished, which --overwrite replaces (it was refused
    # as files no rmjax run wrote, --overwrite or not: a folder to delete by hand)
    from rmjax.runs import folder_files

    real_remove = folder_files.remove

    def stops_after_one(paths, store=None):
        real_remove(list(paths)[:1])
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(folder_files, "remove", stops_after_one)
        with pytest.raises(KeyboardInterrupt):
            run_export(inproc.options(other, out, overwrite=True))
    assert not (out / EXPORT_RECORD).exists() and _files(out) != before
    with monkeypatch.context() as patch:  # stopped again inside the unfinished folder's deletion: still marked
        patch.setattr(folder_files, "remove", stops_after_one)
        with pytest.raises(KeyboardInterrupt):
            run_export(inproc.options(other, out, overwrite=True))
    inproc.refused(lambda: run_export(inproc.options(rm_folder, out)), "is not a finished rmjax result",
                   "Pass --overwrite to replace it")
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


def _multimodal_gemma3(folder, classifier: bool):
    """A tiny multimodal Gemma 3 (Gemma3ForSequenceClassification or …ForConditionalGeneration, a SigLIP tower,
    text fields nested in text_config) with the SmolLM2 tokenizer, saved by transformers."""
    import shutil

    vision = transformers.SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                             num_attention_heads=2, image_size=28, patch_size=14)
    text = tiny.hf_config("gemma3", vocab_size=49152, pad_token_id=2, bos_token_id=1, eos_token_id=2).to_dict()
    # the token ids at the top level too, as google/gemma-3-4b-it has them (its eos: [1, 106])
    cfg = transformers.Gemma3Config(text_config=text, vision_config=vision.to_dict(), mm_tokens_per_image=4,
                                    eos_token_id=[2, 5], bos_token_id=1, pad_token_id=2,
                                    **({"num_labels": 1} if classifier else {}))
    torch.manual_seed(0)
    cls = transformers.Gemma3ForSequenceClassification if classifier else transformers.Gemma3ForConditionalGeneration
    hf = cls(cfg).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():  # weights far from the initializer's, so random ones would show
            p.normal_(0.0, 0.5 if "norm" in name or "embed" in name else 0.15)
    tiny.save_hf_model(hf, folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(tiny.smollm2_tokenizer_folder() / name, folder / name)
    return folder


def _loads_whole(folder):
    """transformers' model of `folder`, refused where any weight was missing (left at its initializer) or unused."""
    hf, info = transformers.AutoModelForSequenceClassification.from_pretrained(
        str(folder), dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    return hf.eval()


def test_a_multimodal_gemma3_exports_as_its_text_model(tmp_path):
    """The export of a multimodal Gemma 3 RM kept its config (model_type gemma3, text_config nested) beside
    text-only weight names: transformers ran the language model on random weights (rewards −1.15 for 0.54). And an
    RM made from a multimodal Gemma 3 LM (train_rm) wrote a config neither transformers nor rmjax could read."""
    from rmjax.loading.reward_head import reward_model_from_lm
    from rmjax.train.rm import save_hf_folder

    source = _multimodal_gemma3(tmp_path / "mm_rm", classifier=True)
    out = run_export(inproc.options(str(source), tmp_path / "export"))
    expected, sequences = _transformers_rewards(source, PROMPT, TEXTS)  # the multimodal class on its own folder
    got, same = _transformers_rewards(out, PROMPT, TEXTS)
    _loads_whole(out)
    assert all(np.array_equal(a, b) for a, b in zip(sequences, same, strict=True))
    model = load(str(out))
    # the text model's config as rmjax reads it from the multimodal one: the same but for the class (token ids too)
    assert dataclasses.replace(model.config, architecture="") == dataclasses.replace(load(str(source)).config,
                                                                                      architecture="")
    # the class transformers' own table names for a gemma3_text classifier (a tool reading `architectures`, not
    # `model_type`, built the multimodal model)
    from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES as CLASSES

    assert json.loads((out / "config.json").read_text())["architectures"] == [CLASSES["gemma3_text"]]
    for ids, want, have in zip(sequences, expected, got, strict=True):
        atol = tolerance.any_rewards_atol(model.params, model.config, ids.shape[1])
        assert abs(have - want) <= 2 * atol, (have, want, atol)  # two float32 forwards of the same weights
    # an export written before this rule (its record's identity without it) ran on random weights: not reused
    record = json.loads((out / EXPORT_RECORD).read_text())
    assert record["identity"]["config"] == "text-only"
    del record["identity"]["config"]
    (out / EXPORT_RECORD).write_text(json.dumps(record))
    inproc.refused(lambda: run_export(inproc.options(str(source), out)), "--overwrite")
    lm = load(str(_multimodal_gemma3(tmp_path / "mm_lm", classifier=False)))
    rm = reward_model_from_lm(lm, seed=3)
    written = save_hf_folder(rm, tmp_path / "trained")
    _loads_whole(written)
    want, (ids,) = _transformers_rewards(written, PROMPT, TEXTS[:1])
    reloaded = load(str(written))
    have = float(TextScorer(reloaded, PROMPT).score(TEXTS[:1])[0])
    assert abs(have - want[0]) <= 2 * tolerance.any_rewards_atol(reloaded.params, reloaded.config, ids.shape[1])


def test_an_untied_lm_exports_with_its_own_head_where_transformers_reads_it(tmp_path):
    """An untied causal LM's head is `lm_head.weight` at the top level of the checkpoint, as transformers saves it:
    the exported folder has the original's tensor names, loads with no missing weight and holds
    the original model's weights, each exactly (float32 written as read)."""
    from safetensors import safe_open

    hf = tiny.build_hf_model("llama3", tie_word_embeddings=False)
    folder = tiny.save_hf_model(hf, tmp_path / "lm")
    out = save_hf_folder(load(str(folder), require_tokenizer=False), tmp_path / "out")
    again, info = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32,
                                                                     output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    with safe_open(str(folder / "model.safetensors"), "np") as a, safe_open(str(out / "model.safetensors"), "np") as b:
        assert set(b.keys()) == set(a.keys())  # the names transformers itself saved (tools read keys literally)
    want, got = hf.state_dict(), again.state_dict()
    assert want.keys() == got.keys() and "lm_head.weight" in got
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=0, atol=0, msg=name)


def test_a_model_without_a_chat_template_records_the_plain_format_it_is_scored_in(rm_folder, tmp_path, capsys):
    """A fault hunt: Gemma 3 270M's export had no chat template (rmjax reads it plain) and said nothing, so a
    transformers user's apply_chat_template failed. The job and rmjax_export.json now give the format; transformers,
    fed conversations written so, gives rmjax's rewards."""
    source = cli.copy_without_chat_template(rm_folder, tmp_path / "plain_rm")
    out = tmp_path / "hf"
    run_export(inproc.options(source, out))
    form = json.loads((out / EXPORT_RECORD).read_text())["conversation_format"]
    assert form == "User: {prompt}\nAssistant: {response}" and "has no chat template" in capsys.readouterr().err
    model = load(str(source))
    ours = TextScorer(model, PROMPT).score(TEXTS)
    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(str(out), dtype=torch.float32,
                                                                         attn_implementation="eager").eval()
    for got, text in zip(ours, TEXTS, strict=True):
        ids = np.asarray([tok(form.format(prompt=PROMPT, response=text), add_special_tokens=False).input_ids])
        with torch.no_grad():
            ref = float(hf(input_ids=torch.from_numpy(ids).long()).logits[0, 0])
        assert abs(float(got) - ref) <= tolerance.rewards_atol(model.params, model.config, ids), (got, ref)
