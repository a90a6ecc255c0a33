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
from rmjax.search.budget import Forwards
from rmjax.search.gcg import gcg, make_target
from rmjax.search.gcg_config import GCGConfig
from rmjax.search.objective import Objective
from rmjax.search.terms import Prior
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
    obj = Objective(target, Prior.of(model, target.prefix), 1.0, 1.0, 0.0, Forwards(10**6, 2 + tail, 2),
                    allow_nonfinite=True)  # 'No Love' is dropped and counted, not refused
    assert obj.rm_is_prior
    _, extended, every = obj.gradient(current)
    got = obj.score(cands, current, extended, every=every)
    reward, atol = _whole_reward(model, target, [yes, start])
    contexts = [list(target.prefix), [*target.prefix, yes]]  # next-token log-probs of 'Yes', then of 'No'
    ids, mask = batching.pad_rows(contexts, side="left")
    lps = to_host(calls.next_token_log_probs(model, ids, mask))
    logp = (float(lps[0, yes]) + float(lps[1, start])) / 2
    lp_atol = tolerance.logprobs_atol(model.params, model.config, ids, mask)
    assert np.isnan(got.reward[1]) and obj.candidates_dropped == 1
    np.testing.assert_allclose(got.reward[0], reward, atol=atol, rtol=0)  # was NaN
    np.testing.assert_allclose(got.prior_logp[0], logp, atol=lp_atol, rtol=0)  # was NaN


def _gcg_job(folder, out, *ids: int) -> None:
    """`gcg --num_tokens=1 --steps=1 --selection=greedy --topk=N --search_width=N --token_ids=IDS --allow_nonfinite`
    in-process (tests/inproc.py): one greedy step from 'No' over these tokens, every other allowed token a
    candidate, all in one row."""
    from rmjax.search.gcg_job import GcgSpec, run_gcg
    from tests import inproc

    run_gcg(GcgSpec(inproc.options(folder, out, allow_nonfinite=True), inproc.prompts(),
                    GCGConfig(num_tokens=1, steps=1, selection="greedy", topk=len(ids), search_width=len(ids),
                              token_ids=ids)))


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
    _gcg_job(folder, out, start, yes, nan)
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
    cli.edit_embedding_row(nan_row, nan, np.nan)
    out = tmp_path / "gcg.json"
    _gcg_job(nan_row, out, start, yes, nan)
    meta = json.loads(out.with_name(out.name + ".meta.json").read_text())
    assert meta["nonfinite"] == {"gradient_swaps_skipped": 1}
    result = json.loads(out.read_text())
    assert result["history"][0]["candidates"] == 1  # 'Yes' only: 'Love' never proposed
    assert sorted(entry["ids"] for entry in result["buffer"]) == sorted([[start], [yes]])


# Padding: the pad token's row never reaches a real token's result ------------------------------------------------
# A padded key gets attention weight 0, but 0 x NaN is NaN: with the pad token's embedding row NaN/Inf (pad id 0, or
# one that overflows under Gemma's x sqrt(hidden)) every padded row came out NaN, and every prompt cached with left
# padding. Padding now enters the stack as zeros (Transformer.inputs). References: transformers PyTorch forwards of
# each unpadded sequence alone; tolerances from the float32 bound (tests/tolerance.py).

PAD_ROW, NAN_TOKEN = 0, 9  # tiny.PAD; a real token whose row holds a NaN


@pytest.fixture(scope="module")
def bad_pad(tmp_path_factory):
    """{'rm' | 'lm': (the transformers model, the loaded model)}: tiny Gemma 2s whose pad row overflows to inf
    (4.3e37 x 8) and whose token NAN_TOKEN has a NaN in its row."""
    import torch

    from tests import tiny

    built = {}
    for kind, labels in (("rm", 1), ("lm", None)):  # the LM's head untied: its logits never read the bad rows
        hf = tiny.build_hf_model("gemma2", num_labels=labels, seed=3, tie_word_embeddings=False)
        with torch.no_grad():
            table = hf.get_input_embeddings().weight
            table[PAD_ROW] = 0.0
            table[PAD_ROW, 0] = 4.3e37
            table[NAN_TOKEN, 0] = float("nan")
        folder = tiny.save_hf_model(hf, tmp_path_factory.mktemp(f"bad_pad_{kind}"))
        built[kind] = hf, load(str(folder), require_tokenizer=False)
    return built


ROWS = [[5, 6, 7, 8, 10], [5, 6], [11, 12, 13], [5, NAN_TOKEN, 7]]  # widths differ; the last holds a real NaN


def _reward_alone(hf, model, row: list[int]) -> tuple[float, float]:
    """transformers' reward of `row` alone and the float32 bound of the comparison."""
    import torch

    with torch.no_grad():
        want = float(hf(input_ids=torch.tensor([row])).logits[0, 0])
    ids = np.asarray([row], np.int32)
    return want, tolerance.rewards_atol(model.params, model.config, ids, np.ones_like(ids, bool))


@pytest.mark.parametrize("side", ["right", "left"])
def test_padded_rows_score_as_alone_with_a_non_finite_pad_row(bad_pad, side):
    """Rows of different widths padded with the overflowing pad token: each finite row gets its reward alone (the
    padded ones were NaN); the row holding a real NaN token stays NaN."""
    hf, model = bad_pad["rm"]
    ids, mask = batching.pad_rows(ROWS, side=side, pad_id=PAD_ROW)
    got = to_host(calls.rewards(model, ids, mask))[:, 0]
    for i, row in enumerate(ROWS[:-1]):
        want, atol = _reward_alone(hf, model, row)
        np.testing.assert_allclose(got[i], want, atol=atol, rtol=0, err_msg=f"row {i}")
    assert np.isnan(got[-1])


def test_a_left_padded_prefix_cache_with_a_non_finite_pad_row_scores_as_the_whole_sequence(bad_pad):
    """A prompt cached left-padded (prefill_prefix pads to a bucket of 32 with id 0), then right-padded
    continuations after it (rewards_after, as text scoring does) and packed variant tails (score_variants, as GCG
    does): each equals the whole sequence's reward alone (all were NaN); a continuation with a real NaN stays NaN."""
    from rmjax.scoring.prefix import prefill_prefix

    hf, model = bad_pad["rm"]
    prefix = [5, 6, 7]
    cache = prefill_prefix(model, prefix)
    assert cache.k.shape[2] > len(prefix)  # the case: left padding in the cache
    ids, mask = batching.pad_rows(ROWS, pad_id=PAD_ROW)
    got = to_host(calls.rewards_after(model, cache, ids, mask))[:, 0]
    for i, row in enumerate(ROWS[:-1]):
        want, atol = _reward_alone(hf, model, prefix + row)
        np.testing.assert_allclose(got[i], want, atol=atol, rtol=0, err_msg=f"row {i}")
    assert np.isnan(got[-1])
    current, suffix = np.asarray([10, 11, 12]), np.asarray([3, 4], np.int32)
    variants = np.asarray([[10, 11, 13], [14, 11, 12], [10, NAN_TOKEN, 16]])
    scored = score_variants(model, extend_prefix(model, cache, current[None]), suffix, current, variants, 8)
    for i, variant in enumerate(variants[:-1]):
        want, atol = _reward_alone(hf, model, [*prefix, *variant, *suffix])
        np.testing.assert_allclose(scored[i], want, atol=atol, rtol=0, err_msg=f"variant {i}")
    assert np.isnan(scored[-1])


def test_log_probs_of_left_padded_prompts_with_a_non_finite_pad_row_equal_each_alone(bad_pad):
    """The logprobs job's forward (prompts left-padded with the pad id, next-token log-probs at each last token):
    each finite prompt's log-probs equal transformers' for it alone (the padded ones were NaN); a prompt with a real
    NaN token stays NaN."""
    import torch

    hf, model = bad_pad["lm"]
    ids, mask = batching.pad_rows(ROWS, side="left", pad_id=PAD_ROW)
    got = to_host(calls.next_token_log_probs(model, ids, mask))
    for i, row in enumerate(ROWS[:-1]):
        with torch.no_grad():
            want = torch.log_softmax(hf(input_ids=torch.tensor([row])).logits[0, -1].double(), -1).numpy()
        alone = np.asarray([row], np.int32)
        atol = tolerance.logprobs_atol(model.params, model.config, alone, np.ones_like(alone, bool))
        np.testing.assert_allclose(got[i], want, atol=atol, rtol=0, err_msg=f"prompt {i}")
    assert np.isnan(got[-1]).all()


def test_score_texts_with_an_overflowing_pad_row_refuses_only_the_nan_text(overflow_row, tmp_path):  # noqa: F811
    """The score job's path (prompt cached left-padded, responses right-padded in one batch) on the Gemma 2 whose
    'Love' overflows, its pad row 0 made to overflow too: refused naming 'Love' alone, '1 of 3' (it was 3 of 3);
    with --allow_nonfinite the other two equal their whole sequences' rewards."""
    from rmjax.scoring.texts import TextScorer, score_texts

    folder, _, _ = overflow_row
    bad = cli.copy_folder(folder, tmp_path / "pad_overflows")
    cli.edit_embedding_row(bad, PAD_ROW, 4.3e37, zero_rest=True)
    model, texts = load(str(bad)), ["Yes", "No thanks", "Love"]
    full = TextScorer(model, PROMPT).token_ids(texts)
    assert len({len(f) for f in full}) > 1 and PAD_ROW not in {t for f in full for t in f}  # the case: padding
    with pytest.raises(NonFiniteError, match=r"1 of 3 are NaN/Inf.*first: text 'Love'"):
        score_texts(model, {"greatest": PROMPT}, texts)
    got = score_texts(model, {"greatest": PROMPT}, texts, allow_nonfinite=True)["greatest"]
    for i in (0, 1):
        ids = np.asarray([full[i]], np.int32)
        want = float(to_host(calls.rewards(model, ids, np.ones_like(ids, bool)))[0, model.output_column])
        atol = tolerance.rewards_atol(model.params, model.config, ids, np.ones_like(ids, bool))
        np.testing.assert_allclose(got[i], want, atol=atol, rtol=0, err_msg=texts[i])
    assert np.isnan(got[2])
