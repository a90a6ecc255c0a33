"""One call from a causal LM and preference data to a trained, exported reward model (the recipe of the
builtin default reward models, `make default-rms`)."""

from __future__ import annotations

import dataclasses
import re
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import jax
import numpy as np

from rmjax import nn
from rmjax.errors import UsageError
from rmjax.loading import config_and_tokenizer, config_of, fingerprint, load
from rmjax.loading.export import HF_FOLDER_FILES, save_hf_folder
from rmjax.loading.identity import hash_json
from rmjax.loading.reward_head import new_head_fingerprint, reward_model_from_lm
from rmjax.loading.safetensors_io import save_file
from rmjax.model import Model
from rmjax.parallel.distributed import is_main, to_host
from rmjax.runs import results
from rmjax.runs.atomic import read_json
from rmjax.runs.claims import Claim, Output, claim_all
from rmjax.runs.folder_files import remove
from rmjax.runs.identities import canonical
from rmjax.runs.paths import refuse_folder_name
from rmjax.runs.results import dump_json
from rmjax.text.chat import Conversations, check_response_fits, has_chat_template
from rmjax.train.data import Pairs, elo_csv, elo_pairs, elo_probability, read_elo_items, read_pairs, split_pairs
from rmjax.train.loop import TrainResult, train_reward_model
from rmjax.train.settings import (
    TrainConfig,
    check_batch_on_mesh,
    check_batch_size,
    check_heldout,
    check_last_k,
    check_sharding_settings,
    train_identity,
)
from rmjax.train.workdir import forget_unsaved_run, read_log, start_workdir, workdir_output


def load_pairs(pairs: str | None, elo: str | None, n_train: int, n_heldout: int, soft: bool, seed: int,
               heldout_pairs: str | None = None) -> tuple[Pairs, Pairs, dict]:
    """(train, held-out, split sizes) from a pairs file (+ optional held-out file) or an EloEverything CSV;
    a pairs file without a held-out file is split by prompt or response item (`split_pairs`), never by pair."""
    if elo:
        train, heldout = elo_pairs(elo, n_train, n_heldout, soft=soft, seed=seed)
        return train, heldout, {"split_by": "item", "train_pairs": len(train), "heldout_pairs": len(heldout)}
    if not pairs:
        raise UsageError("give --pairs=FILE (prompt, chosen, rejected[, label]) or --elo=EloEverything CSV.")
    data = read_pairs(pairs)
    if heldout_pairs:  # pairs shared with --pairs are refused once the template renders them (check_context)
        heldout = read_pairs(heldout_pairs)
        return data, heldout, {"split_by": "file", "train_pairs": len(data), "heldout_pairs": len(heldout)}
    return split_pairs(data, seed=seed)


def train_from_data(model: str, cfg: TrainConfig, *, pairs: str | None = None, elo: str | None = None,
                    heldout_pairs: str | None = None, n_train: int = 20000, n_heldout: int = 4000, soft: bool = False,
                    workdir: str | Path | None = None, export: str | Path | None = None,
                    head_out: str | Path | None = None, dtype: str = "float32", overwrite: bool = False,
                    mesh: jax.sharding.Mesh | None = None) -> TrainResult:
    """train_rm's one call: the pairs (a file, or EloEverything), the template checked against the model's
    tokenizer before any weight is read, then `run_training` with the recipe and the files the run reads."""
    from rmjax.loading.for_job import check_model_template

    train, heldout, split = load_pairs(pairs, elo, n_train, n_heldout, soft, cfg.seed, heldout_pairs)
    check_model_template(model, cfg.template)  # a broken chat template stops the job here, not after the LM loads
    print("split: " + ", ".join(f"{k} {v}" for k, v in split.items()), file=sys.stderr)
    if elo:  # the prompt is the file's name: said, as a file named otherwise gives a prompt no one wrote
        print(f"--elo={elo}: its pairs answer the prompt {train.prompt[0]!r} (the file's name)", file=sys.stderr)
    # the Elo pairs' settings only where they made the pairs (a --pairs run recorded defaults it never used)
    recipe = {"elo": elo, "pairs": pairs, **({"n_train": n_train, "n_heldout": n_heldout, "soft": soft} if elo else {}),
              "split": split}
    inputs = {"--pairs": pairs, "--heldout_pairs": heldout_pairs,  # --overwrite once deleted an --elo file given
              "--elo": str(elo_csv(elo)) if elo else None,  # as --head_out, then trained and failed to reread it
              **({f"--model={model}": model} if Path(model).exists() else {})}  # a folder too
    return run_training(model, train, heldout, cfg, workdir, export=export, head_out=head_out, dtype=dtype,
                        elo_csv=elo, recipe=recipe, overwrite=overwrite, mesh=mesh, inputs=inputs)


def elo_agreement(model: Model, heldout: Pairs, elo_csv: str | Path, template: str) -> dict:
    """Held-out accuracy against the Elo ordering, and the best accuracy any model could reach
    on labels sampled from Elo probabilities (mean max(p, 1-p))."""
    from rmjax.scoring.texts import TextScorer

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


def training_identity(lm_spec: str, train: Pairs, heldout: Pairs, cfg: TrainConfig, dtype: str = "float32") -> dict:
    """The identity of a run (before loading anything heavy): equal to what train_reward_model computes."""
    return train_identity(new_head_fingerprint(fingerprint(lm_spec), cfg.seed), dtype, train, heldout, cfg)


def check_context(lm_spec: str, pairs: tuple[Pairs, ...], template: str) -> None:
    """Refuse, from the tokenizer before the weights load, a pair whose conversation is longer than the model's
    context: every trainable part but the head trained on it silently (positions the model never saw), and the head
    was refused only once the model had loaded."""
    config, tokenizer = config_and_tokenizer(lm_spec)
    context = config.max_position_embeddings
    by_prompt: dict[str, set[str]] = {}
    for part in pairs:
        for prompt, chosen, rejected in zip(part.prompt, part.chosen, part.rejected, strict=True):
            by_prompt.setdefault(prompt, set()).update((chosen, rejected))
    rendered: dict[tuple[str, str], list[int]] = {}
    for prompt, responses in by_prompt.items():
        texts = sorted(responses)
        conversations = Conversations(tokenizer, prompt, template, max_positions=context)  # the prompt's own check
        for text, ids in zip(texts, conversations.token_ids(texts), strict=True):
            check_response_fits(text, len(ids), context, f" after {prompt[:40]!r}; shorten or drop that pair")
            rendered[prompt, text] = ids
    for name, part in zip(("training", "held-out"), pairs, strict=False):
        for number, (prompt, chosen, rejected, label) in enumerate(zip(part.prompt, part.chosen, part.rejected,
                                                                       part.label, strict=True), 1):
            if name == "training" and chosen == rejected and label == 0.5:
                continue  # a weightless pair (rmjax.train.planted.weightless): a batch's place, no gradient
            if rendered[prompt, chosen] == rendered[prompt, rejected]:  # 'gold' and 'gold ' under a trimming template
                raise UsageError(f"{name} pair {number}: {chosen!r} and {rejected!r} are one conversation once the "
                                 f"template renders them (after {prompt[:40]!r}): no preference to learn, and scored "
                                 "wrong in held-out accuracy whatever the model does; remove that pair.")
    if len(pairs) > 1:
        _refuse_trained_heldout(pairs[0], pairs[1], rendered)


def _refuse_trained_heldout(train: Pairs, heldout: Pairs, rendered: dict[tuple[str, str], list[int]]) -> None:
    """Held-out accuracy on a pair the model trained on measures memory, not generalisation. A pair is its two
    rendered conversations whichever side its label prefers: 'gold' and ' gold' are one response under a trimming
    template, so raw strings missed it."""
    def key(prompt: str, chosen: str, rejected: str) -> frozenset:
        return frozenset((tuple(rendered[prompt, chosen]), tuple(rendered[prompt, rejected])))

    trained: dict[frozenset, int] = {}
    for number, row in enumerate(zip(train.prompt, train.chosen, train.rejected, strict=True), 1):
        trained.setdefault(key(*row), number)
    shared = [(number, trained[k]) for number, row in
              enumerate(zip(heldout.prompt, heldout.chosen, heldout.rejected, strict=True), 1)
              if (k := key(*row)) in trained]
    if shared:
        raise UsageError(f"{len(shared)} of the {len(heldout)} held-out pairs are training pairs once the template "
                         f"renders them (first: held-out pair {shared[0][0]} is training pair {shared[0][1]}); "
                         "held-out accuracy on pairs trained on measures memory: hold out pairs not trained on.")


def check_head_out(head_out: str | Path | None, trainable: str) -> None:
    """--head_out writes the score head alone: after a run that trained backbone layers too, that head on the base
    model scores other numbers than the trained model did. Refused from the settings (train_rm's flags, a launch)."""
    if head_out and trainable != "head":
        raise UsageError(f"--head_out writes the score head alone, and --trainable={trainable} trains backbone layers "
                         "too, which it would not write (on the base model the head scores other numbers); use "
                         "--export=DIR for the whole model.")
    if head_out:
        refuse_folder_name(head_out, "--head_out")  # Path() below drops a trailing '/': a file `dir` was written


def head_recipe_path(head_out: Path) -> Path:
    """The recipe JSON beside a --head_out file: X.safetensors -> X.json (the builtin heads'); another name keeps
    it whole (head.v1 -> head.v1.json), so head.v1 and head.v2 never share one recipe."""
    return head_out.with_suffix(".json") if head_out.suffix == ".safetensors" else \
        head_out.with_name(head_out.name + ".json")


def default_workdir(lm_spec: str, identity: dict, root: str | Path = "runs/train_rm") -> Path:
    """One folder per run (base model, data and settings), so two runs never share checkpoints."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(lm_spec.rstrip("/")).name).strip("-") or "model"
    return Path(root) / f"{name}-{hash_json(identity)[:10]}"


def run_training(
    lm_spec: str,
    train: Pairs,
    heldout: Pairs,
    cfg: TrainConfig,
    workdir: str | Path | None = None,
    export: str | Path | None = None,
    head_out: str | Path | None = None,
    dtype: str = "float32",
    elo_csv: str | None = None,
    recipe: dict | None = None,
    overwrite: bool = False,
    mesh: jax.sharding.Mesh | None = None,
    inputs: Mapping[str, str | None] | None = None,
) -> TrainResult:
    """Load the LM, add a score head, train, export an HF folder and/or the head, write a summary. `inputs`
    (flag -> path): the files the run reads (--pairs, a model file), which no output may be.

    Every output (workdir, export folder, head file) is checked and locked before the model loads;
    `workdir` defaults to a folder derived from the run (`default_workdir`). With `mesh` the weights are
    sharded by the logical-axis rules and each step's pairs split over `data`.
    """
    check_batch_size(cfg.batch_size, len(train))
    check_heldout(heldout)
    check_batch_on_mesh(cfg, mesh)
    check_sharding_settings(cfg, mesh)
    base = config_of(lm_spec)
    check_last_k(cfg, base, lm_spec)  # before any output is claimed or weight read
    if base.head is not None:  # its gating tensors stayed beside the new head: an export no loader reads right
        raise UsageError(f"--model={lm_spec} has a gated reward head ({base.architecture}); train_rm puts a new "
                         "one-output score head on a causal LM or a plain reward model: give its base LM.")
    check_context(lm_spec, (train, heldout), cfg.template)
    check_head_out(head_out, cfg.trainable)
    identity = training_identity(lm_spec, train, heldout, cfg, dtype)
    workdir = Path(workdir) if workdir else default_workdir(lm_spec, identity)
    print(f"workdir: {workdir}", file=sys.stderr)
    export, head_out = (Path(p) if p else None for p in (export, head_out))
    head_files = [head_out, head_recipe_path(head_out)] if head_out else []
    outputs = [workdir_output(workdir, identity, overwrite, beside=[*([export] if export else []), *head_files])]
    def fix(path: Path) -> str | None:  # --overwrite would train again: the workdir is reused or resumed without it
        if (workdir / "summary.json").is_file():
            return (f"Delete {path} and rerun: the training in {workdir} is reused (--overwrite would delete it and "
                    "train again).")
        if workdir.is_dir() and any(workdir.iterdir()):  # killed while exporting: every step may be saved
            return (f"Delete {path} and rerun: the run resumes from its last checkpoint in {workdir} (--overwrite "
                    "would delete them and train again).")
        return None

    if export:
        outputs.append(Output(export, identity, overwrite=overwrite, meta=export / SUMMARY_FILE, folder=EXPORT_FILES,
                              flag="--export", beside=tuple(head_files), fix=fix(export)))
    if head_out:
        outputs.append(Output(head_out, identity, overwrite=overwrite, meta=head_files[1], flag="--head_out",
                              fix=fix(head_out)))
    outputs = [dataclasses.replace(output, inputs=dict(inputs or {})) for output in outputs]
    # every output decided (or refused) before --overwrite deletes any; the workdir's earlier run goes now (training
    # anew starts from an empty one), an earlier export or head only as this run writes its own: a run stopped
    # before then (a model whose features are not finite, a kill) leaves them whole
    with claim_all(outputs, defer_removal=True) as (work, *others):
        if is_main():
            remove(work.remove)
        start_workdir(workdir, identity, work)
        # A finished run is recognised here, before the model loads or any feature is computed; the outputs it
        # already wrote (its export, its head) are kept as they are, never rewritten without --overwrite.
        done = finished_run(workdir, identity, work)
        written = dict(zip([p for p in (export, head_out) if p], others, strict=True))
        fresh = {path: not decision.reuse for path, decision in written.items()}
        if done is not None:
            print(reused_line(workdir, done.reused, restore=any(fresh.values())), file=sys.stderr)
        for path, flag, what in ((export, "--export", "Hugging Face folder"), (head_out, "--head_out", "head")):
            if path and not fresh[path]:
                record = export / SUMMARY_FILE if path == export else head_files[1]
                note = results.reused_note(read_json(record))
                print(f"{flag}={path}: {note}: this run's {what}, already there; pass --overwrite to write it "
                      "again.", file=sys.stderr)
        if done is not None and not any(fresh.values()):
            done.export = export
            return done
        try:
            result = _trained(lm_spec, train, heldout, cfg, workdir, identity, dtype, mesh)
        except BaseException:
            if not work.reuse and is_main():
                forget_unsaved_run(workdir)
            raise
        summary = {k: v for k, v in done.reused.items() if k not in ("environment", "written_at")} if done else {
            "identity": identity, "base_model": lm_spec, "train_pairs": len(train), "heldout_pairs": len(heldout),
            "config": dataclasses.asdict(result.config or cfg), "final": result.evals[-1] if result.evals else None,
            "steps_per_second": result.steps_per_second, "seconds": result.seconds,
            "resumed_from": result.resumed_from, "recipe": recipe or {},
            "mesh": dict(mesh.shape) if mesh is not None else None,
        }
        if elo_csv and done is None:
            summary["elo"] = elo_agreement(result.model, heldout, elo_csv, cfg.template)
        if export and fresh[export]:
            plain = cfg.template == "plain"  # "auto" reads a tokenizer without a chat template plain too
            if plain and has_chat_template(result.model.tokenizer) and is_main():
                print(f"--export={export}: trained on the plain format (--template=plain), so the export "
                      "carries no chat template: --template=auto reads it plain, as it was trained.", file=sys.stderr)
            if is_main():
                remove(written[export].remove)  # the export this one replaces (--overwrite)
            save_hf_folder(result.model, export, chat_template=not plain)
        head = to_host(nn.get(result.model.params, "score.kernel"))
        if is_main():  # every process trained; one writes
            now = time.strftime("%Y-%m-%d %H:%M:%S")
            if export and fresh[export]:
                dump_json({**summary, "written_at": now, "files": results.folder_record(export, head_files)},
                          export / SUMMARY_FILE)  # a rerun reuses the folder only when every file is as written
                results.mark_finished(export)
            if head_out and fresh[head_out]:
                remove(written[head_out].remove)
                head_out.parent.mkdir(parents=True, exist_ok=True)
                save_file({"score.weight": head.T.copy()}, head_out)
                dump_json({**summary, "written_at": now, "files": {head_out.name: results.file_record(head_out)}},
                          head_recipe_path(head_out))
            if done is None:
                dump_json({**summary, "environment": results.environment(), "written_at": now},
                          workdir / "summary.json")
    result.workdir, result.export, result.reused = workdir, export, done and done.reused
    return result


def finished_run(workdir: Path, identity: dict, decision: Claim) -> TrainResult | None:
    """The finished run of `identity` in its claimed workdir, read back from its logs without loading the model or
    computing anything (its summary.json, written last by `run_training`, records that every step ran); None when
    the workdir holds no run, or an unfinished one (resumed from its last checkpoint)."""
    if not decision.reuse:
        return None
    summary = read_json(workdir / "summary.json")
    if not isinstance(summary, dict) or summary.get("identity") != canonical(identity):
        return None
    steps = identity["config"]["steps"]
    return TrainResult(model=None, history=read_log(workdir / "train_log.csv", upto=steps),
                       evals=read_log(workdir / "eval_log.csv", upto=steps), seconds=0.0, steps_per_second=0.0,
                       resumed_from=steps, workdir=workdir, reused=summary)


def reused_line(workdir: Path, summary: dict, restore: bool = False) -> str:
    """The one line saying a finished run is reused (rmjax.runs.results.reused_note: when, how long); `restore`:
    its last checkpoint is loaded to write an output it has not written yet (no step runs)."""
    then = ("its last checkpoint is restored to write the outputs it has not written (no step runs, no feature is "
            "computed)" if restore else "nothing is loaded or computed")
    return f"{workdir}: {results.reused_note(summary)}: this run, finished; {then}; pass --overwrite to train it again."


def _trained(lm_spec: str, train: Pairs, heldout: Pairs, cfg: TrainConfig, workdir: Path, identity: dict,
             dtype: str, mesh: jax.sharding.Mesh | None) -> TrainResult:
    """Load the LM, add a score head and train it in the claimed workdir (resuming its last checkpoint; a finished
    run's is only restored)."""
    lm = load(lm_spec, dtype=dtype, mesh=mesh)
    if lm.config.is_reward_model and is_main():  # its trained head is not the starting point: say so
        print(f"note: {lm_spec} is a reward model; its score head is replaced by a new one (seed {cfg.seed}), and "
              "training starts from its backbone.", file=sys.stderr)
    rm = reward_model_from_lm(lm, seed=cfg.seed, source=f"{lm_spec}+score")
    del lm  # its LM head, which the reward model drops, is not held through the run
    # the loaded weights are this run's alone: the steps train them in place, not a copy beside them
    return train_reward_model(rm, train, heldout, cfg, workdir, claimed=identity, consume=True)


SUMMARY_FILE = "rmjax_training.json"  # beside an exported folder's weights: the run that made them
EXPORT_FILES = (*HF_FOLDER_FILES, SUMMARY_FILE, f".{SUMMARY_FILE}.*.tmp")  # all --overwrite deletes in --export
