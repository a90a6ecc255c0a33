"""A job's plan on a TPU slice, from the model's config alone: compile its calls for the slice, read per-chip
memory from XLA, bound and estimate the time (rmjax.plan.cost), price it, and pick the mesh and batch size when
none is given.

The times are a lower bound and an estimate at assumed efficiencies, not measurements: no TPU is involved.
"""

from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path

from rmjax.config import ModelConfig
from rmjax.errors import RmjaxError, UsageError
from rmjax.parallel import batching
from rmjax.plan.chips import CHIPS, PRICES_AS_OF, Slice, mesh_on, parse_slice
from rmjax.plan.cost import (
    HBM_EFFICIENCY,
    ICI_EFFICIENCY,
    MFU_SOURCE,
    CallCost,
    CompileRefused,
    cost_of,
    shard_bytes,
)
from rmjax.plan.host import host_side
from rmjax.plan.shapes import SweepShape
from rmjax.runs import results
from rmjax.scoring import memory

JOBS = ("sweep", "beam", "gcg", "score", "logprobs", "inspect", "train_rm", "audit")


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
    compile_seconds: float = 0.0  # measured here, compiling for the slice

    @property
    def total_bytes(self) -> int:
        # at least the weights (a head-only train_rm's step reads no backbone, and a 27B once "fit" one 16 GiB chip
        # at 0.11 GiB): a floor, as every job's calls read them (the head-only run's feature pass), their peaks too
        return max([c.peak_bytes for c in self.costs] + [self.refused_bytes, self.weights_bytes])

    def seconds(self, piece: Slice, realistic: bool = True) -> float:
        return sum(c.count * c.seconds(piece.chip, realistic) for c in self.costs)

    def terms(self, piece: Slice, realistic: bool = False) -> dict[str, float]:
        """The job's compute, memory and collective seconds, each summed over its calls."""
        out = {"compute": 0.0, "memory": 0.0, "collective": 0.0}
        for c in self.costs:
            for k, v in c.terms(piece.chip, realistic).items():
                out[k] += c.count * v
        return out


def compile_option(cfg: ModelConfig, dtype: str, piece: Slice, data: int, model: int, shape,
                   batch_size: int) -> Option:
    made = shape.calls(cfg, dtype, mesh_on(piece, data, model), batch_size)
    # the planned model's (an --lm's calls count it beside them, and in the host's reads)
    weights = max((shard_bytes(c.weights) for c in made if c.weights is not None and not c.other_model), default=0)
    cache = max((shard_bytes(c.cache) for c in made if c.cache is not None and not c.other_model), default=0)
    started = time.perf_counter()
    try:
        costs = tuple(cost_of(c.name, c.call, c.args, c.count, c.weights, data, c.loop_trips, c.beside)
                      for c in made)
    except CompileRefused as error:
        # The TPU compiler refuses a program whose buffers exceed the chip's HBM, saying what it would need
        found = re.search(r"RESOURCE_EXHAUSTED.*?\(([\d.]+)([KMGTP])\) exceeds", str(error))
        if found is None:
            raise
        need = float(found[1]) * 2 ** (10 * "KMGTP".index(found[2]) + 10)
        return Option(data, model, batch_size, (), weights, cache, int(need) + weights)
    return Option(data, model, batch_size, costs, weights, cache, compile_seconds=time.perf_counter() - started)


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
    if getattr(shape, "fsdp", False):  # train_rm refuses --fsdp with no data axis to split over
        meshes = [(data, model) for data, model in meshes if data > 1]
        if not meshes:
            raise UsageError(f"--fsdp splits the trained weights over the mesh's data axis, and no mesh of "
                             f"{piece.topology} has one of size > 1 that divides the batch of {fixed}; leave --fsdp "
                             "out.")
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
        if batch_size and not fixed and isinstance(shape, SweepShape):  # the job's own check of a given batch
            est = memory.estimate(cfg, dtype, shape.memory_prefix(), shape.positions(), batch, data, model,
                                  piece.chip.hbm_bytes, backend="tpu")
            if est.total_bytes > piece.chip.hbm_bytes:  # XLA's figure fitted where the job refuses, on the VM
                notes.append(f"data:{data},model:{model} batch {batch}: the job's memory planner refuses it "
                             f"({est.describe()})")
                log(f"plan: {notes[-1]}")
                continue
        option = compile_option(cfg, dtype, piece, data, model, shape, batch)
        fits = option.total_bytes <= piece.chip.hbm_bytes and not option.refused_bytes
        notes.append(f"data:{data},model:{model} batch {batch}: " + (
            f"the TPU compiler refuses it (over {option.total_bytes / 2**30:.1f} GiB per chip)" if option.refused_bytes
            else f"{option.total_bytes / 2**30:.2f} GiB per chip, {option.seconds(piece):.4g} s realistic"
            + ("" if fits else " (does not fit)")))
        log(f"plan: {notes[-1]}")
        options.append((not fits, option.seconds(piece), option))
    fitting = [o for o in options if not o[0]]
    if not fitting:
        worst = min(options, key=lambda o: o[2].total_bytes)[2] if options else None
        raise PlanDoesNotFitError(_does_not_fit(cfg, dtype, piece, shape, worst))
    # realistic time with collectives; times within 1% of each other tie, and a tie goes to the smaller model axis
    fastest = min(o[1] for o in fitting)
    best = min((o for o in fitting if o[1] <= 1.01 * fastest), key=lambda o: (o[2].model, o[1]))[2]
    why = ("given --mesh and batch" if mesh and (batch_size or fixed) else
           f"fastest by realistic time (with collectives; within 1% the smaller model axis) of those that fit: "
           f"{'; '.join(notes)}")
    return best, why


def _does_not_fit(cfg: ModelConfig, dtype: str, piece: Slice, shape, option: Option | None) -> str:
    need = (f"needs {'over ' if option.refused_bytes else ''}{option.total_bytes / 2**30:.1f} GiB per chip "
            f"(data:{option.data},model:{option.model})" if option else "fits no batch by the memory planner")
    return (f"{cfg.architecture} in {dtype} on {piece.accelerator_type} ({piece.topology}) {need}; a "
            f"{piece.chip.name} chip has {piece.chip.hbm_bytes / 2**30:.2f} GiB. {_smallest_fit(cfg, dtype, shape)}")


def _smallest_fit(cfg: ModelConfig, dtype: str, shape) -> str:
    """The cheapest slices (by price per hour, on demand) whose chips hold the job by estimate, named as gcloud
    names them. A shape with its own estimate (`per_chip_estimate`: training counts gradients and optimizer
    state) is sized by it; the others by the jobs' memory planner (weights split over `model` and one batch)."""
    fits = []
    for chip in CHIPS.values():
        for chips in chip.slice_chips:
            piece = parse_slice(f"{chip.cloud_name}-{chips * chip.cores_in_name}")
            model = max(m for m in range(1, chips + 1) if chips % m == 0 and cfg.num_heads % m == 0)
            if hasattr(shape, "per_chip_estimate"):
                need, mesh = shape.per_chip_estimate(cfg, dtype, chips, model)
            else:
                need = memory.estimate(cfg, dtype, shape.memory_prefix(), shape.positions(), chips // model,
                                       chips // model, model, chip.hbm_bytes, backend="tpu").total_bytes
                mesh = f"--mesh=data:{chips // model},model:{model}"
            if need <= 0.8 * chip.hbm_bytes:
                fits.append((piece.usd_per_hour(), piece.accelerator_type, mesh))
                break
    if not fits:
        return "No slice in the table fits it."
    ranked = ", ".join(f"{name} ({mesh}, ${usd:.2f}/h on demand)" for usd, name, mesh in sorted(fits)[:3])
    return f"Cheapest that fit by estimate: {ranked}."


def _train_tries(shape, tries: list, mesh: dict | None, fsdp: str, remat: str) -> list:
    """The training variants train_rm would take with these flags (`--fsdp`, `--remat` given as true are checked
    as the job checks them; auto tries no FSDP where there is no data axis to split over)."""
    from types import SimpleNamespace

    from rmjax.train.settings import TrainConfig, check_batch_on_mesh, check_sharding_settings

    job_mesh = SimpleNamespace(shape=mesh) if mesh else None  # what batching.data_shards reads of a Mesh
    given = TrainConfig(trainable=shape.trainable, last_k=shape.last_k, steps=shape.steps,
                        batch_size=shape.batch_size, fsdp=fsdp == "true", remat=remat == "true")
    check_sharding_settings(given, job_mesh)
    check_batch_on_mesh(given, job_mesh)
    return [t for t in tries if not t.fsdp] if mesh and mesh["data"] == 1 else tries


def _splits_data(piece: Slice, cfg: ModelConfig, shape) -> bool:
    """Whether some mesh `choose` tries has a data axis over 1 (where --fsdp means something)."""
    return any(data > 1 for data, _ in _meshes(piece, cfg, shape.fixed_batch if shape.split_batch else None))


def plan(cfg: ModelConfig, dtype: str, piece: Slice, job: str, shape, mesh: dict | None = None,
         batch_size: int | None = None, log=print, fsdp: str = "auto", remat: str = "auto",
         stored: tuple[int | None, int | None] = (None, None)) -> dict:
    """The plan of `job` with `shape` on `piece` (a dict for PLAN.json). Raises PlanDoesNotFitError. Training
    tries neither FSDP nor remat first, then FSDP, then remat, then both (`fsdp`, `remat`: auto, on or off).
    `stored`: the bytes an element of the model's and the --lm's checkpoints take (spec.stored_itemsize)."""
    tries = shape.variants(fsdp, remat) if hasattr(shape, "variants") else [shape]
    if hasattr(shape, "variants"):  # what train_rm refuses, by its own checks, on the mesh it would be given
        tries = _train_tries(shape, tries, mesh, fsdp, remat)
        if not mesh and not _splits_data(piece, cfg, shape):
            tries = [t for t in tries if not t.fsdp] or tries
    for attempt in tries:
        resident = attempt.resident_bytes(cfg, dtype, piece.chips, mesh["model"] if mesh else piece.chips) if (
            hasattr(attempt, "resident_bytes") and attempt is not tries[-1]) else 0
        if resident > piece.chip.hbm_bytes:  # a compile would only confirm it (minutes for a large model)
            log(f"plan: does not fit with fsdp={attempt.fsdp}, remat={attempt.remat} (its weights and optimizer "
                f"state alone take {resident / 2**30:.1f} GiB per chip); trying the next")
            continue
        try:
            option, why = choose(cfg, dtype, piece, attempt, mesh, batch_size, log)
        except PlanDoesNotFitError:
            if attempt is tries[-1]:
                raise
            log(f"plan: does not fit with fsdp={attempt.fsdp}, remat={attempt.remat}; trying the next")
            continue
        if attempt is not tries[0]:  # the flags the run needs: remat may come without FSDP (auto tries it first)
            needed = " and ".join(name for name, on in (("FSDP", attempt.fsdp), ("remat", attempt.remat)) if on)
            why = f"the state does not fit without {needed}; " + why
        shape = attempt
        break
    chip = piece.chip
    lower, realistic = option.seconds(piece, realistic=False), option.seconds(piece)
    terms = option.terms(piece)
    work = sum(c.count * c.flops for c in option.costs)
    hours = realistic / 3600
    out = {
        "job": job, "model": cfg.architecture, "dtype": dtype, "topology": piece.topology, "chip": chip.name,
        "chips": piece.chips, "accelerator_type": piece.accelerator_type,
        "mesh": {"data": option.data, "model": option.model}, "batch_size": option.batch_size, "why": why,
        "per_chip_bytes": {"weights": option.weights_bytes, "cache": option.cache_bytes,
                           "temp": max(c.temp_bytes for c in option.costs),
                           "output": max(c.output_bytes for c in option.costs),
                           "beside": max(c.beside_bytes for c in option.costs), "total": option.total_bytes},
        "hbm_bytes": chip.hbm_bytes,
        "calls": [c.as_dict(chip) for c in option.costs],
        "lower_bound_seconds": lower,
        "realistic_seconds": realistic,
        "predicted_seconds": realistic,
        "collective_seconds": terms["collective"],
        "bound": max(terms, key=terms.get),
        "lower_bound_terms_seconds": terms,
        "assumed_mfu": _weighted_mfu(option),
        "assumed_mfu_source": MFU_SOURCE,
        "assumed_hbm_efficiency": HBM_EFFICIENCY, "assumed_ici_efficiency": ICI_EFFICIENCY,
        "usd_on_demand": hours * piece.usd_per_hour(), "usd_spot": hours * piece.usd_per_hour(spot=True),
        "prices": PRICES_AS_OF,
        "host": _host(cfg, dtype, piece, option, getattr(shape, "lm", None), stored),
        "compile_seconds": option.compile_seconds,
        "compile_kept": bool(option.costs) and all(c.kept for c in option.costs),
        "chip_figures": {"peak_bf16_flops": chip.peak_flops, "hbm_bytes": chip.hbm_bytes,
                         "hbm_bandwidth": chip.hbm_bandwidth, "ici_bandwidth": chip.ici_bandwidth},
        "estimate": "lower bound: per call max(FLOPs / peak, modelled HBM traffic / bandwidth) + collectives / ICI "
                    "bandwidth, times calls; realistic: the same at the assumed MFU and efficiencies "
                    "(rmjax.plan.cost)",
    }
    if shape.per == "candidate":
        out["positions_per_candidate"] = shape.positions()
    out[f"flops_per_{shape.per}"] = work * piece.chips / max(1, shape.work_items())
    out["assumed"] = dataclasses.asdict(shape)
    return out


def _host(cfg: ModelConfig, dtype: str, piece: Slice, option: Option, lm: ModelConfig | None,
          stored: tuple[int | None, int | None] = (None, None)) -> dict:
    """host_side of the model, and of a search's --lm where the job loads one too: both checkpoints read, their
    loading peaks added (an upper bound: the first one's pages may stay mapped while the second loads)."""
    host = host_side(cfg, dtype, piece, option.model, option.weights_bytes, stored[0])
    if lm is None:
        return host
    from rmjax.plan.calls import abstract_params

    lm_weights = shard_bytes(abstract_params(lm, dtype, mesh_on(piece, option.data, option.model)))
    other = host_side(lm, dtype, piece, option.model, lm_weights, stored[1])
    peak = host["host_ram_peak_bytes"] + other["host_ram_peak_bytes"]
    return host | {"checkpoint_bytes_per_host": host["checkpoint_bytes_per_host"] + other["checkpoint_bytes_per_host"],
                   "host_ram_peak_bytes": peak, "fits_host_ram": peak <= host["host_ram_bytes"]}


def _weighted_mfu(option: Option) -> float:
    """The MFU the realistic time assumes, over the whole job: its FLOPs over peak times its compute seconds."""
    from rmjax.plan.cost import assumed_mfu

    work = sum(c.count * c.flops for c in option.costs)
    at = sum(c.count * c.flops / assumed_mfu(c.rows) for c in option.costs)
    return work / at if at else 0.0


def describe(p: dict) -> str:
    gib = 2**30
    b = p["per_chip_bytes"]
    return (f"{p['job']} on {p['topology']} ({p['chips']} x {p['chip']}, {p['accelerator_type']}): mesh "
            f"data:{p['mesh']['data']},model:{p['mesh']['model']}, batch {p['batch_size']}{_train_flags(p)}; per chip "
            f"{b['total'] / gib:.2f} GiB of {p['hbm_bytes'] / gib:.2f} (weights {b['weights'] / gib:.2f}, cache "
            f"{b['cache'] / gib:.3f}, temp {b['temp'] / gib:.2f}"
            + (f", held beside {b['beside'] / gib:.2f}" if b.get("beside") else "")
            + f"); lower bound {_duration(p['lower_bound_seconds'])},"
            f" realistic {_duration(p['realistic_seconds'])} at MFU {p['assumed_mfu']:.2f} ({p['bound']}-bound; "
            f"collectives {_duration(p['collective_seconds'])}); ${p['usd_on_demand']:.2f} on demand, "
            f"${p['usd_spot']:.2f} spot; each of {p['host']['hosts']} host(s) reads "
            f"{p['host']['checkpoint_bytes_per_host'] / 2**30:.1f} GiB of checkpoint, loading peaks under "
            f"{p['host']['host_ram_peak_bytes'] / 2**30:.1f} of {p['host']['host_ram_bytes'] / 2**30:.0f} GiB RAM"
            + ("" if p["host"]["fits_host_ram"] else " (MAY NOT FIT the VM's RAM)")
            + (f"; XLA's numbers of an earlier compile, read in {p['compile_seconds']:.1f} s (the rmjax cache's plans/)"
               if p["compile_kept"] else f"; compiled here in {p['compile_seconds']:.1f} s"))


def _train_flags(p: dict) -> str:
    """The --fsdp / --remat a training plan assumed, which train_rm runs only when given (its defaults are off): a
    plan that fits only with remat said just its mesh and batch."""
    assumed = p.get("assumed") or {}
    if p["job"] != "train_rm" or "fsdp" not in assumed:
        return ""
    given = [flag for flag, on in (("--fsdp", assumed["fsdp"]), ("--remat", assumed["remat"])) if on]
    return f" with {' '.join(given)}" if given else " without --fsdp or --remat"


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
