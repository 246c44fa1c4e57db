"""The place pass: groups + layout order -> tensors in one pool.

A tensor places same-shaped layers: layer ``layers[l]``'s page for block ``b``
starts ``offset + l * layer_stride + b * block_stride`` bytes into the pool.
Groups alias from byte 0, slot by slot: a block id belongs to one group at a
time, so slot *i* of every group can share the same bytes.

Layer-outermost (``LBNHC``; uniform pages or a single group)::

    group 0: | A [blk 0 | blk 1 | ...] | B [blk 0 | blk 1 | ...] |
    group 1: | C [blk 0 | blk 1 | ...] | D [blk 0 | blk 1 | ...] |

Block-outermost (``BLHNC``; pages of different sizes packed per block)::

    group 0: | blk 0 [ A | B | pad ] | blk 1 [ A | B | pad ] | ...
    group 1: | blk 0 [  C  |   D   ] | blk 1 [  C  |   D   ] | ...
             |<-- bytes_per_block -->|

Every quantity that depends on the block count is an :class:`~kvspec.affine.Affine`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from math import prod

from kvspec.affine import Affine
from kvspec.engine import Engine
from kvspec.errors import PlanError
from kvspec.layouts import DIM_B, DIM_L, Layout
from kvspec.spec import LayerSpec, UniformType, round_up


@dataclass(frozen=True, slots=True)
class Tensor:
    """Placement of same-shaped layers in a pool, affine in the block count."""

    size: Affine
    layers: tuple[str, ...]
    layer_stride: Affine
    block_stride: Affine
    offset: Affine
    host_resident: bool = False
    #: "device" (the main pool) or "draft" (a drafter's own pool, same allocation).
    pool: str = "device"
    role: str = ""

    def at(self, num_blocks: int) -> dict[str, object]:
        """The reference's ``KVCacheTensor`` fields for ``num_blocks``."""
        return {"size": self.size.at(num_blocks), "layers": list(self.layers),
                "layer_stride": self.layer_stride.at(num_blocks),
                "block_stride": self.block_stride.at(num_blocks),
                "offset": self.offset.at(num_blocks), "host_resident": self.host_resident}


def page_shape(spec: LayerSpec, num_blocks: int | Affine,
               kernel_block_size: int | None = None) -> tuple:
    """``(B, H, N, C)`` of one layer, C in bytes; kernel blocks split B."""
    block = kernel_block_size if kernel_block_size is not None else spec.block_size
    if spec.block_size % block:
        raise PlanError(f"kernel block size {block} must divide the KV cache block size "
                        f"{spec.block_size}")
    per_page = spec.block_size // block
    return (num_blocks * per_page, spec.num_heads, spec.kernel_states(block),
            spec.state_content_size_bytes)


def layout_strides(spec: LayerSpec, num_blocks: int | Affine, num_layers: int,
                   layout: Layout, kernel_block_size: int | None = None,
                   fixed: tuple[int | Affine | None, ...] = (None,) * 5) -> list[Affine]:
    """Byte strides of ``[L, B, H, N, C]`` for ``layout``, innermost axis first
    in the walk; ``fixed`` pins strides the caller already knows (e.g. the
    packed block stride). A padded page widens the stride of the innermost of
    L and B to the padded page size, so padding sits at each page's end."""
    shape = (num_layers, *page_shape(spec, num_blocks, kernel_block_size))
    order = layout.stride_order
    padded = getattr(spec, "page_size_padded", None)
    grid_end = max(order.index(DIM_L), order.index(DIM_B)) + 1
    if padded is not None:
        if kernel_block_size is not None and kernel_block_size != spec.block_size:
            raise PlanError("padded KV pages cannot be split into kernel blocks")
        grid = [shape[d] for d in order[:grid_end]]
        extra = [g for d, g in zip(order[:grid_end], grid) if d not in (DIM_L, DIM_B)]
        if any(e != 1 for e in extra):
            raise PlanError(
                f"layout {layout.name} puts head slots outside a padded page",
                hint="padded pages need L and B as the outermost axes (e.g. LBNHC, BLHNC)")
    strides: list[Affine] = [Affine()] * 5
    current = Affine(0, 1)
    for phys, dim in reversed(list(enumerate(order))):
        if padded is not None and phys == grid_end - 1:
            current = Affine.max(current, padded)
            if current.a == 0 and current.b % padded:
                raise PlanError("a padded page does not tile its stride")
        pinned = fixed[dim]
        strides[dim] = Affine.of(pinned) if pinned is not None else current
        current = strides[dim] * Affine.of(shape[dim])
    return strides


def bytes_per_block(groups: list) -> int:
    """Bytes one block costs in the pool: the widest group, aligned."""
    widest = max(g.page_bytes() for g in groups)
    if widest <= 0:
        raise PlanError("a KV cache group holds no bytes per block")
    aligns = [g.layer_spec(n).block_stride_alignment or 1 for g in groups
              for n in g.layer_names]
    return round_up(widest, math.lcm(*aligns) if aligns else 1)


def validate_layout(layout: Layout, groups: list) -> None:
    """Reject a layout that cannot express mixed page sizes."""
    pages = {g.layer_spec(n).page_size_bytes for g in groups for n in g.layer_names}
    if len(pages) <= 1:
        return
    if not layout.is_block_compact or (len(groups) > 1 and layout.is_layer_compact):
        raise PlanError(
            f"layout {layout.name} cannot express this model's mixed page sizes "
            f"({sorted(pages)})",
            path="engine.layout", found=layout.name, expected="a block-outermost layout",
            hint="set engine.layout to BLHNC (pages packed side by side in each block)")


def place(engine: Engine, groups: list) -> list[Tensor]:
    """Tensors for ``groups`` in ``engine.layout``, affine in the block count."""
    layout = engine.layout
    validate_layout(layout, groups)
    per_block = bytes_per_block(groups)
    n = Affine(1, 0)
    packed_stride = Affine.of(per_block) if layout.is_block_outermost else None
    size = n * per_block
    tensors: list[Tensor] = []
    for g in groups:
        by_spec: dict[LayerSpec, list[str]] = {}
        if isinstance(g.spec, UniformType):
            # A stage that owns none of a group's layers keeps the global spec
            # (as the reference projects it); place only this stage's layers.
            owned = set(g.layer_names)
            for name, spec in g.spec.members:
                if name in owned:
                    by_spec.setdefault(spec, []).append(name)
        elif g.layer_names:
            by_spec[g.spec] = list(g.layer_names)
        byte_offset = 0
        for spec, names in by_spec.items():
            strides = layout_strides(spec, n, len(names), layout,
                                     fixed=(None, packed_stride, None, None, None))
            page = spec.page_size_bytes
            offset = (Affine.max(strides[DIM_L], page) * byte_offset).exact_div(page)
            tensors.append(Tensor(size=size, layers=tuple(names), layer_stride=strides[DIM_L],
                                  block_stride=strides[DIM_B], offset=offset))
            byte_offset += len(names) * page
    return tensors


@dataclass(frozen=True, slots=True)
class ViewGeometry:
    """One layer's ``[B, H, N, C]`` view: shape/strides in elements of ``dtype``."""

    layer: str
    dtype: str
    shape: tuple[int, int, int, int]
    stride: tuple[int, int, int, int]
    storage_offset: int
    #: Same view in bytes (int8), before reinterpreting as ``dtype``.
    byte_stride: tuple[int, int, int, int]
    byte_offset: int


def view_geometry(tensor_fields: dict, spec: LayerSpec, num_blocks: int, layout: Layout,
                  kernel_block_size: int | None = None) -> list[ViewGeometry]:
    """The views ``create_kv_cache_views`` makes for one tensor at ``num_blocks``.

    ``tensor_fields`` holds concrete ``layer_stride``, ``block_stride``,
    ``offset`` and ``layers``. With kernel blocks, a manager block of
    ``block_size`` tokens is viewed as ``ratio`` kernel blocks a constant stride
    apart, which needs each block to be one dense page.
    """
    from kvspec.dtypes import dtype_size

    layers = list(tensor_fields["layers"])
    layer_stride = int(tensor_fields["layer_stride"])
    block_stride = int(tensor_fields["block_stride"])
    shape = page_shape(spec, num_blocks, kernel_block_size)
    ratio = shape[0] // num_blocks
    if ratio > 1:
        dense = prod(page_shape(spec, 1)[1:])
        if block_stride != dense:
            raise PlanError(
                f"layout {layout.name} does not store blocks as dense, unpadded pages "
                f"(block stride {block_stride} != page {dense}), so a block cannot be "
                f"split into {ratio} kernel blocks of {kernel_block_size} tokens",
                hint=f"use block_size {kernel_block_size}, or a layer-compact layout "
                     "(LBNHC) with unpadded pages")
        block_stride //= ratio
    strides = layout_strides(spec, num_blocks, len(layers), layout, kernel_block_size,
                             fixed=(layer_stride, block_stride, None, None, None))
    byte_strides = [s.at(num_blocks) for s in strides]
    dtype = getattr(spec, "dtype", None) or "int8"
    size = dtype_size(dtype)
    c_bytes = shape[3]
    if c_bytes % size or any(s % size for s in byte_strides[1:4]):
        raise PlanError(f"a {dtype} view does not tile the page's {c_bytes}-byte cells")
    out = []
    base = int(tensor_fields["offset"])
    for i, name in enumerate(layers):
        off = base + i * byte_strides[0]
        if off % size:
            raise PlanError(f"layer {name} starts at byte {off}, not aligned to {dtype}")
        bs = (byte_strides[1], byte_strides[2], byte_strides[3], byte_strides[4])
        out.append(ViewGeometry(
            layer=name, dtype=dtype,
            shape=(shape[0], shape[1], shape[2], c_bytes // size),
            stride=(bs[0] // size, bs[1] // size, bs[2] // size, 1 if bs[3] == 1 else bs[3]),
            storage_offset=off // size, byte_stride=bs, byte_offset=off))
    return out
