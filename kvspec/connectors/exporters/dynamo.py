"""``--as dynamo``: Dynamo KVBM's ``LayoutDescriptor`` JSON, where KVBM can express the cache.

KVBM (``ai-dynamo/dynamo``, crate ``kvbm-physical``) describes a rank's blocks with one
uniform geometry (``lib/kvbm-physical/src/layout/serialize.rs``, ``config.rs``,
``kv_block_layout.rs``)::

    LayoutDescriptor {version: 1, layout_config, location, nixl_metadata,
                      memory_descriptors: [{addr, size}], layout_type_details}
    LayoutConfig {num_blocks, num_layers, outer_dim (1..2), page_size (tokens, a power
                  of two), inner_dim, alignment, dtype_width_bytes (1, 2, 4, 8), num_heads}

kvspec's cell is one head's K||V, so ``outer_dim`` is 1 and ``inner_dim`` is
``heads * C`` elements. Layer-compact orders are ``LayerSeparate`` (one memory
descriptor per layer, ``[num_blocks, 1, page_size, inner_dim]``, ``BlockIsFirstDim``),
block-outermost ones ``FullyContiguous`` (one descriptor, ``[num_blocks, num_layers, 1,
page_size, inner_dim]``); ``LBNHC``/``BLNHC`` are ``OperationalNHD``, ``LBHNC``/``BLHNC``
``OperationalHND``.

What KVBM cannot express is refused, naming the field: several groups (hybrids, a
drafter's pool: one ``LayoutConfig`` is one geometry), state layers, layers of
different shapes or dtypes, padded pages, compressed states (tokens per state other
than 1), a block size that is not a power of two (``page_size``), a dtype width that is
not one (``dtype_width_bytes``), heads outside blocks (``LHBNC``, ``BHLNC``).

>>> from kvspec.artifact import Artifact
>>> from kvspec.connectors.describe import describe
>>> out = export(describe(Artifact.read("layouts/llama-3.1-8b.kvlayout.json")))
>>> out["layout_config"]["inner_dim"], list(out["layout_type_details"])
(2048, ['LayerSeparate'])
>>> export(describe(Artifact.read("layouts/gpt-oss-120b.kvlayout.json")))
... # doctest: +NORMALIZE_WHITESPACE
Traceback (most recent call last):
...
kvspec.connectors.descriptor.ExportError: kvspec: error: Dynamo KVBM's LayoutDescriptor cannot
  express this cache: it has 2 groups (sliding_window, full_attention), and one LayoutConfig is
  one geometry
...
"""

from __future__ import annotations

from typing import Any

from kvspec.connectors.descriptor import Descriptor, ExportError, Layer
from kvspec.model import kinds
from kvspec.model.axes import DIM_H, DIM_N, AxisOrder
from kvspec.model.dtypes import dtype_size

__all__ = ["VERSION", "export", "layout_type"]

#: ``LayoutDescriptor::CURRENT_VERSION``.
VERSION = 1


def layout_type(order: AxisOrder) -> tuple[str, str] | None:
    """``(layout type, KvBlockLayout)`` of an axis order; None where a layer's page is not
    one run (``LHBNC``, ``BHLNC``).

    >>> layout_type(AxisOrder.LBNHC), layout_type(AxisOrder.BLHNC)
    (('LayerSeparate', 'OperationalNHD'), ('FullyContiguous', 'OperationalHND'))
    """
    if not order.is_block_compact:  # a layer's page is not one run (LHBNC, BHLNC)
        return None
    kind = "FullyContiguous" if order.is_block_outermost else "LayerSeparate"
    hnd = order.value.index(DIM_H) < order.value.index(DIM_N)
    return kind, "OperationalHND" if hnd else "OperationalNHD"


def _refuse(message: str, path: str, found: object, hint: str) -> ExportError:
    return ExportError(f"Dynamo KVBM's LayoutDescriptor cannot express this cache: {message}",
                       path=path, found=str(found), hint=hint)


def _uniform(desc: Descriptor) -> tuple[Layer, int]:
    """The one layer geometry every layer shares, and the block size; else a refusal."""
    if len(desc.groups) != 1:
        kinds_ = ", ".join(g.kind for g in desc.groups)
        raise _refuse(f"it has {len(desc.groups)} groups ({kinds_}), and one LayoutConfig is "
                      "one geometry", "groups", len(desc.groups),
                      "export a single-group layout; hybrids need kvspec's own descriptor")
    g, first = desc.groups[0], desc.layers[0]
    if kinds.by_name(first.kind).state:
        raise _refuse(f"its layers are state layers ({first.kind}), which have no tokens "
                      "per block", "layers[0].kind", first.kind, "KVBM holds attention KV")
    for i, x in enumerate(desc.layers):
        for attr in ("heads", "states", "cell_bytes", "dtype", "block_stride"):
            if getattr(x, attr) != getattr(first, attr):
                raise _refuse(f"layer {x.name}'s {attr} differs from layer {first.name}'s",
                              f"layers[{i}].{attr}", getattr(x, attr),
                              "KVBM's layers are all one shape")
        if x.page_bytes_padded is not None:
            raise _refuse(f"layer {x.name}'s pages are padded to {x.page_bytes_padded} B",
                          f"layers[{i}].page_bytes_padded", x.page_bytes_padded,
                          "KVBM has no padding between pages")
    if g.tokens_per_state not in (None, "1"):
        raise _refuse(f"a state covers {g.tokens_per_state} tokens, and page_size counts "
                      "tokens", "groups[0].tokens_per_state", g.tokens_per_state,
                      "KVBM stores one row per token")
    if g.block_size & (g.block_size - 1):
        raise _refuse(f"page_size must be a power of two, and the block size is "
                      f"{g.block_size}", "groups[0].block_size", g.block_size,
                      "compile with a power-of-two block size (16, 32, 64...)")
    width = dtype_size(first.dtype)
    if width not in (1, 2, 4, 8):
        raise _refuse(f"dtype_width_bytes must be 1, 2, 4 or 8, and {first.dtype} is "
                      f"{width} B", "layers[0].dtype", first.dtype, "use a byte-wide dtype")
    return first, g.block_size


def _tiled(desc: Descriptor, kind: str, page: int) -> None:
    """Pages tile KVBM's shape: each layer's blocks one page apart (``LayerSeparate``),
    or each block's layers one page apart and blocks ``num_layers`` pages apart."""
    first = desc.layers[0]
    for i, y in enumerate(desc.layers):
        ok = y.block_stride == page if kind == "LayerSeparate" else \
            (y.offset == first.offset + i * page and y.block_stride == len(desc.layers) * page)
        if not ok:
            raise _refuse(f"layer {y.name}'s pages do not tile {kind}'s shape",
                          f"layers[{i}].offset", y.offset,
                          "KVBM's blocks are dense: compile without padding or packing")


def _location(desc: Descriptor) -> tuple[Any, str, int]:
    r = desc.regions[0]
    if r.device is None:
        where: Any = {"Device": r.device_id} if r.memory == "device" else "Pinned"
    elif r.device == "cpu":
        where = "Pinned" if r.memory == "host" else "System"
    else:
        where = {"Device": r.device_id}
    return where, "Dram" if where in ("System", "Pinned") else "Vram", r.device_id


def export(desc: Descriptor, *, agent_name: str = "") -> dict[str, Any]:
    """KVBM's ``LayoutDescriptor`` of ``desc``'s cache, or an
    :class:`~kvspec.connectors.descriptor.ExportError` naming what it cannot express."""
    order = layout_type(AxisOrder.parse(desc.axis_order))
    if order is None:
        raise _refuse(f"axis order {desc.axis_order} splits a layer's page in one run per head",
                      "axis_order", desc.axis_order, "use LBNHC, LBHNC, BLNHC or BLHNC")
    x, block_size = _uniform(desc)
    item = dtype_size(x.dtype)
    pool = desc.pools[0]
    region = desc.regions[x.region]
    page = x.page_bytes
    kind, layout = order
    _tiled(desc, kind, page)
    if kind == "LayerSeparate":
        memory = [{"addr": region.base + y.offset, "size": pool.num_blocks * page}
                  for y in desc.layers]
        details: dict[str, Any] = {"block_dim": "BlockIsFirstDim", "kv_block_layout": layout}
    else:
        memory = [{"addr": region.base + desc.layers[0].offset,
                   "size": pool.num_blocks * x.block_stride}]
        details = {"block_format": "Operational", "kv_block_layout": layout}
    where, mem_type, device = _location(desc)
    return {"version": VERSION,
            "layout_config": {"num_blocks": pool.num_blocks, "num_layers": len(desc.layers),
                              "outer_dim": 1, "page_size": block_size,
                              "inner_dim": x.heads * x.cell_bytes // item, "alignment": 1,
                              "dtype_width_bytes": item, "num_heads": x.heads},
            "location": where,
            "nixl_metadata": {"agent_name": agent_name, "mem_type": mem_type,
                              "device_id": device},
            "memory_descriptors": memory, "layout_type_details": {kind: details}}
