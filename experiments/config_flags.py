"""absl flags generated from a config dataclass (GCGConfig, TrainConfig): one flag per field, named
as the field, its help text from the field's metadata, so a setting is declared once.

Ranges are checked when the config is built (rmjax.checks), which every entry point does before a
model loads: a bad value is one `error: --flag=value: must be …` line.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Iterable
from typing import Any

from absl import flags

# Seeds feed jax.random.key (which keeps the low 32 bits: 2**32 + 5 would silently be seed 5, -1 seed 2**32 - 1),
# numpy's generators (no negative seed) and scikit-learn's RandomState (below 2**32).
SEED_MAX = 2**32 - 1


def define(cls: type, *, skip: Iterable[str] = (), defaults: dict[str, Any] | None = None) -> Callable[..., Any]:
    """Define --FIELD for each field of `cls` but `skip` (shared flags, passed to the builder instead);
    `defaults` overrides the dataclass defaults for the command line. Returns build(**given) -> cls."""
    hints = typing.get_type_hints(cls)
    holders = {}
    for field in dataclasses.fields(cls):
        if field.name in skip:
            continue
        default = (defaults or {}).get(field.name, field.default)
        holders[field.name] = _define(field.name, hints[field.name], default, field.metadata)

    def build(**given: Any) -> Any:
        values = {name: _value(holder.value, hints[name]) for name, holder in holders.items()}
        return cls(**values, **given)

    build.builds = cls
    return build


def builders(module: types.ModuleType) -> list[Callable[..., Any]]:
    """The config builders an entry point's module defined (experiments.job_line checks a launch's settings with
    them, the skipped fields at their defaults)."""
    return [value for value in vars(module).values() if callable(value) and hasattr(value, "builds")]


def _define(name: str, hint: Any, default: Any, meta: typing.Mapping) -> flags.FlagHolder:
    help_text = meta.get("help") or name
    kind = _base_type(hint)
    if "choices" in meta:
        return flags.DEFINE_enum(name, default, list(meta["choices"]), help_text)
    if kind is bool:
        return flags.DEFINE_bool(name, default, help_text)
    if kind is int and name == "seed":
        return flags.DEFINE_integer(name, default, help_text, lower_bound=0, upper_bound=SEED_MAX)
    if kind is int:
        return flags.DEFINE_integer(name, default, help_text)
    if kind is float:
        return flags.DEFINE_float(name, default, help_text)
    if kind is tuple and meta.get("texts"):
        from experiments.common import define_texts

        return define_texts(name, list(default), help_text)
    if kind is tuple:
        holder = flags.DEFINE_list(name, list(default), help_text)
        item = _item_type(hint)
        if item in (int, float):  # '1x' or an empty item reached float() later: a traceback
            flags.register_validator(name, lambda values, item=item: all(_parses(v, item) for v in values),
                                     message=f"--{name} takes {'integers' if item is int else 'numbers'} separated "
                                             "by commas")
        return holder
    return flags.DEFINE_string(name, default, help_text)


def _value(value: Any, hint: Any) -> Any:
    """A list flag as a tuple; an empty string as None where the field may be None ('--elo=' unsets it)."""
    if isinstance(value, list):
        return tuple(value)
    if value == "" and _optional(hint):
        return None
    return value


def _optional(hint: Any) -> bool:
    return (isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union) and \
        type(None) in typing.get_args(hint)


def _item_type(hint: Any) -> type | None:
    """float for `tuple[float, ...]` (or its `| None`); None when the tuple's items are not one type."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    args = typing.get_args(hint)
    return args[0] if args and all(a in (args[0], Ellipsis) for a in args) else None


def _parses(value: str, kind: type) -> bool:
    try:
        kind(value)
    except ValueError:
        return False
    return True


def _base_type(hint: Any) -> type:
    """int for `int | None`, tuple for `tuple[str, ...]`, the class otherwise."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    return typing.get_origin(hint) or hint


if __name__ == "__main__":
    from experiments import not_a_job

    not_a_job(__spec__.name)
