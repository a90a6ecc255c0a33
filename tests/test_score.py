"""experiments.score as an ad-hoc look: prints rewards and z-scores, writes only with --out."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from tests import cli, inproc, tolerance
from tests import jitted as M

PROMPT = "What, in one word, is the greatest thing ever?"  # --prompts=greatest


def _full_reward(model, ids: list[int]) -> float:
    ids = np.asarray([ids], np.int32)
    return float(np.asarray(M.rewards(model.params, model.config, ids, np.ones_like(ids, bool)))[0, 0])


def test_score_prints_z_scores_and_writes_only_with_out(rm_folder, tmp_path):
    """Issue 45: `score` defaulted to --out=results/texts.csv, so a second ad-hoc call was refused, and it printed
    no z-scores. Now it prints each reward with z against --z_sample single tokens (drawn with seed 0, as the
    frontier draws them), writes nothing without --out, and records the scale in .meta.json with it. Reference:
    one full forward per conversation of the chat template, and numpy's mean and SD of the sampled tokens'."""
    from rmjax.loading import load

    flags = (f"--model={rm_folder}", "--prompts=greatest", "--texts=Love,Hate", "--z_sample=16")
    first = cli.ok(cli.run("score", *flags, cwd=tmp_path))
    again = cli.ok(cli.run("score", *flags, cwd=tmp_path))  # no file claimed: the same call runs twice
    assert list(tmp_path.iterdir()) == [] and first.stdout == again.stdout
    model = load(str(rm_folder))
    tok = model.tokenizer
    sampled = np.random.default_rng(0).choice(min(model.config.vocab_size, len(tok)), 16, replace=False)
    from rmjax.text import chat

    split = chat.split_chat(tok, PROMPT)
    tokens = np.asarray([_full_reward(model, split.ids_with([int(t)])) for t in sampled], np.float64)
    mean, sd = tokens.mean(), tokens.std(ddof=1)
    for text in ("Love", "Hate"):
        rendered = tok.apply_chat_template([{"role": "user", "content": PROMPT},
                                            {"role": "assistant", "content": text}], tokenize=False)
        full = tok(rendered, add_special_tokens=False).input_ids
        want = _full_reward(model, full)
        row = re.search(rf"^\s+(\S+)\s+z\s+(\S+)\s+'{text}'$", first.stdout, flags=re.M)
        assert row, first.stdout
        atol = tolerance.any_rewards_atol(model.params, model.config, len(full) + 8)
        assert abs(float(row.group(1)) - want) <= atol + 5e-5  # printed to 4 decimals
        # z = (r - m) / s: r and the mean each within atol, the SD within atol·sqrt(n/(n-1)) (Minkowski), so z is
        # within (2 + |z|·1.04)·atol / (s - 1.04·atol), plus half the printed 0.01
        z = (want - mean) / sd
        assert abs(float(row.group(2)) - z) <= (2 + 1.04 * abs(z)) * atol / (sd - 1.04 * atol) + 5e-3
    from rmjax.scoring.texts import ScoreSpec, run_score  # with --out, in-process (the flags are checked above)

    out = tmp_path / "t.csv"
    written = run_score(ScoreSpec(inproc.options(rm_folder, out), {"greatest": PROMPT}, ("Love", "Hate"), z_sample=16))
    recorded = json.loads((tmp_path / "t.csv.meta.json").read_text())["z_scale"]["greatest"]
    atol = tolerance.any_rewards_atol(model.params, model.config, 64)  # a prompt and one token: under 64 keys
    assert abs(recorded[0] - mean) <= atol and abs(recorded[1] - sd) <= 1.04 * atol  # SD: atol·sqrt(16/15)
    assert written.scale == {"greatest": tuple(recorded)}  # what the job returns is what it recorded


def test_texts_keep_their_edge_spaces(rm_folder, tmp_path):
    """absl's list flag strips each item: `--texts=" Love",Hate` scored 'Love', a different conversation, under
    the name the user typed nowhere (the CSV said 'Love'). Each item is now kept as typed, said on stderr, and a
    quoted item keeps its comma, and a line break, quoted or not, its line break (the csv module refused one
    unquoted). Reference: one full forward of the chat template's rendering of each."""
    from rmjax.loading import load
    from rmjax.runs.results import read_scores_csv

    out, lines = tmp_path / "t.csv", tmp_path / "lines.txt"
    lines.write_text("Hate \n")  # a file's trailing space, said as --texts' is (helper-143: kept unsaid)
    run = cli.ok(cli.run("score", f"--model={rm_folder}", "--prompts=greatest", '--texts=" Love","a, b",two\nlines',
                         f"--texts_file={lines}", "--z_sample=0", f"--out={out}"))
    assert "--texts: 1 response with a space at an end, kept as typed" in run.stderr and "' Love'" in run.stderr
    assert "--texts_file: 1 response with a space at an end, kept as typed" in run.stderr, run.stderr
    table = read_scores_csv(out)
    assert list(table["text"]) == [" Love", "a, b", "two\nlines", "Hate "]
    model = load(str(rm_folder))

    def rendered(response: str) -> str:
        return model.tokenizer.apply_chat_template([{"role": "user", "content": PROMPT},
                                                    {"role": "assistant", "content": response}], tokenize=False)

    spaced = model.tokenizer(rendered(" Love"), add_special_tokens=False).input_ids
    stripped = model.tokenizer(rendered(" Love").replace(" Love", "Love"), add_special_tokens=False).input_ids
    assert spaced != stripped  # the space is part of what the model reads
    two_lines = model.tokenizer(rendered("two\nlines"), add_special_tokens=False).input_ids
    for row, ids in ((0, spaced), (2, two_lines)):
        atol = tolerance.any_rewards_atol(model.params, model.config, len(ids) + 8)
        assert abs(float(table["greatest"][row]) - _full_reward(model, ids)) <= atol, row


def test_text_batches_keep_every_row_once_and_join_a_width_s_few_rows_to_the_next():
    """texts._cut on random width groups: every row once, shortest first, no batch past batch_size, only the
    last batch holds fewer than `alone` rows (a width's few rows ride with the next width's), and a batch takes a
    wider row only while it holds fewer than `alone` rows (pooling every width, padded 11-16% more, fails)."""
    from rmjax.scoring.texts import _cut

    rng = np.random.default_rng(0)
    for trial in range(200):
        by_width, index = {}, 0
        for width in sorted(rng.choice(np.arange(4, 80, 4), size=rng.integers(1, 8), replace=False)):
            count = int(rng.integers(1, 70))
            by_width[int(width)] = [(index + k, [0] * int(width)) for k in range(count)]
            index += count
        batch_size, alone = int(rng.choice([8, 32, 256])), 16
        batches = list(_cut(by_width, batch_size, alone))
        rows = [row for part in batches for row in part]
        assert [i for i, _ in rows] == list(range(index))  # each once, in width order (the dict's rows in order)
        assert all(1 <= len(part) <= batch_size for part in batches)
        assert all(len(part) >= min(alone, batch_size) for part in batches[:-1]), trial
        for part in batches:  # where the width grows inside a batch, fewer than `alone` rows came before
            assert all(k < alone for k in range(1, len(part)) if len(part[k][1]) != len(part[k - 1][1])), trial


def test_a_text_past_the_context_is_refused_before_the_weights_load(rm_folder, tmp_path, monkeypatch):
    """A fault hunt: score refused a response past the model's context (512 positions) only after loading it. Now
    from the tokenizer, before; a text of more bytes than positions that fits in tokens is still scored."""
    from rmjax.loading import load
    from rmjax.runs.options import RunOptions
    from rmjax.scoring.texts import ScoreSpec, run_score

    def options(out):  # out None: an ad-hoc look, nothing written
        return RunOptions(model=str(rm_folder), out=None if out is None else str(out))

    tok = load(str(rm_folder)).tokenizer
    fits = " ".join(["word"] * 120)  # 599 bytes in about 120 tokens: the tokenizer, not the bytes, decides
    assert len(fits.encode()) > 512 > len(tok(fits).input_ids) + 40
    long = " ".join(["word"] * 512)
    with monkeypatch.context() as patch:
        inproc.no_weights_read(patch)
        for out in (None, tmp_path / "t.csv"):
            inproc.refused(lambda out=out: run_score(ScoreSpec(options(out), {"greatest": PROMPT}, ("Love", long),
                                                               z_sample=0)),
                           "response 'word word", "more than the model's context of 512", "score a shorter response")
    assert not list(tmp_path.iterdir())
    scored = run_score(ScoreSpec(options(None), {"greatest": PROMPT}, ("Love", fits), z_sample=0))
    assert np.isfinite(scored.scores["greatest"]).all() and len(scored.scores["greatest"]) == 2


@pytest.mark.parametrize("tokenizer_of", ["tiny", "gemma-3-270m"])
def test_the_early_context_check_refuses_exactly_the_conversations_past_the_context(rm_folder, tokenizer_of):
    """Conversations.check_fit tokenizes only responses of more bytes than the template leaves room for; against a
    brute force (every conversation tokenized), over texts where tokens and bytes part most (many-byte characters,
    special-token strings, whitespace runs), with a context cut just around each: byte-level BPE and SentencePiece
    (a dummy prefix, byte fallback)."""
    from rmjax.errors import PromptTooLongError
    from rmjax.loading import config_and_tokenizer
    from rmjax.text.chat import Conversations

    tok = config_and_tokenizer(str(rm_folder) if tokenizer_of == "tiny" else tokenizer_of)[1]
    texts = ["Love", " ".join(["word"] * 40), "😀" * 30, "日本語の文章" * 10, "<|im_end|>" * 8,
             "<start_of_turn>model\n" * 6, " " * 90 + "x", "\n\n" * 40, "é" * 70]
    for template in ("auto", "plain"):
        conversations = Conversations(tok, PROMPT, template)
        lengths = [len(ids) for ids in conversations.token_ids(texts)]
        for text, length in zip(texts, lengths, strict=True):
            for context in (length - 1, length):  # just past, and just within
                try:
                    conversations.check_fit([text], context)
                    refused = False
                except PromptTooLongError:
                    refused = True
                assert refused == (length > context), (template, text[:20], length, context)


def test_the_library_scorers_refuse_a_response_past_the_context(rm_folder):
    """Mutants that survived: score_texts and score_conversations (whole, and against a cached prefix) without their
    length check scored positions the model never saw. The audit, the disagreement job and head training call them
    directly, not through run_score's early check. The tiny model's context is 512 positions."""
    from rmjax.errors import PromptTooLongError
    from rmjax.loading import load
    from rmjax.scoring.texts import CACHED_PROMPT_ROWS, score_conversations, score_texts

    model = load(str(rm_folder))
    assert model.config.max_position_embeddings == 512
    long = " ".join(["word"] * 600)
    past = f"{long[:40]!r} makes a conversation of"
    with pytest.raises(PromptTooLongError, match=re.escape(past)):
        score_texts(model, {"greatest": PROMPT}, ["Love", long])
    for rows in (2, CACHED_PROMPT_ROWS):
        responses = [f"Answer {i}." for i in range(rows - 1)] + [long]
        with pytest.raises(PromptTooLongError, match=re.escape(past)):
            score_conversations(model, [PROMPT] * rows, responses)


def test_a_score_result_is_reused_only_for_the_same_inputs():
    """Mutants that survived: the score job's identity without its template, z sample, output column, texts or
    dtype would reuse a finished CSV scored otherwise. Each input, changed alone, gives another identity; the same
    inputs give the same."""
    from rmjax.scoring.texts import text_scores_identity

    base = dict(dtype="float32", output_column=0, prompts={"greatest": PROMPT, "worst": "Worst?"},
                texts=["Love", "Hate"], template="auto", z_sample=2048)
    identity = text_scores_identity({"weights": "abc"}, **base)
    assert text_scores_identity({"weights": "abc"}, **base) == identity
    changed = {"dtype": "bfloat16", "output_column": 1, "prompts": {"greatest": PROMPT}, "texts": ["Love", "Hat"],
               "template": "plain", "z_sample": 0}
    for key, value in changed.items():
        assert text_scores_identity({"weights": "abc"}, **{**base, key: value}) != identity, key
    assert text_scores_identity({"weights": "abd"}, **base) != identity


def test_a_z_sample_that_gives_no_sd_is_refused_before_loading(rm_folder, monkeypatch):
    """Mutants that survived: --z_sample=1 (an SD of one value) and a negative one reached the model."""
    from rmjax.runs.options import RunOptions
    from rmjax.scoring.texts import ScoreSpec, run_score

    inproc.no_weights_read(monkeypatch)
    for n in (1, -1):
        inproc.refused(lambda n=n: run_score(ScoreSpec(RunOptions(model=str(rm_folder), out=None), {"greatest": PROMPT},
                                                       ("Love",), z_sample=n)),
                       f"--z_sample={n}", "at least 2 tokens")


def test_write_text_scores_refuses_a_prompt_named_as_its_key_column(rm_folder, tmp_path):
    """Mutant that survived: the library's writer without its name check wrote a prompt named `text` over the
    column of the texts."""
    from rmjax.errors import UsageError
    from rmjax.loading import load
    from rmjax.scoring.texts import write_text_scores

    with pytest.raises(UsageError, match="prompt name 'text' is a key column"):
        write_text_scores(load(str(rm_folder)), {"text": PROMPT}, ["Love"], tmp_path / "t.csv")
    assert list(tmp_path.iterdir()) == []


def test_the_z_sample_draws_tokens_the_tokenizer_has(tmp_path):
    """Mutant that survived: a config's vocabulary padded past its tokenizer (as Gemma's and Llama's checkpoints
    pad theirs) made the z sample draw rows no text reaches. Reference: numpy's mean and SD of one full forward
    per sampled token, drawn (seed 0) from the tokenizer's ids."""
    from rmjax.loading import load
    from rmjax.scoring.texts import z_scale
    from rmjax.text import chat
    from tests import tiny

    _, folder = tiny.save_reward_model_with_tokenizer(tmp_path / "rm", vocab_size=49152 + 64)
    model = load(str(folder))
    assert model.config.vocab_size > len(model.tokenizer) == 49152
    split = chat.split_chat(model.tokenizer, PROMPT)
    sampled = np.random.default_rng(0).choice(len(model.tokenizer), 16, replace=False)
    rewards = np.asarray([_full_reward(model, split.ids_with([int(t)])) for t in sampled], np.float64)
    mean, sd = z_scale(model, {"greatest": PROMPT}, 16)["greatest"]
    atol = tolerance.any_rewards_atol(model.params, model.config, 64)
    assert abs(mean - rewards.mean()) <= atol and abs(sd - rewards.std(ddof=1)) <= 1.04 * atol


def test_the_library_scorers_refuse_a_causal_lm(lm_folder):
    """Mutants that survived: score_texts and score_conversations without their reward-model check: a causal LM
    has no score head to read."""
    from rmjax.errors import UsageError
    from rmjax.loading import load
    from rmjax.scoring.texts import score_conversations, score_texts

    lm = load(str(lm_folder))
    with pytest.raises(UsageError, match="text scoring needs a reward model"):
        score_texts(lm, {"greatest": PROMPT}, ["Love"])
    with pytest.raises(UsageError, match="conversation scoring needs a reward model"):
        score_conversations(lm, [PROMPT], ["Love"])


def test_long_text_passes_report_their_progress():
    """Mutant that survived: text scoring without its progress (rate and ETA) on the long passes, from 2,000 texts."""
    from rmjax.runs.progress import Progress
    from rmjax.scoring.texts import _progress

    assert _progress(1999) is None
    assert isinstance(_progress(2000), Progress) and _progress(2000).total == 2000


def test_conversation_scoring_reads_the_template_it_is_given(rm_folder):
    """Mutants that survived: score_conversations reading its conversations in the default template, whole (a prompt
    of a few responses) or against the prompt's cached prefix (16 or more). Reference: one full forward per
    conversation, tokenized by transformers from the plain format's text (`User: …\\nAssistant: …`)."""
    from rmjax.loading import load
    from rmjax.scoring.texts import CACHED_PROMPT_ROWS, score_conversations

    model = load(str(rm_folder))
    few, responses = "Who won?", [f"Answer {i}." for i in range(CACHED_PROMPT_ROWS)]
    prompts = [few, few] + [PROMPT] * CACHED_PROMPT_ROWS
    texts = responses[:2] + responses
    got = score_conversations(model, prompts, texts, template="plain")
    auto = score_conversations(model, prompts, texts)
    for i in (0, 1, 2, len(texts) - 1):
        ids = model.tokenizer(f"User: {prompts[i]}\nAssistant: {texts[i]}", add_special_tokens=True).input_ids
        atol = tolerance.any_rewards_atol(model.params, model.config, len(ids))
        assert abs(got[i] - _full_reward(model, ids)) <= atol, i
        assert abs(got[i] - auto[i]) > 10 * atol, i  # the templates differ enough to tell apart


def test_the_printed_ranking_puts_a_nan_reward_last():
    """helper-143: an --allow_nonfinite run's NaN, as a sort key, left the highest finite texts out of the printed
    "highest first" list (0.6546 'a', 0.6351 'b', nan, with 'c' at 0.6563 unshown). Brute force: the finite
    rewards in descending order, then the NaN."""
    from types import SimpleNamespace

    from experiments.score import summary

    values = np.array([0.6546, 0.6351, np.nan, 0.6563, 0.6512, 0.6541])
    texts = ["a", "b", "<file_sep>", "c", "Love", "x"]
    printed = summary(SimpleNamespace(scores={"greatest": values}, scale=None, out=None), texts, 6).splitlines()
    want = [texts[i] for i in sorted((i for i in range(6) if np.isfinite(values[i])), key=lambda i: -values[i])]
    assert [line.split()[-1].strip("'") for line in printed[1:7]] == [*want, "<file_sep>"], printed
