"""The README's Flax NNX examples run as written (on the builtin default reward model)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

README = Path(__file__).resolve().parents[1] / "README.md"


def _nnx_blocks() -> list[str]:
    section = README.read_text().split("### The model is a Flax NNX module", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_readme_nnx_examples_run():
    import jax.numpy as jnp

    from rmjax import model as M

    blocks = _nnx_blocks()
    assert len(blocks) == 2
    ids = jnp.asarray([[1, 504, 3180, 2], [1, 2, 3, 4]], jnp.int32)
    mask = jnp.ones(ids.shape, bool)
    scope = {"ids": ids, "mask": mask}
    exec(blocks[0], scope)  # noqa: S102 - the README's own code
    rm, out, rewards = scope["rm"], scope["out"], scope["rewards"]
    assert out.residuals.shape == (rm.config.num_layers, 2, 4, rm.config.hidden_size)
    np.testing.assert_allclose(np.asarray(rewards), np.asarray(M.rewards(rm.params, rm.config, ids, mask)),
                               rtol=1e-5, atol=1e-5)
    assert scope["state"]["score"]["kernel"].get_metadata()["axes"] == ("embed", "labels")
    exec(blocks[1], scope)  # noqa: S102
    head, opt, step = scope["head"], scope["opt"], scope["step"]
    rng = np.random.default_rng(0)
    chosen = jnp.asarray(rng.normal(size=(8, rm.config.hidden_size)), jnp.float32)
    rejected = jnp.asarray(rng.normal(size=(8, rm.config.hidden_size)), jnp.float32)
    first = float(step(head, opt, chosen, rejected))
    for _ in range(20):
        last = float(step(head, opt, chosen, rejected))
    assert last < first  # the nnx optimizer trains the head
    before = np.asarray(rm.module.score.kernel[...])
    assert not np.allclose(np.asarray(head.kernel[...]), before)  # and never the loaded model's weights
