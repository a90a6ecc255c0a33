"""Score every vocabulary token as the whole assistant response to each prompt.

python -m experiments.sweep --model=SPEC --prompts=greatest,best,worst --out=results/scores.csv \
    [--mode=token|text] [--token_ids=1,2,3 | --limit=N] [--batch_size=256] [--dtype=float32] \
    [--mesh=data:8,model:1]

Re-running the same command after a crash resumes from the last completed chunk.
"""

from __future__ import annotations

from absl import app, flags

from experiments import common
from rmjax import distributed, report
from rmjax import prompts as prompt_lib
from rmjax.sweep import sweep

OUT = flags.DEFINE_string("out", "results/scores.csv", "Output CSV; a .meta.json is written beside it.")
MODE = flags.DEFINE_enum("mode", "token", ["token", "text"],
                         "token: exact token id as the response (prefix-cached); text: decode, template, "
                         "re-tokenize (compatible with the published CSVs).")
TOKEN_IDS = flags.DEFINE_list("token_ids", None, "Score only these token ids.")
LIMIT = flags.DEFINE_integer("limit", None, "Score only the first N candidates.")
BATCH_SIZE = flags.DEFINE_integer("batch_size", 256, "Candidates per forward pass (over all devices).")
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
    model = common.load_model()
    token_ids = [int(t) for t in TOKEN_IDS.value] if TOKEN_IDS.value else None
    sweep(model, prompts, token_ids, limit=LIMIT.value, mode=MODE.value, batch_size=BATCH_SIZE.value,
          chunk_size=CHUNK_SIZE.value, template=common.TEMPLATE.value, out=OUT.value,
          text_add_special_tokens=TEXT_SPECIAL.value)
    if not distributed.is_main():
        return
    print(report.summarize_table(OUT.value, TOP.value))
    if PLOT.value:
        print(f"figure: {report.plot_distributions(OUT.value)}")


if __name__ == "__main__":
    app.run(main)
