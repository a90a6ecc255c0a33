"""Score every candidate response (default: every token of the vocabulary) for each prompt.

Token mode (exact): candidate i is `prefix + [token_i] + suffix`; the prefix K/V is computed once
per prompt and each batch runs only 1 + len(suffix) positions against it (broadcast, never
copied). Text mode (compatibility with the published CSVs): each token is decoded, placed in the
chat template and re-tokenized; see `rmjax.textscore`.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from rmjax import chat, memory, results
from rmjax import model as M
from rmjax.chunks import ChunkStore, fingerprint
from rmjax.distributed import barrier, is_main
from rmjax.loading import Model
from rmjax.prefix import PREFIX_BUCKET, prefill_prefix, replicated, score_responses
from rmjax.progress import Progress


@dataclasses.dataclass
class PromptContext:
    name: str
    split: chat.ChatSplit
    cache: M.KVCache
    suffix: jax.Array


def prepare_prompt(
    model: Model, name: str, text: str, template: str = "auto", response_tokens: int = 1
) -> PromptContext:
    if not model.config.is_reward_model:
        raise ValueError(
            f"{model.source} has no score head ({model.config.architecture}); sweeps need a reward model "
            "(*ForSequenceClassification). For a causal LM use experiments.logprobs."
        )
    split = chat.split_chat(model.tokenizer, text, template, model.config.max_position_embeddings, response_tokens)
    suffix = replicated(jnp.asarray(split.suffix, jnp.int32), model.mesh)
    return PromptContext(name, split, prefill_prefix(model, split.prefix), suffix)


def score_tokens(model: Model, ctx: PromptContext, tokens: np.ndarray, batch_size: int) -> np.ndarray:
    """Scores of `tokens` as one-token responses."""
    return score_responses(model, ctx.cache, ctx.suffix, np.asarray(tokens, np.int32)[:, None], batch_size)


def memory_plan(cfg, tokenizer, prompts: dict[str, str], template: str, dtype: str, mesh,
                batch_size: int | None = None, mode: str = "token") -> memory.MemoryEstimate:
    """Per-device memory of this sweep from the config and tokenizer alone (before weights load);
    picks the batch size when None, raises DoesNotFitError when the run cannot fit."""
    splits = [chat.split_chat(tokenizer, t, template, cfg.max_position_embeddings) for t in prompts.values()]
    prefix = -(-max(len(s.prefix) for s in splits) // PREFIX_BUCKET) * PREFIX_BUCKET
    positions = 1 + max(len(s.suffix) for s in splits) if mode == "token" else 16  # text: re-tokenized tails
    return memory.plan(cfg, dtype, prefix, positions, mesh, batch_size)


def candidate_ids(model: Model, token_ids=None, limit: int | None = None) -> np.ndarray:
    vocab = model.config.vocab_size
    if token_ids is None:
        ids = np.arange(min(vocab, len(model.tokenizer)))
    else:
        ids = np.asarray(list(token_ids), np.int64)
        bad = ids[(ids < 0) | (ids >= vocab)]
        if bad.size:
            raise ValueError(f"token ids {bad[:5].tolist()} are outside the vocabulary [0, {vocab}).")
    return ids[:limit] if limit is not None else ids


def sweep(
    model: Model,
    prompts: dict[str, str],
    token_ids=None,
    *,
    limit: int | None = None,
    mode: str = "token",
    batch_size: int = 256,
    chunk_size: int = 4096,
    template: str = "auto",
    out: str | Path | None = None,
    progress_every: float = 5.0,
    text_add_special_tokens: bool = False,
) -> pd.DataFrame:
    """Reward of every candidate for every prompt; resumable when `out` is given.

    Completed chunks go to `<out>.chunks/`; an interrupted run restarted with the same settings
    continues after the last complete chunk. The CSV and its .meta.json appear only when all
    chunks are done.
    """
    from rmjax import textscore

    if mode not in ("token", "text"):
        raise ValueError(f"mode must be token or text, not {mode!r}")
    start_time = time.perf_counter()
    tokens = candidate_ids(model, token_ids, limit)
    ids_all, names_all, decoded_all = chat.token_table(model.tokenizer, model.config.vocab_size)
    names = [names_all[i] for i in tokens]
    decoded = [decoded_all[i] for i in tokens]
    if mode == "token":
        contexts = [prepare_prompt(model, n, t, template) for n, t in prompts.items()]
    else:
        scorers = [textscore.TextScorer(model, t, template, text_add_special_tokens) for t in prompts.values()]
    store = None
    if out is not None:
        identity = {
            "model": model.source, "dtype": model.dtype, "mode": mode, "template": template,
            "output_column": model.config.reward_index,
            "prompts": prompts, "candidates": fingerprint(tokens), "n_candidates": len(tokens),
            "chunk_size": chunk_size, "text_add_special_tokens": text_add_special_tokens,
        }
        # Process 0 owns the files; the others check the same store once it exists (shared disk).
        if is_main():
            store = ChunkStore(out, identity)
        barrier("rmjax-sweep-store")
        if not is_main():
            store = ChunkStore(out, identity, create=False)
    starts = list(range(0, len(tokens), chunk_size))
    done = {s for s in starts if store is not None and store.has(s)}
    barrier("rmjax-sweep-resume")  # every process agrees on the chunks to skip before any is written
    done_before = sum(min(chunk_size, len(tokens) - s) for s in done)
    progress = Progress(len(tokens), f"sweep {mode}", every=progress_every, done=done_before)
    if done_before:
        progress.update(0, force=True)
    chunks = []
    for s in starts:
        part = tokens[s : s + chunk_size]
        if s in done:
            chunks.append(store.read(s))
            continue
        if mode == "token":
            scores = np.stack([score_tokens(model, ctx, part, batch_size) for ctx in contexts], axis=1)
        else:
            texts = [decoded[i] for i in range(s, s + len(part))]
            scores = np.stack([sc.score(texts, batch_size) for sc in scorers], axis=1)
        if store is not None and is_main():
            store.write(s, scores)
        chunks.append(scores)
        progress.update(len(part))
    table = np.concatenate(chunks) if chunks else np.zeros((0, len(prompts)), np.float32)
    df = pd.DataFrame({"token_id": tokens, "token_name": names, "token_decoded": decoded})
    for j, name in enumerate(prompts):
        df[name] = table[:, j]
    seconds = time.perf_counter() - start_time
    scored = len(tokens) - done_before
    if out is not None and is_main():
        path = results.write_scores_csv(out, tokens, names, decoded, {n: table[:, j] for j, n in enumerate(prompts)})
        results.write_meta(
            path, kind="sweep", model=model.source, architecture=model.config.architecture,
            output_column=model.config.reward_index,
            prompts=prompts, mode=mode, template=template, dtype=model.dtype,
            mesh=dict(model.mesh.shape) if model.mesh is not None else None,
            n_candidates=len(tokens), resumed_candidates=done_before, batch_size=batch_size,
            seconds=seconds, load_seconds=model.load_seconds,
            candidates_per_second=scored * len(prompts) / seconds if seconds > 0 else None,
        )
        store.remove()
    return df
