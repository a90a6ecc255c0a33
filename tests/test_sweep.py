"""The vocabulary sweep against direct full-sequence forwards (rmjax and transformers)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from rmjax import nn
from rmjax.errors import PromptTooLongError
from rmjax.loading import load
from rmjax.parallel import sharding
from rmjax.runs import results
from rmjax.scoring.texts import TextScorer
from rmjax.search.sweep import sweep
from rmjax.text import chat
from rmjax.text.chat import NoChatTemplateError
from tests import cli, tiny, tolerance
from tests import jitted as M

PROMPTS = {"greatest": "What, in one word, is the greatest thing ever?",
           "worst": "What, in one word, is the worst thing ever? Think hard about all options first."}
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def rm(tmp_path_factory):
    hf, folder = tiny.save_reward_model_with_tokenizer(tmp_path_factory.mktemp("rm"))
    return hf, folder, load(str(folder))


def _sample(n: int, seed: int = 0) -> np.ndarray:
    return np.sort(np.random.default_rng(seed).choice(49152, size=n, replace=False))


def test_sweep_equals_full_forward_and_transformers(rm):
    hf, _, model = rm
    tokens = _sample(40)
    df = sweep(model, PROMPTS, tokens, batch_size=16)
    assert df["token_id"].tolist() == tokens.tolist()
    for name, text in PROMPTS.items():
        split = chat.split_chat(model.tokenizer, text)
        assert split.suffix == tuple(model.tokenizer("<|im_end|>\n", add_special_tokens=False).input_ids)
        full = np.asarray([split.ids_with([t]) for t in tokens], np.int32)
        mask = np.ones_like(full, bool)
        direct = np.asarray(M.rewards(model.params, model.config, full, mask))[:, 0]
        with torch.no_grad():
            ref = hf(input_ids=torch.from_numpy(full).long()).logits[:, 0].numpy()
        atol = tolerance.rewards_atol(model.params, model.config, full, mask)
        np.testing.assert_allclose(df[name].to_numpy(), direct, atol=atol, rtol=0)
        np.testing.assert_allclose(df[name].to_numpy(), ref, atol=atol, rtol=0)


def test_text_mode_agrees_where_retokenization_is_exact(rm):
    _, _, model = rm
    pool = _sample(3000, seed=1)
    prompt = PROMPTS["greatest"]
    split = chat.split_chat(model.tokenizer, prompt)
    scorer = TextScorer(model, prompt)
    decoded = model.tokenizer.batch_decode([[t] for t in pool])
    retok = scorer.token_ids(decoded)
    same = [i for i, ids in enumerate(retok) if ids == split.ids_with([pool[i]])][:40]
    other = [i for i, ids in enumerate(retok) if ids != split.ids_with([pool[i]])][:6]
    assert len(same) == 40 and other  # byte-fragment tokens decode to U+FFFD and re-tokenize differently
    token_df = sweep(model, {"p": prompt}, pool[same])
    text_df = sweep(model, {"p": prompt}, pool[same], mode="text")
    full = np.asarray([split.ids_with([pool[i]]) for i in same], np.int32)
    atol = tolerance.rewards_atol(model.params, model.config, full)
    np.testing.assert_allclose(text_df["p"].to_numpy(), token_df["p"].to_numpy(), atol=atol, rtol=0)
    # Where re-tokenization differs, text mode scores the re-tokenized conversation in full.
    got = scorer.score([decoded[i] for i in other])
    for k, i in enumerate(other):
        ids = np.asarray([retok[i]], np.int32)
        ref = np.asarray(M.rewards(model.params, model.config, ids, np.ones_like(ids, bool)))[0, 0]
        assert abs(got[k] - ref) <= tolerance.rewards_atol(model.params, model.config, ids)


def test_eight_devices_equal_one(rm):
    _, folder, model = rm
    tokens = _sample(50, seed=2)
    ref = sweep(model, PROMPTS, tokens, batch_size=16)
    for spec in ("data:8,model:1", "data:4,model:2"):
        sharded = load(str(folder), mesh=sharding.make_mesh(spec))
        got = sweep(sharded, PROMPTS, tokens, batch_size=16)
        for name, text in PROMPTS.items():
            full = np.asarray([chat.split_chat(model.tokenizer, text).ids_with([t]) for t in tokens], np.int32)
            atol = tolerance.rewards_atol(model.params, model.config, full)
            np.testing.assert_allclose(got[name].to_numpy(), ref[name].to_numpy(), atol=atol, rtol=0)


def _sweep_cmd(folder: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "experiments.sweep", f"--model={folder}", "--prompts=greatest,worst",
            f"--out={out}", "--limit=6144", "--chunk_size=512", "--batch_size=64", "--top=3"]


def test_kill_and_resume_gives_identical_csv(rm, tmp_path):
    """A sweep SIGKILLed mid-way and run again gives the uninterrupted run's CSV byte for byte (that run in-process:
    the job _sweep_cmd's flags make, tests/inproc.py)."""
    from rmjax.search.sweep import SweepSpec, run_sweep
    from tests import inproc

    _, folder, _ = rm
    env = cli.subprocess_env(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")  # compiled as in-process
    whole = tmp_path / "whole.csv"
    run_sweep(SweepSpec(inproc.options(folder, whole), inproc.prompts("greatest", "worst"), limit=6144,
                        chunk_size=512, batch_size=64))
    out = tmp_path / "resumed.csv"
    chunks = out.with_name(out.name + ".chunks")
    done = tiny.kill_after_chunks(_sweep_cmd(folder, out), out, 3, cwd=REPO, env=env)
    assert 3 <= done < 12, "the run must be killed mid-way"
    assert not out.exists(), "no CSV may appear before every chunk is done"
    resumed = subprocess.run(_sweep_cmd(folder, out), cwd=REPO, env=env, check=True, capture_output=True, text=True)
    assert f"{done * 512:,}/6,144" in resumed.stderr  # picked up where it stopped
    assert out.read_bytes() == whole.read_bytes()
    assert not chunks.exists()
    meta = results.meta_path(out).read_text()
    assert '"resumed_candidates": ' + str(done * 512) in meta


def test_the_library_sweep_resumes_with_its_saved_batch_and_chunk_sizes(rm, tmp_path, monkeypatch, capsys):
    """`sweep(out=…)` called again with other batch and chunk sizes continues in the saved ones (other sizes would
    split the rows in other places): the CSV of an uninterrupted run, its record naming them and the rows read back
    (two chunks of 8; the short last one of 4 is scored)."""
    from tests import inproc

    _, _, model = rm
    ids = _sample(20)
    whole, out = tmp_path / "whole.csv", tmp_path / "s.csv"
    sweep(model, PROMPTS, ids, out=whole, batch_size=4, chunk_size=8)
    with monkeypatch.context() as m:
        inproc.interrupt_at_write(m, 3)
        with pytest.raises(KeyboardInterrupt):
            sweep(model, PROMPTS, ids, out=out, batch_size=4, chunk_size=8)
    capsys.readouterr()
    sweep(model, PROMPTS, ids, out=out, batch_size=16, chunk_size=32)
    said = capsys.readouterr().err  # both kept sizes are said
    assert "with its chunk size 8" in said and "with its batch size 4, not --batch_size=16" in said
    assert out.read_bytes() == whole.read_bytes()
    meta = results.read_meta(out)
    assert (meta["batch_size"], meta["chunk_size"], meta["resumed_candidates"]) == (4, 8, 16)
    assert meta["candidates_per_second"] * meta["seconds"] == pytest.approx(4 * len(PROMPTS))  # the rate of this run
    # stopped after its last, short chunk: all 20 rows are read back, none scored
    again = tmp_path / "again.csv"
    with monkeypatch.context() as m:
        inproc.interrupt_at_finish(m)
        with pytest.raises(KeyboardInterrupt):
            sweep(model, PROMPTS, ids, out=again, batch_size=4, chunk_size=8)
    sweep(model, PROMPTS, ids, out=again, batch_size=4, chunk_size=8)
    assert again.read_bytes() == whole.read_bytes() and results.read_meta(again)["resumed_candidates"] == 20
    # a finished result is reused; asked for its figure, the reuse draws and records it
    from rmjax.search.sweep import plot_path

    sweep(model, PROMPTS, ids, out=whole, batch_size=4, chunk_size=8, plot=True)
    assert plot_path(whole).stat().st_size > 0 and plot_path(whole).name in results.read_meta(whole)["files"]


def test_resume_with_other_settings_is_refused(rm, tmp_path):
    from rmjax.errors import ResumeMismatchError

    _, _, model = rm
    out = tmp_path / "s.csv"
    out.with_name("s.csv.chunks").mkdir()
    (out.with_name("s.csv.chunks") / "manifest.json").write_text('{"identity": {"model": "other"}, "chunk_size": 4}')
    with pytest.raises(ResumeMismatchError, match="different .*model.*--overwrite to discard it"):
        sweep(model, PROMPTS, _sample(4), out=out)
    assert not out.exists()
    df = sweep(model, PROMPTS, _sample(4), out=out, overwrite=True)  # discards the other run's chunks
    # the CSV holds 9 significant digits, which round-trip a float32
    assert results.read_scores_csv(out)["greatest"].tolist() == pytest.approx(df["greatest"].tolist())
    assert not out.with_name("s.csv.chunks").exists()


def test_replaced_params_are_not_the_loaded_checkpoint(rm, tmp_path):
    """A model whose params were edited after loading must not reuse the loaded checkpoint's result."""
    import dataclasses

    from rmjax.errors import OutputExistsError

    _, _, model = rm
    out = tmp_path / "s.csv"
    first = sweep(model, PROMPTS, _sample(4), out=out)
    written = out.stat().st_mtime_ns
    sweep(model, PROMPTS, _sample(4), out=out)
    assert out.stat().st_mtime_ns == written  # the same model's finished result is reused, not rewritten
    edited = dataclasses.replace(model, params=nn.replace(model.params, model.config,
                                                          **{"score.kernel": nn.get(model.params, "score.kernel") * 2}))
    with pytest.raises(OutputExistsError, match="different model.weights"):
        sweep(edited, PROMPTS, _sample(4), out=out)
    again = sweep(edited, PROMPTS, _sample(4), out=out, overwrite=True)
    # doubling the head's weights doubles each product exactly and the sweep runs the same code: exactly twice
    np.testing.assert_array_equal(again["greatest"], 2 * first["greatest"])


def test_prompt_longer_than_context(tmp_path):
    _, folder = tiny.save_reward_model_with_tokenizer(tmp_path, max_position_embeddings=64)
    model = load(str(folder))
    with pytest.raises(PromptTooLongError, match=r"context is 64 \(max_position_embeddings\)"):
        sweep(model, {"long": "word " * 100}, _sample(4))


def test_the_room_check_names_the_depth_that_fits_and_else_the_prompt():
    """check_room at its edges (context 12, prefix 8, suffix 2: room for 2 tokens): a response that fills the room
    fits; one longer is refused naming the depth that fits; a prompt that leaves no room at all is refused as too
    long (no --depth=0 to offer), whatever the depth."""
    from rmjax.search.sweep import check_room

    check_room("p", 8, 2, 12, 2)
    check_room("p", 8, 2, 12, 1)
    with pytest.raises(PromptTooLongError, match="leaving 2 for the response; use --depth=2 or less"):
        check_room("p", 8, 2, 12, 3)
    for depth in (1, 3):
        with pytest.raises(PromptTooLongError) as error:
            check_room("p", 10, 2, 12, depth)
        assert "Shorten the prompt" in str(error.value) and "--depth" not in str(error.value)


def test_an_explicit_batch_may_reach_the_candidates_rounded_up_to_the_data_shards():
    """63 candidates on two data shards fill a batch of 64 (each shard 32 rows): allowed; 65 only pads, refused
    naming 64. On one device 63 is the most."""
    from types import SimpleNamespace

    from rmjax.errors import UsageError
    from rmjax.search.sweep import check_batch_size

    two = SimpleNamespace(shape={"data": 2, "model": 1})
    check_batch_size(64, 63, two)
    with pytest.raises(UsageError, match="--batch_size=64 or less"):
        check_batch_size(65, 63, two)
    check_batch_size(63, 63, None)
    with pytest.raises(UsageError, match="--batch_size=63 or less"):
        check_batch_size(64, 63, None)


def test_a_picked_batch_past_the_candidates_resumes(rm_folder, tmp_path, monkeypatch):
    """100 candidates with --batch_size=0: the plan picks 128 rows (a power of two), which an explicit
    --batch_size=128 is refused as (more than the candidates). A crashed run resumes with its saved 128, not
    refused, and writes what an uninterrupted run writes."""
    from rmjax.search.sweep import SweepSpec, run_sweep
    from tests import inproc

    def run(out, batch_size=0):
        return run_sweep(SweepSpec(inproc.options(rm_folder, out), inproc.prompts("greatest"), limit=100,
                                   chunk_size=64, batch_size=batch_size))

    whole = run(tmp_path / "whole.csv")
    out = tmp_path / "crashed.csv"
    with monkeypatch.context() as m:
        inproc.interrupt_at_write(m, 2)
        with pytest.raises(KeyboardInterrupt):
            run(out)
    run(out)
    assert out.read_bytes() == whole.read_bytes()
    assert results.read_meta(out)["batch_size"] == results.read_meta(whole)["batch_size"] == 128
    inproc.refused(lambda: run(tmp_path / "explicit.csv", 128), "--batch_size=128", "100 candidates")


def test_missing_chat_template(rm, tmp_path):
    import shutil

    _, folder, _ = rm
    copy = tmp_path / "notemplate"
    shutil.copytree(folder, copy)
    (copy / "chat_template.jinja").unlink()
    model = load(str(copy))
    with pytest.raises(NoChatTemplateError, match="--template=plain"):
        sweep(model, PROMPTS, _sample(4), template="chat")
    # auto falls back to the plain base-model format
    df = sweep(model, {"p": "Hi"}, _sample(4))
    split = chat.split_chat(model.tokenizer, "Hi")
    assert split.template == "plain" and split.suffix == ()
    plain = model.tokenizer("User: Hi\nAssistant:", add_special_tokens=False).input_ids  # written out here
    ids = np.asarray([[*plain, t] for t in _sample(4)], np.int32)
    ref = np.asarray(M.rewards(model.params, model.config, ids, np.ones_like(ids, bool)))[:, 0]
    np.testing.assert_allclose(df["p"].to_numpy(), ref, atol=tolerance.rewards_atol(model.params, model.config, ids),
                               rtol=0)


def test_sweep_takes_a_vocab_file_as_beam_and_gcg_do(rm_folder, tmp_path, capsys):
    """Issue 45: the sweep had no --vocab_file. Its single-token lines are scored exactly as the same ids given
    with --token_ids; a line that is not one token is skipped and counted; another file is another run."""
    from transformers import AutoTokenizer

    from rmjax.errors import RmjaxError, UsageError
    from rmjax.runs.options import RunOptions
    from rmjax.search.sweep import SweepSpec, run_sweep

    tok = AutoTokenizer.from_pretrained(rm_folder)
    words = tmp_path / "words.txt"
    words.write_text(" cat\n dog\nzzqxjv-not-one-token\n house\n", encoding="utf-8")
    ids = [tok(w, add_special_tokens=False).input_ids[0] for w in (" cat", " dog", " house")]
    by_file, by_ids = tmp_path / "file.csv", tmp_path / "ids.csv"
    prompts = {"greatest": PROMPTS["greatest"]}

    def spec(out, **given):
        return SweepSpec(RunOptions(model=str(rm_folder), out=str(out)), prompts, **given)

    run_sweep(spec(by_file, vocab_file=str(words)))
    assert "--vocab_file: 3 of 4 lines are single tokens" in capsys.readouterr().err
    run_sweep(spec(by_ids, token_ids=tuple(ids)))
    a, b = results.read_scores_csv(by_file), results.read_scores_csv(by_ids)
    assert sorted(a.token_id) == sorted(ids)
    assert a.set_index("token_id")["greatest"].sort_index().tolist() == \
        b.set_index("token_id")["greatest"].sort_index().tolist()
    words.write_text(" cat\n dog\n", encoding="utf-8")
    with pytest.raises(RmjaxError, match="--overwrite"):
        run_sweep(spec(by_file, vocab_file=str(words)))
    with pytest.raises(UsageError, match="--token_ids or --vocab_file"):
        run_sweep(spec(tmp_path / "x.csv", vocab_file=str(words), token_ids=(1,)))
