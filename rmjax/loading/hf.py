"""Load a Hugging Face checkpoint folder: config.json, safetensors (single or sharded), tokenizer."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import jax
import ml_dtypes
import numpy as np
from flax import nnx

from rmjax import nn, sharding
from rmjax.config import ModelConfig, load_config_file, read_json_file
from rmjax.errors import CheckpointError, MissingFileError, TokenizerMismatchError, UsageError
from rmjax.loading import safetensors_io
from rmjax.loading.fingerprint import folder_fingerprint
from rmjax.loading.weights import assemble

_NP_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")


@dataclasses.dataclass
class Model:
    """A loaded model: static config, parameters (possibly sharded), tokenizer."""

    config: ModelConfig
    params: nnx.State  # the nnx state of `module` (rmjax.nn.Transformer)
    tokenizer: Any
    source: str
    dtype: str = "float32"
    mesh: jax.sharding.Mesh | None = None
    load_seconds: float = 0.0
    raw_config: dict = dataclasses.field(default_factory=dict)  # config.json as read (for saving)
    weight_bytes: int = 0  # the parameters' size in the loaded dtype
    weight_bytes_read: int = 0  # what this process read from disk for its own devices' shards
    fingerprint: dict | None = None  # {"weights", "tokenizer"} content digests (rmjax.loading.fingerprint)
    fingerprint_of: tuple[int, int] | None = None  # id() of the params and tokenizer it describes
    output_column: int = 0  # which head output jobs read (a run option: --output_column), not architecture

    def __post_init__(self):
        if self.fingerprint is not None and self.fingerprint_of is None:
            self.fingerprint_of = (id(self.params), id(self.tokenizer))

    def stamp(self, fingerprint: dict | None) -> Model:
        """Record the fingerprint of the current params and tokenizer (after loading or placing them)."""
        self.fingerprint, self.fingerprint_of = fingerprint, (id(self.params), id(self.tokenizer))
        return self

    @property
    def module(self) -> nn.Transformer:
        """The model as an nnx module sharing these params (nnx.display, nnx.state, per-layer calls)."""
        return nn.module(self.params, self.config)

    @property
    def chat_template(self) -> str | None:
        return getattr(self.tokenizer, "chat_template", None) if self.tokenizer is not None else None


def numpy_dtype(dtype: str):
    if dtype not in _NP_DTYPES:
        raise UsageError(f"dtype {dtype!r} not supported; use one of {', '.join(_NP_DTYPES)}.")
    return _NP_DTYPES[dtype]


def place_params(flat: dict[str, Any], cfg: ModelConfig, mesh: jax.sharding.Mesh | None) -> nnx.State:
    """Host (or lazily read) arrays -> the module's state, each weight placed by its declared logical axes;
    under a mesh each device's slice is read on its own (make_array_from_callback)."""
    declared = nn.declarations(cfg)
    return nn.from_flat(cfg, {p: sharding.place(a, declared[p].axes, mesh) for p, a in flat.items()})


def load_tokenizer(folder: Path, cfg: ModelConfig, required: bool = True):
    if not any((folder / f).is_file() for f in TOKENIZER_FILES):
        if not required:
            return None
        raise CheckpointError(
            f"{folder}: no tokenizer files ({', '.join(TOKENIZER_FILES)}). Copy them from the "
            "checkpoint's original repository (reward models use their base model's tokenizer)."
        )
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(folder))
    except (OSError, ValueError, TypeError, KeyError) as error:
        raise CheckpointError(f"{folder}: the tokenizer files cannot be read ({type(error).__name__}: "
                              f"{str(error)[:200]}); restore them from the checkpoint's original repository.") from None
    check_tokenizer_fits(tok, cfg, str(folder / "tokenizer.json"))
    return tok


def check_tokenizer_fits(tok, cfg: ModelConfig, where: str) -> None:
    size = len(tok)
    if size > cfg.vocab_size:
        raise TokenizerMismatchError(
            f"{where}: the tokenizer has {size} tokens but the model's embedding has "
            f"{cfg.vocab_size} rows (config.json vocab_size); ids >= {cfg.vocab_size} would index "
            "past the table. Use the tokenizer that was saved with this checkpoint."
        )


def load_hf_model_folder(
    folder: str | Path,
    dtype: str = "float32",
    mesh: jax.sharding.Mesh | None = None,
    require_tokenizer: bool = True,
) -> Model:
    start = time.perf_counter()
    folder = Path(folder)
    if not folder.is_dir():
        raise MissingFileError(f"{folder}: no such model folder.")
    cfg = load_config_file(folder / "config.json")
    raw_config = read_json_file(folder / "config.json", "model config")
    tensors = (
        item for path in safetensors_io.checkpoint_files(folder) for item in safetensors_io.iter_tensors(path)
    )
    flat = assemble(tensors, cfg, nn.declarations(cfg), numpy_dtype(dtype), str(folder))
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
        fingerprint=folder_fingerprint(folder),
    )
