"""Analyses of score tables: paper 1, EloEverything, Big Two (paper 2) and the implicit RM between two LMs.

python -m experiments.analyze --scores=results/scores/ --elo=builtin --out=results/analysis \
    [--models_yaml=YAML] [--frequencies=1_1_all_alpha.txt] [--bigtwo_checkpoints=DIR] \
    [--implicit_chosen=LLAMA_LOGPROBS.csv --implicit_reference=GEMMA_LOGPROBS.csv] \
    [--roundtrip_only] [--collapse_variants=none|max|mean] [--frequency_scale=log_per_million|zscore] \
    [--audits=AUDIT_DIR,AUDIT_DIR] [--disagreements=DISAGREE_DIR,DISAGREE_DIR]

Every input is optional; the analyses whose inputs are given run. Tables are written as CSV, figures
as PNG, and the headline numbers to <out>/report.md (also printed). Nothing is downloaded: `--elo=builtin`
reads the EloEverything files shipped in rmjax/data/elo, and --models_yaml and --frequencies default to the
files shipped in rmjax/data.

With both --scores and --elo, the --scores models join the published ones in every EloEverything table
and figure: a column scores the EloEverything prompt with the same text (.meta.json prompts), an item is
scored by the token that decodes to it (or to ' ' + it; roundtrip tokens only), and the items no single
token scores are counted in report.md and elo_scores_coverage.csv (rmjax.analysis.elo.add_score_tables).
"""

from __future__ import annotations

from absl import flags

from experiments import cli, config_flags
from rmjax import data as shipped
from rmjax.analysis.spec import AnalysisConfig
from rmjax.errors import UsageError

# One flag per AnalysisConfig field (help and choices declared there); the data files default to the shipped ones.
ANALYSIS_CONFIG = config_flags.define(AnalysisConfig, defaults=dict(
    models_yaml=str(shipped.REWARD_MODELS_YAML), frequencies=str(shipped.BNC_FREQUENCIES)))
OUT = flags.DEFINE_string("out", "results/analysis", "Output directory for tables, figures and report.md.")
IMPLICIT = flags.DEFINE_list("implicit", [], "Removed: its A,B order was ambiguous; use --implicit_chosen and "
                             "--implicit_reference.")
OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace an earlier analysis in --out (only the files it wrote, "
                              "listed in its analysis.json); without it --out must be empty or new.")
flags.register_validator("implicit", lambda v: not v, message="--implicit is gone (its A,B order was ambiguous): "
                         "use --implicit_chosen=X.csv --implicit_reference=Y.csv (MWLR > 0 where X gives more "
                         "probability).")
flags.adopt_module_key_flags(config_flags)  # the generated flags: --helpshort lists them


# A setting and the inputs whose analyses read it: given without any of them, it would change nothing.
READ_BY = {
    "framing": ("scores",), "frequencies": ("scores",), "frequency_scale": ("scores",), "rbo_p": ("scores",),
    "rbo_depth": ("scores",), "n_permutations": ("scores", "audits"), "n_boot": ("scores", "audits"),
    "models_yaml": ("scores", "elo"), "bigtwo_dictionary": ("scores", "bigtwo_checkpoints", "implicit_chosen"),
    "collapse_variants": ("scores", "bigtwo_checkpoints", "implicit_chosen"),
    "seed": ("scores", "audits"), "top": ("scores", "elo", "implicit_chosen"),
}


def check_flags() -> None:
    """A setting given without an input that reads it (--framing without --scores) is refused, not ignored: first
    thing in main, and where a launch reads its line."""
    from rmjax.runs.paths import refuse_empty_out

    refuse_empty_out(OUT.value)
    for name, inputs in READ_BY.items():  # an empty value (--models_yaml= : none) asks for nothing
        given = flags.FLAGS[name]
        if given.present and given.value not in ("", None) and not any(flags.FLAGS[i].value for i in inputs):
            raise UsageError(f"--{name} applies to {' / '.join('--' + i for i in inputs)}, and none is given; leave "
                             f"--{name} out.")


def main(argv):
    del argv
    from rmjax.audit.compare import run_analyses_with_audits

    check_flags()
    run_analyses_with_audits(ANALYSIS_CONFIG(), OUT.value, overwrite=OVERWRITE.value,
                             framing_given=flags.FLAGS["framing"].present)


if __name__ == "__main__":
    cli.run(main)
