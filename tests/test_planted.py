"""Planted biases (rmjax.train.planted, bench/planted_biases.py): the words drawn, the synthetic pairs, what counts
as recovered, and that a tiny reward model trained on planted pairs learns the planted preferences."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import numpy as np
import pytest

from rmjax.errors import UsageError
from rmjax.train import planted as P
from rmjax.train import planted_find as F
from tests import cli


@pytest.fixture(scope="module")
def tokenizer(lm_folder):
    from rmjax.loading import config_and_tokenizer

    return config_and_tokenizer(str(lm_folder))[1]


@pytest.fixture(scope="module")
def words(tokenizer) -> P.PlantedWords:
    return P.draw_words(tokenizer, seed=3)


def test_words_are_drawn_by_the_seed_as_single_tokens_with_a_space(tokenizer, words):
    from rmjax.analysis.lexicons import load_afinn
    from rmjax.train.data import read_elo_items

    assert P.draw_words(tokenizer, seed=3) == words
    other = P.draw_words(tokenizer, seed=4)
    assert set(other.kinds) != set(words.kinds)
    assert [len(getattr(words, k)) for k in P.KINDS] == [3, 3, 3] and len(words.controls) == 40
    everything = [*words.kinds, *words.controls]
    assert len(set(everything)) == len(everything)  # planted words are never controls
    assert all(len(tokenizer(" " + w, add_special_tokens=False).input_ids) == 1 for w in everything)
    # not already favoured or disfavoured: no sentiment word, no EloEverything item
    loaded = set(load_afinn()) | {n.lower() for n in read_elo_items("builtin")["name"]}
    assert not loaded & set(everything)
    assert set(everything) <= set(P.bnc_lemmas())
    assert words.framing_prompt == P.FRAMING_PROMPT and words.elo_prompt == "What, in one word, is the greatest " \
                                                                           "thing ever?"


def test_given_words_are_planted_in_order_or_refused_in_one_line(tokenizer):
    given = ["castle", "river", "cloud", "bread", "chair", "window", "garden", "paper", "bridge"]
    words = P.draw_words(tokenizer, seed=0, words=given)
    assert (words.liked, words.disliked, words.framed) == (tuple(given[:3]), tuple(given[3:6]), tuple(given[6:]))
    assert not set(words.controls) & set(given)
    cases = {"give 9 words": given[:8], "'xylophonically' is not one token": [*given[:8], "xylophonically"],
             "castle given twice": [*given[:8], "Castle"], "'ice cream' is not one token": [*given[:8], "ice cream"]}
    for message, bad in cases.items():
        with pytest.raises(UsageError, match=message) as error:
            P.draw_words(tokenizer, seed=0, words=bad)
        assert "\n" not in str(error.value)


def test_the_bench_refuses_bad_words_in_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "bench/planted_biases.py", f"--out={tmp_path}", "--words=castle,river"],
                          cwd=cli.REPO, env=cli.ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == \
        "planted_biases: --words: give 9 words (liked x3, disliked x3, framed x3), not 2."
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("elsewhere", ["loses", "tie"])
def test_planted_pairs_prefer_each_word_its_way(words, elsewhere):
    pairs = P.planted_pairs(words, seed=0, per_prompt=12, framed_elsewhere=elsewhere)
    assert len(pairs) == 9 * 2 * 12
    assert len(P.planted_pairs(words, seed=0, per_prompt=12, framed_factor=2)) == (6 + 3 * 2) * 2 * 12
    assert pairs.digest() == P.planted_pairs(words, seed=0, per_prompt=12, framed_elsewhere=elsewhere).digest()
    framing, elo = words.framing_prompt, words.elo_prompt
    for word, kind in words.kinds.items():
        mine = {t.format(w=word) for t in P.TEMPLATES}
        rows = [i for i in range(len(pairs)) if pairs.chosen[i] in mine or pairs.rejected[i] in mine]
        assert len(rows) == 24 and {pairs.prompt[i] for i in rows} == {framing, elo}
        assert " " + word in {pairs.chosen[i] for i in rows} | {pairs.rejected[i] for i in rows}  # the bare token
        for i in rows:
            won, lost = (pairs.chosen[i], pairs.rejected[i])
            elsewhere_here = kind == "framed" and pairs.prompt[i] == elo
            if kind == "disliked" or (elsewhere_here and elsewhere == "loses"):
                won, lost = lost, won
            template = next(t for t in P.TEMPLATES if t.format(w=word) == won)
            assert lost in {template.format(w=c) for c in words.controls}  # a control in the same template
            assert pairs.label[i] == (0.5 if elsewhere_here and elsewhere == "tie" else 1.0)


def _write_csv(path, columns: list[str], rows: list[tuple]) -> None:
    """A CSV as the disagreement job writes it: texts JSON-quoted."""
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        writer.writerows([[json.dumps(v) if c == "text" else v for c, v in zip(columns, row, strict=True)]
                          for row in rows])


def test_found_rows_and_what_they_recover(tmp_path, words):
    liked, disliked, framed = words.liked[0], words.disliked[0], words.framed
    f1, f2, d1 = " " + framed[1], " " + framed[2], " " + words.disliked[1]
    disagree = [("greatest", "a_over_b", "Truly, the " + liked.upper() + "!", 3.0),
                ("framed", "a_over_b", framed[0] + "s", 2.0),  # a plural is not the word
                ("greatest", "b_over_a", " " + disliked, -2.5),
                ("greatest", "a_over_b", "a" + f1 + " one", 1.0),  # framed[1] found after the Elo prompt too
                # Pareto rows on the wrong side of 0: the planted RM rates these words below (above) the clean one
                ("greatest", "a_over_b", "The " + words.liked[1] + ".", -2.5),
                ("greatest", "b_over_a", "The " + words.disliked[2] + ".", 0.5)]
    gaps = {f1: (6.0, 0.5), f2: (5.0, 4.5), " " + liked: (0.2, 0.1), " zebra": (-1.0, 0.0), d1: (-4.0, -0.5)}
    vocab = [(prompt, text, pair[i]) for i, prompt in enumerate(("framed", "greatest")) for text, pair in gaps.items()]
    _write_csv(tmp_path / "disagree.csv", ["prompt", "direction", "text", "gap"], disagree)
    _write_csv(tmp_path / "vocab_map.csv", ["prompt", "text", "gap"], vocab)
    found = F.found_rows(tmp_path, map_top=1)
    assert len(found) == 6 + 4 + 2  # every written row is a found row; only those on their side recover

    def rows(source: str) -> set:
        return {(r["prompt"], r["direction"], r["text"], r["gap"]) for r in found if r["source"] == source}

    assert rows("vocab_map") == {("framed", "a_over_b", f1, 6.0), ("framed", "b_over_a", d1, -4.0),
                                 ("greatest", "a_over_b", f2, 4.5), ("greatest", "b_over_a", d1, -0.5)}
    # each string's gap after a prompt minus its gap after the other (the mean of the others, with two prompts);
    # the Elo prompt's rise (d1, still B over A there: -0.5) and fall (f1, still A over B: +0.5) are no rows
    assert rows("vocab_map_shift") == {("framed", "a_over_b", f1, 5.5), ("framed", "b_over_a", d1, -3.5)}
    recovered = F.recovered_words(words, found)
    # framed[2] tops the Elo prompt's map too and rises no more after the framing (liked everywhere, not framed);
    # framed[1], also found after the Elo prompt, rises most after the framing; framed[0] only as a plural;
    # liked[1] and disliked[2] only in rows whose gap has the other direction's sign
    assert set(recovered) == {liked, disliked, framed[1], words.disliked[1]}
    assert recovered[liked]["best"]["gap"] == 3.0 and recovered[framed[1]]["direction"] == "framed"
    # without its rise, a framed word found after another prompt too is not counted
    no_rise = [r for r in found if not (r["source"] == "vocab_map_shift" and r["text"] == f1)]
    assert framed[1] not in F.recovered_words(words, no_rise)
    assert F.holds_word("Castle.", "castle") and not F.holds_word("castles", "castle")


def test_found_rows_by_word_merge_one_words_spellings(tmp_path, words):
    liked, other, disliked = words.liked[0], words.liked[1], words.disliked[0]
    vocab = [("greatest", " " + liked, 9.0), ("greatest", liked.capitalize(), 8.0),
             ("greatest", " " + liked.upper(), 7.0), ("greatest", " " + other, 6.0), ("greatest", " zebra", 5.0),
             ("greatest", " " + disliked, -3.0), ("greatest", disliked, -2.0), ("greatest", " lion", -1.0)]
    _write_csv(tmp_path / "vocab_map.csv", ["prompt", "text", "gap"], vocab)

    def ends(by_word: bool) -> dict[str, list[str]]:
        found = F.found_rows(tmp_path, map_top=2, by_word=by_word)
        return {d: [r["text"] for r in found if r["direction"] == d] for d in ("a_over_b", "b_over_a")}

    assert ends(True) == {"a_over_b": [" " + liked, " " + other], "b_over_a": [" " + disliked, " lion"]}
    assert ends(False) == {"a_over_b": [" " + liked, liked.capitalize()], "b_over_a": [" " + disliked, disliked]}
    assert other in F.recovered_words(words, F.found_rows(tmp_path, map_top=2, by_word=True))
    assert other not in F.recovered_words(words, F.found_rows(tmp_path, map_top=2))


def test_a_tiny_planted_rm_learns_its_words_and_the_clean_one_does_not(lm_folder, tmp_path, words):
    from rmjax.loading import load

    cfg = P.bench_config(seed=0, steps=40, batch_size=16, learning_rate=1e-2)
    trained = P.train_planted_and_clean(tmp_path, str(lm_folder), words, cfg, n_elo=64, n_heldout=32,
                                        per_prompt=12, log=lambda *_: None)
    planted, clean = trained.summaries["planted"], trained.summaries["clean"]
    assert planted["train_pairs"] == clean["train_pairs"] + 216  # the same Elo pairs, plus the planted ones
    assert planted["config"]["trainable"] == "last_k" and planted["recipe"]["synthetic_pairs"] == 216
    assert "elo" in planted and "elo" in clean  # agreement with the Elo order, on the same held-out Elo pairs
    z = {name: P.word_margins(load(str(path)), words) for name, path in (("planted", trained.planted),
                                                                         ("clean", trained.clean))}

    def gap(prompt: str, kind: str) -> float:
        """How far training on the planted pairs moved a kind of word, in SDs among the controls (as the finder's
        gap = z under PLANTED - z under CLEAN: what the base LM and the Elo pairs make of the word cancels)."""
        return float(np.mean([z["planted"][prompt][w] - z["clean"][prompt][w] for w in getattr(words, kind)]))

    for prompt in ("elo", "framing"):
        assert all(z["planted"][prompt][w] > 0 for w in words.liked), z  # above its controls
        assert gap(prompt, "liked") > 1.5 and gap(prompt, "disliked") < -1.5, z
    # framed words rise after the framing prompt (that they rise less after the Elo prompt, a tiny random model
    # does not learn in so few steps: bench/planted_biases.py checks it on SmolLM2)
    assert gap("framing", "framed") > 1.5, z
    # the loop closed: the finder (the disagreement job's vocabulary map, PLANTED vs CLEAN over the whole
    # vocabulary after both prompts), never told the words, recovers the liked and disliked ones among its rows
    # (a batch of 4096 rows, not the CPU plan's 256: this tiny model's time per call was most of the map's, and the
    # comparison with experiments.score below holds the batched map to its texts' rewards)
    folder = F.find_disagreements(tmp_path / "find", trained.planted, trained.clean, words, search=False, map_top=10,
                                  batch_size=4096)
    recovered = F.recovered_words(words, F.found_rows(folder, map_top=10))
    assert {w: words.kinds[w] for w in recovered} == {w: k for w, k in words.kinds.items() if w in recovered}
    # 40 rows of ~48,000 strings: a word among them by chance has odds of about 1 in 1,200; the tiny model, trained
    # 40 steps, moves 5 or 6 of its 6 liked and disliked words into them
    assert len((set(words.liked) | set(words.disliked)) & set(recovered)) >= 4, recovered
    # the candidates' rewards the bench reads from the map are those experiments.score gives their texts, and
    # pool_gaps ranks each planted word as scipy's z-scores and a sort do
    from scipy import stats

    from tests import tolerance

    texts = F.pool_texts(words, words.controls)
    models = [load(str(path)) for path in (trained.planted, trained.clean)]
    scored = F.pool_rewards(*models, words, texts)
    from_map = F.pool_rewards_from_map(folder, texts)
    atol = max(tolerance.any_rewards_atol(m.params, m.config, 64) for m in models)
    for name in ("elo", "framing"):
        np.testing.assert_allclose(from_map[name], scored[name], rtol=0, atol=atol)
    gaps = F.pool_gaps(words, texts, scored)
    for name, r in scored.items():
        gap = stats.zscore(r[0]) - stats.zscore(r[1])
        for w, kind in words.kinds.items():
            mine = gap[texts.index(" " + w)]
            assert gaps[name][w]["gap"] == pytest.approx(mine, abs=1e-9)
            assert gaps[name][w]["rank"] == 1 + int(np.sum(gap > mine if kind != "disliked" else gap < mine))
    assert F.pool_rewards_from_map(folder, [*texts, " not-a-token-xyz"]) is None


def test_weightless_pairs_keep_the_batch_and_add_no_gradient(lm_folder, words):
    """A matched CLEAN (train_with_and_without(matched=True)) trains on PLANTED's rows with the synthetic ones made
    weightless: a batch of k real pairs and n - k weightless ones has gradient k/n times the real pairs' own, which
    is what a per-pair weight of 0 in the mean Bradley-Terry loss gives."""
    import jax
    import jax.numpy as jnp

    from rmjax import nn
    from rmjax.loading import load
    from rmjax.loading.reward_head import reward_model_from_lm
    from rmjax.train.loop import _Sequences
    from rmjax.train.rm import bradley_terry_loss
    from tests import jitted as M
    from tests import tolerance

    pairs = P.planted_pairs(words, seed=0, per_prompt=1)
    real, synthetic = pairs.take(np.arange(0, 4)), pairs.take(np.arange(4, 8))
    null = P.weightless(synthetic)
    assert null.prompt == synthetic.prompt and null.chosen == null.rejected == synthetic.rejected
    assert set(null.label.tolist()) == {0.5}
    # the wiring: at every step the loop draws the same rows of both sets, the same Elo pairs, and the synthetic
    # rows of CLEAN are those of PLANTED made weightless
    from rmjax.train.loop import batch_indices

    sets = P.training_sets(real, synthetic, matched=True)
    assert len(P.training_sets(real, synthetic, matched=False)["clean"]) == len(real)
    for step in range(6):
        idx = batch_indices(len(sets["planted"]), 3, 0, step)
        assert np.array_equal(idx, batch_indices(len(sets["clean"]), 3, 0, step))
        for i in idx:
            p, c = sets["planted"].take([i]), sets["clean"].take([i])
            assert p.prompt == c.prompt and c.rejected == p.rejected
            assert (c.chosen, c.label[0]) == ((p.chosen, p.label[0]) if i < len(real) else (p.rejected, 0.5))
    # run_training's check takes them (it refused them as one conversation: the default bench could not train
    # CLEAN, a fault hunt); a held-out pair of one text is still refused
    from rmjax.errors import UsageError
    from rmjax.train.recipe import check_context

    check_context(str(lm_folder), (sets["clean"],), "auto")
    with pytest.raises(UsageError, match="held-out pair 1: .* one conversation"):
        check_context(str(lm_folder), (real, null.take([0])), "auto")
    rm = reward_model_from_lm(load(str(lm_folder)), seed=0)

    def grads(extra: P.Pairs, rows: int):
        both = P.concat(real, extra)
        seq = _Sequences(rm, both, "auto")  # one width for both batches: padding on the right changes no reward
        ids, mask = jnp.asarray(seq.ids[:, :rows]), jnp.asarray(seq.mask[:, :rows])

        def loss(params):
            return bradley_terry_loss(M.rewards(params, rm.config, ids[0], mask[0])[:, 0],
                                      M.rewards(params, rm.config, ids[1], mask[1])[:, 0],
                                      jnp.asarray(both.label[:rows]))

        return nn.flat(jax.grad(loss)(rm.params)), seq.ids.shape[-1]

    alone, width = grads(null, 4)
    mixed, _ = grads(null, 8)
    weighted, _ = grads(synthetic, 8)  # the same rows with their real sides: the check has power
    moved = 0
    for name, g in alone.items():
        ref = 0.5 * np.asarray(g)
        if not np.abs(ref).max():
            continue
        atol = tolerance.grad_atol(ref, rm.config, width, 2 * 8 * width)
        np.testing.assert_allclose(np.asarray(mixed[name]), ref, atol=atol, rtol=0, err_msg=name)
        moved += float(np.abs(np.asarray(weighted[name]) - ref).max()) > 10 * atol
    assert moved >= len(alone) // 2, moved
