"""Best and worst N-token responses: beam search over the vocabulary at every depth, or exhaustive enumeration.

python -m experiments.beam --model=elo-rm-smollm2-135m --prompts=greatest --depth=2 --beam=64 \
    --direction=both --top=100 --out=results/beam.csv [--token_ids=… | --vocab_file=words.txt] [--limit=N] \
    [--from_sweep=SWEEP_CSV] [--exhaustive] [--batch_size=0 (auto)] [--chunk_size=4096] [--mesh=data:8,model:1]

Rows: `depth, direction, rank, ids, tokens, decoded, <one score column per prompt>`; with several prompts the
beam ranks by their mean reward. The completion check (OUT.completions.csv): the RM's own LM (or --lm) continues
each depth and direction's first 100 rows greedily to its end of turn and the RM scores that, per prompt: `depth,
direction, rank, ids, prompt, ends_turn, completed_text, reward, completed_reward, truncation_gain`. Re-running
the same command after a crash resumes from the last chunk. Before the first forward it prints an estimate of the
whole job (every depth and direction); the progress line keeps it.
"""

from __future__ import annotations

from absl import flags

from experiments import candidates, common, config_flags, lm_flag
from rmjax.search.beam import BeamConfig

OUT = flags.DEFINE_string("out", "results/beam.csv", "Output CSV; a .meta.json is written beside it.")
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
flags.adopt_module_key_flags(lm_flag)
flags.adopt_module_key_flags(candidates)
flags.adopt_module_key_flags(config_flags)


def check_flags() -> None:
    """What the job refuses from its flags alone: first thing in main, and where a launch reads its line."""
    common.refuse_blank_models("lm")
    common.check_out(OUT.value, file=True)
    common.checked_result_prompts()
    from rmjax.search.beam import check_candidate_set

    cfg = BEAM_CONFIG(template=common.TEMPLATE.value)
    if cfg.exhaustive:
        common.refuse_given("beam --exhaustive", ("beam",), "scores every sequence and keeps no beam")
    elif cfg.depth == 1:
        common.refuse_given("beam --depth=1", ("beam",), "scores every one-token response and extends none")
    check_candidate_set(cfg, bool(candidates.TOKEN_IDS.value or candidates.VOCAB_FILE.value) or LIMIT.value is not None)
    candidates.refuse_two_sets()
    candidates.refuse_limit_keeping_all(LIMIT.value)


def main(argv):
    del argv
    from rmjax.parallel import distributed
    from rmjax.runs import results
    from rmjax.search import beam_job

    check_flags()
    prompts = common.resolved_prompts()
    cfg = BEAM_CONFIG(template=common.TEMPLATE.value)
    token_ids = candidates.token_ids()
    result = beam_job.run_beam(beam_job.BeamSpec(
        common.options(OUT.value), prompts, cfg, None if token_ids is None else tuple(token_ids),
        vocab_file=candidates.VOCAB_FILE.value, limit=LIMIT.value, from_sweep=FROM_SWEEP.value,
        batch_size=candidates.BATCH_SIZE.value, chunk_size=candidates.CHUNK_SIZE.value, lm=lm_flag.LM.value))
    if distributed.is_main():
        print(beam_job.summary(OUT.value, SHOW.value))
        done = beam_job.completions_path(OUT.value)
        files = f"{OUT.value}{f', {done}' if done.is_file() else ''} and {results.meta_path(OUT.value)}"
        print(f"wrote {files}" if result is not None else f"reused {files}")  # None: a finished result, reused


if __name__ == "__main__":
    common.run(main)
