"""GCG's settings and sizes: the config (`GCGConfig`), what one step can sample (`most_candidates`,
`check_search_width`), the room a prompt leaves (`check_context`) and the memory plan checked before the weights
load (`search_plan`). Imported by the swaps, the start, the loop and the job; imports none of them."""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np

from rmjax import checks
from rmjax.checks import setting
from rmjax.errors import PromptTooLongError, UsageError
from rmjax.parallel import batching
from rmjax.scoring import memory
from rmjax.text import candidates, chat


@dataclasses.dataclass(frozen=True)
class GCGConfig:
    num_tokens: int = setting(8, "Response length N in tokens.")
    steps: int = setting(100, "GCG steps.")
    search_width: int = setting(128, "Candidates evaluated per step.")
    topk: int = setting(64, "Substitutions considered per position (by gradient; at most the number of allowed "
                            "tokens).")
    n_replace: int = setting(1, "Positions swapped per candidate (1..--num_tokens).")
    direction: str = setting("optimal", "Maximize or minimize the reward.", ("optimal", "pessimal"))
    selection: str = setting("random", "random: sample swaps among the top-k; greedy: the best swaps by gradient "
                             "(deterministic), each candidate swapping --n_replace positions.", ("random", "greedy"))
    embed_reg: float = setting(0.0, "Faster-GCG embedding-distance regularizer weight (penalizes swaps far from "
                               "the current token).")
    forbid_revisits: bool = setting(True, "Never evaluate a sequence twice (Faster-GCG history).")
    buffer_size: int = setting(8, "Best sequences kept.")
    init: tuple[str, ...] = setting((), "Initial response strings, each kept as typed (default ' x x x ...').",
                                    texts=True)
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
            "token_ids": (lambda v: all(isinstance(i, int | np.integer) and not isinstance(i, bool) and i >= 0
                                        for i in v), "non-negative integer token ids"),
        })
        object.__setattr__(self, "token_ids", tuple(int(i) for i in self.token_ids or ()))
        candidates.refuse_two_candidate_sets(self.token_ids or None, self.vocab_file)  # () is no set here


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
                     f"sample ({how}); use --search_width={most} or less, or {_widening(cfg, allowed, most)}.")


def _widening(cfg: GCGConfig, allowed: int | None, most: int) -> str:
    """The flags that would let a step sample more distinct candidates: each is named only if raising it by one
    does (greedy ignores --n_replace; a small candidate set caps --topk and, at its power, both)."""
    raised = [("--topk", {"topk": cfg.topk + 1})]
    if cfg.n_replace < cfg.num_tokens:  # it cannot exceed --num_tokens
        raised.append(("--n_replace", {"n_replace": cfg.n_replace + 1}))
    flags = [flag for flag, more in raised if most_candidates(dataclasses.replace(cfg, **more), allowed) > most]
    return f"raise {' / '.join(flags)}" if flags else "give more candidate tokens (--token_ids / --vocab_file)"


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
                mesh: jax.sharding.Mesh | None, held: int = 0) -> SearchPlan:
    """From the config and tokenizer alone (before the weights load): refuse a --num_tokens past the context of
    any prompt, a --search_width no step can fill, and a search that cannot fit the device or the host (beside
    `held`, the other models' per-device weights), each in one line naming the flag, the estimate, the memory
    there is and a value that fits."""
    splits = [chat.split_chat(tokenizer, text, cfg.template) for text in prompts.values()]
    context = model_cfg.max_position_embeddings
    for split in splits:
        check_context(cfg, split.prompt, len(split.prefix), len(split.suffix), context)
    vocab = min(model_cfg.vocab_size, len(tokenizer))
    check_search_width(cfg, min(vocab, len(set(cfg.token_ids))) if cfg.token_ids else vocab)
    data, shards = batching.data_shards(mesh), batching.model_shards(mesh)
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
        device = params + held + one.upcast_bytes + caches + max(gradient, evaluate, sample)
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
