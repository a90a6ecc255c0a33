"""Training the last K layers with each prompt's frozen part computed once.

With `--trainable=last_k` the lower layers are frozen, so a prompt's template prefix (system turn, prompt,
assistant header) has the same keys, values and hidden states below the trained layers at every step and in every
pair. The sequence objective ran that prefix through every layer for every conversation of every batch; here it
goes through the frozen layers once, before training, and each step runs the frozen layers on the responses' own
tokens only (attending to their prompt's cached keys and values) and the trained layers on each prompt's prefix
once plus the responses. The loss and its gradient are the sequence objective's, up to float rounding: a prefix
cache's forward is the full forward (tests/test_prefixed_training.py holds them to the float32 bound).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rmjax import nn
from rmjax.compiled import PARAMS, REPLICATED, compiled, declared_params
from rmjax.config import ModelConfig
from rmjax.model import Model
from rmjax.parallel import batching
from rmjax.text.chat import Conversations
from rmjax.train.data import Pairs


@dataclasses.dataclass(frozen=True)
class PrefixedPairs:
    """Pairs as each prompt's template prefix (shared by its conversations) and each side's tokens after it."""

    responses: np.ndarray  # [2, P, T] int32: side 0 chosen, side 1 rejected, right-padded
    mask: np.ndarray  # [2, P, T] bool
    prompt_of: np.ndarray  # [P] int32: the row of `prefixes` each pair's prompt is
    prefixes: np.ndarray  # [prompts, W] int32, right-padded
    prefix_mask: np.ndarray  # [prompts, W] bool


def pays(prompts: int, batch_size: int) -> bool:
    """Whether a run over `prompts` distinct prompts, `batch_size` pairs a step, trains on prefixes: every step runs
    the trained layers over every prompt's prefix, and the data holds every prefix's frozen K/V. With no more prompts
    than a batch has pairs, a step does less work than on whole sequences and the K/V are at most a batch's; a pairs
    file with a prompt per pair (most preference data) trains on whole sequences."""
    return prompts <= batch_size


def prefixed_pairs(model: Model, pairs: Pairs, template: str, batch_size: int) -> PrefixedPairs | None:
    """`pairs` split at each prompt's template prefix; None where that does not `pay`, where a conversation does not
    start with its prompt's prefix (a merge across the template's edge) or has no token after it, or where the head
    reads the prompt (a prompt-gated head's input is the prefix's final hidden state, which the trained layers
    change): those train on whole sequences."""
    head = model.config.head
    if (head is not None and head.pattern) or not pays(len(set(pairs.prompt)), batch_size):
        return None
    conversations = {q: Conversations(model.tokenizer, q, template, False, model.config.max_position_embeddings)
                     for q in dict.fromkeys(pairs.prompt)}
    order = {q: i for i, q in enumerate(conversations)}
    sides = []
    for texts in (pairs.chosen, pairs.rejected):
        rows = []
        for q, text in zip(pairs.prompt, texts, strict=True):
            prefix = conversations[q].prefix
            ids = conversations[q].token_ids([text])[0]
            if len(ids) <= len(prefix) or ids[: len(prefix)] != prefix:
                return None
            rows.append(ids[len(prefix):])
        sides.append(rows)
    width = max(len(r) for side in sides for r in side)
    padded = [batching.pad_rows(side, width) for side in sides]
    prefixes, prefix_mask = batching.pad_rows([c.prefix for c in conversations.values()])
    return PrefixedPairs(np.stack([ids for ids, _ in padded]), np.stack([m for _, m in padded]),
                         np.asarray([order[q] for q in pairs.prompt], np.int32), prefixes, prefix_mask)


def frozen_prefix_data(model: Model, split: PrefixedPairs, shared: int) -> tuple:
    """The training step's data (`prefixed_pair_rewards`): the responses, each pair's prompt, and each prompt's
    prefix through the first `shared` layers: its keys and values there, its positions and validity, and its
    hidden state entering layer `shared`."""
    call = compiled(lower_prefix, model.config, model.mesh, (PARAMS, REPLICATED, REPLICATED), REPLICATED,
                    shared=shared)
    k, v, positions, valid, hidden = call(declared_params(model), jnp.asarray(split.prefixes),
                                          jnp.asarray(split.prefix_mask))
    return (jnp.asarray(split.responses), jnp.asarray(split.mask), jnp.asarray(split.prompt_of), k, v, positions,
            valid, hidden)


def lower_prefix(cfg: ModelConfig, params, ids, mask, *, shared: int) -> tuple:
    """Prefixes [prompts, W] through the first `shared` layers: (K, V, positions, validity, hidden state entering
    layer `shared`), the frozen part of `prefixed_pair_rewards`'s data."""
    module = nn.module(params, cfg)
    x, mask, positions, inputs = module.enter(ids=ids, mask=mask)
    x, k, v, _ = nn.SplitStack.of(module.layers, shared).lower(x, inputs)
    return k, v, positions, mask, x


def prefixed_pair_rewards(m: nnx.Module, data: tuple, idx: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Rewards of chosen and rejected for pairs `idx` (as `sequence_pair_rewards`), `m.layers` a SplitStack whose
    lower part is frozen: the trained layers run over each prompt's cached prefix state once, and over the
    responses after it; the frozen layers over the responses only."""
    responses, mask, prompt_of, k, v, positions, valid, hidden = data
    upper, lower = m.layers.upper, m.layers.lower
    _, uk, uv, _ = upper(hidden, m.attention_inputs(positions, valid, None))
    rows = prompt_of[idx]
    cache = nn.KVCache(k=k[:, rows], v=v[:, rows], positions=positions[rows], valid=valid[rows])

    def side(s: int) -> jax.Array:
        x, new_mask, _, inputs = m.enter(ids=responses[s][idx], mask=mask[s][idx], cache=cache)
        x = lower(x, inputs, cache.k, cache.v)[0]
        x = upper(x, inputs, uk[:, rows], uv[:, rows])[0]
        return m.reward_head(nn.at_last(m.final_norm(x), new_mask))[:, 0]

    return side(0), side(1)
