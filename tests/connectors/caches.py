"""Compiled caches for the transfer tests and benchmarks: small layouts from
tests/data/connectors/, compiled with kvspec, loaded on CPU with ``kvspec.load`` and
filled with seeded bytes; an in-process executor of transfer plans; and the check that
a transfer moved exactly what it should.

The check reads the caches' own views (``LoadedCache.kv``: K and V of every layer, or
the whole cell of a state layer) and the artifacts' groups, never the plan: for every
moved unit of every destination layer, its K and V of those tokens equal the source's
(each destination head from the source rank that holds it), and no byte outside the
moved units of the destination changed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvspec.artifact import Artifact
from kvspec.compiler import compile_source
from kvspec.connectors.plan import TransferPlan

DATA = Path(__file__).resolve().parents[1] / "data" / "connectors"

#: What :func:`compiled` changes in a source's text, by keyword.
_EDITS = {"tensor": ("tensor: 1,", "tensor: {},"),
          "layout": ("layout: LBNHC", "layout: {}"),
          "block": ("block_size: 16", "block_size: {}"),
          "heads": ("num_kv_heads: 4", "num_kv_heads: {}"),
          "head_size": ("head_size: 8", "head_size: {}"),
          "mla": ("full: {kind: full_attention}", "full: {{kind: mla}}"),
          "dtype": ("dtype: bfloat16", "dtype: {}"),
          "window": ("sliding_window: 32", "sliding_window: {}"),
          "layers": ("repeat: 4", "repeat: {}"),
          "pipeline": ("pipeline: 1}", "pipeline: {}}}"),
          "model": ("model: synthetic/", "model: {}/"),
          "quantization": ("layer_types:", "quantization: {{kv_cache_dtype: {}}}\nlayer_types:")}


def source(name: str, **changes: Any) -> str:
    """The text of ``tests/data/connectors/NAME.yaml`` with ``changes`` made."""
    text = (DATA / f"{name}.yaml").read_text()
    for key, value in changes.items():
        old, new = _EDITS[key]
        assert old in text, (name, key)
        text = text.replace(old, new.format(value))
    return text


def compiled(name: str, **changes: Any) -> Artifact:
    """``name``'s layout with ``changes``, compiled (read back from its text, so it
    carries the text errors are placed in)."""
    art = compile_source(source(name, **changes), f"{name}.yaml")
    return Artifact.from_text(art.text(), origin=f"{name}.kvlayout.json")


def load(art: Artifact | str, num_blocks: int, rank: int = 0, seed: int | None = None):
    """Rank ``rank``'s cache of ``art`` (an artifact or its text) on the CPU, every
    byte of its allocations seeded random (``seed``), zero (``-1``) or 0x5A (None)."""
    import torch  # deferred: the peer processes import this module before torch

    import kvspec

    if isinstance(art, str):
        art = Artifact.from_text(art)
    tp = art.body.engine.tensor_parallel_size
    cache = kvspec.load(art, device="cpu", num_blocks=num_blocks, stage=rank // tp)
    for i, buf in enumerate(regions(cache).values()):
        if seed is None or seed < 0:
            buf.fill_(0x5A if seed is None else 0)
        else:
            gen = torch.Generator().manual_seed(seed * 1000 + i)
            buf.copy_(torch.randint(-128, 128, buf.shape, dtype=torch.int8, generator=gen))
    return cache


def regions(cache) -> dict:
    """The cache's allocations (what a connector registers), by name."""
    return {a.name: cache.buffers[a.name]
            for a in cache.artifact.body.stages[cache.stage].allocations}


def apply(plan: TransferPlan, blocks: Any, sources: list, destinations: list) -> None:
    """Execute ``plan`` for ``blocks`` in this process: byte copies between the source
    ranks' and destination ranks' regions (by rank), as a connector would."""
    for (sr, dr), spans in plan.spans(blocks).items():
        src = _by_id(plan.source, sr, sources[sr])
        dst = _by_id(plan.destination, dr, destinations[dr])
        for span in spans:
            dst[span.dst_region][span.dst_offset:span.dst_offset + span.length].copy_(
                src[span.src_region][span.src_offset:span.src_offset + span.length])


def _by_id(side, rank: int, cache) -> dict[int, Any]:
    bufs = regions(cache)
    return {r.id: bufs[r.name] for r in side.regions_of(rank)}


def unit_tokens(src: Artifact, dst: Artifact, dst_group: int) -> tuple[int, int]:
    """The source group of ``dst_group`` and the tokens one unit moves (the smaller
    block size), from the artifacts' groups."""
    name = dst.body.groups[dst_group].layers[0]
    sg = src.body.layers[name].group
    return sg, min(src.body.groups[sg].block_size, dst.body.groups[dst_group].block_size)


def check_moved(src_caches: list, dst_caches: list, before: list[dict], units: dict,
                heads: int | None = None) -> int:
    """Every moved unit of every destination layer holds its source layer's bytes, and
    no other destination byte changed. ``units``: ``{dst group id: [(src_block,
    src_unit, dst_block, dst_unit), ...]}``; ``before``: each destination rank's
    regions before the transfer; ``heads``: the model's KV heads (None: one head per rank
    on as many ranks on both sides). The number of bytes compared."""
    import torch  # deferred, as above

    src_art, dst_art = src_caches[0].artifact, dst_caches[0].artifact
    checked = 0
    for rank, cache in enumerate(dst_caches):
        touched = {k: torch.zeros(v.numel(), dtype=torch.bool) for k, v in regions(cache).items()}
        desc = cache.descriptor(rank)
        for x in desc.layers:
            moved = units.get(x.group, ())
            if not moved:
                continue
            _, tokens = unit_tokens(src_art, dst_art, x.group)
            block = dst_art.body.groups[x.group].block_size
            n = 1 if x.kind == "mamba" else tokens * x.states // block  # states a unit holds
            mine = _parts(cache, x.name)
            for h in range(x.heads):
                src_rank, sh = _source_head(src_caches, desc, x, h, heads)
                theirs = _parts(src_caches[src_rank], x.name)
                for s, i, d, j in moved:
                    for a, b in zip(mine, theirs, strict=True):
                        got, want = a[d, h, j * n:(j + 1) * n], b[s, sh, i * n:(i + 1) * n]
                        assert torch.equal(got, want), (x.name, (s, i, d, j), h)
                        checked += got.numel() * got.element_size()
            for _, _, d, j in moved:  # (H, n, C) bytes of the unit, by the descriptor
                off = x.offset + d * x.block_stride + j * n * x.state_stride
                torch.as_strided(touched[desc.regions[x.region].name], (x.heads, n, x.cell_bytes),
                                 (x.head_stride, x.state_stride, 1), off).fill_(True)
        for name, buf in regions(cache).items():
            keep = ~touched[name]
            assert torch.equal(buf[keep], before[rank][name][keep]), \
                f"rank {rank}: bytes outside the moved units of {name!r} changed"
    return checked


def _parts(cache, name: str) -> list:
    """K and V of a layer (``(B, H, N, D)`` each), else its whole cells, as bytes (random
    bytes hold NaNs, which no float comparison finds equal)."""
    import torch  # deferred, as above

    try:
        parts = list(cache.kv[name])
    except KeyError:
        parts = [cache.views[name]]
    return [p.view(torch.uint8) for p in parts]


def _source_head(src_caches: list, desc, x, h: int, total: int | None) -> tuple[int, int]:
    """The source rank and local head holding destination head ``h`` of layer ``x``
    (``total``: the model's KV heads). Heads split over ranks are found by number; a
    head several source ranks replicate is read from the one a plan reads it from
    (``t % replicas``: the test's source ranks hold different bytes)."""
    art = src_caches[0].artifact
    ts, td = art.body.engine.tensor_parallel_size, desc.parallel.tensor_parallel_size
    t = desc.parallel.tensor_rank
    first = art.body.layers[x.name].stage * ts
    if x.kind == "mamba" or x.replicated or total is None:  # state, latent, or 1 head a rank
        return first + t % ts, h
    g = t * x.heads + h if x.heads * td == total else t // (td // total)
    hs = src_caches[first].descriptor(first).layer(x.name).heads
    if hs * ts == total:
        return first + g // hs, g % hs
    rep = ts // total
    return first + g * rep + t % rep, 0
