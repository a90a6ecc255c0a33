"""Greedy Coordinate Gradient: an N-token response that maximizes (optimal) or minimizes (pessimal) a reward.

python -m experiments.gcg --model=elo-rm-smollm2-135m --prompts=greatest --num_tokens=8 \
    --direction=optimal --steps=100 --search_width=128 --topk=64 --n_replace=1 --seed=0 --out=results/gcg.json

Several --model values (comma-separated) and/or prompts make the objective their mean reward.
"""

from __future__ import annotations

import json

from absl import flags

from experiments import common

OUT = flags.DEFINE_string("out", "results/gcg.json", "Result JSON (+ per-step CSV and .meta.json beside it).")
NUM_TOKENS = flags.DEFINE_integer("num_tokens", 8, "Response length N in tokens.", lower_bound=1)
DIRECTION = flags.DEFINE_enum("direction", "optimal", ["optimal", "pessimal"], "Maximize or minimize the reward.")
STEPS = flags.DEFINE_integer("steps", 100, "GCG steps.", lower_bound=1)
SEARCH_WIDTH = flags.DEFINE_integer("search_width", 128, "Candidates evaluated per step.", lower_bound=1)
TOPK = flags.DEFINE_integer("topk", 64, "Substitutions considered per position (by gradient; at most the number "
                            "of allowed tokens).", lower_bound=1)
N_REPLACE = flags.DEFINE_integer("n_replace", 1, "Positions swapped per candidate (1..--num_tokens).", lower_bound=1)
SELECTION = flags.DEFINE_enum("selection", "random", ["random", "greedy"],
                              "random: sample swaps among the top-k; greedy: the best single swaps by gradient.")
EMBED_REG = flags.DEFINE_float("embed_reg", 0.0, "Faster-GCG embedding-distance regularizer weight.", lower_bound=0)
NO_REVISIT = flags.DEFINE_bool("forbid_revisits", True, "Never evaluate a sequence twice (history).")
BUFFER = flags.DEFINE_integer("buffer_size", 8, "Best sequences kept.", lower_bound=1)
INIT = flags.DEFINE_list("init", [], "Initial response strings (default ' x x x ...').")
PATIENCE = flags.DEFINE_integer("patience", None, "Stop after this many steps without improvement.", lower_bound=1)
SEED = flags.DEFINE_integer("seed", 0, "Random seed.")
ALLOW_SPECIAL = flags.DEFINE_bool("allow_special", False, "Allow special/control tokens in the response.")
ALLOW_NON_ASCII = flags.DEFINE_bool("allow_non_ascii", False, "Allow non-ASCII tokens in the response.")
RETOK = flags.DEFINE_bool("retokenize_filter", True,
                          "Keep only responses that re-tokenize to the same ids inside the template.")
flags.register_multi_flags_validator(
    ["n_replace", "num_tokens"], lambda f: f["n_replace"] <= f["num_tokens"],
    message="--n_replace must be at most --num_tokens (positions swapped per candidate).")
flags.adopt_module_key_flags(common)


def main(argv):
    del argv
    from rmjax import distributed
    from rmjax import prompts as prompt_lib
    from rmjax.gcg import GCGConfig
    from rmjax.gcg_run import gcg_identity, run_gcg, steps_path

    prompts = prompt_lib.resolve_prompts(common.PROMPTS.value, common.PROMPT.value)
    cfg = GCGConfig(num_tokens=NUM_TOKENS.value, steps=STEPS.value, search_width=SEARCH_WIDTH.value,
                    topk=TOPK.value, n_replace=N_REPLACE.value, direction=DIRECTION.value,
                    selection=SELECTION.value, embed_reg=EMBED_REG.value, forbid_revisits=NO_REVISIT.value,
                    buffer_size=BUFFER.value, init=tuple(INIT.value), patience=PATIENCE.value, seed=SEED.value,
                    allow_special=ALLOW_SPECIAL.value, allow_non_ascii=ALLOW_NON_ASCII.value,
                    retokenize_filter=RETOK.value, template=common.TEMPLATE.value,
                    allow_nonfinite=common.ALLOW_NONFINITE.value)
    specs = [s for s in common.MODEL.value.split(",") if s]
    identity = gcg_identity([common.fingerprint(s) for s in specs], dtype=common.DTYPE.value, prompts=prompts,
                            output_column=common.OUTPUT_COLUMN.value, cfg=cfg)
    with common.claim_output(OUT.value, identity, owned=[steps_path(OUT.value)]) as claim:
        if not claim.reuse:
            models = [common.load_model(spec) for spec in specs]
            run_gcg(models, prompts, cfg, OUT.value, overwrite=common.OVERWRITE.value)
    if distributed.is_main():
        with open(OUT.value, encoding="utf-8") as f:
            result = json.load(f)
        print(f"best {cfg.direction} response: {result['best_text']!r} reward {result['best_reward']:.4f} "
              f"({len(result['history'])} steps) -> {OUT.value}")


if __name__ == "__main__":
    common.run(main)
