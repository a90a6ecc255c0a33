"""Score every vocabulary token as the whole assistant response to each prompt.

python -m experiments.sweep --model=SPEC --prompts=greatest,best,worst --out=results/scores.csv \
    [--mode=token|text] [--token_ids=1,2,3 | --limit=N] [--batch_size=0 (auto)] [--dtype=float32] \
    [--mesh=data:8,model:1]

Re-running the same command after a crash resumes from the last completed chunk.
"""

from __future__ import annotations

import sys

from absl import app, flags

from experiments import common
from rmjax import distributed, report
from rmjax import prompts as prompt_lib
from rmjax.sweep import memory_plan, sweep

OUT = flags.DEFINE_string("out", "results/scores.csv", "Output CSV; a .meta.json is written beside it.")
MODE = flags.DEFINE_enum("mode", "token", ["token", "text"],
                         "token: exact token id as the response (prefix-cached); text: decode, template, "
                         "re-tokenize (compatible with the published CSVs).")
TOKEN_IDS = flags.DEFINE_list("token_ids", None, "Score only these token ids.")
LIMIT = flags.DEFINE_integer("limit", None, "Score only the first N candidates.")
BATCH_SIZE = flags.DEFINE_integer("batch_size", 0, "Candidates per forward pass (over all devices); 0 picks the "
                                  "largest that fits the device memory estimate (at most 256 on CPU).")
CHUNK_SIZE = flags.DEFINE_integer("chunk_size", 4096, "Candidates per resumable chunk written to <out>.chunks/.")
TOP = flags.DEFINE_integer("top", 20, "Top and bottom tokens printed per prompt at the end.")
PLOT = flags.DEFINE_bool("plot", False, "Also write a score-distribution histogram (PNG) beside the CSV.")
TEXT_SPECIAL = flags.DEFINE_bool("text_add_special_tokens", False,
                                 "Text mode: let the tokenizer add special tokens on re-tokenization (the "
                                 "published pipeline did, giving Llama 3 a second BOS).")

flags.adopt_module_key_flags(common)


def main(argv):
    del argv
    prompts = prompt_lib.resolve_prompts(common.PROMPTS.value, common.PROMPT.value)
    plan = {}

    def plan_memory(cfg, tokenizer, mesh):
        plan["estimate"] = memory_plan(cfg, tokenizer, prompts, common.TEMPLATE.value, common.DTYPE.value, mesh,
                                       BATCH_SIZE.value or None, MODE.value)
        if distributed.is_main():
            print(f"memory plan: {plan['estimate'].describe()}", file=sys.stderr)

    model = common.load_model(before_weights=plan_memory)
    token_ids = [int(t) for t in TOKEN_IDS.value] if TOKEN_IDS.value else None
    sweep(model, prompts, token_ids, limit=LIMIT.value, mode=MODE.value, batch_size=plan["estimate"].batch_size,
          chunk_size=CHUNK_SIZE.value, template=common.TEMPLATE.value, out=OUT.value,
          text_add_special_tokens=TEXT_SPECIAL.value)
    if not distributed.is_main():
        return
    print(report.summarize_table(OUT.value, TOP.value))
    if PLOT.value:
        print(f"figure: {report.plot_distributions(OUT.value)}")


if __name__ == "__main__":
    app.run(main)
