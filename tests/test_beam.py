"""Beam and exhaustive N-token search against brute force over full-sequence forwards (no cache)."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from rmjax import chat, results, sharding
from rmjax import model as M
from rmjax.beam import BeamConfig, beam_search, run_beam
from rmjax.loading import load
from tests import cli, tiny
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


def _check_found(model, found, want_sequences: list, direction: str) -> None:
    """The rows' scores are the full forward's, and their means run in brute force's order (ties aside)."""
    got = [tuple(r) for r in found.ids.tolist()]
    np.testing.assert_allclose(found.scores, _full_scores(model, got), atol=1e-5, rtol=0)
    ranked, ranked_scores = _ranked(model, want_sequences, direction)
    np.testing.assert_allclose(found.scores.mean(1), ranked_scores[: len(got)].mean(1), atol=1e-5, rtol=0)
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


def test_depth_three_cached_equals_full_sequences(model):
    s = _candidates(10, seed=1)
    k = 3
    result = beam_search(model, PROMPTS, BeamConfig(depth=3, beam=k, top=20), s, batch_size=8, chunk_size=6)
    for direction in ("optimal", "pessimal"):
        firsts, _ = _ranked(model, [(t,) for t in s.tolist()], direction)
        seconds = [(*p, t) for p in firsts[:k] for t in s.tolist()]
        kept2, _ = _ranked(model, seconds, direction)
        thirds = [(*p, t) for p in kept2[:k] for t in s.tolist()]
        found = {f.depth: f for f in result.found if f.direction == direction}
        _check_found(model, found[2], seconds, direction)
        _check_found(model, found[3], thirds, direction)


def test_exhaustive_depth_three(model):
    s = _candidates(5, seed=2)
    result = beam_search(model, {"greatest": PROMPTS["greatest"]}, BeamConfig(depth=3, top=10, exhaustive=True), s,
                         batch_size=8)
    triples = list(itertools.product(s.tolist(), repeat=3))
    scores = _full_scores(model, triples)[:, :1]
    for found in result.found:
        if found.depth == 3:
            want = np.sort(scores[:, 0])[::-1][:10] if found.direction == "optimal" else np.sort(scores[:, 0])[:10]
            np.testing.assert_allclose(found.scores[:, 0], want, atol=1e-5, rtol=0)
    assert result.levels[-1]["partials"] == 25 and result.levels[-1]["candidates"] == 125


def test_mesh_equals_one_device(rm_folder, model):
    s = _candidates(12, seed=3)
    cfg = BeamConfig(depth=2, beam=5, top=12)
    ref = beam_search(model, PROMPTS, cfg, s, batch_size=8)
    sharded = load(str(rm_folder), mesh=sharding.make_mesh("data:4,model:2"))
    got = beam_search(sharded, PROMPTS, cfg, s, batch_size=8)
    for a, b in zip(ref.found, got.found, strict=True):
        np.testing.assert_allclose(b.scores, a.scores, atol=1e-5, rtol=0)


def test_csv_round_trips_awkward_tokens(model, tmp_path):
    tok = model.tokenizer
    awkward = [tok(t, add_special_tokens=False).input_ids for t in [",", "\n", '"', "None", "NaN", " null"]]
    s = np.asarray(sorted({ids[0] for ids in awkward if len(ids) == 1}))
    assert len(s) >= 5
    out = tmp_path / "beam.csv"
    result = run_beam(model, PROMPTS, BeamConfig(depth=2, beam=3, top=4), s, out=out, batch_size=8)
    df = results.read_beam_csv(out)
    assert list(df.columns) == [*results.BEAM_KEY_COLUMNS, *PROMPTS]
    assert len(df) == 2 * 2 * 4
    for _, row in df.iterrows():
        assert row["decoded"] == tok.decode(list(row["ids"]))
        assert row["tokens"] == tok.convert_ids_to_tokens(list(row["ids"]))
    first = result.found[0]
    np.testing.assert_allclose(df[(df.depth == 1) & (df.direction == "optimal")][list(PROMPTS)].to_numpy(),
                               first.scores, atol=1e-6)
    meta = json.loads(results.meta_path(out).read_text())
    partials = {tuple(r) for f in result.found if f.depth == 1 for r in f.ids[:3].tolist()}  # both beams, shared
    assert meta["candidates_scored"] == len(s) + len(partials) * len(s)
    assert meta["candidate_set"]["size"] == len(s)


def _beam_cmd(folder, out, *extra):
    return cli.command("beam", f"--model={folder}", "--prompts=greatest,worst", f"--out={out}", "--depth=3",
                       "--beam=8", "--top=16", "--batch_size=64", "--chunk_size=64",
                       "--token_ids=" + ",".join(map(str, range(1000, 1256))), *extra)


def test_kill_and_resume_gives_identical_csv(rm_folder, tmp_path):
    import subprocess

    whole = tmp_path / "whole.csv"
    subprocess.run(_beam_cmd(rm_folder, whole), cwd=cli.REPO, env=cli.ENV, check=True, capture_output=True)
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
    assert "depth 3 optimal:" in resumed.stdout
    assert not out.with_name(out.name + ".chunks").exists()


def test_vocab_file_and_user_errors(rm_folder, tmp_path):
    words = tmp_path / "words.txt"
    words.write_text(" cat\n dog\nzzqxjv-not-one-token\n house\n cat\n", encoding="utf-8")
    out = tmp_path / "w.csv"
    cli.ok(cli.run("beam", f"--model={rm_folder}", f"--out={out}", f"--vocab_file={words}", "--depth=2",
                   "--exhaustive", "--top=9", "--direction=optimal"))
    df = results.read_beam_csv(out)
    assert sorted(df[df.depth == 2].decoded) == sorted(a + b for a in [" cat", " dog", " house"]
                                                       for b in [" cat", " dog", " house"])
    meta = json.loads(results.meta_path(out).read_text())
    assert meta["vocab_file"]["single_tokens"] == 3 and meta["vocab_file"]["skipped"] == 1
    cli.user_error(cli.run("beam", f"--model={rm_folder}", f"--out={tmp_path / 'x.csv'}", "--exhaustive"),
                   "--exhaustive", "--token_ids")
    cli.user_error(cli.run("beam", f"--model={rm_folder}", f"--out={tmp_path / 'x.csv'}", "--depth=0"), "--depth=0")
    cli.user_error(cli.run("beam", f"--model={rm_folder}", f"--out={tmp_path / 'x.csv'}", "--token_ids=1",
                           f"--vocab_file={words}"), "--token_ids or --vocab_file")
    cli.user_error(cli.run("beam", f"--model={rm_folder}", f"--out={tmp_path / 'x.csv'}",
                           f"--vocab_file={tmp_path / 'missing.txt'}"), "missing.txt")


def test_analyze_reads_beam_results(model, tmp_path):
    """experiments.analyze --scores takes beam CSVs: top/bottom tables per depth and the cross-model Kendall tau on
    the sequences both models found, aligned by decoded string."""
    import pandas as pd

    from rmjax.analysis.config import AnalysisConfig
    from rmjax.analysis.report import run_analyses

    other_folder = tmp_path / "other"
    tiny.save_reward_model_with_tokenizer(other_folder, seed=5)
    other = load(str(other_folder))
    s = _candidates(6, seed=4)
    cfg = BeamConfig(depth=2, top=36, exhaustive=True)
    paths = []
    for name, m in (("a", model), ("b", other)):
        paths.append(tmp_path / f"{name}.csv")
        run_beam(m, {"greatest": PROMPTS["greatest"]}, cfg, s, out=paths[-1], batch_size=8)
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
