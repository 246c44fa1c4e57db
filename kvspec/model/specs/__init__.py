"""Layer specs: what one layer stores per block, and what a request costs it.

One frozen class per layer kind (registered in :mod:`kvspec.model.kinds`):

* :mod:`.base` -- ``LayerSpec`` and the merge rules derived from fields;
* :mod:`.attention` -- full, sliding-window, chunked-local, sink, R-SWA,
  cross, encoder, ring and kpool-tail attention;
* :mod:`.mla` -- latent attention (MLA, sliding-window MLA, hidden-state caches);
* :mod:`.state` -- recurrent state layers (Mamba, GDN, short conv, linear attention);
* :mod:`.uniform` -- one group of one type whose pages differ in size.
"""

from kvspec.model.specs.attention import (
    RSWA,
    Attention,
    ChunkedLocal,
    CircularBuffer,
    CrossAttention,
    DraftSlidingWindow,
    EncoderOnly,
    FullAttention,
    KpoolTail,
    SinkFullAttention,
    SlidingWindow,
)
from kvspec.model.specs.base import (
    LayerSpec,
    MergeConflict,
    MergeInvalid,
    cdiv,
    recast,
    replace,
    round_up,
)
from kvspec.model.specs.mla import MLA, HiddenState, SlidingWindowMLA
from kvspec.model.specs.state import MAMBA_TYPES, MambaState
from kvspec.model.specs.uniform import UniformType, layer_specs

__all__ = [
    "MAMBA_TYPES", "MLA", "RSWA", "Attention", "ChunkedLocal", "CircularBuffer",
    "CrossAttention", "DraftSlidingWindow", "EncoderOnly", "FullAttention", "HiddenState",
    "KpoolTail", "LayerSpec", "MambaState", "MergeConflict", "MergeInvalid",
    "SinkFullAttention", "SlidingWindow", "SlidingWindowMLA", "UniformType", "cdiv",
    "layer_specs", "recast", "replace", "round_up",
]
