"""The plain forwards a job runs on token rows of a loaded model, each a compiled call (rmjax.compiled): rewards and
final hidden states of whole conversations or after a cached prefix, next-token log-probs, and the staged trace
the non-finite diagnosis reads. Rows are over `data` when the mesh divides them, else whole on every device.
"""

from __future__ import annotations

import jax
import numpy as np

from rmjax import nn
from rmjax.compiled import PARAMS, REPLICATED, Cache, Compiled, compiled, declared_params, rows_of
from rmjax.config import ModelConfig
from rmjax.model import Model


def rewards(model: Model, ids, mask) -> jax.Array:
    """All head outputs at each row's last real token: [B, num_outputs] float32."""
    return rewards_call(model.config, model.mesh, np.shape(ids)[0])(declared_params(model), ids, mask)


def rewards_call(cfg: ModelConfig, mesh, rows: int) -> Compiled:
    """The compiled scorer of whole conversations: (params, ids [rows, T], mask) -> head outputs, the rows over
    `data` when the mesh divides them."""
    spec = rows_of(rows, 2, mesh)
    return compiled(_rewards, cfg, mesh, (PARAMS, spec, spec), spec)


def rewards_after(model: Model, cache: nn.KVCache, ids, mask) -> jax.Array:
    """Head outputs for the batch-1 `cache` prefix + `ids`, at each row's last real new token."""
    call = rewards_after_call(model.config, model.mesh, cache.k.shape[2], np.shape(ids)[0])
    return call(declared_params(model), cache, ids, mask)


def rewards_after_call(cfg: ModelConfig, mesh, cache_width: int, rows: int) -> Compiled:
    """The compiled text scorer: (params, prefix cache [1, cache_width], ids [rows, T], mask) -> head outputs,
    the rows over `data` when the mesh divides them."""
    spec = rows_of(rows, 2, mesh)
    return compiled(_rewards_after, cfg, mesh, (PARAMS, Cache(1, cache_width), spec, spec), spec)


def last_hidden(model: Model, ids, mask) -> jax.Array:
    """Final-normed hidden state at each row's last real token: [B, H]."""
    return last_hidden_call(model.config, model.mesh, np.shape(ids)[0])(declared_params(model), ids, mask)


def last_hidden_call(cfg: ModelConfig, mesh, rows: int) -> Compiled:
    """The compiled final hidden states of whole conversations: (params, ids [rows, T], mask) -> [rows, H], the
    rows over `data` when the mesh divides them."""
    spec = rows_of(rows, 2, mesh)
    return compiled(_last_hidden, cfg, mesh, (PARAMS, spec, spec), spec)


def last_hidden_after(model: Model, cache: nn.KVCache, ids, mask) -> jax.Array:
    """`last_hidden` after the batch-1 `cache` prefix."""
    call = last_hidden_after_call(model.config, model.mesh, cache.k.shape[2], np.shape(ids)[0])
    return call(declared_params(model), cache, ids, mask)


def last_hidden_after_call(cfg: ModelConfig, mesh, cache_width: int, rows: int) -> Compiled:
    """The compiled feature pass of head-only training: (params, prefix cache [1, cache_width], ids [rows, T], mask)
    -> final hidden states, the rows over `data` when the mesh divides them."""
    spec = rows_of(rows, 2, mesh)
    return compiled(_last_hidden_after, cfg, mesh, (PARAMS, Cache(1, cache_width), spec, spec), spec)


def next_token_log_probs(model: Model, ids, mask) -> jax.Array:
    """Log-probs of the token after each row's last real token: [B, vocab] float32."""
    return log_probs_call(model.config, model.mesh)(declared_params(model), ids, mask)


def log_probs_call(cfg: ModelConfig, mesh) -> Compiled:
    """The compiled next-token log-probs of left-padded prompt rows (ids, mask) -> [B, vocab] float32."""
    return compiled(_next_token_log_probs, cfg, mesh, (PARAMS, REPLICATED, REPLICATED), REPLICATED)


def trace(model: Model, ids, mask) -> dict[str, jax.Array]:
    """Every stage of one forward (Transformer.trace): embeddings, residual after each layer, hidden, head."""
    return compiled(_trace, model.config, model.mesh, (PARAMS, REPLICATED, REPLICATED),
                    REPLICATED)(declared_params(model), ids, mask)


def _rewards(cfg: ModelConfig, params, ids, mask) -> jax.Array:
    return nn.module(params, cfg).rewards(ids, mask)


def _rewards_after(cfg: ModelConfig, params, cache: nn.KVCache, ids, mask) -> jax.Array:
    return nn.module(params, cfg).rewards_after(cache, ids, mask)


def _last_hidden(cfg: ModelConfig, params, ids, mask) -> jax.Array:
    m = nn.module(params, cfg)
    return m.read(m(ids=ids, mask=mask).hidden, mask, ids)


def _last_hidden_after(cfg: ModelConfig, params, cache: nn.KVCache, ids, mask) -> jax.Array:
    return nn.module(params, cfg).last_hidden_after(cache, ids, mask)


def _next_token_log_probs(cfg: ModelConfig, params, ids, mask) -> jax.Array:
    m = nn.module(params, cfg)
    return jax.nn.log_softmax(m.lm_logits(nn.at_last(m(ids=ids, mask=mask).hidden, mask)), axis=-1)


def _trace(cfg: ModelConfig, params, ids, mask) -> dict[str, jax.Array]:
    return nn.module(params, cfg).trace(ids, mask)
