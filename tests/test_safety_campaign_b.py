"""Issue 42's second hidden campaign, its careless-user half: what a hurried user got wrong with exit 0.

Each test failed on the code before its fix: a sweep or beam resumed with its prompts in another order wrote the
saved chunks' columns under the other prompts' names (and a finished sweep was reused for them, its columns in the
first order); score's --texts_file cut a response at a form feed or U+2028
(str.splitlines) and kept a byte-order mark in the first; train_rm's --head_out=x.json wrote its recipe over the
head, and --head_out=WORKDIR/run its recipe over the workdir's run.json.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from rmjax.errors import OutputExistsError, ResumeMismatchError
from rmjax.runs import results
from rmjax.runs.chunks import store_dir
from rmjax.runs.options import RunOptions
from rmjax.search.sweep import SweepSpec, run_sweep
from tests import cli, inproc

PROMPTS = {"greatest": "What, in one word, is the greatest thing ever?",
           "worst": "What, in one word, is the worst thing ever?"}
SWAPPED = dict(reversed(PROMPTS.items()))


def test_a_resume_with_the_prompts_in_another_order_is_refused(rm_folder, tmp_path, monkeypatch):
    """The identity compares prompts as a mapping (any order) while a chunk holds their columns in the order given:
    a sweep killed after its first chunk and resumed with --prompts=worst,greatest wrote the first chunk's
    'greatest' scores under 'worst' and the other way round, exit 0. The beam's chunks likewise."""
    from rmjax.search.beam import BeamConfig
    from rmjax.search.beam_job import BeamSpec, run_beam

    out = tmp_path / "s.csv"

    def sweep(prompts):
        return run_sweep(SweepSpec(RunOptions(model=str(rm_folder), out=str(out)), prompts, limit=24, chunk_size=8,
                                   batch_size=8))

    with monkeypatch.context() as patch:
        inproc.interrupt_at_write(patch, 2)
        with pytest.raises(KeyboardInterrupt):
            sweep(PROMPTS)
    assert len(list(store_dir(out).glob("chunk-*.npy"))) == 1
    with pytest.raises(ResumeMismatchError, match="holds prompts in the order greatest, worst, not worst, greatest"):
        sweep(SWAPPED)
    sweep(PROMPTS)  # the saved order continues
    assert list(pd.read_csv(out).columns[-2:]) == ["greatest", "worst"]
    # the finished result too: it was reused for the swapped order, exit 0, its columns in the first order
    with pytest.raises(OutputExistsError, match="prompts in the order greatest, worst, not worst, greatest"):
        sweep(SWAPPED)

    beam_out = tmp_path / "b.csv"

    def beam(prompts):
        return run_beam(BeamSpec(RunOptions(model=str(rm_folder), out=str(beam_out)), prompts,
                                 BeamConfig(depth=2, beam=2, top=2, allow_special=True), limit=24, batch_size=8,
                                 chunk_size=8))

    with monkeypatch.context() as patch:
        inproc.interrupt_at_write(patch, 3)
        with pytest.raises(KeyboardInterrupt):
            beam(PROMPTS)
    with pytest.raises(ResumeMismatchError, match="in the order greatest, worst"):
        beam(SWAPPED)


def test_texts_file_lines_end_at_newlines_only(rm_folder, tmp_path):
    """str.splitlines also ends a line at a form feed, U+2028 and the like: a two-line file was scored as four
    responses, exit 0; and a Windows editor's byte-order mark stayed in the first response."""
    texts = tmp_path / "texts.txt"
    texts.write_bytes("\ufeffLove\r\na\u2028b\n\nc\x0cd\nx\ry\n".encode())  # a lone CR too (a fault hunt)
    out = tmp_path / "t.csv"
    proc = cli.ok(cli.run("score", f"--model={rm_folder}", f"--texts_file={texts}", f"--out={out}"))
    table = pd.read_csv(out, keep_default_na=False)
    assert table["text"].tolist() == ["Love", "a\u2028b", "c\x0cd", "x\ry"]
    assert "1 blank or whitespace-only line skipped" in proc.stderr


def test_train_rm_outputs_that_name_one_file_are_refused(lm_folder, tmp_path, monkeypatch):
    """--head_out=x.json: the recipe (x.json) replaced the head, leaving no weights, exit 0 (its recipe is now
    x.json.json); --head_out=WORKDIR/run
    wrote its recipe over the workdir's run.json, and --export=E --head_out=E/rmjax_training over the export's
    record. Now refused before the model loads (run_training's claims, in-process as train_rm calls it)."""
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("prompt,chosen,rejected\n" + "".join(f"Q{i},Love,Hate\n" for i in range(4)))
    heldout = tmp_path / "heldout.csv"
    heldout.write_text("prompt,chosen,rejected\nH,Gold,Dirt\n")
    work, export = tmp_path / "work", tmp_path / "export"

    def train_rm(**outputs):
        return inproc.train_rm(lm_folder, pairs=pairs, heldout_pairs=heldout, workdir=work, steps=2, batch_size=2,
                               warmup_steps=1, checkpoint_every=1, **outputs)

    with monkeypatch.context() as patch:
        inproc.no_weights_read(patch)
        inproc.refused(lambda: train_rm(head_out=work / "run"), "run.json", f"--workdir={work}")
        inproc.refused(lambda: train_rm(export=export, head_out=export / "rmjax_training"), "rmjax_training.json",
                       f"--export={export}")
        inproc.refused(lambda: train_rm(head_out=work / "checkpoints" / "h"), "checkpoints/")
        # the head alone of a run that trained backbone layers scores other numbers on the base model
        inproc.refused(lambda: train_rm(head_out=tmp_path / "h.safetensors", trainable="last_k", last_k=1),
                       "--head_out writes the score head alone, and --trainable=last_k")
    assert not work.exists() and not export.exists()
    head = tmp_path / "head.safetensors"
    train_rm(head_out=head)
    assert json.loads(head.with_suffix(".json").read_text())["files"]["head.safetensors"]["bytes"] == \
        head.stat().st_size
    assert json.loads((work / "run.json").read_text())["identity"]["job"] == "train_rm"
    # the recipe beside a head named head.v1 was head.json, shared with head.v2 (and replaced by its --overwrite);
    # a head named head.json no longer has its recipe written over it (head.json.json)
    from rmjax.train.recipe import head_recipe_path

    names = ("head.v1", "head.v2", "head.json", "h", "h.safetensors")
    assert [head_recipe_path(tmp_path / name).name for name in names] == \
        ["head.v1.json", "head.v2.json", "head.json.json", "h.json", "h.json"]


def test_a_train_rm_run_stopped_after_the_load_keeps_the_export_it_would_replace_and_claims_nothing(lm_folder,
                                                                                                    tmp_path):
    """helper-149: a run with --overwrite whose model's features are not finite stopped after the load having
    deleted the finished run's --export (6 files, none left), though safety.md says a replaced result stays whole
    until the new one is written; and a run stopped before its first checkpoint left run.json, so the corrected
    rerun into that --workdir was refused as another run's. Now the export goes only as the new one is written,
    and a run that saved nothing leaves no claim."""
    from rmjax.errors import NonFiniteError

    pairs = tmp_path / "pairs.csv"
    pairs.write_text("prompt,chosen,rejected\n" + "".join(f"Q{i},Love,Hate\n" for i in range(4)))
    heldout = tmp_path / "heldout.csv"
    heldout.write_text("prompt,chosen,rejected\nH,Gold,Dirt\n")
    broken = cli.copy_folder(lm_folder, tmp_path / "broken")
    cli.edit_embedding_row(broken, 1, np.nan)  # every conversation starts with it: every feature NaN
    export = tmp_path / "export"

    def train_rm(model, work, **settings):
        return inproc.train_rm(model, pairs=pairs, heldout_pairs=heldout, workdir=work, steps=2, batch_size=2,
                               warmup_steps=1, checkpoint_every=2, export=export, **settings)

    train_rm(lm_folder, tmp_path / "w1")
    before = {p.name: p.read_bytes() for p in export.iterdir()}
    assert len(before) >= 5
    with pytest.raises(NonFiniteError, match="non-finite features"):
        train_rm(broken, tmp_path / "w2", overwrite=True)
    assert {p.name: p.read_bytes() for p in export.iterdir()} == before
    assert not (tmp_path / "w2").exists()  # nothing saved: no claim left on the workdir
    train_rm(lm_folder, tmp_path / "w2", overwrite=True, seed=1)  # the corrected run there, replacing the export
    after = {p.name: p.read_bytes() for p in export.iterdir()}
    assert after.keys() == before.keys() and after["model.safetensors"] != before["model.safetensors"]


def test_analyze_with_a_constant_model_skips_its_mds_in_one_line(tmp_path):
    """Two models, one scoring every string alike for 'greatest': Kendall tau with it is undefined (NaN), and the
    MDS of 1 - tau ended the analysis with scikit-learn's traceback (status 1). Now that prompt's MDS/RSA is
    skipped, named in report.md; the other prompt's MDS is drawn."""
    scores = tmp_path / "scores"
    scores.mkdir()
    header = '"token_id","token_name","token_decoded","roundtrip","greatest","worst"\n'
    words = ["a", "b", "c", "love"]
    (scores / "flat.csv").write_text(header + "".join(f'{i},"{w}","{w}",1,0.5,{0.1 * (i + 1)}\n'
                                                      for i, w in enumerate(words)))
    (scores / "ranked.csv").write_text(header + "".join(f'{i},"{w}","{w}",1,{0.1 * (i + 1)},{0.4 - 0.1 * i}\n'
                                                        for i, w in enumerate(words)))
    out = tmp_path / "analysis"
    inproc.analyze(out, scores=(str(scores),))  # as `analyze --scores=DIR`: it raised scikit-learn's error
    report = (out / "report.md").read_text()
    assert "MDS/RSA for 'greatest': Kendall tau is undefined for flat" in report
    assert not (out / "paper1_mds_greatest.csv").exists() and (out / "paper1_mds_worst.csv").exists()
    tau = pd.read_csv(out / "paper1_kendall_tau_worst.csv", index_col=0)
    assert tau.loc["flat", "ranked"] == pytest.approx(-1.0)  # worst: one ranking the other's reverse


def test_heldout_accuracy_leaves_ties_out(lm_folder, tmp_path, monkeypatch):
    """A held-out pair labelled 0.5 prefers neither response, but accuracy counted it right only when the chosen
    side scored higher: a held-out set of ties gave accuracy 0.0 or 1.0 with exit 0, and ties beside decisive pairs
    moved the number. Ties only are refused before the model loads; otherwise accuracy is over the decisive pairs."""
    import numpy as np

    from rmjax.train.data import Pairs
    from rmjax.train.loop import _evaluation

    label = np.asarray([1.0, 0.0, 0.5, 0.5, 0.8], np.float32)
    rc = np.asarray([2.0, 1.0, 0.0, 3.0, 0.0], np.float32)  # right, wrong, (tie), (tie), wrong
    rr = np.asarray([1.0, 0.0, 1.0, 1.0, 1.0], np.float32)
    heldout = Pairs(["q"] * 5, list("abcde"), list("fghij"), label)
    record = _evaluation(None, lambda module: (rc, rr), heldout)
    assert record["heldout_accuracy"] == pytest.approx(1 / 3)  # 1 right of the 3 pairs with a preference

    pairs = tmp_path / "pairs.csv"
    pairs.write_text("prompt,chosen,rejected\n" + "".join(f"Q{i},Love,Hate\n" for i in range(4)))
    ties = tmp_path / "ties.csv"
    ties.write_text("prompt,chosen,rejected,label\nH,Gold,Dirt,0.5\nH,Sun,Rain,0.5\n")
    inproc.no_weights_read(monkeypatch)
    inproc.refused(lambda: inproc.train_rm(lm_folder, pairs=pairs, heldout_pairs=ties, steps=2, batch_size=2,
                                           workdir=tmp_path / "work"),
                   "all 2 held-out pairs have label 0.5", "accuracy is undefined")


def test_an_output_that_is_an_input_of_the_run_is_refused(rm_folder, tmp_path, monkeypatch):
    """beam --from_sweep=X --out=X --overwrite deleted the sweep X (and its .meta.json) as an old result to replace,
    then stopped: '--from_sweep=X: no such file'. An output that is a file the run reads is refused before
    anything is deleted (the sweep stays byte for byte), --vocab_file likewise (run_beam's claim, in-process)."""
    from rmjax.search.beam import BeamConfig
    from rmjax.search.beam_job import BeamSpec, run_beam

    sweep = tmp_path / "s.csv"
    run_sweep(SweepSpec(inproc.options(rm_folder, sweep), inproc.prompts(), (5, 6, 7)))
    before = sweep.read_bytes(), results.meta_path(sweep).read_bytes()
    inproc.no_weights_read(monkeypatch)
    inproc.refused(lambda: run_beam(BeamSpec(inproc.options(rm_folder, sweep, overwrite=True), inproc.prompts(),
                                             BeamConfig(depth=2, beam=2, top=2, allow_special=True), (5, 6, 7),
                                             from_sweep=str(sweep))),
                   "which this run reads (--from_sweep=")
    assert (sweep.read_bytes(), results.meta_path(sweep).read_bytes()) == before
    words = tmp_path / "words.txt"
    words.write_text("Love\nHate\n")
    inproc.refused(lambda: run_beam(BeamSpec(inproc.options(rm_folder, words, overwrite=True), inproc.prompts(),
                                             BeamConfig(depth=1), vocab_file=str(words))),
                   "which this run reads (--vocab_file=")
    assert words.read_text() == "Love\nHate\n"


def test_no_output_may_be_a_file_the_command_line_names(rm_folder, lm_folder, tmp_path, monkeypatch):
    """The same rule for the files every job's flags name: --texts_file, a --prompts YAML, the frontier's --sweep and
    train_rm's --pairs, each given as the output with --overwrite, was replaced by the result (exit 0). The entry
    points name --texts_file, --prompts and --pairs (so those run as commands); the frontier job its --sweep."""
    texts = tmp_path / "texts.txt"
    texts.write_text("Love\nHate\n")
    # a file inside the model's folder: --out=MODEL/config.json --overwrite deleted the model's config
    model = cli.copy_folder(rm_folder, tmp_path / "model")
    config = (model / "config.json").read_bytes()
    prompts = tmp_path / "prompts.yaml"
    prompts.write_text("greatest: What is the greatest thing?\n")
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("prompt,chosen,rejected\n" + "".join(f"Q{i},Love,Hate\n" for i in range(4)))
    heldout = tmp_path / "heldout.csv"
    heldout.write_text("prompt,chosen,rejected\nH,Gold,Dirt\n")
    # each refused before any model loads: the five command lines in one interpreter (cli.run_each)
    from_texts, in_model, as_folder, from_prompts, from_pairs = cli.run_each(
        ("score", f"--model={rm_folder}", f"--texts_file={texts}", f"--out={texts}", "--overwrite"),
        ("score", f"--model={model}", "--texts=a", f"--out={model / 'config.json'}", "--overwrite"),
        # a file output named as a folder (--out=dir/): score wrote `dir` and its .meta.json, then died reading `dir/`
        ("score", f"--model={rm_folder}", "--texts=a", f"--out={tmp_path / 'scores'}/"),
        ("sweep", f"--model={rm_folder}", f"--prompts={prompts}", "--token_ids=5,6", f"--out={prompts}", "--overwrite"),
        ("train_rm", f"--model={lm_folder}", f"--pairs={pairs}", f"--heldout_pairs={heldout}", "--steps=2",
         "--warmup_steps=1", "--batch_size=2", f"--workdir={tmp_path / 'work'}", f"--head_out={pairs}", "--overwrite"))
    cli.user_error(from_texts, "which this run reads (--texts_file=")
    assert texts.read_text() == "Love\nHate\n"
    cli.user_error(in_model, "inside a folder this run reads (--model=")
    assert (model / "config.json").read_bytes() == config
    cli.user_error(as_folder, "ends in a separator", f"--out={tmp_path / 'scores'}/result.csv")
    cli.user_error(from_prompts, "which this run reads (--prompts=")
    assert prompts.read_text() == "greatest: What is the greatest thing?\n"
    cli.user_error(from_pairs, "which this run reads (--pairs=")
    assert pairs.read_text().startswith("prompt,chosen,rejected\nQ0,Love,Hate")
    # a prompt's name is no path: a folder that happens to bear it may hold the output
    (tmp_path / "greatest").mkdir()
    cli.ok(cli.run("score", f"--model={rm_folder}", "--prompts=greatest", "--texts=a", "--z_sample=0",
                   "--out=greatest/s.csv", cwd=tmp_path))
    inproc.refused(lambda: run_sweep(SweepSpec(inproc.options(rm_folder, f"{tmp_path / 'swept'}/"), inproc.prompts(),
                                               (5, 6))), "ends in a separator")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(("scores", "swept"))]
    from rmjax.search.fluent import FluentConfig
    from rmjax.search.frontier_job import FrontierConfig, FrontierSpec, run_frontier

    sweep = tmp_path / "f" / "frontier.csv"  # where a frontier job with --out=f writes its table
    run_sweep(SweepSpec(inproc.options(rm_folder, sweep), inproc.prompts(), limit=3))
    before = sweep.read_bytes()
    with monkeypatch.context() as patch:
        inproc.no_weights_read(patch)
        inproc.refused(lambda: run_frontier(FrontierSpec(
            inproc.options(rm_folder, sweep.parent, overwrite=True), inproc.prompts(), FrontierConfig(),
            FluentConfig(), lm=str(lm_folder), judge=str(lm_folder), sweep=str(sweep))),
            "which this run reads (--sweep=")
    assert sweep.read_bytes() == before


def test_inspect_top_past_what_its_source_holds_is_refused(rm_folder, tmp_path, monkeypatch):
    """inspect --from_beam --top=3 of a beam keeping 2 sequences per direction inspected 4 responses with exit 0
    (a partial result, unsaid); --from_sweep --top past half the sweep's tokens made the best and worst lists
    overlap and was refused as "response … is given twice", which the user never did. (The jobs in-process.)"""
    from rmjax.inspect.job import InspectSpec, run_inspect
    from rmjax.search.beam import BeamConfig
    from rmjax.search.beam_job import BeamSpec, run_beam

    beam = tmp_path / "b.csv"
    run_beam(BeamSpec(inproc.options(rm_folder, beam), inproc.prompts(),
                      BeamConfig(depth=1, beam=2, top=2, allow_special=True), (5, 6, 7, 8, 9)))
    assert len(pd.read_csv(beam)) == 4
    sweep = tmp_path / "s.csv"
    run_sweep(SweepSpec(inproc.options(rm_folder, sweep), inproc.prompts(), (5, 6, 7)))
    inproc.no_weights_read(monkeypatch)

    def inspect(source, flag, top):
        (prompt,) = inproc.prompts().items()
        return run_inspect(InspectSpec(inproc.options(rm_folder, tmp_path / "inspect"), prompt, source=str(source),
                                       top=top, steps=4, source_flag=flag))

    inproc.refused(lambda: inspect(beam, "--from_beam", 3), "--top=3", "2 optimal, 2 pessimal")
    inproc.refused(lambda: inspect(sweep, "--from_sweep", 2), "--top=2", "its 3 tokens")


def test_implicit_rm_of_one_model_twice_is_refused(lm_folder, tmp_path):
    """Two log-prob tables of one model (two runs, or a copied folder: one content fingerprint) passed as chosen
    and reference: MWLR is 0 for every token, and analyze listed the ties' order as 'optimal' and 'pessimal'
    tokens with exit 0 (only the same file twice was refused)."""
    from rmjax.scoring.logprobs import LogprobsSpec, run_logprobs

    tables = [tmp_path / "a.csv", tmp_path / "b.csv"]
    # two runs of `logprobs --model=LM` (in-process), the second with --template=chat, which auto renders for this
    # LM (it has a chat template): the same conversations (helper-159: `auto` and `chat` passed as two sides)
    for table, template in zip(tables, ("auto", "chat"), strict=True):
        run_logprobs(LogprobsSpec(inproc.options(lm_folder, table, template=template), inproc.prompts()))
    assert results.read_meta(tables[0])["chat_template_head"] is not None
    inproc.refused(lambda: inproc.analyze(tmp_path / "analysis", implicit_chosen=str(tables[0]),
                                          implicit_reference=str(tables[1])), "are log-probs of one model")
    assert not (tmp_path / "analysis" / "report.md").exists()
    # at auto (chat, here) and plain the model saw two conversations: two sides, named by their templates
    plain = tmp_path / "plain.csv"
    run_logprobs(LogprobsSpec(inproc.options(lm_folder, plain, template="plain"), inproc.prompts()))
    inproc.analyze(tmp_path / "two", implicit_chosen=str(tables[0]), implicit_reference=str(plain))
    title = next(line for line in (tmp_path / "two" / "report.md").read_text().splitlines()
                 if line.startswith("## Implicit RM"))
    assert title.endswith(" (chat template) over reference " + title.split(" over reference ")[1]) and title.endswith(
        " (plain template)"), title


def test_implicit_rm_of_one_model_in_two_dtypes_names_each_side(lm_folder, tmp_path):
    """One model's log-probs in float32 and bfloat16 are two sides (MWLR measures the rounding): the report named
    both by the model, "chosen X over reference X". Each side is now named by its dtype."""
    from rmjax.scoring.logprobs import LogprobsSpec, run_logprobs

    tables = {dtype: tmp_path / f"{dtype}.csv" for dtype in ("float32", "bfloat16")}
    for dtype, table in tables.items():
        run_logprobs(LogprobsSpec(inproc.options(lm_folder, table, dtype=dtype), inproc.prompts()))
    inproc.analyze(tmp_path / "analysis", implicit_chosen=str(tables["float32"]),
                   implicit_reference=str(tables["bfloat16"]))
    report = (tmp_path / "analysis" / "report.md").read_text()
    title = next(line for line in report.splitlines() if line.startswith("## Implicit RM"))
    chosen, reference = title.removeprefix("## Implicit RM: chosen ").split(" over reference ")
    assert chosen.endswith(" (float32)") and reference.endswith(" (bfloat16)"), title
    assert chosen.removesuffix(" (float32)") == reference.removesuffix(" (bfloat16)"), title  # one model's name


def test_logprobs_refuses_a_prompt_past_the_context_before_loading(lm_folder, tmp_path, monkeypatch):
    """A fault hunt: logprobs loaded the weights, then refused a prompt past the context (sweep and plan refuse
    it before). Now from the tokenizer (a tiny LM of 512 positions)."""
    from rmjax.scoring.logprobs import LogprobsSpec, run_logprobs

    inproc.no_weights_read(monkeypatch)
    long = {"long": " ".join(["word"] * 600)}
    inproc.refused(lambda: run_logprobs(LogprobsSpec(inproc.options(lm_folder, tmp_path / "l.csv"), long)),
                   "positions", "the model's context is 512")
    assert not list(tmp_path.iterdir())


def test_a_result_deleted_without_its_meta_is_recomputed(rm_folder, tmp_path):
    """A user deleted a sweep's CSV (not its .meta.json) and reran the command: refused as '--out=X already exists
    and is not a finished rmjax result (no .meta.json with its inputs)', both false. The .meta.json of this very
    run (and the figure it records) are its own: the rerun recomputes the result, byte for byte the deleted one.
    (`sweep --token_ids=5,6,7 --plot`, in-process.)"""
    out = tmp_path / "s.csv"

    def sweep():
        return run_sweep(SweepSpec(inproc.options(rm_folder, out), inproc.prompts(), (5, 6, 7), plot=True))

    sweep()
    first = out.read_bytes()
    out.unlink()
    sweep()
    assert out.read_bytes() == first
    figure = out.with_name(out.name + ".png")
    out.unlink()
    figure.write_bytes(b"not the figure it drew")  # a companion the .meta.json does not record stays refused
    inproc.refused(sweep, str(figure), "no rmjax run")


def test_a_head_run_resumes_with_its_saved_feature_batch_size(lm_folder, tmp_path):
    """--feature_batch_size is not part of a training run's identity, yet the frozen features (and so every
    later step) round differently in other batches: a head-only run killed at step 8 and resumed with another
    --feature_batch_size trained on mixed features, its losses and head no longer the uninterrupted run's. The
    resume now computes them in the batches its checkpoints were trained on (run.json records them)."""
    import dataclasses

    import numpy as np

    from rmjax import nn
    from rmjax.loading import load
    from rmjax.loading.reward_head import reward_model_from_lm
    from rmjax.train.data import Pairs
    from rmjax.train.loop import train_reward_model
    from rmjax.train.settings import TrainConfig
    from tests.test_train import Crash, crash_at

    rm = reward_model_from_lm(load(str(lm_folder)), seed=0)
    rng = np.random.default_rng(0)
    words = [f"{a} {b}" for a in ("good", "bad", "fine", "odd") for b in ("apple", "river", "house", "music", "dog")]

    def pairs(n: int) -> Pairs:
        a, b = rng.choice(words, n), rng.choice(words, n)
        return Pairs(["Which is better?"] * n, list(a), list(b), np.ones(n, np.float32))

    train, held = pairs(64), pairs(8)
    cfg = TrainConfig(trainable="head", steps=12, batch_size=8, learning_rate=5e-2, checkpoint_every=4)
    whole = train_reward_model(rm, train, held, cfg, tmp_path / "a", log=lambda *_: None)
    with pytest.raises(Crash):
        train_reward_model(rm, train, held, cfg, tmp_path / "b", log=crash_at(8))
    notes = []
    resumed = train_reward_model(rm, train, held, dataclasses.replace(cfg, feature_batch_size=3), tmp_path / "b",
                                 log=notes.append)
    assert resumed.resumed_from == 8 and resumed.config.feature_batch_size == 256
    assert any("--feature_batch_size=256, not 3" in n for n in notes)
    assert [h["loss"] for h in resumed.history] == [h["loss"] for h in whole.history]
    np.testing.assert_array_equal(np.asarray(nn.flat(resumed.model.params)["score.kernel"]),
                                  np.asarray(nn.flat(whole.model.params)["score.kernel"]))


def test_a_bootstrap_of_one_resample_is_refused(tmp_path):
    """analyze --n_boot=1 wrote a "95%" interval of no width (low == high, not even around the mean), exit 0."""
    inproc.refused(lambda: inproc.analyze(tmp_path / "a", elo="builtin", n_boot=1), "--n_boot=1", "an integer >= 2")
    assert not (tmp_path / "a").exists()


def test_logprobs_writes_no_row_for_an_id_past_the_tokenizer(tmp_path):
    """A fault hunt: an LM whose embedding table is padded past its tokenizer (49,280 rows, 49,152 tokens) had its
    padding ids written as '' tokens with log-probs; one ranked first, and the implicit reward read them as a string
    both LMs share. Those ids are left out, as the sweep leaves them, and counted in .meta.json; every written row
    is transformers' log_softmax of the same conversation (max |Δ| within the float32 bound of a log-prob)."""
    import numpy as np
    import torch
    import transformers

    from rmjax.loading import load
    from rmjax.runs import results
    from rmjax.scoring.logprobs import LogprobsSpec, run_logprobs
    from rmjax.text.chat import split_chat
    from tests import tiny, tolerance

    folder = tmp_path / "padded"
    hf = tiny.build_hf_model("llama3", vocab_size=49280, pad_token_id=2, bos_token_id=1, eos_token_id=2)
    with torch.no_grad():
        hf.lm_head.weight[49152:] += 5.0  # the padding rows would lead the table
    tiny.save_hf_model(hf, folder)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (folder / f).write_bytes((tiny.smollm2_tokenizer_folder() / f).read_bytes())
    out = tmp_path / "lp.csv"
    run_logprobs(LogprobsSpec(inproc.options(folder, out), inproc.prompts()))
    table = results.read_scores_csv(out)
    assert table["token_id"].tolist() == list(range(49152)) and "" not in set(table["token_name"])
    assert results.read_meta(out)["ids_past_the_tokenizer"] == 128
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    ids = split_chat(tokenizer, inproc.prompts()["greatest"], "auto").prefix
    with torch.no_grad():
        reference = torch.log_softmax(hf(torch.tensor([list(ids)])).logits[0, -1].double(), -1).numpy()
    model = load(str(folder))
    atol = tolerance.logprobs_atol(model.params, model.config, [list(ids)])
    assert np.abs(table["greatest"].to_numpy() - reference[:49152]).max() <= atol
