"""Every input and setting of one analysis run (what `experiments.analyze` flags fill in)."""

from __future__ import annotations

import dataclasses

from rmjax import checks
from rmjax import data as shipped
from rmjax.analysis.data import COLLAPSE_MODES
from rmjax.analysis.paper1 import FREQUENCY_SCALES
from rmjax.checks import setting
from rmjax.errors import UsageError


@dataclasses.dataclass(frozen=True)
class AnalysisConfig:
    scores: tuple[str, ...] = setting((), "Score CSVs (one per model; name = .meta.json model or file stem) "
                                      "and/or directories of them; beam results (experiments.beam) among them get "
                                      "top/bottom tables and cross-model Kendall tau per depth.")
    elo: str | None = setting(None, "Directory of EloEverything CSVs (one per prompt); builtin: the three shipped in "
                              "rmjax/data/elo; builtin:<prompt>: one of them.")
    models_yaml: str | None = setting(None, "Model metadata (name, nickname, base_model, size, reward_bench_rank); "
                                      "empty for none.")
    implicit_chosen: str | None = setting(
        None, "Implicit RM: log-prob table (experiments.logprobs) of the model whose preferences score > 0: MWLR = "
        "1/2 (p_c + p_r)(log p_c - log p_r). The second paper's 'Llama 3.2 3B -> Gemma 2 2B' table (Freedom "
        "optimal, Love pessimal) is chosen = Llama.")
    implicit_reference: str | None = setting(None, "Implicit RM: log-prob table of the reference model (p_r).")
    bigtwo_checkpoints: str | None = setting(None, "Directory of step_<N>.csv score tables of one training run.")
    bigtwo_dictionary: str | None = setting(None, "CSV word,category (agency/communion) instead of nvm's Big Two "
                                            "stems.")
    frequencies: str | None = setting(None, "BNC word-frequency list (1_1_all_alpha.txt).")
    audits: tuple[str, ...] = setting((), "Audit folders (experiments.audit), two or more: their effects side by "
                                      "side and the paired differences between models, with CIs.")
    disagreements: tuple[str, ...] = setting((), "Disagreement folders (experiments.disagree), one job at two or "
                                             "more --seed values: the search against best-of-N per prompt and "
                                             "direction over the runs, with a t interval.")
    top: int = setting(20, "Top and bottom tokens/items per table.")
    n_boot: int = setting(1000, "Bootstrap resamples for the moments' confidence intervals and the --audits "
                                "differences' (an audit's own default is 2000).")
    n_permutations: int = setting(10000, "Permutations for the RSA p-values and the --audits differences' "
                                         "p-values.")
    rbo_p: float = setting(0.9, "RBO persistence p, in (0, 1).")
    rbo_depth: int = setting(132, "RBO truncation depth.")
    framing: tuple[str, ...] = setting(("best", "worst"), "The two prompts compared for framing.")
    seed: int = setting(0, "Seed for bootstrap, permutations and MDS.")
    roundtrip_only: bool = setting(False, "Only tokens whose token-mode sequence a real conversation produces (the "
                                   "sweep's roundtrip column).")
    collapse_variants: str = setting(
        "none", "Word variants (love, ' love', Love, ' LOVE') in the Big Two tests and the sentiment/frequency fits: "
        "none counts each token (the papers' tables), max keeps each normalized word's best variant, mean averages "
        "them. report.md shows the Big Two test under all three.", COLLAPSE_MODES)
    frequency_scale: str = setting(
        "log_per_million", "Frequency regressor: natural log of the BNC frequency per million words, or that log "
        "z-scored over the regressed words (slope per standard deviation).", FREQUENCY_SCALES)

    def __post_init__(self):
        checks.validate(self, {
            "top": checks.POSITIVE, "n_permutations": checks.POSITIVE,
            "n_boot": (lambda v: v >= 2, "an integer >= 2 (one resample gives an interval of no width)"),
            "rbo_depth": checks.POSITIVE, "rbo_p": (lambda p: 0 < p < 1, "in (0, 1)"),
            "collapse_variants": checks.one_of(*COLLAPSE_MODES),
            "frequency_scale": checks.one_of(*FREQUENCY_SCALES),
        })
        elo_folder(self.elo)
        if bool(self.implicit_chosen) != bool(self.implicit_reference):
            raise UsageError("the implicit RM needs both --implicit_chosen (the model whose preferences score > 0) "
                             "and --implicit_reference.")
        if self.roundtrip_only and self.implicit_chosen:  # never claimed for tables it did not restrict
            raise UsageError("--roundtrip_only cannot restrict the implicit RM: log-prob tables (experiments.logprobs) "
                             "have no roundtrip column; run --implicit_chosen/--implicit_reference without it.")
        if self.roundtrip_only and not (self.scores or self.bigtwo_checkpoints):
            raise UsageError("--roundtrip_only restricts sweep tables (--scores, --bigtwo_checkpoints) and none is "
                             "given; drop it.")
        if len(self.framing) != 2 or self.framing[0] == self.framing[1]:
            raise UsageError("--framing takes two different prompt names, e.g. best,worst.")
        if self.audits:  # the audit's own floor (rmjax.audit.job.AuditSpec): fewer broke its CIs and p-values
            for flag, value in (("--n_boot", self.n_boot), ("--n_permutations", self.n_permutations)):
                if value < checks.MIN_RESAMPLES:
                    raise UsageError(f"{flag}={value}: --audits needs at least {checks.MIN_RESAMPLES}.")
        if not (self.scores or self.elo or self.implicit_chosen or self.bigtwo_checkpoints or self.audits
                or self.disagreements):
            raise UsageError("nothing to analyze: give --scores, --elo, --implicit_chosen/--implicit_reference, "
                             "--bigtwo_checkpoints, --audits and/or --disagreements.")


def elo_folder(spec: str | None) -> tuple[str | None, str | None]:
    """--elo's folder, and the one prompt of it to read where it names one shipped file (`builtin:<prompt>`, as
    train_rm takes it; a path of that name was "not found"). Read as the settings are built, so a launch refuses
    an unknown one."""
    if spec == shipped.BUILTIN:
        return str(shipped.ELO_DIR), None
    if not spec or not spec.startswith(shipped.BUILTIN + ":"):
        return spec, None
    path = shipped.elo_file(spec.partition(":")[2])
    if path is None:
        raise UsageError(f"--elo={spec}: no shipped EloEverything file for that prompt; give builtin (all of them) or "
                         f"one of {shipped.builtin_elo_choices()}.")
    return str(shipped.ELO_DIR), path.stem
