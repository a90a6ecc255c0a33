"""A job's plan on a TPU slice, from the model's config alone: compile its calls for the slice, read per-chip
memory from XLA, estimate the time by roofline, and pick the mesh and batch size when none is given.

The time is an estimate (each call at the slower of peak compute and full HBM bandwidth, times the number of
calls), not a measurement: no TPU is involved.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import jax

from rmjax.config import ModelConfig
from rmjax.errors import RmjaxError, UsageError
from rmjax.parallel import batching
from rmjax.plan.chips import CHIPS, Slice, mesh_on
from rmjax.plan.cost import CallCost, cost_of, shard_bytes
from rmjax.plan.shapes import SweepShape
from rmjax.runs import results
from rmjax.scoring import memory

JOBS = ("sweep", "beam", "gcg", "score", "logprobs", "inspect", "train_rm")


class PlanDoesNotFitError(RmjaxError):
    """The job needs more memory per chip than the slice's chips have."""


@dataclasses.dataclass(frozen=True)
class Option:
    """One mesh and batch size, compiled."""

    data: int
    model: int
    batch_size: int
    costs: tuple[CallCost, ...]
    weights_bytes: int
    cache_bytes: int
    refused_bytes: int = 0  # what the TPU compiler said one call needs when it refused to compile it

    @property
    def total_bytes(self) -> int:
        return max([c.peak_bytes for c in self.costs] + [self.refused_bytes])

    def seconds(self, piece: Slice) -> float:
        return sum(c.count * c.seconds(piece.chip) for c in self.costs)


def compile_option(cfg: ModelConfig, dtype: str, piece: Slice, data: int, model: int, shape,
                   batch_size: int) -> Option:
    made = shape.calls(cfg, dtype, mesh_on(piece, data, model), batch_size)
    weights = max((shard_bytes(c.weights) for c in made if c.weights is not None), default=0)
    cache = max((shard_bytes(c.cache) for c in made if c.cache is not None), default=0)
    try:
        costs = tuple(cost_of(c.name, c.call, c.args, c.count)[0] for c in made)
    except jax.errors.JaxRuntimeError as error:
        # The TPU compiler refuses a program whose buffers exceed the chip's HBM, saying what it would need
        found = re.search(r"RESOURCE_EXHAUSTED.*?\(([\d.]+)([KMGTP])\) exceeds", str(error))
        if found is None:
            raise
        need = float(found[1]) * 2 ** (10 * "KMGTP".index(found[2]) + 10)
        return Option(data, model, batch_size, (), weights, cache, int(need) + weights)
    return Option(data, model, batch_size, costs, weights, cache)


def _meshes(piece: Slice, cfg: ModelConfig, batch: int | None) -> list[tuple[int, int]]:
    """(data, model) over the slice's chips: `model` a divisor of the attention heads (beyond the KV heads, K/V
    weights and caches are whole on every chip of the axis: the sharding rules keep a dimension the axis does not
    divide whole), and `data` dividing a fixed batch."""
    out = []
    for model in range(1, piece.chips + 1):
        data = piece.chips // model
        if piece.chips % model or cfg.num_heads % model or (batch and batch % data):
            continue
        out.append((data, model))
    return out


def _sweep_batch(cfg: ModelConfig, dtype: str, piece: Slice, data: int, model: int, shape: SweepShape) -> int | None:
    """The largest power-of-two batch the jobs' own memory planner fits on one chip (None: none fits)."""
    try:
        return memory.pick_batch_size(cfg, dtype, shape.memory_prefix(), shape.positions(), data, model,
                                      piece.chip.hbm_bytes, largest=4096, backend="tpu").batch_size
    except memory.DoesNotFitError:
        return None


def choose(cfg: ModelConfig, dtype: str, piece: Slice, shape, mesh: dict | None, batch_size: int | None,
           log=print) -> tuple[Option, str]:
    """The option to run, and why: the given mesh and batch, or of those that fit the fastest by estimate."""
    fixed = shape.fixed_batch
    meshes = [(mesh["data"], mesh["model"])] if mesh else _meshes(
        piece, cfg, fixed if getattr(shape, "split_batch", False) else None)
    if not meshes:
        raise UsageError(f"no mesh of {piece.topology} splits the batch of {fixed} evenly over its data axis and the "
                         f"{cfg.num_heads} attention heads over its model axis; pass --mesh or another --batch_size.")
    options, notes = [], []
    for data, model in meshes:
        batch = fixed or batch_size or _sweep_batch(cfg, dtype, piece, data, model, shape)
        if batch is not None and not (fixed or batch_size):  # as the job: no more rows than the candidates
            batch = min(batch, batching.rows_for(shape.candidates, data))
        if batch is None:
            notes.append(f"data:{data},model:{model} fits no batch by the memory planner")
            continue
        option = compile_option(cfg, dtype, piece, data, model, shape, batch)
        fits = option.total_bytes <= piece.chip.hbm_bytes and not option.refused_bytes
        notes.append(f"data:{data},model:{model} batch {batch}: " + (
            f"the TPU compiler refuses it (over {option.total_bytes / 2**30:.1f} GiB per chip)" if option.refused_bytes
            else f"{option.total_bytes / 2**30:.2f} GiB per chip, {option.seconds(piece):.4g} s"
            + ("" if fits else " (does not fit)")))
        log(f"plan: {notes[-1]}")
        options.append((not fits, option.seconds(piece), option))
    fitting = [o for o in options if not o[0]]
    if not fitting:
        worst = min(options, key=lambda o: o[2].total_bytes)[2] if options else None
        raise PlanDoesNotFitError(_does_not_fit(cfg, dtype, piece, shape, worst))
    best = min(fitting, key=lambda o: o[1])[2]
    why = ("given --mesh and batch" if mesh and (batch_size or fixed) else
           f"fastest by estimate of those that fit: {'; '.join(notes)}")
    return best, why


def _does_not_fit(cfg: ModelConfig, dtype: str, piece: Slice, shape, option: Option | None) -> str:
    need = (f"needs {'over ' if option.refused_bytes else ''}{option.total_bytes / 2**30:.1f} GiB per chip "
            f"(data:{option.data},model:{option.model})" if option else "fits no batch by the memory planner")
    return (f"{cfg.architecture} in {dtype} on {piece.topology} {need}; a {piece.chip.name} chip has "
            f"{piece.chip.hbm_bytes / 2**30:.1f} GiB. {_smallest_fit(cfg, dtype, shape)}")


def _smallest_fit(cfg: ModelConfig, dtype: str, shape) -> str:
    """The smallest slice in the chip table whose chips hold the weights split over `model` and one batch, by the
    jobs' memory planner (an estimate: compile it to be sure)."""
    positions, prefix = shape.positions(), shape.memory_prefix()
    best = None
    for chip in CHIPS.values():
        for chips in (4, 8, 16, 32, 64, 128, 256):
            model = max(m for m in range(1, chips + 1) if chips % m == 0 and cfg.num_heads % m == 0)
            est = memory.estimate(cfg, dtype, prefix, positions, chips // model, chips // model, model,
                                  chip.hbm_bytes, backend="tpu")
            if est.total_bytes <= 0.8 * chip.hbm_bytes:
                if best is None or chips < best[0]:
                    best = (chips, f"{chip.name} with {chips} chips, --mesh=data:{chips // model},model:{model}")
                break
    return f"Smallest that fits by estimate: {best[1]}." if best else "No slice in the table fits it."


def plan(cfg: ModelConfig, dtype: str, piece: Slice, job: str, shape, mesh: dict | None = None,
         batch_size: int | None = None, log=print) -> dict:
    """The plan of `job` with `shape` on `piece` (a dict for PLAN.json). Raises PlanDoesNotFitError."""
    option, why = choose(cfg, dtype, piece, shape, mesh, batch_size, log)
    chip = piece.chip
    seconds = option.seconds(piece)
    work = sum(c.count * c.flops for c in option.costs)
    traffic = sum(c.count * c.bytes_accessed for c in option.costs)
    out = {
        "job": job, "model": cfg.architecture, "dtype": dtype, "topology": piece.topology, "chip": chip.name,
        "chips": piece.chips, "mesh": {"data": option.data, "model": option.model}, "batch_size": option.batch_size,
        "why": why,
        "per_chip_bytes": {"weights": option.weights_bytes, "cache": option.cache_bytes,
                           "temp": max(c.temp_bytes for c in option.costs),
                           "output": max(c.output_bytes for c in option.costs), "total": option.total_bytes},
        "hbm_bytes": chip.hbm_bytes,
        "calls": [c.as_dict(chip) for c in option.costs],
        "predicted_seconds": seconds,
        "bound": "compute" if work / chip.peak_flops >= traffic / chip.hbm_bandwidth else "memory",
        "chip_figures": {"peak_bf16_flops": chip.peak_flops, "hbm_bytes": chip.hbm_bytes,
                         "hbm_bandwidth": chip.hbm_bandwidth},
        "estimate": "roofline per call: max(FLOPs / peak, bytes / bandwidth) x calls; FLOPs and bytes are XLA's "
                    "per-chip cost analysis with each scan body counted per trip (rmjax.plan.cost)",
    }
    if shape.per == "candidate":
        out["positions_per_candidate"] = shape.positions()
    out[f"flops_per_{shape.per}"] = work * piece.chips / max(1, shape.work_items())
    out["assumed"] = dataclasses.asdict(shape)
    return out


def describe(p: dict) -> str:
    gib = 2**30
    b = p["per_chip_bytes"]
    return (f"{p['job']} on {p['topology']} ({p['chips']} x {p['chip']}): mesh data:{p['mesh']['data']},"
            f"model:{p['mesh']['model']}, batch {p['batch_size']}; per chip {b['total'] / gib:.2f} GiB of "
            f"{p['hbm_bytes'] / gib:.0f} (weights {b['weights'] / gib:.2f}, cache {b['cache'] / gib:.3f}, temp "
            f"{b['temp'] / gib:.2f}); predicted {_duration(p['predicted_seconds'])} ({p['bound']}-bound, estimate)")


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.3g} s"
    return f"{seconds / 3600:.2f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min"


def write(p: dict, out: str | Path) -> Path:
    """The plan as strict JSON through the jobs' one writer (results.dump_json: atomic, and a NaN/Inf estimate is
    refused naming its field; a plan has no --allow_nonfinite): a refused plan leaves any earlier file whole."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    return results.dump_json(p, out, allow_nonfinite=False)
