"""Where two reward models disagree, or a reward model and a base model's implicit reward: fluent whole responses
side A rates far above side B (and the reverse), found by the frontier's search on the gap z_A − z_B, against
best-of-N at the same forwards; with --vocab_map, every one-token response both vocabularies share.

python -m experiments.disagree --models=elo-rm-smollm2-135m,elo-rm-gemma3-270m --prompts=greatest \
    --num_tokens=8 --forwards=2000 --direction=both --out=results/disagree [--vocab_map]
python -m experiments.disagree --models=elo-rm-smollm2-135m,implicit:smollm2-135m-instruct:gemma-3-270m ...

Writes OUT/disagree.csv (prompt, direction, method, rank, text, ends_turn, completed_text, reward_a, reward_b, z_a,
z_b, gap, judge_ppl, forwards), OUT/disagree.png, OUT/vocab_map.csv (with --vocab_map) and .meta.json. Re-running
the same command after a crash resumes from the last finished (prompt, direction, method).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from absl import flags

from experiments import common, config_flags, lm_flag
from rmjax.search.disagree_config import SEARCH_DEFAULTS, DisagreeConfig
from rmjax.search.fluent import FluentConfig

MODELS = flags.DEFINE_list("models", None, "The two sides A,B: reward model specs, or for B "
                           "implicit:CHOSEN_LM:REFERENCE_LM (the chosen LM's log-prob minus the reference's).")
OUT = flags.DEFINE_string("out", "results/disagree", "Output folder: disagree.csv, disagree.png, vocab_map.csv, "
                          ".meta.json.")
JUDGE = flags.DEFINE_string("judge", None, "The judge: a causal LM of another family than side A (default: "
                            "gemma-3-270m for a Llama-family RM, smollm2-135m-instruct for a Gemma one).")
BATCH_SIZE = flags.DEFINE_integer("batch_size", 0, "One-token responses per forward in the vocabulary map and the "
                                  "z yardsticks (over all devices); 0 picks the largest that fits, at most 256.",
                                  lower_bound=0)
DISAGREE_CONFIG = config_flags.define(DisagreeConfig)
SEARCH_CONFIG = config_flags.define(FluentConfig, defaults=SEARCH_DEFAULTS)  # the library's search_config
flags.mark_flag_as_required("models")
flags.adopt_module_key_flags(common)
flags.adopt_module_key_flags(lm_flag)
flags.adopt_module_key_flags(config_flags)


def check_flags() -> None:
    """What the job refuses from its flags alone: first thing in main, and where a launch reads its line."""
    common.refuse_blank_models("lm", "judge")
    from rmjax.search.disagree_config import check_screen, parse_sides, refuse_column_read_as_lm

    common.refuse_given("disagree", ("model",), "takes its two sides from --models (side A first)")
    if not flags.FLAGS["search"].value:  # read by the search alone: given, they were recorded and ignored
        search_only = ("lm", "judge", "forwards", "lam", "repetition_penalty", "top", "front_rows", "methods",
                       *(f.name for f in dataclasses.fields(FluentConfig) if f.name in flags.FLAGS))
        common.refuse_given("disagree --nosearch", search_only, "runs only the vocabulary map, which does not read it")
    a, b = parse_sides(MODELS.value, flags.FLAGS["b_gradient"].value)
    refuse_column_read_as_lm(a, b, lm_flag.LM.value if flags.FLAGS["search"].value else None,
                             common.OUTPUT_COLUMN.value)
    check_screen(DISAGREE_CONFIG().screen, SEARCH_CONFIG().search_width)
    common.check_out(OUT.value)
    common.checked_prompts()


def main(argv):
    del argv
    from rmjax.search.disagree_config import DisagreeSpec, parse_sides
    from rmjax.search.disagree_job import run_disagree

    check_flags()
    a, b = parse_sides(MODELS.value)
    prompts = common.resolved_prompts()
    config, search = DISAGREE_CONFIG(), SEARCH_CONFIG()
    options = common.options(OUT.value)
    named = [m for side in (a, b) for m in side.models if Path(m).exists()]  # a model folder too: no output in it
    options = dataclasses.replace(options, model=a.models[0],
                                  inputs=options.inputs + tuple(("--models", m) for m in named))
    run_disagree(DisagreeSpec(options, tuple(MODELS.value), prompts, config, search, lm=lm_flag.LM.value,
                              judge=JUDGE.value, batch_size=BATCH_SIZE.value))


if __name__ == "__main__":
    common.run(main)
