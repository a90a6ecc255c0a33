"""Compile a job for a TPU slice on this machine (no TPU needed) and know its memory and time before paying for it.

python -m experiments.plan --model=Skywork/Skywork-Reward-Llama-3.1-8B-v0.2 --topology=v5e-8 --job=sweep \
    --prompts=paper1 --dtype=bfloat16 --out=plans/sweep.json

--model is a zoo hub id or nickname (rmjax.zoo), a checkpoint folder, a config.json or a builtin name: only the
config (and a tokenizer, when there is one) is read, never the weights. Without --mesh the plan picks the mesh and
batch size that fit and are fastest by its estimate, and says why. What the job itself would refuse (a context too
short for its positions, an exhaustive beam too large for the host, a batch past its candidates, a config no model
can have) and an --out that cannot be written are refused first, by the job's own checks, before anything compiles.
A job that does not fit exits with status 2 and one line naming the cheapest Cloud slices that would. Needs libtpu:
pip install "jax[tpu]==<the pinned jax>".
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the plan runs here; the slice's devices come from libtpu

from absl import flags  # noqa: E402

from experiments import common  # noqa: E402
from rmjax.audit.batteries import BATTERIES  # noqa: E402
from rmjax.plan.planner import JOBS  # noqa: E402
from rmjax.plan.spec import JOBS_SIZED_BY  # noqa: E402
from rmjax.train.settings import COMMAND_LINE_DEFAULTS  # noqa: E402

TOPOLOGY = flags.DEFINE_string("topology", "v5e:2x4", "TPU slice: libtpu's name (v5e:2x4) or Cloud TPU's (v5e-8); "
                               "chips v4, v5e, v5p, v6e.")
JOB = flags.DEFINE_enum("job", "sweep", list(JOBS), "The job to plan.")
OUT = flags.DEFINE_string("out", None, "Write the plan here (JSON).")
LIMIT = flags.DEFINE_integer("limit", 0, "sweep, beam: candidates (0: the whole vocabulary).", lower_bound=0)
BATCH_SIZE = flags.DEFINE_integer("batch_size", 0, "sweep, beam: candidates per call (0: the largest that fits); "
                                  "gcg: evaluation rows per call, score: texts per call, train_rm: pairs per step "
                                  "(0: 256); inspect: path points per call (0: 16); audit: conversations per call "
                                  "(0: 64).",
                                  lower_bound=0)
PREFIX_TOKENS = flags.DEFINE_integer("prefix_tokens", 0, "Prompt prefix length in tokens (0: measured with the "
                                     "model's tokenizer and template, or 64 when it has none).", lower_bound=0)
SUFFIX_TOKENS = flags.DEFINE_integer("suffix_tokens", -1, "Template tokens after the response (-1: measured, or 8).",
                                     lower_bound=-1)
TRAINABLE = flags.DEFINE_enum("trainable", "head", ["head", "last_k", "full"], "train_rm: what trains.")
LAST_K = flags.DEFINE_integer("last_k", 2, "train_rm: layers trained with --trainable=last_k.", lower_bound=1)
STEPS = flags.DEFINE_integer("steps", 0, "train_rm: optimizer steps (0: 1500); gcg: steps (0: 100).",
                             lower_bound=0)
DEPTH = flags.DEFINE_integer("depth", 2, "beam: response length in tokens.", lower_bound=1)
BEAM = flags.DEFINE_integer("beam", 64, "beam: partials kept per direction (K).", lower_bound=1)
DIRECTION = flags.DEFINE_enum("direction", "both", ["optimal", "pessimal", "both"], "beam: which beams.")
EXHAUSTIVE = flags.DEFINE_bool("exhaustive", False, "beam: score every sequence of the candidates.")
NUM_TOKENS = flags.DEFINE_integer("num_tokens", 8, "gcg: response length in tokens.", lower_bound=1)
SEARCH_WIDTH = flags.DEFINE_integer("search_width", 128, "gcg: candidates evaluated per step.", lower_bound=1)
AUDIT_BATTERIES = flags.DEFINE_list("batteries", list(BATTERIES),
                                    "audit: its batteries (length joins identity or sycophancy, as in the audit).")
LM = flags.DEFINE_string("lm", "", "beam, gcg: the completion check's causal LM (the job's --lm, of the RM's "
                         "tokenizer), loaded beside the RM for the whole job: its weights count in every call.")
BUFFER_SIZE = flags.DEFINE_integer("buffer_size", 8, "gcg: best sequences kept (the completion check "
                                   "continues each).", lower_bound=1)
FSDP = flags.DEFINE_enum("fsdp", "auto", ["auto", "true", "false"], "train_rm: shard the trained weights and Adam's "
                         "moments over data (auto: only when the replicated state does not fit).")
REMAT = flags.DEFINE_enum("remat", "auto", ["auto", "true", "false"], "train_rm: recompute each layer in the "
                          "backward pass (auto: only when FSDP alone does not fit).")
TEXTS = flags.DEFINE_integer("texts", 7530, "score: response texts per prompt (EloEverything's items).",
                             lower_bound=1)
TEXT_TOKENS = flags.DEFINE_integer("text_tokens", 8, "score, inspect, train_rm --trainable=head (its feature pass): "
                                   "tokens per response text.", lower_bound=1)
ITEMS = flags.DEFINE_integer("items", 4, "inspect: responses inspected (inspect's default --top=2 inspects 2 best "
                             "and 2 worst).", lower_bound=1)
IG_STEPS = flags.DEFINE_integer("ig_steps", 64, "inspect: integrated-gradients steps (as experiments.inspect "
                                "--steps; its refinement may spend up to --ig_max_evaluations, 1024, a response: "
                                "give that for the longest run).", lower_bound=1)
N_TRAIN = flags.DEFINE_integer("n_train", 20000, "train_rm: training pairs.", lower_bound=1)
N_HELDOUT = flags.DEFINE_integer("n_heldout", 4000, "train_rm: held-out pairs (last_k/full: made before the steps and "
                                 "held through them, evaluated at each checkpoint).", lower_bound=1)
CHECKPOINT_EVERY = flags.DEFINE_integer("checkpoint_every", COMMAND_LINE_DEFAULTS["checkpoint_every"],
                                        "train_rm: steps between checkpoints, each evaluating the held-out pairs.",
                                        lower_bound=1)
HELDOUT_RESPONSES = flags.DEFINE_integer("heldout_responses", 0, "train_rm, last_k/full: the held-out pairs' distinct "
                                         "responses (0: EloEverything's, two a pair, at most its 1,506 held-out "
                                         "items).", lower_bound=0)
RESPONSES = flags.DEFINE_integer("responses", 0, "train_rm: distinct responses (head only: the feature matrix's "
                                 "rows, training and held-out pairs' both; last_k: the training pairs' responses, "
                                 "whose states below the trained layers are kept where they pay). 0: EloEverything's, "
                                 "7,530 items for head, their 80% (6,024) in training for last_k.", lower_bound=0)
SEQUENCE_TOKENS = flags.DEFINE_integer("sequence_tokens", 0, "train_rm, last_k/full: tokens per conversation "
                                       "(0: the --prompts' prefix, measured or --prefix_tokens, and 32 response "
                                       "tokens). The prefix goes through last_k's frozen layers once, and the trained "
                                       "ones once a step, as train_rm does, when it is shorter.", lower_bound=0)
for _name in ("model", "dtype", "mesh", "prompts", "prompt", "template", "overwrite"):
    flags.declare_key_flag(_name)


def check_flags() -> None:
    """What the plan refuses from its flags alone: first thing in main, and where a launch reads its line."""
    common.refuse_system_prompt("plan", "sizes conversations with the chat template's own system turn")
    from rmjax.errors import UsageError
    from rmjax.plan.spec import slice_and_mesh

    if OUT.value and not OUT.value.strip():  # --out=' ' wrote the plan to a file named ' ' (--out= writes none)
        raise UsageError(f"--out={OUT.value!r} is blank; give the file to write the plan to, or leave --out out.")
    for name, jobs in JOBS_SIZED_BY.items():
        if JOB.value not in jobs:
            common.refuse_given(f"plan --job={JOB.value}", (name,), f"does not read it (--{name} sizes "
                                f"{' and '.join(jobs)})")
    if JOB.value == "audit":
        common.refuse_given("plan --job=audit", ("prompts", "prompt"), "sizes the batteries' own prompts")
    if JOB.value == "train_rm":  # a head-only run's feature pass reads responses; the others, whole conversations
        unread = ("sequence_tokens", "heldout_responses") if TRAINABLE.value == "head" else ("text_tokens",)
        common.refuse_given(f"plan --job=train_rm --trainable={TRAINABLE.value}", unread, "does not read it "
                            "(--text_tokens sizes a head-only run's feature pass, --sequence_tokens and "
                            "--heldout_responses the others' steps: a head-only run's held-out responses are rows of "
                            "--responses)")
    slice_and_mesh(TOPOLOGY.value, common.MESH.value)  # the slice and the mesh over it, before the model is read
    if JOB.value == "train_rm":
        _note_warmup()


def _note_warmup() -> None:
    """The plan takes no --warmup_steps (it changes no memory or time), but train_rm refuses --steps at or below
    its warmup: say so, rather than plan a command that is then refused."""
    import sys

    steps, warmup = STEPS.value or COMMAND_LINE_DEFAULTS["steps"], COMMAND_LINE_DEFAULTS["warmup_steps"]
    if steps <= warmup:
        print(f"note: train_rm refuses --steps={steps} with its default --warmup_steps={warmup} (the learning rate "
              f"would never peak): unless it is given one, run it with --warmup_steps below {steps}, e.g. "
              f"--warmup_steps={steps // 10}.", file=sys.stderr)


def main(argv):
    del argv
    import os
    from pathlib import Path

    from rmjax.errors import UsageError
    from rmjax.plan.planner import describe, plan, write
    from rmjax.plan.spec import plan_inputs, stored_itemsize
    from rmjax.runs.paths import check_writable

    check_flags()
    if OUT.value:  # before anything compiles: a folder or an unwritable place is refused now
        check_writable(OUT.value, "--out")
        model, out = Path(os.path.realpath(common.MODEL.value)), Path(os.path.realpath(OUT.value))
        if model.exists() and (out == model or model in out.parents):  # --overwrite wrote over its config.json
            raise UsageError(f"--out={OUT.value} would write {out}, inside the model this plan reads "
                             f"(--model={common.MODEL.value}); choose an output outside it.")
        if Path(OUT.value).exists() and not common.OVERWRITE.value:
            raise UsageError(f"--out={OUT.value} exists; pass --overwrite to replace it, or choose another --out.")

    cfg, piece, shape, mesh = plan_inputs(
        common.MODEL.value, TOPOLOGY.value, JOB.value, mesh=common.MESH.value, prompts=common.PROMPTS.value,
        extra_prompts=common.PROMPT.value, template=common.TEMPLATE.value, limit=LIMIT.value,
        prefix_tokens=PREFIX_TOKENS.value, suffix_tokens=SUFFIX_TOKENS.value, trainable=TRAINABLE.value,
        last_k=LAST_K.value, steps=STEPS.value, batch_size=BATCH_SIZE.value, n_train=N_TRAIN.value,
        n_heldout=N_HELDOUT.value, heldout_responses_count=HELDOUT_RESPONSES.value,
        checkpoint_every=CHECKPOINT_EVERY.value, responses=RESPONSES.value, sequence_tokens=SEQUENCE_TOKENS.value,
        depth=DEPTH.value, beam=BEAM.value,
        direction=DIRECTION.value, exhaustive=EXHAUSTIVE.value, num_tokens=NUM_TOKENS.value,
        search_width=SEARCH_WIDTH.value, buffer_size=BUFFER_SIZE.value, lm=LM.value,
        batteries=tuple(AUDIT_BATTERIES.value),
        texts_count=TEXTS.value,
        text_tokens=TEXT_TOKENS.value,
        items=ITEMS.value, ig_steps=IG_STEPS.value, output_column=common.OUTPUT_COLUMN.value,
        column_chosen=common.OUTPUT_COLUMN.present)
    stored = (stored_itemsize(common.MODEL.value), stored_itemsize(LM.value) if LM.value else None)
    result = plan(cfg, common.DTYPE.value, piece, JOB.value, shape, mesh, BATCH_SIZE.value or None, fsdp=FSDP.value,
                  remat=REMAT.value, stored=stored)
    print(describe(result))
    if OUT.value:
        print(f"plan written to {write(result, OUT.value)}")


if __name__ == "__main__":
    common.run(main)
