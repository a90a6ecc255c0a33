"""A NaN candidate never changes the score of a candidate packed beside it (issue 42, found while fixing it).

GCG's and the frontier's candidates run their changed tails packed end to end in one row (prefix.score_variants).
The mask gives a row-mate's keys weight 0, but 0 x NaN is NaN in the weights x values product: a finite candidate
packed beside a NaN one came out NaN, and was then dropped (and counted) as NaN with --allow_nonfinite, or named
first in the refusal without it. The model: tests/test_mutants.py's Gemma 2 whose reward is NaN for 'Love' only.
The references are independent forwards of each whole sequence (no cache, no packing).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from rmjax.errors import NonFiniteError
from rmjax.loading import load
from rmjax.parallel import batching
from rmjax.parallel.distributed import to_host
from rmjax.scoring import calls
from rmjax.scoring.prefix import extend_prefix, pack, score_variants
from rmjax.search.gcg import gcg, make_target
from rmjax.search.gcg_config import GCGConfig
from rmjax.search.objective import Forwards, Objective, Prior
from rmjax.text import prompts
from tests import cli, tolerance
from tests.test_mutants import overflow_row  # noqa: F401  (the fixture)

PROMPT = prompts.PAPER1["greatest"]  # the jobs' default --prompts=greatest


@pytest.fixture(scope="module")
def packed(overflow_row):  # noqa: F811
    """(the loaded model, its target, the ids of 'No' (the start), 'Yes' (finite) and 'Love' (NaN))."""
    from transformers import AutoTokenizer

    folder, start, nan = overflow_row
    (yes,) = AutoTokenizer.from_pretrained(str(folder))("Yes", add_special_tokens=False).input_ids
    model = load(str(folder))
    return folder, model, make_target(model, PROMPT), start, yes, nan


def _whole_reward(model, target, response: list[int]) -> tuple[float, float]:
    """The reward of prompt + response + suffix from one forward of the whole sequence, and its error bound."""
    full = np.asarray([[*target.prefix, *response, *target.suffix]], np.int32)
    mask = np.ones_like(full, bool)
    reward = float(to_host(calls.rewards(model, full, mask))[0, model.output_column])
    return reward, tolerance.rewards_atol(model.params, model.config, full, mask)


def test_a_finite_candidate_packed_beside_a_nan_one_scores_as_alone(packed):
    """'Yes' and 'Love' (one token each after the start 'No') share one row; 'Yes' gets its whole-sequence reward
    and 'Love' stays NaN (a genuine NaN is not hidden)."""
    _, model, target, start, yes, nan = packed
    suffix, current = np.asarray(target.suffix, np.int32), np.asarray([start])
    variants = np.asarray([[yes], [nan]])
    assert pack(np.full(2, 1 + len(suffix)), 2 * (1 + len(suffix))) == [[0, 1]]  # the case: one row
    extended = extend_prefix(model, target.cache, current[None])
    got = score_variants(model, extended, suffix, current, variants, 8)
    want, atol = _whole_reward(model, target, [yes])
    assert np.isnan(got[1])
    np.testing.assert_allclose(got[0], want, atol=atol, rtol=0)  # was NaN


def test_the_objective_scores_a_packed_finite_variant_with_its_prior_term_as_alone(packed):
    """The frontier's objective (the RM its own prior: reward and log-probs from one packed forward): 'Yes No'
    (from position 0) and 'No Love' (from position 1) share a row. 'Yes No' gets its whole-sequence reward and
    mean log-probability; 'No Love' stays NaN."""
    _, model, target, start, yes, nan = packed
    current, cands = np.asarray([start, start]), np.asarray([[yes, start], [start, nan]], np.int32)
    tail = len(target.suffix)
    assert pack(np.asarray([2 + tail, 1 + tail]), 3 + 2 * tail) == [[0, 1]]  # the case: one row
    obj = Objective(target, Prior.of(model, target.prefix), 1.0, 1.0, 0.0, Forwards(10**6, 2 + tail, 2))
    assert obj.rm_is_prior
    _, extended, every = obj.gradient(current)
    got = obj.score(cands, current, extended, every=every)
    reward, atol = _whole_reward(model, target, [yes, start])
    contexts = [list(target.prefix), [*target.prefix, yes]]  # next-token log-probs of 'Yes', then of 'No'
    ids, mask = batching.pad_rows(contexts, side="left")
    lps = to_host(calls.next_token_log_probs(model, ids, mask))
    logp = (float(lps[0, yes]) + float(lps[1, start])) / 2
    lp_atol = tolerance.logprobs_atol(model.params, model.config, ids, mask)
    assert np.isnan(got.reward[1])
    np.testing.assert_allclose(got.reward[0], reward, atol=atol, rtol=0)  # was NaN
    np.testing.assert_allclose(got.prior_logp[0], logp, atol=lp_atol, rtol=0)  # was NaN


def _flags(folder, *ids: int) -> list[str]:
    """One greedy step from 'No' over these tokens: every other allowed token is a candidate, all in one row."""
    return [f"--model={folder}", "--num_tokens=1", "--steps=1", "--selection=greedy", f"--topk={len(ids)}",
            f"--search_width={len(ids)}", f"--token_ids={','.join(map(str, ids))}"]


def test_gcg_drops_and_names_only_the_nan_candidate_of_a_shared_row(packed, tmp_path):
    """One GCG step evaluates 'Yes' and 'Love' in one row: refused naming 'Love', the only NaN one (it named
    'Yes' first, '2 of 2'); with --allow_nonfinite one candidate is dropped, not two, and 'Yes' is in the
    buffer with its whole-sequence reward."""
    folder, model, target, start, yes, nan = packed
    cfg = GCGConfig(num_tokens=1, steps=1, selection="greedy", topk=3, search_width=3, token_ids=(start, yes, nan),
                    template="auto")
    with pytest.raises(NonFiniteError, match=rf"1 of 2 are NaN/Inf.*first: response ids \[{nan}\] \('Love'\)"):
        gcg([target], cfg)
    out = tmp_path / "gcg.json"
    cli.ok(cli.run("gcg", *_flags(folder, start, yes, nan), "--allow_nonfinite", f"--out={out}"))
    meta = json.loads(out.with_name(out.name + ".meta.json").read_text())
    assert meta["nonfinite"] == {"candidates_dropped": 1}  # was 2
    result = json.loads(out.read_text())
    assert result["history"][0]["candidates"] == 2
    rewards = {tuple(entry["ids"]): entry["reward"] for entry in result["buffer"]}
    assert set(rewards) == {(start,), (yes,)}
    want, atol = _whole_reward(model, target, [yes])
    np.testing.assert_allclose(rewards[(yes,)], want, atol=atol, rtol=0)


def test_gcg_counts_the_swaps_a_nan_gradient_keeps_it_from_proposing(overflow_row, tmp_path):  # noqa: F811
    """'Love' with a NaN in its embedding row: its gradient column is NaN at every position, so with
    --allow_nonfinite GCG never proposes it. .meta.json says so (it said nothing): one swap (one position, one
    allowed token) skipped for the one gradient computed."""
    from transformers import AutoTokenizer

    folder, start, nan = overflow_row
    (yes,) = AutoTokenizer.from_pretrained(str(folder))("Yes", add_special_tokens=False).input_ids
    nan_row = cli.copy_folder(folder, tmp_path / "nan_row")

    def poison(table: np.ndarray) -> np.ndarray:
        table = table.copy()
        table[nan, 0] = np.nan
        return table

    cli.edit_tensor(nan_row, "model.embed_tokens.weight", poison)
    out = tmp_path / "gcg.json"
    cli.ok(cli.run("gcg", *_flags(nan_row, start, yes, nan), "--allow_nonfinite", f"--out={out}"))
    meta = json.loads(out.with_name(out.name + ".meta.json").read_text())
    assert meta["nonfinite"] == {"gradient_swaps_skipped": 1}
    result = json.loads(out.read_text())
    assert result["history"][0]["candidates"] == 1  # 'Yes' only: 'Love' never proposed
    assert sorted(entry["ids"] for entry in result["buffer"]) == sorted([[start], [yes]])
