"""Issue 46: side B's reward gradient in the disagreement search's proposals, mapped onto side A's tokens through
the strings both read alike — against torch autograd through B's embeddings, and the tokens two real tokenizers
align on, written out by hand."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import torch

from rmjax.loading import config_and_tokenizer, load
from rmjax.parallel.distributed import to_host
from rmjax.search import turns
from rmjax.search.budget import Forwards
from rmjax.search.disagree import Disagreement, aligned_tokens
from rmjax.search.gcg import make_target
from rmjax.search.objective import Objective
from rmjax.search.sides import RewardSide, SideSpec
from rmjax.text import prompts
from rmjax.text.chat import PLAIN_FORMAT, Conversations
from tests import tiny, tolerance

PROMPT = prompts.PAPER1["greatest"]
TEXT = "Honestly, the greatest thing is love."


def test_two_real_tokenizers_align_where_they_cut_the_text_alike():
    """SmolLM2's chat reading and Gemma 3's plain one (a space before the response): 'Hon est ly' against
    ' Honestly', then the same words; the first tokens differ, every later one is paired."""
    _, tok_a = config_and_tokenizer("smollm2-135m-instruct")
    _, tok_b = config_and_tokenizer("gemma-3-270m")
    text = "Honestly, the greatest thing is unconditional love."
    body_a = Conversations(tok_a, PROMPT, "auto").response_ids([text])[0]
    body_b = Conversations(tok_b, PROMPT, "auto").response_ids([text])[0]
    assert [tok_a.decode([i]) for i in body_a][:4] == ["Hon", "est", "ly", ","]
    assert [tok_b.decode([i]) for i in body_b][:2] == [" Honestly", ","]
    twins = np.full(len(tok_a), -1)
    for i in body_a:
        ids = tok_b(tok_a.decode([i]), add_special_tokens=False).input_ids
        twins[i] = ids[0] if len(ids) == 1 else -1
    assert aligned_tokens(tok_a, body_a, tok_b, body_b, twins) == [(i, i - 2) for i in range(3, len(body_a))]
    twins[body_a[5]] = -1  # ' greatest' with no twin in B: no pair there
    assert (5, 3) not in aligned_tokens(tok_a, body_a, tok_b, body_b, twins)


def test_side_b_gradient_on_a_tokens_equals_autograd_through_b(rm_folder, tmp_path):
    """A reads the chat template, B (another RM, the same tokenizer) the plain one: B's tokens 1..9 are A's, its
    first carries the plain template's space. Row i of the mapped gradient is d z_B for swapping A's token i for each
    t: B's embedding gradient at the paired position · (E_B[t] − E_B[own token]) / SD_B, from torch; 0 at rows with
    no pair. In the objective it enters −dJ with the direction's sign (J = sign·(z_A − z_B)), charged 3 of B's
    forwards."""
    hf_b, folder_b = tiny.save_reward_model_with_tokenizer(tmp_path / "b", seed=11)
    rm_a, rm_b = load(str(rm_folder)), load(str(folder_b))
    side_b = RewardSide(SideSpec.parse(str(folder_b)), rm_b, PROMPT, "plain")
    target = make_target(rm_a, PROMPT, "auto")
    end = turns.end_of_turn(target.suffix, rm_a.tokenizer, rm_a.source)
    body_a = Conversations(rm_a.tokenizer, PROMPT, "auto").response_ids([TEXT])[0]
    vocab = rm_a.config.vocab_size
    partner = Disagreement(rm_a.tokenizer, end, (0.0, 2.0), side_b, (0.5, 3.0), token_map=np.arange(vocab))
    turn = np.asarray([*body_a, end], np.int32)
    got = to_host(partner.gradient(turn, vocab))

    tok = rm_b.tokenizer
    ids = tok(PLAIN_FORMAT.format(prompt=PROMPT), add_special_tokens=False).input_ids
    body_b = tok(" " + TEXT, add_special_tokens=False).input_ids
    ids = ids + body_b
    table = hf_b.model.embed_tokens.weight.detach()
    embeds = table[torch.tensor(ids)].clone().requires_grad_()
    hf_b(inputs_embeds=embeds[None]).logits[0, 0].backward()
    start = len(ids) - len(body_b)
    want = np.zeros_like(got)
    for i in range(1, len(body_a)):
        assert body_b[i] == body_a[i]
        g = embeds.grad[start + i]
        want[i] = ((table - table[body_b[i]]) @ g).numpy() / 3.0
    assert np.abs(want).max() > 1e-3
    atol = 2 * tolerance.grad_atol(want, rm_b.config, len(ids), rm_b.config.hidden_size)
    np.testing.assert_allclose(got, want, rtol=0, atol=atol)
    # a token with no twin in B's vocabulary (-1) has no estimated change (it wrapped to B's last column)
    holes = np.arange(vocab)
    holes[::3] = -1
    holed = to_host(Disagreement(rm_a.tokenizer, end, (0.0, 2.0), side_b, (0.5, 3.0), token_map=holes)
                    .gradient(turn, vocab))
    expected = want.copy()
    expected[:, holes == -1] = 0.0
    expected[[i for i, t in enumerate(turn) if i < len(body_a) and holes[t] == -1]] = 0.0  # unpaired: B says nothing
    assert expected.any() and not holed[:, holes == -1].any()
    np.testing.assert_allclose(holed, expected, rtol=0, atol=atol)

    blind = Disagreement(rm_a.tokenizer, end, (0.0, 2.0), side_b, (0.5, 3.0))  # B only scores
    for sign in (1.0, -1.0):
        alone = Objective(target, None, 0.0, sign, 0.0, Forwards(10**6, 9, 9), partner=blind)
        both = Objective(target, None, 0.0, sign, 0.0, Forwards(10**6, 9, 9), partner=partner)
        loss_alone, loss_both = (to_host(o.gradient(turn)[0]) for o in (alone, both))
        np.testing.assert_allclose(loss_both - loss_alone, sign * got, rtol=0, atol=1e-6 * np.abs(got).max())
        # A's part is its reward's gradient in its SDs (2.0): z_A = (R_A − mean) / SD, J's own term. Two calls of one
        # compiled gradient, scaled by a power of two: equal but for a backend's reduction order (1e-6 covers it)
        own = to_host(Objective(target, None, 0.0, sign, 0.0, Forwards(10**6, 9, 9)).gradient(turn)[0])
        np.testing.assert_allclose(loss_alone, own / 2.0, rtol=1e-6, atol=0)
        assert both.forwards.spent - alone.forwards.spent == Fraction(3)
    # a text whose conversation in B does not continue B's cached prefix ("\n\n" merges with the newline its chat
    # template ends the prefix with): B gives no gradient, and none of B's forwards is paid for one
    chat_b = RewardSide(SideSpec.parse(str(folder_b)), rm_b, PROMPT, "auto")
    odd = np.asarray([*rm_a.tokenizer("\n\nlove", add_special_tokens=False).input_ids, end], np.int32)
    assert rm_a.tokenizer.decode(odd[:-1].tolist()) == "\n\nlove" and chat_b.gradient("\n\nlove") is None
    unpaid = Disagreement(rm_a.tokenizer, end, (0.0, 2.0), chat_b, (0.5, 3.0), token_map=np.arange(vocab))
    alone = Objective(target, None, 0.0, 1.0, 0.0, Forwards(10**6, 9, 9), partner=blind)
    none = Objective(target, None, 0.0, 1.0, 0.0, Forwards(10**6, 9, 9), partner=unpaid)
    np.testing.assert_array_equal(to_host(none.gradient(odd)[0]), to_host(alone.gradient(odd)[0]))
    assert none.forwards.spent == alone.forwards.spent
