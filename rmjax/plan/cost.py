"""What one compiled call costs on one chip: XLA's memory analysis and a roofline time.

XLA's `cost_analysis` of the partitioned program is per chip but counts a `lax.scan` body once (the decoder
stack is one scan over layers). The count here is XLA's, scaled by the trip counts the jaxpr shows: the matmul
FLOPs (and operand bytes) of the jaxpr with every scan body times its length, over the same count with each body
once. Matmuls carry nearly all of a transformer's FLOPs, so the ratio is the decoder's layer count to within the
embedding and head's share.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import numpy as np
from jax.extend import core as jcore

from rmjax.compiled import Compiled
from rmjax.plan.chips import Chip


def _matmuls(jaxpr: jcore.Jaxpr, trips: bool) -> tuple[float, float]:
    """(FLOPs, operand + result bytes) of every dot_general in `jaxpr`; scan bodies times their length when
    `trips`, else once; a cond's costliest branch; a while body once (its trip count is not static)."""
    flops = moved = 0.0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            (contract, _), _ = eqn.params["dimension_numbers"]
            lhs, rhs, out = eqn.invars[0].aval, eqn.invars[1].aval, eqn.outvars[0].aval
            flops += 2.0 * math.prod(out.shape) * math.prod(lhs.shape[d] for d in contract)
            moved += sum(math.prod(a.shape) * np.dtype(a.dtype).itemsize for a in (lhs, rhs, out))
            continue
        subs = [_matmuls(sub, trips) for sub in _inner(eqn.params.values())]
        if not subs:
            continue
        if eqn.primitive.name == "cond":
            f, b = max(subs)
        else:
            f, b = map(sum, zip(*subs, strict=True))
        times = eqn.params["length"] if trips and eqn.primitive.name == "scan" else 1
        flops, moved = flops + times * f, moved + times * b
    return flops, moved


def _inner(values) -> list[jcore.Jaxpr]:
    out = []
    for v in values:
        if isinstance(v, jcore.ClosedJaxpr):
            out.append(v.jaxpr)
        elif isinstance(v, jcore.Jaxpr):
            out.append(v)
        elif isinstance(v, tuple | list):
            out.extend(_inner(v))
    return out


def scan_factors(traced: jax.stages.Traced) -> tuple[float, float]:
    """(FLOP factor, byte factor) from counting each scan body once to counting it per trip."""
    jaxpr = traced.jaxpr.jaxpr
    (f_all, b_all), (f_once, b_once) = _matmuls(jaxpr, True), _matmuls(jaxpr, False)
    return (f_all / f_once if f_once else 1.0), (b_all / b_once if b_once else 1.0)


def shard_bytes(tree: Any) -> int:
    """Bytes one chip holds of the abstract arrays in `tree` (each with its sharding)."""
    total = 0
    for x in jax.tree.leaves(tree):
        shape = x.sharding.shard_shape(x.shape) if getattr(x, "sharding", None) is not None else x.shape
        total += math.prod(shape) * np.dtype(x.dtype).itemsize
    return total


@dataclasses.dataclass(frozen=True)
class CallCost:
    """One compiled call on one chip, and how many times the job makes it."""

    name: str
    count: int
    flops: float  # per chip, scan trips counted
    bytes_accessed: float  # per chip, scan trips counted
    xla_flops: float  # cost_analysis as XLA reports it (each scan body once)
    argument_bytes: int
    output_bytes: int
    temp_bytes: int
    alias_bytes: int

    @property
    def peak_bytes(self) -> int:
        """Arguments, results and scratch live at once (donated arguments counted once)."""
        return self.argument_bytes + self.output_bytes + self.temp_bytes - self.alias_bytes

    def seconds(self, chip: Chip) -> float:
        """Roofline estimate of one call: the slower of compute at peak and memory traffic at full bandwidth."""
        return max(self.flops / chip.peak_flops, self.bytes_accessed / chip.hbm_bandwidth)

    def bound(self, chip: Chip) -> str:
        return "compute" if self.flops / chip.peak_flops >= self.bytes_accessed / chip.hbm_bandwidth else "memory"

    def as_dict(self, chip: Chip) -> dict:
        return {"name": self.name, "count": self.count, "flops": self.flops, "bytes_accessed": self.bytes_accessed,
                "xla_flops_scan_once": self.xla_flops, "temp_bytes": self.temp_bytes,
                "predicted_seconds": self.seconds(chip), "bound": self.bound(chip)}


def cost_of(name: str, call: Compiled, args: tuple, count: int) -> tuple[CallCost, jax.stages.Compiled]:
    """Compile `call` for `args` (abstract, with shardings on the target's devices) and read its cost."""
    traced = call.trace(*args)  # one trace serves the count and the compile
    executable = traced.lower().compile()
    analysis = executable.cost_analysis()
    analysis = analysis[0] if isinstance(analysis, list | tuple) else analysis
    memory = executable.memory_analysis()
    f_factor, b_factor = scan_factors(traced)
    xla_flops = float(analysis.get("flops", 0.0))
    return CallCost(name, count, xla_flops * f_factor, float(analysis.get("bytes accessed", 0.0)) * b_factor,
                    xla_flops, int(memory.argument_size_in_bytes), int(memory.output_size_in_bytes),
                    int(memory.temp_size_in_bytes), int(memory.alias_size_in_bytes)), executable
