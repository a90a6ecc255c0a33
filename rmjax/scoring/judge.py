"""How fluent a response reads to an independent LM (issue 25's judge): the perplexity of its decoded text under a
causal LM of another family, on the judge's own tokenization, after the prompt in the judge's own chat template.

The text is put into the judge's conversation and the whole conversation tokenized, so the response's tokens are
those the judge would read there (a leading space or a merge at the template's edge included); where the
conversation's head is not the prompt's prefix token for token, the text is tokenized alone.

The judge reads the prompt's prefix and the response's tokens, within its context: a response longer than that in
the judge's tokenization (known only once the text is, since one RM token may be many judge tokens) is refused in
one line, never scored at positions the judge was not trained on.
"""

from __future__ import annotations

import numpy as np

from rmjax.errors import PromptTooLongError
from rmjax.model import Model
from rmjax.parallel import batching
from rmjax.scoring.prefix import prefill_prefix
from rmjax.scoring.prior import first_token_log_probs, require_lm_head, response_log_probs
from rmjax.text import chat


def judge_tokens(judge: Model, prompt: str, texts: list[str], template: str = "auto"
                 ) -> tuple[tuple[int, ...], list[list[int]]]:
    """The prompt's prefix in the judge's template and each text's tokens after it."""
    split = chat.split_chat(judge.tokenizer, prompt, template, judge.config.max_position_embeddings)
    inside = chat.Conversations(judge.tokenizer, prompt, template).response_ids(list(texts))
    rows = [ids if ids is not None else judge.tokenizer(text, add_special_tokens=False).input_ids
            for text, ids in zip(texts, inside, strict=True)]
    tail = len(split.suffix)
    check_room(judge, prompt, len(split.prefix), tail, texts, rows)
    return split.prefix, rows


def check_room(judge: Model, prompt: str, prefix: int, suffix: int, texts: list[str], rows: list[list[int]]
               ) -> None:
    """Refuse, naming the longest, responses whose conversation in the judge's template (prefix, the response's
    judge tokens, suffix: split_chat's rule) passes the judge's context (max_position_embeddings): their
    perplexity would be read at positions it never saw."""
    context = judge.config.max_position_embeddings
    longest = max(range(len(rows)), key=lambda i: len(rows[i]), default=None)
    if longest is None or prefix + len(rows[longest]) + suffix <= context:
        return
    over = sum(prefix + len(r) + suffix > context for r in rows)
    raise PromptTooLongError(
        f"the judge {judge.source} cannot read {over} of {len(rows)} responses within its context of {context} "
        f"positions (max_position_embeddings): {texts[longest]!r} is {len(rows[longest])} of its tokens, between "
        f"a prefix of {prefix} and a suffix of {suffix} (prompt {prompt[:40]!r}). Give a smaller --num_tokens or a "
        "judge with a longer context; no perplexity was computed.")


def judge_end_of_turn(judge: Model, prompt: str, template: str = "auto") -> int:
    """What ends a response for the judge (chat.end_of_turn_id): its template's first token after the response,
    or, for a base model read as plain text (no chat template), the newline before the next turn."""
    return chat.end_of_turn_id(judge.tokenizer, chat.split_chat(judge.tokenizer, prompt, template).suffix,
                               f"the judge {judge.source}")


def judge_perplexities(judge: Model, prompt: str, texts: list[str], template: str = "auto",
                       batch_size: int = 64, end_of_turn: bool = False) -> np.ndarray:
    """exp(−mean log p) of each text's judge tokens after the prompt [W] float64; NaN for a text with no token.
    With `end_of_turn` (whole responses, rmjax.search.turns), the judge's end of turn after them counts too: a
    fragment the judge would not stop on reads as less fluent."""
    lps = text_log_probs(judge, prompt, texts, template, batch_size, end_of_turn)
    return np.asarray([np.exp(-lp.mean()) if len(lp) else np.nan for lp in lps], np.float64)


WIDTH_STEP = 4


class PromptLogProbs:
    """Token log-probs of texts after one prompt under one LM (`text_log_probs`), its prefix prefilled once: a caller
    that reads many batches of texts (an implicit reward side) pays the prompt once."""

    def __init__(self, lm: Model, prompt: str, template: str = "auto"):
        require_lm_head(lm)
        self.lm, self.prompt, self.template = lm, prompt, template
        self.prefix = chat.split_chat(lm.tokenizer, prompt, template, lm.config.max_position_embeddings).prefix
        self.cache, self.first = prefill_prefix(lm, self.prefix), first_token_log_probs(lm, list(self.prefix))

    def __call__(self, texts: list[str], batch_size: int = 64, end_of_turn: bool = False) -> list[np.ndarray]:
        lm, prompt, template = self.lm, self.prompt, self.template
        distinct = list(dict.fromkeys(texts))
        _, rows = judge_tokens(lm, prompt, distinct, template)  # after self.prefix: split_chat's, as here
        if end_of_turn:
            end = judge_end_of_turn(lm, prompt, template)
            rows = [[*r, end] if r else r for r in rows]
        out = [np.zeros(0, np.float64) for _ in distinct]
        order = sorted((i for i, r in enumerate(rows) if r), key=lambda i: len(rows[i]))
        for start in range(0, len(order), batch_size):
            which = order[start : start + batch_size]
            # widths in steps of WIDTH_STEP (within the context): one program per token count compiled 16 for an
            # implicit side (helper-165); causal, the padding after a text changes none of its log-probs
            longest = len(rows[which[-1]])
            room = max(longest, lm.config.max_position_embeddings - len(self.prefix))
            padded, _ = batching.pad_rows([rows[i] for i in which], min(room, batching.bucket(longest, WIDTH_STEP)))
            lps = response_log_probs(lm, self.cache, self.first, padded, batch_size).astype(np.float64)
            for k, i in enumerate(which):
                out[i] = lps[k, : len(rows[i])]
        at = {text: i for i, text in enumerate(distinct)}
        return [out[at[text]] for text in texts]


def text_log_probs(lm: Model, prompt: str, texts: list[str], template: str = "auto", batch_size: int = 64,
                   end_of_turn: bool = False) -> list[np.ndarray]:
    """Each text's token log-probs under `lm` after the prompt, on the LM's own tokenization in its own template
    (judge_tokens), float64; with `end_of_turn`, its end of turn's last (a text with no token: none). Each distinct
    text runs once; texts sorted by token count share batches, each right-padded to its longest (causal: the padding
    after a text's tokens changes none of its log-probs), so few rows are padding."""
    return PromptLogProbs(lm, prompt, template)(texts, batch_size, end_of_turn)
