"""Range checks of settings, declared once per config dataclass and run when it is built.

Entry points build their config before any model loads, so a bad value stops the job at once with
one line naming the flag (flags share the fields' names), the value and the allowed range.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from rmjax.errors import UsageError

Rule = tuple[Callable[[object], bool], str]

POSITIVE: Rule = (lambda v: v >= 1, "an integer >= 1")
NON_NEGATIVE: Rule = (lambda v: v >= 0, ">= 0")
GREATER_THAN_ZERO: Rule = (lambda v: v > 0, "> 0")


def setting(default, help: str, choices: tuple[str, ...] | None = None):
    """A config field with its command-line help (and choices): entry points generate their flags from these."""
    return dataclasses.field(default=default, metadata={"help": help, **({"choices": choices} if choices else {})})


def one_of(*choices: str) -> Rule:
    return (lambda v: v in choices, "one of " + ", ".join(choices))


def validate(config, rules: dict[str, Rule]) -> None:
    """UsageError for the first field of `config` outside its rule (None passes: 'not set'); a float
    setting must be finite."""
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise UsageError(f"--{field.name}={value}: must be a finite number.")
        if field.name in rules and value is not None:
            ok, allowed = rules[field.name]
            if not ok(value):
                raise UsageError(f"--{field.name}={value}: must be {allowed}.")
