"""A decoding loop's cost against its row count: the prior's sampler (SmolLM2-135M-Instruct, builtin; 8 tokens after
a chat prompt), compiled first, each row count's median call time over 7 seeds, in one run. Why
batching.decode_rows pads a decoding loop's rows to at least 8: the cost of the padding rows against a program
compiled for every row count a search meets.

python bench/decode_rows.py [--rows=1,8,64] [--tokens=8]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,8,64")
    parser.add_argument("--tokens", type=int, default=8)
    args = parser.parse_args()

    import jax

    jax.config.update("jax_enable_compilation_cache", False)  # every first call compiles
    from rmjax.compiled import declared_params
    from rmjax.loading import load
    from rmjax.scoring import prior as prior_lib
    from rmjax.search.terms import Prior
    from rmjax.text import chat

    lm = load("smollm2-135m-instruct")
    prior = Prior.of(lm, list(chat.split_chat(lm.tokenizer, "What is the greatest thing?").prefix))
    width, n = prior.cache.k.shape[2], args.tokens
    call_args = (declared_params(lm), prior.cache, prior.first, np.zeros(lm.config.vocab_size, bool),
                 np.float32(1.0))
    base = None
    for rows in map(int, args.rows.split(",")):
        call = prior_lib.sample_call(lm.config, lm.mesh, width, rows, n, None, n - 1)
        scalars = tuple(np.int32([width, n, 1]))
        start = time.perf_counter()
        jax.block_until_ready(call(*call_args, jax.random.key(0), *scalars))
        first = time.perf_counter() - start
        times = []
        for seed in range(1, 8):
            start = time.perf_counter()
            jax.block_until_ready(call(*call_args, jax.random.key(seed), *scalars))
            times.append(time.perf_counter() - start)
        median = float(np.median(times))
        base = base or median
        print(f"rows {rows:3d}: call {median * 1000:6.0f} ms (x{median / base:.2f} the first row count's), "
              f"first call with its compile {first:.2f} s", flush=True)


if __name__ == "__main__":
    main()
