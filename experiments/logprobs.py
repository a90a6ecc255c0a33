"""Next-token log-probs of a causal LM after each prompt, ranked over the vocabulary.

python -m experiments.logprobs --model=smollm2-135m-instruct --prompts=greatest,best,worst \
    --out=results/logprobs.csv
"""

from __future__ import annotations

from absl import flags

from experiments import common

OUT = flags.DEFINE_string("out", "results/logprobs.csv", "Output CSV (a .meta.json is written beside it).")
TOP = flags.DEFINE_integer("top", 20, "How many top and bottom tokens to print per prompt.", lower_bound=0)

for _name in (*common.LM_FLAGS, "system_prompt"):  # its conversations take the system prompt as every job's
    flags.declare_key_flag(_name)
flags.FLAGS.set_default("model", common.DEFAULT_LM)


def check_flags() -> None:
    """What the job refuses from its flags alone: first thing in main, and where a launch reads its line."""
    common.refuse_output_column("logprobs (a causal LM's next-token log-probs)")
    common.check_out(OUT.value, file=True)
    common.checked_result_prompts()


def main(argv):
    del argv
    from rmjax.parallel import distributed
    from rmjax.runs import table_summary
    from rmjax.scoring.logprobs import LogprobsSpec, run_logprobs

    check_flags()
    prompts = common.resolved_prompts()
    out = run_logprobs(LogprobsSpec(common.options(OUT.value), prompts))
    if not distributed.is_main():
        return
    print(table_summary.summarize_table(out, TOP.value, what="log-prob"))


if __name__ == "__main__":
    common.run(main)
