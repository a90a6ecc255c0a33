"""Results that are easy to misread (issue 12): token-mode sequences no conversation produces, the
implicit RM's direction, held-out pairs that share training responses, word variants counted as
independent observations, the frequency regressor's scale. Each reference is computed here."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from rmjax.analysis import bigtwo, data, lexicons, paper1
from rmjax.errors import UsageError
from rmjax.runs import results
from rmjax.search.sweep import SweepSpec, run_sweep
from tests import cli, inproc

PROMPTS = {"greatest": "What, in one word, is the greatest thing ever?", "other": "Name one thing you love."}


def _reference_roundtrip(tok, ids: np.ndarray, template: str, prompt: str) -> np.ndarray:
    """Token mode's sequence vs the tokenized conversation, both built here from the tokenizer alone."""
    if template == "chat":
        def conversation(text):
            return tok.apply_chat_template([{"role": "user", "content": prompt},
                                            {"role": "assistant", "content": text}], tokenize=False)
        before, after = conversation("\x00").split("\x00")
        prefix = tok(before, add_special_tokens=False).input_ids
        suffix = tok(after, add_special_tokens=False).input_ids
        encode = lambda text: tok(conversation(text), add_special_tokens=False).input_ids  # noqa: E731
    else:  # the whole `User: …\nAssistant: <response>` string, tokenized at once
        prefix, suffix = tok(f"User: {prompt}\nAssistant:").input_ids, []
        encode = lambda text: tok(f"User: {prompt}\nAssistant: {text.strip()}").input_ids  # noqa: E731
    return np.array([encode(tok.decode([int(i)])) == [*prefix, int(i), *suffix] for i in ids])


@pytest.mark.parametrize("template", ["chat", "plain"])
def test_sweep_marks_tokens_no_conversation_produces(rm_folder, tmp_path, template):
    """1: every sweep CSV says per token whether its token-mode sequence is a real conversation's."""
    from transformers import AutoTokenizer

    out = tmp_path / "s.csv"  # `sweep --prompts=greatest --prompt=other=… --limit=1500 --template=…`, in-process
    run_sweep(SweepSpec(inproc.options(rm_folder, out, template=template),
                        inproc.prompts("greatest", other=PROMPTS["other"]), limit=1500))
    table = results.read_scores_csv(out)
    tok = AutoTokenizer.from_pretrained(str(rm_folder))
    per_prompt = {n: _reference_roundtrip(tok, table.token_id.to_numpy(), template, p) for n, p in PROMPTS.items()}
    expected = per_prompt["greatest"] & per_prompt["other"]  # a real conversation under every prompt
    assert table[results.ROUNDTRIP].tolist() == expected.astype(int).tolist()
    assert 0 < expected.sum() < len(expected)
    meta = json.loads(results.meta_path(out).read_text())
    assert meta["roundtrip"] == {"tokens": int(expected.sum()), "of": 1500,
                                 "per_prompt": {n: int(m.sum()) for n, m in per_prompt.items()}}
    if template == "plain":  # `Assistant:` + a token without a leading space is `Assistant:love`
        spaced = np.array([tok.decode([int(i)])[:1] == " " for i in table.token_id])
        assert not expected[~spaced].any()


@pytest.mark.parametrize("template", ["chat", "plain"])
def test_a_read_back_serves_the_prompts_that_read_tokens_back_alike(rm_folder, template):
    """The disagreement map reads every shared string back after each prompt (token_round_trips, a jinja render
    and a tokenization each): a prompt whose read_back_key an earlier one has reuses its mask. Under the chat
    template both prompts end their prefix in '<|im_start|>assistant\\n' and share one mask; under the plain one
    the prompt's words precede the response unsplit, so each is read back anew. Each mask equals the reference."""
    from transformers import AutoTokenizer

    from rmjax.text import candidates
    from rmjax.text.chat import Conversations

    tok = AutoTokenizer.from_pretrained(str(rm_folder))
    ids = np.unique(np.linspace(0, len(tok) - 1, 600).astype(int))
    texts = [tok.decode([int(i)]) for i in ids]
    done: dict = {}
    calls = []
    for name, prompt in PROMPTS.items():
        conversations = Conversations(tok, prompt, template)
        real = conversations.token_ids
        conversations.token_ids = lambda responses, real=real: calls.append(len(responses)) or real(responses)
        mask = candidates.token_round_trips(conversations, ids, texts, done)
        assert mask.tolist() == _reference_roundtrip(tok, ids, template, prompt).tolist(), name
        assert 0 < mask.sum() < len(ids)
    assert calls == ([len(ids)] if template == "chat" else [len(ids)] * 2)
    assert len(done) == (1 if template == "chat" else 2)


def test_analyze_roundtrip_only(rm_folder, tmp_path):
    """1: --roundtrip_only restricts the analyses to those rows; a table without the column is refused."""
    out = tmp_path / "s.csv"  # `sweep --limit=1500 --template=plain`, then `analyze`, in-process (tests/inproc.py)
    run_sweep(SweepSpec(inproc.options(rm_folder, out, template="plain"), inproc.prompts("greatest"), limit=1500))
    table = results.read_scores_csv(out)
    kept = table[table[results.ROUNDTRIP] == 1]
    analysis = tmp_path / "a"
    inproc.analyze(analysis, scores=(str(out),), roundtrip_only=True, models_yaml=None, n_boot=5)
    moments = pd.read_csv(analysis / "paper1_moments.csv")
    assert int(moments.n_tokens.iloc[0]) == len(kept) < len(table)
    assert float(moments["mean"].iloc[0]) == pytest.approx(kept.greatest.mean(), rel=1e-6)
    published = tmp_path / "published.csv"
    results.write_scores_csv(published, table.token_id, table.token_name.tolist(), table.token_decoded.tolist(),
                             {"greatest": table.greatest.to_numpy()})  # as the published pipeline wrote them
    inproc.refused(lambda: inproc.analyze(tmp_path / "b", scores=(str(published),), roundtrip_only=True,
                                          models_yaml=None), "no roundtrip column")


def _logprobs(path, probs: dict[str, float]):
    words = list(probs)
    logp = np.log(np.array([probs[w] for w in words]))
    pd.DataFrame({"token_id": range(len(words)), "token_name": words, "token_decoded": words,
                  "greatest": logp}).to_csv(path, index=False)
    results.write_meta(path, kind="logprobs")  # as experiments.logprobs writes them
    return path


def test_implicit_rm_direction_is_named(tmp_path):
    """2: chosen over reference: MWLR > 0 where the chosen model gives more probability (the slide table
    'Llama -> Gemma' has Freedom on top and Love at the bottom: chosen = Llama)."""
    llama = _logprobs(tmp_path / "llama.csv", {"Freedom": 0.30, "Love": 0.05, "Hope": 0.10, "That": 0.20})
    gemma = _logprobs(tmp_path / "gemma.csv", {"Freedom": 0.05, "Love": 0.40, "Hope": 0.12, "That": 0.20})
    out = tmp_path / "out"
    inproc.analyze(out, implicit_chosen=str(llama), implicit_reference=str(gemma), models_yaml=None, top=1)
    rewards = results.read_scores_csv(out / "implicit_rm.csv").set_index("text")
    expected = 0.5 * (0.30 + 0.05) * (np.log(0.30) - np.log(0.05))  # 1/2 (p_c + p_r)(log p_c - log p_r)
    assert rewards.loc["Freedom", "greatest"] == pytest.approx(expected)
    assert rewards.loc["Freedom", "greatest:logp_chosen"] == pytest.approx(np.log(0.30))
    top = pd.read_csv(out / "implicit_rm_top_bottom.csv", keep_default_na=False)
    assert top[top.side == "top"].text.tolist() == ["Freedom"] and top[top.side == "bottom"].text.tolist() == ["Love"]
    assert "chosen llama over reference gemma" in (out / "report.md").read_text()
    # the removed --implicit=A,B (a flag validator: the command line's own)
    cli.user_error(cli.run("analyze", f"--implicit={llama},{gemma}", f"--out={tmp_path / 'x'}"),
                   "--implicit_chosen", "--implicit_reference")


def test_pairs_without_a_heldout_file_are_split_by_item_and_prompt(tmp_path):
    """3: no held-out response (or prompt) is ever trained on; the split sizes are reported."""
    from rmjax.train.recipe import load_pairs

    rng = np.random.default_rng(0)
    items = [f"item {i}" for i in range(40)]
    one = tmp_path / "one.csv"
    pairs = [rng.choice(items, 2, replace=False) for _ in range(600)]
    pd.DataFrame({"prompt": "Which is better?", "chosen": [a for a, _ in pairs],
                  "rejected": [b for _, b in pairs]}).to_csv(one, index=False)
    train, held, sizes = load_pairs(str(one), None, 0, 0, False, seed=0)
    train_items, held_items = set(train.chosen) | set(train.rejected), set(held.chosen) | set(held.rejected)
    assert held_items and not train_items & held_items
    assert sizes["train_pairs"] == len(train) and sizes["heldout_pairs"] == len(held)
    assert sizes["train_pairs"] + sizes["heldout_pairs"] + sizes["dropped_pairs"] == 600
    # One repeated response (a refusal) among unique ones: still a prompt split, only its pairs dropped.
    refusal = tmp_path / "refusal.csv"
    pd.DataFrame({"prompt": [f"Question {i % 10}?" for i in range(600)],
                  "chosen": [f"yes {i}" for i in range(600)],
                  "rejected": ["I don't know" if i % 7 == 0 else f"no {i}" for i in range(600)]}).to_csv(refusal,
                                                                                                     index=False)
    train, held, sizes = load_pairs(str(refusal), None, 0, 0, False, seed=0)
    frame = pd.read_csv(refusal)
    trained_refusals = (~frame.prompt.isin(set(held.prompt)) & (frame.rejected == "I don't know")).sum()
    assert sizes["split_by"] == "prompt" and len(held) == 120 and sizes["dropped_pairs"] == trained_refusals
    assert not (set(train.chosen) | set(train.rejected)) & (set(held.chosen) | set(held.rejected))
    several = tmp_path / "several.csv"
    prompts = [f"Question {i}?" for i in range(10)]
    pd.DataFrame({"prompt": rng.choice(prompts, 600), "chosen": [a for a, _ in pairs],
                  "rejected": [b for _, b in pairs]}).to_csv(several, index=False)
    train, held, sizes = load_pairs(str(several), None, 0, 0, False, seed=0)
    assert sizes["split_by"] == "prompt and item"  # the same items recur under several prompts
    assert len(held) and not set(train.prompt) & set(held.prompt)
    assert not (set(train.chosen) | set(train.rejected)) & (set(held.chosen) | set(held.rejected))
    # Responses unique to their prompt (as in most preference data): the prompt split alone separates them.
    unique = tmp_path / "unique.csv"
    pd.DataFrame({"prompt": [f"Question {i % 10}?" for i in range(600)], "chosen": [f"yes {i}" for i in range(600)],
                  "rejected": [f"no {i}" for i in range(600)]}).to_csv(unique, index=False)
    train, held, sizes = load_pairs(str(unique), None, 0, 0, False, seed=0)
    assert sizes["split_by"] == "prompt" and sizes["dropped_pairs"] == 0 and len(held) == 120
    assert not set(train.prompt) & set(held.prompt)


VARIANTS = ["love", " love", "Love", " LOVE", "care", " Care", "affection", "ally", " ally", "achieve", " achieve",
            "ambition", "attain", " Attain", " ATTAIN", "accomplish", "table", " table"]
LEXICON = {lexicons.AGENCY: ["achiev*", "ambition*", "attain*", "accomplish*"],
           lexicons.COMMUNION: ["love", "care", "affection*", "ally"]}
AGENCY_WORDS, COMMUNION_WORDS = ["achieve", "ambition", "attain", "accomplish"], ["love", "care", "affection", "ally"]


def _variant_table(seed: int = 0) -> data.ScoreTable:
    scores = np.random.default_rng(seed).normal(size=len(VARIANTS))
    frame = pd.DataFrame({"token_id": range(len(VARIANTS)), "token_name": VARIANTS, "token_decoded": VARIANTS,
                          "p": scores})
    return data.ScoreTable("m", "m", frame, "token_decoded")


def test_word_variants_counted_once_per_word():
    """4: with max/mean, love, ' love', Love and ' LOVE' are one observation of the word 'love'."""
    table = _variant_table()
    scores = table.frame.p.to_numpy()
    percentile = scipy_stats.rankdata(scores, method="max") / len(scores)  # the table's own percentile
    per_word: dict[str, list[tuple[float, float]]] = {}
    for v, s, q in zip(VARIANTS, scores, percentile, strict=True):
        per_word.setdefault(v.strip().lower(), []).append((s, q))
    best = {w: max(pts)[1] for w, pts in per_word.items()}  # the best-scoring variant's percentile
    mean = {w: np.mean([q for _, q in pts]) for w, pts in per_word.items()}
    statistics = set()
    for how, value in (("max", best), ("mean", mean)):
        row = bigtwo.bigtwo_comparison([table], ["p"], LEXICON, collapse=how).iloc[0]
        assert (row.n_agency, row.n_communion) == (4, 4)
        agency, communion = [value[w] for w in AGENCY_WORDS], [value[w] for w in COMMUNION_WORDS]
        ref = scipy_stats.mannwhitneyu(agency, communion, alternative="two-sided")
        assert row.mann_whitney_u == pytest.approx(ref.statistic) and row.p_value == pytest.approx(ref.pvalue)
        assert row.median_percentile_agency == pytest.approx(np.median(agency))
        assert row.median_percentile_communion == pytest.approx(np.median(communion))
        statistics.add((row.mann_whitney_u, row.median_percentile_agency))
    assert len(statistics) == 2  # the two countings differ on this table
    none = bigtwo.bigtwo_comparison([table], ["p"], LEXICON).iloc[0]
    assert (none.n_agency, none.n_communion) == (7, 9)  # the papers' counting: every variant token


def test_frequency_scale_and_collapse_in_the_regression():
    """4, 5: the frequency regressor is log per million or its z-score, over words or variant tokens."""
    table = _variant_table(1)
    frequencies = {"love": 300.0, "care": 120.0, "achieve": 40.0, "ambition": 8.0, "table": 90.0, "attain": 5.0}
    afinn = {"love": 3, "care": 2, "achieve": 2, "ambition": 1}
    for how in ("none", "max", "mean"):
        for scale in ("log_per_million", "zscore"):
            row = paper1.frequency_regressions([table], ["p"], afinn, frequencies, how, scale).iloc[0]
            frame = pd.DataFrame({"word": [v.strip().lower() for v in VARIANTS], "score": table.frame.p})
            frame = frame[frame.word.isin(frequencies)]
            if how != "none":
                frame = frame.groupby("word", as_index=False).score.agg(how)
            x = np.log(frame.word.map(frequencies).to_numpy(float))
            x = (x - x.mean()) / x.std() if scale == "zscore" else x
            design = np.column_stack([np.ones(len(x)), x, frame.word.map(afinn).fillna(0).to_numpy(float)])
            coef = np.linalg.lstsq(design, frame.score.to_numpy(), rcond=None)[0]
            assert row.n_tokens == len(frame) and row.slope_frequency == pytest.approx(coef[1], rel=1e-9)



def test_a_frequency_of_one_value_is_refused_as_a_z_score_even_when_its_sd_rounds_above_zero():
    """Variants of one word share its log frequency; where numpy's mean of it rounds, its SD is not 0, and the
    regression ran on a column of ±1 (NaN slopes in the CSV) instead of refusing --frequency_scale=zscore."""
    frequency = next(f for f in np.linspace(1.0, 200.0, 2000) if np.full(3, np.log(f)).std() > 0)
    strings = ["love", " love", "Love", "zzz"]
    frame = pd.DataFrame({"token_id": range(4), "token_name": strings, "token_decoded": strings,
                          "p": [1.0, 2.0, 4.0, 0.0]})
    table = data.ScoreTable("m", "m", frame, "token_decoded")
    with pytest.raises(UsageError, match="no spread to z-score"):
        paper1.frequency_regressions([table], ["p"], {"love": 3}, {"love": frequency}, scale="zscore")


def test_analyze_reports_big_two_under_every_collapse(tmp_path):
    """4: report.md shows the Big Two test with each way of counting variants; the flag picks bigtwo.csv's."""
    scores = tmp_path / "scores"
    scores.mkdir()
    words = VARIANTS * 3
    rng = np.random.default_rng(2)
    for name in ("a", "b"):
        pd.DataFrame({"token_id": range(len(words)), "token_name": words, "token_decoded": words,
                      "greatest": rng.normal(size=len(words))}).to_csv(scores / f"{name}.csv", index=False)
    plain = ["table", "chair", "lamp", "door"] * 3  # no Big Two word at all: NaN, but still reported
    pd.DataFrame({"token_id": range(len(plain)), "token_name": plain, "token_decoded": plain,
                  "greatest": rng.normal(size=len(plain))}).to_csv(scores / "c.csv", index=False)
    out = tmp_path / "out"
    inproc.analyze(out, scores=(str(scores),), collapse_variants="max", models_yaml=None, n_boot=5)
    report = (out / "report.md").read_text()
    assert "word variants: max" in report and "rank_biserial (none)" in report and "rank_biserial (mean)" in report
    big2 = pd.read_csv(out / "bigtwo.csv")
    assert set(big2.collapse) == {"max"}
    variants = pd.read_csv(out / "bigtwo_variants.csv")
    assert sorted(set(variants.collapse)) == ["max", "mean", "none"]
    tables = data.load_score_tables(scores)
    for how in ("none", "max", "mean"):  # each counting's numbers are bigtwo_comparison's on the same tables
        ref = bigtwo.bigtwo_comparison(tables, ["greatest"], lexicons.load_bigtwo(), how).set_index("model")
        got = variants[variants.collapse == how].set_index("model")
        np.testing.assert_allclose(got.loc[["a", "b"], "rank_biserial"], ref.loc[["a", "b"], "rank_biserial"])
        assert (got.loc["a", "n_agency"], got.loc["a", "n_communion"]) == (ref.loc["a", "n_agency"],
                                                                          ref.loc["a", "n_communion"])
    every = report.split("The same test with each word counted once")[1].split("\n\n")[1]  # the 3-way table
    assert "rank_biserial (max)" in every and "| greatest | c |" in every  # a model without Big Two words stays


def test_candidates_stop_at_the_tokenizer_when_the_embedding_has_padded_rows():
    """A model whose embedding has rows past its tokenizer (padded to a multiple) scores only tokens the tokenizer
    has: the count a job claims and plans by is the tokenizer's, as the ids it then scores are."""
    import types

    from rmjax.text.candidates import candidate_count, candidate_ids

    tokenizer = type("Tokenizer", (), {"__len__": lambda self: 10})()
    cfg = types.SimpleNamespace(vocab_size=16)
    assert candidate_count(cfg, tokenizer) == len(candidate_ids(tokenizer, cfg.vocab_size)) == 10
    assert candidate_count(cfg, tokenizer, limit=4) == 4 and candidate_count(cfg, None) == 16


def test_the_split_holds_out_a_response_with_its_edge_whitespace_twin():
    """helper-149: 'item10' was held out while 'item10 ' trained; a trimming chat template (Gemma's, Llama 3's)
    renders both as one conversation, so held-out accuracy partly measured memory. The split compares responses
    without edge whitespace: no held-out response is a trained one's twin, at any seed (checked by brute force)."""
    from rmjax.train.data import Pairs, split_pairs

    rng = np.random.default_rng(1)
    items = [f"item{i}" for i in range(12)] + [f"item{i} " for i in range(12)] + [f" item{i}\n" for i in range(4)]
    drawn = [rng.choice(items, 2, replace=False) for _ in range(300)]
    drawn = [(a, b) for a, b in drawn if a.strip() != b.strip()]
    pairs = Pairs(prompt=["Which is better?"] * len(drawn), chosen=[str(a) for a, _ in drawn],
                  rejected=[str(b) for _, b in drawn], label=np.ones(len(drawn)))
    for seed in range(8):
        train, held, _ = split_pairs(pairs, seed=seed)
        trained = {t.strip() for t in (*train.chosen, *train.rejected)}
        assert held.chosen and not trained & {t.strip() for t in (*held.chosen, *held.rejected)}, seed


def test_the_split_holds_out_a_prompt_with_its_edge_whitespace_twin():
    """helper-153: as responses, a trimming template renders the user's 'Q3' and 'Q3 ' as one turn: a held-out 'Q3'
    beside a trained 'Q3 ' was the same conversation. Prompts are compared stripped too (brute force, 8 seeds)."""
    from rmjax.train.data import Pairs, split_pairs

    rng = np.random.default_rng(2)
    prompts = [f"Q{i}" + rng.choice(["", " ", "\n"]) for i in rng.integers(0, 10, 300)]
    pairs = Pairs(prompt=prompts, chosen=[f"yes {i}" for i in range(300)], rejected=[f"no {i}" for i in range(300)],
                  label=np.ones(300))
    for seed in range(8):
        train, held, _ = split_pairs(pairs, seed=seed)
        assert held.prompt and not {p.strip() for p in train.prompt} & {p.strip() for p in held.prompt}, seed
