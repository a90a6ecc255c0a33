"""Zero-copy safetensors reading (numpy memmap; bf16 via ml_dtypes) and writing."""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath

import ml_dtypes
import numpy as np

from rmjax.errors import CheckpointError

_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": ml_dtypes.bfloat16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}


def float_itemsize(dtype: str) -> int | None:
    """Bytes an element of a safetensors floating dtype (F32, BF16, …) takes; None for any other dtype."""
    kind = _DTYPES.get(dtype)
    return np.dtype(kind).itemsize if kind is not None and dtype.startswith(("F", "BF")) else None


def read_header(path: Path) -> tuple[dict, int]:
    """(tensor header, data offset); a truncated or corrupt file is an error naming it and what is wrong."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise CheckpointError(f"{path}: truncated safetensors file ({size} bytes); download it again.")
        (n,) = struct.unpack("<Q", raw)
        if 8 + n > size:
            raise CheckpointError(f"{path}: truncated or not a safetensors file (header of {n} bytes, file of "
                                  f"{size}); download it again.")
        try:
            header = json.loads(f.read(n))
        except (ValueError, RecursionError) as error:  # RecursionError: nested too deep
            raise CheckpointError(f"{path}: corrupt safetensors header ({error}); download it again.") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: corrupt safetensors header (not a JSON object); download it again.")
    header.pop("__metadata__", None)
    data = size - 8 - n
    for name, info in header.items():
        try:
            start, end = info["data_offsets"]
            shape, dtype = list(info["shape"]), np.dtype(_DTYPES.get(info["dtype"], np.uint8))
            whole = [v for v in (start, end, *shape) if type(v) is int and v >= 0]  # JSON ints (no bool, no 4.5)
            if len(whole) != 2 + len(shape) or start > end:
                raise ValueError("offsets and shape must be whole numbers >= 0, the start before the end")
            if (end - start) != math.prod(shape) * dtype.itemsize and info["dtype"] in _DTYPES:  # Python ints: exact
                raise ValueError(f"shape {shape} ({info['dtype']}) does not span its {end - start} bytes")
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise CheckpointError(f"{path}: corrupt safetensors header entry for {name!r} ({error}); download the "
                                  "file again.") from None
        if end > data:
            raise CheckpointError(f"{path}: truncated: tensor {name!r} ends at byte {end} of the data but the file "
                                  f"holds {data} data bytes; download it again.")
    return header, 8 + n


def iter_tensors(path: Path) -> Iterator[tuple[str, callable]]:
    """(name, loader) pairs; each loader returns a read-only memmap view of one tensor."""
    header, offset = read_header(path)
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=offset)
    for name, info in header.items():
        dtype = _DTYPES.get(info["dtype"])
        if dtype is None:
            raise CheckpointError(f"{path}: tensor {name} has unsupported dtype {info['dtype']}.")
        start, end = info["data_offsets"]
        if end - start != int(np.prod(info["shape"], dtype=np.int64)) * np.dtype(dtype).itemsize:
            raise CheckpointError(f"{path}: corrupt header: tensor {name!r} of shape {info['shape']} "
                                  f"({info['dtype']}) spans {end - start} bytes; download the file again.")

        def load(start=start, end=end, dtype=dtype, shape=tuple(info["shape"])):
            return data[start:end].view(dtype).reshape(shape)

        yield name, load


def _shard_path(folder: Path, name, index: Path) -> Path:
    """`folder/name` for a shard the index names, refused unless `name` is a plain .safetensors file name in the
    folder (as Hugging Face writes them): no `..`, no absolute path, no subfolder. (The shard file itself may be
    a link, as the Hugging Face cache makes them.)"""
    if not isinstance(name, str) or not name or "\0" in name:
        why = "is not a file name"
    elif PurePosixPath(name).is_absolute() or ".." in PurePosixPath(name).parts:
        why = "lies outside the folder"
    elif "/" in name:
        why = "is not a file directly in the folder"
    elif not name.endswith(".safetensors"):
        why = "is not a .safetensors file"
    else:
        return folder / name
    raise CheckpointError(f"{index}: shard {str(name)[:200]!r} {why}; rmjax reads only the checkpoint's own files. "
                          "Restore the index from the checkpoint's original repository.")


def refuse_unreadable(path: Path, what: str) -> None:
    """A name in a checkpoint folder that is not a readable regular file: a broken link (a hub cache snapshot whose
    blob is missing), a folder, a FIFO that would block the read. A broken link was skipped as if absent (a
    tokenizer read without its chat template) or ended in a traceback."""
    if path.is_symlink() and not path.exists():
        raise CheckpointError(f"{path}: a broken link (its target is missing); {what}. Restore the file (or remove "
                              "the link).")
    if path.exists() and not path.is_file():
        raise CheckpointError(f"{path}: not a regular file; {what}. Remove it or restore the checkpoint.")


def _regular(files: list[Path]) -> list[Path]:
    """`files` as they are, each a regular file (refuse_unreadable)."""
    for path in files:
        refuse_unreadable(path, "a checkpoint's weights are *.safetensors files")
    return files


def checkpoint_files(folder: Path) -> list[Path]:
    """The safetensors files of a checkpoint folder (single file or sharded with an index), each inside the
    folder: the one list that loading and the fingerprint (rmjax.loading.identity) both read. model.safetensors
    alone where it exists, as transformers reads it, before an index beside it (another *.safetensors, such as an
    older copy, is not part of the checkpoint); then the index's shards; only a folder with neither reads every
    *.safetensors, and `iter_checkpoint` refuses a tensor found in two of them."""
    adapter = [p.name for p in (folder / "adapter_config.json", folder / "adapter_model.safetensors") if p.exists()]
    if adapter:  # a PEFT adapter is no checkpoint rmjax reads: beside base weights it was ignored, not applied
        raise CheckpointError(f"{folder}: holds a PEFT adapter ({adapter[0]}), which rmjax does not apply; merge it "
                              "into its base model (peft's merge_and_unload, then save_pretrained) and load that.")
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    for path in (single, index):
        refuse_unreadable(path, "a checkpoint's weights are *.safetensors files")
    if single.is_file():
        return [single]
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            if not isinstance(weight_map, dict) or not weight_map:
                raise TypeError("weight_map is not a non-empty object")
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as error:
            raise CheckpointError(f"{index}: not a valid shard index ({type(error).__name__}: {error}); restore it "
                                  "from the checkpoint's original repository.") from None
        paths = sorted({_shard_path(folder, name, index) for name in weight_map.values()})
        missing = [str(p.relative_to(folder)) for p in paths if not p.exists()]
        if missing:
            raise CheckpointError(
                f"{index} lists shards that are missing: {', '.join(missing)}. "
                "Download every shard of the checkpoint into the folder."
            )
        return _regular(paths)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        bins = sorted(folder.glob("*.bin"))
        fix = (
            " It has PyTorch .bin weights: convert them once with transformers "
            "(`AutoModel...from_pretrained(dir).save_pretrained(dir, safe_serialization=True)`)."
            if bins
            else " Download the checkpoint's *.safetensors files into it."
        )
        raise CheckpointError(f"{folder}: no model.safetensors or model.safetensors.index.json.{fix}")
    _regular(files)
    return [single] if single in files else files


def iter_checkpoint(folder: Path) -> Iterator[tuple[str, Callable[[], np.ndarray]]]:
    """(name, loader) of every tensor of the checkpoint's files; a name found in two files is refused (which of
    the two would be the model's weight is not for rmjax to guess)."""
    seen: dict[str, Path] = {}
    for path in checkpoint_files(folder):
        for name, load in iter_tensors(path):
            if name in seen:
                raise CheckpointError(f"{folder}: tensor {name!r} is in both {seen[name].name} and {path.name}; "
                                      "keep only the checkpoint's own weight files (model.safetensors, or the "
                                      "shards model.safetensors.index.json lists).")
            seen[name] = path
            yield name, load


def save_file(tensors: dict[str, np.ndarray], path: Path, metadata: dict | None = None) -> None:
    names = {v: k for k, v in _DTYPES.items()}
    header, offset = {}, 0
    arrays = []
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr)
        header[name] = {
            "dtype": names[arr.dtype.type],
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + arr.nbytes],
        }
        offset += arr.nbytes
        arrays.append(arr)
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for arr in arrays:
            f.write(arr.tobytes())
    tmp.replace(path)
