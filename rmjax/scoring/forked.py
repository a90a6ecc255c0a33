"""Two reward models that share their lower layers, scored with one pass through them.

An RM fine-tuned from another with its first layers frozen (`train_rm --last_k`, the planted-bias bench's
PLANTED and CLEAN) computes the same hidden states as the other up to its first trained layer: the forked forward
runs those layers once and each model's own upper layers, final norm and head on the result. Mapping the
vocabulary under both (issue 46's map) then costs (L + 2K) / 2L of two separate sweeps: 53% for SmolLM2's 30
layers with K = 2. The shared layers are found by comparing the weights, never assumed; each model's prefix cache
is its own (equal to the other's below the fork, so the lower layers read model A's).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from rmjax import nn
from rmjax.compiled import PARAMS, REPLICATED, ROWS, Cache, Compiled, compiled, declared_params
from rmjax.config import ModelConfig
from rmjax.model import Model
from rmjax.parallel import batching
from rmjax.parallel.distributed import to_host
from rmjax.runs.progress import Progress
from rmjax.scoring.context import PromptContext


@jax.jit
def _equal_layers(x: jax.Array, y: jax.Array) -> jax.Array:
    """Per leading index (a layer of a stacked weight): whether x and y hold the same values, bit for bit."""
    return jnp.all((x == y).reshape(x.shape[0], -1), axis=1)


def shared_layers(a: Model, b: Model) -> int:
    """How many leading decoder layers `a` and `b` hold with identical weights (and identical embeddings, config,
    dtype and mesh), at most all but one: 0 when they share nothing a forked forward can use. Compared on the
    devices, so a sharded model is never gathered."""
    cfg = a.config
    if cfg != b.config or a.dtype != b.dtype or a.mesh != b.mesh or cfg.num_layers < 2:
        return 0
    wa, wb = nn.flat(a.params), nn.flat(b.params)
    if any(not bool(jnp.all(_equal_layers(wa[p][None], wb[p][None]))) for p in wa if p.startswith("embed.")):
        return 0
    same = np.ones(cfg.num_layers, bool)
    for path in (p for p in wa if p.startswith("layers.")):
        same &= to_host(_equal_layers(wa[path], wb[path]))
    differs = np.flatnonzero(~same)
    return int(min(differs[0] if len(differs) else cfg.num_layers, cfg.num_layers - 1))


def forked_token_rewards(a: Model, b: Model, ctx_a: PromptContext, ctx_b: PromptContext, tokens: np.ndarray,
                         shared: int, batch_size: int = 256, progress: Progress | None = None,
                         chunk: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """Each model's reward of every token of `tokens` as a one-token response after its prompt context: what
    score_tokens gives for each, with the first `shared` layers (shared_layers) run once. The contexts must be
    the same prompt in the same tokens. `progress` counts both models' tokens, `chunk` tokens at a time."""
    if not 0 < shared < a.config.num_layers or shared > shared_layers(a, b):
        raise ValueError(f"the two models do not share their first {shared} layers.")
    if ctx_a.split.prefix != ctx_b.split.prefix or ctx_a.split.suffix != ctx_b.split.suffix:
        raise ValueError("a forked forward needs the same prompt in the same tokens for both models.")
    responses = np.asarray(tokens, np.int32)[:, None]
    batch_size = min(batching.round_up(batch_size, a.mesh),
                     batching.rows_for(len(responses), batching.data_shards(a.mesh)))
    scorer = forked_scorer(a.config, a.mesh, ctx_a.cache.k.shape[2], shared, a.output_column, b.output_column)
    params_a, params_b = declared_params(a), declared_params(b)
    parts = []
    for start in range(0, len(responses), chunk):
        parts.append(batching.in_batches(
            lambda rows: scorer(params_a, params_b, ctx_a.cache, ctx_b.cache, rows, ctx_a.suffix),
            responses[start : start + chunk], batch_size, a.mesh, outputs=2))
        if progress is not None:
            progress.update(2 * len(parts[-1][0]))
    if not parts:
        return np.zeros(0, np.float32), np.zeros(0, np.float32)
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def forked_scorer(cfg: ModelConfig, mesh, cache_width: int, shared: int, column_a: int, column_b: int) -> Compiled:
    """The compiled forked sweep step: (params A, params B, A's and B's prefix caches [1, cache_width],
    responses [R, N], suffix [S]) -> (A's rewards [R], B's rewards [R])."""
    return compiled(_forked_rewards, cfg, mesh, (PARAMS, PARAMS, Cache(1, cache_width), Cache(1, cache_width),
                                                 ROWS(2), REPLICATED), (ROWS(1), ROWS(1)),
                    shared=shared, columns=(column_a, column_b))


def _forked_rewards(cfg: ModelConfig, params_a, params_b, cache_a: nn.KVCache, cache_b: nn.KVCache, responses,
                    suffix, *, shared: int, columns: tuple[int, int]):
    a, b = nn.module(params_a, cfg), nn.module(params_b, cfg)
    ids = jnp.concatenate([responses, jnp.broadcast_to(suffix, (responses.shape[0], suffix.shape[0]))], axis=1)
    x, mask, _, inputs = a.enter(ids=ids, cache=cache_a)
    x = a.layers(x, inputs, cache_a.k[:shared], cache_a.v[:shared], span=(0, shared))[0]
    rewards = []
    for model, cache, column in ((a, cache_a, columns[0]), (b, cache_b, columns[1])):
        hidden = model.final_norm(model.layers(x, inputs, cache.k[shared:], cache.v[shared:],
                                               span=(shared, cfg.num_layers))[0])
        rewards.append(model.reward_head(model.read(hidden, mask, ids, cache), cache.gate_input)[:, column])
    return tuple(rewards)
