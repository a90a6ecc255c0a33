"""Issue 22 for `experiments.analyze`: no silent wrong results. Names that read alike get files of their own,
--roundtrip_only is honoured or refused (never only claimed), bad inputs and outputs stop in one line, and a
killed analysis is known as one (and replaced by --overwrite). Stand-in tables, no model. The analyses run
in-process (`analyze`: experiments.analyze's main, its RmjaxError the command's one `error:` line, tests/inproc.py);
only the killed analysis is a command, killed with SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rmjax.analysis import data
from rmjax.analysis.files import STAGE, Outputs
from rmjax.errors import OutputExistsError
from rmjax.runs import results
from tests import cli, inproc

QUICK = ["--models_yaml=", "--frequencies=", "--n_boot=5", "--n_permutations=5", "--top=3"]
# QUICK as AnalysisConfig fields (the flags given empty are None).
QUICK_SETTINGS = dict(models_yaml=None, frequencies=None, n_boot=5, n_permutations=5, top=3)
WORDS = [f"w{i}" for i in range(40)]


def sweep(path: Path, columns: dict[str, np.ndarray], model: str | None = None, kind: str = "sweep",
          roundtrip: np.ndarray | None = None, meta: bool = True) -> Path:
    """A score table of WORDS (as experiments.sweep writes it), with its .meta.json unless `meta` is False."""
    n = len(next(iter(columns.values())))
    words = WORDS[:n] if n <= len(WORDS) else [f"w{i}" for i in range(n)]
    results.write_scores_csv(path, np.arange(n), words, words, columns, roundtrip=roundtrip)
    if meta:
        results.write_meta(path, kind=kind, model=model or path.stem, prompts={p: f"Prompt {p}?" for p in columns})
    return path


def beam(path: Path, model: str, prompts: list[str], seed: int) -> Path:
    """A beam result (experiments.beam's columns) of depths 1 and 2, both directions, 4 sequences each."""
    rng = np.random.default_rng(seed)
    keys: dict[str, list] = {c: [] for c in results.BEAM_KEY_COLUMNS}
    for depth in (1, 2):
        for direction in ("optimal", "pessimal"):
            for rank in range(1, 5):
                ids = [int(i) for i in rng.choice(30, size=depth, replace=False)]
                for column, value in zip(results.BEAM_KEY_COLUMNS, (
                        depth, direction, rank, " ".join(map(str, ids)), json.dumps([f"t{i}" for i in ids]),
                        json.dumps("".join(f"t{i}" for i in ids))), strict=True):
                    keys[column].append(value)
    results.write_table(path, keys, {p: rng.normal(size=len(keys["depth"])) for p in prompts})
    results.write_meta(path, kind="beam", model=model, prompts={p: p for p in prompts})
    return path


def analyze(out: Path, *scores: Path, overwrite: bool = False, **settings) -> dict:
    """`analyze --scores=A,B ... QUICK --out=OUT [--overwrite]` in-process: tests.inproc.analyze with --overwrite,
    `settings` AnalysisConfig flags over QUICK's."""
    from rmjax import data as shipped
    from rmjax.analysis.report import run_analyses
    from rmjax.analysis.spec import AnalysisConfig

    settings = {"models_yaml": str(shipped.REWARD_MODELS_YAML), "frequencies": str(shipped.BNC_FREQUENCIES),
                **QUICK_SETTINGS, **settings}
    if scores:
        settings["scores"] = tuple(str(p) for p in scores)
    return run_analyses(AnalysisConfig(**settings), out, overwrite=overwrite)


def unrendered(monkeypatch) -> None:
    """Each figure of the analyses that follow drawn and named as ever, written as an empty file in place of its
    PNG: rendering is most of a small analysis's time, and tests/test_figures.py renders every figure."""
    from rmjax.analysis import plots

    def drawn(fig, path):
        plots.plt.close(fig)
        Path(path).write_bytes(b"")
        return Path(path)

    monkeypatch.setattr(plots, "_save", drawn)


def manifest(out: Path) -> dict:
    return json.loads((out / "analysis.json").read_text())


def whole(out: Path) -> list[str]:
    """The files of a finished analysis: each listed once, every listed one there, nothing else."""
    listed = manifest(out)
    assert listed["complete"] is True
    assert len(listed["files"]) == len(set(listed["files"])), "one file written twice"
    assert sorted(listed["files"]) == sorted(p.name for p in out.iterdir() if p.name != "analysis.json")
    return listed["files"]


def tau(path: Path) -> float:
    matrix = pd.read_csv(path).set_index("model")
    return float(matrix.iloc[0, 1])


def test_names_that_read_alike_get_files_of_their_own(tmp_path, monkeypatch):
    """1: `a-b`/`a_b` prompts, `my-rm`/`my_rm` models, a prompt called `checkpoints` beside --bigtwo_checkpoints
    and EloEverything files `What is best` / `What is best!` each wrote one file name, the second silently
    replacing the first (the report then quoted the wrong tau). (A figure's file is named as ever: `unrendered`.)"""
    unrendered(monkeypatch)
    rng = np.random.default_rng(0)
    base = rng.normal(size=40)
    cases = {}
    # prompts: a_b has tau +1 between the models, a-b tau -1 (written last, it used to replace a_b's table)
    scores = tmp_path / "prompts"
    scores.mkdir()
    sweep(scores / "m1.csv", {"a_b": base, "a-b": base})
    sweep(scores / "m2.csv", {"a_b": base + 1, "a-b": -base})
    cases["prompts"] = dict(scores=(str(scores),))
    # models: my_rm's beam is read first, my-rm's second
    beams = tmp_path / "models"
    beams.mkdir()
    beam(beams / "a.csv", "my_rm", ["greatest"], seed=1)
    beam(beams / "b.csv", "my-rm", ["greatest"], seed=2)
    cases["models"] = dict(scores=(str(beams),))
    # a prompt whose Big Two figure (bigtwo_<prompt>.png) was the checkpoints figure's name
    clash = tmp_path / "clash"
    clash.mkdir()
    sweep(clash / "m.csv", {"checkpoints": base})
    steps = tmp_path / "steps"
    steps.mkdir()
    for step in (0, 10):
        sweep(steps / f"step_{step}.csv", {"greatest": base + step})
    cases["families"] = dict(scores=(str(clash),), bigtwo_checkpoints=str(steps))
    # EloEverything files whose prompts differ only in punctuation
    elo = tmp_path / "elo"
    elo.mkdir()
    for stem, sign in (("What is best", 1), ("What is best!", -1)):
        pd.DataFrame({"elo_rank": [1, 2, 3, 4], "elo_score": [1500, 1400, 1300, 1200], "name": list("abcd"),
                      "elo_matches": [9] * 4, "m1": [4, 3, 2, 1], "m2": [sign * v for v in (4, 3, 2, 1)]}).to_csv(
            elo / f"{stem}.csv", index=False)
    cases["elo"] = dict(elo=str(elo))

    for case, settings in cases.items():
        out = tmp_path / f"out_{case}"
        analyze(out, **settings)
        files = whole(out)
        if case == "prompts":
            assert tau(out / "paper1_kendall_tau_a_b.csv") == pytest.approx(1.0)
            (other,) = [f for f in files if f.startswith("paper1_kendall_tau_a_b-") and f.endswith(".csv")]
            assert tau(out / other) == pytest.approx(-1.0)
        elif case == "models":
            mine = pd.read_csv(out / "beam_my_rm_depth1_optimal.csv", keep_default_na=False)
            frame = results.read_beam_csv(beams / "a.csv")
            want = frame[(frame["depth"] == 1) & (frame["direction"] == "optimal")].head(3)
            assert mine["decoded"].tolist() == want["decoded"].tolist()
            assert len([f for f in files if f.startswith("beam_my_rm") and "_depth" in f]) == 8
        elif case == "families":
            assert "bigtwo_checkpoints.png" in files
            assert len([f for f in files if f.startswith("bigtwo_checkpoints") and f.endswith(".png")]) == 2
        else:
            ranks = [f for f in files if f.startswith("elo_ranks_what_is_best")]
            assert len(ranks) == 2
            human = {f: pd.read_csv(out / f)["m2_rank"].tolist() for f in ranks}
            assert sorted(human.values()) == [[1.0, 2.0, 3.0, 4.0], [4.0, 3.0, 2.0, 1.0]]


def test_roundtrip_only_is_applied_or_refused(tmp_path):
    """2: --roundtrip_only was said to apply to beam results and log-prob tables it never restricted, and a table
    it emptied gave NaN moments with status 0."""
    base = np.random.default_rng(1).normal(size=40)
    half = (np.arange(40) % 2).astype(int)
    sweep(tmp_path / "none.csv", {"greatest": base, "worst": -base}, roundtrip=np.zeros(40, int))
    sweep(tmp_path / "half.csv", {"greatest": base, "worst": -base}, roundtrip=half)
    beam(tmp_path / "beam.csv", "b", ["greatest"], seed=3)
    for name, kind in (("lp_a", "logprobs"), ("lp_b", "next_token_logprobs")):  # the kind of today, of before
        sweep(tmp_path / f"{name}.csv", {"greatest": base}, kind=kind)
    implicit = dict(implicit_chosen=str(tmp_path / "lp_a.csv"), implicit_reference=str(tmp_path / "lp_b.csv"))
    refused = [
        (dict(scores=(str(tmp_path / "none.csv"),)), ["none.csv", "leaves none of its 40 rows", "greatest, worst"]),
        (dict(scores=(str(tmp_path / "half.csv"), str(tmp_path / "beam.csv"))), ["--roundtrip_only", "beam.csv"]),
        (implicit, ["--roundtrip_only", "implicit"]),
        (dict(elo="builtin"), ["--roundtrip_only", "drop it"]),
    ]
    for i, (settings, fragments) in enumerate(refused):
        out = tmp_path / f"out{i}"
        inproc.refused(partial(analyze, out, roundtrip_only=True, **settings), *fragments)
        assert not out.exists(), settings
    out = tmp_path / "kept"
    analyze(out, tmp_path / "half.csv", roundtrip_only=True)
    moments = pd.read_csv(out / "paper1_moments.csv")
    assert moments["n_tokens"].tolist() == [20, 20]
    assert moments.loc[moments.prompt == "greatest", "mean"].item() == pytest.approx(base[half == 1].mean())


KILL = """
import os, runpy, signal, sys
from rmjax.runs import results
from rmjax.analysis import plots
target = sys.argv.pop(1)

def killed(path):
    path.write_bytes(b"partial")
    os.kill(os.getpid(), signal.SIGKILL)

save, rows = plots._save, results.write_rows
plots._save = lambda fig, path: killed(path) if path.name == target else save(fig, path)
results.write_rows = lambda f, r: killed(__import__("pathlib").Path(f.name)) \\
    if os.path.basename(f.name).startswith("." + target + ".") else rows(f, r)
sys.argv[0] = "analyze"
runpy.run_module("experiments.analyze", run_name="__main__", alter_sys=True)
"""


def test_killed_analysis_is_unfinished_and_overwritten(tmp_path, monkeypatch):
    """3: analyze killed while writing a table (its .tmp left) or a figure (half a PNG, not yet listed) left a
    folder that --overwrite refused as 'files no rmjax analysis wrote'; the folder must say it is unfinished.
    The analysis is killed (SIGKILL) as a command; the same command again, and with --overwrite, run in-process
    (their figures named as ever, no PNG read: `unrendered`; the killed command renders its own)."""
    unrendered(monkeypatch)
    base = np.random.default_rng(2).normal(size=40)
    scores = tmp_path / "scores"
    scores.mkdir()
    for i in range(2):
        sweep(scores / f"m{i}.csv", {"greatest": base * (i + 1), "worst": -base})
    flags = [f"--scores={scores}", *QUICK]
    for target in ("paper1_moments.csv", "paper1_violin_greatest.png"):
        out = tmp_path / target.split(".")[0]
        proc = subprocess.run([sys.executable, "-c", KILL, target, *flags, f"--out={out}"], cwd=cli.REPO,
                              env=cli.ENV, capture_output=True, text=True, timeout=600)
        assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
        assert sorted(p.name for p in out.iterdir()) == [STAGE]  # it writes there until it has written everything
        left = sorted(p.name for p in (out / STAGE).iterdir())
        assert any(name.startswith((target, f".{target}.")) for name in left), left
        assert "report.md" not in left and manifest(out / STAGE)["complete"] is False
        inproc.refused(partial(analyze, out, scores), "unfinished analysis", "--overwrite")
        analyze(out, scores, overwrite=True)
        assert not [name for name in whole(out) if name.endswith(".tmp")]


def test_an_analysis_refused_halfway_leaves_its_folder_as_it_was(tmp_path, monkeypatch):
    """A fault hunt: an input refused only once the analysis writes (one word in the frequency list has no spread
    to z-score; and score tables with no prompt in common, now refused before) came after --overwrite had removed
    the earlier analysis (24 files, none left); without it, a new folder kept half an analysis. Now a run writes
    into a stage and moves its files in once all are written. (Its figures are files like the tables: `unrendered`.)"""
    unrendered(monkeypatch)
    base = np.random.default_rng(5).normal(size=40)
    tables = [sweep(tmp_path / "a.csv", {"best": base}), sweep(tmp_path / "b.csv", {"best": base ** 2})]
    (tmp_path / "bnc.txt").write_text("\tWord\tPoS\t\tFreq\n\tw3\tNoC\t:\t12\t90\t0.9\n", encoding="latin-1")
    late = dict(frequencies=str(tmp_path / "bnc.txt"), frequency_scale="zscore")
    earlier = tmp_path / "earlier"
    analyze(earlier, *tables)
    before = {p.name: p.read_bytes() for p in earlier.iterdir()}
    assert len(before) > 5 and manifest(earlier)["complete"] is True
    inproc.refused(partial(analyze, earlier, *tables, overwrite=True, **late), "no spread to z-score")
    assert {p.name: p.read_bytes() for p in earlier.iterdir()} == before
    fresh = tmp_path / "fresh"
    inproc.refused(partial(analyze, fresh, *tables, **late), "no spread to z-score")
    assert list(fresh.iterdir()) == []
    analyze(fresh, *tables)  # and the folder takes the next analysis as it would an empty one


def test_a_table_whose_token_id_is_no_id_is_refused(tmp_path):
    """A fault hunt: a bare table (no .meta.json, as the published ones) with token_id 'x' or empty stopped in a
    ValueError traceback with a partial folder, and '1.5' was written as token 1 in the top and bottom tables."""
    for bad in ("x", "", "1.5", "-3"):
        path = tmp_path / f"t{len(list(tmp_path.iterdir()))}.csv"
        path.write_text('"token_id","token_name","token_decoded","best"\n1,"a","love",1.5\n'
                        f'{bad},"b","war",-1.0\n3,"c","peace",0.5\n')
        inproc.refused(partial(analyze, tmp_path / "out", path), f"token_id {bad!r} (row 2) is not a token id")
        assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_a_bare_table_with_a_token_id_twice_is_refused(tmp_path):
    """helper-151: a bare table whose rows were appended to itself was read with each token twice (moments over
    twice the tokens, Big Two counts doubled and a smaller p, the shared vocabulary empty), exit 0."""
    path = tmp_path / "twice.csv"
    path.write_text('"token_id","token_name","token_decoded","best"\n1,"a","love",1.5\n2,"b","war",-1.0\n'
                    '3,"c","peace",0.5\n2,"b","war",-1.0\n')
    inproc.refused(partial(analyze, tmp_path / "out", path), "twice.csv: token_id 2 is in 2 rows")
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_unreadable_inputs_and_unwritable_outputs_stop_in_one_line(tmp_path):
    """3: a binary file given to --scores, a header-only table, a model labelled like the matrices' `model`
    column and an --out that cannot be written each gave a traceback or an analysis of nothing."""
    base = np.random.default_rng(3).normal(size=40)
    (tmp_path / "random.csv").write_bytes(np.random.default_rng(0).bytes(3000))
    (tmp_path / "image.csv").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4)
    sweep(tmp_path / "empty.csv", {"greatest": np.zeros(0)})
    models = tmp_path / "models"
    models.mkdir()
    sweep(models / "a.csv", {"greatest": base}, model="model")
    sweep(models / "b.csv", {"greatest": -base}, model="other")
    good = models / "b.csv"
    cases = [
        (tmp_path / "random.csv", None, ["random.csv", "not a text CSV"]),
        (tmp_path / "image.csv", None, ["image.csv", "not a text CSV"]),
        (tmp_path / "empty.csv", None, ["empty.csv", "no rows"]),
        (models, None, ["a.csv", "'model'"]),
        (good, Path("/proc/self"), ["--out=/proc/self", "cannot write"]),
        (good, Path("/proc/rmjax-none/analysis"), ["--out=/proc/rmjax-none/analysis", "cannot write"]),
    ]
    if os.geteuid() != 0:  # root writes in a read-only folder anyway
        locked = tmp_path / "read_only"
        locked.mkdir()
        locked.chmod(0o555)
        cases.append((good, locked, [str(locked), "cannot write"]))
    for i, (scores, out, fragments) in enumerate(cases):  # analyze --scores=SCORES QUICK --out=OUT, in-process
        inproc.refused(partial(analyze, out or tmp_path / f"out{i}", scores), *fragments)


def test_a_dictionary_frequency_list_or_elo_folder_of_the_wrong_kind_stops_in_one_line(tmp_path):
    """A fault hunt's cases: each gave a traceback (a Big Two file of the wrong kind; an Elo folder with no model
    columns, which left a half-written --out), or exit 0 with a NaN table or a 'Skipped' line for a file the user
    named (a --frequencies typo, or a word list read as the BNC list). Each stops before --out exists."""
    table = sweep(tmp_path / "a.csv", {"best": np.arange(40.0), "worst": -np.arange(40.0)})
    (tmp_path / "words.txt").write_text("love\nhate\n")
    (tmp_path / "1_2_all_freq.txt").write_text("\tWord\tPoS\tFreq\tRa\tDisp\n\tthe\tDet\t61847\t100\t0.93\n")
    (tmp_path / "header_only.txt").write_text("\tWord\tPoS\t\tFreq\tRa\tDisp\n")
    (tmp_path / "keys.json").write_text('{"a": 1}')
    (tmp_path / "cat.csv").write_text("word,cat\nsuccess,agency\n")
    (tmp_path / "latin1.csv").write_bytes("word,category\ncaf\xe9,agency\n".encode("latin-1"))
    (tmp_path / "agency.csv").write_text("word,category\nsucc*,agency\n")
    (tmp_path / "elo").mkdir()
    (tmp_path / "elo" / "What is best.csv").write_text("elo_rank,elo_score,name,elo_matches\n1,10,w1,3\n2,9,w2,3\n"
                                                        "3,8,w3,3\n")
    cases = [
        (dict(bigtwo_dictionary=str(tmp_path / "words.txt")), ["words.txt", "not a UTF-8 JSON or CSV"]),
        (dict(bigtwo_dictionary=str(tmp_path / "keys.json")), ["keys.json", "big2a_agen and big2a_comm"]),
        (dict(bigtwo_dictionary=str(tmp_path / "cat.csv")), ["cat.csv", "needs the columns word,category"]),
        (dict(bigtwo_dictionary=str(tmp_path / "latin1.csv")), ["latin1.csv", "not a UTF-8 JSON or CSV"]),
        (dict(bigtwo_dictionary=str(tmp_path / "agency.csv")), ["agency.csv", "no communion words"]),
        (dict(frequencies=str(tmp_path / "typo.txt")), ["--frequencies=", "typo.txt not found"]),
        (dict(frequencies=str(tmp_path / "words.txt")), ["words.txt", "not the header of the BNC list"]),
        # the BNC's frequency-ordered list has no marker column: its Range was read as the frequency
        (dict(frequencies=str(tmp_path / "1_2_all_freq.txt")), ["first line reads 'Word | PoS | Freq | Ra | Disp'",
                                                               "1_1_all_alpha.txt"]),
        (dict(frequencies=str(tmp_path / "header_only.txt")), ["header_only.txt", "no word frequencies read"]),
        # folders where a file belongs: IsADirectoryError tracebacks
        (dict(frequencies=str(tmp_path / "elo")), ["--frequencies=", "is a folder; give the file itself"]),
        (dict(bigtwo_dictionary=str(tmp_path / "elo")), ["--bigtwo_dictionary=", "is a folder"]),
        # a pipe (the shell's <(…)) passed the check to a read that blocks with no writer; now named, never opened
        (dict(bigtwo_dictionary=str(tmp_path / "pipe.csv")), ["--bigtwo_dictionary=", "is not a regular file"]),
    ]
    os.mkfifo(tmp_path / "pipe.csv")
    for i, (settings, fragments) in enumerate(cases):
        inproc.refused(partial(analyze, tmp_path / f"out{i}", table, **settings), *fragments)
        assert not (tmp_path / f"out{i}").exists()
    inproc.refused(partial(analyze, tmp_path / "elo_out", elo=str(tmp_path / "elo"), models_yaml=None, frequencies=None,
                           scores=()), "no model columns")
    assert not (tmp_path / "elo_out").exists()


def test_a_model_of_one_score_or_a_prompt_some_model_lacks_is_named_not_tabled(tmp_path):
    """A constant column ranks nothing: its RBO was a number (the alphabetical tie-break's overlap) beside NaN τ, ρ and
    EPIC; its framing z-scores divided by 0 (NaN correlations, its rankings gone unsaid). A prompt only some models
    have was dropped from every table without a word."""
    rng = np.random.default_rng(5)
    a = sweep(tmp_path / "a.csv", {p: rng.normal(size=40) for p in ("best", "worst", "extra")})
    b = sweep(tmp_path / "b.csv", {"best": np.ones(40), "worst": rng.normal(size=40)})
    analyze(tmp_path / "out", a, b, framing=("best", "worst"))
    rbo = pd.read_csv(tmp_path / "out" / "paper1_rbo_best.csv").set_index("model")
    assert np.isnan(rbo.loc["a", "b"]) and np.isnan(rbo.loc["b", "b"])
    assert rbo.loc["a", "a"] == pytest.approx(1 - 0.9**40)  # RBO@40 of a ranking with itself
    correlations = pd.read_csv(tmp_path / "out" / "paper1_framing_correlations.csv")
    assert list(correlations.model) == ["a"] and np.isfinite(correlations[["pearson", "kendall_tau"]]).all(axis=None)
    report = (tmp_path / "out" / "report.md").read_text()
    assert "framing: b gives one score to every string" in report
    assert "a's prompts extra are not in every --scores table" in report


def test_prompts_and_models_named_like_pandas_attributes(tmp_path, monkeypatch):
    """3: a prompt called `mean` (or `index`, `T`, `values`, `columns`, `shape`) broke the beam tables (the mean
    over prompts took its column); every such name must analyze like any other. The figures are not rendered
    (`unrendered`): a name reaches an image only as a label's text."""
    unrendered(monkeypatch)
    names = ["mean", "index", "T", "values", "columns", "shape"]
    rng = np.random.default_rng(4)
    columns = {name: rng.normal(size=40) for name in names}
    scores = tmp_path / "scores"
    scores.mkdir()
    sweep(scores / "a.csv", columns, model="index")
    sweep(scores / "b.csv", {k: v[::-1].copy() for k, v in columns.items()}, model="T")
    for model, seed in (("values", 5), ("shape", 6)):
        beam(scores / f"beam_{model}.csv", model, ["mean", "index"], seed)
    out = tmp_path / "out"
    analyze(out, scores)
    whole(out)
    moments = pd.read_csv(out / "paper1_moments.csv", keep_default_na=False).set_index(["prompt", "model"])
    for name in names:
        assert float(moments.loc[(name, "index"), "mean"]) == pytest.approx(columns[name].mean())
    top = pd.read_csv(out / "beam_values_depth1_optimal.csv")
    frame = results.read_beam_csv(scores / "beam_values.csv")
    want = frame[(frame["depth"] == 1) & (frame["direction"] == "optimal")].head(3)
    np.testing.assert_allclose(top["mean"], want["mean"], rtol=1e-8)  # the prompt, as written
    np.testing.assert_allclose(top["_mean"], (want["mean"] + want["index"]) / 2, rtol=1e-8)


def test_implicit_takes_only_log_prob_tables(tmp_path):
    """4: --implicit_chosen/--implicit_reference read any score table, so a reward sweep passed as log-probs
    gave an 'implicit RM' of rewards (and one file given twice an implicit RM of zeros)."""
    base = np.random.default_rng(5).normal(size=40) - 5
    sweep(tmp_path / "rewards.csv", {"greatest": base})
    sweep(tmp_path / "bare.csv", {"greatest": base}, kind="next_token_logprobs", meta=False)
    sweep(tmp_path / "lp.csv", {"greatest": base[::-1].copy()}, kind="logprobs")
    cases = [("rewards.csv", "--implicit_chosen", ["experiments.sweep result", "experiments.logprobs"]),
             ("bare.csv", "--implicit_reference", ["bare.csv.meta.json", "experiments.logprobs"]),
             ("lp.csv", "--implicit_chosen", ["one file"])]  # MWLR 0 for every token
    for i, (name, flag, fragments) in enumerate(cases):  # analyze --implicit_chosen=… --implicit_reference=…
        pair = {"--implicit_chosen": tmp_path / "lp.csv", "--implicit_reference": tmp_path / "lp.csv",
                flag: tmp_path / name}
        settings = {k.removeprefix("--"): str(v) for k, v in pair.items()}
        line = inproc.refused(partial(analyze, tmp_path / f"out{i}", **settings), flag, name, *fragments)
        assert "Traceback" not in line


def test_checkpoints_scored_otherwise_are_not_drawn_as_one_curve(tmp_path):
    """A fault hunt: --bigtwo_checkpoints drew one line, exit 0, through tables scored with another template, token
    set or dtype (or not by rmjax at all) beside a run's checkpoints. Each is now refused by name; a later
    checkpoint of the run (other weights, same scoring) is a point of the curve."""
    from rmjax.search.sweep import SweepSpec, run_sweep
    from tests import tiny

    first = tiny.save_reward_model_with_tokenizer(tmp_path / "rm")[1]
    later = cli.copy_folder(first, tmp_path / "later")
    cli.edit_tensor(later, "score.weight", lambda w: -w)  # a later step of the run: other weights
    steps = tmp_path / "steps"

    def score(step: int, model: Path, limit: int = 64, **options) -> Path:
        return run_sweep(SweepSpec(inproc.options(model, steps / f"step_{step}.csv", **options),
                                   inproc.prompts("greatest"), limit=limit))

    score(0, first)
    score(10, later, template="chat")  # what auto renders for this RM (it has a chat template): scored alike
    analyze(tmp_path / "ok", bigtwo_checkpoints=str(steps), bigtwo_dictionary=None)
    assert pd.read_csv(tmp_path / "ok" / "bigtwo_checkpoints.csv").step.tolist() == [0, 10]
    for settings, differ in ((dict(template="plain"), "template"), (dict(limit=32), "limit"),
                             (dict(dtype="bfloat16"), "dtype")):
        odd = score(20, later, **settings)
        inproc.refused(partial(analyze, tmp_path / f"o_{differ}", bigtwo_checkpoints=str(steps),
                               bigtwo_dictionary=None), "--bigtwo_checkpoints=", "step_20.csv", f"another {differ} "
                       "than step_0.csv", "rescore it")
        odd.unlink()
        results.meta_path(odd).unlink()
    # two GGUF checkpoints of one run: a GGUF's tokenizer digest is the file's, as its weights' is (review, helper-110)
    for path in (steps / "step_0.csv", steps / "step_10.csv"):
        meta = results.read_meta(path)
        meta["identity"]["model"]["tokenizer"] = meta["identity"]["model"]["weights"]
        results.meta_path(path).write_text(json.dumps(meta))
    analyze(tmp_path / "gguf", bigtwo_checkpoints=str(steps), bigtwo_dictionary=None)
    assert pd.read_csv(tmp_path / "gguf" / "bigtwo_checkpoints.csv").step.tolist() == [0, 10]
    bare = sweep(steps / "step_20.csv", {"greatest": np.zeros(64)}, meta=False)
    inproc.refused(partial(analyze, tmp_path / "o_bare", bigtwo_checkpoints=str(steps), bigtwo_dictionary=None),
                   f"{bare.name} records no identity", "step_0.csv does", "score every checkpoint")


def test_tables_compared_without_a_prompt_in_common_or_in_two_templates(tmp_path, capsys):
    """A fault hunt: --bigtwo_checkpoints tables with no prompt in common ended in a KeyError traceback (and a
    refused table there was named as a --scores one); log-probs taken under --template=chat for one model and
    plain for the other gave an implicit RM, exit 0, that never said so: each model saw another prompt."""
    base = np.random.default_rng(7).normal(size=40) - 5
    steps = tmp_path / "steps"
    steps.mkdir()
    sweep(steps / "step_1.csv", {"best": base})
    sweep(steps / "step_2.csv", {"worst": base})
    inproc.refused(partial(analyze, tmp_path / "o1", bigtwo_checkpoints=str(steps), bigtwo_dictionary=None),
                   "the --bigtwo_checkpoints tables have no prompt column in common")
    # RBO's settings with one model: RBO compares models, so it was never computed, and they were accepted
    one = sweep(tmp_path / "one.csv", {"best": base})
    inproc.refused(partial(analyze, tmp_path / "o0", one, rbo_p=0.5), "--rbo_p=0.5 sets the rank-biased overlap",
                   "1 score table")
    sweep(steps / "step_2.csv", {"best": base}, kind="logprobs")
    inproc.refused(partial(analyze, tmp_path / "o2", bigtwo_checkpoints=str(steps), bigtwo_dictionary=None),
                   "--bigtwo_checkpoints=", "step_2.csv")
    # --template=auto is chat where the tokenizer has a chat template (its .meta.json records what it renders first)
    head = "<|im_start|>user\n"
    for i, (chosen, reference, differ) in enumerate((
            (("chat", None), ("plain", None), True), (("auto", head), ("auto", None), True),
            (("chat", head), ("auto", head), False), (("plain", head), ("auto", None), False))):
        pair = {}
        for side, (template, rendered) in (("chosen", chosen), ("reference", reference)):
            path = sweep(tmp_path / f"{side}{i}.csv", {"best": base + len(pair)}, kind="logprobs")
            results.write_meta(path, kind="logprobs", model=side, prompts={"best": "Prompt best?"}, template=template,
                               chat_template_head=rendered, identity={"model": side, "template": template})
            pair[f"implicit_{side}"] = str(path)
        report = Path(analyze(tmp_path / f"o3_{i}", **pair)["report"]).read_text()
        said = "different templates (chosen: chat, reference: plain)"
        assert (said in report, said in capsys.readouterr().err) == (differ, differ), (chosen, reference)
    # one --system_prompt for the chosen LM's log-probs and none for the reference's (helper-150): said too
    for i, (systems, differ) in enumerate(((("You hate everything.", None), True), (("Be kind.", "Be kind."), False),
                                           ((None, None), False))):
        pair = {}
        for side, system in zip(("chosen", "reference"), systems, strict=True):
            path = sweep(tmp_path / f"{side}_s{i}.csv", {"best": base + len(pair)}, kind="logprobs")
            results.write_meta(path, kind="logprobs", model=side, prompts={"best": "Prompt best?"}, template="chat",
                               system_prompt=system, identity={"model": side, "template": "chat"})
            pair[f"implicit_{side}"] = str(path)
        report = Path(analyze(tmp_path / f"o4_{i}", **pair)["report"]).read_text()
        said = "different system prompts (chosen: 'You hate everything.', reference: its template's default)"
        assert (said in report, said in capsys.readouterr().err) == (differ, differ), systems



def test_a_prompt_one_input_lacks_is_said_to_be_left_out(tmp_path):
    """A fault hunt: a prompt in the chosen log-probs but not the reference's, in one checkpoint but not another, or
    in no two beam results was left out of every table, exit 0, with nothing under Skipped (score tables said so)."""
    base = np.random.default_rng(8).normal(size=40) - 5
    chosen = sweep(tmp_path / "chosen.csv", {"best": base, "worst": base[::-1].copy()}, kind="logprobs")
    reference = sweep(tmp_path / "reference.csv", {"best": base - 1}, kind="logprobs")
    steps = tmp_path / "steps"
    sweep(steps / "step_0.csv", {"best": base})
    sweep(steps / "step_10.csv", {"best": base + 1, "worst": base})
    beams = [beam(tmp_path / "b1.csv", "m1", ["best"], 1), beam(tmp_path / "b2.csv", "m2", ["worst"], 2)]
    report = Path(analyze(tmp_path / "out", *beams, implicit_chosen=str(chosen), implicit_reference=str(reference),
                          bigtwo_checkpoints=str(steps))["report"]).read_text()
    for said in ("implicit: --implicit_chosen (chosen)'s prompts worst are not in every implicit table",
                 "--bigtwo_checkpoints: step_10.csv's prompts worst are not in every --bigtwo_checkpoints table",
                 "beam Kendall tau: m1's prompts best are not in every beam Kendall tau table",
                 "m2's prompts worst are not in every beam Kendall tau table"):
        assert said in report, said
    assert "best" in pd.read_csv(tmp_path / "out" / "implicit_rm.csv").columns

def test_an_elo_file_too_small_to_rank_or_pair(tmp_path):
    """A fault hunt: an EloEverything file of one item gave every tau, rho, p and z NaN, exit 0 (one of no items
    was refused); one file alone (no pair of prompts) wrote two tables as a 1-byte CSV that pandas cannot read."""
    header = "elo_rank,elo_score,name,elo_matches,org/m\n"
    items = ["1,1600,Water,10,3.0\n", "2,1500,Fire,10,2.0\n", "3,1400,Air,10,1.0\n"]
    one, three = tmp_path / "one", tmp_path / "three"
    for folder, rows in ((one, items[:1]), (three, items)):
        folder.mkdir()
        (folder / "What is best.csv").write_text(header + "".join(rows))
    inproc.refused(partial(analyze, tmp_path / "o1", elo=str(one)), "has 1 item", "at least 3")
    found = analyze(tmp_path / "o3", elo=str(three))
    for path in found["tables"].values():
        assert len(pd.read_csv(path).columns), path  # EmptyDataError on a 1-byte file
    assert "elo_cross_prompt_tau.csv: nothing to tabulate" in Path(found["report"]).read_text()


def test_cut_tables_are_refused_and_bare_ones_warned(tmp_path, capsys):
    """5: a sweep cut to 150 of its 3000 rows, or its last number cut mid-digit, is refused; a table without
    .meta.json (the published RMs') is read with a warning."""
    values = np.random.default_rng(6).normal(size=3000)
    values[-1] = 0.642987728
    full = sweep(tmp_path / "full.csv", {"greatest": values})
    text = full.read_text()
    rows = text.splitlines(keepends=True)
    cut = tmp_path / "cut"
    cut.mkdir()
    variants = {"rows.csv": "".join(rows[:151]), "digits.csv": text.replace("0.642987728\n", "0.64\n")}
    for name, content in variants.items():
        assert content != text
        (cut / name).write_text(content)
        (cut / f"{name}.meta.json").write_text(results.meta_path(full).read_text().replace("full.csv", name))
        inproc.refused(partial(analyze, tmp_path / name, cut / name), f"--scores={cut / name}", "does not match",
                       "bytes")
    bare = tmp_path / "published.csv"
    bare.write_text(text)
    capsys.readouterr()
    analyze(tmp_path / "bare_out", bare)  # analyze --scores=published.csv QUICK, in-process: its stderr
    assert [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("warning: ")] == [
        f"warning: --scores={bare} has no published.csv.meta.json (not written by rmjax, e.g. the published RMs' "
        "tables): its completeness cannot be checked."]


def test_file_parts_are_one_to_one():
    """1, the helper every per-prompt or per-model file name goes through: distinct names never share a part."""
    long = "What is the single thing, person, or concept that humans most prefer"
    names = ["a-b", "a_b", "A_B", "a b", "", "x", "..", "a/b", long, long + " today", long.lower(), "checkpoints",
             "greatest", "Greatest"]
    parts = data.file_parts(names, clashes=lambda slug: slug == "checkpoints")
    assert len(set(parts.values())) == len(names)
    assert parts["a_b"] == "a_b" and parts["x"] == "x" and parts["greatest"] == "greatest"  # readable where they can
    assert parts["checkpoints"].startswith("checkpoints-") and "/" not in parts["a/b"]
    assert data.file_parts(["What is best"]) == {"What is best": "what_is_best"}


def test_overwrite_keeps_what_is_not_ours(tmp_path):
    """3: --overwrite removes only files an analysis listed: not a user's own analysis.json, nor a folder."""
    mine = tmp_path / "json"
    mine.mkdir()
    (mine / "analysis.json").write_text('{"notes": "mine"}')
    listed = tmp_path / "folder"
    listed.mkdir()
    (listed / "analysis.json").write_text('{"files": ["t.csv"], "complete": false}')
    (listed / "t.csv").mkdir()
    for out, name in ((mine, "analysis.json"), (listed, "t.csv")):
        with pytest.raises(OutputExistsError, match=f"no rmjax analysis wrote \\({name}"):
            Outputs(out, overwrite=True)
        assert (out / name).exists()


def test_models_given_by_path_are_named_by_their_folder(tmp_path):
    """A folder's label was cut at its first dot (Skywork-Reward-V2-Llama-3.2-1B and …-3.1-8B both became
    Skywork-Reward-V2-Llama-3, then refused as one model), and two folders named alike were one model."""
    def labels(*models: str) -> list[str]:
        folder = tmp_path / f"s{len(list(tmp_path.iterdir()))}"
        folder.mkdir()
        rng = np.random.default_rng(0)
        paths = [sweep(folder / f"t{i}.csv", {"greatest": rng.normal(size=40)}, model=m) for i, m in enumerate(models)]
        return [t.model for t in data.load_score_tables(paths)]

    assert labels("/m/Skywork-Reward-V2-Llama-3.2-1B", "out/Skywork-Reward-V2-Llama-3.1-8B/") == [
        "Skywork-Reward-V2-Llama-3.2-1B", "Skywork-Reward-V2-Llama-3.1-8B"]
    assert labels("/x/a/model", "/x/b/model", "elo-rm-smollm2-135m") == ["a/model", "b/model", "elo-rm-smollm2-135m"]
    assert labels("models/rm.v2.gguf", "./other/x.y") == ["rm.v2", "x.y"]  # a GGUF file loses its suffix alone
    inproc.refused(lambda: labels("/x/a/model", "/x/a/model"), "same model", "model")


def test_models_typed_alike_whose_records_name_other_contents_are_two_models(tmp_path):
    """Two sweeps each run as --model=rm, from two folders holding different models, were refused as "the same
    model ['rm']" (helper-159): their records' content fingerprints tell them apart, and each is named by its table
    too. Two of one content stay one model, refused."""
    rng = np.random.default_rng(0)

    def table(name: str, weights: str) -> Path:
        path = sweep(tmp_path / f"{name}.csv", {"greatest": rng.normal(size=40)}, model="rm")
        meta = json.loads(results.meta_path(path).read_text())
        meta["identity"] = {"job": "sweep", "model": {"weights": weights, "tokenizer": "t"},
                            "prompts": {"greatest": "Prompt greatest?"}}
        results.meta_path(path).write_text(json.dumps(meta))
        return path

    a, b, c = table("a", "w1"), table("b", "w2"), table("c", "w1")
    assert [t.model for t in data.load_score_tables([a, b])] == [f"rm ({a})", f"rm ({b})"]
    inproc.refused(lambda: data.load_score_tables([a, c]), "same model ['rm']")
    # one model's weights read by two versions of rmjax's loader (`reading`) are one model still
    meta = json.loads(results.meta_path(c).read_text())
    meta["identity"]["model"]["reading"] = 7
    results.meta_path(c).write_text(json.dumps(meta))
    inproc.refused(lambda: data.load_score_tables([a, c]), "same model ['rm']")


def test_the_in_sample_note_reads_the_recipe_the_scoring_job_recorded(rm_folder, tmp_path, monkeypatch):
    """The Elo in-sample note looked for the model's rmjax_training.json by the path the job was given, from the
    analysis's working directory: a model scored by absolute path (or from elsewhere) lost the note. The job now
    records the recipe the checkpoint holds in its .meta.json."""
    import shutil

    from rmjax.analysis.data import ScoreTable
    from rmjax.analysis.elo import table_training
    from rmjax.scoring.texts import ScoreSpec, run_score

    model = tmp_path / "trained"
    shutil.copytree(rm_folder, model)
    (model / "rmjax_training.json").write_text(json.dumps({"recipe": {"elo": "builtin:best"}}))
    out = tmp_path / "scores.csv"
    run_score(ScoreSpec(inproc.options(str(model), out), {"greatest": "What is the greatest thing?"}, ("Love",),
                        z_sample=16))
    assert results.read_meta(out)["training"] == {"elo": "builtin:best"}
    monkeypatch.chdir(tmp_path.parent)  # the analysis runs elsewhere, and the folder has moved since
    model.rename(tmp_path / "moved")
    frame = pd.DataFrame({"text": ["Love"], "greatest": [0.0]})
    assert table_training(ScoreTable("trained", "trained", frame, "text", out)) == "builtin:best"
    # a recorded "none" is the answer; a result written before the meta recorded it asks the model's own record
    results.write_meta(tmp_path / "none.csv", kind="score", model="elo-rm-smollm2-135m", training=None)
    results.write_meta(tmp_path / "old.csv", kind="score", model="elo-rm-smollm2-135m")
    assert table_training(ScoreTable("a", "a", frame, "text", tmp_path / "none.csv")) is None
    assert table_training(ScoreTable("b", "b", frame, "text", tmp_path / "old.csv")) == "builtin"


def test_a_folder_of_beam_runs_reads_each_run_once(tmp_path):
    """A fault hunt: `--scores=DIR` over finished beam runs was refused, 'not a finished rmjax result': a run's
    .completions.csv, which its .meta.json records beside it, was read as a table of its own."""
    for i, model in enumerate(("m1", "m2"), 1):
        path = beam(tmp_path / "runs" / f"{model}.csv", model, ["best"], i)
        extra = path.with_name(path.name + ".completions.csv")
        results.write_table(extra, {"depth": [1], "direction": ["optimal"], "rank": [1]}, {"reward": np.ones(1)})
        results.write_meta(path, files=[extra], kind="beam", model=model, prompts={"best": "best"})
    report = Path(analyze(tmp_path / "out", tmp_path / "runs")["report"]).read_text()
    assert "Kendall tau-b between models" in report
    assert (tmp_path / "out" / "beam_kendall_tau_depth1_best.csv").is_file()


def test_a_sweep_of_part_of_the_vocabulary_is_said_to_be_one(tmp_path, monkeypatch):
    """helper-145: a --limit sweep's report read "Moments of the full score distributions" and nothing said the table
    held part of the vocabulary; its EloEverything agreement was over the few items it scored. Each partial table
    is named with how its tokens were chosen (its .meta.json's identity); a whole-vocabulary sweep is not."""
    unrendered(monkeypatch)
    rng = np.random.default_rng(0)
    tables = {}
    for name, chosen in (("quick", {"limit": 40}), ("picked", {"token_ids": list(range(40))}), ("whole", {})):
        path = sweep(tmp_path / "in" / f"{name}.csv", {"greatest": rng.normal(size=40)})
        identity = {"job": "sweep", "token_ids": None, "limit": None, **chosen}
        results.write_meta(path, kind="sweep", model=name, prompts={"greatest": "Prompt greatest?"},
                           identity=identity, n_candidates=40)
        tables[name] = path
    assert data.candidate_subset(tables["quick"]) == "--limit=40: 40 tokens"
    assert data.candidate_subset(tables["picked"]) == "--token_ids: 40 tokens"
    assert data.candidate_subset(tables["whole"]) is None
    out = tmp_path / "out"
    analyze(out, *tables.values())
    report = (out / "report.md").read_text()
    for name, subset in (("quick", "--limit=40: 40 tokens"), ("picked", "--token_ids: 40 tokens")):
        assert f"- {name} is a sweep of part of its vocabulary ({subset})" in report, report
    assert "whole is a sweep of part" not in report and "full score distributions" not in report


def test_a_framing_the_tables_cannot_give_is_refused_when_asked_for(tmp_path, monkeypatch):
    """helper-145: `--framing=best,nope` ran to the end with exit 0, the framing only listed as skipped in the
    report. Named by the user, it is refused in one line before --out is made; the default framing (best, worst)
    is still skipped where the tables lack its prompts (a table of `greatest` alone here)."""
    rng = np.random.default_rng(0)
    table = sweep(tmp_path / "in" / "m.csv", {"best": rng.normal(size=40), "worst": rng.normal(size=40)})
    (refused,) = cli.run_each(("analyze", f"--scores={table}", "--framing=best,nope", f"--out={tmp_path / 'o'}",
                               *QUICK))
    cli.user_error(refused, "--framing=best,nope: 'nope' is not a prompt of every --scores table",
                   "['best', 'worst']")
    assert not (tmp_path / "o").exists()
    unrendered(monkeypatch)
    only = sweep(tmp_path / "in2" / "g.csv", {"greatest": rng.normal(size=40)})
    done = analyze(tmp_path / "g", only)
    assert any(s.startswith("framing: needs prompts 'best' and 'worst'") for s in done["skipped"]), done["skipped"]


def test_two_tables_of_one_model_are_refused_naming_the_fix(tmp_path):
    """helper-145: a folder of one model's per-prompt sweeps (the README's `<model>_<prompt>.csv` names) was refused
    with "pass one file per model" alone; the line now says how to get one table of all its prompts."""
    from rmjax.errors import UsageError

    rng = np.random.default_rng(0)
    tables = [sweep(tmp_path / "in" / f"m_{p}.csv", {p: rng.normal(size=40)}, model="m") for p in ("best", "worst")]
    with pytest.raises(UsageError, match=r"same model \['m'\]; pass one file per model: sweep a model once with all "
                                         r"its prompts \(--prompts=a,b,…\)"):
        analyze(tmp_path / "o", *tables)
    assert not (tmp_path / "o").exists()
