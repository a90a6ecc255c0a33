"""Score arbitrary response texts for each prompt with a reward model (prefix-cached).

python -m experiments.score --model=SPEC --prompts=greatest --texts=Love,Hate,"Ice cream" --out=results/texts.csv
python -m experiments.score --model=SPEC --texts_file=items.txt   # one response per line
"""

from __future__ import annotations

import time
from pathlib import Path

from absl import app, flags

from experiments import common
from rmjax import prompts as prompt_lib
from rmjax import results
from rmjax.textscore import score_texts

OUT = flags.DEFINE_string("out", "results/texts.csv", "Output CSV `text, <one column per prompt>` (+ .meta.json).")
TEXTS = flags.DEFINE_list("texts", [], "Responses to score (comma-separated).")
TEXTS_FILE = flags.DEFINE_string("texts_file", None, "File with one response per line.")
BATCH_SIZE = flags.DEFINE_integer("batch_size", 256, "Responses per forward pass.")

flags.adopt_module_key_flags(common)


def main(argv):
    del argv
    texts = list(TEXTS.value)
    if TEXTS_FILE.value:
        path = Path(TEXTS_FILE.value)
        if not path.is_file():
            raise app.UsageError(f"--texts_file {path} not found.")
        texts += [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not texts:
        raise app.UsageError("give responses with --texts=a,b,c or --texts_file=FILE.")
    prompts = prompt_lib.resolve_prompts(common.PROMPTS.value, common.PROMPT.value)
    model = common.load_model()
    start = time.perf_counter()
    scores = score_texts(model, prompts, texts, common.TEMPLATE.value, BATCH_SIZE.value)
    seconds = time.perf_counter() - start
    out = results.write_table(OUT.value, {"text": texts}, scores)
    results.write_meta(out, kind="score_texts", model=model.source, prompts=prompts, dtype=model.dtype,
                       n_texts=len(texts), seconds=seconds, load_seconds=model.load_seconds)
    for name, values in scores.items():
        order = values.argsort()[::-1]
        print(f"{name}: " + ", ".join(f"{texts[i]!r} {values[i]:.3f}" for i in order[:20]))
    print(f"{len(texts)} texts x {len(prompts)} prompts in {seconds:.1f} s -> {out}")


if __name__ == "__main__":
    app.run(main)
