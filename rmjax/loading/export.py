"""A model as a Hugging Face folder (config.json, model.safetensors, tokenizer files) that transformers'
AutoModelForSequenceClassification loads: one writer, `save_hf_folder`, for `train_rm --export` and for the export
job (`run_export`, experiments/export.py), which writes any model `rmjax.loading.load` accepts.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time
from pathlib import Path

from rmjax import nn
from rmjax.errors import UsageError
from rmjax.loading.registry import model_folder, training_recipe
from rmjax.loading.safetensors_io import save_file
from rmjax.loading.weights import to_hf_tensors
from rmjax.model import Model
from rmjax.parallel.distributed import is_main, to_host
from rmjax.runs.options import RunOptions
from rmjax.runs.results import UNFINISHED, mark_unfinished

# What `save_hf_folder` writes (rmjax.runs.folder_files.store_files): the weights (and safetensors_io's temp file), the
# config, and what a transformers tokenizer's save_pretrained writes: its config, special and added tokens, chat
# template files, a fast tokenizer's tokenizer.json, a slow one's vocabulary files.
HF_FOLDER_FILES = (UNFINISHED, "model.safetensors", "model.safetensors.tmp", "config.json", "tokenizer.json",
                   "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "chat_template.jinja",
                   "chat_template.json", "additional_chat_templates/", "tokenizer.model", "vocab.json", "vocab.txt",
                   "merges.txt", "spiece.model", "sentencepiece.bpe.model")


# A multimodal Gemma 3's text model under its text-only class (the weights written are the text model's alone).
TEXT_ONLY_CLASS = {"Gemma3ForSequenceClassification": "Gemma3TextForSequenceClassification",
                   "Gemma3ForConditionalGeneration": "Gemma3ForCausalLM"}
# What only the multimodal wrapper has: the rest of its top level (token ids, labels, dtype) stays.
MULTIMODAL_FIELDS = ("text_config", "vision_config", "model_type", "architectures", "image_token_index",
                     "boi_token_index", "eoi_token_index", "mm_tokens_per_image", "auto_map")


def text_only_config(raw: dict) -> dict:
    """config.json for the text-only weights `save_hf_folder` writes. A multimodal Gemma 3's config (its text model's
    fields nested in text_config, model_type gemma3) made transformers load the written weights as unexpected keys
    and run its language model on random ones (the exported RM's rewards were another model's). Its top level's
    token ids (eos [1, 106]), labels and dtype are kept beside the text model's fields."""
    text = raw.get("text_config")
    if raw.get("model_type") not in ("gemma3", "gemma3_text") or not isinstance(text, dict):
        return raw
    top = {k: v for k, v in raw.items() if k not in MULTIMODAL_FIELDS}
    flat = {**text, **top, "model_type": "gemma3_text"}
    flat["architectures"] = [TEXT_ONLY_CLASS.get(a, a) for a in raw.get("architectures") or []]
    return flat


def save_hf_folder(model: Model, folder: str | Path, chat_template: bool = True) -> Path:
    """config.json + model.safetensors + tokenizer/chat template, loadable by rmjax and transformers
    (written by process 0); without `chat_template` the tokenizer is saved without its chat template (a model trained
    on the plain format: `--template=auto` then reads it plain, as it was trained)."""
    flat = {k: to_host(v) for k, v in nn.flat(model.params).items()}  # every process takes part in gathering
    if not is_main():
        return Path(folder)
    folder = Path(folder)
    mark_unfinished(folder)  # until the caller's record is written (results.mark_finished)
    save_file(to_hf_tensors(flat, model.config), folder / "model.safetensors", metadata={"format": "pt"})
    # the weights' dtype, not the one the checkpoint was read from (a bfloat16 export's config said float32)
    raw = text_only_config(model.raw_config)
    keys = [k for k in ("dtype", "torch_dtype") if k in raw] or ["dtype"]
    config = {**raw, **dict.fromkeys(keys, str(model.dtype))}
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    if model.tokenizer is not None:
        tokenizer = model.tokenizer
        if not chat_template and getattr(tokenizer, "chat_template", None):
            tokenizer = copy.deepcopy(tokenizer)  # the loaded model's (cached) tokenizer keeps its template
            tokenizer.chat_template = None
        tokenizer.save_pretrained(str(folder))
        _drop_read_options(folder / "tokenizer_config.json")
    return folder


def _drop_read_options(path: Path) -> None:
    """transformers writes the options rmjax read the tokenizer with (local_files_only, is_local) into the saved
    tokenizer_config.json, as if the model's own settings: an export carries the source's, not rmjax's reading."""
    from rmjax.runs.atomic import atomic_write_text, read_json

    raw = read_json(path)
    if isinstance(raw, dict) and {"local_files_only", "is_local"} & raw.keys():
        raw = {k: v for k, v in raw.items() if k not in ("local_files_only", "is_local")}
        atomic_write_text(path, json.dumps(raw, indent=2, ensure_ascii=False) + "\n")


# The export job's record inside its folder (as train_rm's export has rmjax_training.json): what was exported (the
# identity), when and how long it took, and the files written. Written last: a folder holding it is complete.
EXPORT_RECORD = "rmjax_export.json"
EXPORT_FILES = (*HF_FOLDER_FILES, EXPORT_RECORD, f".{EXPORT_RECORD}.*.tmp")  # all --overwrite deletes in --out


def export_identity(model_fingerprint: dict, dtype: str, text_only: bool = False) -> dict:
    """What an exported folder depends on: the model's content (weights, head, tokenizer, template) and the dtype
    its weights are written in; `text_only`: a multimodal config written as its text model's (an export from before
    that rule ran on random weights in transformers, and must not be reused)."""
    return {"job": "export", "model": model_fingerprint, "dtype": dtype} | ({"config": "text-only"} if text_only
                                                                           else {})


def _text_only(spec: str) -> bool:
    """Whether `spec`'s config.json is one `text_only_config` rewrites (read before any weight)."""
    from rmjax.runs.atomic import read_json

    folder = model_folder(spec)
    raw = read_json(folder / "config.json") if folder is not None else None
    return isinstance(raw, dict) and text_only_config(raw) is not raw


def _refuse_own_folder(spec: str, out: Path) -> None:
    """--out may not be (in, or around) the folder the model is read from: --overwrite would delete the model
    before it loads."""
    folder = model_folder(spec)
    where = Path(os.path.realpath(out))
    if folder is not None and (where == folder or folder in where.parents or where in folder.parents):
        raise UsageError(f"--out={out} is, holds or lies inside the model's own folder {folder}; choose another "
                         "folder.")


def _refuse_gated_head(spec: str) -> None:
    """A gated head (ArmoRM, QRM, URM) has no transformers class: its folder loads as a plain classifier, whose
    score head is missing (random) or another column, and scores otherwise than rmjax, silently."""
    from rmjax.loading import config_of

    head = config_of(spec).head
    if head is not None:
        raise UsageError(f"--model={spec} has a gated {head.kind} reward head, which transformers has no class for: "
                         "its export would load there as a plain classifier and score otherwise (a random or another "
                         "output's head); score it with rmjax, from its own folder.")


def run_export(options: RunOptions) -> Path:
    """The export job: the model's identity from its fingerprint, without loading it → claim options.out (a
    folder; a finished export of the same model is reused, another's refused unless options.overwrite) → load →
    the earlier export --overwrite replaces deleted (kept whole until the model has loaded) → write the Hugging Face
    folder, then its record. Returns the folder."""
    from rmjax.loading import fingerprint
    from rmjax.loading.for_job import load_for_job
    from rmjax.runs import atomic, results
    from rmjax.runs.claims import claim
    from rmjax.runs.folder_files import remove
    from rmjax.runs.paths import real_path

    out = real_path(options.out)
    _refuse_own_folder(options.model, out)
    _refuse_gated_head(options.model)
    identity = export_identity(fingerprint(options.model), options.dtype, _text_only(options.model))
    record_path = out / EXPORT_RECORD
    with claim(out, identity, overwrite=options.overwrite, flag="--out", meta=record_path, folder=EXPORT_FILES,
               inputs=dict(options.inputs), defer_removal=True) as decision:
        if decision.reuse:
            note = results.reused_note(atomic.read_json(record_path))
            print(f"--out={out}: {note}: this model's export, already there; pass --overwrite to write it again.",
                  file=sys.stderr)
            return out
        start = time.perf_counter()
        model = load_for_job(options)
        if is_main() and decision.remove:  # the old export's files, the folder marked unfinished and its record
            mark_unfinished(out)  # first: a stop from here leaves no folder passed as whole, and one --overwrite takes
            remove(sorted((p for p in decision.remove if p.name != UNFINISHED),  # a stopped one's mark stays
                          key=lambda p: p.name != EXPORT_RECORD))
        save_hf_folder(model, out)
        if is_main():
            from rmjax.text.chat import PLAIN_FORMAT, has_chat_template

            # a tokenizer without a chat template (Gemma 3 270M's GGUF): rmjax reads its conversations plain, and
            # transformers' apply_chat_template refuses it; the record and the job say how to write them
            plain = None if has_chat_template(model.tokenizer) else PLAIN_FORMAT + " {response}"
            if plain:
                print(f"note: {options.model} has no chat template: rmjax scores its conversations as {plain!r}; "
                      "write them so for transformers (its apply_chat_template refuses this tokenizer).",
                      file=sys.stderr)
            results.dump_json({
                "kind": "export", "identity": identity, "model": model.source, "dtype": model.dtype,
                "mesh": dict(model.mesh.shape) if model.mesh is not None else None,
                "written_at": time.strftime("%Y-%m-%d %H:%M:%S"), "seconds": time.perf_counter() - start,
                "recipe": training_recipe(options.model),
                "conversation_format": plain or "the tokenizer's chat template",
                "files": results.folder_record(out),
                "environment": results.environment()}, record_path)
            results.mark_finished(out)
    return out
