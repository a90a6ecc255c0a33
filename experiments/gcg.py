"""Greedy Coordinate Gradient: an N-token response that maximizes (optimal) or minimizes (pessimal) a reward.

python -m experiments.gcg --model=elo-rm-smollm2-135m --prompts=greatest --num_tokens=8 \
    --direction=optimal --steps=100 --search_width=128 --topk=64 --n_replace=1 --seed=0 --out=results/gcg.json \
    [--token_ids=… | --vocab_file=words.txt]

Several --model values (comma-separated) and/or prompts make the objective their mean reward. The completion check
(OUT.completions.csv): each RM's own LM (or --lm) continues each buffer sequence greedily to its end of turn and
the RM scores that, per prompt: `model, rank, ids, prompt, ends_turn, completed_text, reward, completed_reward,
truncation_gain`.
"""

from __future__ import annotations

import json

from absl import flags

from experiments import common, config_flags, lm_flag, token_ids
from rmjax.search.gcg_config import GCGConfig

OUT = flags.DEFINE_string("out", "results/gcg.json", "Result JSON (+ per-step CSV and .meta.json beside it).")
# One flag per GCGConfig field (help and choices declared there; ranges, e.g. --n_replace <= --num_tokens, are
# checked when the config is built); --template and --allow_nonfinite are shared, and --token_ids is the beam's.
GCG_CONFIG = config_flags.define(GCGConfig, skip=("template", "allow_nonfinite", "token_ids"))
flags.adopt_module_key_flags(common)
flags.adopt_module_key_flags(lm_flag)
flags.adopt_module_key_flags(token_ids)
flags.adopt_module_key_flags(config_flags)  # the generated flags: --helpshort lists them


def check_flags() -> None:
    """What the job refuses from its flags alone: first thing in main, and where a launch reads its line."""
    from rmjax.search.gcg_config import check_search_width

    common.refuse_blank_models("lm")
    common.check_out(OUT.value, file=True)
    check_search_width(GCG_CONFIG(template=common.TEMPLATE.value, allow_nonfinite=common.ALLOW_NONFINITE.value,
                                  token_ids=tuple(token_ids.token_ids() or ())))  # by --topk alone, as run_gcg
    if common.MODEL.value:  # the job's own reading of its models (an empty item, a model twice)
        from rmjax.search.gcg_job import model_specs

        model_specs(common.MODEL.value)
    if flags.FLAGS["selection"].value == "greedy":  # recorded in the identity as used, changing nothing
        common.refuse_given("gcg --selection=greedy", ("seed",), "takes the best swaps by gradient, drawing "
                            "nothing at random")
    common.checked_prompts()


def main(argv):
    del argv
    from rmjax.parallel import distributed
    from rmjax.search.gcg_job import GcgSpec, run_gcg

    check_flags()
    prompts = common.resolved_prompts()
    cfg = GCG_CONFIG(template=common.TEMPLATE.value, allow_nonfinite=common.ALLOW_NONFINITE.value,
                     token_ids=tuple(token_ids.token_ids() or ()))
    run_gcg(GcgSpec(common.options(OUT.value), prompts, cfg, lm=lm_flag.LM.value))
    if distributed.is_main():
        with open(OUT.value, encoding="utf-8") as f:
            result = json.load(f)
        print(f"best {cfg.direction} response: {result['best_text']!r} reward {result['best_reward']:.4f} "
              f"({len(result['history'])} steps) -> {OUT.value}")


if __name__ == "__main__":
    common.run(main)
