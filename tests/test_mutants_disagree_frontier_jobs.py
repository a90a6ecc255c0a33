"""Tests that kill the mutants the mutation pass over rmjax/search/disagree_job.py and rmjax/search/frontier_job.py
found surviving: each names the function and the mutant it kills, and compares against an independent reference (the
chunk read back with np.load, a hand-made table, a hand count)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from rmjax.errors import ResumeMismatchError, UsageError
from rmjax.runs.chunks import ChunkStore
from rmjax.runs.options import RunOptions
from rmjax.search import disagree_job, frontier_job
from rmjax.search.disagree_config import DisagreeConfig, DisagreeSpec
from rmjax.search.fluent import FluentConfig
from rmjax.search.frontier_job import FrontierConfig, FrontierSpec

SHARED = pd.DataFrame({"text": ["a", "b", "c"], "token_a": [5, 6, 7], "token_b": [50, 60, 70]})


def _store(tmp_path) -> ChunkStore:
    return ChunkStore(tmp_path / "out.csv", {"job": "test"}, 1)


# --- the vocabulary map's chunk (_read_map) ------------------------------------------------------------------------


def test_a_stored_map_of_another_width_or_with_fractional_token_ids_is_refused(tmp_path):
    """disagree_job._read_map: a chunk of five columns (the four of a map and one more) or whose token pairs are not
    whole numbers is not a map of this run, whatever its first four columns say. Kills `packed.shape[1] == 4` ->
    `>= 4` and dropping the `pairs == np.round(pairs)` test."""
    store = _store(tmp_path)
    good = np.asarray([[2, 1, np.nan, np.nan], [5, 50, 0.25, -1.5], [7, 70, 3.0, 0.125]])
    store.write("m0000", good)
    readable, (ra, rb, layers) = disagree_job._read_map(store, "m0000", SHARED)
    assert readable.text.tolist() == ["a", "c"] and ra.tolist() == [0.25, 3.0] and layers == 1
    wide = np.column_stack([good, np.zeros(3)])
    fractional = good.copy()
    fractional[1, 0] = 5.25  # int() of it is 5: the pair (5, 50) would be read as the string "a"
    for bad in (wide, fractional):
        store.write("m0000", bad)
        with pytest.raises(ResumeMismatchError, match=r"chunk-m0000.npy is not a vocabulary map of this run"):
            disagree_job._read_map(store, "m0000", SHARED)


# --- a unit's chunk (_write, _read) ---------------------------------------------------------------------------------


def _unit() -> disagree_job.Unit:
    ids = np.asarray([[11, 12, 13], [21, 22, 23]], np.int64)
    return disagree_job.Unit("greatest", "b_over_a", "search", ids, np.asarray([0.5, -1.25]), np.asarray([2.0, 3.5]),
                             150.0, 7.25)


def test_a_unit_is_stored_as_its_header_and_rows_and_read_back_as_itself(tmp_path):
    """disagree_job._write then _read: the chunk on disk (np.load of its file) is the header [rows, forwards,
    seconds, NaN…] over [ids, reward A, reward B], and it reads back as the unit written, each reward on its own side
    and forwards apart from seconds. Kills the header's `u.forwards, u.seconds` swapped, _read's `rows[:, n]` and
    `rows[:, n + 1]` swapped and its `packed[0, 1]` and `packed[0, 2]` swapped."""
    store, unit = _store(tmp_path), _unit()
    disagree_job._write(store, "u0003", unit)
    on_disk = np.load(store.dir / "chunk-u0003.npy")
    assert on_disk[0, :3].tolist() == [2.0, 150.0, 7.25] and np.isnan(on_disk[0, 3:]).all()
    assert on_disk[1:].tolist() == [[11, 12, 13, 0.5, 2.0], [21, 22, 23, -1.25, 3.5]]
    back = disagree_job._read(store, "u0003", "greatest", "b_over_a", "search", 3)
    assert back.ids.tolist() == [[11, 12, 13], [21, 22, 23]] and back.ids.dtype == np.int64
    assert back.reward_a.tolist() == [0.5, -1.25] and back.reward_b.tolist() == [2.0, 3.5]
    assert (back.forwards, back.seconds) == (150.0, 7.25)
    assert back.meta() == unit.meta() == {"prompt": "greatest", "direction": "b_over_a", "method": "search",
                                          "rows": 2, "forwards": 150.0, "seconds": 7.25}


def test_a_stored_unit_of_another_width_or_with_a_nan_row_is_refused(tmp_path):
    """disagree_job._read: a unit stored for responses of 3 tokens is not read for 2 (one column too many), and a
    NaN in its first row (not only its last) is refused, naming the chunk to delete. Kills `packed.shape[1] == n + 2`
    -> `>= n + 2` and `np.isfinite(packed[1:])` -> `packed[2:]`."""
    store = _store(tmp_path)
    disagree_job._write(store, "u0000", _unit())
    with pytest.raises(ResumeMismatchError, match=r"chunk-u0000.npy is not a disagreement unit of this run"):
        disagree_job._read(store, "u0000", "greatest", "b_over_a", "search", 2)
    packed = np.load(store.dir / "chunk-u0000.npy")
    packed[1, 4] = np.nan  # side B's reward of the first row
    store.write("u0000", packed)
    with pytest.raises(ResumeMismatchError, match=r"chunk-u0000.npy is not a disagreement unit of this run"):
        disagree_job._read(store, "u0000", "greatest", "b_over_a", "search", 3)


# --- the map's read-back and the yardsticks (_read_back, _yardsticks) -----------------------------------------------


class _ReadBackSide:
    """A side whose read-back keeps the strings of `keep` (by text), recording the ids it was asked about."""

    def __init__(self, keep: set[str], like: bool):
        self.keep, self.like, self.asked = keep, like, []

    def tokens_read_back(self, ids, texts, done):
        self.asked.append(list(ids))
        return np.asarray([t in self.keep for t in texts])

    def reads_like(self, other) -> bool:
        return self.like


@pytest.mark.parametrize("like", [True, False])
def test_the_map_keeps_the_strings_both_sides_read_back_unless_b_reads_as_a(like):
    """disagree_job._read_back with the same ids on both sides: B's mask is taken to be A's only where B reads every
    text as A does (reads_like); else a string B does not read back is left out (the hand-made intersection). Kills
    dropping `p.side_a.reads_like(p.side_b)` from the test."""
    shared = pd.DataFrame({"text": ["a", "b", "c"], "token_a": [5, 6, 7], "token_b": [5, 6, 7]})
    side_a, side_b = _ReadBackSide({"a", "b"}, like), _ReadBackSide({"b", "c"}, like)
    kept = disagree_job._read_back(SimpleNamespace(side_a=side_a, side_b=side_b), shared, {"a": {}, "b": {}})
    assert kept.text.tolist() == (["a", "b"] if like else ["b"])
    assert side_b.asked == ([] if like else [[5, 6, 7]])


def test_each_sides_yardstick_reads_its_own_sides_map_rewards():
    """disagree_job._yardsticks: side A's yardstick is handed the map's rewards of A's tokens (token_a -> reward A),
    side B's those of B's (token_b -> reward B), checked against the hand-made map. Kills the two rewards swapped."""
    shared = pd.DataFrame({"text": ["a", "b"], "token_a": [5, 6], "token_b": [50, 60]})
    handed = {}

    def side(name):
        return SimpleNamespace(yardstick=lambda z, allow, known: handed.setdefault(name, (z, allow, known)))

    p = SimpleNamespace(side_a=side("a"), side_b=side("b"))
    spec = SimpleNamespace(config=SimpleNamespace(z_sample=64), options=SimpleNamespace(allow_nonfinite=True))
    raw = (np.asarray([0.5, 1.5]), np.asarray([-2.0, -3.0]), 1)
    assert disagree_job._yardsticks(p, spec, shared, raw) == (handed["a"], handed["b"])
    assert handed == {"a": (64, True, {5: 0.5, 6: 1.5}), "b": (64, True, {50: -2.0, 60: -3.0})}



def test_a_prompts_stored_map_is_read_not_read_back_and_scored_again(tmp_path):
    """disagree_job._map_of on a rerun: the chunk m0001 on disk is the map of prompt 1 (its rewards come back, the
    prompt itself, None here, is never touched). Kills `store.has(key)` -> never (the whole vocabulary read back and
    scored again on every resume)."""
    store = _store(tmp_path)
    store.write("m0001", np.asarray([[1, 1, np.nan, np.nan], [6, 60, 1.5, -0.5]]))
    readable, (ra, rb, layers) = disagree_job._map_of(store, 1, None, "greatest", SHARED, {"a": {}, "b": {}})
    assert readable.text.tolist() == ["b"] and (ra.tolist(), rb.tolist(), layers) == ([1.5], [-0.5], 1)


# --- a unit's search (_compute) and the job's entry (run_disagree) --------------------------------------------------


class _Built(Exception):
    pass


@pytest.mark.parametrize(("direction", "method", "on_best_of_n", "sign", "screen"), [
    ("a_over_b", "search", False, 1.0, 3), ("b_over_a", "search", False, -1.0, 3),
    ("b_over_a", "best_of_n", False, -1.0, 0), ("a_over_b", "best_of_n", True, 1.0, 3)])
def test_a_unit_searches_its_directions_gap_and_screens_as_asked(monkeypatch, direction, method, on_best_of_n,
                                                                  sign, screen):
    """disagree_job._compute builds its Objective (stubbed, stopping there) with sign +1 for a_over_b and -1 for
    b_over_a (the gap z_A - z_B maximised or minimised), and screens the search always, best-of-N only with
    --screen_best_of_n. Kills `sign` fixed at 1.0 (b_over_a searched as a_over_b) and `method == "search" or
    cfg.screen_best_of_n` -> `and`."""
    built = {}

    def objective(target, prior, lam, sign, *args, **kwargs):
        built.update(sign=sign, screen=kwargs["screen"])
        raise _Built

    monkeypatch.setattr(disagree_job, "Objective", objective)
    monkeypatch.setattr(disagree_job, "_partner", lambda p, allow: None)
    model = object()
    p = SimpleNamespace(target=SimpleNamespace(prefix=[1, 2, 3], suffix=[4, 5], model=model),
                        prior=SimpleNamespace(prefix=[1, 2], model=model),
                        side_b=SimpleNamespace(prefill_forwards=lambda n: 1))
    cfg = DisagreeConfig(forwards=150, screen=3, screen_best_of_n=on_best_of_n)
    spec = SimpleNamespace(config=cfg, search=SimpleNamespace(num_tokens=3), options=SimpleNamespace(
        allow_nonfinite=False))
    with pytest.raises(_Built):
        disagree_job._compute(p, spec, "greatest", direction, method, None)
    assert built == {"sign": sign, "screen": screen}


def test_a_job_whose_options_model_is_not_side_a_is_refused_before_any_config_is_read(tmp_path, monkeypatch):
    """disagree_job.run_disagree: options.model (the model the job's claim and .meta name) other than side A is a
    UsageError naming both, before _check_configs (stubbed to fail) reads a config. Kills the check dropped."""
    monkeypatch.setattr(disagree_job, "_check_configs", lambda *a: pytest.fail("a config was read"))
    spec = DisagreeSpec(RunOptions(model=str(tmp_path / "other"), out=str(tmp_path / "d")),
                        (str(tmp_path / "a"), str(tmp_path / "b")), {"greatest": "G?"}, DisagreeConfig(),
                        FluentConfig())
    with pytest.raises(UsageError, match=r"options.model \(.*other\) is not side A \(.*a\)"):
        disagree_job.run_disagree(spec)


# --- the map's batch (map_batch) ------------------------------------------------------------------------------------


def test_the_map_batch_is_the_smallest_plan_capped_at_map_batch_or_the_given_one_held_to_each_plan(monkeypatch):
    """disagree_job.map_batch with the memory plan stubbed to fit `fits[cfg]`: --batch_size=0 is the least of the
    plans and MAP_BATCH (min by hand); a given --batch_size is handed to every plan (which refuses one that does not
    fit) and kept. Kills `min(MAP_BATCH, ...)` -> `max` and `spec.batch_size or None` -> `None`."""
    asked = []

    def plan(cfg, tokenizer, prompts, template, dtype, mesh, batch_size, held):
        asked.append((cfg, batch_size, held))
        return SimpleNamespace(batch_size=batch_size or {"a": 300, "b": 100, "c": 500}[cfg])

    monkeypatch.setattr(disagree_job, "memory_plan", plan)
    monkeypatch.setattr(disagree_job.memory, "beside", lambda weights, cfg, dtype, mesh: weights)
    options = SimpleNamespace(template="auto", dtype="float32", mesh=None)

    def spec(batch_size):
        return SimpleNamespace(options=options, prompts={"g": "G?"}, batch_size=batch_size)

    assert disagree_job.map_batch(spec(0), [("a", None), ("c", None)], 7) == disagree_job.MAP_BATCH == 256
    assert disagree_job.map_batch(spec(0), [("a", None), ("b", None)], 7) == 100
    assert asked == [("a", None, 7), ("c", None, 7), ("a", None, 7), ("b", None, 7)]
    asked.clear()
    assert disagree_job.map_batch(spec(8), [("a", None), ("b", None)]) == 8
    assert asked == [("a", 8, 0), ("b", 8, 0)]


# --- frontier_job: its settings, its plan and its budget ------------------------------------------------------------


@pytest.mark.parametrize("bad", [{"lambdas": ()}, {"lambdas": (0.0, 1.0, 0.0)}, {"lambdas": (0.0, float("inf"))},
                                 {"lambdas": (float("nan"),)}, {"lambdas": (-0.5,)}, {"z_sample": 1}])
def test_frontier_config_refuses_what_no_search_or_yardstick_can_use(bad):
    """FrontierConfig.__post_init__: no λ, a repeated λ, an infinite or NaN one, a negative one and --z_sample=1 (an
    SD of one value) are refused; λ = 0 and --z_sample=2 are not. Kills dropping `not self.lambdas`, the
    `len(set(...))` test and `np.isfinite(v)`, `v >= 0` -> `v > 0` and Z_SAMPLE's `v >= 2` -> `v >= 1`."""
    with pytest.raises(UsageError):
        FrontierConfig(**bad)
    assert FrontierConfig(lambdas=(0.0, 2.0), z_sample=2).lambdas == (0.0, 2.0)


def test_the_frontier_runs_exactly_one_prompt_and_each_direction_asked():
    """frontier_job.check_one_prompt refuses none and two prompts, takes one; FrontierConfig.directions is both
    directions for `both`, else the one asked. Kills `len(prompts) != 1` -> `> 1` and the directions' mapping."""
    for prompts in ({}, {"a": "A?", "b": "B?"}):
        with pytest.raises(UsageError, match="one prompt per job"):
            frontier_job.check_one_prompt(prompts)
    frontier_job.check_one_prompt({"a": "A?"})
    assert [FrontierConfig(direction=d).directions for d in ("both", "optimal", "pessimal")] == [
        ("optimal", "pessimal"), ("optimal",), ("pessimal",)]


def test_best_of_n_is_paid_every_lambdas_budget_and_a_search_its_own():
    """frontier_job._budget: a search unit gets --forwards, best-of-N len(lambdas) x --forwards (3 x 50 by hand).
    Kills the condition turned to `method == "search"` and the factor dropped."""
    cfg = FrontierConfig(lambdas=(0.0, 1.0, 4.0), forwards=50)
    assert (frontier_job._budget(cfg, "search"), frontier_job._budget(cfg, "best_of_n")) == (50, 150)


def _planned(monkeypatch, cfg: FrontierConfig) -> list[tuple]:
    """compute_units with every model step stubbed: (direction, method, λ, λs of the seeds handed) per unit, in the
    order it ran them; a unit's rows (ids) are its λ, plus 10 if pessimal, so a seed says which unit wrote it."""
    calls = []

    def compute(p, judge, spec, name, direction, method, lam, progress, seeds=None):
        calls.append((direction, method, lam, None if seeds is None else sorted(set(seeds[0].ravel().tolist()))))
        rows = np.full((1, 2), (-1.0 if lam is None else lam) + (10 if direction == "pessimal" else 0))
        return SimpleNamespace(prompt=name, direction=direction, method=method, lam=lam, ids=rows,
                               reward=np.zeros(1), prior_logp=np.zeros(1))

    monkeypatch.setattr(frontier_job, "make_target", lambda rm, text, template: None)
    monkeypatch.setattr(frontier_job, "_reward_scale", lambda rm, target, spec, name: None)
    monkeypatch.setattr(frontier_job, "_prepare", lambda *a: None)
    monkeypatch.setattr(frontier_job, "_compute", compute)
    monkeypatch.setattr(frontier_job, "is_main", lambda: False)
    spec = SimpleNamespace(config=cfg, search=SimpleNamespace(num_tokens=2), prompts={"greatest": "G?"},
                           options=SimpleNamespace(template="auto", allow_nonfinite=False))
    units, _ = frontier_job.compute_units(None, None, None, spec, SimpleNamespace(has=lambda key: False))
    assert len(units) == len(calls)
    return calls


def test_shared_searches_run_from_the_largest_lambda_down_seeded_by_their_own_directions_rows(monkeypatch):
    """frontier_job.compute_units with --share: each direction's searches run λ = 4, 1, 0, each seeded with the rows
    of the larger λs' searches of its own direction (not the other direction's, not best-of-N's), then best-of-N
    unseeded; without --share, the λs in their given order and no seeds (the hand-written plans). Kills `reverse=True`
    dropped, the direction dropped from the seeds' match and `cfg.share and` dropped."""
    shared = [("optimal", "search", 4.0, None), ("optimal", "search", 1.0, [4.0]),
              ("optimal", "search", 0.0, [1.0, 4.0]), ("optimal", "best_of_n", None, None)]
    shared += [("pessimal", "search", 4.0, None), ("pessimal", "search", 1.0, [14.0]),
               ("pessimal", "search", 0.0, [11.0, 14.0]), ("pessimal", "best_of_n", None, None)]
    assert _planned(monkeypatch, FrontierConfig(lambdas=(1.0, 0.0, 4.0), share=True)) == shared
    alone = _planned(monkeypatch, FrontierConfig(lambdas=(1.0, 0.0, 4.0), share=False, direction="pessimal"))
    assert alone == [("pessimal", "search", 1.0, None), ("pessimal", "search", 0.0, None),
                     ("pessimal", "search", 4.0, None), ("pessimal", "best_of_n", None, None)]


def test_the_default_judge_is_of_the_other_family():
    """frontier_job.default_judge: SmolLM2 judges a Gemma RM, Gemma 3 270M a Llama one. Kills the family test
    `startswith("gemma")` turned to another family."""
    assert frontier_job.default_judge(SimpleNamespace(model_type="gemma3_text")) == "smollm2-135m-instruct"
    assert frontier_job.default_judge(SimpleNamespace(model_type="llama")) == "gemma-3-270m"


def test_the_frontier_identity_holds_the_sweeps_bytes_not_its_path(tmp_path):
    """frontier_job.frontier_identity: --sweep enters as the sha1 of its bytes (hashlib over the file), so a sweep
    rewritten in place is a new identity (no reuse of a result computed from the old one). Kills `file_sha1(spec.sweep)`
    -> `spec.sweep`."""
    sweep = tmp_path / "sweep.csv"
    sweep.write_text("token_id,reward\n1,0.5\n")
    spec = FrontierSpec(RunOptions(model="m", out=str(tmp_path / "f")), {"greatest": "G?"}, FrontierConfig(),
                        FluentConfig(), sweep=str(sweep))
    before = frontier_job.frontier_identity(spec, {"w": 1}, None, {"w": 2})
    assert before["sweep"] == hashlib.sha1(sweep.read_bytes()).hexdigest()
    sweep.write_text("token_id,reward\n1,0.75\n")
    assert frontier_job.frontier_identity(spec, {"w": 1}, None, {"w": 2}) != before


@pytest.mark.parametrize(("direction", "lam", "sign", "front"), [("optimal", 0.0, 1.0, 0), ("pessimal", 1.0, -1.0, 5)])
def test_a_searchs_rows_take_pareto_layers_only_at_a_positive_lambda(monkeypatch, direction, lam, sign, front):
    """frontier_job._compute (the Objective and the search stubbed, search_rows stopping there): at λ = 0 (no prior
    term, no fluency to layer by) no Pareto rows are written besides the top, at λ > 0 --front_rows are; the rows are
    ranked with the direction's sign. Kills `cfg.front_rows if lam else 0` -> `cfg.front_rows` and the sign's
    direction test flipped."""
    asked = {}

    def rows(found, top, front_rows, sign, rho):
        asked.update(top=top, front=front_rows, sign=sign)
        raise _Built

    monkeypatch.setattr(frontier_job, "Objective", lambda *a, **k: None)
    monkeypatch.setattr(frontier_job, "fluent_search", lambda *a: None)
    monkeypatch.setattr(frontier_job, "search_rows", rows)
    model = object()
    p = SimpleNamespace(target=SimpleNamespace(prefix=[1, 2, 3], suffix=[4, 5], model=model),
                        prior=SimpleNamespace(prefix=[1, 2], model=model), banned=None, retokenize=[])
    spec = SimpleNamespace(config=FrontierConfig(lambdas=(0.0, 1.0), forwards=100, top=2, front_rows=5),
                           search=FluentConfig(num_tokens=3), options=SimpleNamespace(allow_nonfinite=False))
    with pytest.raises(_Built):
        frontier_job._compute(p, None, spec, "greatest", direction, "search", lam, SimpleNamespace(update=print))
    assert asked == {"top": 2, "front": front, "sign": sign}


def test_the_reward_yardstick_samples_only_tokens_the_tokenizer_has(monkeypatch):
    """frontier_job._reward_scale without --sweep draws its tokens from min(config vocab, len(tokenizer)): 90 here
    (the config's 100 rows include 10 padding rows no text reads). Kills the `len(rm.tokenizer)` bound dropped."""
    drawn = []
    monkeypatch.setattr(frontier_job.finite, "sampled_yardstick", lambda vocab, z, score, allow, fix: drawn.append(
        (vocab, z, allow)))
    rm = SimpleNamespace(config=SimpleNamespace(vocab_size=100), tokenizer=[None] * 90)
    spec = SimpleNamespace(sweep=None, config=FrontierConfig(z_sample=16), options=SimpleNamespace(
        allow_nonfinite=True))
    frontier_job._reward_scale(rm, None, spec, "greatest")
    assert drawn == [(90, 16, True)]


@pytest.mark.parametrize("flag", [True, False])
def test_noretokenize_filter_leaves_the_search_no_round_trip_check(monkeypatch, flag):
    """frontier_job._prepare (every model step stubbed): the prompt's checks are its RetokenizationCheck with
    --retokenize_filter, none with --noretokenize_filter. Kills `[check] if spec.config.retokenize_filter else []`
    -> `[check]` (the flag silently ignored)."""
    monkeypatch.setattr(frontier_job.turns, "end_of_turn", lambda suffix, tokenizer, source: 7)
    monkeypatch.setattr(frontier_job.turns, "banned_with_end", lambda banned, end: banned)
    monkeypatch.setattr(frontier_job, "banned_tokens", lambda tokenizer, vocab, cfg: np.zeros(vocab, bool))
    monkeypatch.setattr(frontier_job.heads, "check_search_keeps_gate", lambda *a: None)
    monkeypatch.setattr(frontier_job.Prior, "of", staticmethod(lambda lm, prefix: "prior"))
    monkeypatch.setattr(frontier_job.chat, "Conversations", lambda *a: None)
    monkeypatch.setattr(frontier_job, "RetokenizationCheck", lambda *a: "check")
    rm = SimpleNamespace(tokenizer=None, source="rm", config=SimpleNamespace(vocab_size=10, head=None))
    spec = SimpleNamespace(prompts={"greatest": "G?"}, options=SimpleNamespace(template="auto"),
                           search=FluentConfig(num_tokens=3), config=FrontierConfig(retokenize_filter=flag))
    prepared = frontier_job._prepare(rm, rm, spec, "greatest", SimpleNamespace(suffix=[1], prefix=[2]), "z")
    assert prepared.retokenize == (["check"] if flag else []) and prepared.banned.shape == (10,)


def test_identities_hold_what_the_inputs_are_not_how_they_were_typed(tmp_path, monkeypatch):
    """A killed disagree, frontier or GCG run given `rm` where it had `/abs/rm` (or `judge/`, `./w.txt`) could not
    resume ("different sides", "judge.spec", "config.init_from.path"), and analyze --disagreements refused seeds run
    from two folders (helper-159): each identity holds a model's content fingerprint and a file's digest. The sides'
    kinds still tell an RM from an implicit pair, and a file's new content is a new identity."""
    from rmjax.search.gcg_config import GCGConfig
    from rmjax.search.gcg_job import gcg_identity
    from rmjax.search.sides import SideSpec

    monkeypatch.chdir(tmp_path)
    for name in ("rm", "other", "lm", "ref", "judge"):
        (tmp_path / name).mkdir()
    # a model's fingerprint is its content's: here the folder it resolves to, however typed
    monkeypatch.setattr(disagree_job, "job_fingerprint", lambda o, m: {"weights": Path(m).resolve().name})

    def disagree(a: str, b: str, judge: str) -> dict:
        spec = DisagreeSpec(RunOptions(model=a, out=str(tmp_path / "d")), (a, b), {"g": "G?"}, DisagreeConfig(),
                            FluentConfig())
        return disagree_job.disagree_identity(spec, (SideSpec.parse(a), SideSpec.parse(b)), judge)

    typed = disagree("rm", "other", "judge")
    assert disagree(str(tmp_path / "rm"), "./other/", f"{tmp_path}/judge/") == typed
    implicit = disagree("rm", "implicit:lm:ref", "judge")
    assert [s["kind"] for s in implicit["sides"]] == ["rm", "implicit"] and implicit != typed
    assert disagree("rm", f"implicit:{tmp_path}/lm:./ref", "judge/") == implicit
    assert disagree("rm", "other", "lm") != typed  # another judge's content
    assert disagree("other", "rm", "judge") != typed  # the sides' order is the direction's meaning
    assert disagree("rm", "implicit:ref:lm", "judge") != implicit  # chosen and reference swapped

    spec = FrontierSpec(RunOptions(model="rm", out=str(tmp_path / "f")), {"g": "G?"}, FrontierConfig(), FluentConfig())
    assert "spec" not in frontier_job.frontier_identity(spec, {"w": 1}, None, {"w": 2})["judge"]

    (tmp_path / "w.txt").write_text(" cat\n dog\n")

    def gcg(path: str) -> dict:
        return gcg_identity([{"w": 1}], dtype="float32", output_column=0, prompts={"g": "G?"},
                            cfg=GCGConfig(vocab_file=path))

    assert gcg("w.txt") == gcg("./w.txt") == gcg(str(tmp_path / "w.txt"))
    before = gcg("w.txt")
    (tmp_path / "w.txt").write_text(" cat\n cow\n")
    assert gcg("w.txt") != before

    from rmjax.runs import results

    def beam(text: str) -> None:  # a finished beam result to start from (its record proves it whole)
        (tmp_path / "b.csv").write_text(text)
        results.write_meta(tmp_path / "b.csv", kind="beam", identity={"job": "beam"})

    def init(path: str) -> dict:
        return gcg_identity([{"w": 1}], dtype="float32", output_column=0, prompts={"g": "G?"},
                            cfg=GCGConfig(init_from=path))

    beam("depth,ids\n1,5\n")
    assert init("b.csv") == init(str(tmp_path / "b.csv")) == init("./b.csv")
    first = init("b.csv")
    beam("depth,ids\n1,6\n")
    assert init("b.csv") != first
