"""Per-device memory estimate for a sweep: parameters + prefix cache + activations of one batch.

Printed before loading so a run that cannot fit fails in seconds with the numbers and the fix,
not after minutes of loading; also picks the largest batch size that fits.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np

from rmjax import nn
from rmjax.config import ModelConfig
from rmjax.errors import RmjaxError
from rmjax.loading.hf import numpy_dtype
from rmjax.parallel import batching, sharding


def _itemsize(dtype: str) -> int:
    return np.dtype(numpy_dtype(dtype)).itemsize  # the loader's dtype table, one source


class DoesNotFitError(RmjaxError):
    """The model, its prefix cache and one batch exceed the device memory."""


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    params_bytes: int  # per device
    cache_bytes: int  # per device
    batch_bytes: int  # per device, for `batch_size` candidates
    batch_size: int
    device_bytes: int
    upcast_bytes: int = 0  # per device: the float32 copy of bfloat16 weights a CPU computes with
    held_bytes: int = 0  # per device: the weights of the other models the job holds meanwhile (weights_held)

    @property
    def total_bytes(self) -> int:
        return self.params_bytes + self.cache_bytes + self.batch_bytes + self.upcast_bytes + self.held_bytes

    def describe(self) -> str:
        gib = 2**30
        upcast = f" + their float32 copy {self.upcast_bytes / gib:.2f} GiB" if self.upcast_bytes else ""
        held = f" + the job's other models {self.held_bytes / gib:.2f} GiB" if self.held_bytes else ""
        return (f"per device: params {self.params_bytes / gib:.2f} GiB{upcast}{held} + prefix cache "
                f"{self.cache_bytes / gib:.3f} GiB + batch of {self.batch_size} {self.batch_bytes / gib:.2f} GiB = "
                f"{self.total_bytes / gib:.2f} GiB of {self.device_bytes / gib:.1f} GiB")


def param_bytes(cfg: ModelConfig, dtype: str, model_shards: int) -> int:
    """Sharded weights split over `model` (heads, MLP, vocab); norms and the score head replicated."""

    return sum(_per_device(decl, 4 if decl.float32 else _itemsize(dtype), model_shards)
               for decl in nn.declarations(cfg).values())


def _per_device(decl, itemsize: int, model_shards: int) -> int:
    """One weight's bytes on a device, as the loader places it (sharding.spec_for): split over `model` where it
    divides a dimension of a `model` axis, else whole."""
    size = decl.size * itemsize
    sharded = any(sharding.RULES.get(ax) == "model" and dim % model_shards == 0
                  for ax, dim in zip(decl.axes, decl.shape, strict=True) if ax)
    return size // model_shards if sharded else size


def upcast_bytes(cfg: ModelConfig, dtype: str, model_shards: int, backend: str | None = None,
                 lm_head: bool | None = None) -> int:
    """A CPU has no bfloat16 matmul: XLA computes in float32 from a float32 copy of every bfloat16 weight a matmul
    reads (not the weights kept in float32, nor the embedding table where it is only gathered from: all but an LM
    whose head is the table), held beside the bfloat16 weights for the whole call. XLA's memory analysis of a 2B
    sweep's compiled call on the CPU (as rmjax.plan.cost reads it): temp 7.85 GiB beside 4.87 GiB of weights.
    `lm_head`: whether the call computes LM logits (default: a causal LM does; an RM that is its own prior does
    too, through its tied table)."""
    if dtype != "bfloat16" or (backend or jax.default_backend()) != "cpu":
        return 0
    reads_head = not cfg.is_reward_model if lm_head is None else lm_head
    gathered = not (cfg.tie_embeddings and reads_head)
    return sum(_per_device(decl, 4, model_shards) for name, decl in nn.declarations(cfg).items()
               if not decl.float32 and not (name == "embed.embedding" and gathered))


def estimate(cfg: ModelConfig, dtype: str, prefix_len: int, positions: int, batch_size: int,
             data_shards: int = 1, model_shards: int = 1, device_bytes: int = 16 * 2**30,
             backend: str | None = None, held_bytes: int = 0) -> MemoryEstimate:
    """Memory of a prefix-cached sweep; `positions` = new tokens per candidate (1 + suffix). `backend`: where it
    runs (default: JAX's default backend), for the CPU's float32 copy of bfloat16 weights; `held_bytes`: other
    models' weights on the device meanwhile."""
    b = _itemsize(dtype)
    kv_shards = model_shards if cfg.num_kv_heads % model_shards == 0 else 1
    cache = 2 * cfg.num_layers * prefix_len * cfg.num_kv_heads * cfg.head_dim * b // kv_shards
    rows = math.ceil(batch_size / data_shards)
    tokens = rows * positions
    # Live activations of one layer (residual, q/k/v, MLP intermediate) + f32 attention scores over prefix + new
    # keys. A scoring call keeps no K/V of the new positions (XLA drops the scan's unused K/V outputs): counting
    # them overstated an 8B sweep's batch by 0.56 GiB a chip, 12-32% of the total (measured against XLA's analysis).
    per_layer = tokens * (4 * cfg.hidden_size + 2 * cfg.intermediate_size // model_shards) * b
    scores = tokens * (cfg.num_heads // max(1, model_shards)) * (prefix_len + positions) * 4 * 2
    return MemoryEstimate(param_bytes(cfg, dtype, model_shards), cache, per_layer + scores, batch_size, device_bytes,
                          upcast_bytes(cfg, dtype, model_shards, backend), held_bytes)


def pick_batch_size(cfg: ModelConfig, dtype: str, prefix_len: int, positions: int, data_shards: int = 1,
                    model_shards: int = 1, device_bytes: int = 16 * 2**30, headroom: float = 0.8,
                    largest: int = 4096, backend: str | None = None, held_bytes: int = 0) -> MemoryEstimate:
    """The largest power-of-two batch (a multiple of the data shards) within `headroom` of the device."""
    best = None
    size = data_shards
    while size <= largest:
        est = estimate(cfg, dtype, prefix_len, positions, size, data_shards, model_shards, device_bytes, backend,
                       held_bytes)
        if est.total_bytes > headroom * device_bytes:
            break
        best, size = est, size * 2
    if best is None:
        est = estimate(cfg, dtype, prefix_len, positions, data_shards, data_shards, model_shards, device_bytes, backend,
                       held_bytes)
        # float32 drops the CPU's copy of this model, but doubles the others' weights beside it
        dtype_fix = ("--dtype=float32 takes less memory on the CPU (no float32 copy)" if est.upcast_bytes and
                     not held_bytes else "use bfloat16" if dtype != "bfloat16" else
                     "hold fewer models beside it" if held_bytes else "use a smaller model")
        raise DoesNotFitError(
            f"{cfg.architecture} in {dtype} does not fit: {est.describe()}. Shard the parameters over more "
            f"devices (--mesh=data:D,model:M with a larger M), {dtype_fix}, or use devices with more memory."
        )
    return best


def host_memory_bytes() -> int:
    """This host's RAM: the physical memory, or the container's cgroup limit when that is lower (a plan against
    the machine's RAM would let a container's job be killed instead of refused)."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            physical = min(physical, int(text))
    return physical


def device_memory_bytes() -> int:
    """Memory of one local device: the accelerator's limit, or on CPU the host RAM split over devices."""
    stats = jax.local_devices()[0].memory_stats() or {}
    if "bytes_limit" in stats:
        return int(stats["bytes_limit"])
    return host_memory_bytes() // jax.local_device_count()


def largest_fitting(fits: Callable[[int], bool], upto: int, multiple: int = 1) -> int | None:
    """The largest multiple of `multiple` in [multiple, upto] for which `fits` (monotone: true up to some value)
    holds, by bisection; None when not even `multiple` fits. What a refusal offers as the value that fits."""
    lo, hi = 0, max(upto, multiple) // multiple  # in units of `multiple`: fits(lo) (or lo == 0), not fits(hi + 1)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid * multiple) else (lo, mid - 1)
    return lo * multiple or None


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def plan(cfg: ModelConfig, dtype: str, prefix_len: int, positions: int, mesh: jax.sharding.Mesh | None,
         batch_size: int | None = None, saved: str | None = None, held: int = 0) -> MemoryEstimate:
    """The estimate for `batch_size`, or for the largest batch that fits when None (CPU: at most 256).

    Raises DoesNotFitError, with the numbers and the fix, when the run cannot fit. `saved`: the saved progress a
    resume keeps `batch_size` from (a smaller --batch_size cannot change it: the fix is to delete it); `held`: the
    per-device bytes of the other models the job holds meanwhile (weights_held).
    """
    data, model_shards = batching.data_shards(mesh), batching.model_shards(mesh)
    device = device_memory_bytes()
    if batch_size is None:
        largest = 256 if jax.default_backend() == "cpu" else 4096
        return pick_batch_size(cfg, dtype, prefix_len, positions, data, model_shards, device, largest=largest,
                               held_bytes=held)
    est = estimate(cfg, dtype, prefix_len, positions, batch_size, data, model_shards, device, held_bytes=held)
    if est.total_bytes > device:
        fits = largest_fitting(lambda b: estimate(cfg, dtype, prefix_len, positions, b, data, model_shards,
                                                  device, held_bytes=held).total_bytes <= device, batch_size, data)
        fix = (f"use a smaller --batch_size: {fits} is the largest that fits (--batch_size=0 picks one)" if fits else
               "not even a batch of one fits: use more `model` shards, bfloat16 or a larger device")
        asked = f"--batch_size={batch_size}"
        if saved is not None and fits:
            asked = f"the batch size {batch_size} of the progress saved in {saved}"
            fix = (f"a resume keeps it: resume where it fits, or delete {saved} and rerun with --batch_size={fits} "
                   "or less (its saved rows are scored again)")
        raise DoesNotFitError(f"{cfg.architecture} in {dtype} with {asked} does not fit: {est.describe()}; {fix}.")
    return est


def weights_held(models: list[tuple[str, ModelConfig]], dtype: str, mesh: jax.sharding.Mesh | None, job: str,
                 fix: str, at_once: int = 0) -> list[int]:
    """Each model's per-device weights, for a job that holds `models` ((label, config), as it loads them) at once;
    refused in one line, naming each, when together they exceed the device with the float32 copies a CPU makes
    for one call: the largest model's, or `at_once` bytes where a call runs several (a forked forward: two RMs').
    A batch planned for one of them counts the others' (`beside`, plan's `held`)."""
    model_shards = batching.model_shards(mesh)
    each = [param_bytes(cfg, dtype, model_shards) for _, cfg in models]
    total = sum(each) + max(at_once, *(upcast_bytes(cfg, dtype, model_shards) for _, cfg in models))
    device = device_memory_bytes()
    if total > device:
        listed = ", ".join(f"{label} {gib(n)}" for (label, _), n in zip(models, each, strict=True))
        dtype_fix = "" if dtype == "bfloat16" else "bfloat16 (--dtype), "
        raise DoesNotFitError(f"the {job} holds {len(models)} models at once ({listed}): {gib(total)} of weights "
                              f"per device, more than its {gib(device)}; use {dtype_fix}more `model` shards "
                              f"(--mesh=data:D,model:M with a larger M), or {fix}.")
    return each


def beside(weights: int, cfg: ModelConfig, dtype: str, mesh: jax.sharding.Mesh | None) -> int:
    """The other models' part of `weights` (the sum of weights_held): what a plan for the model of `cfg` holds
    beside its own (0 when `weights` is 0: a job of one model)."""
    return max(0, weights - param_bytes(cfg, dtype, batching.model_shards(mesh)))
