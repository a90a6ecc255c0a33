"""Jobs' leftovers of issue 42: the frontier's NaN gradient, its judge's context, and plan's JSON.

Each test failed on the code before its fix: the frontier's search never proposed a swap whose gradient entry was
NaN/Inf and said nothing (GCG refused, or counted it with --allow_nonfinite); the judge scored a response past its
context at positions it never saw, with exit 0 (and a judge too short for its prompt was refused only after the
search); `plan --out` wrote NaN/Inf (json.dumps) where every other writer refuses them, and wrote in place.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from rmjax.runs import results
from tests import cli, inproc
from tests.test_mutants import overflow_row  # noqa: F401  (the fixture)
from tests.test_safety_jobs import frontier_spec  # the small frontier (responses of N = 2 tokens)

N = 2


def test_the_frontier_refuses_or_counts_swaps_a_nan_gradient_keeps_it_from_proposing(rm_folder, lm_folder, tmp_path,
                                                                                    monkeypatch):
    """'Love' with a NaN in its RM embedding row: the gradient's 'Love' column is NaN at every position, and
    swap_scores sets it to +inf, so the frontier's search never proposed it and said nothing. Now GCG's rule
    (finite.gradient_swaps_skipped): refused in one line naming the token, or with --allow_nonfinite counted (N
    swaps a gradient: one token, every position). The count is saved with its unit: a run killed before writing,
    resumed without the flag, is refused naming the saved unit; resumed with it, .meta.json records the count.
    (The frontier job in-process, as experiments.frontier calls it: test_safety_jobs.frontier_spec.)"""
    from transformers import AutoTokenizer

    from rmjax.search.frontier_job import csv_path, run_frontier

    (love,) = AutoTokenizer.from_pretrained(str(rm_folder))("Love", add_special_tokens=False).input_ids
    rm = cli.copy_folder(rm_folder, tmp_path / "nan_row")
    cli.edit_embedding_row(rm, love, np.nan)

    def frontier(out, allow_nonfinite: bool = False):  # --forwards=80: the search takes GCG steps
        return run_frontier(frontier_spec(rm, lm_folder, out, forwards=80, allow_nonfinite=allow_nonfinite))

    out = tmp_path / "refused"
    line = inproc.refused(lambda: frontier(out), "objective's gradient", f"token {love} ('Love')", "embed",
                          "--allow_nonfinite")
    assert "NaN/Inf at" in line
    assert not csv_path(out).exists()
    out = tmp_path / "allowed"
    with monkeypatch.context() as patch:
        inproc.interrupt_at_finish(patch)
        with pytest.raises(KeyboardInterrupt):
            frontier(out, allow_nonfinite=True)
    assert not csv_path(out).exists()
    inproc.refused(lambda: frontier(out), "search unit saved in", "chunk-u0000.npy", "gradient_swaps_skipped",
                   "--allow_nonfinite")
    frontier(out, allow_nonfinite=True)
    meta = json.loads(results.meta_path(csv_path(out)).read_text())
    units = {u["method"]: u for u in meta["units"]}
    skipped = meta["nonfinite"]["gradient_swaps_skipped"]
    assert skipped > 0 and skipped % N == 0 and units["search"]["gradient_swaps_skipped"] == skipped
    assert "gradient_swaps_skipped" not in units["best_of_n"]  # no gradient
    table = pd.read_csv(csv_path(out), keep_default_na=False)
    assert np.isfinite(table.reward).all() and not any(str(love) in ids.split() for ids in table.ids)


def test_the_frontier_objective_refuses_or_drops_and_counts_a_nan_sequence(overflow_row):  # noqa: F811
    """The frontier ranked a sequence whose reward was NaN last and never said so (GCG refuses it, or drops and
    counts it). Now Objective's scores are held to GCG's rule: refused naming the sequence and where the model
    turns NaN; with allow_nonfinite dropped (J = -inf: never kept or written) and counted; the finite ones keep
    their rewards (against a whole-sequence forward)."""
    from rmjax.errors import NonFiniteError
    from rmjax.loading import load
    from rmjax.search.budget import Forwards
    from rmjax.search.gcg import make_target
    from rmjax.search.objective import Objective
    from rmjax.text import prompts
    from tests.test_safety_packing import _whole_reward

    folder, start, nan = overflow_row
    model = load(str(folder))
    target = make_target(model, prompts.PAPER1["greatest"])
    tail = len(target.suffix)
    cands = np.asarray([[start, start], [start, nan], [nan, start]], np.int32)

    def objective(allow: bool) -> Objective:
        return Objective(target, None, 0.0, 1.0, 0.0, Forwards(10**6, 2 + tail, 2), allow_nonfinite=allow)

    refusing = objective(False)
    with pytest.raises(NonFiniteError, match=rf"2 of 3 are NaN/Inf.*first: response ids \[{start}, {nan}\] "
                                             r"\('NoLove'\).*first non-finite value"):
        refusing.score(cands)
    with pytest.raises(NonFiniteError, match=rf"response ids \[{nan}\] \('Love'\)"):  # a beam's partials too
        refusing.score_partials(cands[2:, :1])
    allowing = objective(True)
    got = allowing.score(cands)
    assert allowing.candidates_dropped == 2
    assert np.isneginf(got.objective[1:]).all() and np.isnan(got.reward[1:]).all()
    want, atol = _whole_reward(model, target, [start, start])
    np.testing.assert_allclose(got.reward[0], want, atol=atol, rtol=0)
    assert got.objective[0] == got.reward[0]  # λ = 0, sign +1
    allowing.score_partials(cands[2:, :1])
    assert allowing.candidates_dropped == 3


def _judge_split(folder) -> tuple[int, int]:
    """The prompt's prefix and suffix lengths in the judge's own template ("auto"), with transformers alone."""
    from transformers import AutoTokenizer

    from rmjax.text.prompts import resolve_prompts

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    marker = "\u0000RESPONSE\u0000"
    text = resolve_prompts(["greatest"], [])["greatest"]
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": text},
                                              {"role": "assistant", "content": marker}], tokenize=False)
    before, after = rendered.split(marker)
    return (len(tokenizer(before, add_special_tokens=False).input_ids),
            len(tokenizer(after, add_special_tokens=False).input_ids))


def _short_context(folder, dst, context: int):
    copy = cli.copy_folder(folder, dst)
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "max_position_embeddings": context}))
    return copy


def test_a_response_past_the_judges_context_is_refused_never_scored(rm_folder, lm_folder, tmp_path, monkeypatch):
    """The judge re-tokenizes each found response after the prompt in its own template; past its context the
    perplexity was read at positions it never saw, with exit 0. A judge with no room for a response is refused
    before any weight loads; one response longer than the room (known once decoded) in one line, no CSV.
    (The frontier job in-process, as experiments.frontier calls it.)"""
    from rmjax.search.frontier_job import csv_path, run_frontier

    prefix, suffix = _judge_split(lm_folder)
    out = tmp_path / "f"
    no_room = _short_context(lm_folder, tmp_path / "no_room", prefix + suffix)
    with monkeypatch.context() as patch:
        inproc.no_weights_read(patch)
        inproc.refused(lambda: run_frontier(frontier_spec(rm_folder, lm_folder, out, judge=no_room, forwards=80)),
                       f"--judge={no_room}", f"needs {prefix + suffix + 1} positions",
                       f"context is {prefix + suffix}")
    context = prefix + suffix + 1  # room for one judge token: some of the 2-token RM responses decode to more
    short = _short_context(lm_folder, tmp_path / "short", context)
    line = inproc.refused(lambda: run_frontier(frontier_spec(rm_folder, lm_folder, out, judge=short, forwards=80)),
                          f"the judge {short}", f"context of {context} positions", "--num_tokens")
    assert f"a prefix of {prefix} and a suffix of {suffix}" in line
    assert not csv_path(out).exists()


def test_the_judges_room_is_its_context_to_the_token(lm_folder):
    """judge_tokens at the boundary (config and tokenizer only: no weights): responses of t judge tokens pass in a
    context of prefix + t + suffix and are refused, naming the longest, in one less."""
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from rmjax.errors import PromptTooLongError
    from rmjax.scoring.judge import judge_tokens
    from rmjax.text.prompts import resolve_prompts

    prefix, suffix = _judge_split(lm_folder)
    tokenizer = AutoTokenizer.from_pretrained(str(lm_folder))
    text = resolve_prompts(["greatest"], [])["greatest"]
    texts = [" the cat sat on the mat", " yes"]
    longest = len(tokenizer(texts[0], add_special_tokens=False).input_ids)

    def judge(context: int):
        return SimpleNamespace(tokenizer=tokenizer, source="tiny-judge",
                               config=SimpleNamespace(max_position_embeddings=context))

    _, rows = judge_tokens(judge(prefix + longest + suffix), text, texts)
    assert [len(r) for r in rows] == [longest, 1]
    with pytest.raises(PromptTooLongError, match=rf"cannot read 1 of 2 responses .*' the cat sat on the mat' is "
                                                 rf"{longest} of its tokens"):
        judge_tokens(judge(prefix + longest + suffix - 1), text, texts)



def test_a_plan_with_a_nonfinite_estimate_is_refused_and_the_old_plan_kept(tmp_path):
    """plan --out wrote json.dumps' bare NaN/Infinity (no strict reader takes it) where every job's writer refuses
    NaN/Inf; and it wrote in place. Now results.dump_json: refused naming the field, an earlier plan left whole,
    a finite plan strict JSON."""
    from rmjax.errors import NonFiniteError
    from rmjax.plan.planner import write

    out = tmp_path / "plans" / "plan.json"
    plan = {"job": "sweep", "chips": 4, "predicted_seconds": 12.5, "per_chip_bytes": {"total": 1024}}
    write(plan, out)
    before = out.read_bytes()
    assert json.loads(before, parse_constant=lambda c: pytest.fail(f"non-strict JSON: {c}")) == plan
    for bad in (float("nan"), float("inf")):
        with pytest.raises(NonFiniteError, match=r"plan\.json: field 'per_chip_bytes\.total'"):
            write({**plan, "per_chip_bytes": {"total": bad}}, out)
        assert out.read_bytes() == before
    assert sorted(p.name for p in out.parent.iterdir()) == ["plan.json"]  # no temp file left


def test_the_wrong_kind_of_model_is_refused_from_its_config_before_any_weight_loads(rm_folder, lm_folder, tmp_path,
                                                                                    monkeypatch):
    """score, audit and GCG read a causal LM's weights (513 MiB for a real one) before saying it has no score head,
    logprobs a reward model's before saying it is one; inspect died with a TypeError in the reward head after
    loading. Each now refuses from the config. GCG's objective is the models' mean, so a model twice is refused."""
    from rmjax.audit.job import AuditSpec, run_audit
    from rmjax.inspect.job import InspectSpec, run_inspect
    from rmjax.scoring.logprobs import LogprobsSpec, run_logprobs
    from rmjax.scoring.texts import ScoreSpec, run_score
    from rmjax.search.gcg_config import GCGConfig
    from rmjax.search.gcg_job import GcgSpec, run_gcg

    inproc.no_weights_read(monkeypatch)
    lm, out = str(lm_folder), tmp_path / "out"
    inproc.refused(lambda: run_score(ScoreSpec(inproc.options(lm, out), inproc.prompts(), ("a",))), "no score head",
                   "text scoring")
    inproc.refused(lambda: run_score(ScoreSpec(inproc.options(lm, None), inproc.prompts(), ("a",))), "no score head")
    inproc.refused(lambda: run_audit(AuditSpec(inproc.options(lm, out))), "no score head", "the audit")
    inproc.refused(lambda: run_gcg(GcgSpec(inproc.options(f"{rm_folder},{lm}", out), inproc.prompts(),
                                           GCGConfig(num_tokens=2, steps=1))), f"{lm} has no score head", "GCG")
    inproc.refused(lambda: run_gcg(GcgSpec(inproc.options(f"{rm_folder},{rm_folder}", out), inproc.prompts(),
                                           GCGConfig(num_tokens=2, steps=1))), "more than once")
    inproc.refused(lambda: run_inspect(InspectSpec(inproc.options(lm, out), ("greatest", "Q?"), responses=("a",))),
                   "no score head", "inspect")
    inproc.refused(lambda: run_logprobs(LogprobsSpec(inproc.options(rm_folder, out), inproc.prompts())),
                   "is a reward model", "causal LM")
    assert not out.exists()
    # a builtin RM passes (its backbone's config, which config_and_tokenizer reads, has no score head): each job
    # goes on to its next check, still before loading
    builtin = "elo-rm-smollm2-135m"
    inproc.refused(lambda: run_score(ScoreSpec(inproc.options(builtin, out), inproc.prompts(), ("a", "a"))),
                   "'a' is given 2 times")
    inproc.refused(lambda: run_inspect(InspectSpec(inproc.options(builtin, out), ("greatest", "Q?"),
                                                   responses=("a", "a"))), "given twice")
    assert not out.exists() or not list(out.iterdir())  # inspect's writable check makes its folder, empty


def test_gcg_over_models_reading_ids_as_different_tokens_is_refused(rm_folder, tmp_path, monkeypatch):
    """GCG averages each candidate's reward over its models as one list of ids: two tokenizers of one size but
    another order (only sizes were compared, after loading) averaged two different responses' rewards, exit 0."""
    from rmjax.search.gcg_config import GCGConfig
    from rmjax.search.gcg_job import GcgSpec, run_gcg

    other = cli.copy_folder(rm_folder, tmp_path / "reordered")
    tokenizer = json.loads((other / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    vocab["Ġcat"], vocab["Ġdog"] = vocab["Ġdog"], vocab["Ġcat"]  # the same tokens, two ids swapped
    (other / "tokenizer.json").write_text(json.dumps(tokenizer))
    inproc.no_weights_read(monkeypatch)
    inproc.refused(lambda: run_gcg(GcgSpec(inproc.options(f"{rm_folder},{other}", tmp_path / "g.json"),
                                           inproc.prompts(), GCGConfig(num_tokens=2, steps=1))),
                   "one vocabulary", f"{other}'s differs")



def test_a_nan_prior_log_prob_is_refused_or_dropped_where_fluency_is_in_j(rm_folder, lm_folder):
    """At λ > 0 the prior's log-prob is a term of J: a NaN one is refused naming that term, or with allow_nonfinite
    dropped (J = -inf) and counted; at λ = 0 it is not in J and the candidate keeps its reward's J."""
    from rmjax.errors import NonFiniteError
    from rmjax.loading import load
    from rmjax.search.budget import Forwards
    from rmjax.search.gcg import make_target
    from rmjax.search.objective import Objective
    from rmjax.search.terms import Prior
    from rmjax.text import prompts

    target = make_target(load(str(rm_folder)), prompts.PAPER1["greatest"])
    prior = Prior.of(load(str(lm_folder)), target.prefix)  # the same tokenizer and template
    words = target.model.tokenizer([" love", " war"], add_special_tokens=False).input_ids
    cands = np.asarray([w[:1] * N for w in words], np.int32)
    known = np.asarray([-1.0, np.nan])

    def objective(lam: float, allow: bool) -> Objective:
        return Objective(target, prior, lam, 1.0, 0.0, Forwards(10**6, N + len(target.suffix), N + 1),
                         allow_nonfinite=allow)

    with pytest.raises(NonFiniteError, match="prior_logp"):
        objective(0.5, False).score(cands, known_logp=known)
    allowing = objective(0.5, True)
    got = allowing.score(cands, known_logp=known)
    assert allowing.candidates_dropped == 1 and np.isneginf(got.objective[1]) and np.isfinite(got.objective[0])
    at_zero = objective(0.0, False)
    got = at_zero.score(cands, known_logp=known)
    assert at_zero.candidates_dropped == 0 and np.array_equal(got.objective, got.reward)
