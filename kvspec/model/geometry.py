"""View geometry, torch-free: the byte strides of a layer's page in its pool.

Shared by the planner's place pass (tensors as affine forms of the block count)
and the runtime's views (one ``as_strided`` per layer). A layer's page for
block ``b`` has the logical shape ``(B, H, N, C)``; the axis order decides the
strides, innermost physical axis first::

    LBNHC (layer-compact, the default)      BLHNC (block-outermost, packed)
      C: 1                                    C: 1
      H: c                                    N: c
      N: H * c                                H: N * c
      B: block_stride  (= N * H * c)          L: layer_stride (= page, in the block)
      L: layer_stride  (= num_blocks * page)  B: block_stride (= bytes_per_block)

>>> from kvspec.model.specs import FullAttention
>>> f = FullAttention(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16")
>>> [str(s) for s in spec_strides(f, Affine(1), 2, AxisOrder.LBNHC)]
['65536*N', '65536', '512', '4096', '1']
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import prod
from typing import overload

from kvspec.errors import PLANNER_BUG, PlanError
from kvspec.model.affine import Affine
from kvspec.model.axes import DIM_B, DIM_L, AxisOrder
from kvspec.model.dtypes import dtype_size
from kvspec.model.specs.base import LayerSpec


@overload
def page_shape(spec: LayerSpec, num_blocks: int,
               kernel_block_size: int | None = None) -> tuple[int, int, int, int]: ...
@overload
def page_shape(spec: LayerSpec, num_blocks: Affine,
               kernel_block_size: int | None = None) -> tuple[Affine, int, int, int]: ...
def page_shape(spec: LayerSpec, num_blocks: int | Affine,
               kernel_block_size: int | None = None) -> tuple[int | Affine, int, int, int]:
    """``(B, H, N, C)`` of one layer, C in bytes; kernel blocks split B."""
    block = kernel_block_size if kernel_block_size is not None else spec.block_size
    if block <= 0 or spec.block_size % block:
        raise PlanError(f"kernel block size {block} must divide the KV cache block size "
                        f"{spec.block_size}", found=str(block),
                        expected=f"a divisor of {spec.block_size}",
                        hint="give kernel_block_size per group ({group id: size}) where "
                        "groups differ in block size")
    per_page = spec.block_size // block
    return (num_blocks * per_page, spec.num_heads, spec.kernel_states(block),
            spec.state_content_size_bytes)


def page_runs(cell_bytes: int, axes: Sequence[tuple[int, int]]) -> tuple[list[int], int]:
    """A page's contiguous byte runs within one block, ``(run offsets, run length)``:
    its cells ``cell_bytes`` long, its N and H axes at ``(stride, count)``.

    C is innermost and contiguous in every axis order; N and H merge into the run
    when their stride continues it, otherwise each of their positions starts a
    run of its own (e.g. LHBNC interleaves heads and blocks).

    >>> page_runs(256, [(256, 16), (65536, 2)])      # heads outside blocks: a run each
    ([0, 65536], 4096)
    """
    run, offsets = cell_bytes, [0]
    for stride, count in sorted(axes):
        if count == 1:
            continue
        if stride == run and offsets == [0]:
            run *= count
        else:
            offsets = [o + i * stride for o in offsets for i in range(count)]
    return offsets, run


def _check_padded_grid(order: tuple[int, ...], shape: tuple[int | Affine, ...], grid_end: int,
                       axis_order: AxisOrder) -> None:
    extra = [shape[d] for d in order[:grid_end] if d not in (DIM_L, DIM_B)]
    if any(e != 1 for e in extra):
        raise PlanError(
            f"layout {axis_order.name} puts head slots outside a padded page",
            hint="padded pages need L and B as the outermost axes (e.g. LBNHC, BLHNC)")


def spec_strides(spec: LayerSpec, num_blocks: int | Affine, num_layers: int,
                 axis_order: AxisOrder, kernel_block_size: int | None = None,
                 fixed: tuple[int | Affine | None, ...] = (None,) * 5) -> list[Affine]:
    """Byte strides of ``[L, B, H, N, C]`` of ``num_layers`` layers of ``spec`` in
    ``axis_order``; ``fixed`` pins strides the caller already knows (e.g. the
    packed block stride). A padded page widens the stride of the innermost of L
    and B to the padded page size, so padding sits at each page's end."""
    shape = (num_layers, *page_shape(spec, num_blocks, kernel_block_size))
    order = axis_order.stride_order
    padded = getattr(spec, "page_size_padded", None)
    if padded is not None:
        if kernel_block_size is not None and kernel_block_size != spec.block_size:
            raise PlanError("padded KV pages cannot be split into kernel blocks",
                            hint="leave this group out of kernel_block_size "
                            "({group id: size} for the others)")
        grid_end = max(order.index(DIM_L), order.index(DIM_B)) + 1
        _check_padded_grid(order, shape, grid_end, axis_order)
    strides = axis_strides(axis_order, shape, padded, fixed)
    if strides is None:
        raise PlanError("a padded page does not tile its stride", hint=PLANNER_BUG)
    return strides


def axis_strides(axis_order: AxisOrder, shape: Sequence[int | Affine], padded: int | None,
                 fixed: Sequence[int | Affine | None] = (None,) * 5) -> list[Affine] | None:
    """The byte strides of ``[L, B, H, N, C]`` (``shape``, C in bytes) that
    ``axis_order`` gives, innermost physical axis first, each axis's stride the
    extent of the axes inside it; ``fixed`` pins strides already known. A
    padded page widens the innermost of L and B to ``padded`` bytes. None when
    the padded page does not tile that stride.

    The planner places tensors with it and the artifact reader checks every
    stored stride against it (:mod:`kvspec.artifact.structure`).

    >>> [str(s) for s in axis_strides(AxisOrder.LBNHC, (2, Affine(1), 8, 16, 256), None)]
    ['32768*N', '32768', '256', '2048', '1']
    """
    order = axis_order.stride_order
    grid_end = max(order.index(DIM_L), order.index(DIM_B)) + 1
    strides: list[Affine] = [Affine()] * 5
    current = Affine(0, 1)
    for phys, dim in reversed(list(enumerate(order))):
        if padded is not None and phys == grid_end - 1:
            try:
                current = Affine.max(current, padded)
            except ValueError:
                return None
            if current.a == 0 and current.b % padded:
                return None
        pinned = fixed[dim]
        strides[dim] = Affine.of(pinned) if pinned is not None else current
        current = strides[dim] * Affine.of(shape[dim])
    return strides


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

    def runs(self) -> tuple[list[int], int]:
        """The page's contiguous byte runs within one block (:func:`page_runs`)."""
        _, h, n, c = self.shape
        _, sh, sn, _ = self.byte_stride
        return page_runs(c * dtype_size(self.dtype), ((sn, n), (sh, h)))

    def page_extent(self) -> int:
        """Bytes from a page's first byte to one past its last, within one block."""
        offsets, run = self.runs()
        return max(offsets) + run

    def end(self) -> int:
        """One past the view's last byte in its pool."""
        return self.byte_offset + (self.shape[0] - 1) * self.byte_stride[0] + self.page_extent()


def view_geometry(layers: Sequence[str], layer_stride: int, block_stride: int, offset: int,
                  spec: LayerSpec, num_blocks: int, axis_order: AxisOrder,
                  kernel_block_size: int | None = None) -> list[ViewGeometry]:
    """The views ``create_kv_cache_views`` makes for one tensor at ``num_blocks``.

    With kernel blocks, a manager block of ``block_size`` tokens is viewed as
    ``ratio`` kernel blocks a constant stride apart, which needs each block to
    be one dense page.
    """
    first, step = tensor_geometry(layers, layer_stride, block_stride, offset, spec,
                                  num_blocks, axis_order, kernel_block_size)
    if first is None:
        return []
    size = dtype_size(first.dtype)
    return [ViewGeometry(layer=name, dtype=first.dtype, shape=first.shape, stride=first.stride,
                         storage_offset=(first.byte_offset + i * step) // size,
                         byte_stride=first.byte_stride, byte_offset=first.byte_offset + i * step)
            for i, name in enumerate(layers)]


def tensor_geometry(layers: Sequence[str], layer_stride: int, block_stride: int, offset: int,
                    spec: LayerSpec, num_blocks: int, axis_order: AxisOrder,
                    kernel_block_size: int | None = None) -> tuple[ViewGeometry | None, int]:
    """The first layer's view of a tensor and the bytes between consecutive
    layers' views (every layer of a tensor shares dtype, shape and strides):
    :func:`view_geometry` without building one record per layer."""
    shape = page_shape(spec, num_blocks, kernel_block_size)
    ratio = shape[0] // num_blocks if num_blocks else 1
    if ratio > 1:
        dense = prod(page_shape(spec, 1)[1:])
        if block_stride != dense:
            raise PlanError(
                f"layout {axis_order.name} does not store blocks as dense, unpadded pages "
                f"(block stride {block_stride} != page {dense}), so a block cannot be "
                f"split into {ratio} kernel blocks of {kernel_block_size} tokens",
                hint=f"use block_size {kernel_block_size}, or a layer-compact layout "
                     "(LBNHC) with unpadded pages")
        block_stride //= ratio
    strides = spec_strides(spec, num_blocks, len(layers), axis_order, kernel_block_size,
                             fixed=(layer_stride, block_stride, None, None, None))
    byte_strides = [s.at(num_blocks) for s in strides]
    dtype = getattr(spec, "dtype", None) or "int8"
    size = dtype_size(dtype)
    c_bytes = shape[3]
    if c_bytes % size or any(s % size for s in byte_strides[1:4]):
        raise PlanError(f"a {dtype} view does not tile the page's {c_bytes}-byte cells",
                        hint=PLANNER_BUG)
    bs = (byte_strides[1], byte_strides[2], byte_strides[3], byte_strides[4])
    elem = (bs[0] // size, bs[1] // size, bs[2] // size, 1 if bs[3] == 1 else bs[3])
    view_shape = (shape[0], shape[1], shape[2], c_bytes // size)
    step = byte_strides[0]
    if not layers:
        return None, step
    for i, name in enumerate(layers[:2]):  # offset + i * step: aligned iff these two are
        off = offset + i * step
        if off % size:
            raise PlanError(f"layer {name} starts at byte {off}, not aligned to {dtype}",
                            hint=PLANNER_BUG)
    return ViewGeometry(layer=layers[0], dtype=dtype, shape=view_shape, stride=elem,
                        storage_offset=offset // size, byte_stride=bs, byte_offset=offset), step
