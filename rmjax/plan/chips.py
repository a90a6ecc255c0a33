"""TPU chips and slices, for compiling ahead of time on a machine with no TPU (deviceless AOT through libtpu).

The chip figures are Google's published per-chip numbers (BUILD_NOTES names the pages); a plan's times are a
roofline lower bound and an MFU-derated estimate from them (rmjax.plan.cost), not measurements. Prices are a dated
list (PRICES) that the plan multiplies by its realistic time: check the pricing page before budgeting.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
from typing import TYPE_CHECKING

import numpy as np

from rmjax.errors import UsageError

if TYPE_CHECKING:  # jax starts only where a slice's devices are asked for: launch/*.sh read slice names (job_line)
    from jax.sharding import Mesh

GB = 10**9


@dataclasses.dataclass(frozen=True)
class Chip:
    name: str
    peak_flops: float  # dense bf16 FLOP/s
    hbm_bytes: int  # what one program may use (v5e: libtpu allows 15.75 of its 16 GiB)
    hbm_bandwidth: float  # bytes/s
    chip_config: str  # libtpu's chip configuration: one jax device per chip (megacore where a chip has two cores)
    ici_bandwidth: float  # inter-chip interconnect, bytes/s per chip, both directions
    cloud_name: str  # Cloud TPU's accelerator-type prefix
    cores_in_name: int  # Cloud names count chips (v5e, v6e) or TensorCores, 2 a chip (v4, v5p)
    slice_chips: tuple[int, ...]  # the chip counts Cloud TPU sells as one slice, smallest first


CHIPS = {
    "v4": Chip("v4", 275e12, 32 * 2**30, 1200 * GB, "megacore", 1200 * GB, "v4", 2,
               (4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)),
    "v5e": Chip("v5e", 197e12, int(15.75 * 2**30), 819 * GB, "default", 400 * GB, "v5litepod", 1,
                (1, 4, 8, 16, 32, 64, 128, 256)),
    "v5p": Chip("v5p", 459e12, 95 * 2**30, 2765 * GB, "megacore", 1200 * GB, "v5p", 2,
                (4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 6144)),
    "v6e": Chip("v6e", 918e12, 32 * 2**30, 1640 * GB, "default", 800 * GB, "v6e", 1, (1, 4, 8, 16, 32, 64, 128, 256)),
}
_CORES_IN_NAME = {name: chip.cores_in_name for name, chip in CHIPS.items()}

# US dollars per chip-hour. On demand: Google's Cloud TPU pricing page, us-central1 / us-east5 list prices as of
# 2025 (v4 3.22, v5e 1.20, v5p 4.20, v6e 2.70). Spot: not a list price here but on-demand x 0.35, the middle of
# the 60-70% Spot discount Google states for TPUs. Regions and dates differ: check the page before budgeting.
PRICES_AS_OF = "2025 list prices, us-central1 / us-east5 (cloud.google.com/tpu/pricing); spot = 0.35 x on demand"
PRICES = {"v4": (3.22, 3.22 * 0.35), "v5e": (1.20, 1.20 * 0.35), "v5p": (4.20, 4.20 * 0.35),
          "v6e": (2.70, 2.70 * 0.35)}
_GRIDS = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}
# v4 and v5p's default shapes by chip count (Cloud TPU's v4/v5p pages; the v4 pod has 4,096 chips, v5p's largest
# slice 16x16x24)
_CUBES = {1: "1x1x1", 2: "1x1x2", 4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8",
          256: "4x8x8", 512: "8x8x8", 1024: "8x8x16", 2048: "8x16x16", 4096: "16x16x16", 6144: "16x16x24"}


@dataclasses.dataclass(frozen=True)
class Slice:
    """A TPU slice: chip kind and libtpu topology name (e.g. v5e:2x4)."""

    chip: Chip
    topology: str

    @property
    def chips(self) -> int:
        return math.prod(self.dims)

    @property
    def dims(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.topology.split(":")[1].split("x"))

    @property
    def accelerator_type(self) -> str:
        """Cloud TPU's name for it (gcloud --accelerator-type): v5litepod-8, v5p-8 (4 chips), v6e-1, ..."""
        return f"{self.chip.cloud_name}-{self.chips * self.chip.cores_in_name}"

    def usd_per_hour(self, spot: bool = False) -> float:
        return self.chips * PRICES[self.chip.name][1 if spot else 0]


def parse_slice(name: str) -> Slice:
    """'v5e:2x4' (libtpu's topology) or 'v5e-8' (Cloud TPU's accelerator type) -> Slice: one Cloud TPU sells (a
    plan of v5e:3x3 or v6e-512 was named and priced)."""
    m = re.fullmatch(r"(v4|v5e|v5p|v6e):(\d+(?:x\d+){1,2})", name.strip())
    if m and all(int(d) >= 1 for d in m[2].split("x")):  # v5e:0x0 is no slice
        piece = Slice(CHIPS[m[1]], f"{m[1]}:{m[2]}")
        axes = 3 if m[1] in ("v4", "v5p") else 2  # v4 and v5p are 3-D tori, v5e and v6e 2-D
        if len(piece.dims) == axes and piece.chips in piece.chip.slice_chips:
            return piece
        raise UsageError(f"--topology={name}: rmjax's slice table has no such {m[1]} slice (it knows {axes}-D ones "
                         f"of {', '.join(map(str, piece.chip.slice_chips))} chips, the sizes Cloud TPU sells).")
    m = re.fullmatch(r"(v4|v5e|v5p|v6e|v5litepod)-(\d+)", name.strip())
    if m and int(m[2]) % _CORES_IN_NAME["v5e" if m[1] == "v5litepod" else m[1]] == 0:
        kind = "v5e" if m[1] == "v5litepod" else m[1]
        chips = int(m[2]) // _CORES_IN_NAME[kind]
        grid = (_CUBES if kind in ("v4", "v5p") else _GRIDS).get(chips)
        if grid and chips in CHIPS[kind].slice_chips:
            return Slice(CHIPS[kind], f"{kind}:{grid}")
        if chips:
            sold = ", ".join(f"{m[1]}-{c * _CORES_IN_NAME[kind]}" for c in CHIPS[kind].slice_chips)
            raise UsageError(f"--topology={name}: rmjax's slice table has no such slice (it knows {sold}).")
    raise UsageError(f"--topology={name}: expected a TPU slice such as v5e:2x4 or v5e-8 (chips {', '.join(CHIPS)}).")


@contextlib.contextmanager
def _quiet_fd(fd: int = 2):
    """libtpu writes its start-up complaints (no TPU_WORKER_HOSTNAMES on a machine with no TPU) straight to the
    process's stderr, past Python: hold that file descriptor on /dev/null while it starts."""
    saved = os.dup(fd)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), fd)
            yield
    finally:
        os.dup2(saved, fd)
        os.close(saved)


def devices(piece: Slice) -> list:
    """The slice's devices, one a chip, for compiling (none is attached). Needs libtpu (jax[tpu])."""
    import jax
    from jax.experimental import topologies

    from rmjax.parallel.distributed import quiet_absent_tpu

    try:
        import libtpu  # noqa: F401
    except ImportError:
        raise UsageError(f"compiling for {piece.topology} needs libtpu: pip install 'jax[tpu]=={jax.__version__}' "
                         "(about 700 MB; no TPU is needed).") from None
    quiet_absent_tpu()

    with _quiet_fd():
        desc = topologies.get_topology_desc(topology_name=piece.topology, platform="tpu",
                                            chip_config_name=piece.chip.chip_config, **_host_bounds(piece))
    return list(desc.devices)


def _host_bounds(piece: Slice) -> dict:
    """libtpu lays a slice out on hosts of 2x2x1 chips by default, which a slice smaller than one host (v5e-1,
    v6e-1, v5p-2: one chip) does not divide: it is its own host."""
    dims = (*piece.dims, 1, 1)[:3]
    if all(d % b == 0 for d, b in zip(dims, (2, 2, 1), strict=True)):
        return {}
    return {"chips_per_host_bounds": [math.gcd(d, b) for d, b in zip(dims, (2, 2, 1), strict=True)]}


def mesh_on(piece: Slice, data: int, model: int) -> Mesh:
    """A ('data', 'model') mesh over the slice's chips, model-parallel chips adjacent."""
    from jax.sharding import Mesh

    grid = np.asarray(devices(piece), dtype=object)
    if data * model != grid.size:
        raise UsageError(f"--mesh=data:{data},model:{model} needs {data * model} chips; {piece.topology} has "
                         f"{grid.size}.")
    return Mesh(grid.reshape(data, model), ("data", "model"))
