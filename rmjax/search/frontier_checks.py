"""What the frontier checks before any weight loads, from its flags, the models' configs and tokenizers and the
--sweep table: the prompt and --num_tokens within each model's context (GCG's check), a --forwards budget that
buys at least one candidate, and reward_z's yardstick from --sweep (its single-token rewards)."""

from __future__ import annotations

import math
from fractions import Fraction

from rmjax.errors import PromptTooLongError, UsageError
from rmjax.loading.for_job import job_config_and_tokenizer
from rmjax.parallel import batching
from rmjax.runs import results
from rmjax.scoring import finite, memory
from rmjax.search import turns
from rmjax.search.completion import check_completion_room, require_same_vocabulary
from rmjax.search.gcg_config import check_context
from rmjax.text import chat


def per_candidate(own_prior: bool) -> int:
    """Forwards one sampled and scored candidate costs: a prior forward and an RM forward, or one forward when the
    RM is its own prior (its sampler's forward scores it: rmjax.search.fluent, baseline)."""
    return 1 if own_prior else 2


def check_before_loading(spec, judge: str) -> None:
    """Refuse, in one line and before any model loads, a frontier job (rmjax.search.frontier_job.FrontierSpec)
    that cannot run: a response past the RM's or the prior's context, a prompt that leaves the judge no room for
    a response, a budget too small for one candidate, a --sweep column that gives no yardstick. (How many judge
    tokens a response takes is known only from its text: rmjax.scoring.judge refuses one past the judge's context
    as soon as it is decoded.)"""
    name, text = next(iter(spec.prompts.items()))
    if spec.sweep:
        sweep_yardstick(spec.sweep, name, spec.options.allow_nonfinite)
    checks = PromptChecks(spec.options, spec.search, spec.lm, judge)
    checks.check(text, spec.config.forwards)
    checks.weights("frontier job")


class PromptChecks:
    """A search's prompt checked against every model that reads it, before any weight loads (each config and
    tokenizer read once, as the job loads it: with its --system_prompt): the response within the RM's, the
    prior's (`lm`) and each of `others`' context (a disagreement's side B: (label, spec, reads its template's
    suffix)), room in the judge's, and a --forwards budget that buys one candidate (per_candidate, and `others_each`
    whole forwards of the other side); and the weights of all of them, held at once, against the device."""

    def __init__(self, options, search, lm: str | None, judge: str | None, others=(), others_each: int = 0,
                 load_once: bool = False, searches: bool = True):
        self.options, self.search, self.searches = options, search, searches
        # the search's prior is the RM's own LM head (a prior of the RM's spec is the RM where each loads once)
        self.own_prior = searches and (lm is None or (load_once and lm == options.model))
        self.candidate = per_candidate(self.own_prior) + others_each
        self.context_cfg = search.gcg(template=options.template)
        self.rm = job_config_and_tokenizer(options)
        self.lm_spec = lm
        self.lm = (f"the prior --lm={lm}", *job_config_and_tokenizer(options, lm)) if lm else None
        if self.lm:  # the prior reads the RM's token ids
            require_same_vocabulary(self.rm[1], options.model, self.lm[2], lm)
        self.others = [(label, *job_config_and_tokenizer(options, m), suffix) for label, m, suffix in others]
        self.judge = (judge, *job_config_and_tokenizer(options, judge)) if judge else None
        # (label, config) of each model as the job loads it: the judge apart (its own template); the prior apart
        # from the RM unless the job loads each spec once (`load_once`: the disagreement job)
        held = {options.model: (f"the RM {options.model}", self.rm[0])}
        if self.lm:
            held.setdefault(lm if load_once else ("--lm", lm), self.lm[:2])
        for (label, m, _), (_, config, *_) in zip(others, self.others, strict=True):
            held.setdefault(m, (label, config))
        self.held = [*held.values(), *([(f"the judge --judge={judge}", self.judge[1])] if judge else [])]

    def weights(self, job: str, fix: str = "a smaller judge (--judge) or prior (--lm)", at_once: int = 0
                ) -> list[int]:
        """Each held model's per-device weights, refused in one line when together they do not fit the device
        (memory.weights_held: `at_once`, the CPU's float32 copies of a call that runs several), `fix` naming the
        models to shrink."""
        if self.own_prior:  # the RM's forward computes LM logits, through its tied table
            at_once = max(at_once, memory.upcast_bytes(self.rm[0], self.options.dtype,
                                                       batching.model_shards(self.options.mesh), lm_head=True))
        return memory.weights_held(self.held, self.options.dtype, self.options.mesh, job, fix, at_once)

    def check(self, text: str, forwards: int | None) -> None:
        """`text` fits every model; with `forwards`, the budget buys one candidate after its prefill."""
        rm = self._room(None, *self.rm, text, reads_suffix=True)
        n, others_prefill = self.search.num_tokens, Fraction(0)
        for label, config, tokenizer, suffix in self.others:  # each prefix over one response's positions there
            split = self._room(label, config, tokenizer, text, reads_suffix=suffix)
            others_prefill += Fraction(len(split.prefix), n + (turns.rm_tail(split.suffix) if suffix else 1))
        prior_prefix = 0  # the RM as its own prior: one prefill serves both
        if self.lm:  # the prior reads the prompt, the response and its end of turn
            split = self._room(*self.lm, text, reads_suffix=False)
            prior_prefix = len(split.prefix)
            require_same_end(turns.end_of_turn(rm.suffix, self.rm[1], self.options.model), self.lm[2], split.suffix,
                             self.lm_spec, self.options.model)
        if self.searches:  # the written rows' completion check, by the prior, after the whole search
            label, config, tokenizer = self.lm or (f"the RM {self.options.model} (its own prior)", *self.rm)
            check_completion_room(tokenizer, config, [text], self.options.template, n, label,
                                  "give a shorter prompt or a smaller --num_tokens" + ("" if self.lm else
                                  ", or a prior with a longer context (--lm)"))
        if self.judge:
            judge, judge_cfg, judge_tokenizer = self.judge
            try:  # the judge reads the prompt in its own template ("auto") and at least one token of a response
                chat.split_chat(judge_tokenizer, text, "auto", judge_cfg.max_position_embeddings)
            except PromptTooLongError as error:
                raise PromptTooLongError(f"the judge --judge={judge}: {error}") from None
        if forwards is None:
            return
        need = minimum_forwards(len(rm.prefix), turns.rm_tail(rm.suffix), prior_prefix, n, self.search.start_share,
                                self.candidate, others_prefill)
        if forwards < need:
            raise UsageError(budget_message(forwards, need))

    def _room(self, label: str | None, config, tokenizer, text: str, reads_suffix: bool):
        split = chat.split_chat(tokenizer, text, self.options.template)
        try:
            check_context(self.context_cfg, text, len(split.prefix), len(split.suffix) if reads_suffix else 1,
                          config.max_position_embeddings)
        except PromptTooLongError as error:
            if label is None:
                raise
            raise PromptTooLongError(f"{label}: {error}") from None
        return split


def require_same_end(rm_end: int, lm_tokenizer, lm_suffix, lm_source: str, rm_source: str) -> None:
    """The prior ends a turn with the RM's token: whole responses need one end of turn."""
    theirs = turns.end_of_turn(lm_suffix, lm_tokenizer, lm_source)
    if theirs != rm_end:
        raise UsageError(f"--lm={lm_source} ends a turn with token {theirs}, {rm_source} with {rm_end}: whole "
                         "responses need one end of turn; give a prior with the RM's chat template.")


def prefill_cost(rm_prefix: int, suffix: int, prior_prefix: int, num_tokens: int) -> Fraction:
    """Forwards the prompt's prefill costs (rmjax.search.objective: prefix positions over each model's unit)."""
    return Fraction(rm_prefix, num_tokens + suffix) + Fraction(prior_prefix, num_tokens + 1)


def minimum_forwards(rm_prefix: int, suffix: int, prior_prefix: int, num_tokens: int, start_share: float,
                     candidate: int, others_prefill: Fraction = Fraction(0)) -> int:
    """The least --forwards that buys one candidate (`candidate` forwards: per_candidate, and a disagreement's
    other side's) after the prefill (the other side's too: `others_prefill`), for best-of-N and for the search's
    starts, which may spend start_share of the budget (rmjax.search.fluent.fluent_search)."""
    prefill = prefill_cost(rm_prefix, suffix, prior_prefix, num_tokens) + others_prefill
    return max(math.ceil(prefill + candidate), math.ceil(candidate / Fraction(start_share)))


def budget_message(forwards: int, need: int) -> str:
    return (f"--forwards={forwards} does not buy one candidate: the prompt's prefill and one sampled and scored "
            f"response (within --start_share of the budget for the search's starts) need {need}; give "
            f"--forwards={need} or more.")


def sweep_yardstick(path: str, name: str, allow_nonfinite: bool) -> finite.Scale:
    """The mean and SD of prompt `name`'s column of the sweep at `path` (reward_z's yardstick), refused in one
    line when it has fewer than 2 values or no spread (finite.yardstick)."""
    table = results.read_scores_csv(path)
    if name not in table.columns:
        raise UsageError(f"--sweep={path} has no column {name!r} (it has {results.value_columns(table)}).")
    tokens = table["token_id"].tolist() if "token_id" in table.columns else list(range(len(table)))
    return finite.yardstick(table[name].to_numpy(), what=f"single-token rewards of --sweep={path} for {name!r}",
                            row=lambda i: f"token {tokens[i]}", allow=allow_nonfinite,
                            fix="sweep more tokens (reward_z is in SDs of the single-token rewards), or drop --sweep")
