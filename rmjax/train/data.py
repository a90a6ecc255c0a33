"""Preference pairs: read (prompt, chosen, rejected[, label]) files, or build them from EloEverything.

EloEverything gives each of 7,530 items a human Elo rating from pairwise votes. Two items as
responses to the same prompt form a pair; the probability that humans prefer i over j is the
Elo (Bradley–Terry) probability 1 / (1 + 10^((e_j - e_i) / 400)). Items are split into train and
held-out sets first, so no held-out item is ever trained on.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from rmjax import data as shipped
from rmjax.errors import InputFileError, MissingFileError, UsageError, require_file


@dataclasses.dataclass(frozen=True)
class Pairs:
    """Preference pairs; `label` is P(chosen preferred) (1.0 for hard labels)."""

    prompt: list[str]
    chosen: list[str]
    rejected: list[str]
    label: np.ndarray

    def __len__(self) -> int:
        return len(self.chosen)

    def take(self, idx: np.ndarray) -> Pairs:
        return Pairs([self.prompt[i] for i in idx], [self.chosen[i] for i in idx],
                     [self.rejected[i] for i in idx], self.label[idx])

    def digest(self) -> str:
        """Content digest (part of a training run's identity)."""
        from rmjax.loading.identity import hash_json

        return hash_json([self.prompt, self.chosen, self.rejected, [float(x) for x in self.label]])

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame({"prompt": self.prompt, "chosen": self.chosen, "rejected": self.rejected,
                             "label": self.label})


def read_pairs(path: str | Path) -> Pairs:
    """CSV or JSONL with columns prompt, chosen, rejected and optional label (soft, in [0, 1])."""
    path = require_file(path, f"preference file {path}")
    try:
        if path.suffix.lower() in (".jsonl", ".json"):  # (a .JSONL was read as CSV)
            df = pd.DataFrame(_json_pairs(path))
        else:
            _refuse_repeated_columns(path)
            df = pd.read_csv(path, keep_default_na=False, index_col=False,  # a label read as text: True is no 1
                             dtype={"prompt": str, "chosen": str, "rejected": str, "label": str})
    except (ValueError, UnicodeDecodeError, pd.errors.ParserError) as error:
        raise InputFileError(f"{path}: cannot be read as preference pairs ({' '.join(str(error).split())}).") from None
    missing = {"prompt", "chosen", "rejected"} - set(df.columns)
    if missing:
        raise InputFileError(f"{path}: missing columns {sorted(missing)} (need prompt, chosen, rejected[, label]).")
    if not len(df):
        raise InputFileError(f"{path}: no preference pairs.")
    near = [str(c) for c in df.columns if str(c) != "label" and _misspelt_label(str(c))]
    if near and "label" in df:  # which one is meant? the other was read as no label at all
        raise InputFileError(f"{path}: both label and {near[0]!r} look like the label column; keep one (rename the "
                             "other to something else).")
    if near:
        raise InputFileError(f"{path}: no label column, but {near[0]!r} looks like one; rename it label (or, if "
                             "it is no label, rename it to something else: without label every pair counts as "
                             "chosen preferred).")
    # a blank or non-numeric label is NaN here, and refused with the pair it is on
    label = _label_values(df["label"]) if "label" in df else np.ones(len(df))
    bad = np.flatnonzero(~np.isfinite(label) | (label < 0) | (label > 1))
    if len(bad):
        raise InputFileError(f"{path}: pair {bad[0] + 1} has label {df['label'].iloc[bad[0]]!r} ({len(bad)} pairs in "
                             "all); label must be a probability in [0, 1] on every pair, or leave the column out.")
    blank = np.flatnonzero(~df["prompt"].astype(str).str.strip().astype(bool).to_numpy())
    if len(blank):  # a blank cell trained on an empty user turn, unsaid
        raise InputFileError(f"{path}: pair {blank[0] + 1} has an empty prompt ({len(blank)} pairs in all); every "
                             "pair needs the prompt its responses answer.")
    same = np.flatnonzero((df["chosen"].astype(str) == df["rejected"].astype(str)).to_numpy())
    if len(same):  # no preference to learn, and scored wrong in held-out accuracy whatever the model does
        raise InputFileError(f"{path}: pair {same[0] + 1} has the same chosen and rejected response "
                             f"({df['chosen'].iloc[same[0]]!r}; {len(same)} pairs in all); remove such pairs.")
    return Pairs(df["prompt"].astype(str).tolist(), df["chosen"].astype(str).tolist(),
                 df["rejected"].astype(str).tolist(), label.astype(np.float32))


def _label_values(column: pd.Series) -> np.ndarray:
    """Each label as a float; NaN for a blank, text, or a JSON integer past a float's range (pandas raises
    OverflowError on it despite errors="coerce": a traceback, not the refusal that names its pair)."""
    try:
        return pd.to_numeric(column, errors="coerce").to_numpy(np.float64)
    except OverflowError:
        tamed = column.map(lambda v: np.nan if isinstance(v, int) and abs(v) > sys.float_info.max else v)
        return pd.to_numeric(tamed, errors="coerce").to_numpy(np.float64)


def _misspelt_label(name: str) -> bool:
    """`Label`, `labels`, `lable`, ` label`: one slip from `label` (case, spaces, one letter added, dropped or two
    swapped; not one letter changed, which `table` is), read as no label at all were it let through."""
    name, want = "".join(name.split()).casefold(), "label"
    if name == want:
        return True
    dropped = {want[:i] + want[i + 1:] for i in range(len(want))}
    swapped = {want[:i] + want[i + 1] + want[i] + want[i + 2:] for i in range(len(want) - 1)}
    return name in dropped | swapped or any(name[:i] + name[i + 1:] == want for i in range(len(name)))


def _refuse_repeated_columns(path: Path) -> None:
    """pandas renames a second `chosen` column `chosen.1` and reads the first: a header naming a column twice is
    refused instead. So is a row of more or fewer fields than the header: with one more on every row (a trailing
    comma) pandas took the first column as the index and read each pair shifted one column left, silently."""
    import csv

    limit = csv.field_size_limit(2**31 - 1)  # a long response is one field (csv's default stops at 128 KiB)
    try:
        with open(path, encoding="utf-8", newline="") as f:
            rows = csv.reader(f)
            header = next((row for row in rows if row), [])  # pandas skips blank lines before the header too
            twice = sorted({name for name in header if header.count(name) > 1})
            if twice:
                raise InputFileError(f"{path}: the header names column {', '.join(twice)} more than once; keep one.")
            for number, row in enumerate(rows, start=1):
                if any(field.strip() for field in row) and len(row) != len(header):  # pandas skips blank lines
                    raise InputFileError(f"{path}: row {number} has {len(row)} fields where the header has "
                                         f"{len(header)} ({', '.join(header)}); a trailing or missing comma shifts "
                                         "every value.")
    except csv.Error as error:
        raise InputFileError(f"{path}: cannot be read as a CSV table ({error}).") from None
    finally:
        csv.field_size_limit(limit)


def _object_once(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object whose keys are all different (json.loads would keep the last of two)."""
    keys = [k for k, _ in pairs]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise _RepeatedKey(", ".join(twice))
    return dict(pairs)


class _RepeatedKey(Exception):
    pass


PAIR_KEYS = ("prompt", "chosen", "rejected")
_JSON_TYPES = {list: "array", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}


def _json_pairs(path: Path) -> list[dict]:
    """The objects of a JSONL file (or of a .json file holding one list of them), each checked: a line that is not
    a JSON object with string prompt, chosen and rejected (and a numeric label, on every line or none) is an
    InputFileError naming the file and the line, not a pair of "nan" or "None" texts."""
    text = path.read_text(encoding="utf-8")
    rows: list[tuple[int, object]] = []
    whole = None
    if path.suffix.lower() == ".json":
        try:
            whole = json.loads(text, object_pairs_hook=_object_once)
        except (ValueError, RecursionError):
            whole = None  # JSON lines after all
        except _RepeatedKey as error:
            raise InputFileError(f"{path}: an object gives key {error} twice; JSON would keep only the last. Remove "
                                 "one.") from None
    if isinstance(whole, list):
        rows = [(i + 1, item) for i, item in enumerate(whole)]
        where = "item"
    else:
        where = "line"
        # lines end at '\n' (and '\r\n') only: splitlines also cut at U+2028 or U+0085 inside a JSON string
        for number, line in enumerate(text.split("\n"), 1):
            if not line.strip():
                continue
            try:
                rows.append((number, json.loads(line, object_pairs_hook=_object_once)))
            except _RepeatedKey as error:
                raise InputFileError(f"{path}: line {number} gives key {error} twice; JSON would keep only the last. "
                                     "Remove one.") from None
            except ValueError as error:
                raise InputFileError(f"{path}: line {number} is not JSON ({error.msg} at column {error.colno}); "
                                     "write one object {\"prompt\": …, \"chosen\": …, \"rejected\": …} per "
                                     "line.") from None
            except RecursionError:
                raise InputFileError(f"{path}: line {number} nests arrays or objects too deeply to read; write one "
                                     "object {\"prompt\": …, \"chosen\": …, \"rejected\": …} per line.") from None
    labelled = None
    for number, row in rows:
        at = f"{path}: {where} {number}"
        if not isinstance(row, dict):
            raise InputFileError(f"{at} is a JSON {_JSON_TYPES.get(type(row), 'value')}, not an object with prompt, "
                                 "chosen and rejected.")
        missing = [k for k in PAIR_KEYS if k not in row]
        if missing:
            raise InputFileError(f"{at} lacks {', '.join(missing)} (each pair needs prompt, chosen, rejected[, "
                                 "label]).")
        for key in PAIR_KEYS:
            if not isinstance(row[key], str):
                raise InputFileError(f"{at}: {key} is {json.dumps(row[key])[:60]}, not a string; quote the text.")
            try:  # a \ud800 escape alone (a cut emoji) is JSON, and a string no tokenizer takes
                row[key].encode("utf-8")
            except UnicodeEncodeError as error:
                raise InputFileError(f"{at}: {key} holds a lone surrogate {row[key][error.start]!r} at character "
                                     f"{error.start} (half of an emoji's \\u escape pair); fix or drop it.") from None
        label = row.get("label")
        if "label" in row and (isinstance(label, bool) or not isinstance(label, int | float)):
            raise InputFileError(f"{at}: label is {json.dumps(label)[:60]}, not a number in [0, 1].")
        if labelled is None:
            labelled = (number, "label" in row)
        elif labelled[1] != ("label" in row):
            with_label = labelled[0] if labelled[1] else number
            raise InputFileError(f"{path}: {where} {with_label} has a label but {where} "
                                 f"{number if labelled[1] else labelled[0]} has none; give a label on every "
                                 f"{where} or on none (then each pair counts as chosen preferred).")
    return [row for _, row in rows]


def elo_prompt(path: Path) -> str:
    """EloEverything files are named after their prompt, minus the question mark."""
    return path.stem + "?"


def elo_probability(elo_i: np.ndarray, elo_j: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + 10.0 ** ((elo_j - elo_i) / 400.0))


def elo_csv(spec: str | Path) -> Path:
    """The EloEverything file `spec` names: a CSV path, `builtin` (the shipped greatest-thing file, which trained
    the default reward models) or `builtin:<prompt>` (another shipped file, by its prompt)."""
    text = str(spec)
    if text != shipped.BUILTIN and not text.startswith(shipped.BUILTIN + ":"):
        return Path(spec)
    prompt = text.partition(":")[2] or shipped.GREATEST
    path = shipped.elo_file(prompt)
    if path is None:
        raise UsageError(f"--elo={text}: no shipped EloEverything file for that prompt; give builtin or one of "
                         + shipped.builtin_elo_choices() + ".")
    return path


def read_elo_items(path: str | Path) -> pd.DataFrame:
    path = elo_csv(path)
    if not path.exists():
        raise MissingFileError(f"EloEverything file {path} not found (--elo=builtin reads the shipped one).")
    require_file(path, f"EloEverything file {path}")
    _refuse_repeated_columns(path)  # a trailing comma shifted every item (named by its score), as in a pairs file
    try:
        df = pd.read_csv(path, keep_default_na=False, dtype={"name": str})
    except (ValueError, UnicodeDecodeError, pd.errors.ParserError) as error:
        raise InputFileError(f"{path}: not a readable CSV ({' '.join(str(error).split())}).") from None
    if not {"name", "elo_score"} <= set(df.columns):
        raise InputFileError(f"{path}: expected columns name and elo_score.")
    if not np.isfinite(pd.to_numeric(df["elo_score"], errors="coerce")).all():
        raise InputFileError(f"{path}: elo_score must be a number in every row.")
    repeated = sorted(set(df["name"][df["name"].duplicated()]))
    if repeated:  # which of two ratings is the item's would be a guess (analyze refuses them too)
        raise InputFileError(f"{path}: item {repeated[0]!r} has more than one row ({len(repeated)} items repeat); "
                             "keep one rating per item.")
    return df[["name", "elo_score"]].reset_index(drop=True)


def elo_pairs(
    path: str | Path,
    n_train: int,
    n_heldout: int,
    heldout_fraction: float = 0.2,
    soft: bool = False,
    seed: int = 0,
    prompt: str | None = None,
) -> tuple[Pairs, Pairs]:
    """(train, held-out) pairs from one EloEverything file, split by item.

    Hard labels are sampled from the Elo probability (the chosen item is the sampled winner);
    soft labels keep the probability itself with the higher-rated item as `chosen`.
    """
    path = elo_csv(path)
    items = read_elo_items(path)
    prompt = prompt or elo_prompt(path)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(items))
    cut = int(round(len(items) * (1 - heldout_fraction)))
    if min(cut, len(items) - cut) < 2:  # a pair needs two items on each side of the split
        raise UsageError(f"--elo={path}: {len(items)} items split {cut} / {len(items) - cut} for training and "
                         "held-out pairs; each side needs at least 2 items (give more rated items).")
    return (_sample_pairs(items.iloc[order[:cut]], n_train, soft, rng, prompt),
            _sample_pairs(items.iloc[order[cut:]], n_heldout, soft, rng, prompt))


def _sample_pairs(items: pd.DataFrame, n: int, soft: bool, rng: np.random.Generator, prompt: str) -> Pairs:
    names = items["name"].to_numpy()
    elo = items["elo_score"].to_numpy(dtype=float)
    i = rng.integers(0, len(items), size=n)
    j = (i + rng.integers(1, len(items), size=n)) % len(items)  # never i == j
    p = elo_probability(elo[i], elo[j])
    if soft:
        first = elo[i] >= elo[j]
        label = np.where(first, p, 1 - p)
    else:
        first = rng.random(n) < p
        label = np.ones(n)
    chosen = np.where(first, names[i], names[j])
    rejected = np.where(first, names[j], names[i])
    return Pairs([prompt] * n, chosen.tolist(), rejected.tolist(), label.astype(np.float32))


def split_pairs(pairs: Pairs, heldout_fraction: float = 0.2, seed: int = 0) -> tuple[Pairs, Pairs, dict]:
    """(train, held-out, sizes) with nothing held out ever trained on.

    Several prompts: a `heldout_fraction` of the prompts is held out, and a training pair that reuses
    a held-out pair's response (a repeated refusal, say) is dropped. One prompt, or responses that
    recur so widely that this would drop most training pairs: a `heldout_fraction` of the response
    items is held out too; a pair is then held out when its prompt and both responses are, trained
    on when none is, and dropped otherwise (as the EloEverything split does by item). Responses are compared
    without their edge whitespace, which trimming templates drop.
    """
    rng = np.random.default_rng(seed)
    # a response is its text without edge whitespace: a trimming chat template (Gemma's, Llama 3's) renders
    # 'item10' and 'item10 ' as one conversation, and one was held out while the other trained (helper-149)
    chosen = np.asarray([text.strip() for text in pairs.chosen], object)
    rejected = np.asarray([text.strip() for text in pairs.rejected], object)
    prompt = np.asarray([text.strip() for text in pairs.prompt], object)  # trimmed as the user's turn is too
    prompts = sorted(set(prompt))

    def hold(units: list) -> list:
        return rng.permutation(units)[: max(1, int(round(len(units) * heldout_fraction)))].tolist()

    held = np.ones(len(pairs), bool)
    train = np.ones(len(pairs), bool)
    sizes: dict = {}
    by_item = len(prompts) == 1
    if len(prompts) > 1:
        held_prompts = hold(prompts)
        in_held = np.isin(prompt, held_prompts)
        seen = list(set(chosen[in_held]) | set(rejected[in_held]))
        leak = ~in_held & (np.isin(chosen, seen) | np.isin(rejected, seen))
        by_item = bool(leak.sum() > 0.5 * (~in_held).sum())
        held = in_held
        train = ~in_held if by_item else ~in_held & ~leak
        sizes.update(prompts=len(prompts), heldout_prompts=len(held_prompts))
    if by_item:
        items = sorted(set(chosen) | set(rejected))
        held_items = hold(items)
        in_c, in_r = np.isin(chosen, held_items), np.isin(rejected, held_items)
        held, train = held & in_c & in_r, train & ~in_c & ~in_r
        sizes.update(items=len(items), heldout_items=len(held_items))
    sizes = {"split_by": " and ".join(["prompt"] * (len(prompts) > 1) + ["item"] * by_item), **sizes}
    if not held.any() or not train.any():
        raise UsageError(f"splitting {len(pairs)} pairs by {sizes['split_by']} leaves {int(train.sum())} training and "
                         f"{int(held.sum())} held-out pairs; pass a held-out file with --heldout_pairs.")
    sizes.update(train_pairs=int(train.sum()), heldout_pairs=int(held.sum()),
                 dropped_pairs=int(len(pairs) - train.sum() - held.sum()))
    return pairs.take(np.flatnonzero(train)), pairs.take(np.flatnonzero(held)), sizes
