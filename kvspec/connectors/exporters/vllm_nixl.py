"""``--as vllm-nixl``: vLLM 0.33.0's ``NixlAgentMetadata`` for the same cache.

vLLM's NIXL connector describes a rank's KV cache to its peers in
``NixlAgentMetadata`` (``vllm/distributed/kv_transfer/kv_connector/v1/nixl/metadata.py``,
21 fields), which ``register_kv_caches`` fills from the per-layer cache tensors
(``nixl/base_worker.py``, lines 1481-1946). This module computes the same fields from
a :class:`~kvspec.connectors.descriptor.Descriptor`, following those rules:

* layers in vLLM's region order (``_region_sort_key``: natural layer-name order);
* a *region* per layer at the layer's first byte, ``(base, block_len, block_stride)``:
  the page (padded) and the block stride; where a layer's blocks are not one strided
  page per block (heads outside blocks: ``LHBNC``, ``BHLNC``) one region per segment
  of ``num_blocks * block_stride`` bytes; a block-outermost MLA cache one region of
  whole block rows, its layers in ``packed_member_layouts``; a state (Mamba) layer
  ``(base, page, page)``;
* regions at one address are one (slot aliasing), their group id ``-1`` when layers
  of several groups share it; a later layer whose page there is longer, or strided
  otherwise, than the region vLLM keeps (the first one's) cannot be registered;
* ``block_size`` the lcm of the attention groups' block sizes (a kernel block size
  where the cache was loaded split), ``ssm_sizes`` the first state layer's two tensors.

``engine_id``, ``agent_metadata`` (the NIXL agent's own bytes) and
``attn_backend_name`` are the serving engine's, not the cache's: they are left empty
unless given. :func:`descriptors_per_block` counts what vLLM's ``_compute_desc_ids``
posts per block of a group (``base_worker.py`` lines 140-262): its regions for the
group, and per state layer one descriptor per conv sub-projection plus one.

>>> from kvspec.artifact import Artifact
>>> from kvspec.connectors.describe import describe
>>> d = describe(Artifact.read("layouts/gpt-oss-120b.kvlayout.json"))
>>> meta = agent_metadata(d)
>>> len(meta["kv_caches_base_addr"]), set(meta["region_group_ids"]), meta["block_lens"][0]
(18, {-1}, 16384)
>>> descriptors_per_block(d, 0), descriptors_per_block(d, 1)
(18, 18)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from kvspec.connectors.descriptor import Descriptor, ExportError, Layer
from kvspec.connectors.exporters.pools import one_pool
from kvspec.model import kinds

__all__ = ["FIELDS", "RUNTIME_FIELDS", "agent_metadata", "descriptors_per_block", "export",
           "regions"]

#: ``NixlAgentMetadata``'s fields, in its order (vLLM 0.33.0).
FIELDS = ("engine_id", "agent_metadata", "kv_caches_base_addr", "device_id", "num_blocks",
          "block_lens", "block_strides", "kv_cache_layout", "block_size", "ssm_sizes",
          "attn_backend_name", "physical_blocks_per_logical_kv_block", "region_num_blocks",
          "region_group_ids", "region_names", "region_mem_types", "dcp_size", "pcp_size",
          "ple_block_len", "region_members", "packed_member_layouts")
#: Fields the serving engine fills, not the cache.
RUNTIME_FIELDS = ("engine_id", "agent_metadata", "attn_backend_name")
#: Descriptors per state layer and block: conv sub-projections + the temporal state
#: (``ssm_conv_transfer_utils.derive_mamba_conv_split``); other types vLLM refuses.
_STATE_DESCRIPTORS: dict[str | None, int] = {"MAMBA1": 2, "MAMBA2": 4, "GDN_ATTN": 4}
_SHARED = -1


@dataclass
class _Region:
    base: int
    block_len: int
    block_stride: int
    num_blocks: int
    group: int
    name: str
    mem: str
    state: bool
    members: list[str] = field(default_factory=list)


def _sort_key(name: str) -> tuple[tuple[int, int | str], ...]:
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"(\d+)", name))


def _mem(desc: Descriptor, layer: Layer) -> str:
    region = desc.regions[layer.region]
    if region.device is not None:
        return "DRAM" if region.device == "cpu" else "VRAM"
    return "DRAM" if region.memory == "host" else "VRAM"


def _layer_regions(desc: Descriptor, x: Layer, packed: bool, packed_layouts: dict
                   ) -> list[tuple[int, int, int]] | None:
    """``(base, block_len, block_stride)`` of layer ``x`` as ``register_kv_caches`` makes
    them; None where vLLM cannot partition the layer's view into regions."""
    region = desc.regions[x.region]
    pool = next(p for p in desc.pools if p.name == x.pool)
    page = x.page_bytes_padded or x.page_bytes
    base = region.base + x.offset
    if kinds.by_name(x.kind).state:
        return [(base, page, page)]
    stride = x.block_stride
    block_major = 0 <= region.length - pool.num_blocks * stride < stride
    contiguous = len(x.runs) == 1 and x.page_bytes_padded is None
    if packed and block_major and kinds.by_name(x.kind).latent:
        packed_layouts[x.name] = (x.offset, page)
        return [(region.base, stride, stride)]
    if block_major and not contiguous:
        return [(region.base, stride, stride)]
    if block_major:
        return [(base, page, stride)]
    segment = pool.num_blocks * stride
    nbytes = pool.num_blocks * x.page_bytes
    if segment == 0 or nbytes % segment:
        return None
    count = nbytes // segment
    return [(base + i * segment, stride if count > 1 else page, stride) for i in range(count)]


def regions(desc: Descriptor) -> tuple[list[_Region], dict[str, tuple[int, int]]] | None:
    """vLLM's regions of ``desc``'s cache and its packed member layouts (None: vLLM's
    registration would fail on this cache)."""
    layers = sorted(desc.layers, key=lambda x: _sort_key(x.name))
    strides = {x.block_stride for x in layers}
    mla = any(kinds.by_name(x.kind).latent for x in layers)
    state = any(kinds.by_name(x.kind).state for x in layers)
    block_outer = desc.axis_order.startswith("B")
    packed = block_outer and len(strides) == 1 and len(desc.regions) == 1 and mla and not state
    out: list[_Region] = []
    by_base: dict[int, _Region] = {}
    packed_layouts: dict[str, tuple[int, int]] = {}
    for x in layers:
        found = _layer_regions(desc, x, packed, packed_layouts)
        if found is None:
            return None
        pool = next(p for p in desc.pools if p.name == x.pool)
        for base, block_len, stride in found:
            r = by_base.get(base)
            if r is None:
                r = by_base[base] = _Region(base, block_len, stride, pool.num_blocks, x.group,
                                            x.name, _mem(desc, x), kinds.by_name(x.kind).state)
                out.append(r)
            else:
                if kinds.by_name(x.kind).latent:
                    r.block_len, r.block_stride, r.num_blocks = block_len, stride, pool.num_blocks
                elif block_len > r.block_len or stride != r.block_stride:
                    return None  # vLLM keeps the first layer's region: this one's bytes fall out
                if r.group != x.group:
                    r.group = _SHARED
                r.state |= kinds.by_name(x.kind).state
            r.members.append(x.name)
    return out, packed_layouts


def _block_size(desc: Descriptor) -> tuple[int, int]:
    """vLLM's transfer ``block_size`` and ``physical_blocks_per_logical_kv_block``."""
    sizes = [g.block_size for g in desc.groups if g.kind != "mamba"]
    logical = math.lcm(*sizes) if sizes else desc.scheduler_block_size
    physical = min((g.physical_block_size for g in desc.groups if g.kind != "mamba"),
                   default=logical)
    return (physical, logical // physical) if physical < logical else (logical, 1)


def agent_metadata(desc: Descriptor, *, engine_id: str = "", agent: bytes = b"",
                   attn_backend_name: str = "") -> dict[str, Any]:
    """``NixlAgentMetadata``'s 21 fields for ``desc``'s cache, by name, in its order
    (``agent_metadata`` as bytes). A :class:`ValueError` where vLLM could not register it."""
    found = regions(desc)
    if found is None:
        raise ValueError(f"vLLM 0.33.0's NIXL connector cannot partition this cache "
                         f"({desc.axis_order}) into regions")
    regs, packed = found
    block_size, ratio = _block_size(desc)
    main = desc.pools[0].num_blocks * ratio
    state = next((x for x in desc.layers if kinds.by_name(x.kind).state), None)
    ssm = (state.parts[0].bytes, state.parts[1].bytes) if state and len(state.parts) > 1 \
        else (0, 0)
    has_state = any(r.state for r in regs)
    return {
        "engine_id": engine_id, "agent_metadata": agent,
        "kv_caches_base_addr": [r.base for r in regs],
        "device_id": desc.regions[0].device_id if desc.regions else 0, "num_blocks": main,
        "block_lens": [r.block_len for r in regs],
        "block_strides": [r.block_stride for r in regs], "kv_cache_layout": desc.axis_order,
        "block_size": block_size, "ssm_sizes": ssm, "attn_backend_name": attn_backend_name,
        "physical_blocks_per_logical_kv_block": ratio,
        "region_num_blocks": [main if has_state else r.num_blocks * ratio for r in regs],
        "region_group_ids": [r.group for r in regs], "region_names": [r.name for r in regs],
        "region_mem_types": [r.mem for r in regs],
        "dcp_size": desc.parallel.decode_context_parallel_size, "pcp_size": 1,
        "ple_block_len": None, "region_members": [], "packed_member_layouts": packed,
    }


def descriptors_per_block(desc: Descriptor, group: int) -> int | None:
    """The descriptors vLLM 0.33.0's NIXL connector posts per block of ``group`` (read
    from one remote rank); None where it cannot move this cache or group."""
    found = regions(desc)
    if found is None or len({g.pool for g in desc.groups if not g.own_pool}) > 1:
        return None  # it cannot register this cache, or hold its several pools
    regs, _ = found
    states = [r for r in regs if r.state]
    g = next(x for x in desc.groups if x.id == group)
    if g.kind == "mamba":
        types = {x.state_type for x in desc.layers if x.group == group}
        per = _STATE_DESCRIPTORS.get(types.pop()) if len(types) == 1 else None
        return None if per is None else len(states) * per
    if states or len({r.group for r in regs}) <= 1:
        return len(regs)
    return sum(1 for r in regs if r.group in (group, _SHARED))


def export(desc: Descriptor) -> dict[str, Any]:
    """:func:`agent_metadata` as JSON data: ``agent_metadata`` (bytes the NIXL agent
    makes at run time) as ``""``, tuples as lists. A cache of several pools is refused
    (:func:`~kvspec.connectors.exporters.pools.one_pool`): vLLM 0.33 holds one."""
    one_pool(desc, "vllm-nixl")
    try:
        meta = agent_metadata(desc)
    except ValueError as exc:
        raise ExportError(str(exc), path="axis_order", found=desc.axis_order,
                          hint="vLLM registers a layer whose blocks are one strided page, "
                               "or one segment per head slot; use another axis order"
                          ) from None
    meta["agent_metadata"] = ""
    meta["ssm_sizes"] = list(meta["ssm_sizes"])
    meta["packed_member_layouts"] = {k: list(v) for k, v in meta["packed_member_layouts"].items()}
    return meta
