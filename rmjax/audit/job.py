"""The audit job: identity without loading -> claim DIR -> load -> score each battery's variants (resumable per
battery) -> audit_items.csv, audit.csv, audit.png and .meta.json.

Every number of audit.csv is recomputed from audit_items.csv by `rmjax.audit.stats` (`recompute` reads it back),
so a reader can check any row with the items alone.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from rmjax.audit import batteries as battery_lib
from rmjax.audit import stats
from rmjax.checks import MIN_RESAMPLES
from rmjax.errors import UsageError
from rmjax.loading import config_of
from rmjax.loading.for_job import job_fingerprint, load_for_job
from rmjax.loading.identity import hash_json
from rmjax.model import Model, require_reward_model
from rmjax.parallel.distributed import barrier, is_main
from rmjax.runs import atomic, results
from rmjax.runs.chunks import open_store, store_dir
from rmjax.runs.options import RunOptions, claim_job
from rmjax.scoring.texts import score_conversations

ITEM_KEYS = ("battery", "axis", "item", "group", "text")  # then reward, then prompt (audit_items.csv)
SHOWN = 8  # surviving rows printed per battery (all are in audit.csv)


def check_settings(batteries: Sequence[str], n_boot: int, n_perm: int, seed: int, batch_size: int) -> None:
    """The audit's flags, refused from their values alone: by the job, and by a launch before it pays a VM."""
    if not batteries:
        raise UsageError("--batteries: name at least one of " + ", ".join(battery_lib.BATTERIES) + ".")
    if "" in batteries:
        raise UsageError(f"--batteries={','.join(batteries)}: an empty name (a comma too many?).")
    unknown = [b for b in batteries if b not in battery_lib.BATTERIES]
    if unknown:
        raise UsageError(f"--batteries: {', '.join(unknown)} unknown; choose from "
                         f"{', '.join(battery_lib.BATTERIES)}.")
    if len(set(batteries)) != len(batteries):
        raise UsageError(f"--batteries: {','.join(batteries)} names a battery twice.")
    for flag, value, least in (("--n_boot", n_boot, MIN_RESAMPLES), ("--n_perm", n_perm, MIN_RESAMPLES),
                               ("--batch_size", batch_size, 1)):
        if value < least:
            raise UsageError(f"{flag}={value}: give at least {least}.")
    if not 0 <= seed < 2**32:  # as every job's seed (BUILD_NOTES, config checks)
        raise UsageError(f"--seed={seed}: give a seed in [0, 4294967295].")


@dataclasses.dataclass(frozen=True)
class AuditSpec:
    """An audit as one value: which batteries (the length battery joins identity or sycophancy: it calibrates their
    length-only nulls), and the statistics' settings (`seed` seeds every bootstrap, permutation and shuffle; the
    rows' streams are derived from it)."""

    options: RunOptions  # options.out is the output folder
    batteries: tuple[str, ...] = battery_lib.BATTERIES
    n_boot: int = 2000
    n_perm: int = 10000
    seed: int = 0
    batch_size: int = 64

    def __post_init__(self):
        check_settings(self.batteries, self.n_boot, self.n_perm, self.seed, self.batch_size)
        object.__setattr__(self, "batteries", battery_lib.with_calibration(self.batteries))
        refuse_allow_nonfinite(self.options.allow_nonfinite)


def refuse_allow_nonfinite(allow_nonfinite: bool) -> None:
    """An audit's statistics need every reward finite: the flag is refused from the flags alone (a launch too)."""
    if allow_nonfinite:
        raise UsageError("--allow_nonfinite: an audit's statistics need every reward finite; leave it out.")


def folder_paths(folder: str | Path) -> dict[str, Path]:
    folder = Path(folder)
    return {"csv": folder / "audit.csv", "items": folder / "audit_items.csv", "png": folder / "audit.png"}


def audit_identity(spec: AuditSpec, built: list[battery_lib.Battery]) -> dict:
    o = spec.options
    return {"job": "audit", "model": job_fingerprint(o), "dtype": o.dtype, "output_column": int(o.output_column),
            "template": o.template, "batteries": list(spec.batteries),
            "variants": hash_json([dataclasses.astuple(v) for b in built for v in b.variants]),
            "contrasts": hash_json([dataclasses.astuple(c) for b in built for c in b.contrasts]),
            "stats": {"n_boot": spec.n_boot, "n_perm": spec.n_perm, "seed": spec.seed}}


def run_audit(spec: AuditSpec) -> Path | None:
    """Returns DIR (None off the main process). Batteries are built and checked before any weight loads."""
    o = spec.options
    built = battery_lib.build(spec.batteries)
    battery_lib.check(built)
    # from its config, before any weight loads or a claim deletes an earlier result
    require_reward_model(config_of(o.model), o.model, "the audit", o.output_column, o.column_chosen)
    identity = audit_identity(spec, built)
    nulls = [c.null for b in built for c in b.contrasts]
    paths = folder_paths(o.out)
    with claim_job(o, identity, out=paths["csv"], owned=[paths["items"], paths["png"]],
                   store=store_dir(paths["csv"])) as job:
        if job.reuse:
            if is_main():
                print(describe(pd.read_csv(paths["csv"], keep_default_na=False), paths, spec.n_perm, nulls),
                      file=sys.stderr)
            return Path(o.out)
        started = time.perf_counter()
        note = stats.holm_floor_note(sum(len(b.contrasts) for b in built), spec.n_perm, battery_lib.MIN_ITEMS,
                                     "--n_perm")
        if note and is_main():  # before the scoring, which it does not change
            print(note, file=sys.stderr)
        model = load_for_job(o)
        store = open_store(paths["csv"], identity, 1, spec.batch_size)
        kept = store.batch_size or spec.batch_size
        items = pd.concat([_scored(model, b, store, kept, o.template) for b in built], ignore_index=True)
        table = stats.audit_table(items, [c for b in built for c in b.contrasts], n_boot=spec.n_boot,
                                  n_perm=spec.n_perm, seed=spec.seed)
        job.finish(lambda path: write(paths, items, table, nulls), allow_nonfinite=None, **_model_meta(model),
                   batteries=list(spec.batteries), n_variants=len(items),
                   n_rows=len(table), summary=summary(table, spec.n_perm), seconds=time.perf_counter() - started)
        if is_main():
            store.remove()
            print(describe(table, paths, spec.n_perm, nulls), file=sys.stderr)
    return Path(o.out)


def _model_meta(model: Model) -> dict:
    from rmjax.runs.jobs import model_meta

    return model_meta(model)


def _scored(model: Model, battery: battery_lib.Battery, store, batch_size: int, template: str) -> pd.DataFrame:
    """The battery's variants with their rewards; a battery scored before a crash is read back, not rescored."""
    v = battery.variants
    barrier(f"rmjax-audit-{battery.name}")  # every process agrees whether it is stored before any writes
    if store.has(battery.name):
        rewards = store.read(battery.name, (len(v), 1), _check(store, battery.name))[:, 0]
    else:
        started = time.perf_counter()
        rewards = score_conversations(model, [x.prompt for x in v], [x.response for x in v], template, batch_size,
                                      has_flag=False)  # the audit refuses --allow_nonfinite: not named as the fix
        if is_main():
            store.write(battery.name, np.asarray(rewards, np.float32)[:, None])
            print(f"audit: {battery.name}: {len(v)} conversations scored in {time.perf_counter() - started:.0f} s",
                  file=sys.stderr)
    return pd.DataFrame({"battery": [x.battery for x in v], "axis": [x.axis for x in v],
                         "item": [x.item for x in v], "group": [x.group for x in v],
                         "text": [x.response for x in v], "reward": np.asarray(rewards, np.float64),
                         "prompt": [x.prompt for x in v]})


def _check(store, name: str):
    def check(values: np.ndarray, why: str) -> None:
        if not np.isfinite(values).all():
            raise store.damaged(name, f"holds non-finite rewards ({why})")
    return check


def write(paths: dict[str, Path], items: pd.DataFrame, table: pd.DataFrame, nulls: list[str]) -> Path:
    """audit_items.csv (one row per scored variant: ITEM_KEYS, reward, then the prompt, where the identity-in-prompt
    and sycophancy items differ), the figure, then audit.csv (the result the claim names)."""
    from rmjax.audit import figure

    write_items(paths["items"], items)
    figure.effects(table, nulls, paths["png"])
    keys = ("battery", "axis", "contrast", "n_items")
    results.write_table(paths["csv"], {k: table[k].tolist() for k in keys},
                        {k: table[k].to_numpy(np.float64) for k in table.columns if k not in keys})
    return paths["csv"]


def write_items(path: Path, items: pd.DataFrame) -> None:
    """audit_items.csv: ITEM_KEYS, reward, prompt; strings as strings (read_items reads them back)."""
    columns = [*ITEM_KEYS, "reward", "prompt"]
    with atomic.replacing(path) as tmp, open(tmp, "w", encoding="utf-8", newline="") as f:
        results.write_rows(f, [columns])
        results.write_rows(f, ([*(str(v) for v in row[:-2]), float(row[-2]), str(row[-1])]
                               for row in items[columns].itertuples(index=False)))


def read_items(path: str | Path) -> pd.DataFrame:
    """audit_items.csv as written (strings kept as strings: a text "None" or "NaN" stays text), rewards as the
    job's float32 values, which its 9 digits hold exactly: read as float64 they were not, a group's mean of k equal
    rewards came out 1e-17 off, all one sign, and an RM blind to the groups had identity rows "surviving" Holm
    when recomputed from the CSV (helper-164)."""
    frame = pd.read_csv(path, keep_default_na=False, dtype={k: str for k in (*ITEM_KEYS, "prompt")})
    frame["reward"] = frame["reward"].astype(np.float32).astype(np.float64)
    return frame


def recompute(folder: str | Path, n_boot: int = 2000, n_perm: int = 10000, seed: int = 0) -> pd.DataFrame:
    """audit.csv's table recomputed from audit_items.csv alone, with the batteries' contrasts."""
    items = read_items(folder_paths(folder)["items"])
    built = battery_lib.build(list(dict.fromkeys(items["battery"])))  # the job's order: rows' seeds follow it
    return stats.audit_table(items, [c for b in built for c in b.contrasts], n_boot=n_boot, n_perm=n_perm,
                             seed=seed)


def summary(table: pd.DataFrame, n_perm: int) -> dict:
    """What .meta.json says at a glance: rows, rows surviving Holm (p_holm < stats.ALPHA), and those beyond their
    null; the smallest p_holm these settings allow (None where a test may be exact: stats.holm_floor)."""
    survive = table[table["p_holm"] < stats.ALPHA]
    return {"rows": len(table), "holm_0.05": len(survive),
            "least_p_holm": stats.holm_floor(len(table), n_perm, battery_lib.MIN_ITEMS),
            "surviving": [f"{r.battery}/{r.axis}: {r.contrast} {r.effect:+.3f} [{r.ci_low:+.3f}, {r.ci_high:+.3f}]"
                          f" null {r.null_effect:+.3f}" for r in survive.itertuples()]}


def within_null(effect: float, null: float, kind: str) -> bool:
    """Whether a row's null could make its effect: a shuffled-label null is the 95th percentile of |effect| by chance
    alone (within: |effect| at most that); a length null is the effect length alone predicts, signed (within: the
    same sign and no larger; an effect against length's prediction is not length's doing)."""
    if kind == "shuffled":
        return abs(effect) <= null
    return effect * null >= 0 and abs(effect) <= abs(null)


def describe(table: pd.DataFrame, paths: dict[str, Path], n_perm: int, nulls: Sequence[str]) -> str:
    """The lines an audit prints: per battery the rows that survive Holm, each marked where its null could make it
    (`nulls`: each row's kind, stats.NULLS)."""
    lines = []
    kinds = pd.Series(list(nulls), index=table.index)
    for battery, part in table.groupby("battery", sort=False):
        kept = part[part["p_holm"] < stats.ALPHA]
        lines.append(f"{battery}: {len(kept)} of {len(part)} effects survive Holm's correction "
                     f"(p_holm < {stats.ALPHA:g})")
        # ties at the permutation floor are common: among equal p_holm the largest effects first, and a cut named
        shown = kept.assign(size=kept["effect"].abs()).sort_values(["p_holm", "size"], ascending=[True, False],
                                                                   kind="stable").head(SHOWN)
        if len(kept) > SHOWN:
            lines[-1] += f"; the {SHOWN} with the smallest p_holm shown (largest effects first among ties)"
        for r in shown.itertuples():
            beyond = not within_null(r.effect, r.null_effect, kinds[r.Index])
            lines.append(f"  {r.axis}: {r.contrast}: {r.effect:+.3f} [{r.ci_low:+.3f}, {r.ci_high:+.3f}], "
                         f"p_holm {r.p_holm:.2g}, null {r.null_effect:+.3f}"
                         + ("" if beyond else " (within its null)"))
    # a finished audit read back may have lost a file since (a deleted figure): name only what is there
    gone = [paths[key].name for key in ("items", "png") if not paths[key].exists()]
    there = [paths[key].name for key in ("items", "png") if paths[key].exists()]
    note = stats.holm_floor_note(len(table), n_perm, battery_lib.MIN_ITEMS, "--n_perm")
    lines += [note] if note else []
    lines.append(f"-> {', '.join([str(paths['csv']), *there])} (+ .meta.json)"
                 + (f"; {', '.join(gone)} missing: rerun with --overwrite to write it again" if gone else ""))
    return "\n".join(lines)
