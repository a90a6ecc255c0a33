"""Analyses of score tables: paper 1, EloEverything, Big Two (paper 2) and the implicit RM between two LMs.

python -m experiments.analyze --scores=results/scores/ --elo=../shared/data/elo --out=results/analysis \
    [--models_yaml=../shared/data/reward_models.yaml] [--bigtwo_checkpoints=DIR] \
    [--implicit_chosen=LLAMA_LOGPROBS.csv --implicit_reference=GEMMA_LOGPROBS.csv] \
    [--roundtrip_only] [--collapse_variants=none|max|mean] [--frequency_scale=log_per_million|zscore]

Every input is optional; the analyses whose inputs are given run. Tables are written as CSV, figures
as PNG, and the headline numbers to <out>/report.md (also printed). Nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path

from absl import flags

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
IMPLICIT_CHOSEN = flags.DEFINE_string(
    "implicit_chosen", None, "Implicit RM: log-prob table (experiments.logprobs) of the model whose preferences "
    "score > 0: MWLR = 1/2 (p_c + p_r)(log p_c - log p_r). The second paper's 'Llama 3.2 3B -> Gemma 2 2B' table "
    "(Freedom optimal, Love pessimal) is chosen = Llama.")
IMPLICIT_REFERENCE = flags.DEFINE_string("implicit_reference", None,
                                         "Implicit RM: log-prob table of the reference model (p_r).")
IMPLICIT = flags.DEFINE_list("implicit", [], "Removed: its A,B order was ambiguous; use --implicit_chosen and "
                             "--implicit_reference.")
BIGTWO_CHECKPOINTS = flags.DEFINE_string("bigtwo_checkpoints", None,
                                         "Directory of step_<N>.csv score tables of one training run.")
BIGTWO_DICTIONARY = flags.DEFINE_string("bigtwo_dictionary", None,
                                        "CSV word,category (agency/communion) instead of nvm's Big Two stems.")
FREQUENCIES = flags.DEFINE_string("frequencies", str(DEFAULT_BNC), "BNC word-frequency list (1_1_all_alpha.txt).")
FREQUENCY_SCALE = flags.DEFINE_enum(
    "frequency_scale", "log_per_million", ["log_per_million", "zscore"],
    "Frequency regressor: natural log of the BNC frequency per million words, or that log z-scored over the "
    "regressed words (slope per standard deviation).")
COLLAPSE = flags.DEFINE_enum(
    "collapse_variants", "none", ["none", "max", "mean"],
    "Word variants (love, ' love', Love, ' LOVE') in the Big Two tests and the sentiment/frequency fits: none "
    "counts each token (the papers' tables), max keeps each normalized word's best variant, mean averages them. "
    "report.md shows the Big Two test under all three.")
ROUNDTRIP_ONLY = flags.DEFINE_bool("roundtrip_only", False,
                                   "Only tokens whose token-mode sequence a real conversation produces (the sweep's "
                                   "roundtrip column).")
TOP = flags.DEFINE_integer("top", 20, "Top and bottom tokens/items per table.", lower_bound=1)
N_BOOT = flags.DEFINE_integer("n_boot", 1000, "Bootstrap resamples for the moments' confidence intervals.",
                              lower_bound=1)
N_PERMUTATIONS = flags.DEFINE_integer("n_permutations", 10000, "Permutations for the RSA p-values.", lower_bound=1)
RBO_P = flags.DEFINE_float("rbo_p", 0.9, "RBO persistence p, in (0, 1).")
RBO_DEPTH = flags.DEFINE_integer("rbo_depth", 132, "RBO truncation depth.", lower_bound=1)
FRAMING = flags.DEFINE_list("framing", ["best", "worst"], "The two prompts compared for framing.")
SEED = flags.DEFINE_integer("seed", 0, "Seed for bootstrap, permutations and MDS.")
OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace an earlier analysis in --out (only the files it wrote, "
                              "listed in its analysis.json); without it --out must be empty or new.")
flags.register_validator("rbo_p", lambda p: 0 < p < 1, message="--rbo_p must be in (0, 1).")
flags.register_validator("implicit", lambda v: not v, message="--implicit is gone (its A,B order was ambiguous): "
                         "use --implicit_chosen=X.csv --implicit_reference=Y.csv (MWLR > 0 where X gives more "
                         "probability).")


def main(argv):
    del argv
    from rmjax.analysis.config import AnalysisConfig
    from rmjax.analysis.report import run_analyses

    cfg = AnalysisConfig(scores=tuple(SCORES.value), elo=ELO.value, models_yaml=MODELS_YAML.value or None,
                         implicit_chosen=IMPLICIT_CHOSEN.value, implicit_reference=IMPLICIT_REFERENCE.value,
                         bigtwo_checkpoints=BIGTWO_CHECKPOINTS.value, bigtwo_dictionary=BIGTWO_DICTIONARY.value,
                         frequencies=FREQUENCIES.value or None, top_k=TOP.value, n_boot=N_BOOT.value,
                         n_permutations=N_PERMUTATIONS.value, rbo_p=RBO_P.value, rbo_depth=RBO_DEPTH.value,
                         framing=tuple(FRAMING.value), seed=SEED.value, roundtrip_only=ROUNDTRIP_ONLY.value,
                         collapse_variants=COLLAPSE.value, frequency_scale=FREQUENCY_SCALE.value)
    run_analyses(cfg, OUT.value, overwrite=OVERWRITE.value)


if __name__ == "__main__":
    cli.run(main)
