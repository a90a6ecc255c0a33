"""The --mesh flag's text, read without jax: flag checks and launch scripts read it before any device starts."""

from __future__ import annotations

import re


def parse_mesh_spec(spec: str) -> dict[str, int]:
    """'data:8,model:1' -> {'data': 8, 'model': 1}; a -1 size takes the remaining devices."""
    sizes = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, size = part.partition(":")
        if name not in ("data", "model") or not re.fullmatch(r"-?[0-9]+", size) or name in sizes:  # not '--1', '²'
            raise ValueError(f"bad mesh spec {spec!r}: expected e.g. 'data:8,model:1' (axes data and model, once each)")
        sizes[name] = int(size)
        if sizes[name] < 1 and sizes[name] != -1:
            raise ValueError(f"bad mesh spec {spec!r}: axis {name} has size {sizes[name]}; sizes are >= 1 (or -1: "
                             "the remaining devices)")
    if list(sizes.values()).count(-1) > 1:
        raise ValueError(f"bad mesh spec {spec!r}: only one axis may be -1")
    sizes.setdefault("data", -1 if sizes.get("model") != -1 else 1)
    sizes.setdefault("model", 1)
    return sizes
