"""Next-token log-probs of a causal LM after each prompt, ranked over the vocabulary.

python -m experiments.logprobs --model=smollm2-135m-instruct --prompts=greatest,best,worst \
    --out=results/logprobs.csv
"""

from __future__ import annotations

from absl import app, flags

from experiments import common
from rmjax import prompts as prompt_lib
from rmjax import report
from rmjax.logprobs import write_logprobs

OUT = flags.DEFINE_string("out", "results/logprobs.csv", "Output CSV (a .meta.json is written beside it).")
TOP = flags.DEFINE_integer("top", 20, "How many top and bottom tokens to print per prompt.")

flags.adopt_module_key_flags(common)


def main(argv):
    del argv
    prompts = prompt_lib.resolve_prompts(common.PROMPTS.value, common.PROMPT.value)
    model = common.load_model()
    path = write_logprobs(model, prompts, OUT.value, common.TEMPLATE.value)
    print(report.summarize_table(path, TOP.value, what="log-prob"))


if __name__ == "__main__":
    app.run(main)
