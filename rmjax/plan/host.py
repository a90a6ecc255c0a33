"""The host side of a plan (issue 44): what each TPU VM host reads of the checkpoint and how much RAM loading it
may take, against the VM's RAM.

Host figures are Google's TPU VM machine types as of 2025 (chips a host, GB of RAM a VM): v4 4 chips, 407 GB;
v5e ct5lp-hightpu-1t/4t/8t 48/192/384 GB; v5p 4 chips, 448 GB; v6e ct6e-standard-1t/4t/8t 176/720/1440 GB. A
multi-host v6e slice (v6e-16 and up) is made of ct6e-standard-4t VMs: 4 chips and 720 GB each, 4 VMs for v6e-16.
"""

from __future__ import annotations

import math

import numpy as np

from rmjax import nn
from rmjax.config import ModelConfig
from rmjax.loading.hf import numpy_dtype
from rmjax.plan.chips import Slice

GB = 10**9
# chips a host; the VM's RAM by chips on it (a multi-host slice's VMs are whole hosts)
HOSTS = {"v4": (4, {4: 407 * GB}), "v5e": (8, {1: 48 * GB, 4: 192 * GB, 8: 384 * GB}),
         "v5p": (4, {4: 448 * GB}), "v6e": (8, {1: 176 * GB, 4: 720 * GB, 8: 1440 * GB})}
# chips a VM of a multi-host slice holds, where fewer than a single host's most
MULTI_HOST_VM_CHIPS = {"v6e": 4}


def host_side(cfg: ModelConfig, dtype: str, piece: Slice, model: int, per_chip_weights: int,
              stored_itemsize: int | None = None) -> dict:
    """Checkpoint bytes each host reads and an upper bound on loading's RAM peak there.

    The loader reads lazily (rmjax.parallel.sharding.place): each process reads the slices its chips hold, a
    replicated weight once. With `model` chips adjacent on the mesh, a host's chips hold min(model, chips a
    host) of the model axis's shards. The peak bounds every byte read resident at once (mapped pages count
    once touched) plus the largest weight converted to float32. Bytes read are the checkpoint's: `stored_itemsize`
    bytes an element (a float32 file read for a bfloat16 run is twice the run's bytes; None: the run's dtype)."""
    per_host, ram = HOSTS[piece.chip.name]
    if piece.chips > per_host:
        per_host = MULTI_HOST_VM_CHIPS.get(piece.chip.name, per_host)
    on_host = min(per_host, piece.chips)
    size = np.dtype(numpy_dtype(dtype)).itemsize
    declared = nn.declarations(cfg)
    weight_bytes = {name: d.size * (4 if d.float32 else size) for name, d in declared.items()}
    total = sum(weight_bytes.values())
    # per chip = replicated + sharded / model; total = replicated + sharded
    sharded = (total - per_chip_weights) * model / (model - 1) if model > 1 else 0.0
    reads = (total - sharded) + sharded * min(model, on_host) / model
    if stored_itemsize is not None:  # the same shares of the file's bytes
        reads *= sum(d.size for d in declared.values()) * stored_itemsize / total
    peak = reads + 4 * max(d.size for d in declared.values())
    vm_ram = ram.get(on_host, ram[max(ram)])
    return {"hosts": math.ceil(piece.chips / per_host), "chips_per_host": on_host,
            "checkpoint_bytes_per_host": int(reads), "host_ram_peak_bytes": int(peak), "host_ram_bytes": vm_ram,
            "fits_host_ram": peak <= vm_ram}
