"""Range checks of settings, declared once per config dataclass and run when it is built.

Entry points build their config before any model loads, so a bad value stops the job at once with
one line naming the flag (flags share the fields' names), the value and the allowed range.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Callable

from rmjax.errors import UsageError

Rule = tuple[Callable[[object], bool], str]
FLOAT32_MAX = 3.4028234663852886e38  # np.finfo(np.float32).max
FLOAT32_TINY = 1.1754943508222875e-38  # np.finfo(np.float32).tiny: below it a value flushes to 0

POSITIVE: Rule = (lambda v: v >= 1, "an integer >= 1")  # a float setting: GREATER_THAN_ZERO (`validate`)
NON_NEGATIVE: Rule = (lambda v: v >= 0, ">= 0")
GREATER_THAN_ZERO: Rule = (lambda v: v > 0, "> 0")


def setting(default, help: str, choices: tuple[str, ...] | None = None, texts: bool = False):
    """A config field with its command-line help (and choices): entry points generate their flags from these.
    `texts`: a list of responses, each kept as typed (a flag's list strips spaces at each item's ends)."""
    return dataclasses.field(default=default, metadata={"help": help, **({"choices": choices} if choices else {}),
                                                        **({"texts": True} if texts else {})})


def one_of(*choices: str) -> Rule:
    return (lambda v: v in choices, "one of " + ", ".join(choices))


@functools.cache
def _float_fields(cls: type) -> frozenset[str]:
    """The fields of a config dataclass declared float (or float | None)."""
    hints = typing.get_type_hints(cls)
    return frozenset(f.name for f in dataclasses.fields(cls) if _is_float(hints.get(f.name)))


def _is_float(hint) -> bool:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return float in typing.get_args(hint)
    return hint is float


def rule_for(config_class: type, name: str, rule: Rule) -> Rule:
    """`rule` as it applies to field `name`: POSITIVE on a float setting means > 0 (it is "an integer >= 1" only
    for integers: read for a float, it refused a temperature of 0.5)."""
    return GREATER_THAN_ZERO if rule is POSITIVE and name in _float_fields(config_class) else rule


def _not_float32(value: float) -> str | None:
    """Why a float setting cannot be used as given, or None: the jobs compute in float32 (JAX's default), where a
    finite float64 past its range is inf and one below its smallest normal 0."""
    if not math.isfinite(value):
        return "must be a finite number."
    if abs(value) > FLOAT32_MAX:
        return "must be within float32's range (|x| <= 3.4e38), in which the jobs compute; give a smaller value."
    if 0 < abs(value) < FLOAT32_TINY:
        return "is 0 in float32, in which the jobs compute (|x| below 1.2e-38); give 0 or a larger value."
    return None


def validate(config, rules: dict[str, Rule]) -> None:
    """UsageError for the first field of `config` outside its rule (None passes: 'not set'; a rule reads as the
    field's declared type: `rule_for`); a float setting, and each float of a list, must be finite in float32; no item
    of a list may be empty (a trailing comma made --scores=a.csv, read '' as the current folder: every CSV in it)."""
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        wrong = [why for v in (value if isinstance(value, tuple) else (value,)) if isinstance(v, float)
                 for why in [_not_float32(v)] if why]
        if wrong:  # --embed_reg=1e39 ran GCG sampling nothing (inf on the device); --temperature=1e-300 is 0 there
            raise UsageError(f"--{field.name}={','.join(map(str, value)) if isinstance(value, tuple) else value}: "
                             f"{wrong[0]}")
        if isinstance(value, tuple) and any(isinstance(v, str) and not v.strip() for v in value):
            raise UsageError(f"--{field.name}={','.join(map(str, value))}: an item is empty (a stray comma?); give "
                             "each item once, separated by commas.")
        if field.name in rules and value is not None:
            ok, allowed = rule_for(type(config), field.name, rules[field.name])
            if not ok(value):
                raise UsageError(f"--{field.name}={value}: must be {allowed}.")


# The fewest bootstrap resamples or permutations an audit's statistics take (the audit and `analyze --audits`):
# with fewer, a percentile CI can miss its own effect and a permutation p cannot reach below 0.01.
MIN_RESAMPLES = 100
