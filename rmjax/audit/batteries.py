"""The audit's counterfactual batteries: the shipped YAML (rmjax/data/audit/) turned into `Variant`s and `Contrast`s.

A battery holds items (the unit of independence); an item holds one variant or more per group (the counterfactual
condition), and the variants of one group are rewrites that should not matter (another noun, another first name),
averaged within the item before any statistic. Everything is read from the shipped files in their written order,
with no randomness, so that every run scores the same conversations in the same order.

- identity: the same sentence with another identity descriptor or first name, in the response or in the prompt.
- length: the same correct answer rendered concise, detailed, as markdown, padded with filler or restated.
- sycophancy: agreeing or disagreeing with a user who stated the right or the wrong answer.
- framing: the same one-word answers after the paper's greatest / best / worst prompts and other wordings.

Pure Python (no JAX): the job builds the batteries before it loads a model, and the tests build them in no time.
"""

from __future__ import annotations

import csv
import dataclasses
import string
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from rmjax.audit import AXIS_MEAN, Contrast, Variant
from rmjax.data import AUDIT_DIR, DATA_DIR
from rmjax.errors import InputFileError, UsageError
from rmjax.text import yamlfile

BATTERIES = ("identity", "length", "sycophancy", "framing")
MIN_ITEMS = 20  # a contrast over fewer items has too little power for its CI to mean much
NULLS = ("length", "shuffled")
RENDERINGS = ("concise", "detailed", "markdown", "padded_neutral", "restated")
LENGTH_CONTRASTS = (("detailed", "concise"), ("markdown", "detailed"), ("markdown", "concise"),
                    ("padded_neutral", "concise"), ("restated", "concise"))
IDENTITY_SIDES = (("response", "response_side", "resp"), ("prompt", "prompt_side", "prompt"))
TOP, BOTTOM = "top Elo answers", "bottom Elo answers"
SYCOPHANCY_AXIS = "stated belief"
SYCOPHANCY_CONTRASTS = ((("agree, user wrong",), ("disagree, user wrong",)),  # sycophancy
                        (("agree, user right",), ("disagree, user right",)),  # confirming a correct belief
                        (("agree, user right", "disagree, user wrong"), ("disagree, user right", "agree, user wrong")))


def with_calibration(names: Sequence[str]) -> tuple[str, ...]:
    """The batteries an audit of `names` runs: the length battery joins identity or sycophancy, whose length-only
    nulls are calibrated on its filler (rmjax.audit.stats.filler_slope)."""
    names = tuple(names)
    return (*names, "length") if "length" not in names and {"identity", "sycophancy"} & set(names) else names


@dataclasses.dataclass(frozen=True)
class Battery:
    """One battery: every variant to score and the contrasts (rows of audit.csv) computed over them."""

    name: str
    variants: tuple[Variant, ...]
    contrasts: tuple[Contrast, ...]


def build(names: Sequence[str] = BATTERIES, data_dir: Path = AUDIT_DIR) -> list[Battery]:
    """The batteries `names` (in that order, each once) built from the YAML files in `data_dir`; an unknown name is
    a UsageError. Deterministic: the same files give the same batteries, variant for variant."""
    if isinstance(names, str):
        names = (names,)
    unknown = [name for name in names if name not in BATTERIES]
    if unknown:
        raise UsageError(f"Unknown audit battery {unknown[0]!r}: the batteries are {', '.join(BATTERIES)}.")
    builders = {"identity": _identity, "length": _length, "sycophancy": _sycophancy, "framing": _framing}
    batteries = [builders[name](Path(data_dir)) for name in dict.fromkeys(names)]
    check(batteries)
    return batteries


def check(batteries: Iterable[Battery]) -> None:
    """Raise ValueError where a battery cannot give the audit's rows: a variant with empty or edge-whitespace text,
    a duplicate variant, a contrast whose axis lacks one of its groups, or one with fewer than MIN_ITEMS items
    holding all of its groups (items lacking a group are left out of the paired effect)."""
    for battery in batteries:
        groups: dict[str, dict[str, set[str]]] = {}  # axis -> item -> groups
        seen: set[Variant] = set()
        for v in battery.variants:
            where = f"battery {battery.name!r}, axis {v.axis!r}, item {v.item!r}, group {v.group!r}"
            if v.battery != battery.name:
                raise ValueError(f"{where}: the variant names battery {v.battery!r}.")
            for field, text in (("prompt", v.prompt), ("response", v.response)):
                if not text or text != text.strip():
                    raise ValueError(f"{where}: the {field} {text!r} is empty or has whitespace at its edges.")
            if v in seen:
                raise ValueError(f"{where}: the variant {v.response!r} after {v.prompt!r} is given twice.")
            seen.add(v)
            groups.setdefault(v.axis, {}).setdefault(v.item, set()).add(v.group)
        for c in battery.contrasts:
            if c.null not in NULLS or not c.x or not c.y or AXIS_MEAN in c.x or set(c.x) & set(c.y):
                raise ValueError(f"battery {battery.name!r}, axis {c.row_axis!r}, contrast {c.name!r}: x and y must "
                                 f"be disjoint groups (y may be ({AXIS_MEAN!r},)) and the null one of "
                                 f"{', '.join(NULLS)}, not {c.null!r}.")
            if c.minus_axis and (c.null != "length" or c.minus_axis == c.axis):
                raise ValueError(f"battery {battery.name!r}, contrast {c.name!r}: an interaction subtracts another "
                                 "axis's effect and takes the length null.")
            for axis in c.axes():
                where = f"battery {battery.name!r}, axis {axis!r}, contrast {c.name!r}"
                items = groups.get(axis, {})
                if c.battery != battery.name or not items:
                    raise ValueError(f"{where}: the battery has no variants on this axis.")
                axis_groups = set().union(*items.values())
                needed = set(c.x) | (axis_groups if c.y == (AXIS_MEAN,) else set(c.y))
                if needed - axis_groups:
                    raise ValueError(f"{where}: the axis has no group {sorted(needed - axis_groups)[0]!r} (its "
                                     f"groups: {', '.join(sorted(axis_groups))}).")
                n = sum(needed <= have for have in items.values())
                if n < MIN_ITEMS:
                    raise ValueError(f"{where}: only {n} items hold all of its groups; the audit needs {MIN_ITEMS}.")


def elo_candidates(path: Path, count: int, max_words: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The `count` highest- and `count` lowest-rated names of EloEverything file `path` by human Elo (highest and
    lowest first; ties broken by name), among the names of at most `max_words` words: the framing battery's
    answers, the extremes so that a framing that flips the question (best vs worst) has answers to flip."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = [(float(row["elo_score"]), row["name"].strip()) for row in csv.DictReader(f)]
    except (OSError, KeyError, TypeError, ValueError) as problem:
        raise InputFileError(f"{path}: cannot read its elo_score and name columns ({problem}).") from None
    rows = [(elo, name) for elo, name in rows if 1 <= len(name.split()) <= max_words]

    def first(ordered: list[tuple[float, str]]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(name for _, name in ordered))[:count]  # a name listed twice counts once

    return first(sorted(rows, key=lambda r: (-r[0], r[1]))), first(sorted(rows, key=lambda r: (r[0], r[1])))


def _load(path: Path) -> dict[str, Any]:
    data = yamlfile.load(path, error=InputFileError)
    if not isinstance(data, dict):
        raise InputFileError(f"{path}: expected a mapping at the top of the file.")
    return data


def _fields(text: str) -> list[str]:
    """The placeholders of format string `text`, in order ("{noun}" -> ["noun"])."""
    return [field for _, field, _, _ in string.Formatter().parse(text) if field is not None]


def _templates(path: Path, templates: list[dict[str, str]], side: str, phrase: str) -> list[dict[str, str]]:
    """`templates` checked: each a prompt and a response, `phrase` (e.g. "{descriptor} {noun}", optionally after
    "{a} ") once on `side` and no other placeholder anywhere; a template that breaks this would make two groups'
    variants differ in more than the group, or not at all."""
    other = "prompt" if side == "response" else "response"
    allowed = sorted(_fields(phrase))
    for number, template in enumerate(templates, 1):
        ok = isinstance(template, dict) and set(template) == {"prompt", "response"}
        bare = template[side].replace("{a} " + phrase, phrase) if ok else ""  # the article goes with the phrase
        if not ok or sorted(_fields(bare)) != allowed or bare.count(phrase) != 1 or _fields(template[other]):
            raise InputFileError(f"{path}: template {number} must be a prompt and a response with {phrase} once in "
                                 f"its {side} (optionally after {{a}}) and no other placeholder.")
    return templates


def article(word: str) -> str:
    """The indefinite article before `word` by its first letter (identity.yaml's descriptors follow that rule;
    rmjax.train.planted_identity's sentences use it too)."""
    return "an" if word[:1].lower() in "aeiou" else "a"


def _identity(data_dir: Path) -> Battery:
    """Descriptor axes on each side (items = templates, variants = nouns), then first names by gender and origin."""
    path = data_dir / "identity.yaml"
    data = _load(path)
    variants: list[Variant] = []
    contrasts: list[Contrast] = []

    def axis(name: str, tag: str, templates: list[dict[str, str]], groups: dict[str, list[dict[str, str]]]) -> None:
        for number, template in enumerate(templates, 1):
            for group, fillings in groups.items():
                variants.extend(Variant("identity", name, f"{tag}-{number:02d}", group,
                                        template["prompt"].format(**fill), template["response"].format(**fill))
                                for fill in fillings)
        contrasts.extend(Contrast("identity", name, (group,), (AXIS_MEAN,), "length") for group in groups)

    for side, key, tag in IDENTITY_SIDES:
        part = data[key]
        templates = _templates(path, part["templates"], side, "{descriptor} {noun}")
        for name, descriptors in data["axes"].items():
            fillings = {d: [{"descriptor": d, "noun": noun, "a": article(d)} for noun in part["nouns"]]
                        for d in descriptors}
            axis(f"{name} ({side})", tag, templates, fillings)
    names = data["names"]
    templates = _templates(path, names["templates"], "response", "{name}")
    origins: dict[str, dict[str, list[str]]] = names["origins"]
    genders = list(dict.fromkeys(gender for by_gender in origins.values() for gender in by_gender))
    by_gender = {g: [n for by in origins.values() for n in by.get(g, [])] for g in genders}
    by_origin = {o: [n for g in genders for n in by.get(g, [])] for o, by in origins.items()}
    for name, groups in (("names: gender", by_gender), ("names: origin", by_origin)):
        axis(name, "name", templates, {group: [{"name": n} for n in ns] for group, ns in groups.items()})
    return Battery("identity", tuple(variants), tuple(contrasts))


def renderings(item: dict[str, Any], filler: Sequence[str]) -> dict[str, str]:
    """The five renderings of one length.yaml item: the same correct answer, more or less detailed, formatted or
    padded, so that a reward model's preference for length or markdown shows apart from content."""
    answer, details = item["answer"].strip(), [d.strip() for d in item["details"]]
    return {"concise": answer,
            "detailed": " ".join([answer, *details]),
            "markdown": f"**{answer}**\n\n" + "\n".join(f"- {d}" for d in details),
            "padded_neutral": " ".join([answer, *(f.strip() for f in filler)]),
            "restated": f"{answer} {item['restated'].strip()}"}


def _length(data_dir: Path) -> Battery:
    """Axis "renderings": items = questions, groups = renderings (one variant each); null: shuffled labels."""
    path = data_dir / "length.yaml"
    data = _load(path)
    variants = []
    for number, item in enumerate(data["items"], 1):
        if not 2 <= len(item["details"]) <= 4:
            raise InputFileError(f"{path}: item {number} ({item['question']!r}) needs 2 to 4 details.")
        rendered = renderings(item, data["filler"])
        variants.extend(Variant("length", "renderings", f"len-{number:02d}", group, item["question"].strip(),
                                rendered[group]) for group in RENDERINGS)
    contrasts = [Contrast("length", "renderings", (x,), (y,), "shuffled") for x, y in LENGTH_CONTRASTS]
    return Battery("length", tuple(variants), tuple(contrasts))


def _sycophancy(data_dir: Path) -> Battery:
    """One axis, "stated belief"; items = questions; four groups, the user's belief (right or wrong) by the answer
    (agree or disagree with it). Rows: agreeing against disagreeing under each belief, and the correct answer
    against the incorrect one whatever the user said (its difference from the first two is the belief's pull)."""
    path = data_dir / "sycophancy.yaml"
    data = _load(path)
    variants = []
    for number, q in enumerate(data["questions"], 1):
        item = f"syc-{number:02d}"
        for believed in ("right", "wrong"):
            belief, other = (q["right"], q["wrong"]) if believed == "right" else (q["wrong"], q["right"])
            if str(belief).strip().lower() == str(other).strip().lower():
                raise InputFileError(f"{path}: question {number} gives the same right and wrong answer.")
            prompt = data["prompt"].format(belief=belief, question=q["question"])
            variants += [Variant("sycophancy", SYCOPHANCY_AXIS, item, f"agree, user {believed}", prompt,
                                 data["agree"].format(belief=belief)),
                         Variant("sycophancy", SYCOPHANCY_AXIS, item, f"disagree, user {believed}", prompt,
                                 data["disagree"].format(other=other))]
    contrasts = [Contrast("sycophancy", SYCOPHANCY_AXIS, x, y, "length") for x, y in SYCOPHANCY_CONTRASTS]
    return Battery("sycophancy", tuple(variants), tuple(contrasts))


def _framing(data_dir: Path) -> Battery:
    """Axes "top Elo answers" / "bottom Elo answers": items = candidate answers (the response), groups = framings
    (the prompt); the contrasts are framing.yaml's pairs on both axes, and on the top answers minus the bottom."""
    path = data_dir / "framing.yaml"
    data = _load(path)
    framings: dict[str, str] = data["framings"]
    top, bottom = elo_candidates(DATA_DIR / data["elo_file"], int(data["count"]), int(data["max_words"]))
    variants = [Variant("framing", axis, answer, group, prompt.strip(), answer)
                for axis, answers in ((TOP, top), (BOTTOM, bottom))
                for answer in answers for group, prompt in framings.items()]
    contrasts = []
    for x, y in data["contrasts"]:
        if x not in framings or y not in framings:
            raise InputFileError(f"{path}: contrast {x} vs {y} names a framing it does not define.")
        contrasts += [Contrast("framing", axis, (x,), (y,), "length") for axis in (TOP, BOTTOM)]
    # does a wording read the answer, or only shift every answer alike? the top answers' effect minus the bottom's
    contrasts += [Contrast("framing", TOP, (x,), (y,), "length", minus_axis=BOTTOM) for x, y in data["contrasts"]]
    return Battery("framing", tuple(variants), tuple(contrasts))
