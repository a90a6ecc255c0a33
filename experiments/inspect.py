"""Inside the reward model for one prompt: reward lens per layer, per-token reward curves, attribution to tokens
(gradient x input, integrated gradients) and activation patching, as CSVs, .meta.json and PNG figures.

python -m experiments.inspect --model=elo-rm-smollm2-135m --prompts=greatest --responses=love,war --out=results/inspect
python -m experiments.inspect --model=M --prompts=greatest --from_sweep=results/scores.csv --top=2 --out=DIR
python -m experiments.inspect --model=M --prompts=greatest --from_beam=results/beam.csv --top=1 --out=DIR

Patching takes the first response as the clean run and the last as the donor (a sweep's best and worst).
"""

from __future__ import annotations

import sys
from pathlib import Path

from absl import flags

from experiments import common

OUT = flags.DEFINE_string("out", "results/inspect", "Output folder.")
RESPONSES = common.define_texts("responses", None, "Responses as text (placed in the chat template; comma-separated, "
                                                  "each kept as typed, spaces at its ends too).")
FROM_SWEEP = flags.DEFINE_string("from_sweep", None, "A sweep CSV: inspect its --top best and worst tokens.")
FROM_BEAM = flags.DEFINE_string("from_beam", None, "A beam CSV (the --top best and worst sequences of its deepest "
                                "level, or of --depth) or a GCG result JSON (the first 2 x --top of its buffer).")
DEPTH = flags.DEFINE_integer("depth", None, "With --from_beam: the sequence length to inspect (default: the deepest).",
                             lower_bound=1)
TOP = flags.DEFINE_integer("top", 2, "With --from_sweep / --from_beam: how many best and worst.", lower_bound=1)
STEPS = flags.DEFINE_integer("steps", 64, "Integrated gradients: path points to start from (Simpson panels), refined "
                             "where the path integral does not add up.", lower_bound=1)
IG_TOLERANCE = flags.DEFINE_float("ig_tolerance", 0.05, "Integrated gradients: refine the path until the relative "
                                  "completeness gap |sum(IG) - (R(x) - R(baseline))| / |R(x) - R(baseline)| is "
                                  "within this.", lower_bound=0.0)
IG_MAX_EVALUATIONS = flags.DEFINE_integer("ig_max_evaluations", 1024, "Integrated gradients: gradient evaluations "
                                          "per response at most (the refinement stops there, with a warning).",
                                          lower_bound=2)
BATCH_SIZE = flags.DEFINE_integer("batch_size", 16, "Integrated gradients: path points per call (at most 1024; "
                                  "activation patching: twice as many patches).", lower_bound=1)
BASELINE = flags.DEFINE_enum("baseline", "pad", ["pad", "zero"], "Integrated-gradients baseline embedding at every "
                             "position but the template's special tokens (BOS, turn markers), which keep their own "
                             "rows (pad: the pad token's row; zero: completeness is poor on RMSNorm models).")
flags.adopt_module_key_flags(common)


def _responses_given() -> list[str]:
    return [f for f, v in (("--responses", RESPONSES.value), ("--from_sweep", FROM_SWEEP.value),
                           ("--from_beam", FROM_BEAM.value)) if v]


def check_flags() -> None:
    """What the job refuses from its flags alone: first thing in main, and where a launch reads its line."""
    from rmjax.errors import UsageError
    from rmjax.inspect.job import check_settings

    common.check_out(OUT.value)
    prompts = common.checked_prompts()
    if prompts is not None and len(prompts) != 1:
        alone = " (--prompts defaults to greatest: pass --prompts= with --prompt)" if common.PROMPT.value else ""
        raise UsageError(f"inspect takes one prompt; got {len(prompts)} ({', '.join(prompts)}){alone}.")
    if len(_responses_given()) != 1:
        raise UsageError("give the responses one way: --responses, --from_sweep or --from_beam.")
    if RESPONSES.value:
        common.refuse_empty_responses("--responses", RESPONSES.value)
        common.refuse_given("inspect --responses", ("top", "depth"), "inspects the responses given")
    elif FROM_SWEEP.value:
        common.refuse_given("inspect --from_sweep", ("depth",), "reads one-token responses")
    check_settings(BATCH_SIZE.value, IG_TOLERANCE.value, STEPS.value, IG_MAX_EVALUATIONS.value)


def main(argv):
    del argv
    from rmjax.errors import require_file
    from rmjax.inspect import job as inspect_job
    from rmjax.parallel import distributed

    check_flags()
    prompts, given = common.resolved_prompts(), _responses_given()
    if RESPONSES.value:
        common.note_edge_spaces("--responses", RESPONSES.value)
    source = FROM_SWEEP.value or FROM_BEAM.value
    if source:
        require_file(source, f"{given[0]}={source}")
    summary = inspect_job.run_inspect(inspect_job.InspectSpec(
        common.options(OUT.value), next(iter(prompts.items())),
        responses=tuple(RESPONSES.value) if RESPONSES.value else None, source=source, top=TOP.value,
        depth=DEPTH.value, steps=STEPS.value, baseline=BASELINE.value, tolerance=IG_TOLERANCE.value,
        max_evaluations=IG_MAX_EVALUATIONS.value, batch_size=BATCH_SIZE.value, source_flag=given[0]))
    if distributed.is_main():
        for label, reward, explained, gap, evals in zip(summary["responses"], summary["reward"], summary["explained"],
                                                        summary["ig_relative_gap"], summary["ig_evaluations"],
                                                        strict=True):
            print(f"{label!r}: reward {reward:+.4f}, direct contributions explain {100 * explained:.1f}%, "
                  f"IG completeness gap {100 * gap:.2f}% ({evals} gradient evaluations)")
        there = [name for name in inspect_job.FILES if (Path(OUT.value) / name).is_file()]
        missing = [name for name in inspect_job.FILES if name not in there]  # a reused result's deleted figure
        # not "wrote": a reused result is read back, its files written by the earlier run
        print(f"results in {OUT.value}: {', '.join(there)} and {inspect_job.FILES[0]}.meta.json"
              + (f" ({', '.join(missing)} missing: rerun with --overwrite to write it again)" if missing else ""))
        if summary.get("patching") is None:  # its CSV is a header alone: said here, not only in .meta.json
            print(f"no activation patching (patching.csv holds no rows): "
                  f"{summary.get('patching_skipped') or 'it needs two responses'}.")
        for warning in summary["ig_warnings"]:  # last, where they are seen; stderr too, for logs that keep only it
            print(warning)
            print(warning, file=sys.stderr)


if __name__ == "__main__":
    common.run(main)
