"""The addressable parts of a quantized cell, for the runtime's per-part views.

>>> [p.name for p in cell_parts("int8_per_token_head", kind="attention", dtype="int8",
...                             head_size=128, head_size_v=128, cell_bytes=264)]
['k', 'k_scale', 'v', 'v_scale']
>>> cell_parts("nvfp4", kind="attention", dtype="uint8", head_size=128, head_size_v=128,
...            cell_bytes=72) is None      # packed for one backend's kernels only
True

A layer's quantization as the plan records it (:class:`Quantized`) is decided
once, by the expand pass, with :func:`quantized`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from kvspec.errors import KvspecError
from kvspec.model import kinds
from kvspec.model.dtypes import DTYPE_SIZES
from kvspec.model.quant.formats import (
    DeepSeekMLA,
    PerTokenHead,
    QuantFormat,
    format_for,
)
from kvspec.model.quant.modes import KVQuantMode
from kvspec.model.specs import Attention, LayerSpec


@dataclass(frozen=True, slots=True)
class CellPart:
    """``count`` elements of ``dtype`` starting ``byte_offset`` bytes into the
    cell; the runtime views it as ``(B, H, N, count)`` without a copy."""

    name: str
    dtype: str
    byte_offset: int
    count: int

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "dtype": self.dtype, "byte_offset": self.byte_offset,
                "count": self.count}


def _dense(kind: str, dtype: str, hs: int, hv: int, cell: int) -> list[CellPart] | None:
    if kind == "mla":
        return [CellPart("latent", dtype, 0, hs)]
    return [CellPart("k", dtype, 0, hs), CellPart("v", dtype, hs * DTYPE_SIZES[dtype], hv)]


def _ds_mla(kind: str, dtype: str, hs: int, hv: int, cell: int) -> list[CellPart] | None:
    if kind != "mla":
        return None
    if cell == 656:     # 512 e4m3 NoPE | 4 fp32 tile scales | 64 bf16 RoPE
        return [CellPart("nope", "float8_e4m3fn", 0, 512), CellPart("scale", "float32", 512, 4),
                CellPart("rope", "bfloat16", 528, 64)]
    tiles = max(1, hs // 128)
    if cell == hs + 4 * tiles:  # indexer key: e4m3 | fp32 scale
        return [CellPart("k", "float8_e4m3fn", 0, hs), CellPart("scale", "float32", hs, tiles)]
    return None


def _per_token_head(kind: str, dtype: str, hs: int, hv: int, cell: int,
                    packed: bool) -> list[CellPart]:
    k, v = (hs // 2, hv // 2) if packed else (hs, hv)
    data = "uint8" if packed else dtype
    item = DTYPE_SIZES[data]
    return [CellPart("k", data, 0, k), CellPart("k_scale", "float32", k * item, 1),
            CellPart("v", data, k * item + 4, v),
            CellPart("v_scale", "float32", k * item + 4 + v * item, 1)]


def _parts(fmt: QuantFormat, kind: str, dtype: str, hs: int, hv: int,
           cell: int) -> list[CellPart] | None:
    if isinstance(fmt, DeepSeekMLA):
        return _ds_mla(kind, dtype, hs, hv, cell) if fmt.name == "fp8_ds_mla" else None
    if isinstance(fmt, PerTokenHead):
        return _per_token_head(kind, dtype, hs, hv, cell, fmt.per_byte == 2)
    if fmt.mode in (KVQuantMode.NONE, KVQuantMode.FP8_PER_TENSOR):
        return _dense(kind, dtype, hs, hv, cell)
    return None


def cell_parts(kv_cache_dtype: str, *, kind: str, dtype: str, head_size: int,
               head_size_v: int, cell_bytes: int) -> tuple[CellPart, ...] | None:
    """The parts of one cell, in cell order, or None when the format is opaque
    (nvfp4, turboquant: packed for one backend's kernels) or the cell is not the
    format's own (an explicit ``state_content_bytes``).

    ``kind`` is ``"attention"`` or ``"mla"``; ``dtype`` the storage dtype of the
    view; ``cell_bytes`` the cell size the plan uses (checked against the parts).
    """
    parts = _parts(format_for(kv_cache_dtype), kind, dtype, head_size, head_size_v,
                   cell_bytes)
    if not parts:
        return None
    end = max(p.byte_offset + p.count * DTYPE_SIZES[p.dtype] for p in parts)
    return tuple(parts) if end == cell_bytes else None


class Quantized(NamedTuple):
    """A layer's quantization as the plan records it: its ``kv_cache_dtype``, the
    addressable parts of its cells (None: opaque) and whether it has per-tensor
    scales (a named tuple: one per distinct spec of every compile and read)."""

    kv_cache_dtype: str
    cell_parts: tuple[CellPart, ...] | None
    per_tensor_scales: bool


def quantized(spec: LayerSpec, kv_cache_dtype: str | None) -> Quantized | None:
    """The quantization of a layer of ``spec`` under ``kv_cache_dtype``; None for a
    layer without one (state layers).

    >>> from kvspec.model.specs import FullAttention
    >>> f = FullAttention(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16")
    >>> q = quantized(f, "auto")
    >>> [p.name for p in q.cell_parts], q.per_tensor_scales
    (['k', 'v'], False)
    """
    if not isinstance(spec, Attention) or kv_cache_dtype is None:
        return None
    try:
        parts = cell_parts(kv_cache_dtype, kind="mla" if kinds.of(spec).latent else "attention",
                           dtype=spec.dtype, head_size=spec.head_size,
                           head_size_v=spec.head_size_v or 0,
                           cell_bytes=spec.state_content_size_bytes)
        return Quantized(kv_cache_dtype, parts, format_for(kv_cache_dtype).per_tensor_scales)
    except KvspecError:
        return Quantized(kv_cache_dtype, None, False)
