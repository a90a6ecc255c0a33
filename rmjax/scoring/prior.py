"""How natural a response is: its tokens' log-probabilities under a language model, given the prompt's chat context
(issue 25's fluency term). The LM is any model with an LM head or tied embeddings — a reward model whose
backbone ties them (both default RMs) is its own prior.

The prompt's prefix is run once (`prefix.prefill_prefix`); each batch of responses then runs only its own tokens
after that cache, and token j's log-probability is read from the prediction at position j - 1 (token 0's from the
prefix's last position).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from rmjax import nn
from rmjax.compiled import PARAMS, REPLICATED, ROWS, Cache, Compiled, compiled, declared_params
from rmjax.config import ModelConfig
from rmjax.errors import UsageError
from rmjax.model import Model
from rmjax.parallel import batching
from rmjax.parallel.distributed import replicated, to_host
from rmjax.scoring import calls


def require_lm_head(model: Model) -> None:
    """A prior needs next-token logits: a causal LM, or a reward model whose backbone ties its embeddings (its LM
    head is the embedding table). A reward model with an untied LM head dropped has none: refused, never
    replaced by the input embeddings."""
    cfg = model.config
    if cfg.is_reward_model and not cfg.tie_embeddings:
        raise UsageError(f"{model.source} is a reward model whose backbone has its own LM head (untied embeddings), "
                         "which the reward model does not keep: give a causal LM with the same tokenizer as the "
                         "prior (--lm).")


def first_token_log_probs(model: Model, prefix: list[int]) -> jax.Array:
    """Log-probabilities of every token as the response's first, after the prompt's prefix: [V] float32."""
    require_lm_head(model)
    ids, mask = batching.pad_rows([prefix], side="left")
    return calls.next_token_log_probs(model, ids, mask)[0]


def _response_log_probs(cfg: ModelConfig, params, cache: nn.KVCache, responses, first) -> jax.Array:
    model = nn.module(params, cfg)
    hidden = model(ids=responses, cache=cache).hidden  # [B, N, H], final-normed
    later = jax.nn.log_softmax(model.lm_logits(hidden[:, :-1]).astype(jnp.float32), axis=-1)
    picked = jnp.take_along_axis(later, responses[:, 1:, None], axis=-1)[..., 0]
    return jnp.concatenate([first[responses[:, :1]], picked], axis=1)


def prior_call(cfg: ModelConfig, mesh, cache_width: int) -> Compiled:
    """The compiled prior: (params, prefix cache [1, cache_width], responses [B, N], first-token log-probs [V]) ->
    each response token's log-probability [B, N], the rows over `data`."""
    return compiled(_response_log_probs, cfg, mesh, (PARAMS, Cache(1, cache_width), ROWS(2), REPLICATED), ROWS(2))


def response_log_probs(model: Model, cache: nn.KVCache, first: jax.Array, responses: np.ndarray,
                       batch_size: int = 64) -> np.ndarray:
    """Each token's log-probability of equal-length responses [W, N] after the prefix `cache` (whose next-token
    log-probabilities are `first`): [W, N] float32. Batches are padded to one shape and all dispatched before
    any result is copied to the host."""
    require_lm_head(model)
    responses = np.asarray(responses, np.int32)
    batch_size = batching.round_up(batch_size, model.mesh)
    call = prior_call(model.config, model.mesh, cache.k.shape[2])
    params, first = declared_params(model), replicated(first, model.mesh)
    pending = []
    for start in range(0, len(responses), batch_size):
        part = responses[start : start + batch_size]
        padded, _ = batching.pad_rows(part, responses.shape[1], num_rows=batch_size)
        pending.append((len(part), call(params, cache, batching.place(padded, model.mesh), first)))
    if not pending:
        return np.zeros((0, responses.shape[1]), np.float32)
    return np.concatenate([to_host(lp)[:n] for n, lp in pending]).astype(np.float32)
