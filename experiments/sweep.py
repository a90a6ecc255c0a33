"""Score every vocabulary token as the whole assistant response to each prompt.

python -m experiments.sweep --model=SPEC --prompts=greatest,best,worst --out=results/scores.csv \
    [--mode=token|text] [--token_ids=1,2,3 | --limit=N] [--batch_size=0 (auto)] [--dtype=float32] \
    [--mesh=data:8,model:1] [--overwrite] [--allow_nonfinite]

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


def main(argv):
    del argv
    from rmjax.parallel import distributed
    from rmjax.runs import results, table_summary
    from rmjax.runs.chunks import store_dir
    from rmjax.search.sweep import check_batch_size, plot_path, sweep, sweep_identity
    from rmjax.text import prompts as prompt_lib
    from rmjax.text.candidates import candidate_count

    prompts = prompt_lib.resolve_prompts(common.PROMPTS.value, common.PROMPT.value)
    prompt_lib.check_prompt_names(prompts, results.NON_VALUE_COLUMNS)
    token_ids = candidates.token_ids()
    identity = sweep_identity(common.fingerprint(), dtype=common.DTYPE.value, output_column=common.OUTPUT_COLUMN.value,
                              prompts=prompts, token_ids=token_ids, limit=LIMIT.value, mode=MODE.value,
                              template=common.TEMPLATE.value, text_add_special_tokens=TEXT_SPECIAL.value)
    with common.claim_output(OUT.value, identity, owned=[plot_path(OUT.value)], store=store_dir(OUT.value)) as claim:
        if not claim.reuse:
            plan, plan_memory = candidates.memory_planner(prompts, token_ids, MODE.value)

            def before_weights(config, tokenizer, mesh) -> None:
                plan_memory(config, tokenizer, mesh)
                if candidates.BATCH_SIZE.value:  # an explicit batch beyond the candidates is refused too
                    check_batch_size(candidates.BATCH_SIZE.value,
                                     candidate_count(config, tokenizer, token_ids, LIMIT.value), mesh)

            model = common.load_model(before_weights=before_weights)
            sweep(model, prompts, token_ids, limit=LIMIT.value, mode=MODE.value,
                  batch_size=plan.batch_size, chunk_size=CHUNK_SIZE.value, template=common.TEMPLATE.value,
                  out=OUT.value, text_add_special_tokens=TEXT_SPECIAL.value, overwrite=common.OVERWRITE.value,
                  allow_nonfinite=common.ALLOW_NONFINITE.value)
        if not distributed.is_main():
            return
        print(table_summary.summarize_table(OUT.value, TOP.value))
        if PLOT.value:
            if not (claim.reuse and plot_path(OUT.value).is_file()):
                table_summary.plot_distributions(OUT.value, plot_path(OUT.value))
            print(f"figure: {plot_path(OUT.value)}")


if __name__ == "__main__":
    common.run(main)
