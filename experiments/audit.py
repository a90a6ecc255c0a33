"""A bias audit of one reward model: counterfactual batteries (identity, length, sycophancy, framing) scored with
paired statistics over items, Holm's correction over every row, and a null beside every effect.

python -m experiments.audit --model=SPEC [--batteries=identity,length,sycophancy,framing] --out=DIR

Writes DIR/audit.csv (battery, axis, contrast, n_items, effect, ci_low, ci_high, p, p_holm, null_effect),
DIR/audit_items.csv (every scored variant: battery, axis, item, group, text, reward, prompt), DIR/audit.png and
.meta.json. The batteries ship inside rmjax (rmjax/data/audit, licence beside them); see docs/audit.md.
"""

from __future__ import annotations

from absl import flags

from experiments import common
from rmjax.audit.batteries import BATTERIES

OUT = flags.DEFINE_string("out", "results/audit", "Output folder: audit.csv, audit_items.csv, audit.png.")
BATTERIES_FLAG = flags.DEFINE_list("batteries", list(BATTERIES), f"Which batteries: any of {', '.join(BATTERIES)}.")
N_BOOT = flags.DEFINE_integer("n_boot", 2000, "Bootstrap resamples of the items per row (95% percentile CI).")
N_PERM = flags.DEFINE_integer("n_perm", 10000, "Random sign flips per row for the p-value (exact below 2^n).")
SEED = flags.DEFINE_integer("seed", 0, "Seed of the bootstraps, sign flips and label shuffles.")
BATCH_SIZE = flags.DEFINE_integer("batch_size", 64, "Conversations per forward pass.")

flags.adopt_module_key_flags(common)


def check_flags() -> None:
    """What the job refuses from its flags alone: first thing in main, and where a launch reads its line."""
    from rmjax.audit.job import check_settings, refuse_allow_nonfinite

    common.check_out(OUT.value)
    common.refuse_given("the audit", ("prompts", "prompt"), "scores its batteries' own prompts (rmjax/data/audit)")
    refuse_allow_nonfinite(common.ALLOW_NONFINITE.value)
    check_settings(tuple(BATTERIES_FLAG.value), N_BOOT.value, N_PERM.value, SEED.value, BATCH_SIZE.value)


def main(argv):
    del argv
    from rmjax.audit.job import AuditSpec, run_audit

    check_flags()
    spec = AuditSpec(common.options(OUT.value), tuple(BATTERIES_FLAG.value), N_BOOT.value, N_PERM.value,
                     SEED.value, BATCH_SIZE.value)
    run_audit(spec)


if __name__ == "__main__":
    common.run(main)
