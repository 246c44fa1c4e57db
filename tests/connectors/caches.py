"""Hand-built KV caches for the transfer tests and benchmark: geometry, views, plans.

A :class:`CacheSpec` is one rank's cache as a connector sees it: named regions of
bytes, and for each layer where its block 0 starts and its byte strides. A layer's
view is ``(B, H, N, P, c)`` bytes -- blocks, head slots, tokens, parts (K and V), bytes
of one part -- built with ``as_strided`` from that geometry alone::

    view[b, h, n, p, i] = region[offset + b*sb + h*sh + n*sn + p*sp + i]

:func:`plan_between` makes a transfer plan from two specs by walking every (head,
token, part) unit of block 0 and merging neighbours contiguous on both sides, so the
checks (:func:`check_moved`) read the views and never the plan. These stand in for
caches loaded from compiled artifacts and plans from ``kvspec transfer``: a test that
swaps them in keeps its checks.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from kvspec.connectors.plan import Region, Route, Run, Side, TransferPlan


@dataclass(frozen=True)
class LayerGeo:
    """One layer: block 0's offset in ``region``, shape and byte strides."""

    name: str
    group: str
    region: str
    offset: int
    shape: tuple[int, int, int, int, int]      # (B, H, N, P, c)
    strides: tuple[int, int, int, int]         # bytes per block, head, token, part


@dataclass(frozen=True)
class CacheSpec:
    """One rank's cache: regions (name, bytes), layers, blocks per group."""

    name: str
    regions: tuple[tuple[str, int], ...]
    layers: tuple[LayerGeo, ...]
    num_blocks: tuple[tuple[str, int], ...]

    @property
    def digest(self) -> str:
        """Stands in for the descriptor's identity digest (any rank of a deployment)."""
        return "sha256:" + hashlib.sha256(repr((self.regions, self.layers)).encode()
                                          ).hexdigest()[:16]

    def region_id(self, name: str) -> int:
        return [n for n, _ in self.regions].index(name)


def stacked(order: str, *, layers: int, heads: int, tokens: int, head_bytes: int,
            num_blocks: int, group: str = "full", region: str = "device",
            prefix: str = "layer", offset: int = 0) -> tuple[tuple[LayerGeo, ...], int]:
    """Layers of one group laid out in one region in axis order ``order``
    (``LBNHC``, ``LBHNC``, ``BLHNC``: cells of K then V of one head-token; ``KV-LBNHD``:
    vLLM's per-layer ``[2, B, N, H, D]``, K and V planes apart); and the bytes used."""
    b, h, n, c = num_blocks, heads, tokens, 2 * head_bytes
    page = h * n * c
    out = []
    for i in range(layers):
        if order == "LBNHC":      # layer, block, token, head, cell
            geo = (i * b * page, (page, c, h * c, head_bytes))
        elif order == "LBHNC":
            geo = (i * b * page, (page, n * c, c, head_bytes))
        elif order == "BLHNC":
            geo = (i * page, (layers * page, n * c, c, head_bytes))
        elif order == "KV-LBNHD":  # per layer [2, B, N, H, D]: one part is a plane
            half = h * head_bytes
            geo = (i * b * page, (n * half, head_bytes, half, b * n * half))
        else:
            raise ValueError(order)
        out.append(LayerGeo(f"{prefix}.{i}", group, region, offset + geo[0],
                            (b, h, n, 2, head_bytes), geo[1]))
    return tuple(out), layers * b * page


def layer_view(buf, layer: LayerGeo):
    """``(B, H, N, P, c)`` uint8 view of ``buf`` (a region's bytes) for ``layer``."""
    import torch  # deferred: the worker imports this module before torch is needed

    return torch.as_strided(buf, layer.shape, (*layer.strides, 1), layer.offset)


def fill(spec: CacheSpec, seed: int | None) -> dict:
    """The regions of ``spec`` as uint8 tensors of seeded random bytes (``seed``
    None: one byte, 0x5A, everywhere; ``-1``: zeros), the pages touched."""
    import torch  # deferred, as above

    if seed is None or seed < 0:
        value = 0x5A if seed is None else 0
        return {name: torch.full((size,), value, dtype=torch.uint8) for name, size in spec.regions}
    gen = torch.Generator().manual_seed(seed)
    return {name: torch.randint(0, 256, (size,), dtype=torch.uint8, generator=gen)
            for name, size in spec.regions}


def plan_between(src: CacheSpec, src_ranks: int, dst: CacheSpec,
                 dst_ranks: int) -> TransferPlan:
    """Move every layer of ``dst`` from the ``src`` layer of the same name; heads are
    split evenly over each side's ranks (global head ``g`` is head ``g % H`` of rank
    ``g // H``), so TP 2 -> 1 gathers and 1 -> 2 scatters."""
    units: dict[tuple[int, int, str], list[tuple]] = {}
    by_name = {layer.name: layer for layer in src.layers}
    for d in dst.layers:
        s = by_name[d.name]
        hs, hd = s.shape[1], d.shape[1]
        for g in range(hs * src_ranks):
            for t in range(d.shape[2]):
                for p in range(d.shape[3]):
                    so = s.offset + (g % hs) * s.strides[1] + t * s.strides[2] + p * s.strides[3]
                    do = d.offset + (g % hd) * d.strides[1] + t * d.strides[2] + p * d.strides[3]
                    units.setdefault((g // hs, g // hd, d.group), []).append(
                        (src.region_id(s.region), so, s.strides[0],
                         dst.region_id(d.region), do, d.strides[0], d.shape[4]))
    routes = tuple(Route(sr, dr, group, _merged(runs))
                   for (sr, dr, group), runs in sorted(units.items()))
    return TransferPlan(_side(src, src_ranks), _side(dst, dst_ranks), routes)


def _merged(units: list[tuple]) -> tuple[Run, ...]:
    out: list[Run] = []
    for u in sorted(units):
        run = Run(*u)
        last = out[-1] if out else None
        if last and (last.src_region, last.src_stride, last.dst_region, last.dst_stride) == \
                (run.src_region, run.src_stride, run.dst_region, run.dst_stride) and \
                last.src_offset + last.length == run.src_offset and \
                last.dst_offset + last.length == run.dst_offset:
            out[-1] = last._replace(length=last.length + run.length)
        else:
            out.append(run)
    return tuple(out)


def _side(spec: CacheSpec, ranks: int) -> Side:
    regions = tuple(Region(rank, i, name, size) for rank in range(ranks)
                    for i, (name, size) in enumerate(spec.regions))
    return Side(spec.digest, regions, dict(spec.num_blocks))


def check_moved(src: CacheSpec, src_bufs: list[dict], dst: CacheSpec, before: dict,
                after: dict, pairs: dict[str, list[tuple[int, int]]]) -> int:
    """Every moved block of every destination layer holds its source layer's bytes
    (heads gathered from each source rank), and no other destination byte changed.
    ``src_bufs`` are the source ranks' regions, ``before``/``after`` the destination
    rank's (rank 0 of its side); the number of bytes checked."""
    import torch  # deferred, as above

    touched = {name: torch.zeros(size, dtype=torch.bool) for name, size in dst.regions}
    by_name = {layer.name: layer for layer in src.layers}
    checked = 0
    for d in dst.layers:
        s, view = by_name[d.name], layer_view(after[d.region], d)
        mask = layer_view(touched[d.region], d)
        hs = s.shape[1]
        for sb, db in pairs.get(d.group, ()):
            for r, bufs in enumerate(src_bufs):
                part = layer_view(bufs[s.region], s)[sb]           # (Hs, N, P, c)
                got = view[db, r * hs:(r + 1) * hs]
                assert torch.equal(got, part), f"{d.name} block {sb}->{db}, src rank {r}"
                checked += part.numel()
            mask[db] = True
    for name, _ in dst.regions:
        keep = ~touched[name]
        assert torch.equal(after[name][keep], before[name][keep]), \
            f"bytes outside the moved blocks of {name!r} changed"
    return checked
