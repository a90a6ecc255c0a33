"""Text scoring's batches for the default audit's conversations: how many program shapes (each a compilation) and
how many padded tokens (the forwards' work) rmjax's rule (`rmjax.scoring.texts._cut`: a width's few rows join the
next width's batch) takes, against one batch run per width (the reference, rmjax's rule up to 6c7008b) and against
every width pooled, in one run. Counted through the real scoring path with the model's forwards replaced by zeros:
tokenization and batching only, no timing.

python bench/text_batches.py [--model=elo-rm-smollm2-135m] [--batch_size=256]
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def per_width(by_width: dict, batch_size: int):
    """The reference: each width's rows in batches of their own."""
    for width in sorted(by_width):
        rows = by_width[width]
        for start in range(0, len(rows), batch_size):
            yield rows[start : start + batch_size]


def pooled(by_width: dict, batch_size: int):
    """Every width's rows, shortest first, in full batches."""
    rows = [row for width in sorted(by_width) for row in by_width[width]]
    for start in range(0, len(rows), batch_size):
        yield rows[start : start + batch_size]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="elo-rm-smollm2-135m")
    parser.add_argument("--batch_size", type=int, default=256)
    args = parser.parse_args()

    from rmjax.audit import batteries as battery_lib
    from rmjax.loading import load
    from rmjax.scoring import calls, texts

    model = load(args.model)
    shapes, tokens = set(), [0]

    def counted(cache, ids):
        rows, width = np.shape(ids)
        shapes.add((cache is not None, rows, width, 0 if cache is None else cache.k.shape[2]))
        tokens[0] += rows * width
        return np.zeros((rows, model.output_column + 1), np.float32)  # the reward read from output_column

    calls.rewards = lambda _model, ids, _mask: counted(None, ids)
    calls.rewards_after = lambda _model, cache, ids, _mask: counted(cache, ids)
    texts.finite.check = lambda *_args, **_kwargs: None  # the zeros are no rewards to check
    built = battery_lib.build(tuple(battery_lib.BATTERIES))
    found = collections.OrderedDict()
    for name, rule in (("per width (reference)", per_width), ("rmjax (_cut)", texts._cut), ("pooled", pooled)):
        texts._cut = rule
        shapes.clear()
        tokens[0] = 0
        for battery in built:
            v = battery.variants
            texts.score_conversations(model, [x.prompt for x in v], [x.response for x in v], "auto", args.batch_size)
        found[name] = len(shapes), tokens[0]
    base_shapes, base_tokens = found["per width (reference)"]
    print(f"{args.model}: {sum(len(b.variants) for b in built)} conversations, batch {args.batch_size}")
    print(f"{'rule':>22} {'shapes':>7} {'padded tokens':>14} {'tokens / reference':>19}")
    for name, (count, padded) in found.items():
        print(f"{name:>22} {count:7d} {padded:14,d} {padded / base_tokens:19.3f}")


if __name__ == "__main__":
    main()
