"""One call from a causal LM and preference data to a trained, exported reward model.

Also the builtin default reward models: a PyPI backbone plus a small committed score head
trained with the recipe stored beside it (`rmjax/builtin/NAME.json`).
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import numpy as np

from rmjax import results
from rmjax.loading import load
from rmjax.loading.hf import Model
from rmjax.loading.safetensors_io import iter_tensors, save_file
from rmjax.train.data import Pairs, elo_pairs, elo_probability, read_elo_items, read_pairs
from rmjax.train.loop import TrainConfig, TrainResult, train_reward_model
from rmjax.train.rm import reward_model_from_lm, save_hf_folder

BUILTIN_DIR = Path(__file__).resolve().parents[1] / "builtin"


def load_pairs(pairs: str | None, elo: str | None, n_train: int, n_heldout: int, soft: bool, seed: int,
               heldout_pairs: str | None = None) -> tuple[Pairs, Pairs]:
    """(train, held-out) from a pairs file (+ optional held-out file) or an EloEverything CSV."""
    if elo:
        return elo_pairs(elo, n_train, n_heldout, soft=soft, seed=seed)
    if not pairs:
        raise ValueError("give --pairs=FILE (prompt, chosen, rejected[, label]) or --elo=EloEverything CSV.")
    data = read_pairs(pairs)
    if heldout_pairs:
        return data, read_pairs(heldout_pairs)
    order = np.random.default_rng(seed).permutation(len(data))
    cut = max(1, int(len(data) * 0.9))
    return data.take(order[:cut]), data.take(order[cut:])


def elo_agreement(model: Model, heldout: Pairs, elo_csv: str | Path, template: str) -> dict:
    """Held-out accuracy against the Elo ordering, and the best accuracy any model could reach
    on labels sampled from Elo probabilities (mean max(p, 1-p))."""
    from rmjax.textscore import TextScorer

    items = read_elo_items(elo_csv)
    elo = dict(zip(items["name"], items["elo_score"], strict=True))
    scorer = TextScorer(model, heldout.prompt[0], template)
    texts = sorted(set(heldout.chosen) | set(heldout.rejected))
    score = dict(zip(texts, scorer.score(texts), strict=True))
    ec = np.array([elo[t] for t in heldout.chosen])
    er = np.array([elo[t] for t in heldout.rejected])
    rc = np.array([score[t] for t in heldout.chosen])
    rr = np.array([score[t] for t in heldout.rejected])
    distinct = ec != er
    p = elo_probability(ec, er)
    return {
        "heldout_accuracy_vs_elo_order": float(np.mean((rc > rr)[distinct] == (ec > er)[distinct])),
        "sampled_label_ceiling": float(np.mean(np.maximum(p, 1 - p))),
    }


def run_training(
    lm_spec: str,
    train: Pairs,
    heldout: Pairs,
    cfg: TrainConfig,
    workdir: str | Path,
    export: str | Path | None = None,
    head_out: str | Path | None = None,
    dtype: str = "float32",
    elo_csv: str | None = None,
    recipe: dict | None = None,
) -> TrainResult:
    """Load the LM, add a score head, train, export an HF folder and/or the head, write a summary."""
    workdir = Path(workdir)
    lm = load(lm_spec, dtype=dtype)
    rm = reward_model_from_lm(lm, seed=cfg.seed, source=f"{lm_spec}+score")
    result = train_reward_model(rm, train, heldout, cfg, workdir)
    summary = {
        "base_model": lm_spec, "train_pairs": len(train), "heldout_pairs": len(heldout),
        "config": dataclasses.asdict(cfg), "final": result.evals[-1] if result.evals else None,
        "steps_per_second": result.steps_per_second, "seconds": result.seconds,
        "resumed_from": result.resumed_from, "recipe": recipe or {},
    }
    if elo_csv:
        summary["elo"] = elo_agreement(result.model, heldout, elo_csv, cfg.template)
    if export:
        save_hf_folder(result.model, export)
    if head_out:
        head_out = Path(head_out)
        head_out.parent.mkdir(parents=True, exist_ok=True)
        save_file({"score.weight": np.asarray(result.model.params.score).T.copy()}, head_out)
        head_out.with_suffix(".json").write_text(json.dumps(summary, indent=2, default=str))
    summary["environment"] = results.environment()
    summary["written_at"] = time.strftime("%Y-%m-%d %H:%M:%S")
    (workdir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return result


# Builtin reward models: name -> (backbone builtin, head file stem).
BUILTIN_RMS = {
    "elo-rm-smollm2-135m": "smollm2-135m-instruct",
    "elo-rm-gemma3-270m": "gemma-3-270m",
}


def load_builtin_rm(name: str, dtype: str = "float32", mesh=None) -> Model:
    """A default reward model: PyPI backbone + the committed score head (`rmjax/builtin/NAME.safetensors`)."""
    head_file = BUILTIN_DIR / f"{name}.safetensors"
    if not head_file.is_file():
        raise FileNotFoundError(f"{head_file} is missing: rebuild it with `make default-rms`.")
    (key, loader), = list(iter_tensors(head_file))
    lm = load(BUILTIN_RMS[name], dtype=dtype, mesh=mesh)
    rm = reward_model_from_lm(lm, score=np.asarray(loader()).T, source=name)
    if mesh is not None:
        from rmjax.prefix import replicated

        rm = dataclasses.replace(rm, params=dataclasses.replace(rm.params, score=replicated(rm.params.score, mesh)))
    return rm
