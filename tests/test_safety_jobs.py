"""Jobs' flags and numbers (issue 42): one finiteness rule for every number a job writes, and flag values that
used to end in a traceback, a silent NaN or an unclear refusal.

Each test failed on the code before its fix: the frontier wrote NaN reward_z (exit 0) from a yardstick of one
value and ±Inf from one of SD 0; the final writers wrote a NaN or Inf of a derived column; `frontier --forwards=1`
escaped as a BudgetSpent traceback; `--temperature` refused every value below 1; `frontier --num_tokens` past
the context ran on; `--token_ids` past int64 was an OverflowError traceback; a mesh on 3 of 4 devices was refused
without saying that a mesh uses them all.

A refusal that comes before any model loads, and a run whose point is the job's library code, runs in-process
(tests/inproc.py: the entry points only turn flags into the spec these tests build); what only the command line
does (the --temperature and --token_ids flags) stays a command.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rmjax.errors import NonFiniteError, UsageError
from rmjax.runs import results
from rmjax.runs.options import RunOptions
from tests import cli, inproc

# The least budget that buys the tiny frontier's candidates (the starts and best-of-N; no GCG step): what
# test_a_budget_that_buys_no_candidate_is_refused_naming_the_minimum computes
FORWARDS = 34


def frontier_spec(rm, lm, out, *, judge=None, sweep=None, allow_nonfinite: bool = False, num_tokens: int = 2,
                  temperature: float = 1.0, **config):
    """A frontier small enough to run in seconds (one λ, one direction, responses of 2 tokens), as
    experiments.frontier builds it from `--num_tokens=2 --samples=4 --beam=2 --proposals=2 --search_width=8 --topk=4
    --top=2 --lambdas=0 --direction=optimal --z_sample=8 --forwards=34 --prompts=greatest`: the same settings here,
    in test_safety_jobs2 and in test_safety_outputs compile one set of programs."""
    from rmjax.search.fluent import FluentConfig
    from rmjax.search.frontier_job import FrontierConfig, FrontierSpec
    from rmjax.text.prompts import resolve_prompts

    cfg = FrontierConfig(**{"lambdas": (0.0,), "direction": "optimal", "forwards": FORWARDS, "top": 2, "z_sample": 8,
                            **config})
    search = FluentConfig(num_tokens=num_tokens, samples=4, beam=2, proposals=2, search_width=8, topk=4,
                          temperature=temperature)
    return FrontierSpec(RunOptions(model=str(rm), out=str(out), allow_nonfinite=allow_nonfinite),
                        resolve_prompts(["greatest"], []), cfg, search, lm=str(lm), judge=str(judge or lm),
                        sweep=None if sweep is None else str(sweep))


@pytest.fixture(scope="module")
def flat_rm(rm_folder, tmp_path_factory):
    """The tiny RM with a zero reward head: every response scores exactly 0 (single-token rewards of SD 0)."""
    model = cli.copy_folder(rm_folder, tmp_path_factory.mktemp("flat") / "model")
    cli.edit_tensor(model, "score.weight", np.zeros_like)
    return model


def test_a_yardstick_of_fewer_than_two_values_or_sd_zero_is_refused(rm_folder, lm_folder, flat_rm, tmp_path,
                                                                    monkeypatch, capsys):
    """reward_z = (reward - mean) / SD of single-token rewards: --z_sample=1 or a one-token --sweep gave NaN in
    every row and an RM that scores all tokens alike ±Inf, written with exit 0. A --limit sweep's yardstick is
    the first tokens' (said on stderr)."""
    from rmjax.search.frontier_job import csv_path, run_frontier
    from rmjax.search.sweep import SweepSpec, run_sweep

    out = tmp_path / "f"
    sweep = tmp_path / "one.csv"  # `sweep --limit=1 --prompts=greatest`
    run_sweep(SweepSpec(RunOptions(model=str(rm_folder), out=str(sweep)), inproc.prompts("greatest"), limit=1))
    chosen = tmp_path / "chosen.csv"  # `sweep --token_ids=5,6,7 --prompts=greatest`: a chosen set's SD
    run_sweep(SweepSpec(RunOptions(model=str(rm_folder), out=str(chosen)), inproc.prompts("greatest"),
                        token_ids=(5, 6, 7)))
    with monkeypatch.context() as patch:
        inproc.no_weights_read(patch)
        inproc.refused(lambda: frontier_spec(rm_folder, lm_folder, out, z_sample=1), "--z_sample=1", "integer >= 2")
        # a sweep's column is read before any model loads
        inproc.refused(lambda: run_frontier(frontier_spec(rm_folder, lm_folder, out, sweep=sweep)),
                       f"--sweep={sweep}", "1 finite value", "at least 2")
        # was taken: reward_z in SDs of three chosen tokens' rewards, not of the vocabulary's
        inproc.refused(lambda: run_frontier(frontier_spec(rm_folder, lm_folder, out, sweep=chosen)),
                       "scored a chosen set of tokens (--token_ids)")
    assert not csv_path(out).exists()
    first = tmp_path / "first8.csv"  # `sweep --limit=8`: taken, and said to be the first 8 tokens' SD
    run_sweep(SweepSpec(RunOptions(model=str(rm_folder), out=str(first)), inproc.prompts("greatest"), limit=8))
    capsys.readouterr()
    with monkeypatch.context() as patch, pytest.raises(AssertionError, match="a weight was read"):
        inproc.no_weights_read(patch)  # (the note is printed as the sweep is read, before any model loads)
        run_frontier(frontier_spec(rm_folder, lm_folder, out, sweep=first))
    assert (f"--sweep={first} scored only the vocabulary's first 8 tokens: reward_z is in SDs of theirs."
            in capsys.readouterr().err)
    # the sampled yardstick is refused as soon as it is computed: every token scores 0
    line = inproc.refused(lambda: run_frontier(frontier_spec(flat_rm, lm_folder, out)),
                          "--z_sample", "all equal 0", "values that differ")
    assert "8 sampled tokens" in line
    assert not csv_path(out).exists()


def test_the_writers_name_allow_nonfinite_only_for_a_job_that_has_it(tmp_path):
    """analyze (no --allow_nonfinite flag) was told to pass --allow_nonfinite, then refused it as an unknown flag."""
    from rmjax.runs.finiteness import nonfinite_allowed

    def message(**told) -> str:
        with pytest.raises(NonFiniteError) as error:
            results.write_table(tmp_path / "t.csv", {"k": ["a"]}, {"v": np.array([np.nan])}, **told)
        return str(error.value)

    assert "--allow_nonfinite" not in message() and "t.csv was not written: fix the input" in message()
    assert "--allow_nonfinite" in message(allow_nonfinite=False)
    with nonfinite_allowed(False):
        assert "--allow_nonfinite" in message()
    with nonfinite_allowed(False, has_flag=False):  # the audit, which refuses the flag
        assert "--allow_nonfinite" not in message()


def test_the_final_writers_refuse_a_nonfinite_derived_number(tmp_path):
    """A NaN/Inf computed after every score was checked (a z-score, a ratio) reached the CSV as `nan`/`inf` and
    .meta.json as null: the writers themselves now refuse it unless the job allows non-finite values."""
    keys = {"direction": ["optimal", "optimal"], "lambda": [0.0, 1.0]}
    for bad in (np.nan, np.inf, -np.inf):
        with pytest.raises(NonFiniteError, match=r"t\.csv: column 'reward_z' .* row 2 \(direction 'optimal'\)"):
            results.write_table(tmp_path / "t.csv", keys, {"reward": np.ones(2), "reward_z": np.array([0.5, bad])})
        assert not (tmp_path / "t.csv").exists()
    with pytest.raises(NonFiniteError, match="column 'lambda'"):  # a float key column too
        results.write_table(tmp_path / "t.csv", {"lambda": [0.0, math.nan]}, {"reward": np.ones(2)})
    with pytest.raises(NonFiniteError, match=r"field 'summary\.optimal\.hypervolume\.ratio'"):
        results.write_meta(tmp_path / "t.csv", summary={"optimal": {"hypervolume": {"ratio": math.inf}}})
    assert not results.meta_path(tmp_path / "t.csv").exists()
    # a column whose NaN means "no value" says so; an infinity is never one
    results.write_table(tmp_path / "t.csv", keys, {"tau": np.array([0.5, np.nan])}, no_value=["tau"])
    assert (tmp_path / "t.csv").read_text().splitlines()[2].endswith(",nan")
    with pytest.raises(NonFiniteError, match="column 'tau'"):
        results.write_table(tmp_path / "t.csv", keys, {"tau": np.array([0.5, np.inf])}, no_value=["tau"])
    # --allow_nonfinite (a job's, through Job.finish) writes them: the CSV's `nan`, the JSON's null
    from rmjax.runs import finiteness

    with finiteness.nonfinite_allowed(True):
        results.write_table(tmp_path / "t.csv", keys, {"reward_z": np.array([0.5, np.nan])})
        results.write_meta(tmp_path / "t.csv", summary={"ratio": math.inf})
    assert json.loads(results.meta_path(tmp_path / "t.csv").read_text())["summary"] == {"ratio": None}
    with pytest.raises(NonFiniteError):  # and only inside the job that allows them
        results.dump_json({"x": [1.0, math.nan]}, tmp_path / "x.json")
    # inside a tuple or an array too (json_safe would have written a missed NaN as null); an array is its numbers,
    # not the text numpy prints for it
    for where, value in (("x[1]", (1.0, math.nan)), ("x[0][1]", np.array([[1.0, np.inf]]))):
        with pytest.raises(NonFiniteError, match=rf"field '{re.escape(where)}'"):
            results.dump_json({"x": value}, tmp_path / "x.json")
    results.dump_json({"x": np.array([[1.0, 2.5]]), "n": np.arange(2)}, tmp_path / "x.json")
    assert json.loads((tmp_path / "x.json").read_text()) == {"x": [[1.0, 2.5]], "n": [0, 1]}


def test_the_frontier_writer_refuses_nan_reward_z(tmp_path):
    """The frontier's CSV through the shared writer: a unit whose yardstick has no spread cannot be written."""
    from rmjax.search import frontier_out
    from rmjax.search.frontier_job import FrontierConfig
    from rmjax.search.frontier_unit import Unit

    ids = np.array([[5, 6], [7, 8]])
    unit = Unit("greatest", "optimal", "search", 0.0, ids, np.array([0.5, 0.25]), np.array([-3.0, -4.0]),
                np.array([20.0, 30.0]), np.array([True, True]), 10.0, np.zeros((0, 2)),
                (np.float64(0.5), np.float64(0.0)))  # as read back from a unit's chunk
    tokenizer = type("T", (), {"decode": staticmethod(lambda ids: " ".join(map(str, ids)))})()
    cfg = FrontierConfig(lambdas=(0.0,), direction="optimal")
    with np.errstate(divide="ignore", invalid="ignore"):
        rows = frontier_out.rows([unit, dataclasses.replace(unit, method="best_of_n", lam=None)], cfg, tokenizer)
    assert any(math.isnan(r["reward_z"]) for r in rows) and any(math.isinf(r["reward_z"]) for r in rows)
    for r in rows:  # the completion check's columns (frontier_job._complete)
        r.update(ends_turn=1, completed_text=r["text"], completed_reward=r["reward"])
    with pytest.raises(NonFiniteError, match="column 'reward_z'"):
        frontier_out.write(tmp_path / "frontier.csv", rows, {}, [])
    assert not (tmp_path / "frontier.csv").exists()


def _prefix_and_suffix(folder, text: str) -> tuple[int, int]:
    """Prompt positions before and after the response in the folder's chat template, from transformers'
    tokenizer and its own rendering of the template (not rmjax's)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False) if isinstance(folder, (str, Path)) \
        else folder  # a builtin model's tokenizer, as rmjax builds it from its GGUF file
    marker = "\x00RESPONSE\x00"
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": text},
                                              {"role": "assistant", "content": marker}], tokenize=False)
    before, after = rendered.split(marker)
    return (len(tokenizer(before, add_special_tokens=False).input_ids),
            len(tokenizer(after, add_special_tokens=False).input_ids))


def test_a_budget_that_buys_no_candidate_is_refused_naming_the_minimum(rm_folder, lm_folder, tmp_path, monkeypatch):
    """--forwards=1 ended in the search's internal BudgetSpent traceback (the prompt's prefill alone passed it).
    The least budget: the prefill (prefix positions over each model's unit: N + S for the RM, N + 1 for the
    prior, which reads a whole turn's end too) plus one sampled and scored response (2 forwards), and those 2
    within --start_share (0.4) of it."""
    from rmjax.search.frontier_job import csv_path, run_frontier
    from rmjax.text.prompts import resolve_prompts

    text = resolve_prompts(["greatest"], [])["greatest"]
    (rm_prefix, suffix), (lm_prefix, _) = _prefix_and_suffix(rm_folder, text), _prefix_and_suffix(lm_folder, text)
    n = 2
    need = math.ceil(max(Fraction(rm_prefix, n + suffix) + Fraction(lm_prefix, n + 1) + 2, 2 / Fraction(0.4)))
    assert need <= FORWARDS, "FORWARDS, the other frontier runs' budget, buys no candidate"
    out = tmp_path / "f"
    with monkeypatch.context() as patch:
        inproc.no_weights_read(patch)
        for budget in (1, need - 1):
            inproc.refused(lambda b=budget: run_frontier(frontier_spec(rm_folder, lm_folder, out, forwards=b)),
                           f"--forwards={budget}", f"give --forwards={need} or more")
    assert not csv_path(out).exists()
    run_frontier(frontier_spec(rm_folder, lm_folder, out, forwards=need, temperature=0.5))
    table = pd.read_csv(csv_path(out), keep_default_na=False)
    lambdas = len(frontier_spec(rm_folder, lm_folder, out).config.lambdas)  # best-of-N: every λ's budget pooled
    assert set(table.method) == {"search", "best_of_n"} and (table.forwards <= need * lambdas).all()


def test_float_settings_are_positive_numbers_not_integers(tmp_path):
    """`--temperature` (a float) was checked with the integer rule: every value below 1 was refused as "must be
    an integer >= 1". A rule reads as its field's type: POSITIVE is > 0 for a float setting."""
    from rmjax import checks
    from rmjax.search.fluent import FluentConfig

    out = tmp_path / "f"
    line = cli.user_error(cli.run("frontier", "--model=/nonexistent/model", "--temperature=0.5", f"--out={out}"))
    assert "temperature" not in line  # past the flags: the model is what is missing
    inproc.refused(lambda: FluentConfig(temperature=0.0), "--temperature=0.0", "> 0")  # the flag's config
    assert FluentConfig(temperature=0.25).temperature == 0.25

    @dataclasses.dataclass(frozen=True)
    class Settings:
        scale: float = 1.0
        count: int = 1
        maybe: float | None = None

        def __post_init__(self):
            checks.validate(self, {n: checks.POSITIVE for n in ("scale", "count", "maybe")})

    Settings(scale=0.01, maybe=0.5)
    for bad, message in (({"scale": 0.0}, "--scale=0.0: must be > 0"), ({"maybe": -1.0}, "--maybe=-1.0: must be > 0"),
                         ({"count": 0}, "--count=0: must be an integer >= 1")):
        with pytest.raises(UsageError, match=message):
            Settings(**bad)


def test_a_response_past_the_context_is_refused_before_loading(rm_folder, lm_folder, tmp_path, monkeypatch):
    """GCG refused a --num_tokens past the model's context in seconds; the frontier ran on (positions the model
    never saw). Checked for the RM (prefix + N + suffix) and for the prior (prefix + N), from config.json."""
    from rmjax.search.frontier_job import csv_path, run_frontier
    from rmjax.text.prompts import resolve_prompts

    text = resolve_prompts(["greatest"], [])["greatest"]
    prefix, suffix = _prefix_and_suffix(rm_folder, text)
    short = cli.copy_folder(rm_folder, tmp_path / "short")
    config = json.loads((short / "config.json").read_text())
    context = prefix + suffix + 10
    (short / "config.json").write_text(json.dumps({**config, "max_position_embeddings": context}))
    out = tmp_path / "f"
    inproc.no_weights_read(monkeypatch)
    inproc.refused(lambda: run_frontier(frontier_spec(short, lm_folder, out, num_tokens=11)),
                   "--num_tokens=11", f"takes {prefix + suffix} of the model's {context} positions",
                   "--num_tokens=10 or less")
    short_lm = cli.copy_folder(lm_folder, tmp_path / "short_lm")
    config = json.loads((short_lm / "config.json").read_text())
    (short_lm / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 40}))
    inproc.refused(lambda: run_frontier(frontier_spec(rm_folder, short_lm, out, num_tokens=400)),
                   "--num_tokens=400", f"--lm={short_lm}", "of the model's 40 positions")
    assert not csv_path(out).exists()


@pytest.fixture(scope="module")
def int64_runs(rm_folder, tmp_path_factory):
    """{job: (process, --out)} of `JOB --token_ids=1,99999999999999999999` for sweep, beam and gcg, all in one
    interpreter (tests.cli.run_each)."""
    outs = {job: tmp_path_factory.mktemp(job) / "out.csv" for job in ("sweep", "beam", "gcg")}
    procs = cli.run_each(*[(job, f"--model={rm_folder}", "--token_ids=1,99999999999999999999", f"--out={out}")
                           for job, out in outs.items()])
    return {job: (proc, outs[job]) for job, proc in zip(outs, procs, strict=True)}


@pytest.mark.parametrize("job", ["sweep", "beam", "gcg"])
def test_token_ids_past_int64_are_refused_in_one_line(int64_runs, job):
    """An id that no int64 holds was an OverflowError traceback where the job keys its ids (the vocabulary check
    came after). The check is the --token_ids flag's (experiments/token_ids.py), so each job's command line;
    its boundary is checked below."""
    proc, out = int64_runs[job]
    cli.user_error(proc, "99999999999999999999", "64-bit")
    assert not out.exists()


def test_the_token_id_check_ends_at_the_largest_int64(rm_folder, tmp_path, monkeypatch):
    """The flag's check refuses 2**63 and lets the largest int64 through; with it, each job reaches its own
    vocabulary check (no OverflowError on the way), before any weight loads."""
    from absl import flags

    from experiments.token_ids import _token_ids_are_ints
    from rmjax.search.beam import BeamConfig
    from rmjax.search.beam_job import BeamSpec, run_beam
    from rmjax.search.gcg_config import GCGConfig
    from rmjax.search.gcg_job import GcgSpec, run_gcg
    from rmjax.search.sweep import SweepSpec, run_sweep

    with pytest.raises(flags.ValidationError, match=f"token id {2**63} does not fit a 64-bit integer"):
        _token_ids_are_ints(["1", str(2**63)])
    with pytest.raises(flags.ValidationError, match="token id 9{30}… does not fit"):  # int() refuses 4,300+ digits
        _token_ids_are_ints(["9" * 5000])
    assert _token_ids_are_ints(["0" * 30 + "7"])  # leading zeros are no size
    largest = (1, 2**63 - 1)
    assert _token_ids_are_ints([str(t) for t in largest])
    out = tmp_path / "out.csv"
    options, prompts = RunOptions(model=str(rm_folder), out=str(out)), inproc.prompts("greatest")
    inproc.no_weights_read(monkeypatch)
    for job in (lambda: run_sweep(SweepSpec(options, prompts, token_ids=largest)),
                lambda: run_beam(BeamSpec(options, prompts, BeamConfig(), largest)),
                lambda: run_gcg(GcgSpec(options, prompts, GCGConfig(token_ids=largest)))):
        inproc.refused(job, str(2**63 - 1), "outside the vocabulary")
    assert not out.exists()


@pytest.mark.parametrize("job", ["sweep", "beam"])
def test_an_id_past_a_builtin_models_vocabulary_is_refused_before_its_weights(tmp_path, monkeypatch, job):
    """A fault hunt: a builtin (or GGUF) model's tokenizer comes with its weights, so `--token_ids=5,999999` was
    refused only once they had loaded (19 s for elo-rm-gemma3-270m). Now from its config and tokenizer first."""
    from rmjax.search.beam import BeamConfig
    from rmjax.search.beam_job import BeamSpec, run_beam
    from rmjax.search.sweep import SweepSpec, run_sweep

    options, prompts = RunOptions(model="elo-rm-smollm2-135m", out=str(tmp_path / "o.csv")), inproc.prompts()
    inproc.no_weights_read(monkeypatch)
    run = (lambda: run_sweep(SweepSpec(options, prompts, token_ids=(5, 999999)))) if job == "sweep" else (
        lambda: run_beam(BeamSpec(options, prompts, BeamConfig(), (5, 999999))))
    inproc.refused(run, "--token_ids: [999999] are outside the vocabulary")
    assert not (tmp_path / "o.csv").exists()


def test_an_id_past_the_tokenizer_of_a_padded_embedding_is_refused_before_the_weights(tmp_path, monkeypatch):
    """helper-143: an embedding padded past its tokenizer (50,000 rows, 49,152 tokens) took `--token_ids=49500`:
    the row had an empty name, and `--mode=text` wrote the empty response's reward under it (two such ids, the
    same value). The same bound as the whole-vocabulary sweep's (and logprobs'): the tokens both have."""
    from rmjax.search.beam import BeamConfig
    from rmjax.search.beam_job import BeamSpec, run_beam
    from rmjax.search.gcg import GCGConfig
    from rmjax.search.gcg_job import GcgSpec, run_gcg
    from rmjax.search.sweep import SweepSpec, run_sweep
    from tests import tiny

    _, folder = tiny.save_reward_model_with_tokenizer(tmp_path / "padded", vocab_size=50000)
    out = tmp_path / "out.csv"
    options, prompts = RunOptions(model=str(folder), out=str(out)), inproc.prompts("greatest")
    inproc.no_weights_read(monkeypatch)
    past = (5, 49500)
    for job in (lambda: run_sweep(SweepSpec(options, prompts, token_ids=past, mode="text")),
                lambda: run_beam(BeamSpec(options, prompts, BeamConfig(), past)),
                lambda: run_gcg(GcgSpec(options, prompts, GCGConfig(token_ids=past)))):
        inproc.refused(job, "--token_ids: [49500] are outside the vocabulary [0, 49152); the embedding has 50000 "
                            "rows, but ids from 49152 on are past the tokenizer's tokens")
    assert not out.exists()


def test_a_mesh_must_use_every_device_and_the_refusal_says_so():
    """data:3 on 4 devices was refused as "needs 3 devices, 4 available", as if 3 were too few (the mesh of
    --mesh, experiments.common.start, on 4 devices)."""
    import jax

    from rmjax.parallel.sharding import make_mesh

    four = jax.devices()[:4]
    with pytest.raises(ValueError) as error:
        make_mesh("data:3", devices=four)
    for fragment in ("needs 3 devices, 4 available", "must use every device", "data x model = 4",
                     "e.g. --mesh=data:4,model:1"):
        assert fragment in str(error.value)
    with pytest.raises(ValueError, match=r"must use every device.*e\.g\. --mesh=data:2,model:2"):
        make_mesh("data:1,model:2", devices=four)


def test_the_yardstick_is_the_mean_and_sd_of_its_finite_values():
    """finite.yardstick against numpy: NaN/Inf values stop it unless allowed (then left out), and what is left
    must be at least 2 values with an SD > 0."""
    from rmjax.scoring import finite

    rng = np.random.default_rng(7)
    values = rng.normal(3.0, 2.0, size=50)
    kwargs = {"what": "rewards", "row": lambda i: f"token {i}", "fix": "give more"}
    assert finite.yardstick(values, allow=False, **kwargs) == pytest.approx((np.mean(values), np.std(values, ddof=1)),
                                                                             rel=1e-12)
    holed = values.copy()
    holed[[3, 9]] = [np.nan, np.inf]
    with pytest.raises(NonFiniteError, match="token 3"):
        finite.yardstick(holed, allow=False, **kwargs)
    kept = np.delete(values, [3, 9])
    assert finite.yardstick(holed, allow=True, **kwargs) == pytest.approx((kept.mean(), kept.std(ddof=1)), rel=1e-12)
    for few in ([1.5], [], [np.nan, 2.0]):
        with pytest.raises(UsageError, match="at least 2; give more"):
            finite.yardstick(np.array(few), allow=True, **kwargs)
    one_value = np.full(3, 0.1)  # its computed SD is 1.7e-17, not 0: z-scores divided by it reached 1e16
    assert one_value.std(ddof=1) > 0
    with pytest.raises(UsageError, match="all equal 0.1; a z-score needs values that differ; give more"):
        finite.yardstick(one_value, allow=False, **kwargs)
    with pytest.raises(UsageError, match="all equal 0.25"):
        finite.yardstick(np.full(5, 0.25), allow=False, **kwargs)


def test_the_end_of_turn_is_never_a_response_token_under_allow_special(rm_folder, lm_folder, tmp_path):
    """--allow_special stopped banning the end of turn as a token: a sample or swap put it first, an empty turn,
    and the frontier died in a ZeroDivisionError (its repetition share). The other special tokens are allowed."""
    from rmjax.loading import load
    from rmjax.scoring.finite import Scale
    from rmjax.search import frontier_job
    from rmjax.search.gcg import make_target

    spec = frontier_spec(rm_folder, lm_folder, tmp_path / "f", allow_special=True)
    rm, lm = load(str(rm_folder)), load(str(lm_folder))
    target = make_target(rm, spec.prompts["greatest"], spec.options.template)
    prepared = frontier_job._prepare(rm, lm, spec, "greatest", target, Scale(0.0, 1.0, 2))  # no part of the bans
    end = frontier_job.end_of_turn(rm, spec, "greatest")
    special = set(rm.tokenizer.all_special_ids) - {end}
    assert prepared.banned[end] and special and not prepared.banned[sorted(special)].any()


def test_with_the_rm_as_its_own_prior_a_candidate_costs_one_forward_in_the_least_budget():
    """The least budget counted 2 forwards a candidate (a prior's and the RM's) when the RM is its own prior, whose
    sampler's forward scores the sample (1): budgets that buy a candidate were refused. The default RM ties its
    embeddings: its prefill over N + S, plus 1, within --start_share."""
    from rmjax.runs.options import RunOptions
    from rmjax.search.fluent import FluentConfig
    from rmjax.search.frontier_checks import PromptChecks
    from rmjax.text.prompts import resolve_prompts

    text = resolve_prompts(["greatest"], [])["greatest"]
    model = "elo-rm-smollm2-135m"
    from rmjax.loading import config_and_tokenizer

    prefix, suffix = _prefix_and_suffix(config_and_tokenizer(model)[1], text)
    search = FluentConfig(num_tokens=2, start_share=0.4)
    need = math.ceil(max(Fraction(prefix, 2 + suffix) + 1, 1 / Fraction(0.4)))
    checks = PromptChecks(RunOptions(model=model, out=None), search, None, None)
    checks.check(text, need)
    inproc.refused(lambda: checks.check(text, need - 1), f"give --forwards={need} or more")
