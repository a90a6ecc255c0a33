"""The completion check (rmjax.search.completion): the prior's greedy continuation of written responses against
transformers decoding one token at a time with the whole sequence recomputed (no cache, no padding), and the
completed texts' rewards against the score job (experiments.score's library path).

A tiny random LM rarely predicts the end of turn, so the end is made reachable two ways: greedy_continuations is
given, as its end token, a token the reference predicts at some step; and a copy of the LM whose end-of-turn column
of the LM head is twice the column of the token it predicts after one response (that logit doubles: where it was
the largest and positive, the end of turn now is).

Argmax decisions are compared only where the reference's top-2 logit gap exceeds twice the logits' float32 bound
(tests/tolerance.py: each side's logits are then within the bound of each other, so both pick the same token);
up to the first closer call, the continuations must agree token for token."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import transformers

from rmjax import nn
from rmjax.errors import PromptTooLongError, UsageError
from rmjax.loading import load
from rmjax.parallel.sharding import make_mesh
from rmjax.runs import results
from rmjax.scoring.texts import ScoreSpec, run_score, score_texts
from rmjax.search.completion import complete_responses, greedy_continuations
from rmjax.text import prompts
from rmjax.text.chat import split_chat
from tests import inproc, tolerance

PROMPT = prompts.PAPER1["greatest"]
MAX_NEW = 6
LENGTHS = (1, 2, 3, 5, 4, 0)  # 0: the next token after the prompt alone


@dataclasses.dataclass
class Reference:
    """transformers' greedy decode of prefix + response, MAX_NEW steps whatever the end token."""

    response: list[int]
    logits: np.ndarray  # [MAX_NEW, V] float32: the logits of each step's next token

    def preds(self, logits: np.ndarray | None = None) -> np.ndarray:
        return (self.logits if logits is None else logits).argmax(-1)


def _reference(hf, prefix: list[int], response: list[int]) -> Reference:
    ids, steps = [*prefix, *response], []
    with torch.no_grad():
        for _ in range(MAX_NEW):
            logits = hf(input_ids=torch.tensor([ids])).logits[0, -1].numpy()
            steps.append(logits)
            ids.append(int(logits.argmax()))
    return Reference(response, np.stack(steps))


@pytest.fixture(scope="module")
def setup(lm_folder, rm_folder):
    prior, rm = load(str(lm_folder)), load(str(rm_folder))
    hf = transformers.LlamaForCausalLM.from_pretrained(str(lm_folder), dtype=torch.float32,
                                                       attn_implementation="eager").eval()
    split = split_chat(prior.tokenizer, PROMPT)
    rng = np.random.default_rng(0)
    responses = [rng.integers(100, 20000, size=n).tolist() for n in LENGTHS]
    refs = [_reference(hf, list(split.prefix), r) for r in responses]
    return dict(folder=lm_folder, prior=prior, rm=rm, prefix=list(split.prefix), end=split.suffix[0],
                responses=responses, refs=refs, hf=hf)


def _atol(model, prefix: list[int], ref: Reference, params=None) -> float:
    """The logits' float32 bound over the whole greedy sequence."""
    ids = np.asarray([[*prefix, *ref.response, *ref.preds()]], np.int32)
    return tolerance.logits_atol(model.params if params is None else params, model.config, ids)


def _check(got_ends: bool, got_added: list[int], ref: Reference, end: int, atol: float,
           logits: np.ndarray | None = None) -> bool:
    """The reference's outcome for end token `end` (on its own or edited logits), checked up to its first close
    call; whether every decision was clear (the whole outcome compared)."""
    logits = ref.logits if logits is None else logits
    preds = ref.preds(logits)
    stop = int(np.argmax(preds == end)) if (preds == end).any() else MAX_NEW
    top2 = np.sort(logits, axis=-1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 2 * atol
    decided = min(stop, MAX_NEW - 1) + 1  # the steps whose argmax decides the outcome
    first_close = int(np.argmin(clear[:decided])) if not clear[:decided].all() else decided
    if first_close == decided:
        assert got_ends == (stop == 0) and got_added == preds[:stop].tolist(), (got_added, preds[:stop], end)
        return True
    assert got_added[:first_close] == preds[:first_close].tolist()
    return False


def test_greedy_continuations_equal_transformers_decoding_without_a_cache(setup):
    prior, prefix, refs = setup["prior"], setup["prefix"], setup["refs"]
    atols = [_atol(prior, prefix, ref) for ref in refs]
    # the real end of turn (never predicted by this LM: every row runs MAX_NEW tokens), a token predicted at step 3
    # (row 0 stops there), one predicted first (row 2 ends at once)
    ends = [setup["end"], int(refs[0].preds()[3]), int(refs[2].preds()[0])]
    outcomes = set()
    for end in ends:
        got_ends, added = greedy_continuations(prior, prefix, end, setup["responses"], max_new=MAX_NEW)
        assert got_ends.dtype == bool and got_ends.shape == (len(refs),)
        for i, ref in enumerate(refs):
            assert _check(bool(got_ends[i]), added[i], ref, end, atols[i]), f"row {i}: a close call"
            outcomes.add("ends" if got_ends[i] else "stops early" if len(added[i]) < MAX_NEW else "runs max_new")
    assert outcomes == {"ends", "stops early", "runs max_new"}
    # batches of 2 rows (several compiled calls), and rows over a mesh's `data` axis: the same continuations
    whole = greedy_continuations(prior, prefix, ends[1], setup["responses"], MAX_NEW)
    assert greedy_continuations(prior, prefix, ends[1], setup["responses"], MAX_NEW, batch_size=2)[1] == whole[1]
    meshed = load(str(setup["folder"]), mesh=make_mesh("data:4,model:2"))
    got_ends, added = greedy_continuations(meshed, prefix, ends[1], setup["responses"], MAX_NEW)
    assert added == whole[1] and got_ends.tolist() == whole[0].tolist()


def test_a_prompt_whose_shared_prefix_fills_its_cache(setup):
    """The prompt's prefix less its last token is prefilled once, left-padded to a bucket of 32 slots; where it fills
    the bucket there is no padding slot for a misplaced decode step to land in harmlessly."""
    prior = setup["prior"]
    letters, words = "qwertyuiopasdfghjklzxcvbnm", []
    while len(split_chat(prior.tokenizer, " ".join(words)).prefix) - 1 < 64:
        words.append(letters[len(words) % len(letters)])
    prefix = list(split_chat(prior.tokenizer, " ".join(words)).prefix)
    assert len(prefix) - 1 == 64, len(prefix)  # a letter is one token here: the bucket is full
    refs = [_reference(setup["hf"], prefix, r) for r in setup["responses"][:3]]
    got_ends, added = greedy_continuations(prior, prefix, setup["end"], [r.response for r in refs], MAX_NEW)
    for i, ref in enumerate(refs):
        assert _check(bool(got_ends[i]), added[i], ref, setup["end"], _atol(prior, prefix, ref)), f"row {i}"


@pytest.fixture(scope="module")
def completed(setup):
    """complete_responses with an LM whose end-of-turn logit is twice that of the token it predicts first after
    response 1 (a positive logit: so the end of turn is its argmax there)."""
    prior, refs, end = setup["prior"], setup["refs"], setup["end"]
    token = int(refs[1].preds()[0])
    assert refs[1].logits[0, token] > 0
    kernel = np.asarray(nn.get(prior.params, "lm_head.kernel"))
    edited = kernel.copy()
    edited[:, end] = 2 * kernel[:, token]
    params = nn.replace(prior.params, prior.config, **{"lm_head.kernel": edited})
    ending = dataclasses.replace(prior, params=params, fingerprint=None, fingerprint_of=None)
    out = complete_responses(setup["rm"], ending, PROMPT, setup["responses"], max_new=MAX_NEW)
    for i, ref in enumerate(refs):
        logits = ref.logits.copy()
        logits[:, end] = 2 * ref.logits[:, token]
        added = out.completed_ids[i][len(ref.response):]
        assert out.completed_ids[i][: len(ref.response)] == ref.response
        assert _check(bool(out.ends_turn[i]), added, ref, end, _atol(prior, setup["prefix"], ref, params), logits)
    assert out.ends_turn[1] and not out.ends_turn.all()  # both kinds of rows reach the reward model
    return out


def test_completed_rewards_are_what_the_score_job_writes(setup, completed, tmp_path):
    rm, texts = setup["rm"], completed.completed_text
    assert completed.completed_reward.dtype == np.float64 and completed.completed_reward.shape == (len(texts),)
    for ids, text, response in zip(completed.completed_ids, texts, setup["responses"], strict=True):
        assert text.startswith(rm.tokenizer.decode(response))
        assert text == rm.tokenizer.decode(ids) or text == rm.tokenizer.decode(response) + rm.tokenizer.decode(
            ids[len(response):])
    out = run_score(ScoreSpec(inproc.options(setup["rm"].source, tmp_path / "scores.csv"), {"p": PROMPT},
                              tuple(texts), z_sample=0)).out
    table = results.read_scores_csv(out)
    assert table["text"].tolist() == texts
    longest = max(len(ids) for ids in completed.completed_ids) + len(setup["prefix"]) + 8
    np.testing.assert_allclose(completed.completed_reward, table["p"].to_numpy(np.float64), rtol=0,
                               atol=tolerance.any_rewards_atol(rm.params, rm.config, longest))


def test_a_response_that_ends_the_turn_is_its_own_completion(setup, completed):
    rm, response = setup["rm"], setup["responses"][1]
    assert completed.ends_turn[1] and completed.completed_ids[1] == response
    text = rm.tokenizer.decode(response)
    assert completed.completed_text[1] == text
    own = score_texts(rm, {"p": PROMPT}, [text])["p"][0]
    atol = tolerance.any_rewards_atol(rm.params, rm.config, len(setup["prefix"]) + len(response) + 8)
    np.testing.assert_allclose(completed.completed_reward[1], own, rtol=0, atol=atol)


def test_refusals(setup):
    prior, rm = setup["prior"], setup["rm"]
    # the plain template puts nothing after the response: the newline before the next turn ends it (its greedy
    # continuation is the one greedy_continuations gives with that end)
    done = complete_responses(rm, prior, PROMPT, [[5], [6, 7]], template="plain", max_new=3)
    plain = split_chat(prior.tokenizer, PROMPT, "plain")
    newline = prior.tokenizer("\n", add_special_tokens=False).input_ids
    assert len(newline) == 1
    ends, added = greedy_continuations(prior, plain.prefix, newline[0], [[5], [6, 7]], max_new=3)
    assert done.completed_ids == [[5, *added[0]], [6, 7, *added[1]]] and (done.ends_turn == ends).all()
    context = prior.config.max_position_embeddings
    inproc.refused(lambda: greedy_continuations(prior, setup["prefix"], setup["end"], [[5], [6] * 10], max_new=context),
                   "response 0 needs", "max_position_embeddings")
    with pytest.raises(PromptTooLongError):
        greedy_continuations(prior, setup["prefix"], setup["end"], [[5]], max_new=context - len(setup["prefix"]))
    with pytest.raises(UsageError):
        greedy_continuations(prior, setup["prefix"], setup["end"], [[5]], max_new=0)


def test_a_prompt_the_completion_check_cannot_fit_is_refused_before_any_model_loads(lm_folder, rm_folder, tmp_path):
    """helper-144: a prompt that left room for the search's response but not for the completion check's 32 tokens
    ran the whole search (beam, GCG, frontier, disagree; the judge loaded too) and then stopped with nothing written,
    its chunks kept, so a rerun resumed into the same refusal. Each job now refuses it from its flags, configs and
    tokenizers, by the arithmetic greedy_continuations applies: templated prompt + response + 32 > context (512)."""
    from tests import cli, tiny

    _, tied = tiny.save_reward_model_with_tokenizer(tmp_path / "tied", tie_word_embeddings=True)
    prompt = "word " * 462
    prefix = len(split_chat(load(str(tied)).tokenizer, prompt, "auto").prefix)
    need = prefix + 3 + 32
    assert need > 512 >= prefix + 3  # past the context only with the check's tokens: the search itself fits
    out = tmp_path / "out"
    common = ("--prompts=", f"--prompt=long={prompt}")
    search = ("--num_tokens=3", "--samples=4", "--search_width=8", "--topk=4", "--z_sample=64", f"--judge={lm_folder}")
    procs = cli.run_each(
        ("beam", f"--model={tied}", *common, "--limit=100", "--depth=3", f"--out={out}.csv"),
        ("gcg", f"--model={tied}", *common, "--num_tokens=3", "--steps=2", "--search_width=8", "--topk=4",
         f"--out={out}.json"),
        ("frontier", f"--model={tied}", *common, *search, "--lambdas=0", "--forwards=100", f"--out={out}"),
        ("disagree", f"--models={tied},{rm_folder}", *common, *search, "--forwards=600", f"--out={out}"))
    for proc, flag in zip(procs, ("--depth", "--num_tokens", "--num_tokens", "--num_tokens"), strict=True):
        cli.user_error(proc, f"the completion check of the written rows needs {need} of", "512 positions",
                       f"a smaller {flag}, or a prior with a longer context (--lm)")
    assert not list(tmp_path.glob("out*"))
