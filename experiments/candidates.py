"""Flags of the jobs that score a candidate set batch by batch in resumable chunks (sweep, beam)."""

from __future__ import annotations

from absl import flags

TOKEN_IDS = flags.DEFINE_list("token_ids", None, "Score only these token ids (the candidate set).")
BATCH_SIZE = flags.DEFINE_integer("batch_size", 0, "Candidates per forward pass (over all devices); 0 picks the "
                                  "largest that fits the device memory estimate (at most 256 on CPU).", lower_bound=0)
CHUNK_SIZE = flags.DEFINE_integer("chunk_size", 4096, "Candidates per resumable chunk written to <out>.chunks/.",
                                  lower_bound=1)


def _token_ids_are_ints(values: list[str] | None) -> bool:
    bad = [v for v in values or [] if not v.strip().isdigit()]
    if bad or values == []:
        raise flags.ValidationError(f"expected non-negative integer token ids, got {bad[0] if bad else 'none'!r}")
    return True


flags.register_validator("token_ids", _token_ids_are_ints)


def token_ids() -> list[int] | None:
    return [int(t) for t in TOKEN_IDS.value] if TOKEN_IDS.value else None


class Plan:
    """The memory plan, filled in by `memory_planner`'s callback before the weights load."""

    estimate = None

    @property
    def batch_size(self) -> int:
        return self.estimate.batch_size


def memory_planner(prompts: dict[str, str], token_ids: list[int] | None, mode: str = "token",
                   response_tokens: int = 1):
    """(plan, callback for common.load_model(before_weights=…)): the callback refuses a model without a score
    head, a bad --output_column, token ids outside the vocabulary and a prompt too long for the context, then
    picks the batch size (--batch_size or what fits) and prints the plan."""
    import sys

    from experiments import common
    from rmjax import distributed
    from rmjax.errors import UsageError
    from rmjax.sweep import memory_plan, require_reward_model

    plan = Plan()

    def plan_memory(cfg, tokenizer, mesh):
        require_reward_model(cfg, common.MODEL.value)
        common.check_output_column(cfg, common.OUTPUT_COLUMN.value, common.MODEL.value)
        outside = [t for t in token_ids or [] if t >= cfg.vocab_size]
        if outside:
            raise UsageError(f"--token_ids: {outside[:5]} are outside the vocabulary [0, {cfg.vocab_size}).")
        plan.estimate = memory_plan(cfg, tokenizer, prompts, common.TEMPLATE.value, common.DTYPE.value, mesh,
                                    BATCH_SIZE.value or None, mode, response_tokens)
        if distributed.is_main():
            print(f"memory plan: {plan.estimate.describe()}", file=sys.stderr)

    return plan, plan_memory
