"""The compiled calls a job makes, with abstract arguments placed on a mesh: what `rmjax.plan` compiles.

Each job's calls come from the builders the job itself runs (rmjax.scoring.prefix, rmjax.train.step), so a plan
lowers the same functions with the same shardings; only the arrays are abstract (shape, dtype, sharding: no
weights are read).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rmjax import nn, zoo
from rmjax.compiled import Compiled
from rmjax.config import ModelConfig
from rmjax.loading.hf import numpy_dtype
from rmjax.parallel import batching, sharding
from rmjax.scoring.prefix import (
    PREFIX_BUCKET,
    append_call,
    batch_scorer,
    extend_call,
    prefill_call,
    row_call,
    variants_scorer,
)
from rmjax.train import prefixed
from rmjax.train.step import Steps, feature_pair_rewards, sequence_pair_rewards


@dataclasses.dataclass(frozen=True)
class Call:
    """One compiled call of a job: the call, its abstract arguments, how often the job makes it."""

    name: str
    call: Compiled
    args: tuple
    count: int
    weights: Any = None  # the argument that holds the model's weights (its per-chip bytes), if any
    cache: Any = None  # the argument that holds a KV cache, if any
    loop_trips: int = 0  # the most trips of its while loop (rmjax.plan.cost.cost_of); 0: none planned
    beside: Any = None  # arrays the job holds through the call without passing them (train_rm's held-out data)
    other_model: bool = False  # its weights are another model's (a search's --lm), not the planned model's


def abstract_params(cfg: ModelConfig, dtype: str, mesh: Mesh) -> nnx.State:
    """The weights as the loader would place them on `mesh`: shape, dtype and declared sharding, no values."""
    shapes = zoo.abstract_params(cfg, jnp.dtype(numpy_dtype(dtype)))
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), shapes,
                        nn.shardings(cfg, mesh))


def _array(shape: tuple[int, ...], dtype, mesh: Mesh, *spec: str | None) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, PartitionSpec(*spec)))


def _outputs(call: Compiled, args: tuple) -> Any:
    """The abstract results of `call` (shape, dtype, sharding), to feed the calls that take them."""
    return jax.tree.map(lambda o: jax.ShapeDtypeStruct(o.shape, o.dtype, sharding=o.sharding),
                        call.lower(*args).out_info)


def _prefix(cfg: ModelConfig, dtype: str, mesh: Mesh, prompts: int, prefix_tokens: int):
    """(weights, cache width, the prefill Call (once per prompt), the prefix cache it makes)."""
    params = abstract_params(cfg, dtype, mesh)
    width = batching.bucket(prefix_tokens, PREFIX_BUCKET)
    prefill = prefill_call(cfg, mesh, width)
    args = (params, _array((1, width), jnp.int32, mesh), _array((1, width), jnp.bool_, mesh))
    return params, width, Call("prefill", prefill, args, prompts, params), _outputs(prefill, args)


def sweep_calls(cfg: ModelConfig, dtype: str, mesh: Mesh, *, prompts: int, prefix_tokens: int, suffix_tokens: int,
                candidates: int, batch_size: int, column: int = 0) -> list[Call]:
    """A one-token sweep: per prompt one prefill of the bucketed prefix, then the candidates in batches of
    `batch_size` (rounded up to the data axis), each batch scored after the shared cache."""
    params, width, prefill, cache = _prefix(cfg, dtype, mesh, prompts, prefix_tokens)
    batch = batching.round_up(batch_size, mesh)
    scorer = batch_scorer(cfg, mesh, width, column)
    score_args = (params, cache, _array((batch, 1), jnp.int32, mesh, "data"),
                  _array((suffix_tokens,), jnp.int32, mesh))
    return [prefill, Call("score_batch", scorer, score_args, prompts * math.ceil(candidates / batch), params, cache)]


def responses_calls(cfg: ModelConfig, dtype: str, mesh: Mesh, *, prompts: int, prefix_tokens: int,
                    suffix_tokens: int, responses: int, response_tokens: int, batch_size: int,
                    column: int = 0) -> list[Call]:
    """Equal-length responses scored after a prompt's prefix cache that a search already holds (no prefill of its
    own; rmjax.scoring.prefix.score_responses): `batch_size` rows at most, fewer when the responses need fewer."""
    params, width, _, cache = _prefix(cfg, dtype, mesh, prompts, prefix_tokens)
    rows = min(batching.round_up(batch_size, mesh), batching.rows_for(responses, batching.data_shards(mesh)))
    args = (params, cache, _array((rows, response_tokens), jnp.int32, mesh, "data"),
            _array((suffix_tokens,), jnp.int32, mesh))
    return [Call("score_responses", batch_scorer(cfg, mesh, width, column), args,
                 prompts * math.ceil(responses / rows), params, cache)]


def beam_calls(cfg: ModelConfig, dtype: str, mesh: Mesh, *, prompts: int, prefix_tokens: int, suffix_tokens: int,
               candidates: int, batch_size: int, depth: int, beam: int, direction: str, exhaustive: bool,
               column: int = 0) -> list[Call]:
    """Beam search level by level (rmjax.search.beam): at depth d each kept partial's cache is extended by its
    d-1 tokens (PREFILL_ROWS partials a forward), picked out row by row, and every candidate scored after it."""
    from rmjax.search.beam import PREFILL_ROWS, BeamConfig, job_size

    params, width, prefill, cache = _prefix(cfg, dtype, mesh, prompts, prefix_tokens)
    scored = job_size(BeamConfig(depth=depth, beam=beam, direction=direction, exhaustive=exhaustive), candidates)
    batch = batching.round_up(batch_size, mesh)
    suffix = _array((suffix_tokens,), jnp.int32, mesh)
    made = [prefill]
    for d, count in enumerate(scored, start=1):
        units = count // candidates
        after = cache
        if d > 1:
            rows = batching.round_up(min(PREFILL_ROWS, units), mesh)
            extend = extend_call(cfg, mesh, rows, width, d - 1)
            extend_args = (params, cache, _array((rows, d - 1), jnp.int32, mesh))
            made.append(Call(f"extend_depth{d}", extend, extend_args, prompts * math.ceil(units / rows), params, cache))
            pick = row_call(cfg, mesh, rows, width + d - 1)
            pick_args = (_outputs(extend, extend_args), _array((), jnp.int32, mesh))
            made.append(Call(f"row_depth{d}", pick, pick_args, prompts * units))
            after = _outputs(pick, pick_args)
        scorer = batch_scorer(cfg, mesh, width + d - 1, column)
        args = (params, after, _array((batch, 1), jnp.int32, mesh, "data"), suffix)
        made.append(Call(f"score_depth{d}", scorer, args, prompts * units * math.ceil(candidates / batch), params,
                         after))
    return made


def gcg_calls(cfg: ModelConfig, dtype: str, mesh: Mesh, *, prompts: int, prefix_tokens: int, suffix_tokens: int,
              num_tokens: int, steps: int, search_width: int, eval_batch_size: int, column: int = 0) -> list[Call]:
    """GCG (rmjax.search.gcg): per step and prompt one gradient forward and backward over the response, its K/V
    appended to the prefix cache, and the candidates' changed tails packed into rows (prefix.score_variants). The
    packing depends on where each candidate changes: planned for one swap at a uniformly random position (a tail
    of n/2 + suffix tokens on average)."""
    from rmjax.search.gcg import gradient_call

    params, width, prefill, cache = _prefix(cfg, dtype, mesh, prompts, prefix_tokens)
    n, tail = num_tokens, suffix_tokens
    grad = gradient_call(cfg, mesh, width, column)
    grad_args = (params, cache, _array((n,), jnp.int32, mesh), _array((tail,), jnp.int32, mesh))
    append = append_call(cfg, mesh, width, n)
    append_args = (cache, _outputs(grad, grad_args)[1])
    extended = _outputs(append, append_args)
    row_width = (n + tail) + (1 + tail)
    slots = row_width // (1 + tail)
    packed = math.ceil(search_width * (n / 2 + 0.5 + tail) / row_width)
    calls = math.ceil(packed / min(eval_batch_size, max(1, search_width // 2)))
    rows = batching.round_up(batching.bucket(math.ceil(packed / calls), 8), mesh)
    scorer = variants_scorer(cfg, mesh, width + n, rows, slots, column)
    score_args = (params, extended, *[_array((rows, row_width), jnp.int32, mesh, "data")] * 4,
                  _array((rows, slots), jnp.int32, mesh, "data"), _array((), jnp.int32, mesh))
    per_step = steps * prompts
    return [prefill, Call("gradient", grad, grad_args, per_step, params, cache),
            Call("append_kv", append, append_args, per_step),
            Call("score_variants", scorer, score_args, per_step * calls, params, extended)]


def completion_calls(cfg: ModelConfig, dtype: str, mesh: Mesh, *, prompts: int, prefix_tokens: int,
                     suffix_tokens: int, responses: int, response_tokens: int, max_new: int,
                     prior: ModelConfig | None = None, prior_prefix_tokens: int = 0) -> list[Call]:
    """The completion check of a search's written responses (rmjax.search.completion.check_written) by `prior` (the
    job's --lm, of the RM's tokenizer), else by a tied RM, its own prior: per prompt, the prefix but its last token
    prefilled, the responses in batches of BATCH_SIZE rows each continued greedily in one call (a while loop,
    planned at its `max_new` - 1 trips: every row runs to the cap), then the completed texts (`response_tokens` +
    `max_new`) scored by the RM as experiments.score scores them. Its decode step reads the whole vocabulary's
    logits from the LM head. The RM's weights are held beside an --lm's calls; `prior_prefix_tokens`: the prompt's
    prefix in the --lm's own tokenizer and template (0: the RM's)."""
    from rmjax.search.completion import BATCH_SIZE, SCORED_BATCH_SIZE, WIDTH_BUCKET, greedy_call

    decoder = prior or cfg
    params, width, prefill, cache = _prefix(decoder, dtype, mesh, prompts,
                                            max(1, (prior_prefix_tokens or prefix_tokens) - 1))
    batch = batching.round_up(BATCH_SIZE, mesh)
    rows = batching.decode_rows(responses, BATCH_SIZE, mesh)
    length = batching.bucket(response_tokens + 1, WIDTH_BUCKET)  # the prefix's last token, then the response
    call = greedy_call(decoder, mesh, width, max_new)
    args = (params, cache, _array((rows, length), jnp.int32, mesh, "data"),
            _array((rows, length), jnp.bool_, mesh, "data"), _array((), jnp.int32, mesh))
    scored = score_calls(cfg, dtype, mesh, prompts=prompts, prefix_tokens=prefix_tokens, suffix_tokens=suffix_tokens,
                         texts=responses, text_tokens=response_tokens + max_new,
                         batch_size=SCORED_BATCH_SIZE)
    rm = abstract_params(cfg, dtype, mesh) if prior is not None else None  # loaded beside the LM for the whole job
    lm = prior is not None
    return [dataclasses.replace(prefill, name="completion_prefill", beside=rm, other_model=lm),
            Call("complete", call, args, prompts * math.ceil(responses / batch), params, cache, max_new - 1, rm, lm),
            *(dataclasses.replace(c, name=f"completed_{c.name}") for c in scored)]


def score_calls(cfg: ModelConfig, dtype: str, mesh: Mesh, *, prompts: int, prefix_tokens: int, suffix_tokens: int,
                texts: int, text_tokens: int, batch_size: int, features: bool = False) -> list[Call]:
    """Text scoring (rmjax.scoring.texts): per prompt a prefill, then the texts in batches after the cache, each
    text's tokens and the template's tail in 4-token buckets (planned for texts of `text_tokens` tokens). With
    `features`, the final hidden states in place of the rewards: a head-only train_rm's pass over its responses."""
    from rmjax.scoring.calls import last_hidden_after_call, rewards_after_call
    from rmjax.scoring.texts import LENGTH_BUCKET

    params, width, prefill, cache = _prefix(cfg, dtype, mesh, prompts, prefix_tokens)
    batch = batching.round_up(batch_size, mesh)
    # as the job: a batch holds no more rows than its texts need (the next power of two, rounded up to `data`)
    rows = min(batch, batching.rows_for(texts, batching.data_shards(mesh)))
    length = batching.bucket(text_tokens + suffix_tokens, LENGTH_BUCKET)
    # a batch rounded up to `data`: its rows over `data`
    scorer = (last_hidden_after_call if features else rewards_after_call)(cfg, mesh, width, rows)
    args = (params, cache, _array((rows, length), jnp.int32, mesh, "data"),
            _array((rows, length), jnp.bool_, mesh, "data"))
    name = "features" if features else "score_texts"
    return [prefill, Call(name, scorer, args, prompts * math.ceil(texts / batch), params, cache)]


def whole_calls(cfg: ModelConfig, dtype: str, mesh: Mesh, *, texts: int, tokens: int, batch_size: int) -> list[Call]:
    """Whole conversations scored without a cached prefix (rmjax.scoring.texts.score_conversations' rows of prompts
    with few responses each), in batches of `batch_size` rows at most, planned at the longest (`tokens`)."""
    from rmjax.scoring.calls import rewards_call
    from rmjax.scoring.texts import LENGTH_BUCKET

    params = abstract_params(cfg, dtype, mesh)
    rows = min(batching.round_up(batch_size, mesh), batching.rows_for(texts, batching.data_shards(mesh)))
    length = batching.bucket(tokens, LENGTH_BUCKET)
    args = (params, _array((rows, length), jnp.int32, mesh, "data"), _array((rows, length), jnp.bool_, mesh, "data"))
    return [Call("score_whole", rewards_call(cfg, mesh, rows), args, math.ceil(texts / rows), params)]


def logprobs_calls(cfg: ModelConfig, dtype: str, mesh: Mesh, *, prompts: int, prefix_tokens: int) -> list[Call]:
    """Next-token log-probs (rmjax.scoring.logprobs): every prompt in one left-padded forward of the LM."""
    from rmjax.scoring.calls import log_probs_call

    params = abstract_params(cfg, dtype, mesh)
    call = log_probs_call(cfg, mesh)
    args = (params, _array((prompts, prefix_tokens), jnp.int32, mesh), _array((prompts, prefix_tokens), jnp.bool_,
                                                                               mesh))
    return [Call("next_token_log_probs", call, args, 1, params)]


def inspect_calls(cfg: ModelConfig, dtype: str, mesh: Mesh, *, items: int, tokens: int, steps: int,
                  batch_size: int, column: int = 0) -> list[Call]:
    """Inspecting `items` conversations of `tokens` tokens (rmjax.inspect.job): the lens and the token curve of all
    of them at once, per item the integrated-gradients path in batches of `batch_size` points (planned for its
    first steps + 1 points; the adaptive refinement adds rounds up to --max_evaluations), and with two or more
    items of one length the patching of the last into the first (every component, layer and position: at most, as
    the job skips the positions before the first token that differs)."""
    from rmjax.inspect.attribution import LENGTH_BUCKET, gradients_call
    from rmjax.inspect.lens import _curve, _lens, whole_call
    from rmjax.inspect.patching import COMPONENTS, donor_reads_call, patched_call

    params = abstract_params(cfg, dtype, mesh)
    whole = (params, _array((items, tokens), jnp.int32, mesh), _array((items, tokens), jnp.bool_, mesh))
    made = [Call("lens", whole_call(_lens, cfg, mesh), whole, 1, params),
            Call("token_curve", whole_call(_curve, cfg, mesh), whole, 1, params)]
    width = batching.bucket(tokens, LENGTH_BUCKET)
    grads = gradients_call(cfg, mesh, batch_size, column)
    points = grads.in_axes[3]
    grad_args = (params, _array((1, width), jnp.int32, mesh), _array((1, width), jnp.bool_, mesh),
                 _array((batch_size, width, cfg.hidden_size), jnp.float32, mesh, *(["data"] if points else [])))
    made.append(Call("attribution_path", grads, grad_args, items * math.ceil((steps + 1) / batch_size), params))
    if items >= 2:
        rows = 2 * batch_size
        reads = donor_reads_call(cfg, mesh)
        one = _array((1, tokens), jnp.int32, mesh)
        made.append(Call("patching_donor", reads, (params, one), 1, params))
        patched = patched_call(cfg, mesh, rows, column)
        split = ["data"] if patched.in_axes[4] else []  # the patches over `data` when it divides them
        runs = tokens * (1 + len(COMPONENTS) * cfg.num_layers) + 2
        args = (params, one, one, _outputs(reads, (params, one)), _array((rows,), jnp.int32, mesh, *split),
                _array((rows,), jnp.int32, mesh, *split), _array((rows, tokens), jnp.bool_, mesh, *split))
        made.append(Call("patching", patched, args, math.ceil(runs / rows), params))
    return made


def train_calls(cfg: ModelConfig, dtype: str, mesh: Mesh, *, trainable: str, last_k: int, steps: int,
                batch_size: int, pairs: int, responses: int, sequence_tokens: int, fsdp: bool = False,
                remat: bool = False, prompts: int = 1, prefix_tokens: int = 0, text_tokens: int = 8,
                suffix_tokens: int = 0, heldout_pairs: int = 0, heldout_responses: int = 0,
                checkpoint_every: int = 250) -> list[Call]:
    """One training step of `trainable` (rmjax.train.loop: a head-only run reads a feature matrix of
    `responses` rows, the others token sequences of `sequence_tokens`, those after `prompts` prefixes of
    `prefix_tokens` (run through `last_k`'s frozen layers once) when 0 < prefix_tokens < sequence_tokens and that
    `prefixed.pays`), made `steps` times; with `fsdp` the trained weights and optimizer state split over `data` as
    train_rm --fsdp places them, with `remat` each layer recomputed in the backward pass. A head-only run first
    makes its feature matrix, once: the backbone over each response (`text_tokens` and the template's tail of
    `suffix_tokens`) after its prompt's cached prefix, as TextScorer.features runs it. The others' `heldout_pairs`
    (over `heldout_responses` distinct responses) are made before the steps and held through them, and evaluated
    at each checkpoint (every `checkpoint_every` steps and the last)."""
    from rmjax.train.loop import HELD_BATCH, trainable_part
    from rmjax.train.optimizer import make_optimizer
    from rmjax.train.settings import TrainConfig, frozen_layers
    from rmjax.train.step import _moving

    train_cfg = TrainConfig(trainable=trainable, last_k=last_k, steps=steps, batch_size=batch_size, fsdp=fsdp,
                            remat=remat, checkpoint_every=checkpoint_every)

    class Shapes:  # what trainable_part reads of a Model
        config = cfg
        module = None

    filters = []

    def parts():
        Shapes.module = nn.Transformer(cfg, jnp.dtype(numpy_dtype(dtype)))
        module, wrt = trainable_part(Shapes, train_cfg)
        filters.append(wrt)
        return module, nnx.Optimizer(module, make_optimizer(train_cfg, dtype), wrt=wrt)

    module, optimizer = nnx.eval_shape(parts)
    wrt = filters[0]
    shared = frozen_layers(train_cfg, cfg.num_layers)

    def pair_data(n_pairs: int, n_responses: int, run_steps: int, run_batch: int, split_batch: int) -> tuple:
        """(data, pair_rewards) of `n_pairs` pairs over `n_responses` distinct responses, as train_rm makes them
        for `run_steps` steps of `run_batch` pairs, split at the prefixes where they `pay` at `split_batch`."""
        if not (0 < prefix_tokens < sequence_tokens and prefixed.pays(prompts, split_batch)):
            return (_array((2, n_pairs, sequence_tokens), jnp.int32, mesh),
                    _array((2, n_pairs, sequence_tokens), jnp.bool_, mesh)), sequence_pair_rewards
        # as train_rm runs it: each prompt's prefix through the frozen layers once, the trained ones once a step
        # (rmjax.train.prefixed; `full`: no frozen layer)
        ids = jax.ShapeDtypeStruct((prompts, prefix_tokens), jnp.int32)
        frozen = jax.eval_shape(functools.partial(prefixed.lower_prefix, cfg, shared=shared),
                                zoo.abstract_params(cfg, jnp.dtype(numpy_dtype(dtype))), ids,
                                jax.ShapeDtypeStruct(ids.shape, jnp.bool_))
        response = sequence_tokens - prefix_tokens
        hidden = frozen[-1].dtype  # the distinct responses' states below the trained layers, kept where they pay
        states = (_array((n_responses, response, cfg.hidden_size), hidden, mesh),
                  _array((2, n_pairs), jnp.int32, mesh)) \
            if shared and prefixed.states_pay(n_responses, response, cfg.hidden_size, hidden.itemsize, run_steps,
                                              run_batch) else None
        return (_array((2, n_pairs, response), jnp.int32, mesh), _array((2, n_pairs, response), jnp.bool_, mesh),
                _array((n_pairs,), jnp.int32, mesh), *(_array(x.shape, x.dtype, mesh) for x in frozen),
                states), prefixed.prefixed_pair_rewards

    held = None
    if trainable == "head":  # the held-out pairs' responses are rows of the one feature matrix
        data = (_array((responses, cfg.hidden_size), jnp.float32, mesh), _array((pairs,), jnp.int32, mesh),
                _array((pairs,), jnp.int32, mesh))
        pair_rewards = feature_pair_rewards
    else:
        data, pair_rewards = pair_data(pairs, responses, steps, batch_size, batch_size)
        if heldout_pairs:  # rmjax.train.loop._objective: made before the steps, kept through all of them
            held = pair_data(heldout_pairs, heldout_responses, 1, heldout_pairs, HELD_BATCH)
    moving = _placed(nnx.split((module, optimizer), _moving(wrt), ...)[1], mesh, fsdp)
    runner = Steps(cfg, mesh, module, optimizer, wrt, pair_rewards, data, copy=False,
                   moving_shardings=jax.tree.map(lambda x: x.sharding, moving) if fsdp else None)
    rows = _array((batching.round_up(batch_size, mesh),), jnp.int32, mesh, "data")
    label = _array(rows.shape, jnp.float32, mesh, "data")
    args = (moving, _placed(runner.frozen, mesh), data, rows, label)
    weights = (_placed(nnx.state(module, nnx.All(nnx.Param, wrt)), mesh, fsdp),  # as train_rm places them
               _placed(nnx.state(module, nnx.All(nnx.Param, nnx.Not(wrt))), mesh))
    step = Call("train_step", runner.call, args, steps, weights, beside=held and held[0])
    if trainable != "head":
        return [step, *_evaluation(cfg, mesh, module, optimizer, wrt, data, held, train_cfg, heldout_pairs)]
    # per prompt, its responses in --feature_batch_size batches (TextScorer.features)
    return [*score_calls(cfg, dtype, mesh, prompts=prompts, prefix_tokens=prefix_tokens, suffix_tokens=suffix_tokens,
                         texts=math.ceil(responses / prompts), text_tokens=text_tokens,
                         batch_size=train_cfg.feature_batch_size, features=True), step]


def _evaluation(cfg: ModelConfig, mesh: Mesh, module, optimizer, wrt, data: tuple, held: tuple | None,
                train_cfg, heldout_pairs: int) -> list[Call]:
    """The held-out evaluations (rmjax.train.loop._evaluation: at every checkpoint and the last step, HELD_BATCH
    pairs a call) under the module as trained, the optimizer's state and the training data held beside them."""
    from rmjax.train.loop import HELD_BATCH
    from rmjax.train.step import pair_rewards_call

    if held is None:
        return []
    held_data, pair_rewards = held
    graphdef, _ = nnx.split(module)
    fsdp = train_cfg.fsdp
    trained = _placed(nnx.state(module, nnx.All(nnx.Param, wrt)), mesh, fsdp)
    state = nnx.merge_state(_placed(nnx.state(module, nnx.Not(nnx.All(nnx.Param, wrt))), mesh), trained)
    rows = _array((HELD_BATCH,), jnp.int32, mesh)
    evaluations = math.ceil(train_cfg.steps / train_cfg.checkpoint_every)
    beside = (_placed(nnx.state(optimizer, nnx.OptState), mesh, fsdp), data)
    return [Call("heldout_rewards", pair_rewards_call(cfg, mesh, graphdef, pair_rewards), (state, held_data, rows),
                 evaluations * math.ceil(heldout_pairs / HELD_BATCH), (state,), beside=beside)]


def _placed(state: nnx.State, mesh: Mesh, fsdp: bool = False) -> nnx.State:
    """Abstract variables with the sharding their declared axes give (an optimizer's moments inherit their
    weight's axes; counts are replicated), split over `data` too with `fsdp` (sharding.fsdp_spec)."""
    def place(var):
        value = var.get_value()
        axes = var.get_metadata().get("axes") or ()
        spec = sharding.named_sharding(tuple(axes), value.shape, mesh) if axes else NamedSharding(mesh, PartitionSpec())
        if fsdp and value.ndim:
            spec = NamedSharding(mesh, sharding.fsdp_spec(spec.spec, value.shape, mesh))
        return var.replace(value=jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=spec))

    return jax.tree.map(place, state, is_leaf=lambda x: isinstance(x, nnx.Variable))
