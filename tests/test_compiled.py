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
