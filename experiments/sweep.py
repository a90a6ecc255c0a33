"""Score every vocabulary token as the whole assistant response to each prompt.

python -m experiments.sweep --model=SPEC --prompts=greatest,best,worst --out=results/scores.csv \
    [--mode=token|text] [--token_ids=1,2,3 | --limit=N] [--batch_size=0 (auto)] [--dtype=float32] \
    [--mesh=data:8,model:1] [--overwrite] [--allow_nonfinite]

Re-running the same command after a crash resumes from the last completed chunk; re-running it after
it finished reuses the result. Another run's result at --out is refused unless --overwrite.
"""

from __future__ import annotations

import sys

from absl import flags

from experiments import common

OUT = flags.DEFINE_string("out", "results/scores.csv", "Output CSV; a .meta.json is written beside it.")
MODE = flags.DEFINE_enum("mode", "token", ["token", "text"],
                         "token: exact token id as the response (prefix-cached); text: decode, template, "
                         "re-tokenize (compatible with the published CSVs).")
TOKEN_IDS = flags.DEFINE_list("token_ids", None, "Score only these token ids.")
LIMIT = flags.DEFINE_integer("limit", None, "Score only the first N candidates.", lower_bound=1)
BATCH_SIZE = flags.DEFINE_integer("batch_size", 0, "Candidates per forward pass (over all devices); 0 picks the "
                                  "largest that fits the device memory estimate (at most 256 on CPU).", lower_bound=0)
CHUNK_SIZE = flags.DEFINE_integer("chunk_size", 4096, "Candidates per resumable chunk written to <out>.chunks/.",
                                  lower_bound=1)
TOP = flags.DEFINE_integer("top", 20, "Top and bottom tokens printed per prompt at the end.", lower_bound=0)
PLOT = flags.DEFINE_bool("plot", False, "Also write a score-distribution histogram (PNG) beside the CSV.")
TEXT_SPECIAL = flags.DEFINE_bool("text_add_special_tokens", False,
                                 "Text mode: let the tokenizer add special tokens on re-tokenization (the "
                                 "published pipeline did, giving Llama 3 a second BOS).")


def _token_ids_are_ints(values: list[str] | None) -> bool:
    bad = [v for v in values or [] if not v.strip().isdigit()]
    if bad or values == []:
        raise flags.ValidationError(f"expected non-negative integer token ids, got {bad[0] if bad else 'none'!r}")
    return True


flags.register_validator("token_ids", _token_ids_are_ints)
flags.adopt_module_key_flags(common)


def main(argv):
    del argv
    from rmjax import distributed, results, table_summary
    from rmjax import prompts as prompt_lib
    from rmjax.chunks import store_dir
    from rmjax.errors import UsageError
    from rmjax.sweep import memory_plan, needs_roundtrip, plot_path, require_reward_model, sweep, sweep_identity

    prompts = prompt_lib.resolve_prompts(common.PROMPTS.value, common.PROMPT.value)
    prompt_lib.check_prompt_names(prompts, results.NON_VALUE_COLUMNS)
    token_ids = [int(t) for t in TOKEN_IDS.value] if TOKEN_IDS.value else None
    identity = sweep_identity(common.fingerprint(), dtype=common.DTYPE.value, output_column=common.OUTPUT_COLUMN.value,
                              prompts=prompts, token_ids=token_ids, limit=LIMIT.value, mode=MODE.value,
                              template=common.TEMPLATE.value, text_add_special_tokens=TEXT_SPECIAL.value)
    with common.claim_output(OUT.value, identity, owned=[plot_path(OUT.value)], store=store_dir(OUT.value)) as claim:
        if not claim.reuse or needs_roundtrip(OUT.value):  # an older result gets its roundtrip column
            plan = {}

            def plan_memory(cfg, tokenizer, mesh):
                require_reward_model(cfg, common.MODEL.value)
                common.check_output_column(cfg, common.OUTPUT_COLUMN.value, common.MODEL.value)
                outside = [t for t in token_ids or [] if t >= cfg.vocab_size]
                if outside:
                    raise UsageError(f"--token_ids: {outside[:5]} are outside the vocabulary [0, {cfg.vocab_size}).")
                plan["estimate"] = memory_plan(cfg, tokenizer, prompts, common.TEMPLATE.value, common.DTYPE.value,
                                               mesh, BATCH_SIZE.value or None, MODE.value)
                if distributed.is_main():
                    print(f"memory plan: {plan['estimate'].describe()}", file=sys.stderr)

            model = common.load_model(before_weights=plan_memory)
            sweep(model, prompts, token_ids, limit=LIMIT.value, mode=MODE.value,
                  batch_size=plan["estimate"].batch_size, chunk_size=CHUNK_SIZE.value, template=common.TEMPLATE.value,
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
