"""The prior's sampler: compile and call time of rmjax's (a loop over a cache with free slots) against the same
draws unrolled in Python (each step a forward of its own, the cache grown by concatenation: rmjax's sampler up to
d447578), at several lengths, in one run. Both draw the same tokens (the share printed); the unrolled program
grows with the length, the loop's does not. Model: SmolLM2-135M-Instruct (builtin), 64 rows, half the vocabulary
banned, whole turns (the end of turn drawn from the third token on).

python bench/sampler_compile.py [--lengths=4,8,16] [--rows=64]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def unrolled_sample(cfg, params, cache, first, banned, temperature, key, *, rows, length, end=None, end_from=1):
    """The reference: rmjax.scoring.prior._sample's draws, one traced forward per step."""
    import jax
    import jax.numpy as jnp

    from rmjax import nn
    from rmjax.nn import ops

    model = nn.module(params, cfg)
    ids, lps, logp = [], [], jnp.broadcast_to(first, (rows, first.shape[0]))
    for step, step_key in enumerate(jax.random.split(key, length)):
        logits = jnp.where(banned[None], -jnp.inf, logp / temperature)
        if end is not None and step >= end_from:
            logits = logits.at[:, end].set(logp[:, end] / temperature)
        token = ops.sample_categorical(step_key, logits).astype(jnp.int32)
        ids.append(token)
        lps.append(jnp.take_along_axis(logp, token[:, None], axis=-1)[:, 0])
        if step + 1 < length or end is not None:
            out = model(ids=token[:, None], cache=cache)
            cache = cache.append(out.kv)
            logp = jax.nn.log_softmax(model.lm_logits(out.hidden[:, -1]).astype(jnp.float32), axis=-1)
    if end is not None:
        lps.append(logp[:, end])
    return jnp.stack(ids, axis=1), jnp.stack(lps, axis=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="4,8,16")
    parser.add_argument("--rows", type=int, default=64)
    args = parser.parse_args()

    import jax

    jax.config.update("jax_enable_compilation_cache", False)  # every first call compiles
    from rmjax.compiled import PARAMS, REPLICATED, Cache, compiled, declared_params
    from rmjax.loading import load
    from rmjax.scoring import prior as prior_lib
    from rmjax.search.terms import Prior
    from rmjax.text import chat

    lm = load("smollm2-135m-instruct")
    prior = Prior.of(lm, list(chat.split_chat(lm.tokenizer, "What is the greatest thing?").prefix))
    end = lm.tokenizer.convert_tokens_to_ids("<|im_end|>")
    banned = np.zeros(lm.config.vocab_size, bool)
    banned[: lm.config.vocab_size // 2] = True  # both draw through a ban: half the tokens, the end of turn among
    banned[end] = True  # them (allowed from step end_from = 2 on)
    call_args = (declared_params(lm), prior.cache, prior.first, banned, np.float32(1.0))
    spec = (PARAMS, Cache(1, prior.cache.k.shape[2]), REPLICATED, REPLICATED, REPLICATED, None)
    print(f"{'length':>6} {'sampler':>9} {'first call s':>12} {'again s':>8} {'compile s':>9}")
    for length in map(int, args.lengths.split(",")):
        got = {}
        for name in ("unrolled", "loop"):
            jax.clear_caches()
            if name == "unrolled":
                call = compiled(unrolled_sample, lm.config, lm.mesh, spec, (REPLICATED, REPLICATED),
                                rows=args.rows, length=length, end=end, end_from=2)
                extra = ()
            else:  # the prefix's end, the length and end_from are arguments of rmjax's
                call = prior_lib.sample_call(lm.config, lm.mesh, prior.cache.k.shape[2], args.rows, length, end)
                extra = tuple(np.int32([prior.cache.k.shape[2], length, 2]))
            times = []
            for seed in (0, 1):
                start = time.perf_counter()
                ids, lps = call(*call_args, jax.random.key(seed), *extra)
                ids, lps = np.asarray(ids), np.asarray(lps)
                times.append(time.perf_counter() - start)
            got[name] = ids, lps
            print(f"{length:6d} {name:>9} {times[0]:12.2f} {times[1]:8.2f} {times[0] - times[1]:9.2f}", flush=True)
        (ids_u, lps_u), (ids_s, lps_s) = got["unrolled"], got["loop"]
        print(f"{length:6d} same tokens drawn: {(ids_u == ids_s).mean():.1%}; log-probabilities apart by at most "
              f"{np.abs(lps_u - lps_s).max():.1e}")


if __name__ == "__main__":
    main()
