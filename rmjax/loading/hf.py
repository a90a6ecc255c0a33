"""Load a Hugging Face checkpoint folder: config.json, safetensors (single or sharded), tokenizer."""

from __future__ import annotations

import threading
import time
import weakref
from collections import OrderedDict
from pathlib import Path
from typing import Any

import jax
import ml_dtypes
import numpy as np
from flax import nnx

from rmjax import nn
from rmjax.config import ModelConfig
from rmjax.errors import CheckpointError, MissingFileError, TokenizerMismatchError, UsageError
from rmjax.heads import ARCHITECTURES as CUSTOM_HEADS
from rmjax.hf_config import load_config_file, read_json_file
from rmjax.loading import safetensors_io
from rmjax.loading.identity import file_sha256, folder_fingerprint, tokenizer_digest, tokenizer_files
from rmjax.loading.weights import assemble
from rmjax.model import Model
from rmjax.parallel import sharding
from rmjax.runs.results import package_version

_NP_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")


def numpy_dtype(dtype: str):
    if dtype not in _NP_DTYPES:
        raise UsageError(f"dtype {dtype!r} not supported; use one of {', '.join(_NP_DTYPES)}.")
    return _NP_DTYPES[dtype]


def place_params(flat: dict[str, Any], cfg: ModelConfig, mesh: jax.sharding.Mesh | None) -> nnx.State:
    """Host (or lazily read) arrays -> the module's state, each weight placed by its declared logical axes;
    under a mesh each device's slice is read on its own (make_array_from_callback)."""
    declared = nn.declarations(cfg)
    return nn.from_flat(cfg, {p: sharding.place(a, declared[p].axes, mesh) for p, a in flat.items()})


def _named_code(value) -> list[str]:
    """The module references an `auto_map` value names (strings, at any depth; null entries name none)."""
    if isinstance(value, str):
        return [value] if value else []
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [name for item in value for name in _named_code(item)]
    return []


def _foreign_code(raw, tokenizer: bool) -> list[str]:
    """The code an `auto_map` names that rmjax would need to run. A config.json of a published RM whose head
    rmjax ports (rmjax.heads: ArmoRM, QRM, URM) maps its architecture to the authors' modeling file; rmjax
    computes that head itself and never imports the file, so only its tokenizer entry would count there."""
    auto_map = raw.get("auto_map") if isinstance(raw, dict) else None
    if tokenizer or not isinstance(auto_map, dict):
        return _named_code(auto_map)
    architectures = raw.get("architectures")
    ported = (isinstance(architectures, list) and bool(architectures)
              and all(isinstance(a, str) and a in CUSTOM_HEADS for a in architectures))
    return [name for key, value in auto_map.items() if not ported or key == "AutoTokenizer"
            for name in _named_code(value)]


def refuse_remote_code(folder: Path) -> None:
    """A folder whose config.json or tokenizer_config.json maps a class to code of its own (`auto_map`) is refused
    before its config or tokenizer is parsed: rmjax runs no code from a checkpoint (transformers would import
    it after a prompt that a stray "y" on stdin answers). Every folder loader and tokenizer read calls this."""
    for name, what in (("config.json", "model config"), ("tokenizer_config.json", "tokenizer config")):
        path = folder / name
        if not path.is_file():
            continue
        code = _foreign_code(read_json_file(path, what), tokenizer=name == "tokenizer_config.json")
        if code:
            raise CheckpointError(
                f"{path}: its auto_map names code of its own ({', '.join(sorted(set(code)))[:200]}); rmjax runs "
                "no code from a checkpoint. Use a checkpoint of a supported architecture (Llama 3, Gemma 1-3, the "
                "ported heads of rmjax/heads.py) that needs no custom code.")


def load_tokenizer(folder: Path, cfg: ModelConfig, required: bool = True):
    refuse_remote_code(folder)
    for path in tokenizer_files(folder, every=True).values():  # transformers skips one it cannot open
        safetensors_io.refuse_unreadable(path, "the tokenizer reads it (a chat template, a vocabulary)")
    if not any((folder / f).is_file() for f in TOKENIZER_FILES):
        if not required:
            return None
        raise CheckpointError(
            f"{folder}: no tokenizer files ({', '.join(TOKENIZER_FILES)}). Copy them from the "
            "checkpoint's original repository (reward models use their base model's tokenizer)."
        )
    tok = _read_tokenizer(folder)
    check_tokenizer_fits(tok, cfg, str(folder / "tokenizer.json"))
    return tok


# Tokenizers read in this process, by folder and file content: a job reads its model's tokenizer when it peeks at
# the model and again when it loads it, the frontier three models' each three times (≈0.3 s per read of SmolLM2's,
# more for Gemma's 262k vocabulary). Keyed by the digest of every file the tokenizer reads (identity.tokenizer_files
# and config.json), so a file changed in place is read again. Loads of one content share one tokenizer object: rmjax
# never modifies a tokenizer, and a caller who changes `load(x).tokenizer` copies it first (Model's docstring).
_tokenizers: OrderedDict[tuple[str, str, str], Any] = OrderedDict()
_TOKENIZERS_KEPT = 4
_tokenizers_lock = threading.Lock()


def _read_tokenizer(folder: Path):
    config = folder / "config.json"
    key = (str(folder.resolve()), tokenizer_digest(folder), file_sha256(config) if config.is_file() else "")
    with _tokenizers_lock:
        if key in _tokenizers:
            _tokenizers.move_to_end(key)
            return _tokenizers[key]
    from transformers import AutoTokenizer

    try:
        # No code from the folder, and nothing from the network (a missing file is the folder's fault).
        tok = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False, local_files_only=True)
    except (OSError, ValueError, TypeError, KeyError) as error:
        raise CheckpointError(f"{folder}: the tokenizer files cannot be read ({type(error).__name__}: "
                              f"{str(error)[:200]}); restore them from the checkpoint's original repository.") from None
    except Exception as error:  # the `tokenizers` parser raises a bare Exception
        # ("data did not match any variant ...") on a tokenizer.json it cannot parse, often one a newer
        # `tokenizers` wrote (a model or pre-tokenizer type this version lacks)
        raise CheckpointError(
            f"{folder / 'tokenizer.json'}: the installed tokenizers {package_version('tokenizers')} cannot parse it "
            f"({' '.join(str(error).split())[:160]}); upgrade tokenizers (pip install -U tokenizers transformers) "
            "or re-save the tokenizer with the version installed here.") from None
    with _tokenizers_lock:
        _tokenizers[key] = tok
        while len(_tokenizers) > _TOKENIZERS_KEPT:
            _tokenizers.popitem(last=False)
    return tok


_top_ids: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> its largest id + 1


def _ids_end(tok) -> int:
    """One past the tokenizer's largest id: its length unless an id skips past it (a tokenizer.json can give a
    token any id; len(tok) counts tokens, and the token at 60000 of a 49,152-token tokenizer passed)."""
    if tok not in _top_ids:
        _top_ids[tok] = max(len(tok), max(tok.get_vocab().values(), default=-1) + 1)  # 0.17 s for Gemma 3's
    return _top_ids[tok]


def check_tokenizer_fits(tok, cfg: ModelConfig, where: str) -> None:
    size, end = len(tok), _ids_end(tok)
    if end > cfg.vocab_size:
        has = f"{size} tokens" if end == size else f"ids up to {end - 1:,}"
        raise TokenizerMismatchError(
            f"{where}: the tokenizer has {has} but the model's embedding has "
            f"{cfg.vocab_size} rows (config.json vocab_size); ids >= {cfg.vocab_size} would index "
            "past the table. Use the tokenizer that was saved with this checkpoint."
        )
    eos = cfg.eos_token_id if isinstance(cfg.eos_token_id, tuple) else (cfg.eos_token_id,)
    named = [(f"{name}_token_id", i) for name, ids in (("bos", (cfg.bos_token_id,)), ("eos", eos),
                                                        ("pad", (cfg.pad_token_id,))) for i in ids if i is not None]
    outside = [(name, i) for name, i in named if i >= size]  # (a legacy pad id -1 names no token: not checked)
    if outside:  # another model's tokenizer, smaller than this one's: every id it gives names another token here
        name, i = outside[0]  # (inside the embedding: hf_config refuses an id past it)
        raise TokenizerMismatchError(
            f"{where}: config.json's {name} {i} is not a token of this tokenizer ({size} tokens): the tokenizer is "
            "another model's. Use the tokenizer that was saved with this checkpoint."
        )
    own_bos = getattr(tok, "bos_token_id", None)
    if cfg.bos_token_id is not None and cfg.bos_token_id >= 0 and own_bos is not None and own_bos != cfg.bos_token_id:
        # a smaller tokenizer that still holds config.json's ids (eos may differ in real checkpoints: Llama 3's)
        raise TokenizerMismatchError(
            f"{where}: config.json's bos_token_id {cfg.bos_token_id} is "
            f"{tok.convert_ids_to_tokens(cfg.bos_token_id)!r} in this tokenizer, whose own beginning-of-text token is "
            f"{tok.bos_token!r} (id {own_bos}): the tokenizer is another model's. Use the tokenizer that was saved "
            "with this checkpoint."
        )


def load_hf_model_folder(
    folder: str | Path,
    dtype: str = "float32",
    mesh: jax.sharding.Mesh | None = None,
    require_tokenizer: bool = True,
    fingerprint: dict | None = None,
) -> Model:
    """The folder's model; `fingerprint` where the caller has it (a GGUF's: its converted folder is not hashed)."""
    start = time.perf_counter()
    folder = Path(folder)
    if not folder.is_dir():
        raise MissingFileError(f"{folder}: no such model folder.")
    refuse_remote_code(folder)
    cfg = load_config_file(folder / "config.json")
    raw_config = read_json_file(folder / "config.json", "model config")
    flat = assemble(safetensors_io.iter_checkpoint(folder), cfg, nn.declarations(cfg), numpy_dtype(dtype), str(folder))
    params = place_params(flat, cfg, mesh)
    tok = load_tokenizer(folder, cfg, required=require_tokenizer)
    total, read = sum(p.nbytes for p in flat.values()), sum(p.bytes_read for p in flat.values())
    return Model(
        config=cfg,
        params=params,
        tokenizer=tok,
        source=str(folder),
        dtype=dtype,
        mesh=mesh,
        load_seconds=time.perf_counter() - start,
        raw_config=raw_config,
        weight_bytes=total,
        weight_bytes_read=read,
        fingerprint=fingerprint or folder_fingerprint(folder),
    )
