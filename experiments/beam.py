"""Best and worst N-token responses: beam search over the vocabulary at every depth, or exhaustive enumeration.

python -m experiments.beam --model=elo-rm-smollm2-135m --prompts=greatest --depth=2 --beam=64 \
    --direction=both --top=100 --out=results/beam.csv [--token_ids=… | --vocab_file=words.txt] [--limit=N] \
    [--from_sweep=SWEEP_CSV] [--exhaustive] [--batch_size=0 (auto)] [--chunk_size=4096] [--mesh=data:8,model:1]

Rows: `depth, direction, rank, ids, tokens, decoded, <one score column per prompt>`; with several prompts the
beam ranks by their mean reward. Re-running the same command after a crash resumes from the last chunk. Before
the first forward it prints an estimate of the whole job (every depth and direction); the progress line keeps it.
"""

from __future__ import annotations

import sys

from absl import flags

from experiments import candidates, common, config_flags
from rmjax.search.beam import BeamConfig

OUT = flags.DEFINE_string("out", "results/beam.csv", "Output CSV; a .meta.json is written beside it.")
VOCAB_FILE = flags.DEFINE_string("vocab_file", None,
                                 "Candidate set from a text file, one string per line taken verbatim (' cat' and "
                                 "'cat' are different tokens); lines that are not exactly one token are skipped "
                                 "(counted in .meta.json).")
LIMIT = flags.DEFINE_integer("limit", None, "Keep only the first N candidates, as experiments.sweep --limit does (of "
                             "the vocabulary: token ids 0..N-1; or of --token_ids / --vocab_file).", lower_bound=1)
FROM_SWEEP = flags.DEFINE_string("from_sweep", None,
                                 "A finished token-mode experiments.sweep CSV (with its .meta.json) of the same model, "
                                 "dtype, output column, template and prompts (it may hold more): depth 1 reads its "
                                 "scores instead of scoring the candidates. Another run's sweep or an incomplete one "
                                 "is refused before the model loads.")
SHOW = flags.DEFINE_integer("show", 5, "Sequences printed per depth and direction at the end.", lower_bound=0)
BEAM_CONFIG = config_flags.define(BeamConfig, skip=("template",))
flags.adopt_module_key_flags(common)
flags.adopt_module_key_flags(candidates)
flags.adopt_module_key_flags(config_flags)


def main(argv):
    del argv
    from rmjax.errors import UsageError
    from rmjax.parallel import distributed
    from rmjax.runs import results
    from rmjax.runs.chunks import store_dir
    from rmjax.search import beam_job
    from rmjax.search.sweep import check_batch_size, sweep_identity
    from rmjax.text import candidates as candidate_set
    from rmjax.text import prompts as prompt_lib
    from rmjax.text.candidates import candidate_count

    prompts = prompt_lib.resolve_prompts(common.PROMPTS.value, common.PROMPT.value)
    prompt_lib.check_prompt_names(prompts, results.NON_VALUE_COLUMNS)
    cfg = BEAM_CONFIG(template=common.TEMPLATE.value)
    token_ids = candidates.token_ids()
    if token_ids is not None and VOCAB_FILE.value:
        raise UsageError("give the candidate set once: --token_ids or --vocab_file, not both.")
    lines = candidate_set.read_vocab_file(VOCAB_FILE.value) if VOCAB_FILE.value else None
    if cfg.exhaustive and token_ids is None and lines is None and LIMIT.value is None:
        raise UsageError("--exhaustive enumerates |S|^depth sequences: give a small candidate set S with --token_ids, "
                         "--vocab_file or --limit (the whole vocabulary is what the beam is for).")
    requested = candidate_set.identity_of_candidates(token_ids, lines)
    from_sweep = None
    if FROM_SWEEP.value:  # refused now, before the model loads, if it is not this beam's depth 1
        beam_job.read_sweep(FROM_SWEEP.value, sweep_identity(common.fingerprint(), dtype=common.DTYPE.value,
                                                         output_column=common.OUTPUT_COLUMN.value, prompts=prompts,
                                                         template=cfg.template))
        from_sweep = results.file_sha1(FROM_SWEEP.value)
    identity = beam_job.beam_identity(common.fingerprint(), dtype=common.DTYPE.value, prompts=prompts, cfg=cfg,
                                  output_column=common.OUTPUT_COLUMN.value, candidates=requested, limit=LIMIT.value,
                                  from_sweep=from_sweep)
    with common.claim_output(OUT.value, identity, store=store_dir(OUT.value)) as claim:
        if not claim.reuse:
            plan, plan_memory = candidates.memory_planner(prompts, token_ids, response_tokens=cfg.depth)

            def before_weights(config, tokenizer, mesh) -> None:
                plan_memory(config, tokenizer, mesh)
                if candidates.BATCH_SIZE.value:  # an explicit batch beyond the candidates is refused too
                    given = token_ids if lines is None else lines  # a line gives at most one candidate
                    check_batch_size(candidates.BATCH_SIZE.value,
                                     candidate_count(config, tokenizer, given, LIMIT.value), mesh)

            model = common.load_model(before_weights=before_weights)
            extra, ids = {}, token_ids
            if lines is not None:
                ids, skipped = candidate_set.words_to_ids(model.tokenizer, lines)
                if not len(ids):
                    raise UsageError(f"--vocab_file={VOCAB_FILE.value}: none of its {len(lines)} lines is a single "
                                     "token of this tokenizer.")
                extra["vocab_file"] = {"path": VOCAB_FILE.value, "lines": len(lines), "single_tokens": len(ids),
                                       "skipped": len(skipped), "first_skipped": skipped[:10]}
                if distributed.is_main():
                    print(f"--vocab_file: {len(ids)} of {len(lines)} lines are single tokens", file=sys.stderr)
            beam_job.run_beam(model, prompts, cfg, ids, out=OUT.value, requested=requested, limit=LIMIT.value,
                          from_sweep=FROM_SWEEP.value, batch_size=plan.batch_size,
                          chunk_size=candidates.CHUNK_SIZE.value, overwrite=common.OVERWRITE.value,
                          allow_nonfinite=common.ALLOW_NONFINITE.value, extra_meta=extra)
    if distributed.is_main():
        print(beam_job.summary(OUT.value, SHOW.value))
        print(f"wrote {OUT.value} and {results.meta_path(OUT.value)}")


if __name__ == "__main__":
    common.run(main)
