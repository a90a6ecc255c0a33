"""GCG: gradient vs PyTorch autograd, exhaustive optima on a tiny vocabulary, filters, objectives."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
import torch

from rmjax.errors import OutputExistsError, UsageError
from rmjax.loading import load
from rmjax.search.gcg import evaluate, gcg, make_target, reward_gradient
from rmjax.search.gcg_config import GCGConfig
from rmjax.search.gcg_swaps import disallowed_ids
from tests import jitted as M
from tests import tiny, tolerance

PREFIX, SUFFIX = (1, 17, 33, 5, 60), (2, 9)


@pytest.fixture(scope="module")
def tiny_rm(tmp_path_factory):
    hf = tiny.build_hf_model("gemma2", num_labels=1, seed=11)
    model = load(str(tiny.save_hf_model(hf, tmp_path_factory.mktemp("g"))), require_tokenizer=False)
    return hf, model


def _full_rewards(model, responses: np.ndarray, prefix=PREFIX, suffix=SUFFIX) -> np.ndarray:
    ids = np.asarray([[*prefix, *r, *suffix] for r in responses], np.int32)
    return np.asarray(M.rewards(model.params, model.config, ids, np.ones_like(ids, bool)))[:, 0]


def _atol(model, responses, prefix=PREFIX, suffix=SUFFIX) -> float:
    """The float32 bound (tests/tolerance.py) on these responses' rewards: GCG's cached, packed forwards and one
    full forward per sequence round differently."""
    ids = np.asarray([[*prefix, *r, *suffix] for r in responses], np.int32)
    return tolerance.rewards_atol(model.params, model.config, ids)


def test_one_hot_gradient_matches_pytorch(tiny_rm, tmp_path):
    hf, model = tiny_rm
    target = make_target(model, "", prefix=PREFIX, suffix=SUFFIX)
    response = np.asarray([40, 7, 88], np.int32)
    got = reward_gradient(target, response)
    emb = hf.model.embed_tokens
    one_hot = torch.nn.functional.one_hot(torch.from_numpy(response).long(), tiny.VOCAB).float().requires_grad_()
    scale = emb.embed_scale.to(emb.weight.dtype)  # Gemma's sqrt(hidden), applied after the one-hot matmul
    embeds = torch.cat([emb(torch.tensor(PREFIX)), (one_hot @ emb.weight) * scale, emb(torch.tensor(SUFFIX))])
    reward = hf(inputs_embeds=embeds[None]).logits[0, 0]
    reward.backward()
    # d reward / d one-hot = table @ d reward / d embedding: its last inner product runs over the hidden size
    length, hidden = len(PREFIX) + len(response) + len(SUFFIX), model.config.hidden_size
    np.testing.assert_allclose(got, one_hot.grad.numpy(), atol=tolerance.grad_atol(got, model.config, length, hidden),
                               rtol=0)
    assert np.abs(got).max() > 1e-3
    # bfloat16 weights: the same gradient within bf16 rounding (the backward accumulates in float32)
    half = load(str(tiny.save_hf_model(hf, tmp_path)), dtype="bfloat16", require_tokenizer=False)
    got_half = reward_gradient(make_target(half, "", prefix=PREFIX, suffix=SUFFIX), response)
    assert got_half.dtype == np.float32
    scale = np.abs(one_hot.grad.numpy()).max()
    # bf16 rounds each stored weight and activation once (u = 2^-8, the same on any IEEE CPU): measured 0.9% of the
    # scale; 3% still fails a bf16 accumulation, which adds about sqrt(n)·u (tests/tolerance.py)
    np.testing.assert_allclose(got_half, one_hot.grad.numpy(), atol=0.03 * scale, rtol=0)


@pytest.mark.parametrize("direction", ["optimal", "pessimal"])
def test_single_token_finds_the_sweep_extreme(tiny_rm, direction):
    _, model = tiny_rm
    all_tokens = np.arange(tiny.VOCAB)[:, None]
    scores = _full_rewards(model, all_tokens)
    target = make_target(model, "", prefix=PREFIX, suffix=SUFFIX)
    cfg = GCGConfig(num_tokens=1, steps=3, search_width=tiny.VOCAB, topk=tiny.VOCAB, selection="greedy",
                    direction=direction, retokenize_filter=False)
    res = gcg([target], cfg)
    expected = scores.argmax() if direction == "optimal" else scores.argmin()
    assert res.best_ids == [int(expected)]
    assert res.best_reward == pytest.approx(float(scores[expected]), abs=_atol(model, [[expected]]))


def test_two_tokens_find_the_exhaustive_optimum(tiny_rm):
    _, model = tiny_rm
    pairs = np.asarray(list(itertools.product(range(tiny.VOCAB), repeat=2)), np.int32)
    scores = np.concatenate([_full_rewards(model, pairs[i : i + 1024]) for i in range(0, len(pairs), 1024)])
    best = pairs[scores.argmax()].tolist()
    target = make_target(model, "", prefix=PREFIX, suffix=SUFFIX)
    found = []
    for seed in range(3):
        # random single swaps among each position's 64 (of 96) most promising tokens by gradient
        cfg = GCGConfig(num_tokens=2, steps=12, search_width=128, topk=64, n_replace=1, seed=seed,
                        retokenize_filter=False, buffer_size=4)
        res = gcg([target], cfg)
        found.append(res.best_ids)
        assert res.best_reward == pytest.approx(float(scores[scores.argmax()]), abs=_atol(model, [best])), (
            seed, res.best_ids, best)
    assert all(f == best for f in found)


def test_pessimal_buffer_decreases_monotonically(tiny_rm):
    _, model = tiny_rm
    target = make_target(model, "", prefix=PREFIX, suffix=SUFFIX)
    res = gcg([target], GCGConfig(num_tokens=3, steps=8, search_width=32, topk=8, direction="pessimal",
                                  retokenize_filter=False, seed=1))
    rewards = [h["reward"] for h in res.history]
    assert all(b <= a for a, b in zip(rewards, rewards[1:], strict=False))
    assert rewards[-1] < rewards[0]
    assert res.best_reward == pytest.approx(float(_full_rewards(model, np.asarray([res.best_ids]))[0]),
                                            abs=_atol(model, [res.best_ids]))


def test_an_init_is_refused_not_replaced_by_a_random_start_when_the_model_has_no_tokenizer(tiny_rm):
    """A model loaded without a tokenizer cannot read --init; the search started from random ids instead and
    reported them as the search from the typed response."""
    _, model = tiny_rm
    assert model.tokenizer is None
    target = make_target(model, "", prefix=PREFIX, suffix=SUFFIX)
    with pytest.raises(UsageError, match="--init ' love' needs the model's tokenizer"):
        gcg([target], GCGConfig(num_tokens=1, steps=1, init=(" love",), retokenize_filter=False))


def test_a_step_of_many_batches_runs_in_slices_with_a_progress_line(tiny_rm, monkeypatch, capsys):
    """A step longer than PROGRESS_BATCHES batches reports its progress (a huge --search_width showed nothing for
    hours); its slices keep each reward with its candidate: every buffer entry equals a full forward of its ids."""
    from rmjax.search import gcg as gcg_lib

    _, model = tiny_rm
    monkeypatch.setattr(gcg_lib, "PROGRESS_BATCHES", 1)
    target = make_target(model, "", prefix=PREFIX, suffix=SUFFIX)
    res = gcg([target], GCGConfig(num_tokens=3, steps=3, search_width=32, topk=8, eval_batch_size=4,
                                  retokenize_filter=False, seed=2))
    lines = [ln for ln in capsys.readouterr().err.splitlines()  # each step's last (a slow step prints more)
             if ln.startswith("[gcg optimal step ") and "(100.0%)" in ln]
    assert [ln.split("]")[0] for ln in lines] == [f"[gcg optimal step {k}" for k in (1, 2, 3)]
    assert all(f"{h['candidates']}/{h['candidates']} candidates (100.0%)" in ln
               for ln, h in zip(lines, res.history, strict=True))
    ids = np.asarray([entry for _, entry in res.buffer])
    np.testing.assert_allclose([r for r, _ in res.buffer], _full_rewards(model, ids), atol=_atol(model, ids), rtol=0)


def test_multi_prompt_objective_is_the_mean(tiny_rm):
    _, model = tiny_rm
    other_prefix = (1, 4, 4, 70)
    t1 = make_target(model, "", prefix=PREFIX, suffix=SUFFIX)
    t2 = make_target(model, "", prefix=other_prefix, suffix=(2,))
    cands = np.random.default_rng(0).integers(3, tiny.VOCAB, size=(10, 3)).astype(np.int32)
    got = evaluate([t1, t2], cands)
    ref = (_full_rewards(model, cands) + _full_rewards(model, cands, other_prefix, (2,))) / 2
    atol = max(_atol(model, cands), _atol(model, cands, other_prefix, (2,)))  # (a mean: within the larger bound)
    np.testing.assert_allclose(got, ref, atol=atol, rtol=0)


def test_filters_hold_on_a_real_tokenizer(tmp_path):
    _, folder = tiny.save_reward_model_with_tokenizer(tmp_path)
    model = load(str(folder))
    target = make_target(model, "What, in one word, is the greatest thing ever?")
    res = gcg([target], GCGConfig(num_tokens=3, steps=4, search_width=32, topk=16, seed=0))
    banned = disallowed_ids(model.tokenizer, model.config.vocab_size, False, False)
    assert banned[model.tokenizer.convert_tokens_to_ids("<|im_end|>")]
    n = len(model.tokenizer)  # an embedding table padded past the tokenizer: those rows decode to nothing
    padded = disallowed_ids(model.tokenizer, n + 7, True, True)
    assert padded[n:].all() and not padded[:n].all()
    for _, ids in res.buffer:
        assert not banned[ids].any()
        text = model.tokenizer.decode(ids)
        assert text.isascii()
    # every candidate kept after step 0 re-tokenizes to itself inside the template
    from rmjax.text.chat import Conversations

    conv = Conversations(model.tokenizer, target.prompt)
    for h in res.history:
        assert conv.token_ids([h["text"]])[0] == [*target.prefix, *h["ids"], *target.suffix]


def test_gcg_entry_point_writes_results(rm_folder, tmp_path):
    import json

    from tests import cli

    folder = rm_folder  # the session's tiny RM (what tiny.save_reward_model_with_tokenizer makes), not another
    out = tmp_path / "gcg.json"
    # tests.cli.run: the compile cache and quick compiles the other entry-point tests' subprocesses get
    proc = cli.run("gcg", f"--model={folder}", "--prompts=greatest", "--num_tokens=2", "--steps=3",
                   "--search_width=16", "--topk=8", "--direction=pessimal", f"--out={out}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "step 3/3" in proc.stderr
    record = json.loads(out.read_text())
    model = load(str(folder))
    target = make_target(model, "What, in one word, is the greatest thing ever?")
    ids = np.asarray([[*target.prefix, *record["best_ids"], *target.suffix]], np.int32)
    ref = float(np.asarray(M.rewards(model.params, model.config, ids, np.ones_like(ids, bool)))[0, 0])
    assert record["best_reward"] == pytest.approx(ref, abs=tolerance.rewards_atol(model.params, model.config, ids))
    assert out.with_name(out.name + ".steps.csv").is_file() and (tmp_path / "gcg.json.meta.json").is_file()


def test_embed_reg_uses_true_embedding_distances():
    """Greedy swaps with the embedding-distance penalty equal a brute-force [N, V, H] computation."""
    import jax

    from rmjax.search.gcg_swaps import sample_candidates, swap_scores

    rng = np.random.default_rng(0)
    embed = rng.normal(size=(50, 8)).astype(np.float32)
    current = np.array([3, 17, 42])
    grad = rng.normal(size=(3, 50)).astype(np.float32)
    cfg = GCGConfig(num_tokens=3, selection="greedy", embed_reg=0.7, topk=10, search_width=6)
    no_ban = np.zeros(50, bool)
    key = jax.random.key(0)
    got = sample_candidates(current, swap_scores(grad, no_ban, current, embed, 0.7), cfg, key)
    dist = np.linalg.norm(embed[None, :, :] - embed[current][:, None, :], axis=-1)
    score = grad + 0.7 * dist / dist.mean()
    best = sorted((score[p, v], p, v) for p in range(3) for v in range(50))[:6]
    want = np.repeat(current[None], 6, axis=0)
    for row, (_, p, v) in enumerate(best):
        want[row, p] = v
    np.testing.assert_array_equal(got, want)
    # |e - c|² = |e|² + |c|² - 2 e·c in float32 is off by at most (H + 2)·u·(|e| + |c|)² (H = 8 terms, worst case),
    # and the square root turns that into at most its square root where the distance is ~0 (the current token:
    # |e - e| comes out ~1e-3, not 0); the penalty scales it by 0.7 / mean distance.
    norm = np.linalg.norm(embed, axis=-1).max()
    atol = 0.7 * np.sqrt((8 + 2) * tolerance.U32 * (2 * norm) ** 2) / dist.mean()
    atol += 4 * tolerance.U32 * np.abs(score).max()  # (and the sums' own rounding)
    np.testing.assert_allclose(np.asarray(swap_scores(grad, no_ban, current, embed, 0.7)), score, rtol=0, atol=atol)
    plain = sample_candidates(current, swap_scores(grad, no_ban, current, None, 0.0), cfg, key)
    assert not np.array_equal(got, plain)  # the penalty changes the choice


def test_an_embed_reg_near_float32s_largest_keeps_every_swap_in_distance_order():
    """--embed_reg=3e38 passes the float32 check, but weight × distance / mean distance overflowed to +inf for every
    token farther than the mean: all unproposed, unsaid. The scores keep the order of the float64 penalty."""
    from rmjax.search.gcg_swaps import swap_scores

    rng = np.random.default_rng(1)
    embed = rng.normal(size=(50, 8)).astype(np.float32)
    current = np.array([3, 17, 42])
    grad = rng.normal(size=(3, 50)).astype(np.float32)
    got = np.asarray(swap_scores(grad, np.zeros(50, bool), current, embed, 3e38))
    assert np.isfinite(got).all()
    dist = np.linalg.norm(embed[None, :, :].astype(np.float64) - embed[current][:, None, :], axis=-1)
    want = grad + 3e38 * (dist / dist.mean())  # float64: no overflow; the gradient is below its resolution
    # |e - c|² in float32 is off by at most δ = (H + 2)·u·(|e| + |c|)² (test_embed_reg_uses_true_embedding_distances),
    # so a distance d ≥ sqrt(2δ) by at most δ / d; the division by the mean and the sum add a few u of it. Tokens
    # whose distances differ by more than twice that are ranked as in float64.
    delta = (8 + 2) * tolerance.U32 * (2 * np.linalg.norm(embed, axis=-1).max()) ** 2
    for p in range(3):
        others = np.setdiff1d(np.arange(50), current[p])
        order = others[np.argsort(want[p, others], kind="stable")]
        assert dist[p, others].min() ** 2 > 2 * delta
        error = delta / dist[p, others].min() + 4 * tolerance.U32 * dist[p].max()
        assert np.diff(dist[p, order]).min() > 2 * error  # the draw leaves no near-ties to break
        np.testing.assert_array_equal(order, others[np.argsort(got[p, others], kind="stable")])


def test_greedy_selection_swaps_n_replace_positions():
    """Issue 14: --selection=greedy made single swaps whatever n_replace, so the stall fallback (which raises
    n_replace) produced the same candidates again."""
    import jax

    from rmjax.search.gcg_swaps import sample_candidates

    rng = np.random.default_rng(0)
    current = np.asarray([5, 6, 7, 8], np.int32)
    grad = rng.normal(size=(4, 50)).astype(np.float32)
    for n_replace in (1, 2, 3):
        cfg = GCGConfig(num_tokens=4, search_width=20, topk=8, n_replace=n_replace, selection="greedy")
        cands = sample_candidates(current, jax.numpy.asarray(grad), cfg, jax.random.key(0))
        changed = (cands != current).sum(axis=1)
        assert (changed == n_replace).all(), (n_replace, changed)
        assert len({tuple(c) for c in cands.tolist()}) == len(cands)  # deterministic, and no repeats
        # the i-th candidate holds the i-th best single swap (by gradient)
        order = np.argsort(np.take_along_axis(grad, np.argsort(grad, axis=1)[:, :8], axis=1), axis=None)
        pos, rank = np.unravel_index(order[0], (4, 8))
        assert cands[0][pos] == np.argsort(grad, axis=1)[pos, rank]
    # where a position's best token is its current one, its extra swap is its second best
    grad[0, current[0]], grad[0, 20] = -10.0, -9.0
    cfg = GCGConfig(num_tokens=4, search_width=20, topk=8, n_replace=2, selection="greedy")
    cands = sample_candidates(current, jax.numpy.asarray(grad), cfg, jax.random.key(0))
    assert (cands[:, 0] == 20).sum() >= len(cands) - 8  # all but the swaps at position 0 itself (top 8)


def test_buffer_holds_each_sequence_once_without_the_history(tiny_rm):
    """Issue 14: with --noforbid_revisits a sequence found again was added again, filling the buffer with copies."""
    _, model = tiny_rm
    target = make_target(model, "", prefix=PREFIX, suffix=SUFFIX)
    res = gcg([target], GCGConfig(num_tokens=2, steps=6, search_width=64, topk=4, buffer_size=8, seed=0,
                                  forbid_revisits=False, retokenize_filter=False))
    ids = [tuple(i) for _, i in res.buffer]
    assert len(ids) == len(set(ids)), ids


def test_start_and_every_target_pass_the_retokenization_filter(tmp_path):
    """Issue 14: only the first target's template was checked, and the start (' x x x') never was: with a
    template that trims the response, a sequence no conversation produces could be reported as best."""
    from rmjax.text.chat import Conversations

    _, plain = tiny.save_reward_model_with_tokenizer(tmp_path / "a")
    trimmed = tmp_path / "b"
    import shutil

    shutil.copytree(plain, trimmed)
    template = (trimmed / "chat_template.jinja").read_text()
    assert "message['content']" in template
    (trimmed / "chat_template.jinja").write_text(template.replace("message['content']", "(message['content'] | trim)"))
    prompt = "What, in one word, is the greatest thing ever?"
    targets = [make_target(load(str(plain)), prompt), make_target(load(str(trimmed)), prompt)]
    res = gcg(targets, GCGConfig(num_tokens=3, steps=3, search_width=32, topk=16, seed=0))
    assert res.history[0]["ids"][0] != targets[0].model.tokenizer(" x", add_special_tokens=False).input_ids[0]
    for t in targets:
        conv = Conversations(t.model.tokenizer, prompt)
        for h in res.history:
            assert conv.token_ids([h["text"]])[0] == [*t.prefix, *h["ids"], *t.suffix], (t.model.source, h["text"])


def test_random_candidates_come_from_the_top_k_on_the_device():
    """Issue 14: top-k and sampling run on the device; every candidate swaps n_replace distinct positions, each to
    one of that position's k best tokens by an independent numpy argsort, never to a banned token."""
    import jax

    from rmjax.search.gcg_swaps import sample_candidates, swap_scores

    rng = np.random.default_rng(1)
    current = np.asarray([5, 6, 7, 8, 9], np.int32)
    grad = rng.normal(size=(5, 300)).astype(np.float32)
    banned = np.zeros(300, bool)
    banned[np.argsort(grad, axis=1)[:, :3].ravel()] = True  # the three best tokens of every position are banned
    grad[0, 10] = np.nan  # no gradient: never chosen
    masked = np.where(banned[None] | ~np.isfinite(grad), np.inf, grad)
    allowed_top = np.argsort(masked, axis=1)[:, :7]
    for n_replace in (1, 3):
        cfg = GCGConfig(num_tokens=5, search_width=64, topk=7, n_replace=n_replace)
        cands = sample_candidates(current, swap_scores(grad, banned, current, None, 0.0), cfg, jax.random.key(3))
        assert cands.shape == (64, 5)
        for c in cands:
            changed = np.flatnonzero(c != current)
            assert len(changed) <= n_replace  # a swap may pick the current token back
            for p in changed:
                assert c[p] in allowed_top[p] and not banned[c[p]]
        assert (cands != current).sum(1).max() == n_replace
        assert len({tuple(c) for c in cands.tolist()}) > 20  # sampled (35 single swaps exist), not one repeated
    few = np.arange(300) >= 40  # --topk past the allowed tokens: top-k stops at them, never reaching a banned one
    cfg = GCGConfig(num_tokens=5, search_width=64, topk=1000, n_replace=3)
    cands = sample_candidates(current, swap_scores(grad, few, current, None, 0.0), cfg, jax.random.key(4))
    swapped = cands[cands != current]
    assert len(swapped) > 64 and not few[swapped].any()


def test_init_from_starts_the_buffer_from_the_beams_best(rm_folder, tmp_path):
    """Issue 14: --init_from=BEAM_CSV seeds the buffer with the beam's best sequences of --num_tokens tokens (those
    GCG may reach): after one step the beam's best is in the buffer, or GCG found better (full-forward rewards)."""
    from rmjax.errors import UsageError
    from rmjax.runs import results
    from rmjax.search.beam import BeamConfig
    from rmjax.search.beam_job import write_beam

    model = load(str(rm_folder))
    words = [" cat", " dog", " house", " sun", " love", " war", " tree", " music"]
    s = [model.tokenizer(w, add_special_tokens=False).input_ids[0] for w in words]
    out = tmp_path / "beam.csv"
    prompt = "What, in one word, is the greatest thing ever?"
    write_beam(model, {"p": prompt}, BeamConfig(depth=2, top=8, exhaustive=True), np.asarray(s), out=out, batch_size=8)
    df = results.read_beam_csv(out)
    target = make_target(model, prompt)
    for direction, sign in (("optimal", 1.0), ("pessimal", -1.0)):
        row = df[(df.depth == 2) & (df.direction == direction)].iloc[0]
        cfg = GCGConfig(num_tokens=2, steps=1, search_width=8, topk=4, buffer_size=4, init_from=str(out),
                        direction=direction, seed=0)
        res = gcg([target], cfg)
        full = _full_rewards(model, np.asarray([res.best_ids, list(row.ids)]), target.prefix, target.suffix)
        atol = _atol(model, [res.best_ids, list(row.ids)], target.prefix, target.suffix)
        assert res.best_reward == pytest.approx(full[0], abs=atol)
        assert row.p == pytest.approx(full[1], abs=atol)
        assert list(row.ids) in [ids for _, ids in res.buffer] or sign * (res.best_reward - row.p) > 0
        assert " x" not in res.history[0]["text"]  # the default start is not added to the seeds
    with pytest.raises(UsageError, match="no optimal sequences of --num_tokens=3.*run the beam with --depth=3"):
        gcg([target], GCGConfig(num_tokens=3, steps=1, init_from=str(out)))
    # the depth is there but not the direction: the fix named is the direction (it named --depth=2 again)
    one_way = tmp_path / "optimal.csv"
    write_beam(model, {"p": prompt}, BeamConfig(depth=2, top=8, exhaustive=True, direction="optimal"), np.asarray(s),
               out=one_way, batch_size=8)
    with pytest.raises(UsageError, match=r"no pessimal sequences.*run the beam with --direction=pessimal \(or both\)"):
        gcg([target], GCGConfig(num_tokens=2, steps=1, init_from=str(one_way), direction="pessimal"))
    with pytest.raises(UsageError, match=r"run the beam with --depth=3 --direction=pessimal \(or both\)"):
        gcg([target], GCGConfig(num_tokens=3, steps=1, init_from=str(one_way), direction="pessimal"))
    # a missing file is the job's refusal, before any weight loads, not the config's: a launch checks the config
    # on another machine than the job's (a TPU VM's /tmp/ckpt/beam.csv is not on the launching one)
    from rmjax.search.gcg_job import GcgSpec, run_gcg
    from tests import inproc

    assert GCGConfig(init_from="/tmp/ckpt/beam.csv", vocab_file="/tmp/ckpt/words.txt").init_from
    with pytest.MonkeyPatch.context() as patch:
        inproc.no_weights_read(patch)
        for missing in ({"init_from": str(tmp_path / "missing.csv")}, {"vocab_file": str(tmp_path / "none.txt")}):
            cfg = GCGConfig(num_tokens=2, steps=1, **missing)
            spec = GcgSpec(inproc.options(rm_folder, tmp_path / "g.json"), {"p": prompt}, cfg)
            inproc.refused(lambda: run_gcg(spec), *missing.values())  # noqa: B023
    assert not (tmp_path / "g.json").exists()


def test_vocab_file_keeps_the_search_and_its_start_inside_the_set(rm_folder, tmp_path):
    """GCG --vocab_file (to be judged against the beam on the same set): every sequence it reports, the default
    start included, is made of the file's single tokens only."""
    model = load(str(rm_folder))
    words = [" cat", " dog", " house", " sun", " love", " war", "two words"]
    path = tmp_path / "words.txt"
    path.write_text("\n".join(words) + "\n", encoding="utf-8")
    allowed = {model.tokenizer(w, add_special_tokens=False).input_ids[0] for w in words[:-1]}
    target = make_target(model, "What, in one word, is the greatest thing ever?")
    res = gcg([target], GCGConfig(num_tokens=3, steps=4, search_width=16, topk=4, vocab_file=str(path),
                                  retokenize_filter=False, seed=0))
    assert set(res.history[0]["ids"]) <= allowed
    for h in res.history:
        assert set(h["ids"]) <= allowed, h
    for _, ids in res.buffer:
        assert set(ids) <= allowed


@pytest.mark.parametrize("kind", ["gemma2", "gemma3", "llama3", "mesh"])
def test_variants_run_from_their_first_change_and_equal_full_forwards(kind, tiny_rm, tmp_path):
    """GCG evaluates each candidate from its first changed position against a cache of prefix + current
    (prefix.score_variants), the tails packed several to a row; the rewards equal full-sequence forwards,
    whatever the positions, packing and calls, with the cache from extend_prefix or from the gradient's own
    forward (prefix.append_kv), on sliding-window and sandwich-norm families and over a mesh."""
    from rmjax.parallel.sharding import make_mesh
    from rmjax.scoring.prefix import extend_prefix, pack, score_variants
    from rmjax.search import gcg as gcg_lib

    if kind in ("gemma2", "mesh"):
        hf, model = tiny_rm
        if kind == "mesh":
            model = load(str(tiny.save_hf_model(hf, tmp_path)), require_tokenizer=False,
                         mesh=make_mesh("data:4,model:2"))
    else:
        folder = tiny.save_hf_model(tiny.build_hf_model(kind, num_labels=1, seed=3), tmp_path)
        model = load(str(folder), require_tokenizer=False)
    target = make_target(model, "", prefix=PREFIX, suffix=SUFFIX)
    rng = np.random.default_rng(5)
    current = rng.integers(3, tiny.VOCAB, 6)
    variants = np.repeat(current[None], 23, axis=0)
    for i, row in enumerate(variants):
        positions = rng.choice(6, size=1 + i % 3, replace=False)
        row[positions] = rng.integers(3, tiny.VOCAB, len(positions))
    variants[0] = current  # unchanged: reruns its last token
    changed = variants != current
    tails = 6 - np.where(changed.any(1), changed.argmax(1), 5) + len(SUFFIX)
    assert len(pack(tails, 6 + 2 * len(SUFFIX) + 1)) < len(variants) - 5  # several tails share rows
    want = _full_rewards(model, variants)
    assert np.isfinite(want).all() and np.ptp(want) > 1e-3  # (NaN would compare equal to NaN)
    from_gradient = gcg_lib.reward_gradient_on_device(target, current)[1]
    for extended in (extend_prefix(model, target.cache, current[None]), from_gradient):
        for rows in (8, 32):
            got = score_variants(model, extended, np.asarray(SUFFIX, np.int32), current, variants, rows)
            np.testing.assert_allclose(got, want, atol=_atol(model, variants), rtol=0)


PROMPT = "What, in one word, is the greatest thing ever?"
WORDS = [" cat", " dog", " house", " sun", " love", " war", " tree", " music"]


def _record(monkeypatch) -> list[tuple[str, object]]:
    """In order: every batch sample_candidates made, every batch evaluated and every log line of a gcg() run
    (pass `log=lambda m: events.append(("log", m))`)."""
    from rmjax.search import gcg as gcg_lib

    events = []
    sample, evaluate_ = gcg_lib.sample_candidates, gcg_lib.evaluate

    def sampled(*args, **kwargs):
        out = sample(*args, **kwargs)
        events.append(("sampled", np.asarray(out).copy()))
        return out

    def evaluated(targets, cands, *args, **kwargs):
        events.append(("evaluated", np.asarray(cands).copy()))
        return evaluate_(targets, cands, *args, **kwargs)

    monkeypatch.setattr(gcg_lib, "sample_candidates", sampled)
    monkeypatch.setattr(gcg_lib, "evaluate", evaluated)
    return events


def _warned_steps(caplog) -> dict[int, str]:
    import re

    return {int(re.match(r"GCG step (\d+):", r.getMessage()).group(1)): r.getMessage()
            for r in caplog.records if r.levelname == "WARNING" and r.getMessage().startswith("GCG step ")}


def test_step_candidate_counts_equal_a_recount_of_the_filters(rm_folder, monkeypatch, caplog):
    """Issue 21 (6): per step, the candidates evaluated and what each filter removed (repeats in the batch, sequences
    evaluated before, re-tokenization failures), recounted by brute force from the sampled batches; retries (a
    batch with nothing left) are logged; a step with under a quarter of --search_width left is warned about."""
    import logging

    from rmjax.text.chat import Conversations

    model = load(str(rm_folder))
    target = make_target(model, PROMPT)
    conv = Conversations(model.tokenizer, PROMPT)
    cfg = GCGConfig(num_tokens=2, steps=6, search_width=32, topk=8, buffer_size=4, seed=0)
    events = _record(monkeypatch)
    with caplog.at_level(logging.WARNING):
        res = gcg([target], cfg, log=lambda m: events.append(("log", m)))
    assert events[0][0] == "evaluated"  # the start
    evaluated = {tuple(r) for r in events[0][1].tolist()}
    batches, kept, step, totals = [], None, 0, dict.fromkeys(("repeats", "revisits", "retokenize_failed"), 0)
    for kind, value in events[1:]:
        if kind == "sampled":
            batches.append(value.tolist())
        elif kind == "evaluated":
            kept = {tuple(r) for r in value.tolist()}
        elif f"step {step + 1}/{cfg.steps} " in value:
            record = res.history[step]
            assert record["retries"] == len(batches) - 1
            retries = [m for k, m in events if k == "log" and f"step {step + 1}: " in m and "retrying" in m]
            assert len(retries) == len(batches) - 1  # each retry is logged
            for i, rows in enumerate(batches):
                distinct = set(map(tuple, rows))
                fresh = distinct - evaluated
                passed = {c for c in fresh if conv.token_ids([model.tokenizer.decode(list(c))])[0]
                          == [*target.prefix, *c, *target.suffix]}
                if i < len(batches) - 1:
                    assert not passed  # a retry only follows a batch with nothing left
                    continue
                assert record["candidates"] == len(passed)
                assert (record["sampled"], record["repeats"], record["revisits"], record["retokenize_failed"]) == (
                    len(rows), len(rows) - len(distinct), len(distinct - fresh), len(fresh - passed))
                assert passed == (kept or set())  # exactly those were evaluated
                evaluated |= passed
                for name in totals:
                    totals[name] += record[name]
            batches, kept, step = [], None, step + 1
    assert step == len(res.history) == cfg.steps
    assert all(totals.values()), totals  # every filter removed something in this run
    warned = _warned_steps(caplog)
    assert set(warned) == {h["step"] for h in res.history if 4 * h["candidates"] < cfg.search_width}
    for s, message in warned.items():
        assert f"{res.history[s - 1]['candidates']} of --search_width=32" in message and "To get more" in message
    # from step 2 on, a step's line says the time left at the mean pace of the steps after the first (it compiled)
    from rmjax.runs.progress import duration

    lines = [next(m for k, m in events if k == "log" and f"step {n}/{cfg.steps} " in m) for n in range(1, 7)]
    first = res.history[0]["seconds"]
    for n, line in enumerate(lines, start=1):
        seconds = res.history[n - 1]["seconds"]
        assert line.endswith(f"{seconds:.1f} s)") == (n in (1, cfg.steps))
        if 1 < n < cfg.steps:
            assert line.endswith(f"{seconds:.1f} s, {duration((seconds - first) / (n - 1) * (6 - n))} left)")
    # a tiny model's steps round to 0m00s above: the pace leaves the first (compiling) step out, and --patience
    # makes the time an upper bound
    from types import SimpleNamespace

    from rmjax.search.gcg import _Search

    paced = SimpleNamespace(cfg=cfg, first_step_seconds=30.0)
    assert _Search.time_left(paced, 2, 90.0) == ", 1m30s left"  # (90 - 30) s over 2 steps, 3 steps to go
    paced.cfg = dataclasses.replace(cfg, patience=2)
    assert _Search.time_left(paced, 2, 90.0) == ", at most 1m30s left"
    assert _Search.time_left(paced, 0, 30.0) == _Search.time_left(paced, 5, 200.0) == ""


def test_a_step_with_no_candidate_left_retries_from_the_next_buffer_entries_swapping_more(tiny_rm, monkeypatch):
    """When every top-k neighbour of the best sequence was evaluated before, a step samples again from the buffer's
    next entries (best first, up to four), each retry swapping one more position (n_replace + attempt)."""
    from rmjax.search import gcg as gcg_lib

    _, model = tiny_rm
    target = make_target(model, "", prefix=PREFIX, suffix=SUFFIX)
    calls, sample = [], gcg_lib.sample_candidates

    def recorded(current, score, cfg, key):
        calls.append((np.asarray(current).tolist(), cfg.n_replace))
        return sample(current, score, cfg, key)

    monkeypatch.setattr(gcg_lib, "sample_candidates", recorded)
    cfg = GCGConfig(num_tokens=2, steps=8, search_width=16, topk=2, buffer_size=4, retokenize_filter=False, seed=0)
    res = gcg([target], cfg)
    retries = [h["retries"] for h in res.history]
    assert max(retries) >= 2 and len(calls) == sum(retries) + len(retries)  # 2 x top 2: 4 swaps, soon all seen
    best = None
    for record in res.history:
        step, calls = calls[: record["retries"] + 1], calls[record["retries"] + 1:]
        currents = [c for c, _ in step]
        assert [n for _, n in step] == [min(cfg.num_tokens, cfg.n_replace + i) for i in range(len(step))]
        assert len({tuple(c) for c in currents}) == len(currents)
        assert best is None or currents[0] == best  # the best so far first
        rewards = evaluate([target], np.asarray(currents))
        assert np.all(np.diff(rewards) <= _atol(model, np.asarray(currents)))  # then the buffer's order
        best = record["ids"]


def test_patience_stops_a_search_that_stopped_improving(tiny_rm):
    """--patience=P ends the search P steps after the last step that lowered the best loss, with the history of
    the same search run to the end up to there."""
    _, model = tiny_rm
    target = make_target(model, "", prefix=PREFIX, suffix=SUFFIX)
    cfg = GCGConfig(num_tokens=2, steps=8, search_width=16, topk=2, buffer_size=4, retokenize_filter=False, seed=0)
    whole = gcg([target], cfg)
    losses = [h["loss"] for h in whole.history]
    improved = [i for i in range(1, len(losses)) if losses[i] < min(losses[:i]) - 1e-9]
    # the first step two steps past the last improvement so far (step 0 counts as one)
    stop = next(i for i in range(len(losses)) if i - max([0, *(j for j in improved if j <= i)]) >= 2)
    assert improved and 2 < stop < cfg.steps - 1  # it improves, then stalls for longer than the patience
    stopped = gcg([target], dataclasses.replace(cfg, patience=2))
    assert [h["ids"] for h in stopped.history] == [h["ids"] for h in whole.history][: stop + 1]


def test_warning_names_the_step_and_what_to_change(tiny_rm, caplog):
    """Issue 21 (6): GCG stalled silently (2 of 128 candidates a step). Under a quarter of --search_width left
    warns once per such step, naming it and what to change; a step with enough candidates does not."""
    import logging

    _, model = tiny_rm
    target = make_target(model, "", prefix=PREFIX, suffix=SUFFIX)
    with caplog.at_level(logging.WARNING):  # 2 positions x top 3: at most 6 distinct single swaps of 64
        res = gcg([target], GCGConfig(num_tokens=2, steps=2, search_width=64, topk=3, retokenize_filter=False,
                                      seed=0))
    warned = _warned_steps(caplog)
    assert sorted(warned) == [1, 2] and len(caplog.records) == 2
    assert all(h["candidates"] <= 6 for h in res.history)
    assert "widen --topk (now 3)" in warned[1] and "lower --search_width" in warned[1]
    assert f"only {res.history[0]['candidates']} of --search_width=64" in warned[1]
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # 2 positions x 48 tokens: 16 samples are nearly all distinct
        res = gcg([target], GCGConfig(num_tokens=2, steps=2, search_width=16, topk=48, retokenize_filter=False,
                                      seed=0))
    assert all(4 * h["candidates"] >= 16 for h in res.history) and not _warned_steps(caplog)


def test_token_ids_keep_every_proposed_and_returned_token_in_the_set(rm_folder, monkeypatch, tmp_path):
    """Issue 21 (10): --token_ids (the beam's flag) restricts GCG's candidate vocabulary: every token of every
    candidate sampled, of the start, of the history and of the buffer is one of the ids."""
    from rmjax.errors import UsageError

    model = load(str(rm_folder))
    allowed = {model.tokenizer(w, add_special_tokens=False).input_ids[0] for w in WORDS}
    target = make_target(model, PROMPT)
    events = _record(monkeypatch)
    res = gcg([target], GCGConfig(num_tokens=3, steps=4, search_width=16, topk=4, token_ids=tuple(sorted(allowed)),
                                  seed=0))
    proposed = [set(np.asarray(v).ravel().tolist()) for k, v in events if k in ("sampled", "evaluated")]
    assert len(proposed) > 4 and all(p <= allowed for p in proposed), proposed
    assert len(set().union(*proposed)) > 2  # the search moved inside the set
    assert all(set(h["ids"]) <= allowed for h in res.history)
    assert all(set(ids) <= allowed for _, ids in res.buffer)
    words = tmp_path / "words.txt"
    words.write_text("\n".join(WORDS) + "\n", encoding="utf-8")
    with pytest.raises(UsageError, match="--token_ids or --vocab_file, not both"):
        GCGConfig(token_ids=(1,), vocab_file=str(words))
    with pytest.raises(UsageError, match="--token_ids=.*non-negative integer"):
        GCGConfig(token_ids=(3, -1))
    with pytest.raises(UsageError, match=r"--token_ids: \[49152\] are outside the vocabulary \[0, 49152\)"):
        gcg([target], GCGConfig(num_tokens=2, steps=1, token_ids=(5, 49152)))


def test_steps_csv_has_the_candidates_column_and_is_part_of_the_result(rm_folder, tmp_path):
    """Issue 21 (6): <out>.steps.csv gains `candidates` (evaluated at that step). Issue 22: the steps CSV is part of
    the result, so one edited after it was written (here without `candidates`) is not reused, and is kept."""
    import json

    import pandas as pd

    from rmjax.search.gcg_job import steps_path, write_gcg

    model = load(str(rm_folder))
    out = tmp_path / "gcg.json"
    cfg = GCGConfig(num_tokens=2, steps=3, search_width=16, topk=8, seed=0)
    assert write_gcg([model], {"greatest": PROMPT}, cfg, out) is not None
    steps = pd.read_csv(steps_path(out), keep_default_na=False)
    history = json.loads(out.read_text())["history"]
    assert list(steps.columns) == ["step", "text", "ids", "candidates", "reward", "seconds"]
    assert steps["candidates"].tolist() == [h["candidates"] for h in history] and steps["candidates"].dtype.kind == "i"
    old = steps.drop(columns="candidates")
    old.to_csv(steps_path(out), index=False)
    before = steps_path(out).read_bytes()
    with pytest.raises(OutputExistsError, match="gcg.json.steps.csv has .* bytes where .* were written"):
        write_gcg([model], {"greatest": PROMPT}, cfg, out)
    assert steps_path(out).read_bytes() == before


def test_the_completion_check_of_the_buffer(rm_folder, lm_folder, tmp_path):
    """OUT.completions.csv: one row per buffer sequence (best first) and prompt, checked against independent
    readings (tests/completion_checks.py), its reward a full forward of the conversation without cache."""
    import json

    import pandas as pd
    from transformers import AutoModelForCausalLM

    from rmjax.runs import results
    from rmjax.scoring import calls
    from rmjax.search.gcg_job import completions_path, write_gcg
    from rmjax.text import chat
    from tests.completion_checks import check_table

    model, lm = load(str(rm_folder)), load(str(lm_folder))
    prompts = {"greatest": PROMPT, "worst": "Name the worst thing."}
    out = tmp_path / "gcg.json"
    cfg = GCGConfig(num_tokens=2, steps=2, search_width=8, topk=8, seed=0, direction="pessimal")
    result = write_gcg([model], prompts, cfg, out, lm=lm)
    table = pd.read_csv(completions_path(out), keep_default_na=False)
    assert list(table.columns) == ["model", "rank", "ids", "prompt", "ends_turn", "completed_text", "reward",
                                   "completed_reward", "truncation_gain"]
    assert table.ids.tolist() == [" ".join(map(str, ids)) for _, ids in result.buffer for _ in prompts]
    assert table["rank"].tolist() == [r for r in range(1, len(result.buffer) + 1) for _ in prompts]
    want, longest = [], 0
    for ids in table.ids:
        full = chat.split_chat(model.tokenizer, dict(prompts)[table.prompt[len(want)]]).ids_with(
            [int(t) for t in ids.split()])
        longest = max(longest, len(full))
        want.append(float(np.asarray(calls.rewards(model, np.asarray([full], np.int32),
                                                   np.ones((1, len(full)), bool)))[0, 0]))
    check_table(table, model, lm, AutoModelForCausalLM.from_pretrained(lm_folder).eval(), prompts,
                np.asarray(want), -np.ones(len(table)), tolerance.any_rewards_atol(model.params, model.config, longest))
    meta = json.loads(results.meta_path(out).read_text())
    got = meta["completion"][model.source]["pessimal"]
    assert got["median_truncation_gain"] == pytest.approx(float(np.median(table.truncation_gain)), abs=1e-6)


def test_gcg_entry_point_takes_token_ids(rm_folder, tmp_path):
    """Issue 21 (10): experiments.gcg --token_ids, parsed as experiments.beam's (given with --vocab_file it is
    refused when the config is built: test above); ids past the vocabulary stop the job before the weights load."""
    import json

    import pandas as pd

    from rmjax.runs import results
    from tests import cli

    model = load(str(rm_folder))
    ids = sorted({model.tokenizer(w, add_special_tokens=False).input_ids[0] for w in WORDS})
    out = tmp_path / "gcg.json"
    flags = [f"--model={rm_folder}", "--prompts=greatest", "--num_tokens=2", "--steps=3", "--search_width=16",
             "--topk=4"]
    proc = cli.ok(cli.run("gcg", *flags, "--token_ids=" + ",".join(map(str, ids)), f"--out={out}"))
    assert "sampled candidates left" in proc.stderr
    record = json.loads(out.read_text())
    assert set(record["best_ids"]) <= set(ids) and all(set(h["ids"]) <= set(ids) for h in record["history"])
    steps = pd.read_csv(out.with_name(out.name + ".steps.csv"), keep_default_na=False)
    assert steps["candidates"].tolist() == [h["candidates"] for h in record["history"]]
    meta = json.loads(results.meta_path(out).read_text())
    assert meta["config"]["token_ids"] == ids
    cli.user_error(cli.run("gcg", *flags, "--token_ids=5,49152", f"--out={tmp_path / 'b.json'}"),
                   "--token_ids", "[49152]", "outside the vocabulary")


def test_init_keeps_each_response_as_typed(rm_folder, tmp_path):
    """A fault hunt: the --init list flag stripped each item (' love x' ran as 'love x', and the two shared one
    result), though the default start ' x x x' begins with a space and ChatML reads ' love' and 'love' apart."""
    from tests import cli

    proc, unfiltered = cli.run_each(
        ("gcg", f"--model={rm_folder}", "--num_tokens=5", "--init= love x", f"--out={tmp_path / 'g.json'}"),
        ("gcg", f"--model={rm_folder}", "--num_tokens=5", "--init= love x", "--noretokenize_filter",
         f"--out={tmp_path / 'h.json'}"))
    cli.user_error(proc, "--init ' love x' does not come out of a real conversation")
    # with the filter off, the count is what is wrong: the refusal named --noretokenize_filter, given (helper-144)
    line = cli.user_error(unfiltered, "--init ' love x' is 2 tokens, not --num_tokens=5", "--num_tokens=2")
    assert "noretokenize_filter" not in line, line


def test_a_search_width_past_greedys_candidates_names_only_the_flag_that_widens_them():
    """Under --selection=greedy a step makes one swap per (position, top-k token) whatever --n_replace says: the
    refusal named --n_replace as a fix, which gave the same refusal (a fault hunt)."""
    from rmjax.errors import UsageError
    from rmjax.search.gcg_config import check_search_width

    for n_replace in (1, 2):
        with pytest.raises(UsageError, match=r"the 8 distinct candidates.*or raise --topk\.$"):
            check_search_width(GCGConfig(num_tokens=2, topk=4, search_width=16, selection="greedy",
                                         n_replace=n_replace))
    with pytest.raises(UsageError, match=r"or raise --topk / --n_replace\.$"):
        check_search_width(GCGConfig(num_tokens=6, topk=64, search_width=10**9, selection="random", n_replace=1))
    # --n_replace at --num_tokens cannot rise; 4 allowed tokens cap --topk (greedy) and, at 4**2, random too
    with pytest.raises(UsageError, match=r"or raise --topk\.$"):
        check_search_width(GCGConfig(num_tokens=2, topk=2, search_width=16, selection="random", n_replace=2))
    for selection, width in (("greedy", 16), ("random", 17)):
        with pytest.raises(UsageError, match=r"or give more candidate tokens \(--token_ids / --vocab_file\)\.$"):
            check_search_width(GCGConfig(num_tokens=2, topk=64, search_width=width, selection=selection), allowed=4)
