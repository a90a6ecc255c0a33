"""GCG as a job: build the targets of loaded models, search, write JSON + per-step CSV + .meta.json."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np

from rmjax.errors import UsageError
from rmjax.loading.identity import model_fingerprint
from rmjax.model import Model
from rmjax.parallel.distributed import is_main
from rmjax.runs import jobs, results
from rmjax.runs.results import array_sha1
from rmjax.search.gcg import GCGResult, gcg, make_target
from rmjax.search.gcg_config import NOT_IN_IDENTITY, GCGConfig


def gcg_identity(model_fingerprints: list[dict], *, dtype: str, output_column: int, prompts: dict[str, str],
                 cfg: GCGConfig) -> dict:
    config = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in NOT_IN_IDENTITY}
    if cfg.init_from:  # before any model loads: a partial or foreign file stops here
        results.checked_input(cfg.init_from, ("beam",), "--init_from")
    for name in ("init_from", "vocab_file"):  # what they hold, not only their names
        if getattr(cfg, name):
            config[name] = {"path": getattr(cfg, name), "sha1": _input_sha1(getattr(cfg, name))}
    # the set, not its order; absent when not given (the identities of runs from before the flag hold)
    config.pop("token_ids")
    if cfg.token_ids:
        ids = np.unique(np.asarray(cfg.token_ids, np.int64))
        config["token_ids"] = {"count": len(ids), "sha1": array_sha1(ids)}
    return {"job": "gcg", "models": list(model_fingerprints), "dtype": dtype, "output_column": int(output_column),
            "prompts": dict(prompts), "config": config}


def _input_sha1(path: str) -> str | None:
    try:
        return results.file_sha1(path)
    except OSError:
        return None  # gcg() names the missing file


def steps_path(out: str | Path) -> Path:
    return Path(out).with_name(Path(out).name + ".steps.csv")  # from the full name: injective


def run_gcg(models: list[Model], prompts: dict[str, str], cfg: GCGConfig, out: str | Path,
            overwrite: bool = False) -> GCGResult | None:
    """Search and write the result; None when a finished result with the same identity is reused."""
    vocab = {len(m.tokenizer) for m in models}
    if len(vocab) > 1:
        raise UsageError("GCG over several models needs one shared tokenizer; these have vocabularies of "
                         f"sizes {sorted(vocab)}.")
    identity = gcg_identity([model_fingerprint(m) for m in models], dtype=models[0].dtype, prompts=prompts,
                            output_column=models[0].output_column, cfg=cfg)
    with jobs.job(out, identity, "gcg", overwrite=overwrite, owned=[steps_path(out)]) as job:
        if job.reuse:
            return None
        targets = [make_target(m, text, cfg.template) for m in models for text in prompts.values()]
        log = (lambda msg: print(msg, file=sys.stderr, flush=True)) if is_main() else None
        result = gcg(targets, cfg, log=log)
        nonfinite = {"candidates_dropped": result.nonfinite_candidates} if result.nonfinite_candidates else None
        job.finish(lambda path: _write(result, models[0].tokenizer.decode, cfg, path), **jobs.model_meta(models[0]),
                   models=[m.source for m in models], prompts=prompts, config=dataclasses.asdict(cfg),
                   seconds=result.seconds, steps=len(result.history), nonfinite=nonfinite,
                   seconds_per_step=result.seconds / max(len(result.history), 1))
        return result


def _write(result: GCGResult, decode, cfg: GCGConfig, out: Path) -> Path:
    """The result JSON and the per-step CSV beside it."""
    results.dump_json({
        "best_ids": result.best_ids, "best_text": result.best_text, "best_reward": result.best_reward,
        "direction": cfg.direction,
        "buffer": [{"reward": r, "ids": ids, "text": decode(ids)} for r, ids in result.buffer],
        "history": result.history,
    }, out)
    keys = {"step": [h["step"] for h in result.history], "text": [h["text"] for h in result.history],
            "ids": [" ".join(map(str, h["ids"])) for h in result.history],
            "candidates": [h["candidates"] for h in result.history]}  # evaluated at that step
    results.write_table(steps_path(out), keys, {"reward": [h["reward"] for h in result.history],
                                                "seconds": [h["seconds"] for h in result.history]})
    return out
