"""Activation patching: the reward of one response (the clean run) after taking another response's activation
(the donor, same prompt and length) at one (layer, position): the residual stream after the embeddings or a
layer, or one layer's attention or MLP write. Rows of one batch patch different (layer, position) pairs, so a
whole map costs a few batched forwards.

Patching a run with itself changes nothing; patching the residual after the last layer at the reward position
gives the donor's reward: both are tests.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from rmjax import nn
from rmjax.compiled import PARAMS, REPLICATED, Compiled, compiled, declared_params, rows_of
from rmjax.config import ModelConfig
from rmjax.errors import UsageError
from rmjax.model import Model
from rmjax.parallel import batching
from rmjax.parallel.distributed import replicated, to_host
from rmjax.runs.progress import Progress

COMPONENTS = ("residual", "attention", "mlp")


@dataclasses.dataclass
class PatchingMap:
    """Rewards [rows, T] (column `column`) per component: `residual` has L+1 rows (row 0: the embeddings, i.e. the
    donor's token at that position; row l: after layer l−1), `attention` and `mlp` have L."""

    clean_reward: float
    donor_reward: float
    maps: dict[str, np.ndarray]


def _donor_reads(cfg: ModelConfig, params, ids: jax.Array):
    out = nn.module(params, cfg)(ids=ids, residuals=True)
    return out.residuals, out.attention, out.mlp


def _patched(cfg: ModelConfig, params, ids: jax.Array, donor_ids: jax.Array, reads, layer: jax.Array,
             component: jax.Array, where: jax.Array, *, column: int) -> jax.Array:
    model = nn.module(params, cfg)
    rows = layer.shape[0]
    # "embeddings" rows (component -1) swap in the donor's token ids; the rest patch inside the stack.
    swap = (component < 0)[:, None] & where
    row_ids = jnp.where(swap, donor_ids, ids)
    patch = nn.Patch(layer=layer, component=component, where=where, residual=reads[0], attention=reads[1],
                     mlp=reads[2])
    mask = jnp.ones((rows, ids.shape[1]), bool)
    hidden = model(ids=row_ids, mask=mask, patch=patch).hidden
    return model.rewards_from(row_ids, mask, hidden)[:, column]


def donor_reads_call(cfg: ModelConfig, mesh) -> Compiled:
    """The compiled donor run: (params, ids [1, T]) -> every layer's residual, attention and MLP writes."""
    return compiled(_donor_reads, cfg, mesh, (PARAMS, REPLICATED), REPLICATED)


def patched_call(cfg: ModelConfig, mesh, batch_size: int, column: int = 0) -> Compiled:
    """The compiled patched runs: `batch_size` (layer, component, positions) patches of the donor's reads into the
    clean conversation -> their rewards, the patches over `data` when it divides them."""
    rows = rows_of(batch_size, 1, mesh)
    return compiled(_patched, cfg, mesh, (PARAMS, REPLICATED, REPLICATED, REPLICATED, rows, rows,
                                          rows_of(batch_size, 2, mesh)), rows, column=column)


def patching_map(model: Model, clean: list[int], donor: list[int], batch_size: int = 32,
                 column: int | None = None, skip_shared: bool = True) -> PatchingMap:
    """Every (layer, position) patch of `donor` into `clean` (token ids of whole conversations). With
    `skip_shared`, positions before the first token where the two differ are not run: attention is causal, so
    both runs hold the same activations there and the patch gives the clean reward (filled in, exactly)."""
    if len(clean) != len(donor):
        raise UsageError(f"activation patching needs responses of one length in tokens: the conversations have "
                         f"{len(clean)} and {len(donor)} tokens. Pick responses of the same token length.")
    column = model.output_column if column is None else column
    cfg = model.config
    t, layers = len(clean), cfg.num_layers
    ids, donor_ids = replicated((np.asarray([clean], np.int32), np.asarray([donor], np.int32)), model.mesh)
    params = declared_params(model)
    reads = donor_reads_call(cfg, model.mesh)(params, donor_ids)
    rows = rows_of(batch_size, 1, model.mesh)  # the patches of one call over `data` when it divides them
    patched = patched_call(cfg, model.mesh, batch_size, column)
    place = batching.place if rows != REPLICATED else replicated
    differ = np.flatnonzero(np.asarray(clean) != np.asarray(donor))
    first = int(differ[0]) if skip_shared and len(differ) else 0
    shown = range(first, t)
    plan = ([(-1, -1, p) for p in shown]  # the embeddings
            + [(c, lay, p) for c in range(len(COMPONENTS)) for lay in range(layers) for p in shown])
    plan += [(0, 0, -1), (0, 0, -2)]  # the clean run (nothing patched) and the donor's whole last residual
    out, progress = [], Progress(len(plan), "patching", unit="runs")
    for start in range(0, len(plan), batch_size):
        part = plan[start : start + batch_size]
        part += [part[-1]] * (batch_size - len(part))  # one shape: one compilation
        comp = np.asarray([c for c, _, _ in part], np.int32)
        lay = np.asarray([layer if p != -2 else layers - 1 for _, layer, p in part], np.int32)
        where = np.zeros((batch_size, t), bool)
        for i, (_, _, p) in enumerate(part):
            if p >= 0:
                where[i, p] = True
            elif p == -2:
                where[i] = True
        args = (place(a, model.mesh) for a in (lay, comp, where))
        out.append(to_host(patched(params, ids, donor_ids, reads, *args)))
        progress.update(min(batch_size, len(plan) - start))
    values = np.concatenate(out)[: len(plan)]
    width = t - first
    embeddings, rest = values[:width].reshape(1, width), values[width:-2].reshape(len(COMPONENTS), layers, width)
    computed = {"residual": np.concatenate([embeddings, rest[0]]), "attention": rest[1], "mlp": rest[2]}
    maps = {name: np.concatenate([np.full((v.shape[0], first), values[-2], np.float32), v], axis=1)
            for name, v in computed.items()}
    return PatchingMap(float(values[-2]), float(values[-1]), maps)
