"""What one compiled call costs on one chip: XLA's memory analysis, and two times (issue 44).

FLOPs: XLA's `cost_analysis` of the partitioned program is per chip but counts a `lax.scan` body once (the decoder
stack is one scan over layers). The count here is XLA's, scaled by the trip counts the jaxpr shows: the matmul
FLOPs of the jaxpr with every scan body times its length, over the same count with each body once. Matmuls carry
nearly all of a transformer's FLOPs, so the ratio is the decoder's layer count to within the embedding and head's
share.

HBM traffic is modelled, not XLA's pre-hardware `bytes accessed` (scaled by trips, that counted 3-7x the real
traffic): every argument (weights, caches, inputs) read once, every result written once, and the matmuls'
activations (their operand and result bytes with scan trips counted, less the weights they read) split over the
`data` axis (replicated over `model`: an upper bound on that term).

Collectives are read from the compiled HLO: every all-reduce, all-gather, reduce-scatter, all-to-all and
collective-permute with its bytes and group, times the trip count of the while loops (scans) it sits in, priced as
a ring over the chip's ICI bandwidth.

A float32 product at "highest" costs a TPU six bf16 passes (`mxu_passes`), so compute time counts FLOPs times passes.

`lower_bound_seconds`: the larger of compute at peak and traffic at full HBM bandwidth, plus collectives at full ICI
bandwidth. `realistic_seconds`: the same at the assumed efficiencies (`assumed_mfu` by matmul rows a chip,
HBM_EFFICIENCY, ICI_EFFICIENCY): assumptions until a TPU run calibrates them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import re
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.extend import core as jcore

from rmjax.compiled import Compiled
from rmjax.loading.registry import cache_dir
from rmjax.plan.chips import Chip
from rmjax.runs import results

# bf16 passes of a TPU's MXU for one product: float32 operands at "highest" (every compiled call:
# rmjax.compiled.MATMUL_PRECISION) take six (XLA's cycle estimate for a 4096^2 product on v5e: 5.8x the bf16 one), at
# "high" three; bfloat16 operands, or JAX's default, one.
_PASSES = {jax.lax.Precision.HIGHEST: 6, jax.lax.Precision.HIGH: 3}


def _passes(eqn: jcore.JaxprEqn) -> int:
    if any(np.dtype(v.aval.dtype) != np.float32 for v in eqn.invars[:2]):
        return 1
    precision = eqn.params.get("precision")
    return max((_PASSES.get(p, 1) for p in (precision if isinstance(precision, tuple) else (precision,))), default=1)


def _matmuls(jaxpr: jcore.Jaxpr, trips: bool, loops: int = 1) -> tuple[float, float, float]:
    """(FLOPs, operand + result bytes, FLOPs times MXU passes) of every dot_general in `jaxpr`; scan bodies times
    their length when `trips`, else once; a cond's costliest branch; a while body `loops` times when `trips` (its
    trip count is not static: the caller's bound), else once."""
    flops = moved = passes = 0.0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            (contract, _), _ = eqn.params["dimension_numbers"]
            lhs, rhs, out = eqn.invars[0].aval, eqn.invars[1].aval, eqn.outvars[0].aval
            f = 2.0 * math.prod(out.shape) * math.prod(lhs.shape[d] for d in contract)
            flops, passes = flops + f, passes + f * _passes(eqn)
            moved += sum(math.prod(a.shape) * np.dtype(a.dtype).itemsize for a in (lhs, rhs, out))
            continue
        subs = [_matmuls(sub, trips, loops) for sub in _inner(eqn.params.values())]
        if not subs:
            continue
        if eqn.primitive.name == "cond":
            f, b, p = max(subs)
        else:
            f, b, p = map(sum, zip(*subs, strict=True))
        times = (eqn.params["length"] if eqn.primitive.name == "scan" else
                 loops if eqn.primitive.name == "while" else 1) if trips else 1
        flops, moved, passes = flops + times * f, moved + times * b, passes + times * p
    return flops, moved, passes


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


MFU_SOURCE = ("MFU by matmul rows a chip (FLOPs over twice the weight elements a call reads): 0.55 at >= 2048 "
              "rows (MXU-filling; MaxText reports 50-60% for dense LLMs on v5e/v5p), 0.45 at >= 512, 0.30 at >= 128, "
              "0.15 below; an assumption, not a measurement")
HBM_EFFICIENCY = 0.8  # streaming reads reach ~80% of the HBM bandwidth on TPU and GPU
ICI_EFFICIENCY = 0.7  # ring collectives reach ~70% of the links' bandwidth


def assumed_mfu(rows: float) -> float:
    """The fraction of peak a call's matmuls reach with `rows` rows a chip (MFU_SOURCE)."""
    return 0.55 if rows >= 2048 else 0.45 if rows >= 512 else 0.30 if rows >= 128 else 0.15


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective of a compiled program: its kind, result bytes on one chip, devices in its group, and how
    many times one call runs it (the trip counts of the loops around it)."""

    kind: str
    bytes: int
    group: int
    times: int

    def seconds(self, ici_bandwidth: float) -> float:
        """A ring over `group` chips: all-reduce moves 2(n-1)/n of the data through each chip, all-gather and
        all-to-all (n-1)/n of their result, reduce-scatter (n-1) results, a permute its result once."""
        n = self.group
        if n <= 1:
            return 0.0
        moved = {"all-reduce": 2 * (n - 1) / n, "all-gather": (n - 1) / n, "all-to-all": (n - 1) / n,
                 "reduce-scatter": n - 1, "collective-permute": 1.0}[self.kind] * self.bytes
        return self.times * moved / ici_bandwidth


_KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4,
                "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16, "f8e4m3fn": 1, "f8e5m2": 1}
_OP = re.compile(r"=\s*(.*?)\s+(" + "|".join(_KINDS) + r")(-start)?\(")
_SHAPE = re.compile(r"\b([a-z]+[0-9a-z]*)\[([\d,]*)\]")


def collectives(hlo: str) -> tuple[Collective, ...]:
    """The collectives of a compiled program's HLO text (see Collective), each counted once per execution of the
    computation it sits in: a while body's runs are its known trip count times its caller's."""
    bodies, current, header = {}, None, re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
    entry = None
    for line in hlo.splitlines():
        found = header.match(line)
        if found and not line.startswith(" "):
            current = found[1]
            bodies[current] = []
            entry = current if line.startswith("ENTRY") else entry
        elif current is not None:
            bodies[current].append(line)
    runs: dict[str, int] = {}

    def visit(name: str, times: int) -> None:
        runs[name] = runs.get(name, 0) + times
        for line in bodies.get(name, ()):
            body = re.search(r"body=%?([\w.\-]+)", line)
            if body and " while(" in line:
                visit(body[1], times * _trips(line, bodies))
            for called in re.findall(r"(?:calls=|branch_computations=\{)(%?[\w.\-]+(?:,\s*%[\w.\-]+)*)", line):
                for one in called.split(","):
                    visit(one.strip().lstrip("%"), times)

    if entry is not None:
        visit(entry, 1)
    out = []
    for name, times in runs.items():
        for line in bodies.get(name, ()):
            op = _OP.search(line)
            if op is None:
                continue
            shapes = _SHAPE.findall(op[1])
            if not shapes:
                continue
            dtype, dims = shapes[-1]  # an async start's tuple ends with its result
            size = math.prod(int(d) for d in dims.split(",") if d) * _DTYPE_BYTES.get(dtype, 4)
            out.append(Collective(op[2], size, _group(line), times))
    return tuple(out)


def _trips(line: str, bodies: dict[str, list[str]]) -> int:
    """A while loop's trip count: XLA's known_trip_count, else its condition's `i < constant` (a scan counts
    from 0 by 1), else 1."""
    known = re.search(r'"known_trip_count":\{"n":"(\d+)"', line)
    if known:
        return int(known[1])
    cond = re.search(r"condition=%?([\w.\-]+)", line)
    lines = bodies.get(cond[1], []) if cond else []
    constants = {m[1]: int(m[2]) for m in (re.search(r"%([\w.\-]+) = s32\[\]\S* constant\((\d+)\)", x) for x in lines)
                 if m}
    for x in lines:
        compare = re.search(r"compare\(%[\w.\-]+, %([\w.\-]+)\), direction=LT", x)
        if compare and compare[1] in constants:
            return constants[compare[1]]
    return 1


def _group(line: str) -> int:
    """Devices in each of an op's replica groups: mesh['a'=1,'b'=4] {'b'} (the named axes' sizes), {{0,1},{2,3}}
    or the iota form [2,2]<=[4] (2 groups of 2); a permute's pairs count as a group of 2."""
    named = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", line)
    if named:
        sizes = {k: int(v) for k, v in re.findall(r"'([^']+)'=(\d+)", named[1])}
        return math.prod(sizes[a] for a in re.findall(r"'([^']+)'", named[2]))
    iota = re.search(r"replica_groups=\[([\d,]+)\]<=", line)
    if iota:
        return int(iota[1].split(",")[-1])
    listed = re.search(r"replica_groups=\{\{([\d,]*)\}", line)
    if listed:
        return len(listed[1].split(","))
    return 2 if "source_target_pairs" in line else 1


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
    traffic_bytes: float  # per chip, modelled (module docstring)
    xla_flops: float  # cost_analysis as XLA reports it (each scan body once)
    argument_bytes: int
    output_bytes: int
    temp_bytes: int
    alias_bytes: int
    collectives: tuple[Collective, ...] = ()
    weight_elements: float = 0.0  # weights one chip reads per call (for the MFU's rows)
    mxu_passes: float = 1.0  # bf16 passes per FLOP, FLOP-weighted over the products (`_PASSES`)
    kept: bool = False  # XLA's numbers came from the plan cache, not a compile now (compiled_numbers)
    beside_bytes: int = 0  # the job's arrays live through the call that are not its arguments

    @property
    def peak_bytes(self) -> int:
        """Arguments, results and scratch live at once (donated arguments counted once), and the arrays the job
        keeps beside them."""
        return self.argument_bytes + self.output_bytes + self.temp_bytes - self.alias_bytes + self.beside_bytes

    @property
    def rows(self) -> float:
        """Matmul rows a chip: FLOPs over 2 x the weight elements (inf with no weights)."""
        return self.flops / (2 * self.weight_elements) if self.weight_elements else math.inf

    def terms(self, chip: Chip, realistic: bool = False) -> dict[str, float]:
        """Seconds of one call: compute, memory, collective, at peak (lower bound) or at the assumed efficiencies."""
        mfu, hbm, ici = (assumed_mfu(self.rows), HBM_EFFICIENCY, ICI_EFFICIENCY) if realistic else (1, 1, 1)
        return {"compute": self.flops * self.mxu_passes / (chip.peak_flops * mfu),
                "memory": self.traffic_bytes / (chip.hbm_bandwidth * hbm),
                "collective": sum(c.seconds(chip.ici_bandwidth * ici) for c in self.collectives)}

    def seconds(self, chip: Chip, realistic: bool = True) -> float:
        """One call: the slower of compute and memory, plus collectives (not overlapped: a bound's simplicity)."""
        t = self.terms(chip, realistic)
        return max(t["compute"], t["memory"]) + t["collective"]

    def bound(self, chip: Chip) -> str:
        t = self.terms(chip)
        return max(t, key=t.get)

    def as_dict(self, chip: Chip) -> dict:
        return {"name": self.name, "count": self.count, "flops": self.flops, "traffic_bytes": self.traffic_bytes,
                "xla_flops_scan_once": self.xla_flops, "temp_bytes": self.temp_bytes,
                "beside_bytes": self.beside_bytes, "peak_bytes": self.peak_bytes,
                "collective_bytes": sum(c.bytes * c.times for c in self.collectives),
                "assumed_mfu": assumed_mfu(self.rows), "mxu_passes": self.mxu_passes,
                "lower_bound_seconds": self.seconds(chip, realistic=False),
                "realistic_seconds": self.seconds(chip), "bound": self.bound(chip)}


def cost_of(name: str, call: Compiled, args: tuple, count: int, weights: Any = None, data: int = 1,
            loop_trips: int = 0, beside: Any = None) -> CallCost:
    """Compile `call` for `args` (abstract, with shardings on the target's devices) and read its cost; `weights`
    (the argument holding the model's weights) and the `data` axis size model the activations' traffic. A call
    whose `lax.while_loop` runs at most `loop_trips` times (a greedy decode; 0: no loop planned, a body counted
    once) is planned at that bound: its body's FLOPs that many times, its arguments (weights, cache) read again on
    each trip. `beside`: abstract arrays the job holds through the call without passing them (its peak counts
    them)."""
    traced = call.trace(*args)  # one trace serves the count and the compile
    xla = compiled_numbers(traced.lower(), args)
    jaxpr = traced.jaxpr.jaxpr
    (f_all, moved, passes), (f_once, _, _) = _matmuls(jaxpr, True, max(1, loop_trips)), _matmuls(jaxpr, False)
    xla_flops = xla["flops"]
    global_weights = sum(math.prod(x.shape) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(weights))
    arguments, outputs = xla["argument_bytes"], xla["output_bytes"]
    # the weights read on each trip are in `arguments` (every trip) and in `moved` (every trip): taken out of `moved`
    traffic = arguments * (1 + loop_trips) + outputs + max(0.0, moved - global_weights * (1 + loop_trips)) / data
    elements = sum(math.prod(x.sharding.shard_shape(x.shape)) if getattr(x, "sharding", None) is not None
                   else math.prod(x.shape) for x in jax.tree.leaves(weights))
    return CallCost(name, count, xla_flops * (f_all / f_once if f_once else 1.0), traffic, xla_flops, arguments,
                    outputs, xla["temp_bytes"], xla["alias_bytes"], collectives(xla["hlo"]), float(elements),
                    passes / f_all if f_all else 1.0, xla["kept"], shard_bytes(beside) if beside is not None else 0)


NUMBERS = {"flops": float, "argument_bytes": int, "output_bytes": int, "temp_bytes": int, "alias_bytes": int,
           "hlo": str}
KEPT_FORMAT = 1  # of a kept entry and its key: a change here leaves the old entries unread
# jax settings that reach the compile's options, not the lowered text (jax/_src/compiler.py)
COMPILE_SETTINGS = ("jax_optimization_level", "jax_memory_fitting_level", "jax_exec_time_optimization_effort",
                    "jax_memory_fitting_effort", "jax_enable_remat_opt_pass", "jax_disable_most_optimizations",
                    "jax_xla_profile_version", "jax_use_shardy_partitioner", "jax_enable_pgle")


def compiled_numbers(lowered: jax.stages.Lowered, args: tuple) -> dict:
    """What the plan reads of XLA's compile (NUMBERS: flops, memory sizes, the compiled HLO; `kept`: read from the
    cache). A TPU compile here is deviceless (20 s for one 8B sweep call on 2 cores) and jax's persistent cache
    cannot load it, so a TPU compile's numbers are kept in the rmjax cache (plans/) under a key of the program's
    text (shapes, shardings, donation, precision), the chips in the mesh's order (kind, ids, coordinates), the
    compiler's build, XLA_FLAGS and LIBTPU_INIT_ARGS, the jax settings that reach the compile's options, and
    jax's and jaxlib's versions; a refusal for want of HBM is kept too (CompileRefused). CPU compiles are not kept
    (quick, and in jax's own cache). An unreadable entry is compiled again; a cache that cannot be written is
    passed over."""
    devices = _devices(args)
    path = None
    if devices and devices[0].platform == "tpu":
        import jaxlib

        settings = {name: repr(jax.config.values.get(name)) for name in COMPILE_SETTINGS}
        key = json.dumps([KEPT_FORMAT, lowered.as_text(), devices[0].client.platform_version, jax.__version__,
                          jaxlib.__version__, [(d.id, d.device_kind, list(getattr(d, "coords", ()))) for d in devices],
                          os.environ.get("XLA_FLAGS", ""), os.environ.get("LIBTPU_INIT_ARGS", ""), settings])
        path = cache_dir() / "plans" / f"{hashlib.sha256(key.encode()).hexdigest()}.json"
        kept = _read_numbers(path)
        if kept is not None and "refused" in kept:
            raise CompileRefused(kept["refused"])
        if kept is not None:
            return kept | {"kept": True}
    try:
        executable = lowered.compile()
    except jax.errors.JaxRuntimeError as error:
        if "RESOURCE_EXHAUSTED" not in str(error):
            raise
        _keep(path, {"refused": str(error)})
        raise CompileRefused(str(error)) from None
    analysis = executable.cost_analysis()
    analysis = analysis[0] if isinstance(analysis, list | tuple) else analysis
    memory = executable.memory_analysis()
    numbers = {"flops": float(analysis.get("flops", 0.0)), "argument_bytes": int(memory.argument_size_in_bytes),
               "output_bytes": int(memory.output_size_in_bytes), "temp_bytes": int(memory.temp_size_in_bytes),
               "alias_bytes": int(memory.alias_size_in_bytes), "hlo": executable.as_text()}
    _keep(path, numbers)
    return numbers | {"kept": False}


class CompileRefused(Exception):
    """The TPU compiler refused the program (its buffers exceed the chip's HBM), now or in a kept entry; the
    message is the compiler's, naming what it would need."""


def _keep(path: Path | None, entry: dict) -> None:
    if path is not None:
        with contextlib.suppress(OSError):  # read-only or full: the plan goes on, compiling next time too
            path.parent.mkdir(parents=True, exist_ok=True)
            results.dump_json(entry, path)


def _devices(args: tuple) -> list:
    """The devices the arguments are laid out on: the first mesh's, in its order (which the lowered text does not
    record), else the first sharding's in id order; none without shardings."""
    for x in jax.tree.leaves(args):
        sharding = getattr(x, "sharding", None)
        if sharding is None:
            continue
        mesh = getattr(sharding, "mesh", None)
        if mesh is not None and hasattr(mesh, "devices"):
            return list(mesh.devices.flat)
        return sorted(sharding.device_set, key=lambda d: d.id)
    return []


def _read_numbers(path: Path) -> dict | None:
    """A kept entry, or None where there is none or it is not one (torn, edited): then the program compiles."""
    try:
        numbers = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if isinstance(numbers, dict) and set(numbers) == {"refused"} and isinstance(numbers["refused"], str):
        return numbers
    if not (isinstance(numbers, dict) and set(numbers) == set(NUMBERS)):
        return None
    kinds = {float: (int, float), int: (int,), str: (str,)}
    if any(isinstance(numbers[k], bool) or not isinstance(numbers[k], kinds[t]) for k, t in NUMBERS.items()):
        return None
    if not math.isfinite(numbers["flops"]):
        return None
    return {k: t(numbers[k]) for k, t in NUMBERS.items()}
