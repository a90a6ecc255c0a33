"""Non-finite values stop a run: which rows and prompts, and where in the model the NaN starts.

A NaN or Inf score never reaches a CSV, JSON or plot silently. By default the job stops with one
line naming the first offending candidates and what a full forward of the first one shows: the
first non-finite stage (an embedding row, a layer's output, the final norm, the head) and any
non-finite parameters. `--allow_nonfinite` writes them instead and counts them in `.meta.json`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax.numpy as jnp
import numpy as np

from rmjax import nn
from rmjax.errors import NonFiniteError, UsageError
from rmjax.parallel.distributed import replicated, to_host
from rmjax.runs import finiteness
from rmjax.scoring import calls

ALLOW_HINT = finiteness.ALLOW_HINT  # one wording for every refusal of NaN/Inf


def _few(values, k: int = 5) -> str:
    values = [int(v) for v in values]
    return ", ".join(map(str, values[:k])) + (f" … ({len(values)} in all)" if len(values) > k else "")


def nonfinite_parameters(params) -> list[str]:
    """'embed (1 value, row 17)'-style descriptions of every parameter holding NaN/Inf."""
    found = []
    for path, value in sorted(nn.flat(params).items()):
        bad = ~jnp.isfinite(value)
        n = int(to_host(jnp.sum(bad)))
        if not n:
            continue
        where = ""
        if value.ndim >= 2:
            rows = np.flatnonzero(to_host(jnp.any(bad, axis=tuple(range(1, value.ndim)))))
            unit = "layer" if path.startswith("layers.") else "row"
            where = f", {unit}{'s' if len(rows) > 1 else ''} {_few(rows)}"
        found.append(f"{path} ({n} value{'s' if n > 1 else ''}{where})")
    return found


def first_nonfinite_stage(model, ids: Sequence[int]) -> str:
    """Where a full forward of `ids` first turns non-finite."""
    cfg = model.config
    host_ids = np.asarray([list(ids)], np.int32)
    batch = replicated((host_ids, np.ones_like(host_ids, bool)), model.mesh)
    trace = calls.trace(model, *batch)
    embeds = to_host(trace["embeddings"])[0]
    bad = np.flatnonzero(~np.isfinite(embeds).all(-1))
    if bad.size:
        token = int(host_ids[0, bad[0]])
        text = model.tokenizer.decode([token]) if model.tokenizer is not None else ""
        return f"the embedding row of token {token} ({text!r}) at position {int(bad[0])}"
    layers = to_host(trace["layers"])[:, 0]
    for i, out in enumerate(layers):
        positions = np.flatnonzero(~np.isfinite(out).all(-1))
        if positions.size:
            return f"the output of layer {i} (0-based, of {cfg.num_layers}) at positions {_few(positions)}"
    if not np.isfinite(to_host(trace["hidden"])).all():
        return "the final norm"
    if not np.isfinite(to_host(trace["head"])).all():
        head = "reward head" if cfg.is_reward_model else "LM head (log-softmax of the logits)"
        return f"the {head} (its input, the final hidden state, is finite)"
    return "nowhere in a full forward of this sequence (the batched or cached path differs: please report it)"


def diagnose(model, ids: Sequence[int]) -> str:
    """'; first non-finite value: …; non-finite parameters: …' for the message of a NonFiniteError."""
    try:
        stage = first_nonfinite_stage(model, ids)
    except Exception as error:  # the diagnosis must never hide the error it explains
        stage = f"unknown ({type(error).__name__} while tracing the forward)"
    params = nonfinite_parameters(model.params)
    return f"; first non-finite value: {stage}" + (f"; non-finite parameters: {'; '.join(params)}" if params else "")


def check(values: np.ndarray, *, what: str, row: Callable[[int], str], columns: Sequence[str], allow: bool,
          explain: Callable[[int, int], str] | None = None, has_flag: bool = True) -> dict | None:
    """Raise NonFiniteError when `values` [N, C] holds NaN/Inf; with `allow`, return the record for .meta.json
    (None when everything is finite). `has_flag`: the job has --allow_nonfinite to name (the audit refuses it)."""
    values = np.asarray(values).reshape(len(values), -1)
    bad = ~np.isfinite(values)
    if not bad.any():
        return None
    r, c = np.nonzero(bad)
    first = [f"{row(int(i))} for {columns[int(j)]!r}" for i, j in list(zip(r, c, strict=True))[:3]]
    record = {"values": int(bad.sum()), "rows": int(len(np.unique(r))), "first": first, "allowed": bool(allow)}
    if allow:
        return record
    where = explain(int(r[0]), int(c[0])) if explain is not None else ""
    raise NonFiniteError(
        f"non-finite {what}: {int(bad.sum())} of {values.size} are NaN/Inf, in {record['rows']} of {len(values)} "
        f"rows (first: {'; '.join(first)}){where}. No result was written: fix the model or input"
        + (f", or {ALLOW_HINT}." if has_flag else ".")
    )


def gradient_swaps_skipped(grad, banned, *, allow: bool, what: str, tokenizer=None,
                           explain: Callable[[], str] = lambda: "") -> int:
    """One rule for a search's gradient [N, V] (GCG's and the frontier's): swap_scores puts a NaN/Inf entry at
    +inf, so that swap is never proposed. Without `allow` the job stops here, naming how many entries, the first
    (position, token) and `explain()` (where the model turns NaN); with it, returns how many swaps of allowed tokens
    (not `banned` [V']) were kept from being proposed, for .meta.json's count."""
    bad = ~jnp.isfinite(grad)
    total = int(to_host(jnp.sum(bad)))
    if not total:
        return 0
    if not allow:
        position, token = np.unravel_index(int(to_host(jnp.argmax(bad.reshape(-1)))), bad.shape)
        text = f" ({tokenizer.decode([int(token)])!r})" if tokenizer is not None else ""
        raise NonFiniteError(f"{what} is NaN/Inf at {total} (position, token) entries (first: position "
                             f"{int(position)}, token {int(token)}{text}){explain()}. Fix the model, or {ALLOW_HINT}.")
    width = min(bad.shape[1], banned.shape[0])
    return int(to_host(jnp.sum(bad[:, :width] & ~jnp.asarray(banned)[None, :width])))


def merge(records: Sequence[dict | None]) -> dict | None:
    """One .meta.json record for a result checked in parts (the beam's chunks): counts summed, the first few
    offending rows kept in order; None when every part was finite."""
    found = [r for r in records if r]
    if not found:
        return None
    return {"values": sum(r["values"] for r in found), "rows": sum(r["rows"] for r in found),
            "first": [f for r in found for f in r["first"]][:3], "allowed": all(r["allowed"] for r in found)}


class Scale(tuple):
    """A yardstick: (mean, SD), as which it unpacks and is written, with how many values were scored for it
    (`values`, those left out included) and the record of those left out for NaN/Inf (`nonfinite`, `check`'s;
    None: none), which a job's .meta.json keeps (`record`): --allow_nonfinite promises that count."""

    values: int
    nonfinite: dict | None

    def __new__(cls, mean: float, sd: float, values: int, nonfinite: dict | None = None) -> Scale:
        scale = super().__new__(cls, (mean, sd))
        scale.values, scale.nonfinite = values, nonfinite
        return scale

    def __reduce__(self):  # tuple's would rebuild it from (mean, SD) alone: pickle, copy and deepcopy failed
        return Scale, (self[0], self[1], self.values, self.nonfinite)

    def record(self) -> dict:
        return {"mean": self[0], "sd": self[1], "values": self.values, "nonfinite": self.nonfinite}


def yardstick(values: np.ndarray, *, what: str, row: Callable[[int], str], allow: bool,
              fix: str) -> Scale:
    """The mean and SD (ddof 1) a z-score divides by. NaN/Inf values stop the job (`check`) or, with `allow`, are
    left out (and counted); fewer than 2 values, or an SD that is 0 or not finite, is refused in one line (the
    z-scores would be NaN or ±Inf), `fix` saying how to give a usable one."""
    values = np.asarray(values, np.float64).ravel()
    left_out = check(values[:, None], what=what, row=row, columns=["reward"], allow=allow) if len(values) else None
    kept = values[np.isfinite(values)]
    if len(kept) < 2:
        raise UsageError(f"{what}: {len(kept)} finite value{'' if len(kept) == 1 else 's'}, but a z-score's SD needs "
                         f"at least 2; {fix}.")
    mean, sd = float(kept.mean()), float(kept.std(ddof=1))
    if kept.max() == kept.min():  # one value: its computed SD need not be 0 (three 0.1s: 1.7e-17)
        raise UsageError(f"{what}: the {len(kept)} values all equal {kept[0]:.6g}; a z-score needs values that "
                         f"differ; {fix}.")
    if not (np.isfinite(mean) and np.isfinite(sd) and sd > 0):
        raise UsageError(f"{what}: the {len(kept)} values have mean {mean:.6g} and SD {sd:.6g}; a z-score needs a "
                         f"finite SD > 0; {fix}.")
    return Scale(mean, sd, len(values), left_out)


def sampled_yardstick(vocab: int, n: int, score: Callable[[np.ndarray], np.ndarray], *, allow: bool,
                      fix: str) -> Scale:
    """`yardstick` of the rewards of `n` single tokens drawn with seed 0 from ids [0, vocab): one sample for every
    job (--z_sample), so the frontier's reward_z and `score`'s z of one RM and prompt share their scale. More than
    the vocabulary is all of it (its `values` say how many were scored)."""
    tokens = np.random.default_rng(0).choice(vocab, min(n, vocab), replace=False)
    return yardstick(score(tokens), what=f"single-token rewards of {len(tokens)} sampled tokens (--z_sample)",
                     row=lambda i: f"token {int(tokens[i])}", allow=allow, fix=fix)
