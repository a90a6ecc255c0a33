"""Greedy Coordinate Gradient: an N-token response that maximizes (optimal) or minimizes (pessimal) a reward.

python -m experiments.gcg --model=elo-rm-smollm2-135m --prompts=greatest --num_tokens=8 \
    --direction=optimal --steps=100 --search_width=128 --topk=64 --n_replace=1 --seed=0 --out=results/gcg.json \
    [--token_ids=… | --vocab_file=words.txt]

Several --model values (comma-separated) and/or prompts make the objective their mean reward.
"""

from __future__ import annotations

import json
import sys

from absl import flags

from experiments import common, config_flags, token_ids
from rmjax.search.gcg_config import GCGConfig, check_search_width
from rmjax.search.gcg_start import init_from_rows

OUT = flags.DEFINE_string("out", "results/gcg.json", "Result JSON (+ per-step CSV and .meta.json beside it).")
# One flag per GCGConfig field (help and choices declared there; ranges, e.g. --n_replace <= --num_tokens, are
# checked when the config is built); --template and --allow_nonfinite are shared, and --token_ids is the beam's.
GCG_CONFIG = config_flags.define(GCGConfig, skip=("template", "allow_nonfinite", "token_ids"))
flags.adopt_module_key_flags(common)
flags.adopt_module_key_flags(token_ids)
flags.adopt_module_key_flags(config_flags)  # the generated flags: --helpshort lists them


def main(argv):
    del argv
    from rmjax.parallel import distributed
    from rmjax.search.gcg_job import gcg_identity, run_gcg, steps_path
    from rmjax.text import prompts as prompt_lib

    prompts = prompt_lib.resolve_prompts(common.PROMPTS.value, common.PROMPT.value)
    ids = token_ids.token_ids()
    cfg = GCG_CONFIG(template=common.TEMPLATE.value, allow_nonfinite=common.ALLOW_NONFINITE.value,
                     token_ids=tuple(ids or ()))
    check_search_width(cfg)  # by --topk alone now; by the tokens allowed once the vocabulary is checked
    if cfg.init_from:  # a file that is not a beam CSV of this search stops the job now
        init_from_rows(cfg)
    specs = [s for s in common.MODEL.value.split(",") if s]
    identity = gcg_identity([common.fingerprint(s) for s in specs], dtype=common.DTYPE.value, prompts=prompts,
                            output_column=common.OUTPUT_COLUMN.value, cfg=cfg)
    with common.claim_output(OUT.value, identity, owned=[steps_path(OUT.value)]) as claim:
        if not claim.reuse:
            # ids past a model's vocabulary (--token_ids, --init_from) stop the job before its weights load
            def in_vocabulary(config, *_) -> None:
                token_ids.check_in_vocabulary(ids, config.vocab_size)
                if cfg.init_from:
                    init_from_rows(cfg, config.vocab_size)

            models = [common.load_model(spec, lambda *a: (in_vocabulary(*a), plan_search(cfg, prompts, *a)))
                      for spec in specs]
            run_gcg(models, prompts, cfg, OUT.value, overwrite=common.OVERWRITE.value)
    if distributed.is_main():
        with open(OUT.value, encoding="utf-8") as f:
            result = json.load(f)
        print(f"best {cfg.direction} response: {result['best_text']!r} reward {result['best_reward']:.4f} "
              f"({len(result['history'])} steps) -> {OUT.value}")


def plan_search(cfg: GCGConfig, prompts: dict[str, str], config, tokenizer, mesh) -> None:
    """--num_tokens against the context, --search_width against what a step can sample, and the search's memory,
    checked for each model before its weights load (rmjax.search.gcg_config.search_plan); prints the plan."""
    from rmjax.parallel import distributed
    from rmjax.search.gcg_config import search_plan

    if tokenizer is None:
        return  # make_target names the missing tokenizer
    plan = search_plan(cfg, config, tokenizer, prompts, common.DTYPE.value, mesh)
    if distributed.is_main():
        print(f"memory plan: {plan.describe()}", file=sys.stderr)


if __name__ == "__main__":
    common.run(main)
