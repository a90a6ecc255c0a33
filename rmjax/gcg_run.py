"""GCG as a job: build the targets of loaded models, search, write JSON + per-step CSV + .meta.json."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from rmjax import results
from rmjax.distributed import is_main
from rmjax.gcg import GCGConfig, GCGResult, gcg, make_target
from rmjax.loading import Model


def run_gcg(models: list[Model], prompts: dict[str, str], cfg: GCGConfig, out: str | Path) -> GCGResult:
    targets = [make_target(m, text, cfg.template) for m in models for text in prompts.values()]
    vocab = {len(m.tokenizer) for m in models}
    if len(vocab) > 1:
        raise ValueError("GCG over several models needs one shared tokenizer; these have vocabularies of "
                         f"sizes {sorted(vocab)}.")
    result = gcg(targets, cfg, log=lambda msg: print(msg, file=sys.stderr, flush=True) if is_main() else None)
    if not is_main():
        return result
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "best_ids": result.best_ids, "best_text": result.best_text, "best_reward": result.best_reward,
        "direction": cfg.direction, "buffer": [{"reward": r, "ids": ids, "text": models[0].tokenizer.decode(ids)}
                                               for r, ids in result.buffer],
        "history": result.history,
    }, indent=2))
    steps_csv = out.with_suffix(".steps.csv")
    keys = {"step": [h["step"] for h in result.history], "text": [h["text"] for h in result.history],
            "ids": [" ".join(map(str, h["ids"])) for h in result.history]}
    results.write_table(steps_csv, keys, {"reward": [h["reward"] for h in result.history],
                                          "seconds": [h["seconds"] for h in result.history]})
    results.write_meta(out, kind="gcg", models=[m.source for m in models], prompts=prompts,
                       config=dataclasses.asdict(cfg), output_column=models[0].config.reward_index,
                       dtype=models[0].dtype, seconds=result.seconds, steps=len(result.history),
                       seconds_per_step=result.seconds / max(len(result.history), 1))
    return result
