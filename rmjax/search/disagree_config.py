"""The disagreement job's settings (issue 46): what `experiments.disagree` parses, checked before any model loads,
and the search's defaults for a disagreement."""

from __future__ import annotations

import dataclasses

import numpy as np

from rmjax import checks
from rmjax.checks import setting
from rmjax.errors import UsageError
from rmjax.runs.options import RunOptions
from rmjax.search.fluent import FluentConfig
from rmjax.search.frontier_job import Z_SAMPLE
from rmjax.search.sides import SideSpec, same_model

DIRECTIONS = ("a_over_b", "b_over_a")
METHODS = ("search", "best_of_n")
# The disagreement's search: more of its budget on prior samples, drawn at best-of-N's lower temperature, before GCG
# (the frontier's 0.25, 0.4 and 1.0). At the default RMs' 1,000 forwards, seeds 0-2 (BUILD_NOTES): ahead of best-of-N
# on complete answers in 16 of 18 cell-runs (10 with the frontier's), at the judge cap in 9 (3).
SEARCH_DEFAULTS = {"sample_share": 0.6, "start_share": 0.7, "temperature": 0.7}


def search_config(**settings) -> FluentConfig:
    """The search's settings for a disagreement: FluentConfig's, with SEARCH_DEFAULTS, then `settings`."""
    return FluentConfig(**(SEARCH_DEFAULTS | settings))


@dataclasses.dataclass(frozen=True)
class DisagreeConfig:
    direction: str = setting("both", "a_over_b: responses side A rates far above side B; b_over_a: the reverse.",
                             ("a_over_b", "b_over_a", "both"))
    forwards: int = setting(2000, "Forwards budget of the search, and of best-of-N, per prompt and direction; both "
                                   "sides' forwards count.")
    lam: float = setting(0.5, "λ: weight of the fluency term (the frontier's: mean token log-prob + end of turn "
                              "under side A's backbone, minus the repetition penalty).")
    repetition_penalty: float = setting(2.0, "ρ: the fluency term loses ρ x the share of repeating positions.")
    top: int = setting(8, "Rows written per prompt, direction and method: the best by the objective.")
    front_rows: int = setting(32, "Rows written besides the top: up to this many from each method's Pareto layers "
                                  "(gap vs fluency).")
    b_gradient: bool = setting(False, "Side B's reward gradient joins A's in the search's proposals, through the "
                                      "tokens both sides read as the same string (a reward-model side B; 3 of its "
                                      "forwards a step). Off: A's gradient alone, B only scoring candidates.")
    screen: int = setting(0, "Each GCG step ranks its candidates by side A's part of the objective and has side B "
                             "score only this many of them (0: all): more steps for B's forwards. Best-of-N is "
                             "unchanged unless --screen_best_of_n.")
    screen_best_of_n: bool = setting(False, "With --screen: best-of-N is screened too (B scores A's best "
                                            "screen/search_width share of its samples, so it draws more). A control: "
                                            "measured weaker than unscreened at the cap (BUILD_NOTES).")
    z_sample: int = setting(2048, "Single tokens sampled (seeded) per side and prompt for the SD that z divides by.")
    search: bool = setting(True, "Run the search and best-of-N (--nosearch: only the vocabulary map).")
    methods: str = setting("both", "search or best_of_n: run that one alone (a control rerun beside another run's "
                                   "rows, at the same forwards); both: the search against best-of-N.",
                           ("search", "best_of_n", "both"))
    vocab_map: bool = setting(False, "Also map every one-token response both vocabularies share: z_A against z_B, "
                                     "Kendall τ, the top and bottom by gap (DIR/vocab_map.csv).")
    map_top: int = setting(20, "Strings the summary names at each end of the vocabulary map, per prompt.")
    allow_non_ascii: bool = setting(False, "Allow non-ASCII tokens in responses.")
    allow_special: bool = setting(False, "Allow special and byte tokens in responses.")

    def __post_init__(self):
        checks.validate(self, {"forwards": checks.POSITIVE, "top": checks.POSITIVE, "z_sample": Z_SAMPLE,
                               "front_rows": checks.NON_NEGATIVE, "screen": checks.NON_NEGATIVE,
                               "repetition_penalty": checks.NON_NEGATIVE,
                               "map_top": checks.POSITIVE, "direction": checks.one_of("a_over_b", "b_over_a", "both"),
                               "methods": checks.one_of("search", "best_of_n", "both"),
                               "lam": (lambda v: v >= 0 and np.isfinite(v), "a finite number >= 0")})
        if not (self.search or self.vocab_map):
            raise UsageError("--nosearch without --vocab_map computes nothing: give one of them.")
        # settings that would change nothing, yet be recorded as used (identity, .meta.json): refused
        searching = self.search and self.methods != "best_of_n"
        if self.b_gradient and not searching:
            raise UsageError("--b_gradient steers the search's proposals, and the search does not run here "
                             "(--nosearch or --methods=best_of_n); drop --b_gradient.")
        if self.screen_best_of_n and not (self.screen and self.search and self.methods != "search"):
            raise UsageError("--screen_best_of_n screens best-of-N's samples by --screen=K; give --screen=K and run "
                             "best-of-N (--methods=both or best_of_n), or drop --screen_best_of_n.")
        if self.screen and not (searching or self.screen_best_of_n):
            raise UsageError("--screen screens the search's steps, and the search does not run here (--nosearch or "
                             "--methods=best_of_n); add --screen_best_of_n to screen best-of-N, or drop --screen.")

    @property
    def directions(self) -> tuple[str, ...]:
        return DIRECTIONS if self.direction == "both" else (self.direction,)

    @property
    def method_names(self) -> tuple[str, ...]:
        return METHODS if self.methods == "both" else (self.methods,)


@dataclasses.dataclass(frozen=True)
class DisagreeSpec:
    """The job as one value: options.out is the output folder, options.model side A's reward model; `models` the
    two sides as given; `lm` the prior of the fluency term (None: side A's own backbone); `judge` (None: the
    default of the other family); `batch_size` one-token responses per forward of the map and the yardsticks (0:
    the memory plan's pick, at most 256; not in the identity, as the sweep's)."""

    options: RunOptions
    models: tuple[str, str]
    prompts: dict[str, str]
    config: DisagreeConfig
    search: FluentConfig
    lm: str | None = None
    judge: str | None = None
    batch_size: int = 0

    def __post_init__(self):
        checks.validate(self, {"batch_size": checks.NON_NEGATIVE})
        check_screen(self.config.screen, self.search.search_width)


def check_screen(screen: int, search_width: int) -> None:
    """B would score every candidate: no screen at all. Refused in DisagreeSpec and from the flags alone (a
    launch's line)."""
    if screen >= search_width:
        raise UsageError(f"--screen={screen} keeps every one of --search_width={search_width} candidates, which "
                         "screens nothing; give --screen below --search_width, or drop it.")


def refuse_column_read_as_lm(a: SideSpec, b: SideSpec, lm: str | None, column: int) -> None:
    """One model loaded once: read as an LM (--lm or an implicit side) it reads column 0, and its rewards would too.
    Refused before loading (run_disagree) and from the flags alone (where a launch reads the job's line)."""
    lms = set(b.models if b.implicit else ()) | ({lm} if lm else set())
    read_as_lm = [m for m in (a.models[0], *([] if b.implicit else b.models)) if m in lms]
    if column and read_as_lm:
        raise UsageError(f"--output_column={column} reads {read_as_lm[0]}'s reward output {column}, and it is also "
                         "read as a language model here (--lm or an implicit side), which loads it without one; "
                         "give --lm another model, or drop --output_column.")


def parse_sides(models: tuple[str, ...] | list[str], b_gradient: bool = False) -> tuple[SideSpec, SideSpec]:
    """Two sides; side A a reward model (the search's gradient is its), refused in one line before loading, as is
    --b_gradient with an implicit side B (it gives no reward gradient)."""
    if len(models) != 2:
        raise UsageError(f"--models takes two sides, A,B ({len(models)} given).")
    a, b = (SideSpec.parse(m) for m in models)
    if a.implicit:
        raise UsageError(f"--models={','.join(models)}: side A searches by its reward gradient and must be a reward "
                         "model; put the implicit side second (--direction=b_over_a searches the other way).")
    if same_model(a.text, b.text):  # rm and rm/ (or ./rm) are one model: a map of gaps 0, tau 1
        raise UsageError(f"--models: both sides are {a.text}; a model does not disagree with itself.")
    if b.implicit and b_gradient:
        raise UsageError(f"--b_gradient takes side B's reward gradient, and side B ({b.text}) is an implicit reward, "
                         "which gives none; drop --b_gradient.")
    return a, b
