"""Issue 45: every figure the analyses and jobs write, drawn on awkward inputs (long prompt and model names, 12 models,
whitespace-only and leading-space tokens, box-drawing glyphs, U+FFFD), read as a reader sees the saved PNG: no text
leaves the image, every marker kind and median line is explained and a median is not the colour of its box, no tick
label is blank, a glyph is drawn as itself. Each figure is checked as it is saved (Figure.savefig, with the settings
the code passes), so the checks cover exactly what the file shows."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")
import matplotlib.axes  # noqa: E402
import matplotlib.text  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.colors import to_hex, to_rgb  # noqa: E402
from matplotlib.container import ErrorbarContainer  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import FixedLocator  # noqa: E402
from matplotlib.transforms import TransformedBbox  # noqa: E402

from rmjax.analysis import plots  # noqa: E402
from rmjax.inspect import figures as inspect_figures  # noqa: E402
from rmjax.inspect.patching import COMPONENTS  # noqa: E402
from rmjax.runs import results, table_summary  # noqa: E402

PROMPTS = ["What, in one word, is the single greatest thing, person or concept that has ever existed anywhere?",
           "What, in one word, is the worst thing that has ever existed, according to most people alive today?",
           "humans"]
MODELS = [f"Skywork-Reward-Llama-3.1-8B-v0.2-finetune-{i:02d}" for i in range(12)]
BOX = "\u2550\u2550"  # ══
TOKENS = [" ", "   ", "\t", " the", "the ", BOX, "\ufffd", "$5", "wonderful", "a" * 40, "\n", "x"]
TOLERANCE = 2  # pixels: rounding of a saved extent


@dataclasses.dataclass
class Drawn:
    """What one saved figure shows."""

    path: str
    texts: list[str]
    axes_ticks: list[list[str]]  # per axis, the labels of ticks the code placed (set_xticks: tokens, names)
    outside: list[str]  # texts reaching past the saved image
    unexplained: list[tuple]  # marker kinds (marker, colour) no legend names
    medians: list[str]  # median lines: the colour of their box, or never explained

    @property
    def ticks(self) -> list[str]:
        return [t for labels in self.axes_ticks for t in labels]


def _marker_kind(artist) -> tuple | None:
    if isinstance(artist, ErrorbarContainer):
        artist = artist.lines[0]
    if not isinstance(artist, Line2D) or artist.get_marker() in (None, "None", "", " "):
        return None
    return str(artist.get_marker()), to_hex(artist.get_markerfacecolor())


def _explained_kinds(fig: Figure) -> set:
    kinds = set()
    for ax in fig.axes:
        legend = ax.get_legend()
        if legend is None:
            continue
        shown = {t.get_text() for t in legend.get_texts()}
        handles, labels = ax.get_legend_handles_labels()
        kinds |= {_marker_kind(h) for h, label in zip(handles, labels, strict=True) if label in shown}
        kinds |= {_marker_kind(h) for h in legend.legend_handles}
    return kinds


def _saved_area(fig: Figure, renderer, kwargs: dict):
    if kwargs.get("bbox_inches") != "tight":
        return fig.bbox
    pad = kwargs.get("pad_inches", matplotlib.rcParams["savefig.pad_inches"])
    tight = fig.get_tightbbox(renderer, bbox_extra_artists=kwargs.get("bbox_extra_artists"))
    return TransformedBbox(tight.padded(pad), fig.dpi_scale_trans)


def _examine(fig: Figure, kwargs: dict, path, recorded: list) -> Drawn:
    texts: list = []
    real_draw = matplotlib.text.Text.draw

    def draw(self, renderer):
        texts.append(self)
        return real_draw(self, renderer)

    dpi = kwargs.get("dpi", fig.dpi)
    old_dpi = fig.dpi
    fig.set_dpi(dpi)
    matplotlib.text.Text.draw = draw
    try:
        fig.canvas.draw()
    finally:
        matplotlib.text.Text.draw = real_draw
    renderer = fig.canvas.get_renderer()
    area = _saved_area(fig, renderer, kwargs)
    texts = [t for t in texts if t.get_visible() and t.get_text()]
    outside = []
    for t in texts:
        e = t.get_window_extent(renderer)
        if e.x0 < area.x0 - TOLERANCE or e.y0 < area.y0 - TOLERANCE or e.x1 > area.x1 + TOLERANCE \
                or e.y1 > area.y1 + TOLERANCE:
            outside.append(t.get_text())
    drawn = set(map(id, texts))
    axes_ticks = [[label.get_text() for label in axis.get_majorticklabels() if id(label) in drawn]
                  for ax in fig.axes for axis in (ax.xaxis, ax.yaxis)
                  if isinstance(axis.get_major_locator(), FixedLocator)]
    explained = _explained_kinds(fig)
    unexplained = sorted({k for ax in fig.axes for line in ax.lines if line.get_visible() and len(line.get_xdata())
                          for k in [_marker_kind(line)] if k is not None and k not in explained})
    said = " ".join(t.get_text() for t in texts).lower()
    medians = []
    for ax, kind, parts in recorded:
        if ax.figure is not fig:
            continue
        if kind == "box":
            pairs = [(to_rgb(m.get_color()), to_rgb(b.get_facecolor())) for m, b in zip(parts["medians"],
                                                                                          parts["boxes"], strict=True)]
        else:
            lines = parts.get("cmedians")
            pairs = [] if lines is None else [(tuple(to_rgb(c) for c in lines.get_colors())[0],
                                               to_rgb(body.get_facecolor()[0])) for body in parts["bodies"]]
        medians += [f"{kind} median drawn in its box's colour {to_hex(m)}" for m, b in pairs if m == b]
        if pairs and "median" not in said:
            medians.append(f"{kind} median lines, and no text or legend entry says so")
    medians = sorted(set(medians))
    fig.set_dpi(old_dpi)
    return Drawn(str(path), [t.get_text() for t in texts], axes_ticks, outside, unexplained, medians)


@pytest.fixture
def saved(monkeypatch):
    """The Drawn of every figure saved while the test runs (the file is written as usual)."""
    out: list[Drawn] = []
    recorded: list = []
    real_save = Figure.savefig
    real_box, real_violin = matplotlib.axes.Axes.boxplot, matplotlib.axes.Axes.violinplot

    def savefig(self, fname, *args, **kwargs):
        out.append(_examine(self, kwargs, fname, recorded))
        return real_save(self, fname, *args, **kwargs)

    def boxplot(self, *args, **kwargs):
        parts = real_box(self, *args, **kwargs)
        recorded.append((self, "box", parts))
        return parts

    def violinplot(self, *args, **kwargs):
        parts = real_violin(self, *args, **kwargs)
        recorded.append((self, "violin", parts))
        return parts

    monkeypatch.setattr(Figure, "savefig", savefig)
    monkeypatch.setattr(matplotlib.axes.Axes, "boxplot", boxplot)
    monkeypatch.setattr(matplotlib.axes.Axes, "violinplot", violinplot)
    return out


def _readable(drawn: Drawn) -> None:
    problems = []
    if drawn.outside:
        problems.append(f"text cut at the edge: {drawn.outside}")
    if drawn.unexplained:
        problems.append(f"markers no legend names: {drawn.unexplained}")
    problems += drawn.medians
    blank = [t for t in drawn.ticks if any(not line.strip() or line != line.strip() for line in t.split("\n"))]
    if blank:
        problems.append(f"tick labels a reader cannot see: {blank}")
    for labels in drawn.axes_ticks:  # a name cut so that two models read alike
        models = [t for t in labels if t.startswith("Skywork")]
        if len(set(models)) != len(models):
            problems.append(f"models no longer told apart: {models}")
    escaped = [t for t in drawn.texts if "\\u2550" in t or "\\ufffd" in t]
    if escaped:
        problems.append(f"glyphs the font has, written as escapes: {escaped}")
    assert not problems, f"{drawn.path}:\n" + "\n".join(problems)


# --- the analysis figures (rmjax.analysis.plots) -------------------------------------------------------------------

def _rng():
    return np.random.default_rng(0)


def _violin(path):
    plots.violin({m: _rng().normal(size=300) for m in MODELS}, f"Score distributions: {PROMPTS[0]}", path=path)


def _heatmap(path):
    """elo_spearman_to_human: models x prompts, two models marked as trained on the data, the two-line title."""
    index = [f"{m} (trained on this data)" if i < 2 else m for i, m in enumerate(MODELS)]
    grid = pd.DataFrame(_rng().uniform(-1, 1, (12, 3)), index=index, columns=PROMPTS)
    plots.heatmap(grid, "Spearman rho with the human ranking\n(models trained on this data are partly in-sample)",
                  path=path)


def _token_heatmap(path):
    grid = pd.DataFrame(_rng().uniform(0, 1, (12, 12)), index=MODELS, columns=MODELS)
    plots.heatmap(grid, f"kendall tau: {PROMPTS[0]}", vmin=0, vmax=1, path=path)


def _mds(path):
    coords = pd.DataFrame(_rng().normal(size=(12, 2)), index=MODELS, columns=["x", "y"])
    groups = {m: ["Llama-3.1-8B-Instruct", "gemma-2-27b-it", "Qwen2.5-72B"][i % 3] for i, m in enumerate(MODELS)}
    plots.mds_scatter(coords, groups, f"MDS of 1 - Kendall tau: {PROMPTS[0]}", path=path)


def _matrix_panels(path):
    m = {k: pd.DataFrame(_rng().uniform(0, 1, (12, 12)), index=MODELS, columns=MODELS)
         for k in ("base_model", "size", "reward_bench_rank")}
    plots.matrix_panels(m, "RSA theoretical similarity matrices", path=path)


def _framing(path):
    pairs = {m: (_rng().normal(size=200), _rng().normal(size=200)) for m in MODELS}
    plots.framing_scatter(pairs, PROMPTS[0], PROMPTS[1], path=path)


def _sentiment_points() -> pd.DataFrame:
    sentiment = np.tile(np.array([-5, -3, -1, 1, 2, 4]), 20)
    return pd.DataFrame({"sentiment": sentiment, "score": 0.1 * sentiment + _rng().normal(size=len(sentiment))})


def _sentiment_scatter(path):
    plots.sentiment_scatter({m: _sentiment_points() for m in MODELS}, f"Score vs AFINN-111 sentiment: {PROMPTS[0]}",
                            path=path)


def _slopes(path):
    rows = [{"model": m, "prompt": p, "valence": v, "slope": s, "se": 0.1}
            for p in PROMPTS for v in ("positive", "negative") for m, s in zip(MODELS, _rng().normal(size=12),
                                                                                 strict=True)]
    plots.slope_plot(pd.DataFrame(rows), ["prompt", "valence"], "slope", "se", "Score ~ AFINN-111 sentiment, by "
                     "valence", "slope (score per sentiment point)", path=path)


def _trajectories(path):
    names = ["Albert Einstein, theoretical physicist and author of the theory of relativity", *TOKENS[:5]]
    ranks = pd.DataFrame({"name": names, "human_rank": np.arange(1, len(names) + 1, dtype=float)})
    for m in MODELS:
        ranks[f"{m}_rank"] = _rng().permutation(len(names)) + 1.0
    columns = ["human_rank", *(f"{m}_rank" for m in MODELS)]
    labels = ["Human", *(f"{m}\n(rho 0.31, 796 items)" for m in MODELS)]  # as report.elo_section gives them
    items = [(n, ("human_top", "human_bottom", "model_first")[i % 3]) for i, n in enumerate(names)]
    plots.rank_trajectories(ranks, columns, labels, items, f"Rank trajectories: {PROMPTS[0]}", path=path)


def _diverging(path):
    table = pd.DataFrame({"name": TOKENS, "gap": np.linspace(-5, 6, len(TOKENS))})
    plots.diverging_bars(table, "name", "gap", f"Median model rank minus human rank:\n{PROMPTS[0]}", path=path)


def _bigtwo_frame() -> pd.DataFrame:
    return pd.DataFrame({"category": ["agency"] * 30 + ["communion"] * 30, "percentile": _rng().uniform(0, 100, 60)})


def _bigtwo(path):
    plots.bigtwo_boxes({m: _bigtwo_frame() for m in MODELS}, f"Big Two: agency vs communion, {PROMPTS[0]}",
                       path=path)


def _bigtwo_implicit(path):
    """implicit_rm_bigtwo: one 'model', named after both models (the crop of its y-label)."""
    plots.bigtwo_boxes({f"{MODELS[0]} over {MODELS[1]}": _bigtwo_frame()},
                       f"Big Two: agency vs communion, {PROMPTS[0]}", path=path)


def _checkpoints(path):
    frame = pd.DataFrame([{"prompt": p, "step": s, "median_rank_agency": 10.0 + s, "median_rank_communion": 20.0 - s}
                          for p in PROMPTS for s in (0, 100, 200)])
    plots.checkpoint_lines(frame, path=path)


def _top_bottom(path):
    table = pd.DataFrame({"side": ["top"] * 6 + ["bottom"] * 6, "text": TOKENS, "mwlr": np.linspace(3, -3, 12)})
    plots.top_bottom_bars(table, "text", "mwlr", f"Implicit RM, chosen {MODELS[0]} over reference {MODELS[1]}: "
                          f"{PROMPTS[0]}", path=path)


def _frontier(path):
    rows = [{"direction": d, "method": m, "lambda": lam, "judge_ppl": float(p), "reward": float(r)}
            for d in ("optimal", "pessimal") for m, lams in (("search", (0.0, 0.1, 1.0)), ("best_of_n", (0.0,)))
            for lam in lams for p, r in zip(_rng().uniform(2, 500, 8), _rng().normal(size=8), strict=True)]
    fronts = {(d, m): [r for r in rows if r["direction"] == d and r["method"] == m][:3]
              for d in ("optimal", "pessimal") for m in ("search", "best_of_n")}
    samples = [{"direction": d, "judge_ppl": float(p), "reward": float(r)}
               for d in ("optimal", "pessimal") for p, r in zip(_rng().uniform(2, 500, 30), _rng().normal(size=30),
                                                                strict=True)]
    plots.frontier_scatter(rows, fronts, path, samples)  # its best-of-N star and median line need legend entries


ANALYSIS = {"violin": _violin, "heatmap": _heatmap, "heatmap_models": _token_heatmap, "mds": _mds,
            "matrix_panels": _matrix_panels, "framing": _framing, "sentiment_scatter": _sentiment_scatter,
            "slopes": _slopes, "trajectories": _trajectories, "diverging": _diverging, "bigtwo": _bigtwo,
            "bigtwo_implicit": _bigtwo_implicit, "checkpoints": _checkpoints, "top_bottom": _top_bottom,
            "frontier": _frontier}


@pytest.mark.parametrize("name", list(ANALYSIS))
def test_analysis_figure_reads(name, saved, tmp_path):
    ANALYSIS[name](tmp_path / f"{name}.png")
    assert len(saved) == 1 and (tmp_path / f"{name}.png").is_file()
    _readable(saved[0])


def test_token_tick_labels_show_spaces_and_glyphs(saved, tmp_path):
    """Issue 45: a whitespace token was a blank tick label (' ' drawn as nothing) and ' the' lost its space."""
    _diverging(tmp_path / "d.png")
    ticks = saved[0].ticks
    assert "\u2423" in ticks and "\u2423\u2423\u2423" in ticks and "\u2423the" in ticks and "the\u2423" in ticks
    assert BOX in ticks and "\\t" in ticks and "\\n" in ticks


# --- the inspect job's figures --------------------------------------------------------------------------------------

def _inspect_inputs(converged: bool = True):
    vocabulary = [*TOKENS, "\u539f", "<|im_start|>"]
    tok = SimpleNamespace(decode=lambda ids: "".join(vocabulary[i] for i in ids))
    ids = tuple(np.arange(30) % len(vocabulary))
    donor = ids[:20] + tuple((np.arange(10) + 3) % len(vocabulary))
    items = [SimpleNamespace(label=PROMPTS[0] + " " + MODELS[0], ids=ids, start=12),
             SimpleNamespace(label=" ", ids=donor, start=12)]
    layers = 6
    lens = SimpleNamespace(lens=_rng().normal(size=(layers + 1, 2, 1)))
    attributions = [SimpleNamespace(integrated_gradients=_rng().normal(size=30), reward=1.5, baseline_reward=0.2,
                                    relative_gap=0.003, evaluations=64, converged=converged, tolerance=0.01)
                    for _ in items]
    maps = {c: _rng().normal(size=(layers + (c == "residual"), 30)) for c in COMPONENTS}
    patched = SimpleNamespace(maps=maps, clean_reward=1.5, donor_reward=-0.3)
    return items, lens, attributions, patched, items, 0, tok


@pytest.mark.parametrize("converged", [True, False])
def test_inspect_figures_read(converged, saved, tmp_path):
    inspect_figures.write_figures(tmp_path, *_inspect_inputs(converged))
    assert len(saved) == 3
    for drawn in saved:
        _readable(drawn)
    attribution = saved[1].ticks
    assert "\u2423" in attribution and "\u2423the" in attribution and BOX in attribution


# --- the sweep's figure (rmjax.runs.table_summary) ------------------------------------------------------------------

def _sweep_csv(path, roundtrip: bool = True):
    """Three long prompts; the lowest score of each is the byte fragment U+FFFD, which does not round trip."""
    n = 40
    decoded = [*TOKENS, *(f"w{i}" for i in range(n - len(TOKENS)))]
    values = {p: np.linspace(-1, 1, n) + k for k, p in enumerate(PROMPTS)}
    fragment = decoded.index("\ufffd")
    for v in values.values():
        v[fragment] = -10.0
        v[decoded.index(BOX)] = 10.0
    trips = np.array([i != fragment for i in range(n)]) if roundtrip else None
    return results.write_scores_csv(path, np.arange(n), [f"n{i}" for i in range(n)], decoded, values,
                                    roundtrip=trips)


@pytest.mark.parametrize("roundtrip", [True, False])
def test_sweep_figure_reads(roundtrip, saved, tmp_path):
    """Issue 45: the sweep figure wrote '\\u2550\\u2550' for the token ══ and marked the byte fragment U+FFFD (no
    round trip) as the bottom token, without saying so."""
    table_summary.plot_distributions(_sweep_csv(tmp_path / "s.csv", roundtrip))
    (drawn,) = saved
    _readable(drawn)
    marks = [t for t in drawn.texts if t.startswith(("top:", "bottom:"))]
    assert len(marks) == 6
    assert all(BOX in t for t in marks if t.startswith("top:"))
    assert not [t for t in marks if "\ufffd" in t and "round trip" not in t]
    assert any("round trip" in t for t in drawn.texts)  # the figure says what was left unmarked


def test_the_disagreement_figure_marks_each_methods_best_at_the_cap_and_its_best_complete_answer(monkeypatch,
                                                                                               tmp_path):
    """The stars are each method's most disagreeing row at judge perplexity ≤ cap, often a fragment; the summary
    compares complete answers too (helper-161: both stars fragments while best-of-N won among complete answers),
    so each method's most disagreeing complete answer there is marked too: against a brute-force pick."""
    rng = np.random.default_rng(11)
    rows = [{"prompt": "p", "direction": d, "method": m, "z_a": float(a), "z_b": float(b), "gap": float(a - b),
             "judge_ppl": float(ppl), "ends_turn": int(e)}
            for d in ("a_over_b", "b_over_a") for m in ("search", "best_of_n")
            for a, b, ppl, e in zip(rng.normal(size=12), rng.normal(size=12), rng.uniform(10, 300, 12),
                                    rng.random(12) < 0.4, strict=True)]
    figures = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figures.append(fig) or path)
    plots.disagreement_scatter(rows, {}, tmp_path / "d.png", 100.0)
    marked = {}
    for c in figures[0].axes[0].collections:
        kind = {140: "star", 110: "complete"}.get(int(c.get_sizes()[0]))
        if kind:
            marked.setdefault(kind, set()).update(map(tuple, np.asarray(c.get_offsets()).tolist()))
    want = {"star": set(), "complete": set()}
    for d, sign in (("a_over_b", 1.0), ("b_over_a", -1.0)):
        for m in ("search", "best_of_n"):
            under = [r for r in rows if (r["direction"], r["method"]) == (d, m) and r["judge_ppl"] <= 100]
            for kind, pool in (("star", under), ("complete", [r for r in under if r["ends_turn"]])):
                if pool:
                    best = max(pool, key=lambda r: sign * r["gap"])
                    want[kind].add((best["z_b"], best["z_a"]))
    assert marked == want and len(want["complete"]) >= 3 and want["complete"] != want["star"]
