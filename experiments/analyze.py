"""Analyses of score tables: paper 1, EloEverything, Big Two (paper 2) and the implicit RM between two LMs.

python -m experiments.analyze --scores=results/scores/ --elo=../shared/data/elo --out=results/analysis \
    [--models_yaml=../shared/data/reward_models.yaml] [--implicit=A.csv,B.csv] [--bigtwo_checkpoints=DIR]

Every input is optional; the analyses whose inputs are given run. Tables are written as CSV, figures
as PNG, and the headline numbers to <out>/report.md (also printed). Nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path

from absl import app, flags

from experiments import cli

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
DEFAULT_YAML = SHARED_DATA / "reward_models.yaml"
DEFAULT_BNC = SHARED_DATA / "corpora" / "1_1_all_alpha.txt"

SCORES = flags.DEFINE_list("scores", [], "Score CSVs (one per model; name = .meta.json model or file stem) "
                           "and/or directories of them.")
ELO = flags.DEFINE_string("elo", None, "Directory of EloEverything CSVs (one per prompt).")
OUT = flags.DEFINE_string("out", "results/analysis", "Output directory for tables, figures and report.md.")
MODELS_YAML = flags.DEFINE_string("models_yaml", str(DEFAULT_YAML) if DEFAULT_YAML.is_file() else "",
                                  "Model metadata (name, nickname, base_model, size, reward_bench_rank); "
                                  "empty for none.")
IMPLICIT = flags.DEFINE_list("implicit", [], "Two log-prob tables A,B: implicit RM from A to B (MWLR).")
BIGTWO_CHECKPOINTS = flags.DEFINE_string("bigtwo_checkpoints", None,
                                         "Directory of step_<N>.csv score tables of one training run.")
BIGTWO_DICTIONARY = flags.DEFINE_string("bigtwo_dictionary", None,
                                        "CSV word,category (agency/communion) instead of nvm's Big Two stems.")
FREQUENCIES = flags.DEFINE_string("frequencies", str(DEFAULT_BNC), "BNC word-frequency list (1_1_all_alpha.txt).")
TOP = flags.DEFINE_integer("top", 20, "Top and bottom tokens/items per table.", lower_bound=1)
N_BOOT = flags.DEFINE_integer("n_boot", 1000, "Bootstrap resamples for the moments' confidence intervals.",
                              lower_bound=1)
N_PERMUTATIONS = flags.DEFINE_integer("n_permutations", 10000, "Permutations for the RSA p-values.", lower_bound=1)
RBO_P = flags.DEFINE_float("rbo_p", 0.9, "RBO persistence p, in (0, 1).")
RBO_DEPTH = flags.DEFINE_integer("rbo_depth", 132, "RBO truncation depth.", lower_bound=1)
OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace an earlier analysis in --out (only the files it wrote, "
                              "listed in its analysis.json); without it --out must be empty or new.")
FRAMING = flags.DEFINE_list("framing", ["best", "worst"], "The two prompts compared for framing.")
SEED = flags.DEFINE_integer("seed", 0, "Seed for bootstrap, permutations and MDS.")


flags.register_validator("rbo_p", lambda p: 0 < p < 1, message="--rbo_p must be in (0, 1).")


def main(argv):
    del argv
    from rmjax.analysis.report import run_analyses

    if not (SCORES.value or ELO.value or IMPLICIT.value or BIGTWO_CHECKPOINTS.value):
        raise app.UsageError("give at least one of --scores, --elo, --implicit, --bigtwo_checkpoints.")
    if IMPLICIT.value and len(IMPLICIT.value) != 2:
        raise app.UsageError("--implicit takes exactly two log-prob tables: A.csv,B.csv.")
    if len(FRAMING.value) != 2:
        raise app.UsageError("--framing takes two prompt names, e.g. best,worst.")
    run_analyses(scores=SCORES.value or None, elo=ELO.value, out=OUT.value, models_yaml=MODELS_YAML.value or None,
                 implicit=IMPLICIT.value or None, bigtwo_checkpoints=BIGTWO_CHECKPOINTS.value,
                 bigtwo_dictionary=BIGTWO_DICTIONARY.value, frequencies=FREQUENCIES.value or None,
                 top_k=TOP.value, n_boot=N_BOOT.value, n_permutations=N_PERMUTATIONS.value, rbo_p=RBO_P.value,
                 rbo_depth=RBO_DEPTH.value, framing=tuple(FRAMING.value), seed=SEED.value, overwrite=OVERWRITE.value)


if __name__ == "__main__":
    cli.run(main)
