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
from rmjax.nn import ops
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
    log-probabilities are `first`): [W, N] float32. Batches are padded to one shape (fewer responses than a batch:
    the next power of two rows) and all dispatched before any result is copied to the host."""
    require_lm_head(model)
    responses = np.asarray(responses, np.int32)
    batch_size = min(batching.round_up(batch_size, model.mesh),
                     batching.rows_for(len(responses), batching.data_shards(model.mesh)))
    call = prior_call(model.config, model.mesh, cache.k.shape[2])
    params, first = declared_params(model), replicated(first, model.mesh)
    if not len(responses):
        return np.zeros((0, responses.shape[1]), np.float32)
    return batching.in_batches(lambda rows: call(params, cache, rows, first), responses, batch_size, model.mesh)[0]


def _weighted_log_prob_of_one_hot(cfg: ModelConfig, params, cache: nn.KVCache, one_hot, ids, first, weights):
    """weights · log-probabilities of the response one_hot(ids) [N, V] after the prefix `cache` (weights [N]: the
    caller's, a mean or the fluency term's), differentiable in the one-hot (through the embeddings and through which
    log-probability each position picks); as aux, the prior's log-probabilities of every token at every position
    [N, V] (row j: token j given the tokens before it)."""
    model = nn.module(params, cfg)
    embeds = ops.one_hot_rows(one_hot, model.embed.embedding[...], ids)
    every = every_log_probs_of_hidden(model, model(embeds=embeds[None], cache=cache).hidden[0], first)
    return jnp.sum(weights * jnp.sum(one_hot * every, axis=-1)), every


def every_log_probs_of_hidden(model, hidden: jax.Array, first: jax.Array) -> jax.Array:
    """The prior's log-probabilities of every token at every position of a response [N, V], from the final-normed
    hidden states of its N positions [N, H] after the prompt (row j from position j − 1, row 0 is `first`)."""
    later = jax.nn.log_softmax(model.lm_logits(hidden[:-1]).astype(jnp.float32), axis=-1)
    return jnp.concatenate([first[None], later])


def _prior_gradient(cfg: ModelConfig, params, cache: nn.KVCache, ids, first, weights):
    one_hot = jax.nn.one_hot(ids, first.shape[0], dtype=jnp.float32)
    return jax.grad(_weighted_log_prob_of_one_hot, argnums=3, has_aux=True)(cfg, params, cache, one_hot, ids, first,
                                                                            weights)


def prior_gradient_call(cfg: ModelConfig, mesh, cache_width: int) -> Compiled:
    """The compiled prior gradient: (params, prefix cache [1, cache_width], ids [N], first [V], weights [N]) ->
    (d weights·log p / d one_hot(ids) [N, V], every token's log-probability at every position [N, V])."""
    return compiled(_prior_gradient, cfg, mesh, (PARAMS, Cache(1, cache_width), *[REPLICATED] * 3),
                    (REPLICATED, REPLICATED))


def prior_gradient(model: Model, cache: nn.KVCache, first: jax.Array, ids: np.ndarray,
                   weights: np.ndarray | None = None) -> tuple[jax.Array, jax.Array]:
    """d weights·log p(ids | prompt) / d one_hot(ids) [N, V] (weights [N], default the mean) and the
    log-probabilities of every token at every position [N, V], both on the device (the fluency term's gradient and
    the prior's proposals)."""
    require_lm_head(model)
    ids = np.asarray(ids, np.int32)
    weights = np.full(len(ids), 1.0 / len(ids)) if weights is None else weights
    call = prior_gradient_call(model.config, model.mesh, cache.k.shape[2])
    return call(declared_params(model), cache, replicated(ids, model.mesh), replicated(first, model.mesh),
                replicated(np.asarray(weights, np.float32), model.mesh))


def _every_log_probs(cfg: ModelConfig, params, cache: nn.KVCache, ids, first):
    one_hot = jax.nn.one_hot(ids, first.shape[0], dtype=jnp.float32)
    return _weighted_log_prob_of_one_hot(cfg, params, cache, one_hot, ids, first, 0.0)[1]


def every_log_probs(model: Model, cache: nn.KVCache, first: jax.Array, ids: np.ndarray) -> jax.Array:
    """The log-probabilities of every token at every position of one response [N, V] on the device (row j: given
    the tokens before it): prior_gradient's aux at the cost of a forward, for the prior's proposals where J has
    no prior term."""
    require_lm_head(model)
    call = compiled(_every_log_probs, model.config, model.mesh,
                    (PARAMS, Cache(1, cache.k.shape[2]), REPLICATED, REPLICATED), REPLICATED)
    return call(declared_params(model), cache, replicated(np.asarray(ids, np.int32), model.mesh),
                replicated(first, model.mesh))


def _sample(cfg: ModelConfig, params, cache: nn.KVCache, first, banned, temperature, key, at, length, end_from, *,
            rows: int, steps: int, end: int | None = None, free: int | None = None):
    """`rows` responses of `length` ≤ `steps` tokens (traced) drawn from the prior after the prefix held in the
    cache's first `at` slots (traced; the rest are emptied), banned tokens never, each step one new position written
    into the cache's free slots; with each token's log-probability under the prior itself (not the
    banned-renormalized, tempered distribution it was drawn from). With `end` (whole turns), the end of turn may be
    drawn from step `end_from` (traced) on (what follows it is not the response: the caller cuts it), and one more
    step gives its log-probability after all `length` tokens. ids [rows, steps] and log-probabilities
    [rows, steps (+ 1 with `end`)], valid in their first `length` (+ 1) columns: one program serves every tail start
    and length of a search (per tail start, the sampler compiled 11 programs in the README's frontier). `free`: the
    slots added after the cache for the draws to write (default: room for `steps`; 0 where the cache has room)."""
    model = nn.module(params, cfg)
    keys = jax.random.split(key, steps)
    fed = length if end is not None else length - 1  # steps whose token is fed back (the last only for its end)
    most = steps if end is not None else steps - 1  # the most steps fed back
    slots = cache.before(at).repeat(rows).with_free_slots(most if free is None else free)

    def draw(step, logp):
        logits = jnp.where(banned[None], -jnp.inf, logp / temperature)
        if end is not None:
            logits = logits.at[:, end].set(jnp.where(step >= end_from, logp[:, end] / temperature, logits[:, end]))
        token = ops.sample_categorical(keys[step], logits).astype(jnp.int32)
        return token, jnp.take_along_axis(logp, token[:, None], axis=-1)[:, 0]

    def step_once(step, state):  # one body for every step: it compiles once, whatever `length` is
        slots, logp, ids, lps = state
        token, lp = draw(step, logp)
        out = model(ids=token[:, None], cache=slots)
        logits = model.lm_logits(out.hidden[:, -1]).astype(jnp.float32)
        return (slots.write(out.kv, at + step), jax.nn.log_softmax(logits, axis=-1), ids.at[:, step].set(token),
                lps.at[:, step].set(lp))

    logp = jnp.broadcast_to(first, (rows, first.shape[0]))
    ids, lps = jnp.zeros((rows, steps), jnp.int32), jnp.zeros((rows, steps + (end is not None)), jnp.float32)
    _, logp, ids, lps = jax.lax.fori_loop(0, fed, step_once, (slots, logp, ids, lps))
    if end is not None:
        return ids, lps.at[:, length].set(logp[:, end])
    token, lp = draw(length - 1, logp)
    return ids.at[:, length - 1].set(token), lps.at[:, length - 1].set(lp)


def sample_call(cfg: ModelConfig, mesh, cache_width: int, rows: int, steps: int, end: int | None = None,
                free: int | None = None) -> Compiled:
    """The compiled sampler: (params, cache [1, cache_width], first [V], banned [V], temperature [], key, at [],
    length [], end_from []) -> (ids [rows, steps], log-probabilities [rows, steps (+ 1 with `end`)]). The
    temperature, the prefix's end, the length and end_from are arguments, not part of the program: best-of-N's two
    temperatures and a search's every tail share one compilation."""
    return compiled(_sample, cfg, mesh, (PARAMS, Cache(1, cache_width), REPLICATED, REPLICATED, REPLICATED, None,
                                         REPLICATED, REPLICATED, REPLICATED),
                    (REPLICATED, REPLICATED), rows=rows, steps=steps, end=end, free=free)


def sample_responses(model: Model, cache: nn.KVCache, first: jax.Array, banned: np.ndarray, count: int,
                     length: int, seed: int, temperature: float = 1.0, batch_size: int = 64,
                     end: int | None = None, end_from: int = 1, at: int | None = None,
                     steps: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """`count` responses of `length` tokens sampled from the prior (never a `banned` token) after the prefix in
    the cache's first `at` slots (default all): ids [count, length] and each token's log-probability under the
    prior [count, length]. Batch b draws with key fold_in(seed, b), so the first k samples are the same whatever
    `count` is. With `end` (whole turns: _sample), the end of turn may be drawn from step `end_from` on, and the
    log-probabilities have one more column: the end of turn's after all `length` tokens. `steps` (≥ length, default
    length) sets the program's shape: calls with one cache width and `steps` share one compilation whatever their
    `at` and `length` (a search's tails: Objective.sampling_cache, whose cache has room for every draw: no free
    slots are added then, where each draw ran over N + 1 slots it never wrote, 6% slower; helper-166)."""
    require_lm_head(model)
    width = cache.k.shape[2]
    at, steps = width if at is None else at, length if steps is None else steps
    if not (1 <= length <= steps and 0 < at <= width):
        raise ValueError(f"sample_responses: length {length}, steps {steps}, at {at}: need 1 <= length <= steps "
                         f"and 0 < at <= the cache's {width} slots")
    # each batch keeps `drawn` rows of its `rows` (a multiple of the data axis): on data:3 a batch of 66 put samples
    # 64-65 in batch 0, and every later sample in another batch's position (another draw than on one device). Row
    # i's draw does not depend on the row count: a search's counts (59 starts, 47 and 48 best-of-N draws, the
    # resamples the forwards left buy) share a few programs (batching.decode_rows)
    drawn = min(batch_size, max(count, 1))
    rows = batching.decode_rows(drawn, batch_size, model.mesh)
    free = max(0, at + (length if end is not None else length - 1) - width)  # slots the draw writes past the cache
    call = sample_call(model.config, model.mesh, width, rows, steps, end, free)
    params = declared_params(model)
    never = np.ones(first.shape[0], bool)  # tokens past the banned list's vocabulary are never drawn
    never[: min(len(banned), len(never))] = np.asarray(banned)[: len(never)]
    first, banned = replicated(first, model.mesh), replicated(jnp.asarray(never), model.mesh)
    scalars = [replicated(np.asarray(x, dtype), model.mesh) for x, dtype in (
        (temperature, np.float32), (at, np.int32), (length, np.int32), (end_from, np.int32))]
    pending = batching.dispatched((call(params, cache, first, banned, scalars[0],
                                        jax.random.fold_in(jax.random.key(seed), b), *scalars[1:])
                                   for b in range(-(-count // drawn))), model.mesh)
    columns = length + (end is not None)
    if not pending:
        return np.zeros((0, length), np.int32), np.zeros((0, columns), np.float32)
    ids = np.concatenate([to_host(i)[:drawn, :length] for i, _ in pending])[:count]
    lps = np.concatenate([to_host(lp)[:drawn, :columns] for _, lp in pending])[:count]
    return ids.astype(np.int32), lps.astype(np.float32)


def _next_after(cfg: ModelConfig, params, cache: nn.KVCache, partials) -> jax.Array:
    model = nn.module(params, cfg)
    hidden = model(ids=partials, cache=cache).hidden[:, -1]
    return jax.nn.log_softmax(model.lm_logits(hidden).astype(jnp.float32), axis=-1)


def next_log_probs(model: Model, cache: nn.KVCache, first: jax.Array, partials: np.ndarray) -> jax.Array:
    """The log-probabilities of the token after each partial response [W, d] (d ≥ 0): [W, V] on the device."""
    require_lm_head(model)
    partials = np.asarray(partials, np.int32)
    if partials.shape[1] == 0:
        return jnp.broadcast_to(first, (len(partials), first.shape[0]))
    rows = batching.round_up(batching.bucket(len(partials), 8), model.mesh)  # few shapes, few compilations
    padded, _ = batching.pad_rows(partials, partials.shape[1], num_rows=rows)
    call = compiled(_next_after, model.config, model.mesh, (PARAMS, Cache(1, cache.k.shape[2]), ROWS(2)), ROWS(2))
    return call(declared_params(model), cache, batching.place(padded, model.mesh))[: len(partials)]
