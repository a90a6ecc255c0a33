"""Greedy Coordinate Gradient over an N-token response, maximizing or minimizing a reward.

Objective: the mean reward of `prefix + response + suffix` over one or more (reward model,
prompt) targets. The loss is `-sign * reward` (sign +1 optimal, -1 pessimal) and both the
gradient and the candidate selection minimize that same loss (the reference fork used the
maximizing gradient for pessimal search). The prefix K/V of every target is computed once and
reused for gradients and candidate evaluation.
"""

from __future__ import annotations

import dataclasses
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from rmjax import chat
from rmjax import model as M
from rmjax.distributed import to_host
from rmjax.loading import Model
from rmjax.prefix import prefill_prefix, replicated, score_responses
from rmjax.textscore import Conversations


@dataclasses.dataclass(frozen=True)
class GCGConfig:
    num_tokens: int = 8
    steps: int = 100
    search_width: int = 128
    topk: int = 64
    n_replace: int = 1
    direction: str = "optimal"  # optimal (maximize) | pessimal (minimize)
    selection: str = "random"  # random | greedy (deterministic: best single swaps by gradient)
    embed_reg: float = 0.0  # Faster-GCG: penalize swaps far (in embedding space) from the current token
    forbid_revisits: bool = True  # Faster-GCG history: never evaluate a sequence twice
    buffer_size: int = 8
    init: tuple[str, ...] = ()  # initial response strings (default: "x x x ...")
    patience: int | None = None  # stop after this many steps without improvement
    seed: int = 0
    allow_special: bool = False
    allow_non_ascii: bool = False
    retokenize_filter: bool = True
    eval_batch_size: int = 256
    template: str = "auto"


@dataclasses.dataclass
class Target:
    """One (reward model, prompt) term of the objective."""

    model: Model
    prompt: str
    prefix: tuple[int, ...]
    suffix: tuple[int, ...]
    cache: M.KVCache = None
    suffix_ids: jax.Array = None


@dataclasses.dataclass
class GCGResult:
    best_ids: list[int]
    best_text: str
    best_reward: float
    history: list[dict]
    buffer: list[tuple[float, list[int]]]
    seconds: float


def make_target(model: Model, prompt: str, template: str = "auto", prefix=None, suffix=None) -> Target:
    if not model.config.is_reward_model:
        raise ValueError(f"{model.source} has no score head; GCG needs a reward model.")
    if prefix is None:
        split = chat.split_chat(model.tokenizer, prompt, template, model.config.max_position_embeddings)
        prefix, suffix = split.prefix, split.suffix
    target = Target(model, prompt, tuple(prefix), tuple(suffix or ()))
    target.cache = prefill_prefix(model, target.prefix)
    target.suffix_ids = replicated(jnp.asarray(target.suffix, jnp.int32), model.mesh)
    return target


@functools.partial(jax.jit, static_argnames=("cfg",))
def _reward_of_one_hot(params, cfg, cache, one_hot, suffix):
    """Reward of prefix + (one_hot @ E) + suffix; differentiable in the one-hot matrix [N, V]."""
    embeds = jnp.concatenate([one_hot @ params.embed.astype(one_hot.dtype), params.embed[suffix].astype(one_hot.dtype)])
    hidden, _ = M.forward(params, cfg, embeds=embeds[None], cache=cache)
    return M.reward_head(params, cfg, hidden[:, -1], cache.gate_input)[0, cfg.reward_index]


_grad_one_hot = jax.jit(jax.grad(_reward_of_one_hot, argnums=3), static_argnames=("cfg",))


def reward_gradient(target: Target, ids: np.ndarray) -> np.ndarray:
    """d reward / d one_hot(ids): [N, V] float32."""
    m = target.model
    one_hot = jax.nn.one_hot(jnp.asarray(ids), m.config.vocab_size, dtype=jnp.float32)
    return to_host(_grad_one_hot(m.params, m.config, target.cache, one_hot, target.suffix_ids))


def evaluate(targets: list[Target], candidates: np.ndarray, batch_size: int = 256) -> np.ndarray:
    """Mean reward over targets of each candidate response [W, N] -> [W]."""
    total = np.zeros(len(candidates), np.float64)
    for t in targets:
        total += score_responses(t.model, t.cache, t.suffix_ids, candidates, batch_size)
    return (total / len(targets)).astype(np.float32)


def disallowed_ids(tokenizer, vocab_size: int, allow_special: bool, allow_non_ascii: bool) -> np.ndarray:
    """Boolean [V]: special/control tokens and (optionally) non-ASCII or undecodable tokens."""
    bad = np.zeros(vocab_size, bool)
    if tokenizer is None:
        return bad
    n = min(len(tokenizer), vocab_size)
    bad[n:] = True
    if not allow_special:
        bad[[i for i in tokenizer.all_special_ids if i < vocab_size]] = True
        for i, tok in enumerate(tokenizer.convert_ids_to_tokens(list(range(n)))):
            if tok is not None and tok.startswith("<") and tok.endswith(">") and len(tok) > 2 and (
                    "|" in tok or tok.startswith("<unused") or tok in tokenizer.all_special_tokens):
                bad[i] = True
    if not allow_non_ascii:
        for i, text in enumerate(tokenizer.batch_decode([[i] for i in range(n)])):
            if not text or not text.isascii() or not text.isprintable() or "\ufffd" in text:
                bad[i] = True
    return bad


def retokenizes(conversations, ids: list[int], expected: list[int]) -> bool:
    """The response survives decode -> template -> tokenize as the same ids."""
    text = conversations.tokenizer.decode(ids)
    return conversations.token_ids([text])[0] == expected


def sample_candidates(current: np.ndarray, grad: np.ndarray, cfg: GCGConfig, rng: np.random.Generator,
                      embed: np.ndarray | None) -> np.ndarray:
    """Candidate responses [W, N]; `grad` is d loss / d one_hot with disallowed ids at +inf."""
    score = grad.copy()
    if embed is not None and cfg.embed_reg > 0:
        # |e - c| from norms and one matmul: never materializes [N, V, hidden]
        sq = (embed**2).sum(-1)[None, :] + (embed[current] ** 2).sum(-1)[:, None] - 2.0 * embed[current] @ embed.T
        dist = np.sqrt(np.maximum(sq, 0.0))
        score = score + cfg.embed_reg * dist / (dist.mean() + 1e-9)
    n, v = score.shape
    k = min(cfg.topk, v)
    top = np.argsort(score, axis=1)[:, :k]  # most loss-decreasing tokens per position
    if cfg.selection == "greedy":
        flat = np.argsort(score[np.arange(n)[:, None], top], axis=None)[: cfg.search_width]
        cands = np.repeat(current[None], len(flat), axis=0)
        pos, rank = np.unravel_index(flat, (n, k))
        cands[np.arange(len(flat)), pos] = top[pos, rank]
        return cands
    cands = np.repeat(current[None], cfg.search_width, axis=0)
    for c in cands:
        positions = rng.choice(n, size=min(cfg.n_replace, n), replace=False)
        c[positions] = top[positions, rng.integers(0, k, size=len(positions))]
    return cands


def gcg(targets: list[Target], cfg: GCGConfig, log=None) -> GCGResult:
    """Search an N-token response maximizing (optimal) or minimizing (pessimal) the mean reward."""
    if cfg.direction not in ("optimal", "pessimal"):
        raise ValueError(f"direction must be optimal or pessimal, not {cfg.direction!r}")
    sign = 1.0 if cfg.direction == "optimal" else -1.0
    start = time.perf_counter()
    rng = np.random.default_rng(cfg.seed)
    lead = targets[0].model
    vocab = min(t.model.config.vocab_size for t in targets)
    banned = disallowed_ids(lead.tokenizer, vocab, cfg.allow_special, cfg.allow_non_ascii)
    embed = to_host(lead.params.embed).astype(np.float32)[:vocab] if cfg.embed_reg > 0 else None
    inits = [_init_ids(lead, text, cfg, banned, rng) for text in (cfg.init or ("",))]
    init_arr = np.asarray(inits)
    eval_batch = min(cfg.eval_batch_size, cfg.search_width)  # one batch shape: one compilation
    init_scores = evaluate(targets, init_arr, eval_batch)
    buffer = sorted(((-sign * float(s), list(ids)) for s, ids in zip(init_scores, inits, strict=True)))
    buffer = buffer[: cfg.buffer_size]
    seen = {tuple(ids) for ids in inits}
    history, best_step = [], 0
    for step in range(cfg.steps):
        # When every top-k neighbour of the best sequence has been visited, search from the next
        # buffer entries, swapping more positions at a time (the history forbids going back).
        for attempt in range(min(len(buffer), 4)):
            current = np.asarray(buffer[attempt][1])
            grad = -sign * np.mean([reward_gradient(t, current)[:, :vocab] for t in targets], axis=0)
            grad[:, banned] = np.inf
            step_cfg = dataclasses.replace(cfg, n_replace=min(cfg.num_tokens, cfg.n_replace + attempt))
            cands = _filter(sample_candidates(current, grad, step_cfg, rng, embed), targets[0], cfg, seen)
            if len(cands):
                break
        if len(cands):
            losses = -sign * evaluate(targets, cands, eval_batch)
            for loss, ids in zip(losses, cands, strict=True):
                buffer.append((float(loss), ids.tolist()))
            buffer = sorted(buffer, key=lambda x: x[0])[: cfg.buffer_size]
        best_loss, best_ids = buffer[0]
        if history and best_loss < min(h["loss"] for h in history) - 1e-9:
            best_step = step
        record = {"step": step + 1, "loss": best_loss, "reward": -sign * best_loss, "ids": best_ids,
                  "text": _decode(lead, best_ids), "candidates": len(cands), "seconds": time.perf_counter() - start}
        history.append(record)
        if log:
            log(f"[gcg {cfg.direction}] step {step + 1}/{cfg.steps} reward {record['reward']:.4f} "
                f"{record['text']!r} ({len(cands)} candidates, {record['seconds']:.1f} s)")
        if cfg.patience is not None and step - best_step >= cfg.patience:
            break
    best_loss, best_ids = buffer[0]
    return GCGResult(best_ids, _decode(lead, best_ids), -sign * best_loss, history,
                     [(-sign * loss, ids) for loss, ids in buffer], time.perf_counter() - start)


def _decode(model: Model, ids: list[int]) -> str:
    return model.tokenizer.decode(ids) if model.tokenizer is not None else " ".join(map(str, ids))


def _init_ids(model: Model, text: str, cfg: GCGConfig, banned: np.ndarray, rng) -> list[int]:
    ids = []
    if text and model.tokenizer is not None:
        ids = model.tokenizer(text, add_special_tokens=False).input_ids[: cfg.num_tokens]
    if not text and model.tokenizer is not None:
        ids = model.tokenizer(" x" * cfg.num_tokens, add_special_tokens=False).input_ids[: cfg.num_tokens]
    allowed = np.flatnonzero(~banned)
    while len(ids) < cfg.num_tokens:
        ids.append(int(rng.choice(allowed)))
    return ids


def _filter(cands: np.ndarray, target: Target, cfg: GCGConfig, seen: set) -> np.ndarray:
    check = cfg.retokenize_filter and target.model.tokenizer is not None
    convs = Conversations(target.model.tokenizer, target.prompt, cfg.template) if check else None
    keep = []
    for c in cands:
        key = tuple(c.tolist())
        if cfg.forbid_revisits and key in seen:
            continue
        if check and not retokenizes(convs, list(key), [*target.prefix, *key, *target.suffix]):
            continue
        seen.add(key)
        keep.append(c)
    # duplicates within a batch are dropped even without the history
    return np.unique(np.asarray(keep), axis=0) if keep else np.zeros((0, cands.shape[1]), np.int32)
