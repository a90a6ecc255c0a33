"""The model as Flax NNX modules (rmjax.nn.transformer, rmjax.nn.layers) and its state (rmjax.nn.state)."""

from rmjax.nn.layers import DecoderStack, Embedder, Linear, Patch, RMSNorm, SplitStack, constrain, weight
from rmjax.nn.state import (
    Declaration,
    abstract,
    declarations,
    flat,
    from_flat,
    get,
    graphdef,
    module,
    replace,
    shardings,
)
from rmjax.nn.transformer import (
    Forward,
    GatedHead,
    KVCache,
    Segments,
    Transformer,
    at_last,
    at_read,
    last_token_index,
    or_first_real,
    read_index,
    read_pad_id,
    readable,
)

__all__ = [
    "Declaration", "DecoderStack", "Embedder", "Forward", "GatedHead", "KVCache", "Linear", "Patch", "RMSNorm",
    "Segments", "SplitStack",
    "Transformer", "abstract", "at_last", "at_read", "constrain", "declarations", "flat", "from_flat", "get",
    "graphdef", "last_token_index", "module", "or_first_real", "read_index", "read_pad_id", "readable",
    "replace", "shardings", "weight",
]
