"""Fluent optimal and pessimal whole responses (1..N tokens, each ending the turn): the reward–perplexity frontier
of one prompt, against best-of-N given the same compute (every λ's budget pooled).

python -m experiments.frontier --model=elo-rm-smollm2-135m --prompts=greatest --num_tokens=8 \
    --lambdas=0,0.25,1,4 --forwards=3000 --direction=both --out=results/frontier [--lm=LM] [--judge=LM] \
    [--sweep=SWEEP_CSV]

Writes OUT/frontier.csv (direction, lambda, method, rank, ids, text, roundtrip, ends_turn, completed_text, reward,
reward_z, prior_logp, judge_ppl, completed_reward, forwards), OUT/frontier.png and OUT/frontier.csv.meta.json.
Re-running the same command after a crash resumes from the last finished (direction, λ, method).
"""

from __future__ import annotations

from absl import flags

from experiments import common, config_flags, lm_flag
from rmjax.search.fluent import FluentConfig
from rmjax.search.frontier_job import FrontierConfig

OUT = flags.DEFINE_string("out", "results/frontier", "Output folder: frontier.csv, frontier.png, .meta.json.")
JUDGE = flags.DEFINE_string("judge", None, "The judge: a causal LM of another family (default: gemma-3-270m for a "
                            "Llama-family RM, smollm2-135m-instruct for a Gemma one).")
SWEEP = flags.DEFINE_string("sweep", None, "A finished experiments.sweep CSV of this RM and prompt: reward_z uses its "
                            "mean and SD (default: estimated from --z_sample single tokens).")
FRONTIER_CONFIG = config_flags.define(FrontierConfig)
SEARCH_CONFIG = config_flags.define(FluentConfig)
flags.adopt_module_key_flags(common)
flags.adopt_module_key_flags(lm_flag)
flags.adopt_module_key_flags(config_flags)


def check_flags() -> None:
    """What the job refuses from its flags alone: first thing in main, and where a launch reads its line."""
    from rmjax.search.frontier_job import check_one_prompt

    common.refuse_blank_models("lm", "judge")
    common.check_out(OUT.value)
    if SWEEP.value:  # --z_sample would be ignored, yet recorded in the identity as if used
        common.refuse_given("frontier --sweep", ("z_sample",), "takes reward_z's mean and SD from the sweep")
    prompts = common.checked_prompts()
    if prompts is not None:
        check_one_prompt(prompts)


def main(argv):
    del argv
    from rmjax.search.frontier_job import FrontierSpec, run_frontier

    check_flags()
    prompts = common.resolved_prompts()
    frontier, search = FRONTIER_CONFIG(), SEARCH_CONFIG()  # bad values stop here, before any model loads
    spec = FrontierSpec(common.options(OUT.value), prompts, frontier, search, lm=lm_flag.LM.value, judge=JUDGE.value,
                        sweep=SWEEP.value)
    run_frontier(spec)


if __name__ == "__main__":
    common.run(main)
