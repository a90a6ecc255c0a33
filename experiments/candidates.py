"""Flags of the jobs that score a candidate set batch by batch in resumable chunks (sweep, beam)."""

from __future__ import annotations

from absl import flags

from experiments.token_ids import TOKEN_IDS, check_in_vocabulary, token_ids  # noqa: F401  (the jobs' candidate set)

BATCH_SIZE = flags.DEFINE_integer("batch_size", 0, "Candidates per forward pass (over all devices); 0 picks the "
                                  "largest that fits the device memory estimate (at most 256 on CPU).", lower_bound=0)
CHUNK_SIZE = flags.DEFINE_integer("chunk_size", 4096, "Candidates per resumable chunk written to <out>.chunks/.",
                                  lower_bound=1)
flags.declare_key_flag("token_ids")  # so that sweep and beam, adopting this module's flags, list it


class Plan:
    """The memory plan, filled in by `memory_planner`'s callback before the weights load."""

    estimate = None

    @property
    def batch_size(self) -> int:
        return self.estimate.batch_size


def memory_planner(prompts: dict[str, str], candidate_ids: list[int] | None, mode: str = "token",
                   response_tokens: int = 1):
    """(plan, callback for common.load_model(before_weights=…)): the callback refuses a model without a score
    head, a bad --output_column, token ids outside the vocabulary and a prompt too long for the context, then
    picks the batch size (--batch_size or what fits) and prints the plan."""
    import sys

    from experiments import common
    from rmjax.model import require_reward_model
    from rmjax.parallel import distributed
    from rmjax.search.sweep import memory_plan

    plan = Plan()

    def plan_memory(cfg, tokenizer, mesh):
        require_reward_model(cfg, common.MODEL.value)
        common.check_output_column(cfg, common.OUTPUT_COLUMN.value, common.MODEL.value)
        check_in_vocabulary(candidate_ids, cfg.vocab_size)
        plan.estimate = memory_plan(cfg, tokenizer, prompts, common.TEMPLATE.value, common.DTYPE.value, mesh,
                                    BATCH_SIZE.value or None, mode, response_tokens)
        if distributed.is_main():
            print(f"memory plan: {plan.estimate.describe()}", file=sys.stderr)

    return plan, plan_memory
