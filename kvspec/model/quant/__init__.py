"""KV-cache quantization: every ``kv_cache_dtype`` of the reference, as format objects.

* :mod:`.modes` -- the reference's ``KVQuantMode`` and its string mapping;
* :mod:`.formats` -- one :class:`QuantFormat` per storage format, each carrying
  its rules (the layers it applies to, the model dtypes it takes, how it packs
  a cell); ``layer_quant`` decides how one layer is stored;
* :mod:`.cells` -- the addressable parts of a cell (K, V, scales, NoPE/RoPE).

What each format stores, and the vLLM source of every number, is in
docs/quantization.md.
"""

from kvspec.model.quant.cells import CellPart, cell_parts
from kvspec.model.quant.formats import (
    FORMATS,
    KV_CACHE_DTYPES,
    LayerQuant,
    QuantFormat,
    ScaleTensor,
    format_for,
    formats_of_mode,
    layer_quant,
)
from kvspec.model.quant.modes import KVQuantMode, QuantizationError, quant_mode

__all__ = [
    "FORMATS",
    "KV_CACHE_DTYPES",
    "CellPart",
    "KVQuantMode",
    "LayerQuant",
    "QuantFormat",
    "QuantizationError",
    "ScaleTensor",
    "cell_parts",
    "format_for",
    "formats_of_mode",
    "layer_quant",
    "quant_mode",
]
