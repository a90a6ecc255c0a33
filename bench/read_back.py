"""The vocabulary read-back (candidates.token_round_trips: is each token's text, put in the template as the response
and tokenized, the token itself?) against the plain way, in the same run.

    python bench/read_back.py [--model=elo-rm-smollm2-135m] [--tokens=N] [--prompt=greatest]

The plain way renders each conversation with its own apply_chat_template call and tokenizes it whole; rmjax renders
them in one call and tokenizes from the template head's last special token on (rmjax.text.chat.Conversations).
Prints both ways' strings per second, their ratio, and whether the masks agree (they must, string for string).
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="elo-rm-smollm2-135m")
    ap.add_argument("--tokens", type=int, default=None, help="The first N tokens (default: the whole vocabulary).")
    ap.add_argument("--prompt", default="greatest")
    args = ap.parse_args()

    from rmjax.loading import config_and_tokenizer
    from rmjax.text import chat, prompts
    from rmjax.text.candidates import decoded_tokens, token_round_trips

    tokenizer = config_and_tokenizer(args.model)[1]
    texts = list(decoded_tokens(tokenizer, len(tokenizer)))[: args.tokens]
    ids = np.arange(len(texts))
    conversations = chat.Conversations(tokenizer, prompts.PAPER1[args.prompt], "auto")
    if conversations.split.template != "chat":
        raise SystemExit("read_back: the plain template tokenizes each response alone after the prompt's tokens (no "
                         "rendering): nothing to compare; give a model with a chat template.")

    def plain_way() -> np.ndarray:
        got = tokenizer([conversations.conversation(r) for r in texts], add_special_tokens=False).input_ids
        return np.fromiter((g == conversations.split.ids_with([int(i)]) for g, i in zip(got, ids, strict=True)),
                           bool, len(ids))

    seconds, masks = {"plain": float("inf"), "fast": float("inf")}, {}
    for _ in range(3):  # alternated, best of three each: neither way pays the cold tokenizer alone
        for name, way in (("plain", plain_way), ("fast", lambda: token_round_trips(conversations, ids, texts))):
            t = time.perf_counter()
            masks[name] = way()
            seconds[name] = min(seconds[name], time.perf_counter() - t)
    (plain, plain_s), (fast, fast_s) = ((masks[n], seconds[n]) for n in ("plain", "fast"))
    print(f"{args.model} ({conversations.split.template} template), {len(texts):,} strings: plain "
          f"{len(texts) / plain_s:,.0f}/s, rmjax {len(texts) / fast_s:,.0f}/s, ratio {plain_s / fast_s:.2f}x; "
          f"masks agree: {bool((plain == fast).all())} ({int(fast.sum()):,} read back)")


if __name__ == "__main__":
    main()
