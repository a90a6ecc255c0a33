"""Every input and setting of one analysis run (what `experiments.analyze` flags fill in)."""

from __future__ import annotations

import dataclasses

from rmjax import checks
from rmjax.analysis.data import COLLAPSE_MODES
from rmjax.analysis.paper1 import FREQUENCY_SCALES
from rmjax.errors import UsageError


@dataclasses.dataclass(frozen=True)
class AnalysisConfig:
    scores: tuple[str, ...] = ()  # score CSVs and/or folders of them (paper 1, Big Two)
    elo: str | None = None  # folder of EloEverything CSVs
    models_yaml: str | None = None  # model metadata (nickname, base_model, size, reward_bench_rank)
    implicit_chosen: str | None = None  # log-prob table of the model whose preferences score > 0
    implicit_reference: str | None = None  # log-prob table it is compared against
    bigtwo_checkpoints: str | None = None  # folder of step_<N>.csv score tables of one training run
    bigtwo_dictionary: str | None = None  # CSV word,category instead of nvm's stems
    frequencies: str | None = None  # BNC word-frequency list
    top_k: int = 20
    n_boot: int = 1000
    n_permutations: int = 10000
    rbo_p: float = 0.9
    rbo_depth: int = 132
    framing: tuple[str, str] = ("best", "worst")
    seed: int = 0
    roundtrip_only: bool = False  # only tokens whose token-mode sequence a real conversation produces
    collapse_variants: str = "none"  # none | max | mean: one observation per normalized word or per token
    frequency_scale: str = "log_per_million"  # log_per_million | zscore

    def __post_init__(self):
        checks.validate(self, {
            "top_k": checks.POSITIVE, "n_boot": checks.POSITIVE, "n_permutations": checks.POSITIVE,
            "rbo_depth": checks.POSITIVE, "rbo_p": (lambda p: 0 < p < 1, "in (0, 1)"),
            "collapse_variants": checks.one_of(*COLLAPSE_MODES),
            "frequency_scale": checks.one_of(*FREQUENCY_SCALES),
        })
        if bool(self.implicit_chosen) != bool(self.implicit_reference):
            raise UsageError("the implicit RM needs both --implicit_chosen (the model whose preferences score > 0) "
                             "and --implicit_reference.")
        if len(self.framing) != 2:
            raise UsageError("--framing takes two prompt names, e.g. best,worst.")
        if not (self.scores or self.elo or self.implicit_chosen or self.bigtwo_checkpoints):
            raise UsageError("nothing to analyze: give --scores, --elo, --implicit_chosen/--implicit_reference "
                             "and/or --bigtwo_checkpoints.")
