"""A GGUF file's metadata walked with bounds before gguf's reader sees it.

gguf's reader (0.19) reads an array of numbers one element at a time, and past the end of the file each element is
an empty slice that takes no bytes: a 60-byte file whose array claims 2^60 elements loops until memory runs out.
Here every count is held to the bytes that remain, so a file that promises more than it holds is refused at once.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

# GGUF value types and the size of each number type (gguf.constants.GGUFValueType).
_NUMBER_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
_MAX_DEPTH = 8  # arrays of arrays (gguf writes none deeper than 1)


def check_metadata_bounds(path: Path) -> None:
    """Raise ValueError naming the first key-value entry that runs past the end of `path` (a GGUF v2/v3 file);
    other versions and a wrong magic are left to gguf's reader."""
    with open(path, "rb") as f:
        if f.seek(0, 2) < 24:
            return  # too short for a header: the reader says so
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            _walk(data, len(data))


def _walk(data: mmap.mmap, size: int) -> None:
    if data[:4] != b"GGUF":
        return
    (version,) = struct.unpack_from("<I", data, 4)
    order = ">" if version & 0xFFFF == 0 else "<"  # a big-endian file, as gguf's reader detects it
    if struct.unpack_from(order + "I", data, 4)[0] not in (2, 3):
        return

    def number(offs: int, fmt: str) -> int:
        need(offs, struct.calcsize(fmt))
        return struct.unpack_from(order + fmt, data, offs)[0]

    def need(offs: int, n: int) -> None:
        if offs + n > size:
            raise ValueError(f"metadata needs bytes up to {offs + n} of a {size}-byte file (truncated or corrupt)")

    def value(offs: int, kind: int, depth: int) -> int:
        """The offset after a value of type `kind` at `offs`."""
        if kind in _NUMBER_SIZES:
            need(offs, _NUMBER_SIZES[kind])
            return offs + _NUMBER_SIZES[kind]
        if kind == _STRING:
            length = number(offs, "Q")
            need(offs + 8, length)
            return offs + 8 + length
        if kind == _ARRAY and depth < _MAX_DEPTH:
            item, count = number(offs, "I"), number(offs + 4, "Q")
            offs += 12
            if item in _NUMBER_SIZES:
                need(offs, count * _NUMBER_SIZES[item])
                return offs + count * _NUMBER_SIZES[item]
            for _ in range(count):  # strings or arrays: each takes at least 8 bytes, so this ends with the file
                offs = value(offs, item, depth + 1)
            return offs
        raise ValueError(f"unknown metadata value type {kind} at byte {offs}")

    offs, entries = 24, number(16, "Q")
    for _ in range(entries):  # each entry takes at least 12 bytes, so this ends with the file
        offs = value(offs, _STRING, 0)
        offs = value(offs + 4, number(offs, "I"), 0)
