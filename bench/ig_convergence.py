"""Integrated gradients on the default RMs at default settings: relative completeness gap, gradient evaluations
and seconds per response. Prompt 'greatest'; 'love', 'war' and each model's best and worst token of its
whole-vocabulary sweep, as token ids (Gemma's plain template puts a space before a text response, so text would
give other tokens).

python bench/ig_convergence.py [--models=elo-rm-smollm2-135m,elo-rm-gemma3-270m] [--responses=love,war]
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rmjax.inspect.attribution import attribute  # noqa: E402
from rmjax.inspect.job import items_from_ids, items_from_texts  # noqa: E402
from rmjax.loading import load  # noqa: E402

PROMPT = "What, in one word, is the greatest thing ever?"
# Each model's best and worst single token of its full-vocabulary sweep for 'greatest' (BUILD_NOTES, Inspect).
EXTREMES = {"elo-rm-smollm2-135m": ["connections", "══"], "elo-rm-gemma3-270m": ["原始内容存档", "সন্"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(EXTREMES))
    ap.add_argument("--responses", default=None, help="default: love, war and the model's two extremes")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--max_evaluations", type=int, default=None)
    args = ap.parse_args()
    for name in args.models.split(","):
        model = load(name)
        tok = model.tokenizer
        texts = args.responses.split(",") if args.responses is not None else ["love", "war"]
        extremes = [] if args.responses is not None else EXTREMES[name]
        tokens = [tok.encode(e, add_special_tokens=False) for e in extremes]
        assert all(len(t) == 1 for t in tokens), tokens  # the sweep's single tokens, placed as a sweep places them
        items = items_from_texts(model, PROMPT, texts) + items_from_ids(model, PROMPT, [tuple(t) for t in tokens])
        kw = {} if args.max_evaluations is None else {"max_evaluations": args.max_evaluations}
        attribute(model, list(items[0].ids), steps=2, max_evaluations=3)  # compiles
        for item in items:
            start = time.perf_counter()
            history = []
            a = attribute(model, list(item.ids), steps=args.steps, history=history, **kw)
            seconds = time.perf_counter() - start
            print(f"{name} {item.label!r} ({len(item.ids)} tokens): reward {a.reward:+.4f}, baseline "
                  f"{a.baseline_reward:+.4f}, IG sum {a.integrated_gradients.sum():+.4f}, relative gap "
                  f"{100 * a.relative_gap:.2f}%, {a.evaluations} gradient evaluations, {seconds:.1f} s", flush=True)
            print("  nodes, relative gap, refinable error: " + "; ".join(
                f"{n} {100 * g:.1f}% {100 * r:.1f}%" for n, g, r in history), flush=True)


if __name__ == "__main__":
    main()
