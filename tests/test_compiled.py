"""rmjax.compiled's guard against the kernel's memory-map limit, at which XLA:CPU segfaults in its next compile."""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np

from rmjax import compiled


def _maps() -> int:
    with open("/proc/self/maps", "rb") as maps:
        return maps.read().count(b"\n")


def test_release_frees_the_compiled_code_and_the_calls_compile_again():
    if not sys.platform.startswith("linux"):
        assert compiled.release_near_map_limit(fraction=0.0) is False  # documented: a no-op without /proc
        return
    calls = [jax.jit(lambda x, k=k: jnp.tanh(x.T @ x).sum(0) * k + jnp.cumsum(x, 0)[-1]) for k in range(24)]
    x = jnp.arange(40, dtype=jnp.float32).reshape(5, 8) / 40
    before = _maps()
    want = [np.asarray(f(x)) for f in calls]
    held = _maps() - before
    assert held > 24  # each executable maps its code: what the release is for
    assert compiled.release_near_map_limit(fraction=1.0) is False  # far from the limit: nothing dropped
    assert _maps() - before > held // 2
    assert compiled.release_near_map_limit(fraction=0.0) is True
    assert _maps() - before < held // 2
    for f, expected in zip(calls, want, strict=True):
        np.testing.assert_array_equal(np.asarray(f(x)), expected)


def _products(text: str) -> list[str]:
    import re

    return re.findall(r"stablehlo\.dot_general[^\n]*", text)


def _vocabulary_products(text: str, vocab: int) -> list[str]:
    return [p for p in _products(text) if f"x{vocab}xf32>" in p.rsplit("->", 1)[-1]]


def _programs(rm_folder, lm_folder, dtype: str) -> tuple[dict[str, str], int]:
    """The StableHLO a job runs for a reward model's rewards and GCG gradient and an LM's log-probs, the weights in
    `dtype` (a compiled call serves every dtype, so each is lowered here for these weights)."""
    from rmjax.loading import load
    from rmjax.scoring import calls
    from rmjax.search import gcg

    rm, lm = load(str(rm_folder), dtype=dtype), load(str(lm_folder), dtype=dtype)
    ids, mask = np.full((2, 5), 7, np.int32), np.ones((2, 5), bool)
    target = gcg.make_target(rm, "Name a colour.")
    gradient = gcg.gradient_call(rm.config, rm.mesh, target.cache.k.shape[2], rm.output_column)
    texts = {"_rewards": calls.rewards_call(rm.config, rm.mesh, len(ids)).lower(rm.params, ids, mask),
             "_next_token_log_probs": calls.log_probs_call(lm.config, lm.mesh).lower(lm.params, ids, mask),
             "_grad_one_hot": gradient.lower(rm.params, target.cache, ids[0], target.suffix_ids)}
    return {name: lowered.as_text() for name, lowered in texts.items()}, rm.config.vocab_size


def test_every_product_of_a_float32_model_runs_at_float32(rm_folder, lm_folder):
    """At JAX's default precision a float32 product rounds its inputs to TF32 on a GPU and to one bfloat16 pass on a
    TPU (BUILD_NOTES -> On a GPU: a 1B Llama's rewards 300x further from float64 than transformers' float32); this
    CPU computes both alike, so the test reads the programs: forward, LM head and GCG's backward pass."""
    texts, _ = _programs(rm_folder, lm_folder, "float32")
    for name, text in texts.items():
        products = _products(text)
        assert len(products) >= 7, name  # at least q, k, v, o, gate, up and down
        assert all("precision = [HIGHEST, HIGHEST]" in p for p in products), (name, products)


def test_gcgs_embedding_distances_run_at_float32():
    """Swap scores' |e|^2 + |c|^2 - 2 e.c cancels between near tokens; it is a plain jit outside rmjax.compiled,
    so its product names its precision itself."""
    from rmjax.search.gcg_swaps import swap_scores

    embed = np.ones((64, 16), np.float32)
    text = swap_scores.lower(np.zeros((3, 64), np.float32), np.zeros(64, bool), np.arange(3), embed, 0.5).as_text()
    products = _products(text)
    assert products and all("precision = [HIGHEST, HIGHEST]" in p for p in products), products


def test_a_bfloat16_weight_cast_to_float32_keeps_the_backends_default(rm_folder, lm_folder):
    """The LM head's float32 logits and GCG's one-hot gradient read a [vocab, hidden] bf16 table as float32: at
    "highest" that product would cost six bf16 passes on a TPU (full FP32 on a GPU) for no precision the bf16
    weights hold; the score head's float32 weights stay at "highest"."""
    texts, vocab = _programs(rm_folder, lm_folder, "bfloat16")
    assert all("xbf16>" in text for text in texts.values())
    for name in ("_next_token_log_probs", "_grad_one_hot"):
        products = _vocabulary_products(texts[name], vocab)
        assert products and all("precision = [DEFAULT, DEFAULT]" in p for p in products), (name, products)
    score = [p for p in _products(texts["_rewards"]) if "x1xf32>" in p.rsplit("->", 1)[-1]]
    assert score and all("precision = [HIGHEST, HIGHEST]" in p for p in score), score
