"""NaN/Inf never written silently; every bad value or file a one-line error before the work starts.

Each test runs the entry points as a user does and reproduces one way issue 11 found a wrong
result, a late failure or an unclear error (3, 5, 6, 7).
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from tests import cli


@pytest.fixture(scope="module")
def love(rm_folder):
    """The token ids of the response 'Love' as the chat template tokenizes it."""
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(str(rm_folder))("Love", add_special_tokens=False).input_ids
    assert len(ids) == 1
    return ids[0]


def _meta(out):
    return json.loads(out.with_name(out.name + ".meta.json").read_text())


def test_nan_score_head_stops_sweep_and_gcg(rm_folder, tmp_path):
    """3: a NaN head weight used to give an all-NaN CSV and bare NaN in GCG's JSON, with status 0."""
    model = cli.copy_folder(rm_folder, tmp_path / "nan_head")
    cli.edit_tensor(model, "score.weight", lambda w: np.where(np.arange(w.size).reshape(w.shape) == 7, np.nan, w))
    out = tmp_path / "s.csv"
    flags = [f"--model={model}", "--prompts=greatest,worst", f"--out={out}", "--token_ids=10,11,12"]
    cli.user_error(cli.run("sweep", *flags), "non-finite scores", "token 10", "the reward head",
                   "non-finite parameters: score.kernel (1 value", "--allow_nonfinite", loaded=True)
    assert not out.exists()
    cli.ok(cli.run("sweep", *flags, "--allow_nonfinite"))
    assert pd.read_csv(out)[["greatest", "worst"]].isna().all().all()
    assert _meta(out)["nonfinite"]["values"] == 6 and _meta(out)["nonfinite"]["allowed"] is True
    # The analysis refuses such a table, naming its rows.
    cli.user_error(cli.run("analyze", f"--scores={out}", "--models_yaml=", f"--out={tmp_path / 'a'}"),
                   "NaN/Inf", "token 10", "--allow_nonfinite")
    gcg = tmp_path / "g.json"
    cli.user_error(cli.run("gcg", f"--model={model}", f"--out={gcg}", "--num_tokens=2", "--steps=2",
                           "--search_width=8", "--topk=8"), "non-finite rewards", "the reward head", loaded=True)
    assert not gcg.exists()


def test_nan_embedding_row_is_named(rm_folder, love, tmp_path):
    """3: one NaN embedding row used to be reported as the 'bottom' token of a sweep."""
    model = cli.copy_folder(rm_folder, tmp_path / "nan_row")
    cli.edit_tensor(model, "model.embed_tokens.weight", lambda w: np.where(np.arange(len(w))[:, None] == love,
                                                                           np.nan, w))
    cli.user_error(cli.run("sweep", f"--model={model}", f"--out={tmp_path / 's.csv'}", f"--token_ids=5,{love},7"),
                   f"token {love} ('Love')", f"the embedding row of token {love}",
                   f"embed.embedding (64 values, row {love})", loaded=True)
    cli.user_error(cli.run("score", f"--model={model}", f"--out={tmp_path / 't.csv'}", "--texts=Peace,Love"),
                   "non-finite rewards", "text 'Love'", f"the embedding row of token {love}", loaded=True)
    assert not (tmp_path / "t.csv").exists()
    cli.ok(cli.run("score", f"--model={model}", f"--out={tmp_path / 't.csv'}", "--texts=Peace,Love",
                   "--allow_nonfinite"))
    table = pd.read_csv(tmp_path / "t.csv", keep_default_na=False, na_values=["nan"])
    assert np.isnan(table.greatest[1]) and np.isfinite(table.greatest[0])
    assert _meta(tmp_path / "t.csv")["nonfinite"] == {"values": 1, "rows": 1, "first": ["text 'Love' for 'greatest'"],
                                                     "allowed": True}


@pytest.fixture()
def bad_yaml(tmp_path):
    (tmp_path / "nul.yaml").write_text("greatest: What is the greatest thing?\nnul:\n")
    (tmp_path / "broken.yaml").write_text("a: [unclosed\n")
    return tmp_path


BAD_SWEEP_FLAGS = [
    (["--limit=-1"], ["--limit=-1"]),  # used to drop the last token
    (["--batch_size=-1"], ["--batch_size=-1"]),  # used to run at batch 1
    (["--chunk_size=0"], ["--chunk_size=0"]),  # used to leave a .chunks/ behind
    (["--token_ids=1,abc"], ["--token_ids", "'abc'"]),  # used to fail after the model loaded
    (["--mesh=model:0"], ["--mesh", "size 0"]),  # used to be a ZeroDivisionError
    (["--mesh=data:3"], ["--mesh=data:3", "needs 3 devices"]),
    (["--output_column=-2"], ["--output_column=-2"]),
    (["--prompts={dir}/nul.yaml"], ["prompt 'nul'", "has no text"]),  # used to become the prompt "None"
    (["--prompts={dir}/broken.yaml"], ["broken.yaml", "invalid YAML"]),
    (["--prompt=token_id=Hello?"], ["'token_id'", "key column"]),  # used to give a duplicate CSV header
    (["--prompt=greatest=Another text?"], ["'greatest'", "given twice"]),
    (["--out={dir}"], ["is a directory"]),  # used to fail after scoring
    (["--out={dir}/nul.yaml/s.csv"], ["cannot write"]),
    (["stray"], ["unexpected argument 'stray'"]),
]


@pytest.mark.parametrize("flags,fragments", BAD_SWEEP_FLAGS, ids=[f[0][0] for f in BAD_SWEEP_FLAGS])
def test_bad_sweep_values_stop_before_loading(rm_folder, bad_yaml, flags, fragments):
    """5, 6, 7: every bad value is one line naming it, before any weight is read and nothing left behind."""
    out = bad_yaml / "s.csv"
    flags = [f.format(dir=bad_yaml) for f in flags]
    cli.user_error(cli.run("sweep", f"--model={rm_folder}", f"--out={out}", *flags), *fragments)
    assert not out.exists() and not out.with_name("s.csv.chunks").exists() and not out.with_name("s.csv.lock").exists()


BAD_OTHER_FLAGS = [
    ("gcg", ["--num_tokens=0"], ["--num_tokens=0"]),  # used to run
    ("gcg", ["--num_tokens=-3"], ["--num_tokens=-3"]),
    ("gcg", ["--search_width=0"], ["--search_width=0"]),  # used to run
    ("gcg", ["--topk=0"], ["--topk=0"]),
    ("gcg", ["--num_tokens=2", "--n_replace=3"], ["--n_replace"]),
    ("gcg", ["--out={dir}/file.txt/g.json"], ["cannot write"]),  # used to fail after the whole search
    ("score", ["--batch_size=0"], ["--batch_size=0"]),
    ("score", ["--texts_file={dir}/missing.txt"], ["missing.txt", "not found"]),
    ("train_rm", ["--steps=0", "--elo={dir}/e.csv"], ["--steps=0"]),
    ("train_rm", ["--learning_rate=0", "--elo={dir}/e.csv"], ["--learning_rate"]),
    ("train_rm", ["--clip_norm=inf", "--elo={dir}/e.csv"], ["--clip_norm=inf", "finite"]),
    ("train_rm", ["--pairs={dir}/p.csv", "--elo={dir}/e.csv"], ["exactly one of --pairs", "--elo"]),
    ("train_rm", ["--pairs={dir}/file.txt"], ["file.txt", "missing columns"]),
    ("logprobs", ["--top=-1"], ["--top=-1"]),
    ("analyze", ["--rbo_p=1.5", "--scores={dir}"], ["--rbo_p"]),
    ("analyze", ["--scores={dir}/none.csv"], ["none.csv", "not found"]),
]


@pytest.mark.parametrize("job,flags,fragments", BAD_OTHER_FLAGS, ids=[f"{j}{f[0]}" for j, f, _ in BAD_OTHER_FLAGS])
def test_bad_values_of_other_jobs_stop_before_loading(rm_folder, tmp_path, job, flags, fragments):
    (tmp_path / "file.txt").write_text("not a table\n")
    model = [] if job == "analyze" else [f"--model={rm_folder}"]
    cli.user_error(cli.run(job, *model, *[f.format(dir=tmp_path) for f in flags]), *fragments)


def test_gcg_never_samples_banned_tokens_with_a_large_topk(rm_folder, tmp_path):
    """5: --topk above the number of allowed tokens used to let GCG sample special and non-ASCII ids."""
    from transformers import AutoTokenizer

    out = tmp_path / "g.json"
    cli.ok(cli.run("gcg", f"--model={rm_folder}", f"--out={out}", "--num_tokens=3", "--steps=3", "--search_width=64",
                   "--topk=49152", "--buffer_size=64", "--noretokenize_filter"))
    result = json.loads(out.read_text())
    seen = {i for entry in result["buffer"] + result["history"] for i in entry["ids"]}
    assert len(seen) > 20
    tok = AutoTokenizer.from_pretrained(str(rm_folder))
    for i in seen:  # the defaults ban special tokens and anything that does not decode to printable ASCII
        text = tok.decode([i])
        assert i not in tok.all_special_ids and text.isascii() and text.isprintable() and text, (i, text)


def test_truncated_and_corrupt_files_are_named(rm_folder, tmp_path):
    """7: truncated weights, config or GGUF used to end in 'cannot reshape array…' with no file named."""
    from rmjax.loading.registry import resolve

    truncated = cli.copy_folder(rm_folder, tmp_path / "truncated")
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    flags = ["--token_ids=1,2", f"--out={tmp_path / 's.csv'}"]
    cli.user_error(cli.run("sweep", f"--model={truncated}", *flags), str(weights), "truncated")
    config = cli.copy_folder(rm_folder, tmp_path / "config")
    (config / "config.json").write_text('{"architectures": ["LlamaForSequenceClassification"], ')
    cli.user_error(cli.run("sweep", f"--model={config}", *flags), str(config / "config.json"), "invalid JSON")
    gguf = tmp_path / "cut.gguf"
    gguf.write_bytes(resolve("smollm2-135m-instruct")[1].read_bytes()[: 8 << 20])
    cli.user_error(cli.run("logprobs", f"--model={gguf}", f"--out={tmp_path / 'l.csv'}",
                           env={"RMJAX_CACHE_DIR": str(tmp_path / "cache")}), str(gguf), "truncated")
