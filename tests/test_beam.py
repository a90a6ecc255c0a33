"""Beam and exhaustive N-token search against brute force over full-sequence forwards (no cache)."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from rmjax.errors import UsageError
from rmjax.loading import load
from rmjax.parallel import sharding
from rmjax.runs import results
from rmjax.search.beam import BeamConfig, beam_search
from rmjax.search.beam_job import write_beam
from rmjax.text import chat
from tests import cli, inproc, tiny, tolerance
from tests import jitted as M
from tests.test_analysis_stats import brute_force_tau_b

PROMPTS = {"greatest": "What, in one word, is the greatest thing ever?", "worst": "Name the worst thing."}


@pytest.fixture(scope="module")
def model(rm_folder):
    return load(str(rm_folder))


def _candidates(n: int, seed: int = 0) -> np.ndarray:
    return np.sort(np.random.default_rng(seed).choice(np.arange(300, 49000), size=n, replace=False))


def _full_scores(model, sequences: list[tuple[int, ...]]) -> np.ndarray:
    """[len(sequences), prompts]: one full forward per conversation, no cache."""
    out = []
    for text in PROMPTS.values():
        split = chat.split_chat(model.tokenizer, text)
        ids = np.asarray([split.ids_with(list(s)) for s in sequences], np.int32)
        out.append(np.asarray(M.rewards(model.params, model.config, ids, np.ones_like(ids, bool)))[:, 0])
    return np.stack(out, axis=1)


def _ranked(model, sequences: list[tuple[int, ...]], direction: str) -> tuple[list, np.ndarray]:
    scores = _full_scores(model, sequences)
    mean = scores.astype(np.float64).mean(axis=1)
    order = np.argsort(-mean if direction == "optimal" else mean, kind="stable")
    return [sequences[i] for i in order], scores[order]


def _atol(model, sequences: list[tuple[int, ...]]) -> float:
    """The float32 bound (tests/tolerance.py) on these conversations' rewards: the beam's cached, batched forward
    and one full forward per conversation round differently."""
    atol = 0.0
    for text in PROMPTS.values():
        split = chat.split_chat(model.tokenizer, text)
        ids = np.asarray([split.ids_with(list(s)) for s in sequences], np.int32)
        atol = max(atol, tolerance.rewards_atol(model.params, model.config, ids))
    return atol


def _check_found(model, found, want_sequences: list, direction: str) -> None:
    """The rows' scores are the full forward's, and their means run in brute force's order (ties aside)."""
    got = [tuple(r) for r in found.ids.tolist()]
    atol = _atol(model, got + list(want_sequences))
    np.testing.assert_allclose(found.scores, _full_scores(model, got), atol=atol, rtol=0)
    ranked, ranked_scores = _ranked(model, want_sequences, direction)
    np.testing.assert_allclose(found.scores.mean(1), ranked_scores[: len(got)].mean(1), atol=atol, rtol=0)
    assert len(set(got)) == len(got)


@pytest.mark.parametrize("exhaustive", [False, True])
def test_depth_two_with_full_beam_is_brute_force(model, exhaustive):
    s = _candidates(9)
    pairs = list(itertools.product(s.tolist(), repeat=2))
    cfg = BeamConfig(depth=2, beam=len(s), top=len(pairs), exhaustive=exhaustive)
    result = beam_search(model, PROMPTS, cfg, s, batch_size=8, chunk_size=4)
    for found in result.found:
        if found.depth == 2:
            assert sorted(tuple(r) for r in found.ids.tolist()) == sorted(pairs)  # every pair once
            _check_found(model, found, pairs, found.direction)
        else:
            _check_found(model, found, [(t,) for t in s.tolist()], found.direction)
    assert [lv["candidates"] for lv in result.levels] == [9, 81]


@pytest.mark.parametrize("top", [20, 2])
def test_depth_three_cached_equals_full_sequences(model, top):
    """The beam keeps `beam` partials at each depth before the last, also where fewer rows are written (top)."""
    s = _candidates(10, seed=1)
    k = 3
    result = beam_search(model, PROMPTS, BeamConfig(depth=3, beam=k, top=top), s, batch_size=8, chunk_size=6)
    extended = set()
    for direction in ("optimal", "pessimal"):
        firsts, _ = _ranked(model, [(t,) for t in s.tolist()], direction)
        seconds = [(*p, t) for p in firsts[:k] for t in s.tolist()]
        kept2, _ = _ranked(model, seconds, direction)
        thirds = [(*p, t) for p in kept2[:k] for t in s.tolist()]
        extended |= set(kept2[:k])
        found = {f.depth: f for f in result.found if f.direction == direction}
        assert len(found[2].ids) == len(found[3].ids) == min(top, len(seconds))
        _check_found(model, found[2], seconds, direction)
        _check_found(model, found[3], thirds, direction)
    assert result.levels[2]["partials"] == len(extended) > k


def test_exhaustive_depth_three(model):
    s = _candidates(5, seed=2)
    result = beam_search(model, {"greatest": PROMPTS["greatest"]}, BeamConfig(depth=3, top=10, exhaustive=True), s,
                         batch_size=8)
    triples = list(itertools.product(s.tolist(), repeat=3))
    scores = _full_scores(model, triples)[:, :1]
    atol = _atol(model, triples)
    for found in result.found:
        if found.depth == 3:
            want = np.sort(scores[:, 0])[::-1][:10] if found.direction == "optimal" else np.sort(scores[:, 0])[:10]
            np.testing.assert_allclose(found.scores[:, 0], want, atol=atol, rtol=0)
    assert result.levels[-1]["partials"] == 25 and result.levels[-1]["candidates"] == 125


def test_mesh_equals_one_device(rm_folder, model):
    s = _candidates(12, seed=3)
    cfg = BeamConfig(depth=2, beam=5, top=12)
    ref = beam_search(model, PROMPTS, cfg, s, batch_size=8)
    sharded = load(str(rm_folder), mesh=sharding.make_mesh("data:4,model:2"))
    got = beam_search(sharded, PROMPTS, cfg, s, batch_size=8)
    for a, b in zip(ref.found, got.found, strict=True):
        np.testing.assert_allclose(b.scores, a.scores, atol=_atol(model, [tuple(r) for r in a.ids.tolist()]), rtol=0)


def test_csv_round_trips_awkward_tokens(model, tmp_path):
    tok = model.tokenizer
    awkward = [tok(t, add_special_tokens=False).input_ids for t in [",", "\n", '"', "None", "NaN", " null"]]
    s = np.asarray(sorted({ids[0] for ids in awkward if len(ids) == 1}))
    assert len(s) >= 5
    out = tmp_path / "beam.csv"
    result = write_beam(model, PROMPTS, BeamConfig(depth=2, beam=3, top=4), s, out=out, batch_size=8)
    df = results.read_beam_csv(out)
    assert list(df.columns) == [*results.BEAM_KEY_COLUMNS, *PROMPTS]
    assert len(df) == 2 * 2 * 4
    for _, row in df.iterrows():
        assert row["decoded"] == tok.decode(list(row["ids"]))
        assert row["tokens"] == tok.convert_ids_to_tokens(list(row["ids"]))
    first = result.found[0]
    # the CSV holds 9 significant digits, which round-trip a float32
    np.testing.assert_allclose(df[(df.depth == 1) & (df.direction == "optimal")][list(PROMPTS)].to_numpy(),
                               first.scores, atol=1e-6)
    meta = json.loads(results.meta_path(out).read_text())
    partials = {tuple(r) for f in result.found if f.depth == 1 for r in f.ids[:3].tolist()}  # both beams, shared
    assert meta["candidates_scored"] == len(s) + len(partials) * len(s)
    assert meta["candidate_set"]["size"] == len(s)
    # A fault hunt (helper-133): a library call's candidate ids were not in the identity (only a job's requested
    # set), so a call over other candidates, or the whole vocabulary, reused this result.
    for other in (s[:-1], None):
        inproc.refused(lambda other=other: write_beam(model, PROMPTS, BeamConfig(depth=2, beam=3, top=4), other,
                                                      out=out, batch_size=8), "candidates", "--overwrite")


def _beam_cmd(folder, out, *extra):
    return cli.command("beam", f"--model={folder}", "--prompts=greatest,worst", f"--out={out}", "--depth=3",
                       "--beam=8", "--top=16", "--batch_size=64", "--chunk_size=64",
                       "--token_ids=" + ",".join(map(str, range(1000, 1256))), *extra)


def test_kill_and_resume_gives_identical_csv(rm_folder, tmp_path):
    """A beam SIGKILLed mid-way and run again gives the uninterrupted run's CSV byte for byte (that run in-process:
    the job _beam_cmd's flags make, tests/inproc.py)."""
    import subprocess

    from rmjax.search.beam_job import BeamSpec, run_beam
    from tests import inproc

    whole = tmp_path / "whole.csv"
    run_beam(BeamSpec(inproc.options(rm_folder, whole), inproc.prompts("greatest", "worst"),
                      BeamConfig(depth=3, beam=8, top=16), tuple(range(1000, 1256)), batch_size=64, chunk_size=64))
    out = tmp_path / "resumed.csv"
    done = tiny.kill_after_chunks(_beam_cmd(rm_folder, out), out, 12, cwd=cli.REPO, env=cli.ENV)
    total = 4 + 16 * 4 + 16 * 4  # chunks of 64: depth 1, then at most 16 partials x 4 chunks per level
    assert 12 <= done < total, "the run must be killed mid-way"
    assert not out.exists(), "no CSV may appear before every chunk is done"
    resumed = subprocess.run(_beam_cmd(rm_folder, out), cwd=cli.REPO, env=cli.ENV, check=True, capture_output=True,
                             text=True)
    assert out.read_bytes() == whole.read_bytes()
    meta = json.loads(results.meta_path(out).read_text())
    assert meta["resumed_candidates"] == done * 64
    assert meta["candidates_scored"] + meta["resumed_candidates"] == json.loads(
        results.meta_path(whole).read_text())["candidates_scored"]
    assert "depth 3 optimal:" in resumed.stdout and f"wrote {out}" in resumed.stdout
    assert not out.with_name(out.name + ".chunks").exists()
    again = subprocess.run(_beam_cmd(rm_folder, out), cwd=cli.REPO, env=cli.ENV, check=True, capture_output=True,
                           text=True)  # the finished result: reused, and said so (it printed "wrote")
    assert f"reused {out}" in again.stdout and "wrote" not in again.stdout and out.read_bytes() == whole.read_bytes()


def test_vocab_file_and_user_errors(rm_folder, tmp_path, monkeypatch):
    """`beam --vocab_file=… --depth=2 --exhaustive --top=9 --direction=optimal` and its refusals, in-process
    (tests/inproc.py: the entry point only turns these flags into the spec); the refusals stop before any weight is
    read."""
    from rmjax.search.beam_job import BeamSpec, run_beam
    from tests import inproc

    def beam(out, cfg=None, token_ids=None, vocab_file=None):
        return lambda: run_beam(BeamSpec(inproc.options(rm_folder, out), inproc.prompts("greatest"),
                                         cfg or BeamConfig(), token_ids, vocab_file=vocab_file and str(vocab_file)))

    words = tmp_path / "words.txt"
    words.write_text(" cat\n dog\nzzqxjv-not-one-token\n house\n cat\n", encoding="utf-8")
    out = tmp_path / "w.csv"
    beam(out, BeamConfig(depth=2, exhaustive=True, top=9, direction="optimal"), vocab_file=words)()
    df = results.read_beam_csv(out)
    assert sorted(df[df.depth == 2].decoded) == sorted(a + b for a in [" cat", " dog", " house"]
                                                       for b in [" cat", " dog", " house"])
    meta = json.loads(results.meta_path(out).read_text())
    assert meta["vocab_file"]["single_tokens"] == 3 and meta["vocab_file"]["skipped"] == 1
    x = tmp_path / "x.csv"
    inproc.no_weights_read(monkeypatch)
    inproc.refused(beam(x, BeamConfig(exhaustive=True)), "--exhaustive", "--token_ids")
    inproc.refused(lambda: BeamConfig(depth=0), "--depth=0")  # the flag's config
    inproc.refused(beam(x, token_ids=(1,), vocab_file=words), "--token_ids or --vocab_file")
    inproc.refused(beam(x, vocab_file=tmp_path / "missing.txt"), "missing.txt")
    # candidates that are all special tokens: refused once the model had loaded (a fault hunt), now before
    from rmjax.loading import config_and_tokenizer

    specials = tuple(sorted(set(config_and_tokenizer(str(rm_folder))[1].all_special_ids)))
    inproc.refused(beam(x, token_ids=specials), f"all {len(specials)} candidates are special or byte tokens")
    assert not x.exists()


def test_analyze_reads_beam_results(model, tmp_path):
    """experiments.analyze --scores takes beam CSVs: top/bottom tables per depth and the cross-model Kendall tau on
    the sequences both models found, aligned by decoded string."""
    import pandas as pd

    from rmjax.analysis.report import run_analyses
    from rmjax.analysis.spec import AnalysisConfig

    other_folder = tmp_path / "other"
    tiny.save_reward_model_with_tokenizer(other_folder, seed=5)
    other = load(str(other_folder))
    s = _candidates(6, seed=4)
    cfg = BeamConfig(depth=2, top=36, exhaustive=True)
    paths = []
    for name, m in (("a", model), ("b", other)):
        paths.append(tmp_path / f"{name}.csv")
        write_beam(m, {"greatest": PROMPTS["greatest"]}, cfg, s, out=paths[-1], batch_size=8)
    report = run_analyses(AnalysisConfig(scores=tuple(map(str, paths)), models_yaml="", frequencies="", top=5),
                          tmp_path / "analysis", echo=False)
    names = report["tables"]
    tau = pd.read_csv(names["beam_kendall_tau_depth2_greatest"]).set_index("model")
    frames = [results.read_beam_csv(p) for p in paths]
    per_model = [f[f.depth == 2].groupby("decoded")["greatest"].max() for f in frames]
    common = sorted(set(per_model[0].index) & set(per_model[1].index))
    assert len(common) >= 30  # both exhaustive over the same set: (nearly) every string is shared
    want = brute_force_tau_b([per_model[0][c] for c in common], [per_model[1][c] for c in common])
    labels = list(tau.index)
    assert tau.loc[labels[0], labels[1]] == pytest.approx(want, abs=1e-9)
    top = pd.read_csv(names[f"beam_{labels[0]}_depth2_optimal"], keep_default_na=False)
    assert len(top) == 5 and list(top["rank"]) == [1, 2, 3, 4, 5]
    assert top["mean"].is_monotonic_decreasing


def _count_scored_rows(monkeypatch) -> list[int]:
    """Rows the beam's batch scorer is given per call (one prompt each), from the end of the whole-job estimate
    on (its warm-up batch is not the job's)."""
    import rmjax.search.beam as beam_module

    rows, score, estimate = [], beam_module.score_responses, beam_module._estimate

    def counted(model, cache, suffix, responses, batch_size):
        rows.append(len(responses))
        return score(model, cache, suffix, responses, batch_size)

    def estimated(*args, **kwargs):
        out = estimate(*args, **kwargs)
        rows.clear()
        return out

    monkeypatch.setattr(beam_module, "score_responses", counted)
    monkeypatch.setattr(beam_module, "_estimate", estimated)
    return rows


def _progress_totals(stderr: str) -> list[tuple[int, int]]:
    lines = [ln for ln in stderr.splitlines() if ln.startswith("[beam, whole job")]
    return [tuple(int(x.replace(",", "")) for x in ln.split("] ")[1].split(" ")[0].split("/")) for ln in lines]


@pytest.mark.parametrize(("n", "cfg", "shared"), [
    (10, BeamConfig(depth=3, beam=3, top=5), False),  # two beams, disjoint partials: counted exactly
    (4, BeamConfig(depth=3, beam=3, top=5), True),  # 4 first tokens: the best 3 and the worst 3 share 2
    (4, BeamConfig(depth=3, top=5, exhaustive=True), False),
    (6, BeamConfig(depth=3, beam=2, top=5, direction="pessimal"), False)])
def test_whole_job_estimate_counts_every_depth_and_direction(model, monkeypatch, capsys, tmp_path, n, cfg, shared):
    from rmjax.runs.chunks import ChunkStore

    rows = _count_scored_rows(monkeypatch)
    store = ChunkStore(tmp_path / "b.csv", {"test": n}, 4)
    result = beam_search(model, PROMPTS, cfg, _candidates(n, seed=7), batch_size=8, store=store, progress_every=0)
    err = capsys.readouterr().err
    counted = sum(rows) // len(PROMPTS)  # brute force: every row given to the scorer after the estimate
    assert counted == result.scored == sum(lv["candidates"] for lv in result.levels)
    planned = result.estimate["candidates"]
    assert (planned > counted) if shared else (planned == counted)
    assert len(result.estimate["per_depth"]) == cfg.depth and result.estimate["seconds"] > 0
    assert f"the whole job is {planned:,} candidates" in err
    totals = _progress_totals(err)  # one count for the whole job, lowered to what ran as a level finds shared partials
    assert totals[-1] == (counted, counted) and all(t >= counted for _, t in totals)
    assert shared or {t for _, t in totals} == {counted}
    rerun = beam_search(model, PROMPTS, cfg, _candidates(n, seed=7), batch_size=8, store=store)
    assert rerun.estimate["resumed"] == counted and rerun.scored == 0
    assert shared or rerun.estimate["seconds"] == 0  # all on disk: no warm-up, nothing left (a bound when shared)


def _sweep(model, out, prompts, ids, batch_size: int = 8, mode: str = "token"):
    from rmjax.search.sweep import sweep

    sweep(model, prompts, [int(i) for i in ids], batch_size=batch_size, out=out, mode=mode)
    return out


@pytest.mark.parametrize("superset", [False, True])
def test_from_sweep_gives_the_same_beam(model, tmp_path, superset):
    """Depth 1 read from a sweep is bit-equal to scoring it (the sweep wrote each f32 score with 9 significant
    digits, and runs the same cached-prefix scorer); a sweep of more prompts and tokens serves as well."""
    s = _candidates(24, seed=6)
    prompts, ids = PROMPTS, s
    if superset:
        prompts, ids = {"other": "Say one word.", **PROMPTS}, np.concatenate([[5, 9, 11], s, [49001]])
    swept = _sweep(model, tmp_path / "sweep.csv", prompts, ids)
    cfg = BeamConfig(depth=2, beam=4, top=6)
    write_beam(model, PROMPTS, cfg, s, out=tmp_path / "a.csv", batch_size=8, chunk_size=8)
    write_beam(model, PROMPTS, cfg, s, out=tmp_path / "b.csv", batch_size=8, chunk_size=8, from_sweep=swept)
    assert (tmp_path / "b.csv").read_bytes() == (tmp_path / "a.csv").read_bytes()
    meta_a, meta_b = (json.loads(results.meta_path(tmp_path / f"{x}.csv").read_text()) for x in "ab")
    assert meta_b["candidates_scored"] == meta_a["candidates_scored"] - len(s)
    assert meta_b["levels"][0]["from_sweep"] == len(s) and meta_b["from_sweep"]["path"] == str(swept)
    assert meta_b["identity"]["depth1_from_sweep"] and "depth1_from_sweep" not in meta_a["identity"]


def test_from_sweep_refuses_other_runs_and_incomplete_sweeps(rm_folder, model, tmp_path, monkeypatch):
    from rmjax.errors import RmjaxError

    s = _candidates(12, seed=8)
    good = _sweep(model, tmp_path / "good.csv", PROMPTS, s)
    other_folder = tmp_path / "other"
    tiny.save_reward_model_with_tokenizer(other_folder, seed=5)
    bad = {"model.weights": _sweep(load(str(other_folder)), tmp_path / "other.csv", PROMPTS, s),
           "prompts.worst": _sweep(model, tmp_path / "prompt.csv", {**PROMPTS, "worst": "Worst?"}, s),
           "lacks 2 of": _sweep(model, tmp_path / "fewer.csv", PROMPTS, s[:-2]),
           # the tokens' text re-tokenized in the template: not the beam's token ids (its mode's scores differ)
           "mode 'text' there, 'token' here": _sweep(model, tmp_path / "text.csv", PROMPTS, s, mode="text")}
    text, meta = good.read_bytes(), json.loads(results.meta_path(good).read_text())
    # a finished sweep edited by hand (its .meta.json kept): its last digit changed, its last row removed
    digit, short = text[:-2] + bytes([text[-2] ^ 1]) + b"\n", text[: text.rindex(b"\n", 0, -1) + 1]
    for name, data in (("digit", digit), ("short", short), ("no_meta", text), ("copied", text)):
        (tmp_path / f"{name}.csv").write_bytes(data)
        if name != "no_meta":
            files = {f"{name}.csv" if name != "copied" else "good.csv": meta["files"]["good.csv"]}
            (tmp_path / f"{name}.csv.meta.json").write_text(json.dumps({**meta, "files": files}))
    bad |= {"changed after it was written": tmp_path / "digit.csv", "cut short or changed": tmp_path / "short.csv",
            "not a finished rmjax result": tmp_path / "no_meta.csv", "copied or renamed": tmp_path / "copied.csv"}
    cfg = BeamConfig(depth=2, beam=2, top=4)
    for fragment, path in bad.items():
        with pytest.raises(RmjaxError, match=fragment):
            write_beam(model, PROMPTS, cfg, s, out=tmp_path / "beam.csv", batch_size=8, from_sweep=path)
        assert not (tmp_path / "beam.csv").exists()
    # The job (`beam --prompts=greatest --prompt=worst=… --token_ids=… --from_sweep=…`, in-process: the entry point
    # only turns its flags into this spec): refused before any weight is read.
    from rmjax.search.beam_job import BeamSpec, run_beam
    from tests import inproc

    def job(sweep):
        return lambda: run_beam(BeamSpec(inproc.options(rm_folder, tmp_path / "cli.csv"),
                                         inproc.prompts("greatest", worst=PROMPTS["worst"]), BeamConfig(),
                                         tuple(int(i) for i in s), from_sweep=str(sweep)))

    inproc.no_weights_read(monkeypatch)
    inproc.refused(job(bad["model.weights"]), "--from_sweep", "model.weights")
    inproc.refused(job(tmp_path / "short.csv"), "does not match its")
    inproc.refused(job(bad["lacks 2 of"]), "lacks 2 of the beam's 12 candidates")  # was refused only once loaded
    assert not (tmp_path / "cli.csv").exists()


def test_from_sweep_checked_before_loading_leaves_out_what_the_beam_leaves_out(rm_folder, model, tmp_path,
                                                                                 monkeypatch):
    """The check before loading takes the beam's own candidate set: special and byte tokens the beam leaves out
    need not be in the sweep (a check on the ids as given refused this job), and --allow_special needs them. The
    result is reused, but not under another version of the rule that leaves tokens out."""
    from rmjax.errors import OutputExistsError
    from rmjax.search.beam_job import BeamSpec, run_beam
    from rmjax.text import candidates
    from rmjax.text.candidates import special_or_byte
    from tests import inproc

    special = np.flatnonzero(special_or_byte(model.tokenizer, model.config.vocab_size))[:2]
    assert len(special) == 2
    s = _candidates(8, seed=9)
    swept = _sweep(model, tmp_path / "sweep.csv", PROMPTS, s)

    def job(allow_special: bool):
        return run_beam(BeamSpec(inproc.options(rm_folder, tmp_path / f"beam_{allow_special}.csv"),
                                 dict(PROMPTS), BeamConfig(depth=1, beam=2, top=2, allow_special=allow_special),
                                 tuple(int(i) for i in np.concatenate([special, s])), from_sweep=str(swept)))

    inproc.refused(lambda: job(True), "lacks 2 of the beam's 10 candidates")
    assert job(False).levels[0]["from_sweep"] == len(s)
    assert job(False) is None  # reused
    # another version of the rule that leaves tokens out may leave out others: not this result's inputs
    monkeypatch.setattr(candidates, "LEFT_OUT", candidates.LEFT_OUT + 1)
    with pytest.raises(OutputExistsError):
        job(False)


def test_limit_restricts_the_vocabulary(rm_folder, model, tmp_path):
    """--limit keeps the first N candidates, as the sweep's does: token ids 0..N-1 of the vocabulary (or the first
    N of --token_ids); the command line (with a sweep for depth 1) gives the library's result byte for byte."""
    cfg = BeamConfig(depth=2, beam=2, top=5)
    prompts = {"greatest": PROMPTS["greatest"]}
    # batches of the 3 candidates left (a larger one is padding alone: the command line refuses it)
    lib = write_beam(model, prompts, cfg, out=tmp_path / "lib.csv", limit=20, batch_size=3)
    assert lib.candidates.tolist() == list(range(17, 20))  # SmolLM2's 17 added special tokens are ids 0..16
    assert all(17 <= min(f.ids.ravel()) and max(f.ids.ravel()) < 20 for f in lib.found)
    first = write_beam(model, prompts, cfg, _candidates(30), out=tmp_path / "ids.csv", limit=7, batch_size=8)
    assert first.candidates.tolist() == _candidates(30)[:7].tolist()
    swept = _sweep(model, tmp_path / "sweep.csv", prompts, range(17, 20), 3)  # batches as the beam's: same bits
    out = tmp_path / "cli.csv"
    proc = cli.ok(cli.run("beam", f"--model={rm_folder}", "--prompts=greatest", f"--out={out}", "--limit=20",
                          "--depth=2", "--beam=2", "--top=5", "--batch_size=3", f"--from_sweep={swept}"))
    assert out.read_bytes() == (tmp_path / "lib.csv").read_bytes()
    meta = json.loads(results.meta_path(out).read_text())
    assert meta["candidate_set"]["size"] == 3 and meta["identity"]["limit"] == 20
    assert meta["levels"][0]["from_sweep"] == 3 and meta["candidates_scored"] == 3 * 3  # both beams' prefixes: all 3
    assert "17 special/byte tokens of 20 candidates left out" in proc.stderr
    assert "depth 1: from the sweep" in proc.stderr
    cli.user_error(cli.run("beam", f"--model={rm_folder}", f"--out={tmp_path / 'x.csv'}", "--limit=0"), "--limit")


def test_the_completion_check_of_every_written_row_and_prompt(rm_folder, lm_folder, model, tmp_path, capfd):
    """OUT.completions.csv: one row per written (depth, direction, rank) and prompt, checked against independent
    readings (tests/completion_checks.py), its reward the beam CSV's; .meta.json's medians read the table. The
    tiny RM ties no LM head: without --lm the check is skipped and says so."""
    from transformers import AutoModelForCausalLM

    from rmjax.search.beam_job import completions_path
    from tests.completion_checks import check_table

    lm = load(str(lm_folder))
    s = _candidates(10, seed=3)
    out = tmp_path / "beam.csv"
    write_beam(model, PROMPTS, BeamConfig(depth=2, beam=3, top=3), s, out=out, batch_size=8, lm=lm)
    beam = results.read_beam_csv(out)
    assert completions_path(out) == tmp_path / "beam.csv.completions.csv"  # OUT's whole name: out.csv and out differ
    table = __import__("pandas").read_csv(completions_path(out), keep_default_na=False)
    assert list(table.columns) == ["depth", "direction", "rank", "ids", "prompt", "ends_turn", "completed_text",
                                   "reward", "completed_reward", "truncation_gain"]
    assert len(table) == len(beam) * len(PROMPTS)
    want = beam[list(PROMPTS)].to_numpy(np.float64).reshape(-1)  # a row's prompts together
    assert table.ids.tolist() == [" ".join(map(str, ids)) for ids in beam.ids for _ in PROMPTS]
    assert table.prompt.tolist() == list(PROMPTS) * len(beam)
    signs = np.where(table.direction == "optimal", 1.0, -1.0)
    check_table(table, model, lm, AutoModelForCausalLM.from_pretrained(lm_folder).eval(), PROMPTS, want, signs, 0.0)
    meta = json.loads(results.meta_path(out).read_text())
    for direction, got in meta["completion"]["by_direction"].items():
        mine = table[table.direction == direction]
        assert got["rows"] == len(mine)
        assert got["median_truncation_gain"] == pytest.approx(float(np.median(mine.truncation_gain)), abs=1e-6)
    assert meta["completion"]["lm"] == lm.source and meta["identity"]["completion"]["lm"] is not None
    # the rate counts every prompt's score of a candidate
    assert meta["candidates_per_second"] == pytest.approx(meta["candidates_scored"] * len(PROMPTS) / meta["seconds"])

    bare = tmp_path / "bare.csv"
    capfd.readouterr()
    write_beam(model, PROMPTS, BeamConfig(depth=1, beam=3, top=3), s, out=bare, batch_size=8)
    assert not completions_path(bare).exists()
    skipped = json.loads(results.meta_path(bare).read_text())["completion"]["skipped"]
    assert "--lm" in skipped and f"completion check {skipped}" in capfd.readouterr().err  # said, not only recorded


def test_special_and_byte_tokens_are_left_out_unless_allowed(model, tmp_path):
    """Issue 45: `--limit=500` kept ids 0..499 (SmolLM2's specials and raw bytes) and every top depth-2 row began
    with `<|endoftext|>`. Beam, GCG and the frontier now share one exclusion; --allow_special keeps them all."""
    from rmjax.search.gcg_swaps import disallowed_ids
    from rmjax.text.candidates import special_or_byte

    tok = model.tokenizer
    left_out = special_or_byte(tok, model.config.vocab_size)
    byte = next(i for i in range(100, 300) if "\ufffd" in tok.decode([i]))  # a lone UTF-8 lead byte
    newline, word = tok("\n").input_ids[0], tok(" the").input_ids[0]
    assert left_out[:17].all() and left_out[byte] and not left_out[[17, newline, word]].any()
    # control characters Python calls whitespace (\x0b, \x0c, \x1c-\x1f) are control tokens too: '\x1c' filled a
    # beam's top rows; tab and newline stay (decoded here by the tokenizer, against unicodedata's category)
    import unicodedata

    for i in range(300):
        text = tok.decode([i])
        if len(text) == 1 and unicodedata.category(text) == "Cc":
            assert left_out[i] == (text not in "\t\n\r"), (i, text)
    assert sum(left_out[i] for i in range(17, 300) if len(tok.decode([i])) == 1
               and tok.decode([i]) in "\x0b\x0c\x1c\x1d\x1e\x1f") >= 5
    assert (disallowed_ids(tok, model.config.vocab_size, False, True) == left_out).all()  # GCG's own default
    assert not disallowed_ids(tok, model.config.vocab_size, True, True)[: len(tok)].any()
    prompts = {"greatest": PROMPTS["greatest"]}
    ids = np.asarray([0, 1, byte, newline, word, 17], np.int64)
    cfg = BeamConfig(depth=2, beam=3, top=4, direction="optimal")
    found = write_beam(model, prompts, cfg, ids, out=tmp_path / "b.csv", batch_size=8).found
    assert {int(t) for f in found for t in f.ids.ravel()} <= {newline, word, 17}
    kept = write_beam(model, prompts, BeamConfig(depth=1, beam=3, top=6, direction="optimal", allow_special=True),
                      ids, out=tmp_path / "all.csv", batch_size=8)
    assert sorted(kept.candidates.tolist()) == sorted(ids.tolist())


@pytest.mark.parametrize("model_name", ["elo-rm-smollm2-135m"])
def test_a_resumed_level_prefills_its_partials_as_a_straight_run_does(model_name):
    """A fault hunt: a resume prefilled only the partials left, grouped among themselves (5 of 8 in a 5-row forward,
    not 8), and their caches rounded otherwise: the default RM's resumed beam scored up to 1.05e-5 from the straight
    run's (the same sequences, other numbers; a near tie at the cut could turn). The groups are fixed by index now:
    whatever is stored, each partial's cache is the straight run's, bit for bit."""
    import jax

    from rmjax.scoring.context import prepare_prompt
    from rmjax.search.beam import _cached_units

    model = load(model_name)
    contexts = [prepare_prompt(model, "greatest", "What is the greatest thing ever?", "auto", response_tokens=2)]
    units = np.arange(1000, 1008, dtype=np.int64)[:, None]  # a K = 4 beam's 8 partials at depth 2
    starts = range(0, 64, 16)
    straight = dict(_cached_units(model, contexts, units, set(), starts))
    stored = {(u, s) for u in range(3) for s in starts} | {(3, 0)}  # killed in partial 3's chunks
    resumed = dict(_cached_units(model, contexts, units, stored, starts))
    assert [u for u, caches in resumed.items() if caches is None] == [0, 1, 2]
    for u in range(3, len(units)):
        for a, b in zip(jax.tree.leaves(straight[u]), jax.tree.leaves(resumed[u]), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=f"partial {u}")


def test_a_tokenizers_decoded_vocabulary_is_built_once():
    """Beam, GCG and the frontier each ask for every token decoded alone (Gemma 3's 262,144: ≈1 s each time): the
    table is built once per tokenizer (a decorator left on another function once made it every time)."""
    from rmjax.text.candidates import decoded_tokens

    class Counting:
        calls = 0

        def batch_decode(self, rows):
            Counting.calls += 1
            return [f"<{row[0]}>" for row in rows]

    tok = Counting()
    first = decoded_tokens(tok, 5)
    assert first == tuple(f"<{i}>" for i in range(5))  # each id decoded alone, in id order
    assert decoded_tokens(tok, 5) is first and Counting.calls == 1


def test_ties_keep_the_earlier_partial_then_the_earlier_candidate_whatever_the_chunks():
    """Equal scores (a candidate list with a repeated token, two partials that score alike) are kept in the order
    (partial, candidate index), so a rerun in other chunks writes the same rows."""
    from rmjax.search.beam import _Best

    rng = np.random.default_rng(0)
    scores = rng.choice([0.5, 1.0, 2.0], size=(2, 12, 1)).astype(np.float32)  # many ties
    ids = np.arange(2 * 12 * 2).reshape(2, 12, 2)
    for direction in (1.0, -1.0):
        order = sorted(((u, c) for u in range(2) for c in range(12)), key=lambda k: -direction * scores[k][0])
        want = [ids[k].tolist() for k in order][:7]  # Python's sort is stable: (partial, candidate) among ties
        for chunk in (12, 5, 1):
            best = _Best(direction, 7, 1, 2)
            for u in (1, 0) if chunk == 1 else (0, 1):  # partials in either order
                for s in range(0, 12, chunk):
                    best.add(u, s, ids[u, s : s + chunk], scores[u, s : s + chunk])
            assert best.ids.tolist() == want, (direction, chunk)


def test_a_resumed_beam_keeps_its_saved_batch_size(rm_folder, model, tmp_path, monkeypatch, capfd):
    """Mutants that survived: the beam job's resume, and write_beam's, with the batch size asked for rather than the
    saved one (another batch size is another compiled program, whose rounding differs). Killed at its third chunk
    with batches of 8 and resumed asking for 4: the job plans 8 (refused where only 4 fits), says it keeps 8 and
    writes the uninterrupted run's bytes; write_beam records 8 too."""
    from rmjax.search.beam_job import BeamSpec, run_beam
    from tests import inproc

    cfg, ids, prompts = BeamConfig(depth=2, beam=2, top=4), tuple(range(1000, 1032)), inproc.prompts("greatest")

    def job(out, batch_size):
        return run_beam(BeamSpec(inproc.options(rm_folder, out), prompts, cfg, ids, batch_size=batch_size,
                                 chunk_size=8))

    whole, out = tmp_path / "whole.csv", tmp_path / "resumed.csv"
    job(whole, 8)
    inproc.killed_at_write(monkeypatch, 3, lambda: job(out, 8))
    # where the saved batch does not fit, the resume is refused for it (the memory plan is the saved batch's)
    from rmjax.loading import config_and_tokenizer
    from rmjax.scoring import memory
    from rmjax.search.sweep import memory_plan

    with monkeypatch.context() as patch:
        room = memory_plan(*config_and_tokenizer(str(rm_folder)), prompts, "auto", "float32", None, 8,
                           response_tokens=2).total_bytes - 1
        patch.setattr(memory, "device_memory_bytes", lambda: room)
        inproc.refused(lambda: job(out, 4), "the batch size 8 of the progress saved in")
    capfd.readouterr()
    job(out, 4)
    assert "with its batch size 8, not --batch_size=4" in capfd.readouterr().err
    assert out.read_bytes() == whole.read_bytes() and results.read_meta(out)["batch_size"] == 8
    lib = tmp_path / "lib.csv"

    def library(batch_size):
        return write_beam(model, prompts, cfg, np.asarray(ids), out=lib, batch_size=batch_size, chunk_size=8)

    inproc.killed_at_write(monkeypatch, 3, lambda: library(8))
    library(4)
    assert results.read_meta(lib)["batch_size"] == 8


def test_a_key_column_prompt_name_or_an_lm_without_a_head_is_refused_before_loading(rm_folder, tmp_path, monkeypatch):
    """Mutants that survived: the beam job without its check of prompt names wrote a prompt named `depth` over the
    column of the depths; without its check of --lm's config it loaded the weights first."""
    from rmjax.search.beam_job import BeamSpec, run_beam
    from tests import inproc

    inproc.no_weights_read(monkeypatch)
    spec = BeamSpec(inproc.options(rm_folder, tmp_path / "b.csv"), {"depth": PROMPTS["greatest"]},
                    BeamConfig(depth=1, beam=2, top=2), tuple(range(1000, 1008)))
    inproc.refused(lambda: run_beam(spec), "prompt name 'depth' is a key column")
    # an --lm without an LM head (the tiny RM unties its embeddings): refused before loading, not once loaded
    spec = BeamSpec(inproc.options(rm_folder, tmp_path / "b.csv"), dict(PROMPTS), BeamConfig(depth=1, beam=2, top=2),
                    tuple(range(1000, 1008)), lm=str(rm_folder))
    inproc.refused(lambda: run_beam(spec), f"--lm={rm_folder} has no LM head")
    assert list(tmp_path.iterdir()) == []


def test_a_row_past_the_tokenizer_is_refused_not_written(tmp_path):
    """A vocabulary padded past its tokenizer (as Gemma's and Llama's checkpoints pad theirs): a beam over a padding
    row wrote its token as JSON null (a mutant that survived), then as the empty string, a name every analysis
    reads as one shared string. Such an id is no token, as the whole-vocabulary sweep and logprobs treat it: the
    candidate set is refused (helper-143), whatever --allow_special says."""
    _, folder = tiny.save_reward_model_with_tokenizer(tmp_path / "rm", vocab_size=49152 + 8)
    padded = load(str(folder))
    out = tmp_path / "b.csv"
    with pytest.raises(UsageError, match=r"--token_ids: \[49155\] are outside the vocabulary \[0, 49152\); the "
                                         r"embedding has 49160 rows"):
        write_beam(padded, PROMPTS, BeamConfig(depth=1, beam=2, top=2, allow_special=True),
                   np.asarray([1000, 49155]), out=out, batch_size=2)
    assert not out.exists()
