"""Issue 45: report.md as a reader sees it rendered: the beam Kendall tau matrix names its rows, and a token or
response with spaces at its ends (" the", " ") keeps them visible (Markdown trims a table cell and a bare space is
nothing), in every place report.md prints one."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from rmjax.analysis import beams, report
from rmjax.analysis.data import ScoreTable
from rmjax.analysis.files import Outputs
from rmjax.analysis.spec import AnalysisConfig
from rmjax.text.visible import markdown_code, visible

STRINGS = [" the", "  ", "the", "**bold**", "a|b", "`x", "w1", "w2", "w3", "w4"]


def _kendall_tau_b(x, y) -> float:
    """Tau-b by counting pairs (no ties in these inputs): (concordant - discordant) / pairs."""
    pairs = list(itertools.combinations(range(len(x)), 2))
    return sum(np.sign(x[i] - x[j]) * np.sign(y[i] - y[j]) for i, j in pairs) / len(pairs)


def _beam_table(model: str, seed: int) -> beams.BeamTable:
    scores = np.random.default_rng(seed).permutation(len(STRINGS)).astype(float)
    rows = [{"depth": 1, "direction": "optimal" if s >= 5 else "pessimal", "rank": 0, "ids": (i,), "tokens": [t],
             "decoded": t, "greatest": s} for i, (t, s) in enumerate(zip(STRINGS, scores, strict=True))]
    frame = pd.DataFrame(rows)
    for _, part in frame.groupby("direction"):
        frame.loc[part.index, "rank"] = part["greatest"].rank(ascending=part.direction.iloc[0] != "optimal")
    return beams.BeamTable(model, frame.astype({"rank": int}), None)


def _markdown_rows(lines: list[str], after: str) -> list[list[str]]:
    """The cells of the Markdown table that follows the line starting with `after` (header first)."""
    lines = "\n".join(lines).splitlines()  # Outputs.say takes a whole table as one line
    start = next(i for i, line in enumerate(lines) if line.startswith(after))
    table = list(itertools.takewhile(lambda line: line.startswith("|"), lines[start + 2:]))
    return [[c.strip() for c in row.strip("|").split(" | ")] for row in table if not row.startswith("|---")]


def test_beam_tau_matrix_names_its_rows(tmp_path):
    """Issue 45: the beam Kendall tau matrix was printed without its row labels (which model is each row?)."""
    models = ["alpha-rm", "beta-rm", "gamma-rm"]
    tables = [_beam_table(m, seed) for seed, m in enumerate(models)]
    outputs = Outputs(tmp_path / "a")
    beams.beam_section(outputs, tables, top=5)
    header, *rows = _markdown_rows(outputs.lines, "Kendall tau-b between models")
    assert header == ["model", *models]
    assert [row[0] for row in rows] == models
    scores = [t.frame.set_index("decoded")["greatest"].loc[STRINGS].to_numpy() for t in tables]
    for (i, a), (j, b) in itertools.combinations(enumerate(scores), 2):
        assert float(rows[i][1 + j]) == pytest.approx(_kendall_tau_b(a, b), abs=5e-4)  # printed to 3 decimals
        assert float(rows[j][1 + i]) == pytest.approx(_kendall_tau_b(a, b), abs=5e-4)


def test_beam_tables_show_spaces(tmp_path):
    """Issue 45: a decoded sequence ' the' printed into a Markdown cell lost its space (cells are trimmed)."""
    outputs = Outputs(tmp_path / "a")
    beams.beam_section(outputs, [_beam_table("alpha-rm", 0)], top=10)
    decoded = [row[1] for row in _markdown_rows(outputs.lines, "alpha-rm, 1 tokens, optimal")[1:]] + \
        [row[1] for row in _markdown_rows(outputs.lines, "alpha-rm, 1 tokens, pessimal")[1:]]
    assert sorted(decoded) == sorted(["`\u2423the`", "`\u2423\u2423`", "`the`", "`**bold**`", "`a\\|b`", "`` `x ``",
                                      "`w1`", "`w2`", "`w3`", "`w4`"])


def _logprob_table(name: str, probs: list[float]) -> ScoreTable:
    frame = pd.DataFrame({"token_id": range(len(STRINGS)), "token_name": STRINGS, "token_decoded": STRINGS,
                          "greatest": np.log(probs)})
    return ScoreTable(name, name, frame, "token_decoded")


def test_report_lists_show_spaces(tmp_path):
    """Issue 45: the report's top/bottom lists (paper 1, implicit RM) printed ' the' and ' ' by repr, whose spaces
    Markdown collapses; each token is now a code span with its end spaces as ␣."""
    cfg = AnalysisConfig(scores=("unused.csv",), n_boot=2, top=5)
    probs = np.linspace(0.01, 0.1, len(STRINGS))
    chosen, reference = _logprob_table("chosen-lm", probs[::-1]), _logprob_table("reference-lm", probs)
    outputs = Outputs(tmp_path / "a")
    report.implicit_section(outputs, chosen, reference, None, cfg)
    (line,) = [line for line in outputs.lines if line.startswith("- greatest: optimal")]
    assert "`\u2423the`" in line and "`\u2423\u2423`" in line  # chosen gives the first strings more probability
    table = ScoreTable("m", "m", chosen.frame.assign(greatest=np.arange(len(STRINGS), 0, -1.0)), "token_decoded")
    outputs = Outputs(tmp_path / "b")
    report.paper1_analyses(outputs, [table], None, None, None, cfg)
    (line,) = [line for line in outputs.lines if line.startswith("- m: top")]
    assert line.startswith("- m: top `\u2423the`, `\u2423\u2423`, `the`, `**bold**`, `a|b`; bottom `w4`")


def test_visible_and_markdown_code():
    """The escapes against what a reader should see (independent of repr's details where it matters)."""
    assert [visible(s) for s in (" ", "   ", " the", "the ", "a b", "", "\n", "\t", "\u2550\u2550", "\u2423")] == \
        ["\u2423", "\u2423\u2423\u2423", "\u2423the", "the\u2423", "a b", "''", "\\n", "\\t", "\u2550\u2550",
         "\\u2423"]
    assert markdown_code(" a") == "`\u2423a`" and markdown_code("`x`") == "`` `x` ``" and markdown_code("a``b") == \
        "```a``b```"
