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
import math
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from rmjax import checks, nn
from rmjax.checks import setting
from rmjax.errors import NonFiniteError, PromptTooLongError, UsageError
from rmjax.model import Model, require_reward_model
from rmjax.parallel.distributed import is_main, replicated, to_host
from rmjax.runs import results
from rmjax.scoring import finite, memory
from rmjax.scoring.prefix import append_kv, extend_prefix, prefill_prefix, score_responses, score_variants
from rmjax.text import chat
from rmjax.text.candidates import read_vocab_file, words_to_ids
from rmjax.text.chat import Conversations


@dataclasses.dataclass(frozen=True)
class GCGConfig:
    num_tokens: int = setting(8, "Response length N in tokens.")
    steps: int = setting(100, "GCG steps.")
    search_width: int = setting(128, "Candidates evaluated per step.")
    topk: int = setting(64, "Substitutions considered per position (by gradient; at most the number of allowed "
                            "tokens).")
    n_replace: int = setting(1, "Positions swapped per candidate (1..--num_tokens).")
    direction: str = setting("optimal", "Maximize or minimize the reward.", ("optimal", "pessimal"))
    selection: str = setting("random", "random: sample swaps among the top-k; greedy: the best single swaps by "
                             "gradient.", ("random", "greedy"))
    embed_reg: float = setting(0.0, "Faster-GCG embedding-distance regularizer weight (penalizes swaps far from "
                               "the current token).")
    forbid_revisits: bool = setting(True, "Never evaluate a sequence twice (Faster-GCG history).")
    buffer_size: int = setting(8, "Best sequences kept.")
    init: tuple[str, ...] = setting((), "Initial response strings (default ' x x x ...').")
    vocab_file: str | None = setting(None, "Search only these tokens: a file of strings, one per line (as "
                                     "experiments.beam --vocab_file; lines that are not one token are ignored).")
    token_ids: tuple[int, ...] = setting((), "Search only these token ids (as experiments.beam --token_ids); not with "
                                         "--vocab_file.")
    init_from: str | None = setting(None, "A beam or exhaustive result CSV (experiments.beam): start the buffer from "
                                    "its best sequences of --num_tokens tokens in --direction (those that pass the "
                                    "re-tokenization filter), instead of the default start.")
    patience: int | None = setting(None, "Stop after this many steps without improvement.")
    seed: int = setting(0, "Random seed.")
    allow_special: bool = setting(False, "Allow special/control tokens in the response.")
    allow_non_ascii: bool = setting(False, "Allow non-ASCII tokens in the response.")
    retokenize_filter: bool = setting(True, "Keep only responses that re-tokenize to the same ids inside the "
                                      "template.")
    eval_batch_size: int = setting(256, "Rows per evaluation call (at most; a step's rows each pack about two "
                                        "candidates' tails).")
    template: str = setting("auto", "Chat template use.", ("auto", "chat", "plain"))
    allow_nonfinite: bool = setting(False, "Drop candidates with NaN/Inf rewards instead of stopping.")

    def __post_init__(self):
        checks.validate(self, {
            "num_tokens": checks.POSITIVE, "steps": checks.POSITIVE, "search_width": checks.POSITIVE,
            "topk": checks.POSITIVE, "buffer_size": checks.POSITIVE, "patience": checks.POSITIVE,
            "eval_batch_size": checks.POSITIVE, "embed_reg": checks.NON_NEGATIVE,
            # jax.random.key keeps the low 32 bits (2**32 + 5 is seed 5); numpy refuses a negative seed
            "seed": (lambda v: 0 <= v < 2**32, "an integer in [0, 4294967295]"),
            "n_replace": (lambda v: 1 <= v <= self.num_tokens, f"between 1 and --num_tokens={self.num_tokens}"),
            "direction": checks.one_of("optimal", "pessimal"), "selection": checks.one_of("random", "greedy"),
            "template": checks.one_of("auto", "chat", "plain"),
            "init_from": (lambda v: Path(v).is_file(), "an existing beam result CSV"),
            "vocab_file": (lambda v: Path(v).is_file(), "an existing file of candidate strings"),
            "token_ids": (lambda v: all(isinstance(i, int | np.integer) and not isinstance(i, bool) and i >= 0
                                        for i in v), "non-negative integer token ids"),
        })
        object.__setattr__(self, "token_ids", tuple(int(i) for i in self.token_ids or ()))
        if self.token_ids and self.vocab_file:
            raise UsageError("give the candidate set once: --token_ids or --vocab_file, not both.")


# Settings that do not change the search's result.
NOT_IN_IDENTITY = ("eval_batch_size",)


def most_candidates(cfg: GCGConfig, allowed: int | None = None) -> int:
    """The most distinct candidates one step can sample from `allowed` tokens (None: bounded by --topk alone):
    greedy makes one swap per (position, top-k token); random sets --n_replace positions (up to 3 more when a step
    retries from the buffer) each to one of its top-k tokens. A wider --search_width samples only repeats."""
    n = cfg.num_tokens
    k = cfg.topk if allowed is None else max(1, min(cfg.topk, allowed))
    if cfg.selection == "greedy":
        return n * k
    most = max(math.comb(n, r) * k**r for r in range(cfg.n_replace, min(n, cfg.n_replace + 3) + 1))
    return most if allowed is None else min(most, max(1, allowed) ** n)


def check_search_width(cfg: GCGConfig, allowed: int | None = None) -> None:
    """Refuse a --search_width that no step can fill (it used to run for hours sampling repeats)."""
    most = most_candidates(cfg, allowed)
    if cfg.search_width <= most:
        return
    k = cfg.topk if allowed is None else min(cfg.topk, allowed)
    tokens = f"top {k} tokens" + (f" (of the {allowed:,} this model and candidate set allow)"
                                  if allowed is not None and allowed < cfg.topk else "")
    how = (f"{cfg.num_tokens} positions x {tokens}, one swap each (--selection=greedy)" if cfg.selection == "greedy"
           else f"--num_tokens={cfg.num_tokens} positions, --n_replace={cfg.n_replace}"
                + (f" (up to {min(cfg.num_tokens, cfg.n_replace + 3)} on a retry)" if cfg.n_replace < cfg.num_tokens
                   else "") + f" of them set to one of their {tokens}")
    raise UsageError(f"--search_width={cfg.search_width} is more than the {most:,} distinct candidates one step can "
                     f"sample ({how}); use --search_width={most} or less, or raise --topk / --n_replace.")


def check_context(cfg: GCGConfig, prompt: str, prefix: int, suffix: int, context: int) -> None:
    """Refuse a --num_tokens that, with the templated prompt, runs past the model's context (positions it was
    never trained on: the rewards are meaningless, and nothing used to say so)."""
    room = context - prefix - suffix
    if cfg.num_tokens > room:
        fix = (f"use --num_tokens={room} or less, or a shorter prompt" if room > 0 else
               "the prompt alone fills it: shorten the prompt")
        raise PromptTooLongError(f"--num_tokens={cfg.num_tokens}: prompt {prompt[:40]!r} takes {prefix + suffix} of "
                                 f"the model's {context} positions (max_position_embeddings) with its template, "
                                 f"leaving {max(room, 0)} for the response; {fix}.")


SEEN_BYTES = 120  # + 40 per token: one evaluated sequence in the search's history (a tuple of Python ints in a set)


@dataclasses.dataclass(frozen=True)
class SearchPlan:
    """Memory of a search: per device (weights, prefix caches, the largest of gradient, evaluation and candidate
    sampling) and on the host (every evaluated sequence of every step, kept to forbid revisits)."""

    device_bytes: int
    host_bytes: int
    device_limit: int
    host_limit: int

    def describe(self) -> str:
        return (f"{memory.gib(self.device_bytes)} per device of {memory.gib(self.device_limit)}, "
                f"{memory.gib(self.host_bytes)} of host memory of {memory.gib(self.host_limit)}")


def search_plan(cfg: GCGConfig, model_cfg, tokenizer, prompts: dict[str, str], dtype: str,
                mesh: jax.sharding.Mesh | None) -> SearchPlan:
    """From the config and tokenizer alone (before the weights load): refuse a --num_tokens past the context of
    any prompt, a --search_width no step can fill, and a search that cannot fit the device or the host, each in
    one line naming the flag, the estimate, the memory there is and a value that fits."""
    splits = [chat.split_chat(tokenizer, text, cfg.template) for text in prompts.values()]
    context = model_cfg.max_position_embeddings
    for split in splits:
        check_context(cfg, split.prompt, len(split.prefix), len(split.suffix), context)
    vocab = min(model_cfg.vocab_size, len(tokenizer))
    check_search_width(cfg, min(vocab, len(set(cfg.token_ids))) if cfg.token_ids else vocab)
    data, shards = (mesh.shape["data"], mesh.shape["model"]) if mesh is not None else (1, 1)
    prefix, suffix = max(len(s.prefix) for s in splits), max(len(s.suffix) for s in splits)
    params = memory.param_bytes(model_cfg, dtype, shards)
    on_cpu = jax.default_backend() == "cpu"

    def need(width: int, n: int, steps: int = cfg.steps) -> tuple[int, int]:
        per_position = memory.estimate(model_cfg, dtype, 1, 1, 1, 1, shards).cache_bytes  # K/V of one position
        caches = len(splits) * per_position * (2 * prefix + n)  # each prompt's prefix, and prefix + response
        one = memory.estimate(model_cfg, dtype, prefix, n + suffix, 1, 1, shards)
        # backward keeps every layer's activations; one-hot, gradient, mean, swap scores, distances: [N, V] f32
        gradient = one.batch_bytes * model_cfg.num_layers + 6 * n * model_cfg.vocab_size * 4
        rows = min(cfg.eval_batch_size, max(1, width // 2))  # two candidates' tails per row (score_variants)
        evaluate = memory.estimate(model_cfg, dtype, prefix + n, 2 * (n + suffix), rows, data, shards).batch_bytes
        sample = 6 * width * n * 4  # uniform draws, their argsort, positions, choices, the candidates
        device = params + caches + max(gradient, evaluate, sample)
        host = steps * width * (SEEN_BYTES + 40 * n) + 4 * width * n * 8
        return device, host + (device * jax.local_device_count() if on_cpu else 0)  # CPU devices share the RAM

    device_limit, host_limit = memory.device_memory_bytes(), memory.host_memory_bytes()

    def fits(width: int, n: int, steps: int = cfg.steps) -> bool:
        device, host = need(width, n, steps)
        return device <= device_limit and host <= host_limit

    plan = SearchPlan(*need(cfg.search_width, cfg.num_tokens), device_limit, host_limit)
    if fits(cfg.search_width, cfg.num_tokens):
        return plan
    width = memory.largest_fitting(lambda w: fits(w, cfg.num_tokens), cfg.search_width)
    steps = memory.largest_fitting(lambda t: fits(cfg.search_width, cfg.num_tokens, t), cfg.steps)
    if width or steps:  # the history keeps every step's candidates: fewer steps fit too
        flag = f"--search_width={cfg.search_width}" + (f" over --steps={cfg.steps}" if steps else "")
        fix = "use " + " or ".join([f"--search_width={width} or less"] * bool(width) +
                                   [f"--steps={steps} or fewer"] * bool(steps))
    else:
        n = memory.largest_fitting(lambda m: fits(1, m), cfg.num_tokens)
        flag = f"--num_tokens={cfg.num_tokens}"
        fix = (f"use --num_tokens={n} or less" if n else
               "not even one token fits: use more `model` shards (--mesh), bfloat16 or a larger device")
    raise memory.DoesNotFitError(f"GCG with {flag} does not fit: {plan.describe()}; {fix}.")


@dataclasses.dataclass
class Target:
    """One (reward model, prompt) term of the objective."""

    model: Model
    prompt: str
    prefix: tuple[int, ...]
    suffix: tuple[int, ...]
    cache: nn.KVCache = None
    suffix_ids: jax.Array = None


@dataclasses.dataclass
class GCGResult:
    best_ids: list[int]
    best_text: str
    best_reward: float
    history: list[dict]
    buffer: list[tuple[float, list[int]]]
    seconds: float
    nonfinite_candidates: int = 0  # dropped with allow_nonfinite


def make_target(model: Model, prompt: str, template: str = "auto", prefix=None, suffix=None) -> Target:
    require_reward_model(model.config, model.source, "GCG")
    if prefix is None:
        split = chat.split_chat(model.tokenizer, prompt, template, model.config.max_position_embeddings)
        prefix, suffix = split.prefix, split.suffix
    target = Target(model, prompt, tuple(prefix), tuple(suffix or ()))
    target.cache = prefill_prefix(model, target.prefix)
    target.suffix_ids = replicated(jnp.asarray(target.suffix, jnp.int32), model.mesh)
    return target


@jax.custom_vjp
def _rows_of(one_hot: jax.Array, table: jax.Array, ids: jax.Array) -> jax.Array:
    """one_hot(ids) @ table, computed as the gather it equals (the same rows as the ids path, on every
    backend and dtype); its gradient w.r.t. the (float32) one-hot is the usual g @ table.T."""
    return jnp.take(table, ids, axis=0)


def _rows_forward(one_hot, table, ids):
    return jnp.take(table, ids, axis=0), table


def _rows_backward(table, g):
    # f32 accumulation without an f32 copy of a bf16 table ([V, H]: gigabytes for a 256k vocabulary)
    return jnp.einsum("nh,vh->nv", g, table, preferred_element_type=jnp.float32), None, None


_rows_of.defvjp(_rows_forward, _rows_backward)


@functools.partial(jax.jit, static_argnames=("cfg", "column"))
def _reward_of_one_hot(params, cfg, cache, one_hot, ids, suffix, column):
    """Reward of prefix + (one_hot @ E) + suffix, differentiable in the one-hot matrix [N, V] (one_hot(ids));
    and, as aux, the K/V of that forward (the cache GCG's candidates are scored against)."""
    model = nn.module(params, cfg)
    table = model.embed.embedding[...]
    embeds = jnp.concatenate([_rows_of(one_hot, table, ids), jnp.take(table, suffix, axis=0)])
    out = model(embeds=embeds[None], cache=cache)
    return model.reward_head(out.hidden[:, -1], cache.gate_input)[0, column], out.kv


_grad_one_hot = jax.jit(jax.grad(_reward_of_one_hot, argnums=3, has_aux=True), static_argnames=("cfg", "column"))


def reward_gradient(target: Target, ids: np.ndarray) -> np.ndarray:
    """d reward / d one_hot(ids): [N, V] float32 (on the host; the search keeps it on the device)."""
    return to_host(_device_gradient(target, ids)[0])


def _device_gradient(target: Target, ids: np.ndarray) -> tuple[jax.Array, nn.KVCache]:
    """The gradient, and the cache of prefix + ids that its forward computed on the way (prefix.append_kv)."""
    m = target.model
    ids = jnp.asarray(ids, jnp.int32)
    one_hot = jax.nn.one_hot(ids, m.config.vocab_size, dtype=jnp.float32)
    grad, kv = _grad_one_hot(m.params, m.config, target.cache, one_hot, ids, target.suffix_ids, m.output_column)
    return grad, append_kv(m, target.cache, kv, len(ids))


def evaluate(targets: list[Target], candidates: np.ndarray, batch_size: int = 256,
             current: np.ndarray | None = None, extended: list[nn.KVCache] | None = None) -> np.ndarray:
    """Mean reward over targets of each candidate response [W, N] -> [W]. With `current` (the sequence the
    candidates were made from), each runs only from its first change on (prefix.score_variants), against
    `extended` (per target, the cache of its prefix + current; computed here when not given)."""
    total = np.zeros(len(candidates), np.float64)
    for i, t in enumerate(targets):
        if current is None:
            total += score_responses(t.model, t.cache, t.suffix_ids, candidates, batch_size)
            continue
        cache = extend_prefix(t.model, t.cache, np.asarray(current)[None]) if extended is None else extended[i]
        total += score_variants(t.model, cache, np.asarray(t.suffix, np.int32), current, candidates, batch_size)
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


@jax.jit
def swap_scores(loss_grad: jax.Array, banned: jax.Array, current: jax.Array, embed: jax.Array | None,
                embed_reg: float) -> jax.Array:
    """How much each swap (position, token) is expected to lower the loss, lower is better: the loss gradient
    [N, V], plus the Faster-GCG embedding-distance penalty when `embed` is given; banned and non-finite
    swaps at +inf. |e - c| comes from norms and one matmul: [N, V, hidden] is never built."""
    score = jnp.where(jnp.isfinite(loss_grad), loss_grad, jnp.inf)
    if embed is not None:
        here = embed[current]
        sq = (embed**2).sum(-1)[None, :] + (here**2).sum(-1)[:, None] - 2.0 * here @ embed.T
        dist = jnp.sqrt(jnp.maximum(sq, 0.0))
        score = score + embed_reg * dist / (dist.mean() + 1e-9)
    return jnp.where(banned[None, :], jnp.inf, score)


@functools.partial(jax.jit, static_argnames=("k",))
def _best_swaps(score: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """Per position, the k most loss-decreasing tokens [N, k] and their scores (lowest first)."""
    neg, top = jax.lax.top_k(-score, k)
    return top, -neg


@functools.partial(jax.jit, static_argnames=("width", "n_replace"))
def _random_swaps(current: jax.Array, top: jax.Array, key: jax.Array, width: int, n_replace: int) -> jax.Array:
    """`width` candidates, each `current` with `n_replace` distinct positions set to one of their top-k tokens."""
    n, k = top.shape
    where_key, which_key = jax.random.split(key)
    positions = jnp.argsort(jax.random.uniform(where_key, (width, n)), axis=1)[:, :n_replace]
    choice = jax.random.randint(which_key, (width, n_replace), 0, k)
    return jnp.tile(current, (width, 1)).at[jnp.arange(width)[:, None], positions].set(top[positions, choice])


def sample_candidates(current: np.ndarray, score: jax.Array, cfg: GCGConfig, key: jax.Array) -> np.ndarray:
    """Candidate responses [W, N] from `swap_scores` (on the device: only the top-k swaps or the candidates
    come back to the host, never the [N, V] scores)."""
    n = len(current)
    # Never past the allowed tokens: with --topk above their number, top-k would reach banned ones (+inf).
    k = min(cfg.topk, int(jnp.isfinite(score).sum(axis=1).min()))
    if k == 0:
        return np.zeros((0, n), current.dtype)
    top, top_scores = _best_swaps(score, k)
    if cfg.selection == "greedy":
        return _greedy_candidates(current, to_host(top), to_host(top_scores), cfg)
    cands = _random_swaps(jnp.asarray(current, jnp.int32), top, key, cfg.search_width, min(cfg.n_replace, n))
    return to_host(cands).astype(current.dtype)


def _greedy_candidates(current: np.ndarray, top: np.ndarray, top_scores: np.ndarray, cfg: GCGConfig) -> np.ndarray:
    """Deterministic candidates: the i-th best single swap (by gradient), plus, up to `n_replace` positions,
    the best swap at each of the positions whose best swap scores best (so the stall fallback's larger
    n_replace gives new candidates, not the same single swaps again)."""
    n, k = top.shape
    pos, rank = np.unravel_index(np.argsort(top_scores, axis=None, kind="stable"), (n, k))
    # Per position, its best token that is not the current one, and positions by that swap's score.
    second = min(1, k - 1)
    differs = top[:, 0] != current
    alt = np.where(differs, top[:, 0], top[:, second])
    by_score = np.argsort(np.where(differs, top_scores[:, 0], top_scores[:, second]), kind="stable")
    cands, seen = [], set()
    for p, r in zip(pos, rank, strict=True):
        c = current.copy()
        c[p] = top[p, r]
        extra = [q for q in by_score if q != p][: max(0, min(cfg.n_replace, n) - 1)]
        c[extra] = alt[extra]
        if tuple(c) not in seen:  # two swaps can complete each other into one candidate
            seen.add(tuple(c))
            cands.append(c)
        if len(cands) == cfg.search_width:
            break
    return np.asarray(cands, current.dtype).reshape(-1, n)


def gcg(targets: list[Target], cfg: GCGConfig, log=None) -> GCGResult:
    """Search an N-token response maximizing (optimal) or minimizing (pessimal) the mean reward. The history
    holds per step the best so far, the `candidates` evaluated, and how they were filtered: `sampled`, minus
    `repeats`, `revisits` (--forbid_revisits) and `retokenize_failed`, after `retries` (buffer entries tried
    before one gave a candidate). A step left with under a quarter of --search_width logs a warning."""
    sign = 1.0 if cfg.direction == "optimal" else -1.0
    start = time.perf_counter()
    rng = np.random.default_rng(cfg.seed)
    lead = targets[0].model
    for t in targets:  # past the context every reward is meaningless
        check_context(cfg, t.prompt, len(t.prefix), len(t.suffix), t.model.config.max_position_embeddings)
    vocab = min(t.model.config.vocab_size for t in targets)
    banned = disallowed_ids(lead.tokenizer, vocab, cfg.allow_special, cfg.allow_non_ascii)
    if cfg.vocab_file:
        banned |= ~_only(lead, cfg.vocab_file, vocab)
    if cfg.token_ids:
        banned |= ~_only_ids(cfg.token_ids, vocab)
    if banned.all():
        raise UsageError("no token may be searched: the candidate set (--vocab_file / --token_ids) holds only "
                         "special, non-ASCII or out-of-tokenizer tokens; pass --allow_special / --allow_non_ascii, "
                         "or give other tokens.")
    allowed_count = int((~banned).sum())
    banned_on_device = jnp.asarray(banned)
    embed = nn.get(lead.params, "embed.embedding")[:vocab].astype(jnp.float32) if cfg.embed_reg > 0 else None
    key = jax.random.key(cfg.seed)
    checks = _retokenization_checks(targets, cfg)
    seeds = _seeds(cfg, checks, banned) if cfg.init_from else []
    texts = cfg.init or (() if seeds else ("",))
    inits = seeds + [ids for ids in (_init_ids(lead, text, cfg, banned, rng, checks) for text in texts)
                     if ids not in seeds]
    init_arr = np.asarray(inits)
    # Candidates' tails run packed about two to a row (prefix.score_variants): search_width / 2 rows per call.
    eval_batch = min(cfg.eval_batch_size, max(1, cfg.search_width // 2))
    dropped = 0

    def losses_of(cands: np.ndarray, current: np.ndarray | None = None, extended=None) -> np.ndarray:
        """-sign * reward; NaN/Inf stop the search (or, when allowed, mark the candidate to drop)."""
        nonlocal dropped
        rewards = evaluate(targets, cands, eval_batch, current, extended)
        bad = ~np.isfinite(rewards)
        if bad.any() and not cfg.allow_nonfinite:
            finite.check(rewards[:, None], what="rewards", columns=["GCG objective"], allow=False,
                         row=lambda i: f"response ids {cands[i].tolist()} ({_decode(lead, cands[i].tolist())!r})",
                         explain=lambda i, j: _explain(targets, cands[i]))
        dropped += int(bad.sum())
        return np.where(bad, np.nan, -sign * rewards)

    init_losses = losses_of(init_arr)
    if np.isnan(init_losses).all():
        raise NonFiniteError("every initial response has a NaN/Inf reward; nothing to search from. Check the model "
                             "for NaN (it is not the search's doing).")
    buffer = sorted((float(loss), list(ids)) for loss, ids in zip(init_losses, inits, strict=True) if np.isfinite(loss))
    buffer = buffer[: cfg.buffer_size]
    seen = {tuple(ids) for ids in inits}
    history, best_step = [], 0
    for step in range(cfg.steps):
        # When every top-k neighbour of the best sequence has been visited, search from the next
        # buffer entries, swapping more positions at a time (the history forbids going back): retries.
        tries = min(len(buffer), 4)
        for attempt in range(tries):
            current = np.asarray(buffer[attempt][1])
            grads, extended = zip(*(_device_gradient(t, current) for t in targets), strict=True)
            grad = _mean_on_device([g[:, :vocab] for g in grads]) * -sign
            nonfinite = int(jnp.sum(~jnp.isfinite(grad)))
            if nonfinite and not cfg.allow_nonfinite:
                raise NonFiniteError(
                    f"the reward's gradient for response ids {current.tolist()} is NaN/Inf at {nonfinite} "
                    f"(position, token) entries{_explain(targets, current)}. Fix the model, or {finite.ALLOW_HINT}.")
            # never a banned swap, nor one with no gradient
            score = swap_scores(grad, banned_on_device, jnp.asarray(current), embed, cfg.embed_reg)
            step_cfg = dataclasses.replace(cfg, n_replace=min(cfg.num_tokens, cfg.n_replace + attempt))
            step_key = jax.random.fold_in(key, step * 4 + attempt)
            cands, counts = _filter(sample_candidates(current, score, step_cfg, step_key), checks, cfg, seen)
            if len(cands):
                break
            if log and attempt + 1 < tries:
                log(f"[gcg {cfg.direction}] step {step + 1}: no candidate left from buffer entry {attempt + 1} "
                    f"with n_replace={step_cfg.n_replace} ({_describe(counts)}); retrying from buffer entry "
                    f"{attempt + 2} with n_replace={min(cfg.num_tokens, cfg.n_replace + attempt + 1)}")
        if len(cands):
            losses = losses_of(cands, current, list(extended))
            held = {tuple(ids) for _, ids in buffer}  # without the history a sequence can come back: keep it once
            for loss, ids in zip(losses, cands, strict=True):
                if np.isfinite(loss) and tuple(ids.tolist()) not in held:
                    buffer.append((float(loss), ids.tolist()))
                    held.add(tuple(ids.tolist()))
            buffer = sorted(buffer, key=lambda x: x[0])[: cfg.buffer_size]
        best_loss, best_ids = buffer[0]
        if history and best_loss < min(h["loss"] for h in history) - 1e-9:
            best_step = step
        record = {"step": step + 1, "loss": best_loss, "reward": -sign * best_loss, "ids": best_ids,
                  "text": _decode(lead, best_ids), "candidates": len(cands), "retries": attempt,
                  **{k: v for k, v in counts.items() if k != "left"}, "seconds": time.perf_counter() - start}
        history.append(record)
        retried = f" after {attempt} retr{'y' if attempt == 1 else 'ies'}" if attempt else ""
        if log:
            log(f"[gcg {cfg.direction}] step {step + 1}/{cfg.steps} reward {record['reward']:.4f} "
                f"{record['text']!r} ({_describe(counts)}{';' + retried if retried else ''}; "
                f"{record['seconds']:.1f} s)")
        if 4 * len(cands) < cfg.search_width and is_main():
            logging.warning("GCG step %d: only %d of --search_width=%d candidates left to evaluate%s (%d sampled, %s). "
                            "%s", step + 1, len(cands), cfg.search_width, retried, counts["sampled"],
                            _removed(counts), _advice(counts, cfg, allowed_count))
        if cfg.patience is not None and step - best_step >= cfg.patience:
            break
    best_loss, best_ids = buffer[0]
    return GCGResult(best_ids, _decode(lead, best_ids), -sign * best_loss, history,
                     [(-sign * loss, ids) for loss, ids in buffer], time.perf_counter() - start, dropped)


def _mean_on_device(grads: list[jax.Array]) -> jax.Array:
    """The mean of the targets' gradients where the first one lives (models may sit on different devices)."""
    if len(grads) == 1:
        return grads[0]
    return sum(jax.device_put(g, grads[0].sharding) for g in grads) / len(grads)


def _explain(targets: list[Target], ids: np.ndarray) -> str:
    """Where the first target whose reward of `ids` is non-finite turns NaN (see rmjax.scoring.finite)."""
    for t in targets:
        if not np.isfinite(evaluate([t], np.asarray([ids]), 1)).all():
            return f" (model {t.model.source}, prompt {t.prompt[:40]!r})" + finite.diagnose(
                t.model, [*t.prefix, *np.asarray(ids).tolist(), *t.suffix])
    params = [p for t in targets for p in finite.nonfinite_parameters(t.model.params)]
    return f"; non-finite parameters: {'; '.join(dict.fromkeys(params))}" if params else ""


def _decode(model: Model, ids: list[int]) -> str:
    return model.tokenizer.decode(ids) if model.tokenizer is not None else " ".join(map(str, ids))


def _init_ids(model: Model, text: str, cfg: GCGConfig, banned: np.ndarray, rng, checks) -> list[int]:
    """The starting response: `text` (--init), or by default "x x x ..." (with and without a leading space:
    templates that trim the response make the spaced form impossible). A start that no real conversation
    produces could be reported as the best response, so it must pass the same re-tokenization filter."""
    if model.tokenizer is None:
        return [int(i) for i in rng.choice(np.flatnonzero(~banned), cfg.num_tokens)]
    tries = [text] if text else [" x" * cfg.num_tokens, "x" + " x" * (cfg.num_tokens - 1)]
    for attempt in tries:
        ids = model.tokenizer(attempt, add_special_tokens=False).input_ids[: cfg.num_tokens]
        allowed = bool(text) or not banned[ids].any()  # the default start keeps to the candidate set too
        if len(ids) == cfg.num_tokens and allowed and all(_survives(check, ids) for check in checks):
            return ids
    if not text and (cfg.vocab_file or cfg.token_ids):  # 'x' is not in the set: its lowest allowed id, repeated
        ids = [int(np.flatnonzero(~banned)[0])] * cfg.num_tokens
        if all(_survives(check, ids) for check in checks):
            return ids
    what = f"--init {text!r}" if text else "the default start 'x x x ...'"
    raise UsageError(f"{what} does not come out of a real conversation as {cfg.num_tokens} tokens (decode -> "
                     "template -> tokenize gives other ids, or fewer tokens); give --init a response of exactly "
                     f"--num_tokens={cfg.num_tokens} tokens that survives the template, or --noretokenize_filter.")


def _only(model: Model, path: str, vocab: int) -> np.ndarray:
    """Boolean [V]: the single tokens of --vocab_file."""
    ids, _ = words_to_ids(model.tokenizer, read_vocab_file(path))
    if not len(ids):
        raise UsageError(f"--vocab_file={path}: none of its lines is a single token of this tokenizer.")
    allowed = np.zeros(vocab, bool)
    allowed[ids[ids < vocab]] = True
    return allowed


def _only_ids(ids: tuple[int, ...], vocab: int) -> np.ndarray:
    """Boolean [V]: --token_ids (as experiments.beam's; ids past the vocabulary are refused)."""
    outside = [i for i in ids if i >= vocab]
    if outside:
        raise UsageError(f"--token_ids: {outside[:5]} are outside the vocabulary [0, {vocab}).")
    allowed = np.zeros(vocab, bool)
    allowed[list(ids)] = True
    return allowed


def init_from_rows(cfg: GCGConfig, vocab_size: int | None = None):
    """The rows of --init_from with --num_tokens tokens in --direction, best first. A file that is not a whole beam
    CSV (or cannot be parsed as one), has no such rows, or (given `vocab_size`) holds ids outside [0, vocab_size)
    is a one-line error naming the file: the entry point calls this before the model loads."""
    import pandas as pd

    path = Path(cfg.init_from)
    flag = f"--init_from={path}"
    results.checked_input(path, ("beam",), "--init_from")  # whole, and a beam's (python -m experiments.beam)
    try:
        df = results.read_beam_csv(path)
    except (ValueError, KeyError, TypeError, UnicodeDecodeError, pd.errors.ParserError) as error:
        raise UsageError(f"{flag}: cannot be read as a beam result CSV ({' '.join(str(error).split())[:200]}); rerun "
                         "python -m experiments.beam to write it again.") from None
    rows = df[(df.depth == cfg.num_tokens) & (df.direction == cfg.direction)].sort_values("rank")
    if rows.empty:
        have = sorted({(int(d), str(r)) for d, r in zip(df.depth, df.direction, strict=True)})
        raise UsageError(f"{flag} has no {cfg.direction} sequences of --num_tokens={cfg.num_tokens} tokens (it has "
                         f"depth/direction {have}); run the beam with --depth={cfg.num_tokens}.")
    uneven = [ids for ids in rows.ids if len(ids) != cfg.num_tokens]
    if uneven:
        raise UsageError(f"{flag}: a depth-{cfg.num_tokens} row holds {len(uneven[0])} ids {list(uneven[0])[:8]}; the "
                         "CSV was edited: rerun the beam.")
    if vocab_size is not None:
        outside = sorted({i for ids in rows.ids for i in ids if not 0 <= i < vocab_size})
        if outside:
            raise UsageError(f"{flag}: token ids {outside[:5]} are outside this model's vocabulary [0, {vocab_size}) "
                             "(a beam of another model, or an edited CSV); run the beam with this model.")
    return rows


def _seeds(cfg: GCGConfig, checks, banned: np.ndarray) -> list[list[int]]:
    """The best `buffer_size` sequences of --init_from with --num_tokens tokens in --direction that GCG could
    itself reach (allowed tokens, surviving the re-tokenization filter), best first."""
    path = Path(cfg.init_from)
    rows = init_from_rows(cfg, len(banned))
    seeds = []
    for ids in rows.ids:
        ids = [int(i) for i in ids]
        if not banned[ids].any() and all(_survives(check, ids) for check in checks):
            seeds.append(ids)
        if len(seeds) == cfg.buffer_size:
            break
    if not seeds:
        raise UsageError(f"--init_from={path}: none of its {len(rows)} {cfg.direction} sequences of {cfg.num_tokens} "
                         "tokens is one GCG may search (banned tokens, or they do not survive decode -> template -> "
                         "tokenize); widen the beam's --top, or pass --noretokenize_filter / --allow_special.")
    return seeds


def _retokenization_checks(targets: list[Target], cfg: GCGConfig) -> list[tuple[Conversations, Target]]:
    """One check per target (every prompt and model: templates differ), when the filter is on."""
    if not cfg.retokenize_filter:
        return []
    return [(Conversations(t.model.tokenizer, t.prompt, cfg.template), t) for t in targets
            if t.model.tokenizer is not None]


def _survives(check: tuple[Conversations, Target], ids: list[int]) -> bool:
    convs, target = check
    return retokenizes(convs, ids, [*target.prefix, *ids, *target.suffix])


def _filter(cands: np.ndarray, checks: list, cfg: GCGConfig, seen: set) -> tuple[np.ndarray, dict[str, int]]:
    """The candidates to evaluate, sorted: each distinct one once (even without the history), none evaluated
    before (with forbid_revisits), none failing the re-tokenization filter; and the counts: `sampled`, removed
    as `repeats` (within the batch), `revisits` and `retokenize_failed`, and `left`."""
    n = cands.shape[1]
    distinct = np.unique(cands, axis=0) if len(cands) else cands.reshape(0, n)
    counts = {"sampled": len(cands), "repeats": len(cands) - len(distinct), "revisits": 0, "retokenize_failed": 0}
    keep = []
    for c in distinct:
        key = tuple(c.tolist())
        if cfg.forbid_revisits and key in seen:
            counts["revisits"] += 1
            continue
        if not all(_survives(check, list(key)) for check in checks):
            counts["retokenize_failed"] += 1
            continue
        seen.add(key)
        keep.append(c)
    counts["left"] = len(keep)
    return (np.asarray(keep).reshape(-1, n) if keep else np.zeros((0, n), np.int32)), counts


def _removed(counts: dict[str, int]) -> str:
    removed = [f"{counts[key]} {what}" for key, what in (
        ("repeats", "repeats"), ("revisits", "evaluated before"),
        ("retokenize_failed", "failing the re-tokenization filter")) if counts[key]]
    return "removed " + ", ".join(removed) if removed else "none removed"


def _describe(counts: dict[str, int]) -> str:
    return f"{counts['left']} of {counts['sampled']} sampled candidates left, {_removed(counts)}"


def _advice(counts: dict[str, int], cfg: GCGConfig, allowed: int) -> str:
    """What to change for more candidates, for the filter that removed most first."""
    k = min(cfg.topk, allowed)
    narrow = (f"widen --topk (now {cfg.topk})" if cfg.topk < allowed else
              f"allow more tokens (only {allowed} may be searched)")
    fewer = f"lower --search_width ({cfg.num_tokens} positions x top {k} tokens make {cfg.num_tokens * k} single swaps)"
    actions = {
        "repeats": [narrow, "raise --n_replace", fewer],
        "revisits": [narrow, "pass --noforbid_revisits"],
        "retokenize_failed": ["pass --noretokenize_filter (a response may then not be what a conversation tokenizes "
                              "to)"],
    }
    todo = [a for c in sorted((c for c in actions if counts[c]), key=lambda c: -counts[c]) for a in actions[c]]
    if counts["sampled"] < cfg.search_width:  # greedy selection: fewer distinct swaps than the width
        todo += [narrow, fewer]
    todo = list(dict.fromkeys(todo)) or [narrow, fewer]
    return "To get more: " + (", ".join(todo[:-1]) + " or " if len(todo) > 1 else "") + todo[-1] + "."
