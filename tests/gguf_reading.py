"""gguf's own reader, the reference rmjax's GGUF reading is held to (and the one transformers uses), made quicker
without changing what it parses."""

from __future__ import annotations

import contextlib
import types

_READERS: dict[str, object] = {}


@contextlib.contextmanager
def plain_array_reading():
    """gguf's reader (transformers' reference here) slices its numpy.memmap once per metadata item (~500k slices for
    a 49k-token vocabulary), and each memmap slice pays `memmap.__array_finalize__`. Within this block the reader
    maps the file the same way but reads through a plain ndarray view of the map: the same bytes, a fraction of the
    time."""
    import gguf.gguf_reader as module

    real = module.np

    class _Numpy(types.ModuleType):
        def __getattr__(self, name):
            return getattr(real, name)

        @staticmethod
        def memmap(path, mode="r"):
            return real.memmap(path, mode=mode).view(real.ndarray)  # the view keeps the map alive

    module.np = _Numpy("numpy")
    try:
        yield
    finally:
        module.np = real


@contextlib.contextmanager
def plain_reading_once():
    """plain_array_reading, each file's gguf reader built once per process: transformers builds one for the
    config and one for the weights (and one for the tokenizer), ~12 s each for Gemma 3's 262k-token vocabulary.
    The reader is gguf's own class; only its construction is shared."""
    import gguf

    real = gguf.GGUFReader

    def reader(path, *args, **kwargs):
        if args or kwargs:
            return real(path, *args, **kwargs)
        if str(path) not in _READERS:
            _READERS[str(path)] = real(path)
        return _READERS[str(path)]

    gguf.GGUFReader = reader
    try:
        with plain_array_reading():
            yield
    finally:
        gguf.GGUFReader = real
