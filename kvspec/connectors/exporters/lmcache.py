"""``--as lmcache``: the cache as LMCache 0.5.6 reads a vLLM cache.

LMCache 0.5.6 (``pip install lmcache==0.5.6``) has no layout descriptor of its own
(``KVLayoutDescriptor`` is on LMCache's main branch only). It is handed the engine's
per-layer tensors and works out the rest:

1. each layer's ``EngineKVFormat`` (``lmcache/v1/gpu_connector/kv_format/detectors/vllm.py``):
   a 4-D fused K||V tensor is ``NL_X_NB_BS_NH_CS`` under the ``LayoutHints``
   ``kv_layout`` ``NHD`` or ``BLNHC`` and ``NL_X_NB_NH_BS_CS`` under ``HND`` or
   ``BLHNC``; a 3-D MLA tensor is ``NL_X_NB_BS_HS`` (``NL_X_NB_BSV_BSS`` for the fp8
   indexer's 132-byte rows);
2. the engine's groups as ``EngineGroupInfo`` (``lmcache/v1/multiprocess/group_view.py``),
   one per (engine group, transfer identity), as
   ``lmcache/integration/vllm/kv_cache_groups.py`` makes them: ``tokens_per_block``
   the group's block size (times the DCP size for attention), ``sw_size_tokens`` the
   sliding window (-1 without one); groups vLLM does not prefix-cache are left out;
3. kernel groups (``lmcache/v1/kv_layer_groups.py``): layers of one
   ``KernelGroupIdentity`` ``(kv_size, num_heads, head_size, block_size,
   engine_group_idx, dtype, engine_kv_format)``, each with a ``PageBufferShapeDesc``
   whose ``block_stride_elems`` is the tensor's ``stride(0)`` (every layer's bytes of a
   block under blocks-first layouts, a padded page's bytes under padding);
4. with ``separate_object_groups``, object groups by sliding window in chunks, whose
   windows are the ``AttnWindowDesc`` (``lmcache/v1/distributed/api.py``).

This module writes all of it for a descriptor: the per-layer tensor (shape, element
strides, offset, dtype) vLLM would hand over, the hint, the engine group infos, the
kernel groups with their shape descriptors, and the attention windows for a chunk
size. LMCache 0.5.6 cannot take state (Mamba) pages or layouts whose blocks are not
one strided page per layer (heads outside blocks): those are refused.

>>> from kvspec.artifact import Artifact
>>> from kvspec.connectors.describe import describe
>>> out = export(describe(Artifact.read("layouts/gpt-oss-120b.kvlayout.json")))
>>> out["layout_hints"], [(g["engine_kv_format"], len(g["layer_indices"]))
...                       for g in out["kernel_groups"]]
({'kv_layout': 'NHD'}, [('NL_X_NB_BS_NH_CS', 18), ('NL_X_NB_BS_NH_CS', 18)])
>>> out["attn_window"]["num_chunks_in_sw"]
[1, -1]
"""

from __future__ import annotations

from typing import Any

from kvspec.connectors.descriptor import Descriptor, ExportError, Layer
from kvspec.connectors.exporters.pools import one_pool
from kvspec.model import kinds
from kvspec.model.axes import DIM_H, DIM_N, AxisOrder
from kvspec.model.dtypes import canonical_dtype, dtype_size

__all__ = ["export", "hint"]



def hint(order: AxisOrder) -> str | None:
    """LMCache 0.5.6's ``LayoutHints`` ``kv_layout`` for an axis order: ``NHD`` or
    ``HND`` for layer-compact ones, the order's own name (``BLHNC``, ``BLNHC``) for
    block-outermost ones; None where a layer's page is not one run
    (``LHBNC``, ``BHLNC``).

    >>> [hint(o) for o in AxisOrder]
    ['NHD', 'HND', None, 'BLHNC', 'BLNHC', None]
    """
    if not order.is_block_compact:  # a layer's page is not one run (LHBNC, BHLNC)
        return None
    if order.is_block_outermost:
        return order.name
    return "HND" if order.value.index(DIM_H) < order.value.index(DIM_N) else "NHD"


def _refuse(message: str, path: str, found: str, hint: str) -> ExportError:
    return ExportError(f"LMCache 0.5.6 cannot express this cache: {message}", path=path,
                       found=found, hint=hint)


def _tensor(x: Layer, hnd: bool, num_blocks: int) -> dict[str, Any]:
    """The per-layer tensor vLLM hands LMCache: shape, element strides and offset (from
    its region's start), dtype."""
    item = dtype_size(x.dtype)
    c = x.cell_bytes // item
    if kinds.by_name(x.kind).latent:  # (NB, BS, HS)
        shape, stride = [x.states, c], [x.state_stride // item, 1]
    elif hnd:                         # (NB, NH, BS, CS)
        shape, stride = [x.heads, x.states, c], [x.head_stride // item, x.state_stride // item, 1]
    else:                             # (NB, BS, NH, CS)
        shape, stride = [x.states, x.heads, c], [x.state_stride // item, x.head_stride // item, 1]
    return {"shape": [num_blocks, *shape], "stride": [x.block_stride // item, *stride],
            "offset": x.offset // item, "dtype": canonical_dtype(x.dtype)}


def _format(x: Layer, hnd: bool) -> str:
    indexer = x.dtype == "uint8" and x.cell_bytes == 132
    if kinds.by_name(x.kind).latent:
        return "NL_X_NB_BSV_BSS" if indexer else "NL_X_NB_BS_HS"
    if indexer and x.heads == 1:
        return "NL_X_NB_BSV_BSS"
    return "NL_X_NB_NH_BS_CS" if hnd else "NL_X_NB_BS_NH_CS"


def export(desc: Descriptor, *, chunk_size: int = 256) -> dict[str, Any]:
    """What LMCache 0.5.6 derives from ``desc``'s cache (see the module's docstring),
    its attention windows for LMCache chunks of ``chunk_size`` tokens. A cache of
    several pools is refused (:func:`~kvspec.connectors.exporters.pools.one_pool`): the
    vLLM 0.33 cache LMCache reads is one."""
    one_pool(desc, "lmcache")
    kv_layout = hint(AxisOrder.parse(desc.axis_order))
    if kv_layout is None:
        raise _refuse(f"axis order {desc.axis_order} splits a layer's page in one run per "
                      "head, so a block of a layer is not one strided page", "axis_order",
                      desc.axis_order,
                      "use LBNHC, LBHNC, BLHNC or BLNHC")
    state = next((x for x in desc.layers if kinds.by_name(x.kind).state), None)
    if state is not None:
        raise _refuse(f"layer {state.name} is a state layer ({state.kind}): 0.5.6's "
                      "EngineKVFormat has no format for a state's byte page",
                      f"layers[{desc.layers.index(state)}].kind", state.kind,
                      "offload the attention groups with LMCache and keep state layers "
                      "in the engine")
    hnd = kv_layout in ("HND", "BLHNC")
    groups = {g.id: g for g in desc.groups}
    blocks = {p.name: p.num_blocks for p in desc.pools}
    layers = [dict(name=x.name, index=i, group=x.group, region=x.region,
                   engine_kv_format=_format(x, hnd), **_tensor(x, hnd, blocks[x.pool]))
              for i, x in enumerate(desc.layers)]
    buckets: dict[tuple, list[int]] = {}
    for entry, x in zip(layers, desc.layers, strict=True):
        if not groups[x.group].prefix_cacheable:
            continue  # vLLM's scratch groups: no tokens LMCache could store
        head = 1 if kinds.by_name(x.kind).latent else x.heads
        ident = (1, head, entry["shape"][-1], x.states, x.group, entry["dtype"],
                 entry["engine_kv_format"])
        buckets.setdefault(ident, []).append(entry["index"])
    kernel = [_kernel(ident, idx, layers, desc, groups) for ident, idx
              in sorted(buckets.items(), key=lambda kv: kv[1][0])]
    return {"lmcache": "0.5.6", "layout_hints": {"kv_layout": kv_layout}, "layers": layers,
            "engine_group_infos": [{k: g[k] for k in ("engine_group_id", "layer_indices",
                                                      "tokens_per_block", "sw_size_tokens",
                                                      "extra_object_group_tag",
                                                      "recurrent_state")} for g in kernel],
            "kernel_groups": kernel, "chunk_size": chunk_size,
            "attn_window": _windows(kernel, chunk_size, desc.parallel.tensor_parallel_size)}


def _kernel(ident: tuple, indices: list[int], layers: list[dict], desc: Descriptor,
            groups: dict) -> dict[str, Any]:
    kv_size, heads, head_size, _, gid, dtype, fmt = ident
    first = layers[indices[0]]
    x = desc.layer(first["name"])
    g = groups[gid]
    dcp = desc.parallel.decode_context_parallel_size
    # vLLM's SlidingWindowSpec family: the kinds that need a window
    sliding = "sliding_window" in kinds.by_name(x.kind).required
    window = g.sliding_window if sliding and g.sliding_window else -1
    return {"layer_indices": indices, "engine_group_id": gid, "engine_kv_format": fmt,
            "dtype": dtype, "tokens_per_block": g.block_size * dcp, "sw_size_tokens": window,
            "extra_object_group_tag": 0, "recurrent_state": False,
            "shape_desc": {"kv_size": kv_size, "nl": len(indices), "nb": first["shape"][0],
                           "bs": x.states, "nh": heads, "hs": head_size,
                           "element_size": dtype_size(x.dtype),
                           "block_stride_elems": first["stride"][0]}}


def _windows(kernel: list[dict], chunk: int, world: int) -> dict[str, Any]:
    """``AttnWindowDesc`` of the object groups ``separate_object_groups`` makes."""
    order: dict[int, int] = {}
    for g in kernel:
        w = g["sw_size_tokens"]
        order.setdefault(-1 if w == -1 else -(-w // chunk), len(order))
    windows = sorted(order, key=order.__getitem__)
    return {"num_chunks_in_sw": windows, "world_size": world,
            "group_kinds": ["attention"] * len(windows)}
