"""A prompt made ready to score: its template split and its prefix's KV cache."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from rmjax import nn
from rmjax.model import Model, require_reward_model
from rmjax.parallel.distributed import replicated
from rmjax.scoring.prefix import prefill_prefix, score_responses
from rmjax.text import chat


@dataclasses.dataclass
class PromptContext:
    name: str
    split: chat.ChatSplit
    cache: nn.KVCache
    suffix: jax.Array


def prepare_prompt(
    model: Model, name: str, text: str, template: str = "auto", response_tokens: int = 1
) -> PromptContext:
    split = chat.split_chat(model.tokenizer, text, template, model.config.max_position_embeddings, response_tokens)
    require_reward_model(model.config, model.source)
    cache = prefill_prefix(model, split.prefix)
    return PromptContext(name, split, cache, replicated(jnp.asarray(split.suffix, jnp.int32), model.mesh))


def score_tokens(model: Model, ctx: PromptContext, tokens: np.ndarray, batch_size: int) -> np.ndarray:
    """Scores of `tokens` as one-token responses."""
    return score_responses(model, ctx.cache, ctx.suffix, np.asarray(tokens, np.int32)[:, None], batch_size)
