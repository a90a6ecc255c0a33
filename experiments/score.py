"""Score arbitrary response texts for each prompt with a reward model (prefix-cached).

python -m experiments.score --model=SPEC --prompts=greatest --texts=Love,Hate,"Ice cream" --out=results/texts.csv
python -m experiments.score --model=SPEC --texts_file=items.txt   # one response per line
"""

from __future__ import annotations

from pathlib import Path

from absl import flags

from experiments import common

OUT = flags.DEFINE_string("out", "results/texts.csv", "Output CSV `text, <one column per prompt>` (+ .meta.json).")
TEXTS = flags.DEFINE_list("texts", [], "Responses to score (comma-separated).")
TEXTS_FILE = flags.DEFINE_string("texts_file", None, "File with one response per line.")
BATCH_SIZE = flags.DEFINE_integer("batch_size", 256, "Responses per forward pass.", lower_bound=1)

flags.adopt_module_key_flags(common)


def read_texts() -> list[str]:
    import sys

    from rmjax.errors import MissingFileError, UsageError
    from rmjax.text.candidates import read_vocab_file

    texts = list(TEXTS.value)
    if TEXTS_FILE.value:
        path = Path(TEXTS_FILE.value)
        if not path.is_file():
            raise MissingFileError(f"--texts_file={path} not found.")
        lines = read_vocab_file(path, "--texts_file")  # lines end at '\n' only (a U+2028 inside one is no end)
        if lines.blank:
            print(f"--texts_file={path}: {lines.blank} blank or whitespace-only line{'s' * (lines.blank != 1)} "
                  "skipped.", file=sys.stderr)
        texts += lines
    if not texts:
        raise UsageError("give responses with --texts=a,b,c or --texts_file=FILE.")
    return texts


def main(argv):
    del argv
    from rmjax.parallel import distributed
    from rmjax.runs import results
    from rmjax.scoring.texts import ScoreSpec, run_score
    from rmjax.text import prompts as prompt_lib

    texts = read_texts()
    prompts = prompt_lib.resolve_prompts(common.PROMPTS.value, common.PROMPT.value)
    options = common.options(OUT.value, texts_file=TEXTS_FILE.value)
    out = run_score(ScoreSpec(options, prompts, tuple(texts), BATCH_SIZE.value))
    if not distributed.is_main():
        return
    table = results.read_scores_csv(out)
    for name in results.value_columns(table):
        ranked = table.sort_values(name, ascending=False, kind="stable").head(20)
        print(f"{name}: " + ", ".join(f"{t!r} {v:.3f}" for t, v in zip(ranked["text"], ranked[name], strict=True)))
    print(f"{len(table)} texts x {len(results.value_columns(table))} prompts -> {OUT.value}")


if __name__ == "__main__":
    common.run(main)
