"""Issue 25: the fluent search's objective against full forwards and transformers, the forwards budget counted
exactly, the Pareto front and hypervolume against brute force, the judge, and the job (resume, errors)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import shutil
from fractions import Fraction
from pathlib import Path

import jax
import numpy as np
import pandas as pd
import pytest
import torch

from rmjax.compiled import declared_params
from rmjax.loading import load
from rmjax.scoring import calls
from rmjax.scoring import prior as prior_lib
from rmjax.search import baseline, fluent, objective, pareto, terms, turns
from rmjax.search import gcg as gcg_lib
from rmjax.search.budget import Forwards
from rmjax.search.gcg import make_target
from rmjax.search.objective import Objective
from rmjax.search.terms import Prior
from rmjax.text import chat, prompts
from tests import cli, tiny, tolerance

PROMPT = prompts.PAPER1["greatest"]
WORDS = [" the", " cat", " dog", " is", " good", " very", " sat", " on", " a", " mat"]


def _word_ids(tokenizer) -> np.ndarray:
    ids = [tokenizer(w, add_special_tokens=False).input_ids for w in WORDS]
    assert all(len(i) == 1 for i in ids)
    return np.asarray([i[0] for i in ids], np.int32)


def _conversation(tokenizer, ids, template: str = "auto") -> tuple[list[int], int, int]:
    """The decoded response in the template, tokenized: ids, where the response starts and ends."""
    split = chat.split_chat(tokenizer, PROMPT, template)
    full = chat.Conversations(tokenizer, PROMPT, template).token_ids([tokenizer.decode(list(ids))])[0]
    assert full[: len(split.prefix)] == list(split.prefix) and full[len(split.prefix):][: len(ids)] == list(ids)
    return full, len(split.prefix), len(split.prefix) + len(ids)


def _torch_log_probs(hf, fulls: list[list[int]], start: int, stops: list[int]) -> list[np.ndarray]:
    """transformers' log-probs (float64 softmax) of each whole conversation's tokens full[start:stop], each given
    the tokens before it: conversations of one length share a forward, whose logits are kept only at the positions
    read (transformers' logits_to_keep: the LM head over the vocabulary is most of a tiny model's forward)."""
    groups: dict[int, list[int]] = {}
    for row, full in enumerate(fulls):
        groups.setdefault(len(full), []).append(row)
    picked: list[np.ndarray] = [np.empty(0)] * len(fulls)
    for rows in groups.values():
        keep = np.arange(start - 1, max(stops[r] for r in rows) - 1)
        with torch.no_grad():
            logits = hf(input_ids=torch.tensor([fulls[r] for r in rows]), logits_to_keep=torch.from_numpy(keep)).logits
        lp = torch.log_softmax(logits.double(), -1).numpy()
        for i, r in enumerate(rows):
            picked[r] = lp[i, np.arange(stops[r] - start), fulls[r][start:stops[r]]]
    return picked


def _torch_mean_log_prob(hf, full: list[int], start: int, stop: int) -> float:
    """The judge's term by transformers: the mean log-prob of full[start:stop]."""
    return float(_torch_log_probs(hf, [full], start, [stop])[0].mean())


def _torch_fluency_log_probs(hf, fulls: list[list[int]], start: int, stops: list[int]) -> list[float]:
    """F's log-prob term by transformers: the mean log-prob of the response's tokens full[start : stop - 1] and the
    log-prob of the end of turn full[stop - 1] after them, added at full weight."""
    return [float(picked[:-1].mean() + picked[-1]) for picked in _torch_log_probs(hf, fulls, start, stops)]


def _check_prior_gradient(hf, lm, prefix, ids, weights, grad, every) -> None:
    """A prior gradient (None: not taken) and its every-position log-probs against torch autograd of
    Σ weights · log p(ids) through inputs_embeds, in float64."""
    table = hf.get_input_embeddings().weight.detach().double()
    one_hot = torch.nn.functional.one_hot(torch.tensor(ids, dtype=torch.long), table.shape[0]).double()
    one_hot.requires_grad_(True)
    embeds = torch.cat([table[torch.tensor(prefix)], one_hot @ table])[None]
    lp = torch.log_softmax(hf.double()(inputs_embeds=embeds).logits[0], -1)
    ((one_hot * lp[len(prefix) - 1 : -1]).sum(-1) * torch.tensor(weights, dtype=torch.float64)).sum().backward()
    want = one_hot.grad.numpy()
    hf.float()
    full = np.asarray([[*prefix, *ids.tolist()]], np.int32)
    lp_atol = tolerance.logprobs_atol(lm.params, lm.config, full)
    np.testing.assert_allclose(every, lp[len(prefix) - 1 : -1].detach().numpy(), atol=lp_atol, rtol=0)
    if grad is not None:  # the direct term (each position's log-probs, weighted) and the backward
        atol = lp_atol * max(weights) + tolerance.grad_atol(want, lm.config, full.shape[1], len(ids))
        np.testing.assert_allclose(grad, want, atol=atol, rtol=0)


def _newline(tokenizer) -> int:
    """The plain format's end of turn: the newline before the next `User:` line (one token here)."""
    ids = tokenizer("\n", add_special_tokens=False).input_ids
    assert len(ids) == 1
    return ids[0]


def obj_tail(target) -> int:
    return max(len(target.suffix), 1)


def _whole_turns(current: np.ndarray, words: np.ndarray, end: int) -> np.ndarray:
    """Whole turns around `current` (N slots, end-filled): single swaps, a repeat, truncations, a deletion and,
    where current is shorter than N, a token put before its end."""
    n, body = len(current), turns.tokens(current, end)
    cands = [current.copy() for _ in range(6)]
    for row, pos in enumerate([0, 1, 2, 4, 4, 3]):
        pos = min(pos, len(body) - 1)
        cands[row][pos] = words[(list(words).index(cands[row][pos]) + 1 + row) % len(words)]
    cands[5][len(body) - 1] = cands[5][len(body) - 2]  # a repeat: the repetition term
    shorter = [body[:1], body[:3], body[1:]] + ([[*body, int(words[2])]] if len(body) < n else [])
    return np.unique(np.concatenate([np.asarray(cands), turns.from_turns(shorter, n, end)]), axis=0)


def _appending_eos(model):
    """`model` with a copy of its tokenizer whose special-token rule appends its EOS to every text (as Llama
    tokenizers with add_eos_token do)."""
    import copy

    from tokenizers.processors import TemplateProcessing

    tok = copy.deepcopy(model.tokenizer)
    eos = tok.eos_token
    tok.backend_tokenizer.post_processor = TemplateProcessing(single=f"$A {eos}", pair=f"$A {eos} $B {eos}",
                                                              special_tokens=[(eos, tok.eos_token_id)])
    assert tok("a b").input_ids[-1] == tok.eos_token_id != tok("a b", add_special_tokens=False).input_ids[-1]
    return dataclasses.replace(model, tokenizer=tok, fingerprint=None, fingerprint_of=None)


# both templates, both turn lengths; the plain format with a tokenizer that appends its EOS
@pytest.mark.parametrize("length, template", [(5, "auto"), (3, "plain"), (4, "plain, appending EOS")])
def test_objective_terms_equal_full_forwards_of_the_decoded_text(tied, length, template):
    """Reward and prior terms of whole turns (N slots, shorter ones end-filled), of beam partials and of GCG
    variants (swaps, truncations, deletions, one more token before the end), with the RM as its own prior (its
    LM head in the same forward) and with a separate prior, against the whole decoded conversation: the reward by
    a full forward without cache, F's log-prob term (the response's tokens' mean + its end of turn's) by
    transformers; J by its formula. The plain template has no suffix: the RM reads the response's last token, and
    the prior's end of sequence ends the turn; a tokenizer that appends its EOS has it as the suffix, the end of
    turn both the RM and the prior read."""
    hf, lm, rm = tied
    appending = template.endswith("EOS")
    if appending:
        rm, template = _appending_eos(rm), "plain"
    n, lam, rho = 5, 0.7, 2.0
    target = make_target(rm, PROMPT, template)
    end = target.suffix[0] if target.suffix else _newline(rm.tokenizer)
    assert bool(target.suffix) == (template == "auto" or appending)
    assert end == turns.end_of_turn(target.suffix, rm.tokenizer, rm.source)
    assert not appending or target.suffix == (rm.tokenizer.eos_token_id,)
    words = _word_ids(rm.tokenizer)
    rng = np.random.default_rng(0)
    current = turns.from_turns([rng.choice(words, length).tolist()], n, end)[0]
    cands = _whole_turns(current, words, end)
    assert len(set(turns.lengths(cands, end).tolist())) >= 3

    def want(responses):
        rewards, fulls, stops = [], [], []
        for ids in responses:
            full, start, stop = _conversation(rm.tokenizer, turns.tokens(ids, end), template)
            rewards.append(float(np.asarray(calls.rewards(rm, np.asarray([full], np.int32),
                                                          np.ones((1, len(full)), bool)))[0, 0]))
            if not target.suffix:  # plain, nothing appended: the RM's conversation ends with the response
                assert stop == len(full)
                full = [*full, end]
            assert full[stop] == end  # the end of turn follows the response
            fulls.append(full)
            stops.append(stop + 1)
        return rewards, _torch_fluency_log_probs(hf, fulls, start, stops), full

    want_reward, want_logp, full = want(cands)
    partial_reward, partial_logp, _ = want(cands[:, :2])  # a beam level
    r_atol = tolerance.any_rewards_atol(rm.params, rm.config, len(full) + n)
    lp_atol = tolerance.logprobs_atol(lm.params, lm.config, np.asarray([full], np.int32))
    for sign, prior in ((1.0, Prior.of(rm, target.prefix)), (-1.0, Prior.of(lm, target.prefix))):
        obj = Objective(target, prior, lam, sign, rho, Forwards(10**6, n + obj_tail(target), n + 1))
        loss, extended, every = obj.gradient(current)
        assert loss.shape[0] == length + 1
        for got in (obj.score(cands), obj.score(cands, current, extended, every=every)):
            np.testing.assert_allclose(got.reward, want_reward, atol=r_atol, rtol=0)
            np.testing.assert_allclose(got.prior_logp, want_logp, atol=lp_atol, rtol=0)
            bodies = [turns.tokens(ids, end) for ids in cands]
            rep = [sum(ids[j] == ids[j - 1] or (ids[j - 1], ids[j]) in set(zip(ids[: j - 1], ids[1:j], strict=True))
                       for j in range(1, len(ids))) / len(ids) for ids in bodies]
            np.testing.assert_allclose(got.repetition, rep, atol=0)
            want_j = sign * got.reward + lam * (got.prior_logp - rho * np.asarray(rep))
            np.testing.assert_allclose(got.objective, want_j, rtol=1e-12)
        assert max(got.repetition) > 0
        got = obj.score_partials(cands[:, :2])
        np.testing.assert_allclose(got.reward, partial_reward, atol=r_atol, rtol=0)
        np.testing.assert_allclose(got.prior_logp, partial_logp, atol=lp_atol, rtol=0)


def test_scoring_whole_turns_compiles_once_whatever_the_current_responses_length(tied):
    """A search changes its response's length from step to step: the variants' scorer runs every length against one
    cache width (current's turn, then free slots) and the joint gradient over one width (turn, suffix, filler),
    each with the length an argument, so three lengths compile each once (each compiled once per length). The
    values stay a full forward's (the tests above and below check each length's)."""
    from rmjax import compiled as compiled_lib

    def programs(name):
        return {id(c): c.jitted._cache_size() for c in compiled_lib.made(name)}

    _, _, rm = tied
    n = 6
    target = make_target(rm, PROMPT, "auto")
    end = target.suffix[0]
    words = _word_ids(rm.tokenizer)
    obj = Objective(target, Prior.of(rm, target.prefix), 0.5, 1.0, 0.0, Forwards(10**6, n + obj_tail(target), n + 1))
    before = {name: programs(name) for name in ("_score_variants", "_joint_gradient")}
    for length in (2, 3, 5):
        current = turns.from_turns([words[:length].tolist()], n, end)[0]
        cands = turns.from_turns([words[i : i + length].tolist() for i in range(1, 9)], n, end)
        _, extended, _ = obj.gradient(current)
        got = obj.score(cands, current, extended)
        want = obj.score(cands)  # whole turns from the prompt's cache: no current, no variants' scorer
        np.testing.assert_allclose(got.reward, want.reward, atol=tolerance.any_rewards_atol(
            rm.params, rm.config, len(target.prefix) + n + 1 + len(target.suffix)), rtol=0)
    for name, was in before.items():
        now = programs(name)
        assert sum(now.values()) - sum(was.get(key, 0) for key in now) == 1, name


def test_starts_drawn_and_all_left_out_are_told_apart_from_a_budget_that_buys_none(tied, monkeypatch):
    """helper-144: a disagreement whose sampled starts were all left out by the round trip (random RMs) was refused
    after loading with "does not buy the search's starts (32 samples and a beam of 4)", though its budget had
    bought them, and with no number to give. Both refusals now say which happened and name a budget."""
    from rmjax.errors import UsageError

    _, _, rm = tied
    target = make_target(rm, PROMPT)
    banned = np.ones(rm.config.vocab_size, bool)
    banned[300:5000] = False
    cfg = fluent.FluentConfig(num_tokens=3, samples=8, beam=2, proposals=4, search_width=16, topk=8)

    def search(budget: int):
        obj = Objective(target, Prior.of(rm, target.prefix), 1.0, -1.0, 2.0,
                        Forwards(budget, 3 + len(target.suffix), 4))
        return lambda: fluent.fluent_search(obj, cfg, banned, [object()])

    monkeypatch.setattr(fluent, "survives", lambda check, body: False)  # the round trip leaves every response out
    with pytest.raises(UsageError, match=r"--forwards=120 does not buy the search's starts: it drew responses "
                                         r"\(\d+ forwards\), and every one was left out.*e\.g\. --forwards=240"):
        search(120)()
    with pytest.raises(UsageError, match=r"--forwards=1 does not buy the search's starts: it buys none of them "
                                         r"\(8 samples and a beam of 2\).*--forwards=2\."):
        search(1)()


@pytest.mark.parametrize("case", ["shared prior", "separate prior", "λ=0, exploring"])
def test_every_sequence_a_search_evaluates_carries_its_true_terms(tied, case):
    """Whatever path scored a sequence (samples, beam, shared-forward variants, redrawn tails whose log-probs are
    the sampler's plus the kept head's), its reward equals a full forward and its prior log-prob transformers'."""
    hf, lm, rm = tied
    n = 3
    target = make_target(rm, PROMPT)
    banned = np.ones(rm.config.vocab_size, bool)
    banned[300:5000] = False
    prior = Prior.of(lm if case == "separate prior" else rm, target.prefix)
    obj = Objective(target, prior, 0.0 if case.startswith("λ=0") else 1.0, -1.0, 2.0,
                    Forwards(120, n + len(target.suffix), n + 1))
    cfg = fluent.FluentConfig(num_tokens=n, samples=8, beam=2, proposals=4, search_width=16, topk=8,
                              exact_limit=16, resamples=4)
    found = fluent.fluent_search(obj, cfg, banned, [])
    known = np.flatnonzero(np.isfinite(found.values.prior_logp))
    assert len(found.ids) > 30 and len(known) > 20  # starts, GCG variants and redrawn tails
    prefix, suffix, end = list(target.prefix), list(target.suffix), target.suffix[0]
    sizes = turns.lengths(found.ids, end)
    assert (sizes < n).any() and (sizes == n).any()  # whole turns of several lengths
    bodies = [turns.tokens(ids, end) for ids in found.ids]
    fulls = [[*prefix, *body, *suffix] for body in bodies]
    want_logp = _torch_fluency_log_probs(hf, [fulls[i] for i in known], len(prefix),  # the response and its end
                                         [len(prefix) + len(bodies[i]) + 1 for i in known])
    for i, full in enumerate(fulls):
        want = float(np.asarray(calls.rewards(rm, np.asarray([full], np.int32), np.ones((1, len(full)), bool)))[0, 0])
        np.testing.assert_allclose(found.values.reward[i], want, rtol=0,
                                   atol=tolerance.any_rewards_atol(rm.params, rm.config, len(full)))
    for i, want in zip(known, want_logp, strict=True):
        full = np.asarray([fulls[i]], np.int32)
        np.testing.assert_allclose(found.values.prior_logp[i], want, rtol=0,
                                   atol=tolerance.logprobs_atol(lm.params, lm.config, full))


def test_the_prior_gradient_equals_torch_autograd_and_samples_carry_their_log_probs(tied):
    """d F's log-prob / d one_hot(ids) against torch autograd through inputs_embeds (ids a turn form: three
    tokens at 1/3 each and the end of turn at full weight), and the plain mean's; sampled responses avoid banned
    tokens and carry the prior's own log-probs (transformers on the whole conversation)."""
    hf, lm, _ = tied
    split = chat.split_chat(lm.tokenizer, PROMPT)
    prefix, ids = list(split.prefix), _word_ids(lm.tokenizer)[[1, 4, 2, 7]]
    prior = Prior.of(lm, prefix)
    for by_hand in ([1 / 3, 1 / 3, 1 / 3, 1.0], [0.25] * 4):
        weights = turns.fluency_weights([3], 4)[0] if by_hand[-1] == 1.0 else None
        grad, every = (np.asarray(a) for a in prior_lib.prior_gradient(lm, prior.cache, prior.first, ids, weights))
        _check_prior_gradient(hf, lm, prefix, ids, by_hand, grad, every)
    forward_only = np.asarray(prior_lib.every_log_probs(lm, prior.cache, prior.first, ids))  # the λ = 0 proposals
    _check_prior_gradient(hf, lm, prefix, ids, [0.25] * 4, None, forward_only)

    banned = np.ones(lm.config.vocab_size, bool)
    banned[_word_ids(lm.tokenizer)] = False
    end = int(_word_ids(lm.tokenizer)[0])  # whole turns: one allowed word stands in for the end of turn
    for end_kw in ({}, {"end": end, "end_from": 2}):
        got, lps = prior_lib.sample_responses(lm, prior.cache, prior.first, banned, 5, 3, seed=0, batch_size=4,
                                              **end_kw)
        assert got.shape == (5, 3) and lps.shape == (5, 3 + bool(end_kw)) and not banned[got].any()
        for row, row_lp in zip(got, lps, strict=True):
            full = [*prefix, *row.tolist()]
            with torch.no_grad():
                ref = torch.log_softmax(hf(input_ids=torch.tensor([full])).logits[0], -1).numpy()
            want = ref[np.arange(len(prefix) - 1, len(full) - 1), row]
            if end_kw:  # and the end of turn's after all three tokens
                want = np.append(want, ref[-1, end])
            np.testing.assert_allclose(row_lp, want, rtol=0, atol=tolerance.logprobs_atol(
                lm.params, lm.config, np.asarray([full], np.int32)))
    # the end of turn is drawn from step end_from on (where it is drawn, it is likelier than the one other word
    # allowed), never before
    word = int(_word_ids(lm.tokenizer)[1])
    one_word = np.ones(lm.config.vocab_size, bool)
    one_word[word] = False
    got, _ = prior_lib.sample_responses(lm, prior.cache, prior.first, one_word, 32, 3, seed=0, end=end, end_from=2)
    assert (got[:, :2] == word).all() and end in got[:, 2] and set(got[:, 2].tolist()) <= {word, end}


def test_the_sampler_compiles_one_step_whatever_the_length(tied):
    """The sampler's tokens are drawn in a loop: its program holds one forward for any length (unrolled, each
    step was a forward of its own, and a 16-token sampler compiled 16 of them). Counted in the lowered program,
    where an unrolled loop or a loop in its body would show."""
    _, lm, _ = tied
    prior = Prior.of(lm, chat.split_chat(lm.tokenizer, PROMPT).prefix)

    def matmuls(steps, end):
        call = prior_lib.sample_call(lm.config, lm.mesh, prior.cache.k.shape[2], 4, steps, end)
        banned = np.zeros(lm.config.vocab_size, bool)
        lowered = call.lower(declared_params(lm), prior.cache, prior.first, banned, np.float32(1.0),
                             jax.random.key(0), *np.int32([prior.cache.k.shape[2], steps, 1]))
        return lowered.as_text().count("dot_general")

    for end in (None, 2):
        assert 0 < matmuls(3, end) == matmuls(16, end)


def test_tails_after_any_kept_prefix_run_one_sampler_program_and_carry_their_log_probs(tied):
    """A search's tails keep current's first j tokens and draw the other N − j from the prior: the sampler compiled
    a program per tail start (its cache cut at the kept prefix, its length N − j; 11 in the README's frontier). Now
    the cache has one width for the search (the prompt, N + 1 slots; Objective.sampling_cache) and the prefix's end
    and the length are arguments, so four tail starts and three turn lengths compile one program per prior. Each
    tail's log-probabilities (and its end of turn's after it) against transformers on prompt + kept + tail: the RM as
    its own prior (its extended cache holds current's whole turn past the kept prefix, emptied by the sampler) and a
    separate prior (its prompt cache extended by the j kept tokens)."""
    from rmjax import compiled as compiled_lib

    hf, lm, rm = tied  # the RM is the LM with a reward head: its log-probs are the HF model's
    n = 5
    target = make_target(rm, PROMPT, "auto")
    end, words, prefix = int(target.suffix[0]), _word_ids(rm.tokenizer), list(target.prefix)
    banned = np.ones(rm.config.vocab_size, bool)
    banned[words] = False
    banned[end] = False
    for model in (rm, lm):
        obj = Objective(target, Prior.of(model, prefix), 0.5, 1.0, 0.0, Forwards(10**6, n + obj_tail(target), n + 1))
        before = sum(c.jitted._cache_size() for c in compiled_lib.made("_sample"))
        for length, j in ((4, 0), (4, 2), (3, 1), (5, 4), (2, 1)):
            current = turns.from_turns([words[:length].tolist()], n, end)[0]
            _, extended, every = obj.gradient(current)
            cache, at = obj.sampling_cache(n, current, j, extended)
            tails, lps = prior_lib.sample_responses(model, cache, every[j], banned, 3, n - j, seed=j, end=end,
                                                    end_from=0 if j else 1, at=at, steps=n)
            assert tails.shape == (3, n - j) and lps.shape == (3, n - j + 1) and not banned[tails].any()
            for row, row_lp in zip(tails, lps, strict=True):
                full = [*prefix, *current[:j].tolist(), *row.tolist()]
                with torch.no_grad():
                    ref = torch.log_softmax(hf(input_ids=torch.tensor([full])).logits[0].double(), -1).numpy()
                want = np.append(ref[np.arange(len(prefix) + j - 1, len(full) - 1), row], ref[-1, end])
                np.testing.assert_allclose(row_lp, want, rtol=0, atol=tolerance.logprobs_atol(
                    lm.params, lm.config, np.asarray([full], np.int32)))
        assert sum(c.jitted._cache_size() for c in compiled_lib.made("_sample")) - before == 1, model
        assert obj.sampling_cache(n)[0] is obj.sampling_cache(n)[0]  # the padded prompt cache is made once


@pytest.mark.parametrize("sign, lam, template, spare", [(1.0, 0.7, "auto", 0), (-1.0, 0.0, "auto", 0),
                                                        (1.0, 0.7, "plain", 0), (1.0, 0.7, "auto", 2),
                                                        (-1.0, 0.7, "plain", 3)])
def test_the_joint_gradient_of_an_rm_that_is_its_own_prior_equals_its_two_terms_apart(tied, sign, lam, template,
                                                                                      spare):
    """One forward and backward of the RM gives d(sign·R + λ·F's log-prob)/d one_hot and the prior's log-probs at
    every position: equal to the reward's gradient (against PyTorch in test_gcg) and the prior's (against torch
    autograd above), each from its own forward. At λ = 0 (the prior only proposes) the gradient is the reward's.
    The gradient is over the turn: the response and its end of turn (row 5: a token put before the end). With the
    plain template (no suffix) the reward is the response's last token's: the end of turn is the prior's only.
    `spare`: the response leaves that many of its slots to the end of turn (a shorter turn, run with filler after
    it up to the longest)."""
    _, _, rm = tied
    target = make_target(rm, PROMPT, template)
    prior, ids = Prior.of(rm, target.prefix), _word_ids(rm.tokenizer)[[3, 0, 5, 5, 8]]
    end = target.suffix[0] if target.suffix else _newline(rm.tokenizer)
    slots = np.concatenate([ids, np.full(spare, end, ids.dtype)])
    obj = Objective(target, prior, lam, sign, 2.0, Forwards(10**6, len(slots) + obj_tail(target), len(slots) + 1))
    assert obj.rm_is_prior
    loss, _, every = obj.gradient(slots, explore=True)
    loss, every = np.asarray(loss), np.asarray(every)
    turn = np.asarray([*ids.tolist(), end], np.int32)
    if target.suffix:
        rest = make_target(rm, PROMPT, prefix=target.prefix, suffix=target.suffix[1:])
        reward_grad = np.asarray(gcg_lib.reward_gradient(rest, turn))
    else:  # the reward of the response alone; the end's row: nothing (the RM does not read it)
        reward_grad = np.asarray(gcg_lib.reward_gradient(target, ids))
        reward_grad = np.concatenate([reward_grad, np.zeros_like(reward_grad[:1])])
    prior_grad, want_every = (np.asarray(a) for a in prior_lib.prior_gradient(
        rm, prior.cache, prior.first, turn, turns.fluency_weights([len(ids)], len(turn))[0]))
    full = np.asarray([[*target.prefix, *ids.tolist(), *target.suffix]], np.int32)
    lp_atol = tolerance.logprobs_atol(rm.params, rm.config, full)
    # both ways are f32 against the same exact value: twice each term's bound
    atol = 2 * (tolerance.grad_atol(reward_grad, rm.config, full.shape[1] + 1, rm.config.hidden_size)
                + lam * (lp_atol + tolerance.grad_atol(prior_grad, rm.config, full.shape[1] + 1, len(ids))))
    np.testing.assert_allclose(loss, -(sign * reward_grad + lam * prior_grad), atol=atol, rtol=0)
    np.testing.assert_allclose(every, want_every, atol=2 * lp_atol, rtol=0)
    assert np.abs(lam * prior_grad).max() > 10 * atol or lam == 0  # the prior's term is there to be missed


def test_the_joint_gradient_reads_the_output_column_it_is_given(tied):
    """An RM with two outputs, the one-output RM's head as column 1 and another as column 0, read at
    --output_column=1: its joint gradient and prior log-probs are the one-output RM's (the joint gradient read
    column 0 whatever the column, and every one-output RM hid it)."""
    from rmjax import nn

    _, _, rm = tied
    flat = nn.flat(rm.params)
    head = np.asarray(flat["score.kernel"])
    cfg = dataclasses.replace(rm.config, num_labels=2)
    two = np.concatenate([np.random.default_rng(0).normal(size=head.shape).astype(np.float32), head], axis=1)
    rm2 = dataclasses.replace(rm, config=cfg, params=nn.from_flat(cfg, {**flat, "score.kernel": two}), output_column=1)
    ids = _word_ids(rm.tokenizer)[[3, 0, 5, 5, 8]]
    got = []
    for model in (rm, rm2):
        target = make_target(model, PROMPT)
        obj = Objective(target, Prior.of(model, target.prefix), 0.7, 1.0, 2.0,
                        Forwards(10**6, len(ids) + obj_tail(target), len(ids) + 1))
        assert obj.rm_is_prior
        got.append([np.asarray(a) for a in obj.gradient(ids, explore=True)])
    (loss, _, every), (loss2, _, every2) = got
    full = np.asarray([[*target.prefix, *ids.tolist(), *target.suffix]], np.int32)
    # one computation but for the head's extra column: the same f32 rounding up to the head's matmul, within bound
    atol = 2 * tolerance.grad_atol(loss, rm.config, full.shape[1] + 1, rm.config.hidden_size)
    np.testing.assert_allclose(loss2, loss, atol=atol, rtol=0)
    np.testing.assert_allclose(every2, every, atol=2 * tolerance.logprobs_atol(rm.params, rm.config, full), rtol=0)


def test_the_gradient_with_a_separate_prior_is_the_rewards_and_the_priors_each_from_its_own_model(tied):
    """A prior that is not the RM: d(−J)/d one_hot = −(sign·dR + λ·dF), the reward's gradient from the RM and F's
    from the prior LM (each against PyTorch elsewhere), and the prior's log-probs at every position of the turn."""
    _, lm, rm = tied
    sign, lam = -1.0, 0.7
    target = make_target(rm, PROMPT)
    prior, ids = Prior.of(lm, target.prefix), _word_ids(rm.tokenizer)[[3, 0, 5, 5, 8]]
    obj = Objective(target, prior, lam, sign, 2.0, Forwards(10**6, len(ids) + obj_tail(target), len(ids) + 1))
    assert not obj.rm_is_prior
    loss, _, every = (np.asarray(a) for a in obj.gradient(ids))
    turn = np.asarray([*ids.tolist(), target.suffix[0]], np.int32)
    rest = make_target(rm, PROMPT, prefix=target.prefix, suffix=target.suffix[1:])
    reward_grad = np.asarray(gcg_lib.reward_gradient(rest, turn))
    prior_grad, want_every = (np.asarray(a) for a in prior_lib.prior_gradient(
        lm, prior.cache, prior.first, turn, turns.fluency_weights([len(ids)], len(turn))[0]))
    vocab = min(reward_grad.shape[1], prior_grad.shape[1])
    full = np.asarray([[*target.prefix, *ids.tolist(), *target.suffix]], np.int32)
    # the same f32 computations, composed: each term's bound, twice
    atol = 2 * (tolerance.grad_atol(reward_grad, rm.config, full.shape[1] + 1, rm.config.hidden_size)
                + lam * tolerance.grad_atol(prior_grad, lm.config, full.shape[1] + 1, len(ids)))
    np.testing.assert_allclose(loss, -(sign * reward_grad[:, :vocab] + lam * prior_grad[:, :vocab]), atol=atol, rtol=0)
    np.testing.assert_array_equal(every, want_every)
    assert np.abs(lam * prior_grad).max() > 10 * atol  # the prior's term is there to be missed


class _Ledger:
    """Positions each model call runs, counted by the definition from the calls' own arguments."""

    def __init__(self, monkeypatch, rm, n: int, tail: int, end: int):
        self.rm_positions, self.lm_positions, self.n, self.tail = 0, 0, n, tail
        real = {name: getattr(objective, name) for name in ("score_responses", "score_variants", "extend_prefix",
                                                            "reward_gradient_on_device", "joint_gradient_on_device")}
        real_prior = {name: getattr(prior_lib, name) for name in ("response_log_probs", "prior_gradient",
                                                                  "next_log_probs", "sample_responses",
                                                                  "every_log_probs")}

        self.called = set()
        self.own_draws = False  # within the search's starts or resampled tails, drawn by the RM as its own prior

        def drawing(real):
            def draw(obj, *args, **kwargs):
                self.own_draws = obj.rm_is_prior
                try:
                    return real(obj, *args, **kwargs)
                finally:
                    self.own_draws = False
            return draw

        for name in ("_sample_starts", "_resample_tails"):
            monkeypatch.setattr(fluent, name, drawing(getattr(fluent, name)))

        def spy(name, count):
            def call(*args, **kwargs):
                self.called.add(name)
                count(*args, **kwargs)
                return (real | real_prior)[name](*args, **kwargs)
            return call

        def rm_add(k):
            self.rm_positions += k

        def lm_add(k):
            self.lm_positions += k

        def first_change(row, cur):  # where a variant (a turn: tokens, end of turn) first differs from current's
            return next((j for j in range(min(len(row), len(cur))) if row[j] != cur[j]),
                        min(len(row), len(cur)) if len(row) != len(cur) else len(cur) - 1)

        def through_end(rows):  # a prior row's positions: up to and with its first end of turn
            return sum(row.index(end) + 1 if end in row else len(row) for row in np.asarray(rows).tolist())

        def variants(m, ext, suffix, cur, v, rows, log_probs=False, longest=None, read_offset=0, **k):
            # from its first change, or from where the head reads it if that is earlier (a plain turn cut short:
            # the reward is read at its last token, before the end of turn, and the cache holds no hidden state)
            if not self.own_draws:
                rm_add(sum(len(row) - min(first_change(list(row), list(cur)), len(row) + len(suffix) - 1 - read_offset)
                           + len(suffix) for row in v))

        # a sample or a tail the RM draws as its own prior is one forward of its drawn positions + S, the sampler's,
        # which scores it too (as best-of-N's: the sampler's forward holds the reward's positions but the suffix)
        counters = {
            "score_responses": lambda m, c, s, r, b, first=None, lengths=None, end=None: self.own_draws or rm_add(
                np.shape(r)[0] * (np.shape(r)[1] + self.tail) if lengths is None else int(np.sum(lengths + self.tail))),
            "score_variants": variants,
            "extend_prefix": lambda m, c, x: (rm_add if m is rm else lm_add)(np.size(x)),
            "reward_gradient_on_device": lambda t, ids, read_offset=0: rm_add(3 * (len(ids) + len(t.suffix))),
            "joint_gradient_on_device": lambda t, first, ids, *a, **k: rm_add(3 * (len(ids) + len(t.suffix))),
        }
        prior_counters = {
            "response_log_probs": lambda m, c, f, r, b=64: lm_add(through_end(r)),
            "prior_gradient": lambda m, c, f, ids, *a: lm_add(3 * len(ids)),
            "every_log_probs": lambda m, c, f, ids: lm_add(len(ids)),
            "next_log_probs": lambda m, c, f, p: lm_add(np.size(p)),
            "sample_responses": lambda m, c, f, b, count, length, *a, end=None, **k: rm_add(
                count * (length + self.tail)) if self.own_draws else lm_add(count * (length + (end is not None))),
        }
        for name, count in counters.items():
            monkeypatch.setattr(objective, name, spy(name, count))
        for name, count in prior_counters.items():
            monkeypatch.setattr(prior_lib, name, spy(name, count))

    def forwards(self) -> Fraction:
        return Fraction(self.rm_positions, self.n + self.tail) + Fraction(self.lm_positions, self.n + 1)


@pytest.mark.parametrize("case", ["shared prior", "separate prior", "exact, λ=0", "gradient, λ=0",
                                  "gradient, no explore, λ=0", "best-of-N", "best-of-N, separate prior",
                                  "shared prior, plain template"])
def test_the_forwards_budget_is_counted_exactly_and_never_passed(tied, monkeypatch, case):
    """Every position a method runs, counted from its calls' arguments by the definition, equals what the search
    charged; no method passes the budget, and each stops when too little is left for its next call."""
    _, lm, rm = tied
    # 150 forwards: every case still makes each of its kinds of call (merges, resampled tails at j > 0, ...) and
    # stops on the budget; a search's calls are those of a larger budget's run up to where this one stops
    n, budget = 3, 150
    target = make_target(rm, PROMPT, "plain" if case.endswith("plain template") else "auto")
    words = _word_ids(rm.tokenizer)
    banned = np.ones(rm.config.vocab_size, bool)
    banned[words if case == "exact, λ=0" else np.arange(300, 5000)] = False
    prior = Prior.of(lm if case.endswith("separate prior") else rm, target.prefix)
    # plain: no suffix; the end of turn (a newline) is the prior's, run by the RM for its LM head, read before
    end, tail = turns.end_of_turn(target.suffix, rm.tokenizer, rm.source), turns.rm_tail(target.suffix)
    ledger = _Ledger(monkeypatch, rm, n, tail, end)
    forwards = Forwards(budget, n + tail, n + 1)
    obj = Objective(target, prior, 0.0 if case.endswith("λ=0") else 1.0, 1.0, 2.0, forwards)
    cfg = fluent.FluentConfig(num_tokens=n, samples=8, beam=2, proposals=4, search_width=16, topk=8,
                              exact_limit=16, explore="no explore" not in case)
    if case.startswith("best-of-N"):
        found = baseline.best_of_n(obj, cfg, banned)
    else:
        found = fluent.fluent_search(obj, cfg, banned, [])
    if case == "best-of-N":  # the RM is its own prior: a sample is one forward, the sampler's (module docstring)
        assert found.spent == forwards.spent == len(found.ids) == budget
    else:
        assert found.spent == forwards.spent == ledger.forwards()
    if case.startswith("gradient"):  # at λ = 0 the prior proposes only when exploring
        # (the RM is its own prior here: its gradient's forward gives the prior's log-probs)
        assert ("joint_gradient_on_device" in ledger.called) == ("no explore" not in case)
        assert "every_log_probs" not in ledger.called
    assert forwards.spent <= budget
    if found.converged:  # stopped early: every single swap of the buffer's best sequences was evaluated
        best = found.ids[found.best(fluent.BUFFER_TRIES)]
        evaluated = {tuple(r) for r in found.ids.tolist()}
        assert all(tuple(np.where(np.arange(n) == p, w, row)) in evaluated for row in best
                   for p in range(turns.lengths(row[None], end)[0]) for w in np.flatnonzero(~banned))
    else:
        assert budget - forwards.spent < 8  # a gradient (3 + 3) and one candidate (≤ 2) are the dearest calls
    assert len({tuple(r) for r in found.ids.tolist()}) == len(found.ids) or case.startswith("best-of-N")
    assert not banned[np.concatenate([turns.tokens(r, end) for r in found.ids])].any()
    assert (found.ids == turns.canonical(found.ids, end)).all() and (found.ids[:, 0] != end).all()



def test_a_plain_turn_cut_short_runs_and_is_charged_from_where_its_reward_is_read(tied):
    """With the plain template the reward is read at a turn's last token, before its end of turn. A variant of
    current that ends its turn early first differs at its end of turn, after that read: the RM must run it from the
    read (the cache of current holds no hidden state there), and charge those positions, not one fewer."""
    _, _, rm = tied
    n = 3
    target = make_target(rm, PROMPT, "plain")
    assert not target.suffix  # plain: the RM reads the response's last token; the end of turn after it is run, unread
    forwards = Forwards(10**6, n + turns.rm_tail(target.suffix), n + 1)
    obj = Objective(target, None, 0.0, 1.0, 0.0, forwards)
    end, words = obj.end, _word_ids(rm.tokenizer)
    current = np.asarray(words[[0, 1, 2]], np.int32)
    cut = np.asarray([[words[0], end, end]], np.int32)  # current's first token, then the end of its turn
    extended = obj.extended_cache(current)  # prefix + current's turn (charged: the gradient's forward, in a search)
    before = forwards.spent
    got = obj.score(cut, current, extended)
    # runs the first token (where the reward is read) and the end of turn: 2 of a whole turn's n + 1 positions
    assert forwards.spent - before == Fraction(2, n + 1)
    whole = obj.score(cut)  # the same turn run whole after the prompt
    np.testing.assert_allclose(got.reward, whole.reward, rtol=0,
                               atol=tolerance.any_rewards_atol(rm.params, rm.config, len(target.prefix) + n + 1))


def test_best_of_n_with_a_separate_prior_spends_the_whole_budget(tied, monkeypatch):
    """Best-of-N priced every sample as a whole N-token turn, then charged the short ones their own length: with a
    separate prior it spent 157 of 200 forwards against the search's 200. Now what a round leaves buys another, so
    it stops only when no whole sample fits. The samples here are one-token turns (the prior's draws stand-in)."""
    _, lm, rm = tied
    n, budget = 4, 200
    target = make_target(rm, PROMPT)
    words = _word_ids(rm.tokenizer)
    seeds, rounds, draws = [], [], []

    def one_token_turns(model, cache, first, banned, count, length, seed, temperature=1.0, end=None, **_):
        seeds.append(seed)
        draws.append((temperature, count))
        ids = np.full((count, length), end, np.int32)
        ids[:, 0] = np.random.default_rng(seed).choice(words, count)
        return ids, np.full((count, length + 1), -1.0, np.float32)

    monkeypatch.setattr(prior_lib, "sample_responses", one_token_turns)
    one_round = baseline._round
    monkeypatch.setattr(baseline, "_round", lambda *a: (rounds.append(a[4]), one_round(*a))[1])  # its count
    forwards = Forwards(budget, n + len(target.suffix), n + 1)
    obj = Objective(target, Prior.of(lm, target.prefix), 1.0, 1.0, 2.0, forwards)
    cfg = fluent.FluentConfig(num_tokens=n, samples=8, beam=2, proposals=4, search_width=16, topk=8)
    found = baseline.best_of_n(obj, cfg, np.zeros(rm.config.vocab_size, bool))
    whole = forwards.cost(n + len(target.suffix), n + 1)  # one sample priced before it is drawn
    assert budget - whole < forwards.spent <= budget and found.spent == forwards.spent
    # each draw has a stream of its own: none is another draw's, nor the seed a search at a nearby --seed starts from
    assert len(set(seeds)) == len(seeds) and not set(seeds) & set(range(1000))
    # the rounds' small draws come in powers of two (so few sampler shapes compile), and there were several
    assert len(rounds) > 2 and all(c >= baseline.SAMPLER_ROWS or c & (c - 1) == 0 for c in rounds), rounds
    # each round's count in equal shares over the temperatures, the remainder to the next temperature each round
    # (round r's first extra to temperature r mod T): rounds of 1 sample all went to the first temperature
    temps = cfg.best_of_n_temperatures
    want = [(temps[k], c // len(temps) + ((k - r) % len(temps) < c % len(temps)))
            for r, c in enumerate(rounds) for k in range(len(temps))]
    assert draws == [(t, c) for t, c in want if c]
    totals = [sum(c for t, c in draws if t == temp) for temp in temps]
    assert max(totals) - min(totals) <= 1, totals
    # its history (stored with the unit) holds the best J and its sequence, not the worst
    best = int(np.argmax(found.values.objective))
    assert found.history[-1][1:] == (float(found.values.objective[best]), found.ids[best].tolist())


def test_a_seeded_search_takes_its_seeds_free_with_their_terms(tied, monkeypatch):
    """Seeds (rows another λ's search found and paid for) join the archive at no charge, with
    J computed from their given reward and prior log-prob under this search's λ; no sequence is scored twice, and
    the search's best is at least the best seed's."""
    _, _, rm = tied
    n = 3
    target = make_target(rm, PROMPT)
    banned = np.ones(rm.config.vocab_size, bool)
    banned[300:5000] = False
    prior = Prior.of(rm, target.prefix)
    cfg = fluent.FluentConfig(num_tokens=n, samples=8, beam=2, proposals=4, search_width=16, topk=8, exact_limit=16)
    unit = (n + len(target.suffix), n + 1)
    earlier = fluent.fluent_search(Objective(target, prior, 4.0, -1.0, 2.0, Forwards(150, *unit)),
                                   dataclasses.replace(cfg, seed=7), banned, [])
    pick = earlier.best(6)
    seeds = (earlier.ids[pick], earlier.values.reward[pick], earlier.values.prior_logp[pick])
    ledger, scored, real_score = _Ledger(monkeypatch, rm, n, len(target.suffix), target.suffix[0]), [], Objective.score
    monkeypatch.setattr(Objective, "score", lambda self, cands, *a, **k: (
        scored.extend(map(tuple, np.asarray(cands).tolist())), real_score(self, cands, *a, **k))[1])
    forwards = Forwards(150, *unit)
    found = fluent.fluent_search(Objective(target, prior, 0.25, -1.0, 2.0, forwards), cfg, banned, [], seeds=seeds)
    assert found.spent == forwards.spent == ledger.forwards() and len(scored) == len(set(scored)) > 20
    free = [i for i, ids in enumerate(seeds[0].tolist()) if tuple(ids) not in set(scored)]
    assert free  # seeds the search had not found itself: in its archive without being scored (nor charged)
    index = {tuple(row): i for i, row in enumerate(found.ids.tolist())}
    want = -seeds[1] + 0.25 * (seeds[2] - 2.0 * terms.repetition(seeds[0], target.suffix[0]))
    got = [found.values.objective[index[tuple(seeds[0][i].tolist())]] for i in free]
    np.testing.assert_allclose(got, want[free], rtol=1e-12)
    assert found.values.objective.max() >= max(want)


class _RecordingObjective:
    """What _merge_improvements needs of an Objective: a budget, costs, and a score that records its candidates."""

    def __init__(self, left: int):
        self.forwards, self.scored = Forwards(left, 1, 1), []
        self.end = 10**6  # no token here: every sequence is a whole turn of N tokens

    def cost(self, cands, current, every, known=False, partner=True, paid=False):
        return np.full(len(cands), Fraction(1), object)

    def score(self, cands, current, extended, every=None):
        self.scored.append(np.asarray(cands).copy())
        zero = np.zeros(len(cands))
        return terms.Values(zero, zero, zero, zero)


def test_a_step_merges_its_improving_swaps_at_distinct_positions_best_first():
    """The merged candidates, against a brute-force reading of the rule: the single swaps that beat current's J,
    best first, the best one per position, applied cumulatively (best two, best three, ... up to `merges`); swaps
    that do not improve, multi-token changes and sequences seen before are never merged or scored."""
    rng, merged_trials = np.random.default_rng(4), 0
    for _ in range(40):
        n, merges = int(rng.integers(2, 7)), int(rng.integers(0, 6))
        current = rng.integers(0, 50, n).astype(np.int32)
        cands = np.repeat(current[None], int(rng.integers(1, 25)), axis=0)
        for row in cands:
            for p in rng.choice(n, int(rng.choice([1, 1, 1, 2])), replace=False):
                row[p] = (row[p] + int(rng.integers(1, 49))) % 50
        j = rng.integers(-4, 5, len(cands)).astype(float)  # ties: the earlier candidate first
        cfg = fluent.FluentConfig(num_tokens=n, merges=merges)
        seen = {tuple(r) for r in cands.tolist()}
        archive, obj = fluent._Archive(None), _RecordingObjective(10**6)
        archive.forwards = obj.forwards
        fluent._merge_improvements(obj, cfg, current, 0.0, cands, terms.Values(j, j, j, j), None, None, [],
                                   archive, seen)
        order = sorted(range(len(cands)), key=lambda i: (-j[i], i))
        chosen = {}
        for i in order:
            diff = [p for p in range(n) if cands[i][p] != current[p]]
            if j[i] > 0 and len(diff) == 1 and diff[0] not in chosen and len(chosen) < merges:
                chosen[diff[0]] = cands[i][diff[0]]
        positions, tokens = list(chosen), list(chosen.values())
        want = [[tokens[positions.index(p)] if p in positions[:k] else current[p] for p in range(n)]
                for k in range(2, len(positions) + 1)]  # each built from current afresh
        want = [w for w in want if w not in cands.tolist()]
        got = np.concatenate(obj.scored) if obj.scored else np.zeros((0, n), np.int32)
        assert got.tolist() == want
        assert len(archive.ids) == len(want)
        merged_trials += len(want) > 0
    assert merged_trials >= 15  # the rule was exercised, not only its empty case


def test_merged_swaps_of_whole_turns_are_canonical():
    """A cut (the end of turn put at a response's last slot) and an improving swap after it merge into the cut
    turn itself, never into a row with tokens after its end of turn (one response under two keys)."""
    end, current = 99, np.asarray([1, 2, 3, 99, 99], np.int32)
    cands = np.asarray([[1, 2, 99, 99, 99], [1, 2, 3, 4, 99], [5, 2, 3, 99, 99]], np.int32)  # cut, grow, swap
    j = np.asarray([3.0, 2.0, 1.0])
    obj = _RecordingObjective(10**6)
    obj.end = end
    archive = fluent._Archive(obj.forwards)
    seen = {tuple(r) for r in cands.tolist()}
    fluent._merge_improvements(obj, fluent.FluentConfig(num_tokens=5, merges=3), current, 0.0, cands,
                               terms.Values(j, j, j, j), None, None, [], archive, seen)
    got = np.concatenate(obj.scored) if obj.scored else np.zeros((0, 5), np.int32)
    assert (got == turns.canonical(got, end)).all()
    assert got.tolist() == [[5, 2, 99, 99, 99]]  # the cut and the first swap; the growth after the cut is no token


def test_pareto_front_and_hypervolume_against_brute_force():
    rng = np.random.default_rng(0)
    for trial in range(30):
        k = int(rng.integers(1, 25))
        gain = rng.integers(0, 6, k).astype(float) if trial % 2 else rng.normal(size=k)
        ppl = np.exp(rng.integers(0, 6, k).astype(float) if trial % 2 else rng.normal(size=k))
        dominated = {i for i in range(k) for j in range(k)
                     if gain[j] >= gain[i] and ppl[j] <= ppl[i] and (gain[j] > gain[i] or ppl[j] < ppl[i])}
        duplicates = {i for i in range(k) for j in range(i) if gain[j] == gain[i] and ppl[j] == ppl[i]}
        assert set(pareto.front(gain, ppl).tolist()) == set(range(k)) - dominated - duplicates
        # a reference every point beats, and one inside the cloud (points worse on either side add nothing)
        for ref in ((gain.min() - 0.5, ppl.max() * 1.5), (float(np.median(gain)), float(np.median(ppl)))):
            xs = np.unique(np.concatenate([[ref[0]], gain]))
            ys = np.unique(np.concatenate([[-np.log(ref[1])], -np.log(ppl)]))
            xs, ys = xs[xs >= ref[0]], ys[ys >= -np.log(ref[1])]
            cells = itertools.product(zip(xs, xs[1:], strict=False), zip(ys, ys[1:], strict=False))
            area = sum((x1 - x0) * (y1 - y0) for (x0, x1), (y0, y1) in cells
                       if any(g >= x1 and -np.log(p) >= y1 for g, p in zip(gain, ppl, strict=True)))
            assert pareto.hypervolume(gain, ppl, ref) == pytest.approx(area, rel=1e-12, abs=1e-12)


def _layers_by_brute_force(gain, fluency):
    """Each point's Pareto layer (0: the front), peeling fronts: a point is in the layer when no point left beats
    it on both (better on one) and no earlier point left equals it."""
    left, layer, depth = set(range(len(gain))), {}, 0
    while left:
        this = {i for i in left if not any(
            (gain[k] >= gain[i] and fluency[k] >= fluency[i] and (gain[k] > gain[i] or fluency[k] > fluency[i]))
            or (k < i and gain[k] == gain[i] and fluency[k] == fluency[i]) for k in left)}
        layer |= dict.fromkeys(this, depth)
        left, depth = left - this, depth + 1
    return layer


def test_search_rows_are_its_best_by_j_and_its_own_pareto_layers():
    """The written search rows: the top by J, and up to front_rows points taken layer by layer from the search's
    own (gain, fluency) Pareto layers, whole layers first, the last one touched spread with both its ends kept;
    ordered by J."""
    from rmjax.search.frontier_unit import search_rows

    rng, deep = np.random.default_rng(1), 0
    for trial in range(40):
        w, rho, lam, sign = int(rng.integers(1, 60)), 2.0, 0.5, (1.0, -1.0)[trial % 2]
        ids = rng.integers(0, 4, (w, 4))
        reward, logp = rng.normal(size=w).round(1), rng.normal(size=w).round(1)
        rep = terms.repetition(ids)
        j = sign * reward + lam * (logp - rho * rep)
        found = fluent.Found(ids, terms.Values(reward, logp, rep, j), Fraction(0), [])
        top, extra_rows = int(rng.integers(1, 5)), int(rng.integers(0, 30))
        rows = search_rows(found, top, extra_rows, sign, rho).tolist()
        gain, fluency = sign * reward, logp - rho * rep
        layer = _layers_by_brute_force(gain, fluency)
        best_by_j = sorted(range(w), key=lambda i: (-j[i], i))[:top]
        extra = set(rows) - set(best_by_j)
        assert set(best_by_j) <= set(rows) and len(rows) == len(set(rows)) <= top + extra_rows
        assert rows == sorted(rows, key=lambda i: (-j[i], i))
        if not extra_rows:
            assert not extra
            continue
        whole = 0  # points in the layers before the last one touched: all written
        for depth in range(max(layer.values()) + 1):
            members = [i for i in range(w) if layer[i] == depth]
            if whole + len(members) > extra_rows:
                break
            assert set(members) <= set(rows)
            whole += len(members)
        else:  # every layer fits: every point is written
            assert set(rows) == set(range(w))
            continue
        deep += depth > 0
        last = [i for i in members if i in rows]
        assert extra <= {i for i in range(w) if layer[i] <= depth}
        assert len(extra & set(members)) <= extra_rows - whole <= len(last)
        if extra_rows - whole >= 2:  # the last layer's ends: its most fluent and its best gain (first of equals)
            assert {min(members, key=lambda i: (-fluency[i], -gain[i], i)),
                    min(members, key=lambda i: (-gain[i], -fluency[i], i))} <= set(rows)
    assert deep >= 10  # rows came from behind the front, not only from it


def test_the_summary_counts_each_dominating_response_once_and_its_hypervolumes_share_a_reference():
    """Dominating responses (judge perplexity ≤ best-of-N's median, gain ≥ its best) counted as distinct sequences,
    though several λs write the same one; both hypervolumes from one fixed reference inside the fluent band
    (best-of-N's median gain, perplexity 1,000); the primary metric, each method's best at each judge-perplexity
    cap (30, 100, best-of-N's median), against a brute-force reading of every row."""
    from rmjax.search.frontier_job import FrontierConfig
    from rmjax.search.frontier_out import summaries
    from rmjax.search.frontier_unit import Unit

    rng, repeated = np.random.default_rng(3), 0
    for trial in range(20):
        sign, units = (1.0, -1.0)[trial % 2], []
        direction = "optimal" if sign > 0 else "pessimal"
        pool = rng.integers(0, 3, (6, 2))  # few distinct responses: λs write the same ones
        for lam in (None, 1.0, 0.0):
            w = int(rng.integers(1, 12))
            ids = pool[rng.integers(0, len(pool), w)] if lam is not None else rng.integers(0, 3, (w, 2))
            noise = 0 if lam is not None else rng.normal(size=w)  # best-of-N: its own, a little worse on both
            reward = np.asarray([float(np.sum(r)) for r in ids]) + (0 if lam is not None else noise - sign)
            ppl = np.exp(np.asarray([1.0 + r[0] for r in ids]) + (0 if lam is not None else noise + 1))
            units.append(Unit("p", direction, "best_of_n" if lam is None else "search", lam, ids, reward,
                              np.zeros(w), ppl, np.ones(w, bool), 0.0, np.zeros((0, 2)), (0.0, 1.0)))
        got = summaries(units, FrontierConfig(direction=direction))[direction]
        base, search = units[0], units[1:]
        median, best = np.median(base.judge_ppl), np.max(sign * base.reward)
        want = {tuple(u.ids[i]) for u in search for i in range(len(u.ids))
                if u.judge_ppl[i] <= median and sign * u.reward[i] >= best}
        assert got["dominating_responses"] == len(want)
        gains = [sign * u.reward[i] for u in search for i in range(len(u.ids))
                 if u.judge_ppl[i] <= median and sign * u.reward[i] >= best]
        if gains:  # the most rewarding of them, by direction
            assert sign * got["best_dominating"]["reward"] == max(gains)
        else:
            assert got["best_dominating"] is None
        rows = sum(u.judge_ppl[i] <= median and sign * u.reward[i] >= best for u in search for i in range(len(u.ids)))
        repeated += rows > len(want)  # trials where counting rows would be wrong
        ref = (float(np.median(sign * base.reward)), 1000.0)
        assert (sign * got["hypervolume"]["reference"]["reward"], got["hypervolume"]["reference"]["judge_ppl"]) == ref
        assert [c["cap"] for c in got["at_judge_ppl"]] == [30.0, 100.0, median]
        for cap in got["at_judge_ppl"]:
            s_best = [sign * u.reward[i] for u in search for i in range(len(u.ids)) if u.judge_ppl[i] <= cap["cap"]]
            b_best = [sign * r for r, p in zip(base.reward, base.judge_ppl, strict=True) if p <= cap["cap"]]
            assert cap["search"] == (sign * max(s_best) if s_best else None)
            assert cap["best_of_n"] == (sign * max(b_best) if b_best else None)
            assert cap["delta_sd"] == (pytest.approx(max(s_best) - max(b_best)) if s_best and b_best else None)
        s_gain = np.concatenate([sign * u.reward for u in search])
        assert got["hypervolume"]["search"] == pareto.hypervolume(
            s_gain, np.concatenate([u.judge_ppl for u in search]), ref)
    assert repeated >= 10  # the trials do test the counting once


def test_the_truncation_gain_is_the_direction_signed_loss_to_completion_over_distinct_rows():
    """The summary's truncation gain against a brute-force reading of written rows: per group (search at λ > 0,
    at λ = 0, best-of-N), each distinct response once, sign·(reward − completed_reward)/SD, its median and the
    share that ends the turn."""
    from rmjax.search.frontier_out import truncation_gains

    rng = np.random.default_rng(7)
    for trial in range(30):
        direction = ("optimal", "pessimal")[trial % 2]
        sign, sd = (1.0 if direction == "optimal" else -1.0), float(rng.uniform(0.5, 2.0))
        groups = [("search", 0.0), ("search", 1.0), ("best_of_n", 1.0)]
        table = []
        for _ in range(int(rng.integers(1, 30))):
            method, lam = groups[rng.integers(0, 3)]
            table.append({"direction": ("optimal", "pessimal")[rng.integers(0, 2)], "method": method, "lambda": lam,
                          "ids": str(rng.integers(0, 6)), "reward": float(rng.normal()),
                          "completed_reward": float(rng.normal()), "ends_turn": int(rng.integers(0, 2))})
        got = truncation_gains(table, direction, (0.3, sd))
        for name, keep in (("search", lambda r: r["method"] == "search" and r["lambda"] > 0),
                           ("search_lambda0", lambda r: r["method"] == "search" and r["lambda"] == 0),
                           ("best_of_n", lambda r: r["method"] == "best_of_n")):
            rows = {}
            for r in table:  # the last row of each response, as a dict keyed by ids keeps it
                if r["direction"] == direction and keep(r):
                    rows[r["ids"]] = r
            gains = [sign * (r["reward"] - r["completed_reward"]) / sd for r in rows.values()]
            assert got[name]["rows"] == len(gains)
            if gains:
                assert got[name]["median_sd"] == pytest.approx(float(np.median(gains)), abs=1e-12)
                assert got[name]["ends_turn"] == pytest.approx(np.mean([r["ends_turn"] for r in rows.values()]))
            else:
                assert got[name]["median_sd"] is None and got[name]["ends_turn"] is None


def test_complete_answers_at_a_cap_are_the_best_that_end_asked_lazily():
    """at_judge_ppl_complete against a brute-force reading: per method and cap, the most rewarding response (by
    direction) at judge perplexity ≤ cap among those that end the turn (an oracle over distinct responses), its
    lead in SDs; the oracle is asked about each response at most once, and not about every response."""
    from types import SimpleNamespace

    from rmjax.search.frontier_out import complete_at_caps

    rng, end = np.random.default_rng(3), 99
    for _ in range(20):
        ends = {i: bool(rng.random() < 0.3) for i in range(40)}
        units = []
        for direction in ("optimal", "pessimal"):
            for method in ("search", "search", "best_of_n"):
                w = int(rng.integers(1, 60))
                ids = np.full((w, 3), end)
                ids[:, 0] = rng.integers(0, 40, w)  # one-token responses: repeats across units
                units.append(SimpleNamespace(direction=direction, method=method, ids=ids, end=end,
                                             reward=rng.normal(size=w), judge_ppl=rng.uniform(1, 200, w),
                                             z=(0.0, 1.7)))
        summary = {d: {"at_judge_ppl": [{"cap": c} for c in (30.0, 100.0, 57.0)]} for d in ("optimal", "pessimal")}
        asked = []

        def oracle(responses, asked=asked, ends=ends):
            asked.extend(r[0] for r in responses)
            return np.asarray([ends[r[0]] for r in responses])

        complete_at_caps(summary, units, oracle, batch=4)
        assert len(asked) == len(set(asked))  # each response asked once
        for direction, s in summary.items():
            sign = 1.0 if direction == "optimal" else -1.0
            for got in s["at_judge_ppl_complete"]:
                want = {}
                for method in ("search", "best_of_n"):
                    gains = [sign * u.reward[i] for u in units if u.direction == direction and u.method == method
                             for i in range(len(u.ids)) if u.judge_ppl[i] <= got["cap"] and ends[int(u.ids[i, 0])]]
                    want[method] = max(gains) if gains else None
                    assert got[method] == (None if want[method] is None else pytest.approx(sign * want[method]))
                if None in want.values():
                    assert got["delta_sd"] is None
                else:
                    assert got["delta_sd"] == pytest.approx((want["search"] - want["best_of_n"]) / 1.7)
            # the fluency cost over complete answers (the search's): the best complete at any perplexity against
            # the best complete at ≤ 100, brute force
            whole = [(sign * u.reward[i], u.judge_ppl[i]) for u in units if u.direction == direction
                     and u.method == "search" for i in range(len(u.ids)) if ends[int(u.ids[i, 0])]]
            best = max((g for g, _ in whole), default=None)
            fluent = max((g for g, ppl in whole if ppl <= 100), default=None)
            cost = s["fluency_cost_complete"]
            assert cost["best"] == (None if best is None else pytest.approx(sign * best))
            assert cost["best_fluent"] == (None if fluent is None else pytest.approx(sign * fluent))
            if best is None or fluent is None:
                assert cost["reward"] is None and cost["sd"] is None
            else:
                assert cost["reward"] == pytest.approx(best - fluent) and cost["reward"] >= 0
                assert cost["sd"] == pytest.approx((best - fluent) / 1.7)
    assert len(set(asked)) < 40  # lazy: the last trial did not need every response


def test_the_fluency_cost_is_the_best_reward_against_the_best_at_judge_perplexity_100():
    """The summary's fluency cost, against a brute-force reading of every search row: the most rewarding row (by
    direction) at any judge perplexity, the most rewarding at ≤ 100, their difference in reward and in SDs."""
    from rmjax.search.frontier_job import FrontierConfig
    from rmjax.search.frontier_out import summaries
    from rmjax.search.frontier_unit import Unit

    rng, none_fluent, differ = np.random.default_rng(5), 0, 0
    for trial in range(40):
        sign = (1.0, -1.0)[trial % 2]
        direction = "optimal" if sign > 0 else "pessimal"
        units, sd = [], float(rng.uniform(0.5, 2.0))
        for lam in (None, 4.0, 1.0, 0.0):
            w = int(rng.integers(1, 10))
            ppl = np.exp(rng.uniform(1.0, 8.0, w) + (0 if trial % 5 else 4.7))  # every 5th: none fluent
            units.append(Unit("p", direction, "best_of_n" if lam is None else "search", lam,
                              rng.integers(0, 50, (w, 3)), rng.normal(size=w) * 3, np.zeros(w), ppl,
                              np.ones(w, bool), 0.0, np.zeros((0, 2)), (0.3, sd)))
        got = summaries(units, FrontierConfig(direction=direction))[direction]["fluency_cost"]
        rows = [(sign * u.reward[i], u.reward[i], u.judge_ppl[i]) for u in units[1:] for i in range(len(u.ids))]
        best = max(rows)
        fluent = [r for r in rows if r[2] <= 100]
        assert (got["best"]["reward"], got["best"]["judge_ppl"]) == (best[1], best[2])
        if not fluent:
            none_fluent += 1
            assert got["best_fluent"] is None and got["reward"] is None and got["sd"] is None
            continue
        top = max(fluent)
        assert (got["best_fluent"]["reward"], got["best_fluent"]["judge_ppl"]) == (top[1], top[2])
        assert got["reward"] == pytest.approx(best[0] - top[0], abs=1e-12) and got["reward"] >= 0
        assert got["sd"] == pytest.approx((best[0] - top[0]) / sd, abs=1e-12)
        differ += got["reward"] > 0
    assert none_fluent >= 3 and differ >= 10  # both branches, and costs above zero, were tested


def test_the_judge_and_the_sampler_compile_few_programs_over_a_searchs_sizes(tied):
    """helper-165: the judge's (and an implicit side's) log-probs compiled a program per token count (16 for one
    implicit side) and the sampler one per row count (59 starts, 47 and 48 best-of-N draws, the resamples the budget
    left: 4 to 6), the completion check one per row count (6): widths now come in steps of 4 and decoding loops'
    rows are a power of two, at least 8 (batching.decode_rows). Texts of 1 to 4 tokens, one per call, compile one
    judge program; 1, 3 and 8 samples one sampler program, whose first draws are the same whatever the count; 1 and
    3 completions one program (the values: the tests around this one)."""
    from rmjax import compiled as compiled_lib
    from rmjax.scoring.judge import PromptLogProbs

    def programs(name):
        return sum(c.jitted._cache_size() for c in compiled_lib.made(name))

    _, lm, _ = tied
    judge, words = PromptLogProbs(lm, PROMPT), lm.tokenizer.convert_ids_to_tokens(_word_ids(lm.tokenizer).tolist())
    texts = [lm.tokenizer.convert_tokens_to_string(words[:k]) for k in range(1, 5)]
    before = programs("_response_log_probs")
    lengths = [len(judge([text])[0]) for text in texts]
    assert len(set(lengths)) == 4 and max(lengths) <= 4, lengths
    assert programs("_response_log_probs") - before == 1

    prior = Prior.of(lm, chat.split_chat(lm.tokenizer, PROMPT).prefix)
    banned = np.zeros(lm.config.vocab_size, bool)
    before = programs("_sample")
    draws = [prior_lib.sample_responses(lm, prior.cache, prior.first, banned, count, 3, seed=5)[0]
             for count in (1, 3, 8)]
    assert programs("_sample") - before == 1
    for drawn in draws[:2]:
        np.testing.assert_array_equal(drawn, draws[2][: len(drawn)])

    from rmjax.search.completion import greedy_continuations  # the completion check's decoding loop too

    before, prefix = programs("_greedy"), list(prior.prefix)
    ends = [greedy_continuations(lm, prefix, 2, [w.tolist() for w in draws[2][:count]], max_new=3)[0]
            for count in (1, 3)]
    assert programs("_greedy") - before == 1
    np.testing.assert_array_equal(ends[0], ends[1][:1])


def test_judge_perplexity_equals_transformers_on_the_judges_own_conversation(tied, lm_folder):
    """The judge reads the decoded text in its own template, tokenized by itself (here a model whose template
    and tokenizer are SmolLM2's; texts of different token counts)."""
    from rmjax.scoring.judge import judge_perplexities

    hf = tiny.build_hf_model("llama3", vocab_size=49152, pad_token_id=2, bos_token_id=1, eos_token_id=2)
    judge = load(str(lm_folder))
    texts = ["The cat sat on the mat.", "Love", " dog dog dog", "Freedom, obviously", "Love"]
    split = chat.split_chat(judge.tokenizer, PROMPT)
    got = []
    for size, end in ((64, False), (2, False), (64, True), (2, True)):
        # texts of different lengths share a batch, right-padded; "Love" twice runs once; whole turns: the end of
        # turn after the text counts
        got += zip(texts, judge_perplexities(judge, PROMPT, texts, batch_size=size, end_of_turn=end),
                   [end] * len(texts), strict=True)
    for text, ppl, end in got:
        full = chat.Conversations(judge.tokenizer, PROMPT).token_ids([text])[0]
        start, stop = len(split.prefix), len(full) - len(split.suffix)
        assert full[stop] == split.suffix[0]
        mean = _torch_mean_log_prob(hf, full, start, stop + end)
        atol = tolerance.logprobs_atol(judge.params, judge.config, np.asarray([full], np.int32))
        assert abs(np.log(ppl) + mean) <= atol, (text, np.log(ppl), -mean)
    # a base model read as plain text (no chat template): the newline before the next turn ends the response
    plain = chat.split_chat(judge.tokenizer, PROMPT, "plain")
    assert not plain.suffix
    for text, ppl in zip(texts, judge_perplexities(judge, PROMPT, texts, template="plain", end_of_turn=True),
                         strict=True):
        full = chat.Conversations(judge.tokenizer, PROMPT, "plain").token_ids([text])[0]
        full = [*full, _newline(judge.tokenizer)]
        mean = _torch_mean_log_prob(hf, full, len(plain.prefix), len(full))
        atol = tolerance.logprobs_atol(judge.params, judge.config, np.asarray([full], np.int32))
        assert abs(np.log(ppl) + mean) <= atol, (text, np.log(ppl), -mean)


def _swapped_tokenizer(src, dst):
    """A copy of an LM folder whose tokenizer gives two tokens each other's ids."""
    shutil.copytree(src, dst)
    data = json.loads((dst / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    vocab["a"], vocab["b"] = vocab["b"], vocab["a"]
    (dst / "tokenizer.json").write_text(json.dumps(data))
    return dst


def test_the_frontier_job_writes_resumes_byte_for_byte_and_refuses_bad_inputs(rm_folder, lm_folder, tmp_path,
                                                                              monkeypatch, capsys):
    from rmjax.errors import UsageError
    from rmjax.runs.options import RunOptions
    from rmjax.search import frontier_job
    from rmjax.search.frontier_job import FrontierConfig, FrontierSpec, run_frontier

    # 120 forwards buy each search its starts and 3 GCG steps; front_rows=4 keeps front rows beyond the top 3 in
    # the λ = 1 rows (the λ = 0 search's seeds) while the written rows fit one completion batch (64 took two)
    out, F = tmp_path / "f", 120
    cfg = FrontierConfig(lambdas=(0.0, 1.0), direction="both", forwards=F, top=3, z_sample=64, front_rows=4)
    search = fluent.FluentConfig(num_tokens=3, samples=8, beam=2, proposals=4, search_width=16, topk=8)

    def spec(**options):
        return FrontierSpec(RunOptions(model=str(rm_folder), out=str(out), **options), {"greatest": PROMPT}, cfg,
                            search, lm=str(lm_folder), judge=str(lm_folder))

    drawn, draw = [], fluent._sample_starts
    counted, real_update = [], frontier_job.Progress.update
    monkeypatch.setattr(frontier_job.Progress, "update", lambda self, n, force=False: (  # the search's line
        self.unit == "forwards" and counted.append((n, self.total)), real_update(self, n, force))[1])

    def record_starts(objective, search_cfg, banned, retokenize, archive, *rest):
        before = len(archive.ids)
        draw(objective, search_cfg, banned, retokenize, archive, *rest)
        drawn.append({tuple(row) for row in archive.ids[before:]})

    monkeypatch.setattr(fluent, "_sample_starts", record_starts)
    run_frontier(spec())
    monkeypatch.setattr(fluent, "_sample_starts", draw)
    csv = out / "frontier.csv"
    first = csv.read_bytes()
    # the completion check after the search's last line says it starts and ends, over each distinct written row
    responses = __import__("pandas").read_csv(csv, keep_default_na=False)["ids"].nunique()
    label = "[frontier: completion check of the written rows]"
    err = capsys.readouterr().err
    assert f"{label} 0/{responses:,} responses (0.0%)" in err and f"{label} {responses:,}/{responses:,}" in err, err
    # the progress line counts every unit's budget (best-of-N's pooled one too), forward, to its total
    assert all(n >= 0 for n, _ in counted) and sum(n for n, _ in counted) == counted[0][1] == 2 * (2 + 2) * F
    # each λ's search draws its own prior samples (with one seed, λ = 0 paid again for λ = 1's), and the largest
    # λ's search draws the same ones in both directions (it keeps --seed)
    assert len(drawn) == 4 and all(drawn) and not drawn[0] & drawn[1] and not drawn[2] & drawn[3]
    assert drawn[0] == drawn[2]
    table = __import__("pandas").read_csv(csv, keep_default_na=False)
    assert list(table.columns) == ["direction", "lambda", "method", "rank", "ids", "text", "roundtrip", "ends_turn",
                                   "completed_text", "reward", "reward_z", "prior_logp", "judge_ppl",
                                   "completed_reward", "forwards"]
    # the completion check: each completed text starts with its text (equal where the prior ends the turn there),
    # and its reward is what the score job gives that text
    from rmjax.scoring.texts import score_texts

    texts, completed = [json.loads(t) for t in table.text], [json.loads(t) for t in table.completed_text]
    assert all(c.startswith(t) for t, c in zip(texts, completed, strict=True))
    assert all(c == t for t, c, e in zip(texts, completed, table.ends_turn, strict=True) if e)
    assert (np.asarray(completed) != np.asarray(texts)).any()
    some = list(dict.fromkeys(completed))[:6]
    rm = load(str(rm_folder))
    want = dict(zip(some, score_texts(rm, {"greatest": PROMPT}, some)["greatest"], strict=True))
    got = table.groupby(table.completed_text.map(json.loads)).completed_reward.first()
    np.testing.assert_allclose([got[t] for t in some], [want[t] for t in some], rtol=0,
                               atol=tolerance.any_rewards_atol(rm.params, rm.config, 64))
    assert set(table.method) == {"search", "best_of_n"} and set(table.direction) == {"optimal", "pessimal"}
    searched = table.method == "search"  # best-of-N gets the direction's pooled budget: every λ's together
    assert (table.forwards[searched] <= F).all() and (table.forwards[~searched] <= 2 * F).all()
    assert (table.forwards[~searched] > 2 * F - 3).all() and (out / "frontier.png").stat().st_size > 0
    meta = json.loads((out / "frontier.csv.meta.json").read_text())
    assert set(meta["summary"]) == {"optimal", "pessimal"}
    # Issue 45: the summary's best-of-N best and median perplexity were in no CSV; now each is a column's.
    samples = pd.read_csv(out / "frontier_best_of_n.csv")
    assert "frontier_best_of_n.csv" in meta["files"]
    # a sample whose text tokenizes otherwise was written with its ids' reward, not its text's, and ranked
    assert (samples.roundtrip == 1).all() and (table.roundtrip == 1).all()
    for direction, summary in meta["summary"].items():
        mine, base = samples[samples.direction == direction], summary["best_of_n"]
        assert len(mine) == base["samples"] and mine["rank"].tolist() == list(range(1, len(mine) + 1))
        best = mine.reward.max() if direction == "optimal" else mine.reward.min()
        assert best == mine.reward.iloc[0]  # written with 9 significant digits: 5e-9 apart at most
        assert best == pytest.approx(base["best_reward"], rel=1e-8, abs=1e-12)
        assert np.median(mine.judge_ppl) == pytest.approx(base["median_judge_ppl"], rel=1e-8)

    real, calls_made = frontier_job._compute, []

    def crash_after_one(*args, **kwargs):  # the λ = 0 search then starts from the λ = 1 rows read back
        if len(calls_made) == 1:
            raise KeyboardInterrupt
        calls_made.append(args[3:7])
        return real(*args, **kwargs)

    monkeypatch.setattr(frontier_job, "_compute", crash_after_one)
    finished = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    with pytest.raises(KeyboardInterrupt):
        run_frontier(spec(overwrite=True))
    # --overwrite replaces the earlier result only as it writes its own: stopped first, it leaves it whole
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == finished
    for name in finished:  # without it, the crashed run's saved units are what a rerun continues
        (out / name).unlink()
    seeds_given = []
    monkeypatch.setattr(frontier_job, "_compute", lambda *a, **k: (calls_made.append(a[3:7]), seeds_given.append(a[8]),
                                                                    real(*a, **k))[2])
    capsys.readouterr()
    run_frontier(spec())
    assert len(calls_made) == 6  # 1 before the crash, 5 after it: the finished unit was read back
    # issue 45: the progress line names the unit it runs (direction, λ) and counts the unit read back as resumed
    err = capsys.readouterr().err
    assert "[frontier 6/6: greatest pessimal, best-of-N] " in err and ", resumed from " in err, err[-2000:]
    assert calls_made[:2] == [("greatest", "optimal", "search", 1.0), ("greatest", "optimal", "search", 0.0)]
    assert csv.read_bytes() == first
    # the reward_z yardstick, with the tokens it was taken over and none left out for NaN/Inf (helper-108)
    again = json.loads((out / "frontier.csv.meta.json").read_text())["yardsticks_sampled"]["greatest"]
    assert again == meta["yardsticks_sampled"]["greatest"] and again["values"] == 64 and again["nonfinite"] is None
    # the λ = 0 search after the resume was given exactly the λ = 1 rows the CSV holds, with their terms
    written = table[(table.direction == "optimal") & (table["lambda"] == 1.0) & (table.method == "search")]
    ids, reward, logp = seeds_given[0]
    from rmjax.loading import config_and_tokenizer

    end = chat.split_chat(config_and_tokenizer(str(rm_folder))[1], PROMPT).suffix[0]  # fills a short turn's slots
    keys = [" ".join(map(str, turns.tokens(row, end))) for row in ids.tolist()]
    assert sorted(keys) == sorted(written.ids)
    by_ids = dict(zip(written.ids, zip(written.reward, written.prior_logp, strict=True), strict=True))
    np.testing.assert_allclose(  # the CSV keeps 9 significant digits: off by at most half a unit of the 9th
        [by_ids[k] for k in keys], np.stack([reward, logp], 1), rtol=5.1e-9, atol=0)
    assert seeds_given[2] is None  # best-of-N takes no seeds

    # the findings benches read both directions of a --direction=both job (issue 45: one crashed, one dropped
    # the pessimal half)
    import runpy

    bench = Path(__file__).resolve().parents[1] / "bench"
    for script in ("frontier_ceiling.py", "frontier_agreement.py"):  # in-process: two fewer JAX start-ups
        monkeypatch.setattr("sys.argv", [script, str(out)])
        capsys.readouterr()
        runpy.run_path(str(bench / script), run_name="__main__")
        printed = capsys.readouterr().out
        assert "optimal" in printed and "pessimal" in printed, printed

    # refusals, each before the models load (the RM here unties its embeddings: no prior of its own); without --lm
    # the line named "--lm=RM", a flag never given (helper-152): it says the RM is the default
    with pytest.raises(UsageError, match=f"{rm_folder}, the default --lm \\(not given\\), has no LM head"):
        run_frontier(dataclasses_replace(spec(), lm=None, judge=str(lm_folder)))
    with pytest.raises(UsageError, match="another tokenizer"):
        run_frontier(dataclasses_replace(spec(overwrite=True), lm=str(_swapped_tokenizer(lm_folder,
                                                                                         tmp_path / "swapped"))))
    with pytest.raises(UsageError, match="one prompt per job.*or --prompts= with --prompt"):
        run_frontier(dataclasses_replace(spec(overwrite=True), prompts={"a": "A?", "b": "B?"}))


def dataclasses_replace(spec, **changes):
    import dataclasses

    return dataclasses.replace(spec, **changes)


def test_bad_flags_stop_the_entry_point_in_one_line_before_any_model_loads(tmp_path):
    out = tmp_path / "f"
    lambdas, share, shares, word, blank = cli.run_each(  # in one interpreter (tests.cli.run_each)
        ("frontier", "--model=/nonexistent/model", "--lambdas=0,-1", f"--out={out}"),
        ("frontier", "--model=/nonexistent/model", "--start_share=1.5", f"--out={out}"),
        # the prior's samples would take the starts' whole share, leaving the start beam nothing (a fault hunt)
        ("frontier", "--model=/nonexistent/model", "--sample_share=0.4", "--start_share=0.4", f"--out={out}"),
        # not numbers: a float() traceback, status 1 (a fault hunt)
        ("frontier", "--model=/nonexistent/model", "--best_of_n_temperatures=0.7,hot", f"--out={out}"),
        ("frontier", "--model=/nonexistent/model", "--lambdas=0,,1", f"--out={out}"))
    cli.user_error(lambdas, "--lambdas=0.0,-1.0", "distinct finite numbers >= 0")
    cli.user_error(share, "--start_share=1.5")
    cli.user_error(shares, "--sample_share=0.4 must be below --start_share=0.4")
    cli.user_error(word, "--best_of_n_temperatures takes numbers separated by commas")
    cli.user_error(blank, "--lambdas takes numbers separated by commas")
    assert not out.exists()


def test_the_figures_best_of_n_front_is_over_every_sample_not_its_written_rows(monkeypatch, tmp_path):
    """The summary's best-of-N numbers come from all its samples; the figure's best-of-N front came from its few
    written rows, and missed samples that dominate them (helper-161: −9.21 at perplexity 25.5 unplotted, the front
    reaching −8.99). The front drawn is the samples' own, against a brute-force dominance check."""
    from rmjax.search import frontier_out

    rng = np.random.default_rng(7)
    samples = [{"direction": d, "reward": float(r), "judge_ppl": float(p)} for d in ("optimal", "pessimal")
               for r, p in zip(rng.normal(size=60), np.exp(rng.uniform(1, 7, 60)), strict=True)]
    table = [{"direction": d, "method": m, "reward": float(r), "judge_ppl": float(p)}
             for d in ("optimal", "pessimal") for m in ("search", "best_of_n")
             for r, p in zip(rng.normal(size=5), np.exp(rng.uniform(1, 7, 5)), strict=True)]
    drawn = {}
    monkeypatch.setattr(frontier_out, "_write_rows", lambda *a: None)
    monkeypatch.setattr(frontier_out.plots, "frontier_scatter", lambda rows, fronts, *a: drawn.update(fronts))
    frontier_out.write(tmp_path / "f.csv", table, {"optimal": {}, "pessimal": {}}, samples)
    for d, sign in (("optimal", 1.0), ("pessimal", -1.0)):
        mine = [s for s in samples if s["direction"] == d]
        want = [s for s in mine if not any(sign * o["reward"] >= sign * s["reward"] and o["judge_ppl"] <= s["judge_ppl"]
                                           and (o["reward"], o["judge_ppl"]) != (s["reward"], s["judge_ppl"])
                                           for o in mine)]
        key = lambda r: (r["judge_ppl"], r["reward"])  # noqa: E731
        assert sorted(map(key, drawn[(d, "best_of_n")])) == sorted(map(key, want)) and len(want) >= 2
        search = [r for r in table if r["direction"] == d and r["method"] == "search"]
        assert all(r in search for r in drawn[(d, "search")])
