"""rmjax's GGUF reader against gguf's own: every metadata value and every tensor (name, type, shape, offset, data)
the same, on the real SmolLM2 file and on a file written with every value type gguf's writer has."""

from __future__ import annotations

import numpy as np
import pytest

from rmjax.errors import CheckpointError
from rmjax.loading import resolve
from rmjax.loading.gguf_file import read_gguf
from tests.gguf_reading import plain_reading_once


def _same_as_gguf(path) -> int:
    """Assert rmjax's reading of `path` equals gguf.GGUFReader's; the number of metadata keys compared."""
    import gguf

    with plain_reading_once():
        ref = gguf.GGUFReader(str(path))
    ours = read_gguf(path)
    keys = [k for k in ref.fields if not k.startswith("GGUF.")]  # gguf's own header pseudo-fields
    assert sorted(ours.metadata) == sorted(keys)
    for key in keys:
        field = ref.fields[key]
        want, got = field.contents(), ours.metadata[key]
        assert got == want and type(got) is type(want), key
        if isinstance(want, list) and want:
            assert [type(v) for v in got] == [type(v) for v in want], key
        assert ours.kinds[key] == int(field.types[0]), key
    assert [t.name for t in ours.tensors] == [t.name for t in ref.tensors]
    for mine, theirs in zip(ours.tensors, ref.tensors, strict=True):
        assert mine.tensor_type == theirs.tensor_type and mine.data_offset == int(theirs.data_offset)
        assert mine.shape == tuple(reversed([int(d) for d in theirs.shape])) and mine.n_bytes == int(theirs.n_bytes)
        assert mine.data.dtype == theirs.data.dtype and mine.data.shape == theirs.data.shape, mine.name
        np.testing.assert_array_equal(mine.data, theirs.data)
    return len(keys)


def test_the_smollm2_file_reads_as_ggufs_reader_reads_it():
    _, path = resolve("smollm2-135m-instruct")
    assert _same_as_gguf(path) > 20


@pytest.mark.parametrize("endian", ["LITTLE", "BIG"])
def test_every_value_and_tensor_type_reads_as_ggufs_reader_reads_it(tmp_path, endian):
    """Each value type gguf's writer has, and float, integer and quantized tensors, in either byte order (gguf's
    reader tells a big-endian file by its version field)."""
    import gguf

    path = tmp_path / "all.gguf"
    w = gguf.GGUFWriter(str(path), "llama", endianess=getattr(gguf.GGUFEndian, endian))
    for i, (name, value) in enumerate((("uint8", 7), ("int8", -7), ("uint16", 65535), ("int16", -300),
                                       ("uint32", 2**32 - 1), ("int32", -(2**31)), ("float32", 0.1),
                                       ("uint64", 2**64 - 1), ("int64", -(2**63)), ("float64", 0.1),
                                       ("bool", True), ("string", "café\n,None"))):
        getattr(w, f"add_{name}")(f"x.{i}.{name}", value)
    w.add_array("x.strings", ["a", "", "原始", "NaN"])
    w.add_array("x.ints", [1, -2, 3])
    w.add_array("x.floats", [0.5, -1.25])
    w.add_array("x.bools", [True, False])
    w.add_array("x.empty", [])
    rng = np.random.default_rng(0)
    w.add_tensor("f32", rng.standard_normal((3, 5)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal((2, 7)).astype(np.float16))
    w.add_tensor("i32", np.arange(6, dtype=np.int32).reshape(2, 3))  # the writer swaps what it is given
    q8 = gguf.quants.quantize(rng.standard_normal((2, 64)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("q8", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert _same_as_gguf(path) >= 17
    assert path.read_bytes()[4:8] == (3).to_bytes(4, endian.lower())  # the version field in the file's order
    ours = read_gguf(path)
    assert ours.metadata["x.3.int16"] == -300 and ours.metadata["x.strings"] == ["a", "", "原始", "NaN"]
    assert ours.tensors[2].data.tolist() == [[0, 1, 2], [3, 4, 5]] and ours.tensors[-1].shape == (2, 64)


def test_a_tensor_past_the_end_of_the_file_is_refused_naming_it(tmp_path):
    import gguf

    path = tmp_path / "cut.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("token_embd.weight", np.zeros((64, 64), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match=r"truncated: tensor 'token_embd.weight' ends at byte \d+ of a"):
        read_gguf(path)
