"""Greedy Coordinate Gradient: an N-token response that maximizes (optimal) or minimizes (pessimal) a reward.

python -m experiments.gcg --model=elo-rm-smollm2-135m --prompts=greatest --num_tokens=8 \
    --direction=optimal --steps=100 --search_width=128 --topk=64 --n_replace=1 --seed=0 --out=results/gcg.json

Several --model values (comma-separated) and/or prompts make the objective their mean reward.
"""

from __future__ import annotations

from absl import app, flags

from experiments import common
from rmjax import prompts as prompt_lib
from rmjax.gcg import GCGConfig
from rmjax.gcg_run import run_gcg

OUT = flags.DEFINE_string("out", "results/gcg.json", "Result JSON (+ per-step CSV and .meta.json beside it).")
NUM_TOKENS = flags.DEFINE_integer("num_tokens", 8, "Response length N in tokens.")
DIRECTION = flags.DEFINE_enum("direction", "optimal", ["optimal", "pessimal"], "Maximize or minimize the reward.")
STEPS = flags.DEFINE_integer("steps", 100, "GCG steps.")
SEARCH_WIDTH = flags.DEFINE_integer("search_width", 128, "Candidates evaluated per step.")
TOPK = flags.DEFINE_integer("topk", 64, "Substitutions considered per position (by gradient).")
N_REPLACE = flags.DEFINE_integer("n_replace", 1, "Positions swapped per candidate.")
SELECTION = flags.DEFINE_enum("selection", "random", ["random", "greedy"],
                              "random: sample swaps among the top-k; greedy: the best single swaps by gradient.")
EMBED_REG = flags.DEFINE_float("embed_reg", 0.0, "Faster-GCG embedding-distance regularizer weight.")
NO_REVISIT = flags.DEFINE_bool("forbid_revisits", True, "Never evaluate a sequence twice (history).")
BUFFER = flags.DEFINE_integer("buffer_size", 8, "Best sequences kept.")
INIT = flags.DEFINE_list("init", [], "Initial response strings (default ' x x x ...').")
PATIENCE = flags.DEFINE_integer("patience", None, "Stop after this many steps without improvement.")
SEED = flags.DEFINE_integer("seed", 0, "Random seed.")
ALLOW_SPECIAL = flags.DEFINE_bool("allow_special", False, "Allow special/control tokens in the response.")
ALLOW_NON_ASCII = flags.DEFINE_bool("allow_non_ascii", False, "Allow non-ASCII tokens in the response.")
RETOK = flags.DEFINE_bool("retokenize_filter", True,
                          "Keep only responses that re-tokenize to the same ids inside the template.")
flags.adopt_module_key_flags(common)


def main(argv):
    del argv
    prompts = prompt_lib.resolve_prompts(common.PROMPTS.value, common.PROMPT.value)
    cfg = GCGConfig(num_tokens=NUM_TOKENS.value, steps=STEPS.value, search_width=SEARCH_WIDTH.value,
                    topk=TOPK.value, n_replace=N_REPLACE.value, direction=DIRECTION.value,
                    selection=SELECTION.value, embed_reg=EMBED_REG.value, forbid_revisits=NO_REVISIT.value,
                    buffer_size=BUFFER.value, init=tuple(INIT.value), patience=PATIENCE.value, seed=SEED.value,
                    allow_special=ALLOW_SPECIAL.value, allow_non_ascii=ALLOW_NON_ASCII.value,
                    retokenize_filter=RETOK.value, template=common.TEMPLATE.value)
    models = [common.load_model(spec) for spec in common.MODEL.value.split(",")]
    result = run_gcg(models, prompts, cfg, OUT.value)
    print(f"best {cfg.direction} response: {result.best_text!r} reward {result.best_reward:.4f} "
          f"({len(result.history)} steps, {result.seconds:.1f} s) -> {OUT.value}")


if __name__ == "__main__":
    app.run(main)
