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


def test_every_product_of_a_model_call_runs_at_its_operands_precision(rm_folder):
    """At JAX's default precision a float32 product rounds its inputs to TF32 on a GPU and to one bfloat16 pass on a
    TPU (BUILD_NOTES -> GPU: a 1B Llama's rewards 300x further from float64 than transformers' float32); this CPU
    computes both the same way, so the test reads the programs: the forward and GCG's backward pass."""
    import re

    from rmjax.loading import load
    from rmjax.scoring import calls
    from rmjax.search import gcg

    model = load(str(rm_folder))
    ids = np.full((2, 5), 7, np.int32)
    calls.rewards(model, ids, np.ones_like(ids, bool))
    gcg.reward_gradient(gcg.make_target(model, "Name a colour."), ids[0])
    for name in ("_rewards", "_grad_one_hot"):
        for call in compiled.made(name):
            products = re.findall(r"stablehlo\.dot_general[^\n]*", call.lower(*call.example[0]).as_text())
            assert len(products) >= 7, name  # at least q, k, v, o, gate, up and down
            assert all("precision = [HIGHEST, HIGHEST]" in p for p in products), (name, products)
