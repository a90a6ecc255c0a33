"""Train a reward model from a causal LM on preference pairs (Bradley–Terry), with resumable checkpoints.

python -m experiments.train_rm --model=smollm2-135m-instruct --elo=builtin \
    --trainable=head --steps=1500 --workdir=runs/elo-rm --export=runs/elo-rm/hf

Re-running the same command after a crash resumes from the last checkpoint in --workdir (by default a
folder under runs/train_rm/ derived from the model, data and settings); a workdir of another run is
refused unless --overwrite.
"""

from __future__ import annotations

from absl import flags

from experiments import common, config_flags
from rmjax.errors import UsageError
from rmjax.runs.progress import rate_text
from rmjax.train.settings import COMMAND_LINE_DEFAULTS, TrainConfig

PAIRS = flags.DEFINE_string("pairs", None, "CSV/JSONL of prompt, chosen, rejected[, label (soft, in [0,1])].")
HELDOUT_PAIRS = flags.DEFINE_string("heldout_pairs", None, "Held-out pairs file (default: 20% of --pairs' prompts, or "
                                    "of its response items when it has one prompt; never a trained response).")
ELO = flags.DEFINE_string("elo", None, "EloEverything CSV: builds pairs from human Elo ratings, split by item. "
                          "builtin: the shipped greatest-thing file (the default reward models' data); "
                          "builtin:<prompt>: another shipped file (rmjax/data/elo/<prompt>.csv).")
N_TRAIN = flags.DEFINE_integer("n_train", 20000, "EloEverything: training pairs to sample.", lower_bound=1)
N_HELDOUT = flags.DEFINE_integer("n_heldout", 4000, "EloEverything: held-out pairs (from held-out items only).",
                                 lower_bound=1)
SOFT = flags.DEFINE_bool("soft", False, "EloEverything: soft labels (the Elo probability) instead of sampled winners.")
# One flag per TrainConfig field (help and choices declared there), with command-line defaults for real runs.
TRAIN_CONFIG = config_flags.define(TrainConfig, skip=("template",), defaults=COMMAND_LINE_DEFAULTS)
WORKDIR = flags.DEFINE_string("workdir", None, "Checkpoints, logs and summary.json go here (default: "
                               "runs/train_rm/<model>-<digest of model, data and settings>).")
EXPORT = flags.DEFINE_string("export", None, "Write the trained model as a Hugging Face folder here (printed at the "
                             "end); a folder of another run is refused unless --overwrite, this run's is kept.")
HEAD_OUT = flags.DEFINE_string("head_out", None, "Write only the score head (safetensors) + recipe JSON here.")
for _name in common.LM_FLAGS:
    flags.declare_key_flag(_name)
flags.FLAGS.set_default("model", common.DEFAULT_LM)
flags.adopt_module_key_flags(config_flags)  # the generated flags: --helpshort lists them


flags.register_multi_flags_validator(
    ["pairs", "elo"], lambda f: bool(f["pairs"]) != bool(f["elo"]),
    message="give exactly one of --pairs=FILE (prompt, chosen, rejected[, label]) and --elo=EloEverything CSV "
            "(builtin: the shipped one).")
flags.register_multi_flags_validator(
    ["heldout_pairs", "pairs"], lambda f: not f["heldout_pairs"] or bool(f["pairs"]),
    message="--heldout_pairs goes with --pairs (EloEverything splits its own held-out items).")


def check_flags() -> None:
    """What the job refuses from its flags alone: first thing in main, and where a launch reads its line."""
    common.refuse_output_column("train_rm (it trains a new one-output score head)")
    for holder in (WORKDIR, EXPORT, HEAD_OUT):  # '--workdir= ' trained into a folder named ' ' ('' leaves it unset)
        if holder.value and not holder.value.strip():
            raise UsageError(f"--{holder.name}={holder.value!r} is blank; give a path, or leave --{holder.name} out.")
    common.refuse_system_prompt("train_rm", "renders its pairs with the chat template's own system turn (a "
                                "--system_prompt for training is not built yet)")
    if common.ALLOW_NONFINITE.value:  # a NaN loss or reward ends a training run: there is nothing to write anyway
        raise UsageError("--allow_nonfinite does not apply to train_rm: a NaN/Inf loss, gradient or held-out reward "
                         "stops the run (lower --learning_rate or --clip_norm instead); leave it out.")
    common.refuse_given("train_rm", ("prompts", "prompt"), "trains on its pairs' own prompts")
    cfg_flags = flags.FLAGS
    if cfg_flags["feature_batch_size"].present and cfg_flags["trainable"].value != "head":
        raise UsageError(f"--feature_batch_size applies to --trainable=head (this run trains "
                         f"{cfg_flags['trainable'].value}: no feature matrix); leave --feature_batch_size out.")
    if cfg_flags["last_k"].present and cfg_flags["trainable"].value != "last_k":
        raise UsageError(f"--last_k applies to --trainable=last_k (this run trains {cfg_flags['trainable'].value}); "
                         "leave --last_k out.")
    from rmjax.train.data import elo_csv
    from rmjax.train.recipe import check_head_out

    check_head_out(HEAD_OUT.value, cfg_flags["trainable"].value)
    if ELO.value:  # builtin:<prompt> names a shipped file (a path is read, and checked, as the job loads)
        elo_csv(ELO.value)
    if PAIRS.value:
        common.refuse_given("train_rm --pairs", ("n_train", "n_heldout", "soft"), "trains on the pairs given "
                            "(--n_train, --n_heldout and --soft build pairs from --elo)")
    cfg = TRAIN_CONFIG(template=common.TEMPLATE.value)
    from rmjax.train.settings import check_batch_on_data, check_sharding_on_data

    data = common.mesh_data_size()  # the job checks them against its mesh, before loading
    check_batch_on_data(cfg, data)
    check_sharding_on_data(cfg, data)
    if cfg.warmup_steps >= cfg.steps:  # the schedule stretched to fit: the peak learning rate was never reached
        given = "" if cfg_flags["warmup_steps"].present else ", the default"
        raise UsageError(f"--steps={cfg.steps} ends before the warmup does (--warmup_steps={cfg.warmup_steps}{given}): "
                         f"the learning rate would never reach --learning_rate; give --warmup_steps below --steps "
                         f"(e.g. --warmup_steps={max(cfg.steps // 10, 0)}).")


def main(argv):
    del argv
    from rmjax.train.recipe import train_from_data

    check_flags()
    mesh = common.start()
    cfg = TRAIN_CONFIG(template=common.TEMPLATE.value)
    result = train_from_data(common.MODEL.value, cfg, pairs=PAIRS.value, elo=ELO.value,
                             heldout_pairs=HELDOUT_PAIRS.value, n_train=N_TRAIN.value, n_heldout=N_HELDOUT.value,
                             soft=SOFT.value, workdir=WORKDIR.value, export=EXPORT.value, head_out=HEAD_OUT.value,
                             dtype=common.DTYPE.value, overwrite=common.OVERWRITE.value, mesh=mesh)
    final = result.evals[-1] if result.evals else {}
    trained = cfg.steps - (result.resumed_from or 0)
    done = f"trained {trained} steps ({rate_text(result.steps_per_second)} steps/s)" if trained else \
        f"already trained: all {cfg.steps} steps were in the workdir"
    print(f"{done}; held-out accuracy {final.get('heldout_accuracy', float('nan')):.3f}; summary in "
          f"{result.workdir}/summary.json")
    if result.export is not None:
        print(f"Hugging Face folder: {result.export}")


if __name__ == "__main__":
    common.run(main)
