"""Audits side by side (`analyze --audits=DIR,DIR…`): each model's effects per row, and for every pair of models
the paired difference of their effects over the items both scored, in SDs of each model's rewards over the shared
batteries (rmjax.audit.stats.reward_scale), with its CI, p and Holm's correction.

The section is built (every audit read and checked) before the analysis folder is touched, and written by
`rmjax.analysis.report.run_analyses` as one of its sections.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from rmjax.analysis.files import Outputs, markdown
from rmjax.analysis.report import run_analyses
from rmjax.analysis.spec import AnalysisConfig
from rmjax.audit import batteries as battery_lib
from rmjax.audit import stats
from rmjax.audit.job import folder_paths, read_items
from rmjax.errors import InputFileError, MissingFileError, UsageError
from rmjax.loading.identity import hash_json
from rmjax.runs import results, stages


def run_analyses_with_audits(cfg: AnalysisConfig, out: str | Path, *, overwrite: bool = False,
                             echo: bool = True, framing_given: bool = False) -> dict:
    """`experiments.analyze`: the analyses of `cfg` (rmjax.analysis.report.run_analyses), plus the audits side by
    side when `cfg.audits` names them (read before the folder is touched)."""
    sections = [AuditSection(cfg.audits, n_boot=cfg.n_boot, n_perm=cfg.n_permutations, seed=cfg.seed)] \
        if cfg.audits else []
    return run_analyses(cfg, out, overwrite=overwrite, echo=echo, sections=sections, framing_given=framing_given)


class AuditSection:
    """The audits of several models, read now; called with the analysis's Outputs, it writes
    audit_side_by_side.csv and audit_differences.csv and the report's lines."""

    def __init__(self, folders: Sequence[str], n_boot: int = 2000, n_perm: int = 10000, seed: int = 0):
        self.items: dict[str, pd.DataFrame] = {}
        self.tables: dict[str, pd.DataFrame] = {}
        self.audit_settings: dict[str, dict] = {}  # each audit's own bootstrap, permutations and seed
        scorers: dict[str, str] = {}  # what scored (weights, system prompt, template, column, dtype) -> folder
        for folder in folders:
            paths = folder_paths(folder)
            if Path(folder).is_file():
                raise UsageError(f"--audits={folder} is a file; give the audit's folder (experiments.audit's --out).")
            if not (paths["csv"].is_file() and paths["items"].is_file()):
                raise MissingFileError(f"--audits={folder}: no finished audit there (audit.csv, audit_items.csv and "
                                       f".meta.json); run experiments.audit --out={folder} first.")
            # both tables whole and as the audit wrote them (its record's digests): an edited item moved every
            # difference computed from it, silently
            meta = results.checked_input(paths["csv"], ("audit",), "--audits")
            identity = meta.get("identity")
            if not isinstance(identity, dict) or not identity.get("model"):
                raise InputFileError(f"--audits={folder}: its .meta.json records no identity of the model it scored "
                                     f"(edited?); rerun experiments.audit --out={folder} --overwrite.")
            # a model is what scored, not the path typed: `rm` and `rm/` are one model, and one folder read with
            # two system prompts is two
            scorer = hash_json({k: identity.get(k) for k in ("model", "output_column", "dtype")}
                               | {"template": stages.recorded_template(meta)})  # auto: as rendered
            if scorer in scorers:
                raise UsageError(f"--audits: {scorers[scorer]} and {folder} are audits of one model (the same "
                                 "weights, system prompt, template, reward column and dtype); give each model once.")
            scorers[scorer] = folder
            name = str(meta.get("model") or Path(folder).name)
            if name in self.items:  # one path read otherwise (another system prompt, template or dtype)
                name = f"{name} ({folder})"
            self.items[name] = read_items(paths["items"])
            self.tables[name] = pd.read_csv(paths["csv"], keep_default_na=False)
            self.audit_settings[name] = dict(identity.get("stats") or {})
        if len(self.items) < 2:
            raise UsageError("--audits: give at least two audit folders to compare.")
        shared = set.intersection(*(set(f["battery"]) for f in self.items.values()))
        if not shared:
            raise UsageError("--audits: the audits share no battery.")
        _same_conversations(self.items, sorted(shared))
        self.left_out = {name: [b for b in dict.fromkeys(items["battery"]) if b not in shared]
                         for name, items in self.items.items()}
        self.contrasts = [c for b in battery_lib.build([b for b in battery_lib.BATTERIES if b in shared])
                          for c in b.contrasts]
        self.settings = dict(n_boot=n_boot, n_perm=n_perm, seed=seed)
        try:  # one scale per model serves both tables
            self.scales = {}
            for name, items in self.items.items():
                self.scales[name] = stats.reward_scale(items, sorted(shared))
            self.differences = stats.compare_models(self.items, self.contrasts, scales=self.scales, **self.settings)
        except ValueError as error:  # a model whose rewards do not vary; too few items of a contrast in both audits
            raise UsageError(f"--audits: {f'{name}: ' if name not in self.scales else ''}{error}.") from None

    def __call__(self, outputs: Outputs) -> None:
        keys = ["battery", "axis", "contrast"]
        side = None
        for name, table in self.tables.items():
            part = table[[*keys, "effect", "ci_low", "ci_high", "p_holm"]].assign(
                effect_sd=table["effect"] / self.scales[name]).rename(
                columns={c: f"{c} {name}" for c in ("effect", "ci_low", "ci_high", "p_holm", "effect_sd")})
            side = part if side is None else side.merge(part, on=keys, how="outer", sort=False)
        outputs.table("audit_side_by_side", side)
        for name, batteries in self.left_out.items():
            if batteries:
                outputs.skip(f"audits: {name}'s batteries {', '.join(batteries)} are not in every audit, so they are "
                             "left out of the differences and the scale (audit_side_by_side.csv shows their rows).")
        diff = outputs.table("audit_differences", self.differences)
        kept = diff[diff["p_holm"] < stats.ALPHA]
        note = stats.holm_floor_note(len(diff), self.settings["n_perm"], battery_lib.MIN_ITEMS, "--n_permutations")
        units = ", ".join(f"{name} {scale:.4g}" for name, scale in self.scales.items())
        outputs.say("## Audits side by side", "",
                    f"{len(self.items)} models; effects compared in SDs of each model's rewards over the shared "
                    f"batteries' conversations (a reward model's scale is arbitrary): {units}. "
                    f"{len(diff)} paired differences over shared items, {len(kept)} with "
                    f"p_holm < {stats.ALPHA:g} (Holm over the table):", "")
        outputs.say(*self._settings_lines(len(diff)), *([note] if note else []), "")
        if len(kept):
            outputs.say(markdown(kept[["battery", "axis", "contrast", "model_a", "model_b", "difference_sd",
                                       "ci_low", "ci_high", "p_holm"]].head(20)), "")

    def _settings_lines(self, n_differences: int) -> list[str]:
        """What each audit's own CIs and p_holm (the side-by-side table's) were taken with, and the differences':
        set side by side without a word, a CI of 400 resamples read as one of 2000 and a Holm family of 12 rows
        as one of 160."""
        def described(settings: dict, rows: int) -> str:
            return (f"{settings.get('n_boot', '?')} bootstrap resamples, {settings.get('n_perm', '?')} permutations, "
                    f"seed {settings.get('seed', '?')}, Holm over {rows} rows")

        own = {name: described(self.audit_settings[name], len(table)) for name, table in self.tables.items()}
        alike = len(set(own.values())) == 1
        lines = ["Each audit's own effects, CIs and p_holm (audit_side_by_side.csv) are as it wrote them, with "
                 + ("the same settings: " + next(iter(own.values())) if alike else
                    "other settings (their CIs and p_holm are not alike in precision or family): "
                    + "; ".join(f"{name}: {text}" for name, text in own.items())) + "."]
        lines.append(f"The differences (audit_differences.csv): {described(self.settings, n_differences)}.")
        return lines


def _same_conversations(items: dict[str, pd.DataFrame], batteries: Sequence[str]) -> None:
    """Audits compared battery by battery must hold the very same conversations: made from other versions of the
    shipped data, their differences were taken over the items both had and their scales over other texts."""
    keys = ["battery", "axis", "item", "group", "text", "prompt"]
    (first, reference), *others = ((name, set(map(tuple, frame.loc[frame["battery"].isin(batteries), keys].to_numpy())))
                                   for name, frame in items.items())
    for name, conversations in others:
        if conversations != reference:
            only = sorted(conversations ^ reference)[0]
            raise UsageError(f"--audits: {first} and {name} hold different conversations in the batteries both ran "
                             f"({len(reference)} and {len(conversations)}; e.g. {only[0]} {only[2]} {only[3]!r} is "
                             "in one only): audits from other versions of the battery data; rerun the older one.")
