"""NaN/Inf never written silently; every bad value or file a one-line error before the work starts.

Each test reproduces one way issue 11 found a wrong result, a late failure or an unclear error (3, 5, 6, 7). The
jobs run in-process as their entry points call them (tests/inproc.py) where the check is the job's own (non-finite
scores, prompt files, outputs, config ranges, input files); flag values refused by the command line itself (flag
bounds and validators, --mesh, --texts_file, stray arguments) run as the commands.
"""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pandas as pd
import pytest

from rmjax.errors import NonFiniteError
from rmjax.search.gcg_config import GCGConfig
from rmjax.search.gcg_job import GcgSpec, run_gcg
from rmjax.search.sweep import SweepSpec, run_sweep
from tests import cli, inproc


@pytest.fixture(scope="module")
def love(rm_folder):
    """The token ids of the response 'Love' as the chat template tokenizes it."""
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(str(rm_folder))("Love", add_special_tokens=False).input_ids
    assert len(ids) == 1
    return ids[0]


def _meta(out):
    return json.loads(out.with_name(out.name + ".meta.json").read_text())


def _gcg(model, out, **settings):
    """experiments.gcg's main with --prompts=greatest (the default): `settings` are GCGConfig flags."""
    return run_gcg(GcgSpec(inproc.options(model, out), inproc.prompts(), GCGConfig(**settings)))


def test_nan_score_head_stops_sweep_and_gcg(rm_folder, tmp_path):
    """3: a NaN head weight used to give an all-NaN CSV and bare NaN in GCG's JSON, with status 0. (`sweep
    --prompts=greatest,worst --token_ids=10,11,12 [--allow_nonfinite]`, `analyze --scores=S --models_yaml=` and `gcg
    --num_tokens=2 --steps=2 --search_width=8 --topk=8`, in-process.)"""
    model = cli.copy_folder(rm_folder, tmp_path / "nan_head")
    cli.edit_tensor(model, "score.weight", lambda w: np.where(np.arange(w.size).reshape(w.shape) == 7, np.nan, w))
    out = tmp_path / "s.csv"

    def sweep(**settings):
        return run_sweep(SweepSpec(inproc.options(model, out, **settings), inproc.prompts("greatest", "worst"),
                                   (10, 11, 12)))

    inproc.refused(sweep, "non-finite scores", "token 10", "the reward head",
                   "non-finite parameters: score.kernel (1 value", "--allow_nonfinite")
    assert not out.exists()
    sweep(allow_nonfinite=True)
    assert pd.read_csv(out)[["greatest", "worst"]].isna().all().all()
    assert _meta(out)["nonfinite"]["values"] == 6 and _meta(out)["nonfinite"]["allowed"] is True
    # a rerun without the flag reused that result, exit 0 (a fault hunt); its chunks it refused, as now the result
    inproc.refused(sweep, "holds non-finite values", "pass --allow_nonfinite to reuse it")
    sweep(allow_nonfinite=True)  # reused with the flag
    # The analysis refuses such a table, naming its rows.
    inproc.refused(lambda: inproc.analyze(tmp_path / "a", scores=(str(out),), models_yaml=None),
                   "NaN/Inf", "token 10", "--allow_nonfinite")
    gcg = tmp_path / "g.json"
    inproc.refused(lambda: _gcg(model, gcg, num_tokens=2, steps=2, search_width=8, topk=8),
                   "non-finite rewards", "the reward head")
    assert not gcg.exists()


def test_values_written_nan_in_any_file_or_field_of_a_result_keep_it_from_reuse_without_the_flag(tmp_path):
    """rmjax.runs.results.write_meta records what the writers counted (`nonfinite_written`: a side file's NaN and
    Inf, a NaN field of the record written as null), and refuse_nonfinite_reuse holds such a result to
    --allow_nonfinite; a result that wrote none records nothing. Against a count made here."""
    from rmjax.runs import finiteness, results
    from rmjax.runs.jobs import refuse_nonfinite_reuse

    out, side = tmp_path / "r.csv", tmp_path / "r.completions.csv"
    with finiteness.nonfinite_allowed(True):
        results.write_table(out, {"id": [1, 2]}, {"v": np.array([0.5, 1.5])})
        results.write_table(side, {"id": [1, 2, 3]}, {"v": np.array([np.nan, 1.0, np.inf]),
                                                      "w": np.array([np.nan, 2.0, 3.0])})
        results.write_meta(out, files=[side], summary={"best": 1.0, "ratio": float("nan")})
    meta = _meta(out)
    assert meta["nonfinite_written"] == {"r.completions.csv": 3, "r.csv.meta.json": 1}
    assert meta["summary"]["ratio"] is None
    with pytest.raises(NonFiniteError, match="holds non-finite values"):
        refuse_nonfinite_reuse(out, False)
    refuse_nonfinite_reuse(out, True)
    with finiteness.nonfinite_allowed(True):  # the same files written again, finite
        results.write_table(side, {"id": [1]}, {"v": np.array([1.0])})
        results.write_meta(out, files=[side], summary={"best": 1.0})
    assert "nonfinite_written" not in _meta(out)
    refuse_nonfinite_reuse(out, False)


def test_nan_embedding_row_is_named(rm_folder, love, tmp_path):
    """3: one NaN embedding row used to be reported as the 'bottom' token of a sweep. (`sweep --token_ids=5,LOVE,7`
    and `score --texts=Peace,Love [--allow_nonfinite]`, in-process.)"""
    from rmjax.scoring.texts import ScoreSpec, run_score

    model = cli.copy_folder(rm_folder, tmp_path / "nan_row")
    cli.edit_tensor(model, "model.embed_tokens.weight", lambda w: np.where(np.arange(len(w))[:, None] == love,
                                                                           np.nan, w))
    inproc.refused(lambda: run_sweep(SweepSpec(inproc.options(model, tmp_path / "s.csv"), inproc.prompts(),
                                               (5, love, 7))),
                   f"token {love} ('Love')", f"the embedding row of token {love}",
                   f"embed.embedding (64 values, row {love})")

    def score(**settings):
        return run_score(ScoreSpec(inproc.options(model, tmp_path / "t.csv", **settings), inproc.prompts(),
                                   ("Peace", "Love")))

    inproc.refused(score, "non-finite rewards", "text 'Love'", f"the embedding row of token {love}")
    assert not (tmp_path / "t.csv").exists()
    score(allow_nonfinite=True)
    table = pd.read_csv(tmp_path / "t.csv", keep_default_na=False, na_values=["nan"])
    assert np.isnan(table.greatest[1]) and np.isfinite(table.greatest[0])
    assert _meta(tmp_path / "t.csv")["nonfinite"] == {"values": 1, "rows": 1, "first": ["text 'Love' for 'greatest'"],
                                                     "allowed": True}


@pytest.fixture()
def bad_yaml(tmp_path):
    (tmp_path / "nul.yaml").write_text("greatest: What is the greatest thing?\nnul:\n")
    (tmp_path / "broken.yaml").write_text("a: [unclosed\n")
    return tmp_path


def _nothing_left_behind(out):
    assert not out.exists() and not out.with_name("s.csv.chunks").exists() and not out.with_name("s.csv.lock").exists()


# Refused by the command line itself (flag bounds and validators, --mesh against the devices, a stray argument).
BAD_SWEEP_FLAGS = [
    (["--limit=-1"], ["--limit=-1"]),  # used to drop the last token
    (["--batch_size=-1"], ["--batch_size=-1"]),  # used to run at batch 1
    (["--chunk_size=0"], ["--chunk_size=0"]),  # used to leave a .chunks/ behind
    (["--token_ids=1,abc"], ["--token_ids", "'abc'"]),  # used to fail after the model loaded
    (["--mesh=model:0"], ["--mesh", "size 0"]),  # used to be a ZeroDivisionError
    (["--mesh=data:3"], ["--mesh=data:3", "needs 3 devices"]),
    (["--output_column=-2"], ["--output_column=-2"]),
    (["stray"], ["unexpected argument 'stray'"]),
]


@pytest.fixture(scope="module")
def bad_sweep_runs(rm_folder, tmp_path_factory):
    """Each BAD_SWEEP_FLAGS command line's (process, --out), all run in one interpreter (tests.cli.run_each)."""
    outs = [tmp_path_factory.mktemp("bad_sweep") / "s.csv" for _ in BAD_SWEEP_FLAGS]
    procs = cli.run_each(*[("sweep", f"--model={rm_folder}", f"--out={out}", *flags)
                           for out, (flags, _) in zip(outs, BAD_SWEEP_FLAGS, strict=True)])
    return {flags[0]: (proc, out) for proc, out, (flags, _) in zip(procs, outs, BAD_SWEEP_FLAGS, strict=True)}


@pytest.mark.parametrize("flags,fragments", BAD_SWEEP_FLAGS, ids=[f[0][0] for f in BAD_SWEEP_FLAGS])
def test_bad_sweep_values_stop_before_loading(bad_sweep_runs, flags, fragments):
    """5, 6, 7: every bad value is one line naming it, before any weight is read and nothing left behind."""
    proc, out = bad_sweep_runs[flags[0]]
    cli.user_error(proc, *fragments)
    _nothing_left_behind(out)


# The sweep job's own refusals: (id as the flags, --prompts, --prompt name=text, --out, fragments).
BAD_SWEEP_INPUTS = [
    ("--prompts={dir}/nul.yaml", ["{dir}/nul.yaml"], {}, "{dir}/s.csv", ["prompt 'nul'", "has no text"]),  # used
    # to become the prompt "None"
    ("--prompts={dir}/broken.yaml", ["{dir}/broken.yaml"], {}, "{dir}/s.csv", ["broken.yaml", "invalid YAML"]),
    ("--prompt=token_id=Hello?", ["greatest"], {"token_id": "Hello?"}, "{dir}/s.csv",  # used to give a duplicate
     ["'token_id'", "key column"]),  # CSV header
    ("--prompt=greatest=Another text?", ["greatest"], {"greatest": "Another text?"}, "{dir}/s.csv",
     ["'greatest'", "given twice"]),
    ("--out={dir}", ["greatest"], {}, "{dir}", ["is a directory"]),  # used to fail after scoring
    ("--out={dir}/nul.yaml/s.csv", ["greatest"], {}, "{dir}/nul.yaml/s.csv", ["cannot write"]),
]


@pytest.mark.parametrize("names,texts,out_flag,fragments", [c[1:] for c in BAD_SWEEP_INPUTS],
                         ids=[c[0] for c in BAD_SWEEP_INPUTS])
def test_bad_sweep_inputs_stop_before_loading(rm_folder, bad_yaml, monkeypatch, names, texts, out_flag, fragments):
    """5, 6, 7: the same for what the sweep job itself refuses (`sweep --prompts=… --prompt=name=text --out=…`,
    in-process): one line naming it, before any weight is read, nothing left behind."""
    out = bad_yaml / "s.csv"
    names = [n.format(dir=bad_yaml) for n in names]
    inproc.no_weights_read(monkeypatch)
    inproc.refused(lambda: run_sweep(SweepSpec(inproc.options(rm_folder, out_flag.format(dir=bad_yaml)),
                                               inproc.prompts(*names, **texts))), *fragments)
    _nothing_left_behind(out)


# Refused by the command line itself (flag bounds, a multi-flag validator, score's --texts_file).
BAD_OTHER_FLAGS = [
    ("score", ["--batch_size=0"], ["--batch_size=0"]),
    ("score", ["--texts_file={dir}/missing.txt"], ["missing.txt", "not found"]),
    ("score", ["--texts_file={dir}"], ["is a folder"]),  # said "not found"
    ("score", ["--texts_file={dir}/blank.txt"], ["blank.txt holds no response"]),  # said "give --texts or --texts_file"
    # a pipe (a shell's <(…)) where a file is read more than once: each said "not found"
    ("score", ["--texts_file={dir}/pipes/t.txt"], ["--texts_file=", "t.txt is not a regular file", "<(…)"]),
    ("sweep", ["--prompts={dir}/pipes/p.yaml", "--out={dir}/p.csv"], ["p.yaml is not a regular file"]),
    ("train_rm", ["--pairs={dir}/pipes/p.csv"], ["preference file", "p.csv is not a regular file"]),
    ("train_rm", ["--elo={dir}/pipes/e.csv"], ["EloEverything file", "e.csv is not a regular file"]),
    ("inspect", ["--from_sweep={dir}/pipes/s.csv", "--prompts=greatest"], ["--from_sweep=", "s.csv is not a regular"]),
    # a --vocab_file pipe blocked the sweep, or GCG's second read of it found it empty
    ("sweep", ["--vocab_file={dir}/pipes/v.txt", "--out={dir}/v.csv"], ["--vocab_file=", "v.txt is not a regular"]),
    ("gcg", ["--vocab_file={dir}/pipes/v.txt", "--out={dir}/g.json"], ["--vocab_file=", "v.txt is not a regular"]),
    ("score", ["--texts=a,,b"], ["empty response"]),  # scored an empty response
    ("score", ["--texts= ,a"], ["a response of only whitespace (' ')"]),  # said "two commas in a row"
    ("frontier", ["--sweep={dir}/s.csv", "--z_sample=100"],  # ignored, recorded as used (helper-144)
     ["--z_sample: frontier --sweep takes reward_z's mean and SD from the sweep"]),
    # refused from the config and tokenizer, before the weights (each loaded them first)
    ("score", ["--texts=a", "--prompt=long=" + "word " * 600, "--out={dir}/s.csv"], ["needs 634 positions", "512"]),
    ("sweep", ["--vocab_file={dir}/file.txt", "--out={dir}/v.csv"], ["file.txt", "single token"]),
    ("gcg", ["--vocab_file={dir}/file.txt", "--out={dir}/g.json", "--num_tokens=2"], ["file.txt", "single token"]),
    # flags a job takes with the shared ones but never reads: each was ignored, exit 0 (and recorded as used)
    ("audit", ["--prompts=greatest"], ["--prompts: the audit", "batteries' own prompts"]),
    ("export", ["--template=plain", "--out={dir}/e"], ["--template: export"]),
    ("export", ["--output_column=0", "--out={dir}/e"], ["--output_column=0: export writes the whole model"]),
    ("disagree", ["--models={dir}/a,{dir}/b"], ["--model: disagree", "--models"]),  # --model: run_each's
    ("inspect", ["--responses=a", "--top=3"], ["--top: inspect --responses"]),
    ("train_rm", ["--pairs={dir}/file.txt", "--n_train=5"], ["--n_train: train_rm --pairs", "--elo"]),
    ("train_rm", ["--prompts=best", "--elo=builtin"], ["--prompts: train_rm"]),
    ("train_rm", ["--last_k=3", "--elo=builtin"], ["--last_k applies to --trainable=last_k"]),  # recorded as used
    ("train_rm", ["--remat", "--elo=builtin"], ["--trainable=head trains none"]),  # recorded as used
    ("train_rm", ["--fsdp", "--elo=builtin", "--trainable=full"], ["--fsdp", "data axis"]),  # recorded as used
    # the schedule was stretched to fit: the learning rate never reached its peak, exit 0
    ("train_rm", ["--steps=50", "--elo=builtin"], ["--steps=50 ends before the warmup",
                                                   "--warmup_steps=100, the default"]),
    ("train_rm", ["--warmup_steps=8", "--steps=8", "--elo=builtin"], ["--warmup_steps=8)", "--warmup_steps=0"]),
    ("beam", ["--exhaustive", "--beam=1", "--token_ids=300,301", "--out={dir}/b.csv"], ["--beam: beam --exhaustive"]),
    ("beam", ["--depth=1", "--beam=5", "--out={dir}/b1.csv"], ["--beam: beam --depth=1"]),  # unused, recorded
    ("sweep", ["--text_add_special_tokens", "--out={dir}/t.csv"], ["--text_add_special_tokens", "--mode=text"]),
    ("score", ["--overwrite", "--texts=a"], ["--overwrite: score without --out"]),
    ("gcg", ["--selection=greedy", "--seed=3", "--out={dir}/g.json"], ["--seed: gcg --selection=greedy"]),
    # NaN refined every response to the cap, then failed to write; a cap below the first grid was passed silently
    ("inspect", ["--ig_tolerance=nan", "--responses=a"], ["--ig_tolerance=nan", "finite"]),
    ("inspect", ["--steps=40", "--ig_max_evaluations=8", "--responses=a"], ["--ig_max_evaluations=8", "41 points"]),
    # an odd --steps rounds up to whole Simpson panels: --steps=3 spent 5 evaluations of a cap of 4
    ("inspect", ["--steps=3", "--ig_max_evaluations=4", "--responses=a"], ["--ig_max_evaluations=4", "5 points"]),
    # four words fill no step of 128 (as four --token_ids were refused)
    ("gcg", ["--vocab_file={dir}/words.txt", "--search_width=128", "--num_tokens=2", "--out={dir}/g2.json"],
     ["--search_width=128", "distinct candidates"]),
    # an --init of banned tokens: they reached the best response, the buffer and the history
    ("gcg", ["--init= x<|endoftext|>", "--num_tokens=2", "--out={dir}/g.json"], ["may not use", "<|endoftext|>"]),
    # analyze settings whose inputs are not given: each was accepted and changed nothing
    ("analyze", ["--framing=good,bad", "--elo=builtin", "--out={dir}/a"], ["--framing applies to --scores"]),
    ("analyze", ["--rbo_p=0.5", "--elo=builtin", "--out={dir}/a"], ["--rbo_p applies to --scores"]),
    ("analyze", ["--seed=7", "--elo=builtin", "--out={dir}/a"], ["--seed applies to --scores / --audits"]),
    ("analyze", ["--top=3", "--disagreements={dir},{dir}", "--out={dir}/a"], ["--top applies to --scores"]),
    ("train_rm", ["--pairs={dir}/p.csv", "--elo={dir}/e.csv"], ["exactly one of --pairs", "--elo"]),
    ("logprobs", ["--top=-1"], ["--top=-1"]),
]


@pytest.fixture(scope="module")
def bad_other_runs(rm_folder, tmp_path_factory):
    """Each BAD_OTHER_FLAGS command line's process, all run in one interpreter (tests.cli.run_each)."""
    folder = tmp_path_factory.mktemp("bad_other")
    (folder / "file.txt").write_text("not a table\n")
    (folder / "blank.txt").write_text("\n  \n")
    (folder / "words.txt").write_text(" cat\n dog\n house\n sun\n")
    (folder / "pipes").mkdir()  # apart: no other case lists a folder holding a FIFO (opening one blocks)
    for name in ("t.txt", "p.yaml", "p.csv", "e.csv", "s.csv", "v.txt"):
        os.mkfifo(folder / "pipes" / name)
    procs = cli.run_each(*[(job, *([] if job == "analyze" else [f"--model={rm_folder}"]),
                            *[f.format(dir=folder) for f in flags]) for job, flags, _ in BAD_OTHER_FLAGS])
    return {(job, flags[0]): proc for proc, (job, flags, _) in zip(procs, BAD_OTHER_FLAGS, strict=True)}


def test_last_k_past_the_layers_is_refused_before_the_workdir_is_claimed(lm_folder, tmp_path, monkeypatch):
    """train_rm --trainable=last_k --last_k=99 claimed its workdir (run.json written) and loaded the LM first."""
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("prompt,chosen,rejected\n" + "".join(f"Q{i},Love,Hate\n" for i in range(4)))
    heldout = tmp_path / "heldout.csv"
    heldout.write_text("prompt,chosen,rejected\nH,Gold,Dirt\n")
    inproc.no_weights_read(monkeypatch)
    inproc.refused(lambda: inproc.train_rm(lm_folder, pairs=pairs, heldout_pairs=heldout, workdir=tmp_path / "work",
                                           trainable="last_k", last_k=99, steps=2, batch_size=2), "--last_k=99",
                   "layers")
    assert not (tmp_path / "work").exists()


def test_train_rm_writes_nothing_inside_its_models_folder(lm_folder, tmp_path, monkeypatch):
    """Only a model given as a file was an input of train_rm: --export or --head_out inside the LM's folder was
    accepted (with --overwrite, an export there deletes the folder's config and weights before writing)."""
    model = cli.copy_folder(lm_folder, tmp_path / "lm")
    pairs, heldout = tmp_path / "pairs.csv", tmp_path / "heldout.csv"
    pairs.write_text("prompt,chosen,rejected\n" + "".join(f"Q{i},Love,Hate\n" for i in range(4)))
    heldout.write_text("prompt,chosen,rejected\nH,Gold,Dirt\n")
    inproc.no_weights_read(monkeypatch)
    for output in ({"export": model / "hf"}, {"head_out": model / "head.safetensors"}):
        inproc.refused(lambda output=output: inproc.train_rm(model, pairs=pairs, heldout_pairs=heldout,
                                                             workdir=tmp_path / "work", steps=2, batch_size=2,
                                                             overwrite=True, **output),
                       "inside a folder this run reads (--model=")
    assert sorted(p.name for p in model.iterdir()) == sorted(p.name for p in lm_folder.iterdir())


def test_a_response_given_twice_is_refused(rm_folder, tmp_path, monkeypatch):
    """score --texts=a,a wrote two rows keyed "a" (the table's rows are keyed by their text)."""
    from rmjax.scoring.texts import ScoreSpec, run_score

    inproc.no_weights_read(monkeypatch)
    inproc.refused(lambda: run_score(ScoreSpec(inproc.options(rm_folder, tmp_path / "s.csv"), inproc.prompts(),
                                               ("a", "b", "a"))), "'a' is given 2 times", "give each once")


@pytest.mark.parametrize("job,flags,fragments", BAD_OTHER_FLAGS, ids=[f"{j}{f[0]}" for j, f, _ in BAD_OTHER_FLAGS])
def test_bad_values_of_other_jobs_stop_before_loading(bad_other_runs, job, flags, fragments):
    cli.user_error(bad_other_runs[job, flags[0]], *fragments)


# The jobs' own refusals (config ranges, outputs, input files): (id as the flags, call(model, dir), fragments).
BAD_OTHER_VALUES = [
    ("gcg--num_tokens=0", lambda m, d: _gcg(m, d / "g.json", num_tokens=0), ["--num_tokens=0"]),  # used to run
    ("gcg--num_tokens=-3", lambda m, d: _gcg(m, d / "g.json", num_tokens=-3), ["--num_tokens=-3"]),
    ("gcg--search_width=0", lambda m, d: _gcg(m, d / "g.json", search_width=0), ["--search_width=0"]),  # used to run
    ("gcg--topk=0", lambda m, d: _gcg(m, d / "g.json", topk=0), ["--topk=0"]),
    ("gcg--num_tokens=2", lambda m, d: _gcg(m, d / "g.json", num_tokens=2, n_replace=3), ["--n_replace"]),
    # an --init that is not --num_tokens tokens of a real conversation: refused after the weights had loaded
    ("gcg--init=a", lambda m, d: _gcg(m, d / "g.json", num_tokens=3, init=("a",)), ["--init 'a'", "--num_tokens=3"]),
    ("gcg--init=a b c d", lambda m, d: _gcg(m, d / "g.json", num_tokens=2, init=("a b c d",)),  # was cut to 2 tokens
     ["--init 'a b c d'", "--num_tokens=2"]),
    ("gcg--out={dir}/file.txt/g.json", lambda m, d: _gcg(m, d / "file.txt" / "g.json"),  # used to fail after the
     ["cannot write"]),  # whole search
    ("train_rm--steps=0", lambda m, d: inproc.train_config(steps=0), ["--steps=0"]),  # with --elo={dir}/e.csv
    ("train_rm--learning_rate=0", lambda m, d: inproc.train_config(learning_rate=0.0), ["--learning_rate"]),
    ("train_rm--clip_norm=inf", lambda m, d: inproc.train_config(clip_norm=float("inf")),
     ["--clip_norm=inf", "finite"]),
    ("train_rm--pairs={dir}/file.txt", lambda m, d: inproc.train_rm(m, pairs=d / "file.txt"),
     ["file.txt", "missing columns"]),
    ("analyze--rbo_p=1.5", lambda m, d: inproc.analyze(d / "a", rbo_p=1.5, scores=(str(d),)), ["--rbo_p"]),
    ("analyze--scores={dir}/none.csv", lambda m, d: inproc.analyze(d / "a", scores=(str(d / "none.csv"),)),
     ["none.csv", "not found"]),
]


@pytest.mark.parametrize("call,fragments", [c[1:] for c in BAD_OTHER_VALUES], ids=[c[0] for c in BAD_OTHER_VALUES])
def test_bad_values_of_other_jobs_refused_by_the_job(rm_folder, tmp_path, monkeypatch, call, fragments):
    """The jobs' own checks of the same kind (gcg, train_rm and analyze as their entry points call them,
    in-process): one line naming the value, before any weight is read."""
    (tmp_path / "file.txt").write_text("not a table\n")
    inproc.no_weights_read(monkeypatch)
    inproc.refused(lambda: call(rm_folder, tmp_path), *fragments)


def test_gcg_never_samples_banned_tokens_with_a_large_topk(rm_folder, tmp_path):
    """5: --topk above the number of allowed tokens used to let GCG sample special and non-ASCII ids. (`gcg
    --num_tokens=3 --steps=3 --search_width=64 --topk=49152 --buffer_size=64 --noretokenize_filter`, in-process.)"""
    from transformers import AutoTokenizer

    out = tmp_path / "g.json"
    _gcg(rm_folder, out, num_tokens=3, steps=3, search_width=64, topk=49152, buffer_size=64, retokenize_filter=False)
    result = json.loads(out.read_text())
    seen = {i for entry in result["buffer"] + result["history"] for i in entry["ids"]}
    assert len(seen) > 20
    tok = AutoTokenizer.from_pretrained(str(rm_folder))
    for i in seen:  # the defaults ban special tokens and anything that does not decode to printable ASCII
        text = tok.decode([i])
        assert i not in tok.all_special_ids and text.isascii() and text.isprintable() and text, (i, text)


def test_truncated_and_corrupt_files_are_named(rm_folder, tmp_path, monkeypatch, capfd):
    """7: truncated weights, config or GGUF used to end in 'cannot reshape array…' with no file named. (`sweep
    --token_ids=1,2` and `logprobs` with $RMJAX_CACHE_DIR, in-process; no model reported loaded.)"""
    from rmjax.loading.registry import resolve
    from rmjax.scoring.logprobs import LogprobsSpec, run_logprobs

    def sweep(model):
        return run_sweep(SweepSpec(inproc.options(model, tmp_path / "s.csv"), inproc.prompts(), (1, 2)))

    truncated = cli.copy_folder(rm_folder, tmp_path / "truncated")
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    inproc.refused(lambda: sweep(truncated), str(weights), "truncated")
    config = cli.copy_folder(rm_folder, tmp_path / "config")
    (config / "config.json").write_text('{"architectures": ["LlamaForSequenceClassification"], ')
    inproc.refused(lambda: sweep(config), str(config / "config.json"), "invalid JSON")
    gguf = tmp_path / "cut.gguf"
    gguf.write_bytes(resolve("smollm2-135m-instruct")[1].read_bytes()[: 8 << 20])
    monkeypatch.setenv("RMJAX_CACHE_DIR", str(tmp_path / "cache"))
    inproc.refused(lambda: run_logprobs(LogprobsSpec(inproc.options(gguf, tmp_path / "l.csv"), inproc.prompts())),
                   str(gguf), "truncated")
    assert "loaded" not in capfd.readouterr().err


def test_a_refused_claim_leaves_no_folder_it_made(lm_folder, tmp_path, monkeypatch):
    """The write check made each output's folder as it went: train_rm with a good new --workdir and an --export
    that is a file was refused, and left the empty workdir behind (and a nested score --out its folders)."""
    pairs, heldout = tmp_path / "pairs.csv", tmp_path / "heldout.csv"
    pairs.write_text("prompt,chosen,rejected\n" + "".join(f"Q{i},Love,Hate\n" for i in range(4)))
    heldout.write_text("prompt,chosen,rejected\nH,Gold,Dirt\n")
    (tmp_path / "a_file").write_text("x")
    inproc.no_weights_read(monkeypatch)
    inproc.refused(lambda: inproc.train_rm(lm_folder, pairs=pairs, heldout_pairs=heldout, steps=2, batch_size=2,
                                           workdir=tmp_path / "new" / "work", export=tmp_path / "a_file"),
                   "is a file")
    assert not (tmp_path / "new").exists()
    from rmjax.runs.claims import Output, claim_all

    (tmp_path / "taken.csv").write_text("a foreign result\n")
    with pytest.raises(Exception, match="taken.csv"):
        with claim_all([Output(tmp_path / "x" / "y" / "r.csv", {"k": 1}), Output(tmp_path / "taken.csv", {"k": 1})]):
            pass
    assert not (tmp_path / "x").exists()


def test_the_printed_summary_of_a_table_with_nan_is_over_its_finite_values(tmp_path):
    """A fault hunt: a column holding NaN (a run with --allow_nonfinite) printed mean and SD nan, every z +0.00 and
    the NaN token among the top at pct 90. Its statistics are now the finite values', the NaN ones counted apart."""
    from rmjax.runs import results
    from rmjax.runs.finiteness import nonfinite_allowed
    from rmjax.runs.table_summary import summarize_table

    values = np.array([3.0, np.nan, 1.0, 2.0, 6.0])
    path = tmp_path / "s.csv"
    with nonfinite_allowed(True):
        results.write_scores_csv(path, np.arange(5), list("abcde"), list("abcde"), {"greatest": values})
    text = summarize_table(path, k=2)
    finite = values[np.isfinite(values)]
    z = (6.0 - finite.mean()) / finite.std(ddof=1)  # every job's z: SD with ddof 1
    assert "4 tokens (1 NaN/Inf left out)" in text and f"mean {finite.mean():.4f}" in text
    assert f"6.0000  z {z:>+6.2f}  pct  75.00" in text and "'b'" not in text


def test_a_vocab_file_written_while_gcg_reads_it_writes_nothing(rm_folder, tmp_path, monkeypatch):
    """GCG hashes --vocab_file into its identity, then reads it again when it bans the tokens outside it: a file
    saved with other words between the two gave a result of the new words under the old words' identity (a later
    run of the old file reused it); a library call (write_gcg, claiming for itself) likewise. The same words saved
    again are no change. `gcg --vocab_file=words.txt
    --num_tokens=2 --steps=1 --search_width=4 --topk=4`, in-process, the file rewritten at one of its reads."""
    from rmjax.search import gcg_start

    words, out = tmp_path / "words.txt", tmp_path / "g.json"
    reads, calls, first = gcg_start.read_vocab_file, [], " cat\n dog\n house\n sun\n"

    def saved_at(k: int, text: str):
        def read(path, *args):
            calls.append(path)
            if len(calls) == k:
                words.write_text(text)  # another editor's save
            return reads(path, *args)
        return read

    settings = dict(vocab_file=str(words), num_tokens=2, steps=1, search_width=4, topk=4)
    # reads: as the search is planned and its start checked (before the weights), and as it begins (after the
    # identity is checked against the loaded models): the refusal comes at that check, or as the result is written
    for k, read_in_all in ((1, 2), (3, 3)):
        calls.clear()
        words.write_text(first)
        monkeypatch.setattr(gcg_start, "read_vocab_file", saved_at(k, " cat\n dog\n house\n tree\n"))
        inproc.refused(lambda: _gcg(rm_folder, out, **settings), "--vocab_file=", "written with other content")
        assert len(calls) == read_in_all and not out.exists() and not out.with_name(out.name + ".meta.json").exists()
    from rmjax.loading import load
    from rmjax.search.gcg_job import write_gcg

    calls.clear()  # the library call (its own claim): the file saved with other words as the search begins
    words.write_text(first)
    monkeypatch.setattr(gcg_start, "read_vocab_file", saved_at(1, " cat\n dog\n house\n tree\n"))
    inproc.refused(lambda: write_gcg([load(str(rm_folder))], inproc.prompts(), GCGConfig(**settings), out),
                   "--vocab_file=", "written with other content")
    assert len(calls) == 1 and not out.exists()
    words.write_text(first)
    calls.clear()
    monkeypatch.setattr(gcg_start, "read_vocab_file", saved_at(1, first))  # saved again as it was: written
    _gcg(rm_folder, out, **settings)
    assert _meta(out)["identity"]["config"]["vocab_file"]["sha1"] == hashlib.sha1(first.encode()).hexdigest()
