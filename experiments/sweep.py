"""Score every vocabulary token as the whole assistant response to each prompt.

python -m experiments.sweep --model=SPEC --prompts=greatest,best,worst --out=results/scores.csv \
    [--mode=token|text] [--token_ids=1,2,3 | --vocab_file=words.txt] [--limit=N] [--batch_size=0 (auto)] \
    [--dtype=float32] [--mesh=data:8,model:1] [--overwrite] [--allow_nonfinite]

Re-running the same command after a crash resumes from the last completed chunk; re-running it after
it finished reuses the result. Another run's result at --out is refused unless --overwrite.
"""

from __future__ import annotations

from absl import flags

from experiments import candidates, common
from experiments.candidates import CHUNK_SIZE

OUT = flags.DEFINE_string("out", "results/scores.csv", "Output CSV; a .meta.json is written beside it.")
MODE = flags.DEFINE_enum("mode", "token", ["token", "text"],
                         "token: exact token id as the response (prefix-cached); text: decode, template, "
                         "re-tokenize (compatible with the published CSVs).")
LIMIT = flags.DEFINE_integer("limit", None, "Score only the first N candidates.", lower_bound=1)
TOP = flags.DEFINE_integer("top", 20, "Top and bottom tokens printed per prompt at the end.", lower_bound=0)
PLOT = flags.DEFINE_bool("plot", False, "Also write a score-distribution histogram (PNG) beside the CSV.")
TEXT_SPECIAL = flags.DEFINE_bool("text_add_special_tokens", False,
                                 "Text mode: let the tokenizer add special tokens on re-tokenization (the "
                                 "published pipeline did, giving Llama 3 a second BOS).")


flags.adopt_module_key_flags(common)
flags.adopt_module_key_flags(candidates)


def check_flags() -> None:
    """What the job refuses from its flags alone: first thing in main, and where a launch reads its line."""
    common.check_out(OUT.value, file=True)
    common.checked_result_prompts()
    if MODE.value != "text":
        common.refuse_given("sweep --mode=token", ("text_add_special_tokens",), "places token ids in the template "
                            "(--text_add_special_tokens applies to --mode=text)")
    candidates.refuse_two_sets()
    candidates.refuse_limit_keeping_all(LIMIT.value)


def main(argv):
    del argv
    from rmjax.parallel import distributed
    from rmjax.runs import table_summary
    from rmjax.search.sweep import SweepSpec, plot_path, run_sweep

    check_flags()
    prompts = common.resolved_prompts()
    token_ids = candidates.token_ids()
    out = run_sweep(SweepSpec(common.options(OUT.value), prompts, None if token_ids is None else tuple(token_ids),
                              limit=LIMIT.value, vocab_file=candidates.VOCAB_FILE.value, mode=MODE.value,
                              batch_size=candidates.BATCH_SIZE.value,
                              chunk_size=CHUNK_SIZE.value, text_add_special_tokens=TEXT_SPECIAL.value,
                              plot=PLOT.value))
    if not distributed.is_main():
        return
    print(table_summary.summarize_table(out, TOP.value))
    if PLOT.value:
        print(f"figure: {plot_path(out)}")


if __name__ == "__main__":
    common.run(main)
