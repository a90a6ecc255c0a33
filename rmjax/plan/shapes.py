"""What a plan needs to know of a job's sizes, one class per job: its compiled calls at a batch size, the batch it
fixes (if any; `split_batch`: the job refuses a batch its data axis does not divide), and the prefix and
positions per row the jobs' memory planner sizes a batch by."""

from __future__ import annotations

import dataclasses

from rmjax.config import ModelConfig
from rmjax.plan import calls


@dataclasses.dataclass(frozen=True)
class SweepShape:
    prompts: int
    prefix_tokens: int
    suffix_tokens: int
    candidates: int

    fixed_batch = None  # the plan picks the batch
    per = "candidate"

    def positions(self) -> int:
        return 1 + self.suffix_tokens

    def memory_prefix(self) -> int:
        return self.prefix_tokens

    def work_items(self) -> int:
        return self.prompts * self.candidates

    def calls(self, cfg: ModelConfig, dtype: str, mesh, batch: int) -> list[calls.Call]:
        return calls.sweep_calls(cfg, dtype, mesh, prompts=self.prompts, prefix_tokens=self.prefix_tokens,
                                 suffix_tokens=self.suffix_tokens, candidates=self.candidates, batch_size=batch)


@dataclasses.dataclass(frozen=True)
class BeamShape(SweepShape):
    depth: int = 2
    beam: int = 64
    direction: str = "both"
    exhaustive: bool = False
    lm: ModelConfig | None = None  # the completion check's --lm, loaded beside the RM for the whole job
    lm_prefix_tokens: int = 0  # the longest prompt prefix in the --lm's tokenizer and template (0: the RM's)

    def memory_prefix(self) -> int:  # the deepest level's partial response joins the cached prefix
        return self.prefix_tokens + self.depth - 1

    def work_items(self) -> int:
        from rmjax.search.beam import BeamConfig, job_size

        return self.prompts * sum(job_size(BeamConfig(depth=self.depth, beam=self.beam, direction=self.direction,
                                                      exhaustive=self.exhaustive), self.candidates))

    def calls(self, cfg: ModelConfig, dtype: str, mesh, batch: int) -> list[calls.Call]:
        from rmjax.search.beam_job import MAX_NEW

        made = calls.beam_calls(cfg, dtype, mesh, prompts=self.prompts, prefix_tokens=self.prefix_tokens,
                                suffix_tokens=self.suffix_tokens, candidates=self.candidates, batch_size=batch,
                                depth=self.depth, beam=self.beam, direction=self.direction,
                                exhaustive=self.exhaustive)
        made += _completion(cfg, dtype, mesh, self, self.written_responses(), self.depth, MAX_NEW)
        return _beside_lm(made, self.lm, dtype, mesh)

    def written_responses(self) -> int:
        """The responses the completion check continues (beam_job's CHECKED_ROWS of each depth and direction's
        written rows; at most: the two directions may share some)."""
        from rmjax.search.beam import BeamConfig
        from rmjax.search.beam_job import CHECKED_ROWS

        cfg = BeamConfig(depth=self.depth, beam=self.beam, direction=self.direction, exhaustive=self.exhaustive)
        n = self.candidates  # a direction's sequences at depth d: all, or its beam's partials times every candidate
        ranked = [n ** d if self.exhaustive else min(self.beam, n ** (d - 1)) * n for d in range(1, self.depth + 1)]
        return sum(len(cfg.directions) * min(CHECKED_ROWS, cfg.top, r) for r in ranked)


@dataclasses.dataclass(frozen=True)
class GcgShape:
    prompts: int
    prefix_tokens: int
    suffix_tokens: int
    num_tokens: int
    steps: int
    search_width: int
    eval_batch_size: int
    buffer_size: int = 8  # GCGConfig's default: the best sequences kept, written and completed
    lm: ModelConfig | None = None  # the completion check's --lm, loaded beside the RM for the whole job
    lm_prefix_tokens: int = 0  # the longest prompt prefix in the --lm's tokenizer and template (0: the RM's)

    per = "step"

    @property
    def fixed_batch(self) -> int:
        return self.eval_batch_size

    def positions(self) -> int:  # two candidates' tails a row
        return 2 * (self.num_tokens + self.suffix_tokens)

    def memory_prefix(self) -> int:
        return self.prefix_tokens + self.num_tokens

    def work_items(self) -> int:
        return self.steps

    def calls(self, cfg: ModelConfig, dtype: str, mesh, batch: int) -> list[calls.Call]:
        from rmjax.search.gcg_job import BUFFER_BATCH_SIZE, MAX_NEW

        made = calls.gcg_calls(cfg, dtype, mesh, prompts=self.prompts, prefix_tokens=self.prefix_tokens,
                               suffix_tokens=self.suffix_tokens, num_tokens=self.num_tokens, steps=self.steps,
                               search_width=self.search_width, eval_batch_size=self.eval_batch_size)
        # the buffer of best sequences the job writes and completes, scored again after each prompt's prefix first
        completion = _completion(cfg, dtype, mesh, self, self.buffer_size, self.num_tokens, MAX_NEW)
        if completion:
            made += calls.responses_calls(cfg, dtype, mesh, prompts=self.prompts, prefix_tokens=self.prefix_tokens,
                                          suffix_tokens=self.suffix_tokens, responses=self.buffer_size,
                                          response_tokens=self.num_tokens, batch_size=BUFFER_BATCH_SIZE)
        return _beside_lm(made + completion, self.lm, dtype, mesh)


def _completion(cfg: ModelConfig, dtype: str, mesh, shape, responses: int, response_tokens: int,
                max_new: int) -> list[calls.Call]:
    """The completion check's calls (rmjax.search.completion.completion_prior): by the job's --lm, else by the RM
    itself where it ties its embeddings (its LM head is the embedding table); an untied RM's job without --lm skips
    the check."""
    if shape.lm is None and not cfg.tie_embeddings:
        return []
    return calls.completion_calls(cfg, dtype, mesh, prompts=shape.prompts, prefix_tokens=shape.prefix_tokens,
                                  suffix_tokens=shape.suffix_tokens, responses=responses,
                                  response_tokens=response_tokens, max_new=max_new, prior=shape.lm,
                                  prior_prefix_tokens=shape.lm_prefix_tokens)


def _beside_lm(made: list[calls.Call], lm: ModelConfig | None, dtype: str, mesh) -> list[calls.Call]:
    """The job loads its --lm with the RM and holds both to the end: the LM's weights beside each of the RM's calls
    (the LM's own calls hold the RM's already)."""
    if lm is None:
        return made
    weights = calls.abstract_params(lm, dtype, mesh)
    return [c if c.beside is not None else dataclasses.replace(c, beside=weights) for c in made]


@dataclasses.dataclass(frozen=True)
class TrainShape:
    trainable: str
    last_k: int
    steps: int
    batch_size: int
    pairs: int
    responses: int
    sequence_tokens: int
    fsdp: bool = False
    remat: bool = False
    prompts: int = 1
    prefix_tokens: int = 0  # each prompt's prefix, run through the layers once (a step's, for the steps; 0: not split)
    text_tokens: int = 8  # head: its feature pass's response tokens after the prefix, and the template's tail
    suffix_tokens: int = 0
    heldout_pairs: int = 0  # made before the steps, held through them (not head: rows of its feature matrix)
    heldout_responses: int = 0
    checkpoint_every: int = 250  # each checkpoint evaluates the held-out pairs (train_rm's command-line default)

    per = "step"
    split_batch = True  # rmjax.train.settings.check_batch_on_mesh

    @property
    def fixed_batch(self) -> int:
        return self.batch_size

    def positions(self) -> int:
        return self.sequence_tokens

    def memory_prefix(self) -> int:
        return 1

    def work_items(self) -> int:
        return self.steps

    def calls(self, cfg: ModelConfig, dtype: str, mesh, batch: int) -> list[calls.Call]:
        return calls.train_calls(cfg, dtype, mesh, **dataclasses.asdict(self))

    def per_chip_estimate(self, cfg: ModelConfig, dtype: str, chips: int, model: int) -> tuple[int, str]:
        """(bytes a chip needs, the flags that get there) with FSDP and remat, for the refusal's "cheapest that
        fit": frozen weights split over `model`; trained weights (trained in place: train_rm keeps no loaded copy),
        their gradients and Adam's two moments split over every chip; each layer's input kept for the backward pass
        and one layer's activations at a time."""
        size, total, trained = self._parameters(cfg, dtype)
        layer = 4 * cfg.hidden_size + 3 * cfg.intermediate_size
        if self.trainable == "head":  # the feature pass's forward, one layer at a time (a step holds no backbone)
            from rmjax.train.settings import TrainConfig

            rows = max(1, TrainConfig.feature_batch_size // (chips // model)) * (self.prefix_tokens + self.text_tokens
                                                                                  + self.suffix_tokens)
            activations = rows * 4 * layer
        else:  # chosen and rejected, each layer's input kept for the backward pass
            rows = 2 * max(1, self.batch_size // (chips // model)) * self.sequence_tokens
            activations = rows * 4 * (cfg.hidden_size * cfg.num_layers + layer)
        # a trained weight, its gradient and Adam's two moments; narrower than float32 (not the head), a float32
        # master copy too, and moments in float32 (rmjax.train.optimizer.float32_master)
        per_trained = 4 * size if self.trainable == "head" or size == 4 else 2 * size + 3 * 4
        loaded = total if self.trainable == "last_k" else total - trained  # last_k: the whole stack, its copy trains
        need = loaded * size / model + per_trained * trained / chips + activations
        # only the flags train_rm takes for this run (it refuses them where they change nothing: no trained
        # layers, or no data axis to split over)
        flags = ([] if self.trainable == "head" else ["--fsdp"] * (chips // model > 1) + ["--remat"])
        return int(need), " ".join([f"--mesh=data:{chips // model},model:{model}", *flags])

    def _parameters(self, cfg: ModelConfig, dtype: str) -> tuple[int, int, float]:
        """(bytes of a weight in `dtype`, parameters, trained parameters: the head, or the layers after the
        embeddings, a last_k share of them)."""
        import numpy as np

        from rmjax import nn
        from rmjax.loading.hf import numpy_dtype

        declared = nn.declarations(cfg)
        total = sum(d.size for d in declared.values())
        embed = sum(d.size for name, d in declared.items() if "embed" in name)
        trained = {"head": cfg.hidden_size * max(1, cfg.num_labels),
                   "last_k": (total - embed) * min(self.last_k, cfg.num_layers) / cfg.num_layers,
                   "full": total - embed}[self.trainable]
        return np.dtype(numpy_dtype(dtype)).itemsize, total, trained

    def resident_bytes(self, cfg: ModelConfig, dtype: str, chips: int, model: int) -> int:
        """A lower bound on what a chip holds through a step on `chips` with at most `model` on the model axis:
        every weight, and each trained one's float32 master (below float32) and Adam's two moments, split as far
        as they can be (frozen weights over `model`; trained ones and their state over every chip with FSDP, over
        `model` without). No gradient, no activation: a variant it puts past a chip's HBM cannot fit, and the
        plan does not compile it."""
        if self.trainable == "head":
            return 0
        size, total, trained = self._parameters(cfg, dtype)
        state = (4 if size < 4 else 0) + 2 * 4  # the master copy, the moments (rmjax.train.optimizer)
        return int((total - trained) * size / model + trained * (size + state) / (chips if self.fsdp else model))

    def variants(self, fsdp: str, remat: str) -> list[TrainShape]:
        """The shapes a plan tries in turn (`auto`: without first, then with; FSDP before remat)."""
        out = []
        choices = {"auto": (False, True), "true": (True,), "false": (False,)}
        for f in choices[fsdp]:
            for r in choices[remat]:
                out.append(dataclasses.replace(self, fsdp=f, remat=r))
        return sorted(out, key=lambda s: (s.remat, s.fsdp))


@dataclasses.dataclass(frozen=True)
class ScoreShape:
    prompts: int
    prefix_tokens: int
    suffix_tokens: int
    texts: int
    text_tokens: int
    batch_size: int

    per = "text"

    @property
    def fixed_batch(self) -> int:
        return self.batch_size

    def positions(self) -> int:
        return self.text_tokens + self.suffix_tokens

    def memory_prefix(self) -> int:
        return self.prefix_tokens

    def work_items(self) -> int:
        return self.prompts * self.texts

    def calls(self, cfg: ModelConfig, dtype: str, mesh, batch: int) -> list[calls.Call]:
        return calls.score_calls(cfg, dtype, mesh, prompts=self.prompts, prefix_tokens=self.prefix_tokens,
                                 suffix_tokens=self.suffix_tokens, texts=self.texts, text_tokens=self.text_tokens,
                                 batch_size=batch)


@dataclasses.dataclass(frozen=True)
class AuditShape:
    """The audit's conversations as score_conversations scores them (each distinct one once): the prompts with
    CACHED_PROMPT_ROWS responses or more after their cached prefix, the others' conversations whole."""

    prompts: int  # prompts scored after a cached prefix
    prefix_tokens: int  # the longest of their prefixes
    suffix_tokens: int
    texts: int  # the most responses one of them has
    text_tokens: int  # the longest response among them
    whole_texts: int  # conversations scored whole
    whole_tokens: int  # the longest of them
    batch_size: int

    per = "conversation"

    @property
    def fixed_batch(self) -> int:
        return self.batch_size

    def positions(self) -> int:
        return max(self.text_tokens + self.suffix_tokens, self.whole_tokens)

    def memory_prefix(self) -> int:
        return self.prefix_tokens

    def work_items(self) -> int:
        return self.prompts * self.texts + self.whole_texts

    def calls(self, cfg: ModelConfig, dtype: str, mesh, batch: int) -> list[calls.Call]:
        made = calls.score_calls(cfg, dtype, mesh, prompts=self.prompts, prefix_tokens=self.prefix_tokens,
                                 suffix_tokens=self.suffix_tokens, texts=self.texts, text_tokens=self.text_tokens,
                                 batch_size=batch) if self.prompts else []
        if self.whole_texts:
            made += calls.whole_calls(cfg, dtype, mesh, texts=self.whole_texts, tokens=self.whole_tokens,
                                      batch_size=batch)
        return made


@dataclasses.dataclass(frozen=True)
class LogprobsShape:
    prompts: int
    prefix_tokens: int

    per = "prompt"

    @property
    def fixed_batch(self) -> int:  # every prompt in one forward
        return self.prompts

    def positions(self) -> int:
        return self.prefix_tokens

    def memory_prefix(self) -> int:
        return 1

    def work_items(self) -> int:
        return self.prompts

    def calls(self, cfg: ModelConfig, dtype: str, mesh, batch: int) -> list[calls.Call]:
        return calls.logprobs_calls(cfg, dtype, mesh, prompts=self.prompts, prefix_tokens=self.prefix_tokens)


@dataclasses.dataclass(frozen=True)
class InspectShape:
    items: int
    tokens: int  # each conversation: prompt, response and the template's tail
    steps: int
    batch_size: int

    per = "response"

    @property
    def fixed_batch(self) -> int:
        return self.batch_size

    def positions(self) -> int:
        return self.tokens

    def memory_prefix(self) -> int:
        return 1

    def work_items(self) -> int:
        return self.items

    def calls(self, cfg: ModelConfig, dtype: str, mesh, batch: int) -> list[calls.Call]:
        return calls.inspect_calls(cfg, dtype, mesh, items=self.items, tokens=self.tokens, steps=self.steps,
                                   batch_size=batch)
