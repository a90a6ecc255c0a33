"""Score arbitrary response texts for each prompt with a reward model (prefix-cached).

python -m experiments.score --model=SPEC --prompts=greatest --texts=Love,Hate,"Ice cream"   # prints, writes nothing
python -m experiments.score --model=SPEC --texts_file=items.txt --out=results/texts.csv   # one response per line

Each text's reward is printed with its z-score: SDs from the mean reward of --z_sample single tokens (seeded; the
frontier's reward_z uses the same sample, so the two agree).
"""

from __future__ import annotations

import math
from pathlib import Path

from absl import flags

from experiments import common

OUT = flags.DEFINE_string("out", None, "Output CSV `text, <one column per prompt>` (+ .meta.json); without it the "
                          "scores are printed and nothing is written.")
TEXTS = common.define_texts("texts", [], "Responses to score (comma-separated, each kept as typed, spaces at its ends "
                                        "too; quote one holding a comma, '\"a, b\",c', or use --texts_file).")
TEXTS_FILE = flags.DEFINE_string("texts_file", None, "File with one response per line (commas and quotes kept).")
Z_SAMPLE = flags.DEFINE_integer("z_sample", 2048, "Single tokens sampled (seed 0) to estimate each prompt's mean and "
                                "SD of the reward for the printed z-scores; 0: no z-scores.", lower_bound=0)
SHOW = flags.DEFINE_integer("show", 20, "Texts printed per prompt (the highest first).", lower_bound=1)
BATCH_SIZE = flags.DEFINE_integer("batch_size", 256, "Responses per forward pass.", lower_bound=1)

flags.adopt_module_key_flags(common)


def read_texts() -> list[str]:
    import sys

    from rmjax.errors import UsageError
    from rmjax.text.candidates import read_vocab_file

    texts = list(TEXTS.value)
    common.note_edge_spaces("--texts", texts)
    if TEXTS_FILE.value:
        path = Path(TEXTS_FILE.value)
        lines = read_vocab_file(path, "--texts_file")  # lines end at '\n' only (a U+2028 inside one is no end)
        if lines.blank:
            print(f"--texts_file={path}: {lines.blank} blank or whitespace-only line{'s' * (lines.blank != 1)} "
                  "skipped.", file=sys.stderr)
        if not lines:
            raise UsageError(f"--texts_file={path} holds no response (every line is blank); give one per line.")
        common.note_edge_spaces("--texts_file", list(lines))  # a trailing space is easy to miss in a file
        texts += lines
    return texts


def check_flags() -> None:
    """What the job refuses from its flags alone: first thing in main, and where a launch reads its line."""
    from rmjax.errors import UsageError
    from rmjax.scoring.texts import check_z_sample, refuse_repeated_texts

    common.check_out(OUT.value, file=True)
    common.refuse_empty_responses("--texts", list(TEXTS.value), ", or put an empty response's neighbours in "
                                  "--texts_file")  # first: two stray commas are no response given twice
    if OUT.value is None:
        common.refuse_given("score without --out", ("overwrite",), "writes nothing to replace")
    else:  # a written table's rows are keyed by their text (--texts_file's lines are read on the job's machine)
        refuse_repeated_texts(TEXTS.value)
    if not TEXTS.value and not TEXTS_FILE.value:
        raise UsageError("give responses with --texts=a,b,c or --texts_file=FILE.")
    check_z_sample(Z_SAMPLE.value)
    common.checked_result_prompts()


def main(argv):
    del argv
    from rmjax.parallel import distributed
    from rmjax.scoring.texts import ScoreSpec, run_score

    check_flags()
    texts = read_texts()
    prompts = common.resolved_prompts()
    options = common.options(OUT.value, texts_file=TEXTS_FILE.value)
    found = run_score(ScoreSpec(options, prompts, tuple(texts), BATCH_SIZE.value, Z_SAMPLE.value))
    if distributed.is_main():
        print(summary(found, texts, SHOW.value))


def summary(found, texts: list[str], show: int) -> str:
    """Per prompt, the `show` highest texts: reward, z (with the scale it came from) and the text's repr."""
    lines = []
    for name, values in found.scores.items():
        scale = found.scale[name] if found.scale else None
        head = f"{name}: reward" + (f", z = (reward - {scale[0]:.4f}) / {scale[1]:.4f} (single-token sample)"
                                     if scale else "")
        lines.append(head)
        # NaN (an --allow_nonfinite run's) last: as a sort key it leaves the finite ones out of order
        for i in sorted(range(len(texts)), key=lambda i: (math.isnan(values[i]), 0.0 if math.isnan(values[i])
                                                          else -values[i]))[:show]:
            z = f"  z {(values[i] - scale[0]) / scale[1]:+6.2f}" if scale else ""
            lines.append(f"  {values[i]:>10.4f}{z}  {texts[i]!r}")
    where = f" -> {found.out} (+ .meta.json)" if found.out else " (printed only; --out=FILE writes a CSV)"
    lines.append(f"{len(texts)} texts x {len(found.scores)} prompts{where}")
    return "\n".join(lines)


if __name__ == "__main__":
    common.run(main)
