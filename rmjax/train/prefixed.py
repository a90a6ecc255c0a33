"""Training the last K layers with each prompt's frozen part computed once (and every layer on each prompt's prefix
once a step).

With `--trainable=last_k` the lower layers are frozen, so a prompt's template prefix (system turn, prompt,
assistant header) has the same keys, values and hidden states below the trained layers at every step and in every
pair. The sequence objective ran that prefix through every layer for every conversation of every batch; here it
goes through the frozen layers once, before training, and each step runs the frozen layers on the responses' own
tokens only (attending to their prompt's cached keys and values) and the trained layers on each prompt's prefix
once plus the responses. The loss and its gradient are the sequence objective's, up to float rounding: a prefix
cache's forward is the full forward (tests/test_prefixed_training.py holds them to the float32 bound). A full
fine-tune does the same with no frozen layer: each step runs every layer over each prompt's prefix once, not in
every conversation.

The responses' states below the trained layers are as frozen as the prefixes': where the run would otherwise run
the frozen layers over more response rows than there are distinct responses (`states_pay`), each distinct response
goes through them once too, and a step runs only the trained layers (BUILD_NOTES: the planted bench's steps).
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
    start with its prompt's prefix (a merge across the template's edge) or has no token after it that the head reads
    (all the pad id: nn.read_index), or where the head reads the prompt (a prompt-gated head's input is the
    prefix's final hidden state, which the trained layers change): those train on whole sequences."""
    head = model.config.head
    if (head is not None and head.pattern) or not pays(len(set(pairs.prompt)), batch_size):
        return None
    conversations = {q: Conversations(model.tokenizer, q, template, False, model.config.max_position_embeddings)
                     for q in dict.fromkeys(pairs.prompt)}
    order = {q: i for i, q in enumerate(conversations)}
    sides, pad = [], nn.read_pad_id(model.config)
    for texts in (pairs.chosen, pairs.rejected):
        rows = []
        for q, text in zip(pairs.prompt, texts, strict=True):
            prefix = conversations[q].prefix
            ids = conversations[q].token_ids([text])[0]
            if len(ids) <= len(prefix) or ids[: len(prefix)] != prefix or all(t == pad for t in ids[len(prefix):]):
                return None
            rows.append(ids[len(prefix):])
        sides.append(rows)
    width = max(len(r) for side in sides for r in side)
    padded = [batching.pad_rows(side, width) for side in sides]
    prefixes, prefix_mask = batching.pad_rows([c.prefix for c in conversations.values()])
    return PrefixedPairs(np.stack([ids for ids, _ in padded]), np.stack([m for _, m in padded]),
                         np.asarray([order[q] for q in pairs.prompt], np.int32), prefixes, prefix_mask)


STATES_BYTES = 1 << 30  # the most the responses' frozen states may take (a copy on each device)
STATES_CHUNK = 256  # responses a call when computing them


def states_pay(responses: int, tokens: int, hidden: int, itemsize: int, steps: int, batch_size: int) -> bool:
    """Whether `responses` distinct responses of `tokens` tokens go through the frozen layers once, before
    training: when the steps would run those layers over more response rows (2 a pair) than that, and their
    states fit in STATES_BYTES."""
    return responses <= 2 * steps * batch_size and responses * tokens * hidden * itemsize <= STATES_BYTES


def frozen_prefix_data(model: Model, split: PrefixedPairs, shared: int, steps: int = 0, batch_size: int = 0
                       ) -> tuple:
    """The training step's data (`prefixed_pair_rewards`): the responses, each pair's prompt, and each prompt's
    prefix through the first `shared` layers: its keys and values there, its positions and validity, and its
    hidden state entering layer `shared`; last, where `states_pay` for a run of `steps` of `batch_size` pairs,
    the distinct responses' states entering layer `shared` and each side's row of them, else None."""
    call = compiled(lower_prefix, model.config, model.mesh, (PARAMS, REPLICATED, REPLICATED), REPLICATED,
                    shared=shared)
    params = declared_params(model)
    k, v, positions, valid, hidden = call(params, jnp.asarray(split.prefixes), jnp.asarray(split.prefix_mask))
    data = (jnp.asarray(split.responses), jnp.asarray(split.mask), jnp.asarray(split.prompt_of), k, v, positions,
            valid, hidden)
    tokens = split.responses.shape[2]
    keys = np.concatenate([np.broadcast_to(split.prompt_of[None, :, None], (2, len(split.prompt_of), 1)),
                           split.responses, split.mask], axis=-1).reshape(-1, 1 + 2 * tokens)
    distinct, index = np.unique(keys, axis=0, return_inverse=True)
    if not shared or not states_pay(len(distinct), tokens, model.config.hidden_size, hidden.dtype.itemsize, steps,
                                    batch_size):  # no frozen layer: a state would be the response's embedding
        return (*data, None)
    lower = compiled(lower_responses, model.config, model.mesh, (PARAMS, *[REPLICATED] * 7), REPLICATED,
                     shared=shared)
    chunk = min(STATES_CHUNK, len(distinct))
    states = []
    for start in range(0, len(distinct), chunk):
        rows = distinct[start:start + chunk]
        rows = np.concatenate([rows, np.repeat(rows[:1], chunk - len(rows), axis=0)])  # one shape, one compile
        states.append(lower(params, jnp.asarray(rows[:, 1:1 + tokens]), jnp.asarray(rows[:, 1 + tokens:], bool),
                            jnp.asarray(rows[:, 0]), k, v, positions, valid))
    states = jnp.concatenate(states)[: len(distinct)]
    return (*data, (states, jnp.asarray(index.reshape(2, -1), jnp.int32)))


def lower_prefix(cfg: ModelConfig, params, ids, mask, *, shared: int) -> tuple:
    """Prefixes [prompts, W] through the first `shared` layers: (K, V, positions, validity, hidden state entering
    layer `shared`), the frozen part of `prefixed_pair_rewards`'s data."""
    module = nn.module(params, cfg)
    x, mask, positions, inputs = module.enter(ids=ids, mask=mask)
    if not shared:  # every layer trains: the prefixes' embeddings, and a cache of no layer
        k = jnp.zeros((0, *x.shape[:2], cfg.num_kv_heads, cfg.head_dim), x.dtype)
        return k, k, positions, mask, x
    x, k, v, _ = module.layers(x, inputs, span=(0, shared))  # in place: a slice of the stack is a copy
    return k, v, positions, mask, x


def lower_responses(cfg: ModelConfig, params, ids, mask, prompt_of, k, v, positions, valid, *, shared: int
                    ) -> jax.Array:
    """Responses [R, T] after their prompts' cached prefixes (`lower_prefix`'s K/V) through the first `shared`
    layers: their hidden states entering layer `shared`."""
    module = nn.module(params, cfg)
    cache = nn.KVCache(k=k[:, prompt_of], v=v[:, prompt_of], positions=positions[prompt_of], valid=valid[prompt_of])
    x, _, _, inputs = module.enter(ids=ids, mask=mask, cache=cache)
    return module.layers(x, inputs, cache.k, cache.v, span=(0, shared))[0]


def prefixed_pair_rewards(m: nnx.Module, data: tuple, idx: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Rewards of chosen and rejected for pairs `idx` (as `sequence_pair_rewards`), `m.layers` a SplitStack whose
    lower part is frozen, or one stack that trains whole (`full`: the data's prefixes through no layer, their
    embeddings): the trained layers run over each prompt's cached prefix state once, and over the responses after
    it; the frozen layers over the responses only, or not at all where the data holds their states."""
    responses, mask, prompt_of, k, v, positions, valid, hidden, frozen_states = data
    split = isinstance(m.layers, nn.SplitStack)
    upper = m.layers.upper if split else m.layers
    _, uk, uv, _ = upper(hidden, m.attention_inputs(positions, valid, None))
    rows = prompt_of[idx]
    cache = nn.KVCache(k=k[:, rows], v=v[:, rows], positions=positions[rows], valid=valid[rows])

    def side(s: int) -> jax.Array:
        x, new_mask, _, inputs = m.enter(ids=responses[s][idx], mask=mask[s][idx], cache=cache)
        if frozen_states is not None:  # the embedding above is unused (compiled away); `inputs` still carry the
            states, row = frozen_states  # positions and masks
            x = states[row[s][idx]]
        elif split:
            x = m.layers.lower(x, inputs, cache.k, cache.v, span=(0, m.layers.at))[0]
        x = upper(x, inputs, uk[:, rows], uv[:, rows])[0]
        return m.reward_head(m.read(m.final_norm(x), new_mask, responses[s][idx]))[:, 0]

    return side(0), side(1)
