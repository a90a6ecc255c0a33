"""A GGUF file's metadata and tensor table, read in one bounded pass.

gguf's own reader (0.19) slices its memory map once per metadata element: ~790k slices for Gemma 3's 262k-token
vocabulary, 14 s of a 47 s conversion. Here numeric arrays are one `frombuffer` each and strings one slice each
(0.3 s). Every count is also held to the bytes that remain: gguf's reader reads an array of numbers one element at a
time, and past the end of the file each element is an empty slice, so a 60-byte file whose array claims 2^60
elements looped until memory ran out. Tensor data stay views of the map, as gguf's reader gives them, so that
`gguf.quants.dequantize` takes them unchanged.
"""

from __future__ import annotations

import dataclasses
import struct
from pathlib import Path

import numpy as np

# GGUF value types (gguf.constants.GGUFValueType): the numbers' numpy types, then strings and arrays.
_NUMBERS = {0: "u1", 1: "i1", 2: "u2", 3: "i2", 4: "u4", 5: "i4", 6: "f4", 7: "?", 10: "u8", 11: "i8", 12: "f8"}
_STRING, _ARRAY = 8, 9
_MAX_DEPTH = 8  # arrays of arrays (gguf writes none deeper than 1)
_MAGIC = b"GGUF"
_DEFAULT_ALIGNMENT = 32
# Tensor types whose data gguf's reader gives as typed arrays (the rest as rows of bytes): GGMLQuantizationType ids.
_TYPED = {0: "f4", 1: "f2", 24: "i1", 25: "i2", 26: "i4", 27: "i8", 28: "f8"}


class TruncatedError(ValueError):
    """A tensor's data run past the end of the file."""


@dataclasses.dataclass(frozen=True)
class GGUFTensor:
    name: str
    tensor_type: object  # gguf.GGMLQuantizationType
    shape: tuple[int, ...]  # numpy order (GGUF lists the fastest-varying dimension first)
    data_offset: int
    n_bytes: int
    data: np.ndarray  # a view of the file: typed for float and integer tensors, rows of bytes for quantized ones


@dataclasses.dataclass(frozen=True)
class GGUFContents:
    """`metadata`: key -> a Python scalar, a str, or a list of them (GGUF arrays), the values gguf's reader's
    `contents()` gives; `kinds`: key -> its GGUF value type (8 string, 9 array, else a number)."""

    metadata: dict
    kinds: dict
    tensors: list[GGUFTensor]


def read_contents(path: Path) -> GGUFContents:
    """The metadata and tensors of a GGUF v2/v3 file; ValueError naming the first thing that is wrong."""
    data = np.memmap(path, mode="r").view(np.ndarray)  # the view keeps the map alive; slices of it are plain
    return _Parser(data).contents()


class _Parser:
    def __init__(self, data: np.ndarray):
        self.data, self.buffer, self.size = data, memoryview(data), len(data)
        if self.size < 24 or bytes(data[:4]) != _MAGIC:
            raise ValueError("GGUF magic invalid (not a GGUF file)")
        (version,) = struct.unpack_from("<I", self.buffer, 4)
        self.order = ">" if version & 0xFFFF == 0 else "<"  # a big-endian file, as gguf's reader detects it
        version = self.number(4, "I")
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} is not supported (2 and 3 are)")

    def need(self, offs: int, n: int) -> None:
        if offs + n > self.size:
            raise ValueError(f"metadata needs bytes up to {offs + n} of a {self.size}-byte file (truncated or corrupt)")

    def number(self, offs: int, fmt: str):
        self.need(offs, struct.calcsize(fmt))
        return struct.unpack_from(self.order + fmt, self.buffer, offs)[0]

    def string(self, offs: int) -> tuple[str, int]:
        length = self.number(offs, "Q")
        self.need(offs + 8, length)
        try:
            return str(self.buffer[offs + 8 : offs + 8 + length], "utf-8"), offs + 8 + length
        except UnicodeDecodeError:
            raise ValueError(f"the string at byte {offs} is not UTF-8") from None

    def value(self, offs: int, kind: int, depth: int = 0):
        """(the value of type `kind` at `offs`, the offset after it)."""
        if kind in _NUMBERS:
            dtype = np.dtype(_NUMBERS[kind]).newbyteorder(self.order)
            self.need(offs, dtype.itemsize)
            return np.frombuffer(self.buffer, dtype, 1, offs)[0].item(), offs + dtype.itemsize
        if kind == _STRING:
            return self.string(offs)
        if kind == _ARRAY and depth < _MAX_DEPTH:
            item, count = self.number(offs, "I"), self.number(offs + 4, "Q")
            offs += 12
            if item in _NUMBERS:
                dtype = np.dtype(_NUMBERS[item]).newbyteorder(self.order)
                self.need(offs, count * dtype.itemsize)
                return np.frombuffer(self.buffer, dtype, count, offs).tolist(), offs + count * dtype.itemsize
            values = []
            for _ in range(count):  # strings or arrays: each takes at least 8 bytes, so this ends with the file
                one, offs = self.value(offs, item, depth + 1)
                values.append(one)
            return values, offs
        raise ValueError(f"unknown metadata value type {kind} at byte {offs}")

    def contents(self) -> GGUFContents:
        import gguf

        n_tensors, n_entries = self.number(8, "Q"), self.number(16, "Q")
        metadata, kinds, offs = {}, {}, 24
        for _ in range(n_entries):  # each entry takes at least 12 bytes, so this ends with the file
            key, offs = self.string(offs)
            kind = self.number(offs, "I")
            value, offs = self.value(offs + 4, kind)
            if key in metadata:
                raise ValueError(f"metadata key {key!r} appears twice")
            metadata[key], kinds[key] = value, kind
        infos = []
        for _ in range(n_tensors):  # each takes at least 24 bytes
            name, offs = self.string(offs)
            n_dims = self.number(offs, "I")
            self.need(offs + 4, 8 * n_dims + 12)
            dims = [self.number(offs + 4 + 8 * i, "Q") for i in range(n_dims)]
            offs += 4 + 8 * n_dims
            infos.append((name, dims, self.number(offs, "I"), self.number(offs + 4, "Q")))
            offs += 12
        alignment = metadata.get("general.alignment", _DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment < 1:
            raise ValueError(f"general.alignment={alignment!r} is not a positive integer")
        start = -(-offs // alignment) * alignment
        tensors, names = [], set()
        for name, dims, type_id, relative in infos:
            if name in names:
                raise ValueError(f"tensor {name!r} appears twice")
            names.add(name)
            kind = gguf.GGMLQuantizationType(type_id)  # ValueError for a type this gguf does not know
            block, type_size = gguf.GGML_QUANT_SIZES[kind]
            elements = int(np.prod(dims, dtype=object)) if dims else 1
            n_bytes = elements * type_size // block
            shape = tuple(reversed(dims))
            begin = start + relative
            if begin + n_bytes > self.size:
                raise TruncatedError(f"truncated: tensor {name!r} ends at byte {begin + n_bytes} of a "
                                     f"{self.size}-byte file")
            if type_id in _TYPED:
                dtype = np.dtype(_TYPED[type_id]).newbyteorder(self.order)
                array = np.frombuffer(self.buffer, dtype, elements, begin).reshape(shape)
            else:
                array = self.data[begin : begin + n_bytes].reshape(gguf.quant_shape_to_byte_shape(shape, kind))
            tensors.append(GGUFTensor(name, kind, shape, begin, n_bytes, array))
        return GGUFContents(metadata, kinds, tensors)
