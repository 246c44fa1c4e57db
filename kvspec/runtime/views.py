"""Per-layer views of a pool: ``[B, H, N, C]`` in the layer's dtype, and the
K/V, NHD and HND conventions that follow from it without a copy.

Axes (docs/concepts.md's words): B block, H head slot, N state (one token for
token-indexed kinds), C the cell's elements. A tensor of the artifact places
same-shaped layers; layer ``l`` of tensor ``t`` starts at byte
``t.offset + l * t.layer_stride`` of its pool and block ``b`` of it another
``b * t.block_stride`` bytes in. The remaining byte strides follow from the
axis order, as :mod:`kvspec.model.geometry` sets them out (innermost physical axis
first).

A view is one ``torch.as_strided`` of the pool's int8 allocation with those
byte strides, then ``.view(dtype)``: the strides of B, H and N and the storage
offset divide by the dtype's size (C's stays 1). Kernel-block splitting views a block of
``block_size`` tokens as ``ratio = block_size // kernel_block_size`` kernel
blocks: ``B' = B * ratio``, ``N' = N / ratio`` and ``block_stride' =
block_stride / ratio`` (only where a block is one dense page).

This module imports torch; the geometry is the artifact's own (each tensor's
``view`` record), checked when the artifact was read
(:mod:`kvspec.artifact.structure`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from fractions import Fraction

import torch

from kvspec.artifact.format import CellPart, Tensor, at
from kvspec.errors import ArtifactError, KvspecError
from kvspec.model.affine import Affine
from kvspec.model.axes import DIM_H, DIM_N, AxisOrder
from kvspec.model.dtypes import canonical_dtype, dtype_size
from kvspec.model.geometry import axis_strides
from kvspec.runtime.budget import LoadError
from kvspec.runtime.meta import LayerMeta, TensorMeta

__all__ = [
    "KVViews",
    "LayerMeta",
    "TensorMeta",
    "LayoutViews",
    "build_tensor_views",
    "conventions",
    "split_kv",
    "torch_dtype",
]


def torch_dtype(name: str) -> torch.dtype:
    """The ``torch.dtype`` of a kvspec dtype name.

    >>> torch_dtype("bfloat16"), torch_dtype("fp8_e4m3")
    (torch.bfloat16, torch.float8_e4m3fn)
    """
    dtype = getattr(torch, canonical_dtype(name), None)
    if not isinstance(dtype, torch.dtype):
        raise ArtifactError(f"this torch ({torch.__version__}) has no dtype {name!r}",
                            hint="upgrade torch, or compile without that dtype")
    return dtype


def _kernel_split(t: Tensor, order: AxisOrder, num_blocks: int, kernel: int
                  ) -> tuple[int, int, int, int]:
    """``(ratio, states, head stride, state stride)`` of ``t``'s view when each
    block of ``block_size`` tokens is seen as ``ratio`` kernel blocks of
    ``kernel`` tokens, a constant stride apart: each block must be one dense,
    unpadded page, and each kernel block is then a dense page of its own."""
    v = t.view
    if kernel <= 0 or t.block_size % kernel:
        raise LoadError(f"kernel block size {kernel} must divide the KV cache block size "
                            f"{t.block_size}", found=str(kernel),
                            expected=f"a divisor of {t.block_size}",
                            hint="give kernel_block_size per group ({group id: size}) where "
                            "groups differ in block size")
    ratio = t.block_size // kernel
    dense = v.heads * v.states * v.cell_bytes
    block_stride = at(t.block_stride, num_blocks)
    if v.page_padded is not None and v.page_padded != dense:
        raise LoadError("padded KV pages cannot be split into kernel blocks",
                            hint="leave this group out of kernel_block_size "
                            "({group id: size} for the others)")
    if block_stride != dense:
        raise LoadError(
            f"layout {order.name} does not store blocks as dense, unpadded pages "
            f"(block stride {block_stride} != page {dense}), so a block cannot be "
            f"split into {ratio} kernel blocks of {kernel} tokens",
            hint=f"use block_size {kernel}, or a layer-compact layout (LBNHC) with "
                 "unpadded pages")
    states = int(Fraction(kernel) / Fraction(v.tokens_per_state or "1"))
    strides = axis_strides(order, (len(t.layers), Affine(1, 0), v.heads, states, v.cell_bytes),
                           None, (Affine(0, at(t.layer_stride, num_blocks)),
                                  Affine(0, block_stride // ratio), None, None, None))
    assert strides is not None  # unpadded pages always tile
    return ratio, states, strides[DIM_H].at(num_blocks), strides[DIM_N].at(num_blocks)


def build_tensor_views(buffer: torch.Tensor, tensor: Tensor, index: int, order: AxisOrder,
                       num_blocks: int, pool_blocks: int, kernel_block_size: int | None,
                       pool: str,
                       ) -> list[tuple[torch.Tensor, LayerMeta]]:
    """The views of one artifact tensor's layers over ``buffer`` (its int8
    allocation, the tensor's offsets counted from its start).

    ``num_blocks`` evaluates the tensor's affine fields (the stage's block count);
    ``pool_blocks`` is B of the views (a pool of a fixed count, e.g. a drafter's,
    has its own). The geometry is the artifact's, checked when it was read
    (:mod:`kvspec.artifact.structure`); one ``as_strided`` per layer::

        view = as_strided(buffer.view(dtype), (B, H, N, C), byte_stride / itemsize,
                          storage_offset + byte_offset / itemsize)
        # (B, H, N, C) in dtype
    """
    v = tensor.view
    dtype_name = canonical_dtype(v.dtype)
    item = dtype_size(dtype_name)
    blocks, states = pool_blocks, v.states
    sh, sn = at(v.head_stride, num_blocks), at(v.state_stride, num_blocks)
    sb = at(tensor.block_stride, num_blocks)
    if kernel_block_size is not None and kernel_block_size != tensor.block_size:
        try:
            ratio, states, sh, sn = _kernel_split(tensor, order, num_blocks, kernel_block_size)
        except KvspecError as err:
            raise err.replace(message=f"tensor {index} ({tensor.layers[0]}, ...): "
                              f"{err.message}") from None
        blocks, sb = blocks * ratio, sb // ratio
    c = v.cell_bytes // item
    shape = (blocks, v.heads, states, c)
    byte_stride = (sb, sh, sn, 1)
    shared = TensorMeta(
        group=tensor.group, kind=tensor.kind, block_size=tensor.block_size,
        kernel_block_size=kernel_block_size if kernel_block_size is not None
        else tensor.block_size, sliding_window=tensor.sliding_window,
        attention_chunk_size=tensor.attention_chunk_size, pool=pool, num_blocks=pool_blocks,
        dtype=dtype_name, tensor=index, shape=shape,
        stride=(sb // item, sh // item, sn // item, 1), byte_stride=byte_stride,
        head_size=v.kv[0] if v.kv else None, head_size_v=v.kv[1] if v.kv else None,
        role=tensor.role)
    start, step = at(tensor.offset, num_blocks), at(tensor.layer_stride, num_blocks)
    offsets = [start + i * step for i in range(len(tensor.layers))]
    return _layer_views(buffer, torch_dtype(dtype_name), item, tensor.layers, offsets, shared)


def _layer_views(buffer: torch.Tensor, dtype: torch.dtype, item: int, layers: Sequence[str],
                 offsets: list[int], shared: TensorMeta) -> list[tuple[torch.Tensor, LayerMeta]]:
    """One view per layer at ``offsets`` (bytes into ``buffer``), ``shared``'s shape."""
    strided, out, base = torch.as_strided, [], buffer.storage_offset()
    if item > 1 and base % item == 0 and buffer.numel() % item == 0 \
            and all(s % item == 0 for s in shared.byte_stride[:3]) \
            and all(o % item == 0 for o in offsets[:2]):
        # The pool seen in dtype once, each layer one as_strided in elements: the
        # same view as as_strided(...).view(dtype), in one call instead of two
        # (every offset and stride is a whole number of elements: the reader checked).
        typed, first = buffer.view(dtype), base // item
        for slot, (name, off) in enumerate(zip(layers, offsets)):
            out.append((strided(typed, shared.shape, shared.stride, first + off // item),
                        LayerMeta(name, slot, off // item, off, shared)))
        return out
    byte_shape = (*shared.shape[:3], shared.shape[3] * item)
    for slot, (name, off) in enumerate(zip(layers, offsets)):
        view = strided(buffer, byte_shape, shared.byte_stride, base + off)
        if dtype is not torch.int8:
            view = view.view(dtype)  # (B, H, N, C) in dtype, strides / itemsize
        out.append((view, LayerMeta(name, slot, off // item, off, shared)))
    return out


# ---------------------------------------------------------------------------
# derived views: K/V, NHD/HND
# ---------------------------------------------------------------------------


def split_kv(view: torch.Tensor, meta: LayerMeta) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of a dense attention cell, split along C without a copy::

        view: (B, H, N, head_size + head_size_v)
        K = view[..., :head_size]      # (B, H, N, head_size),   strides of view
        V = view[..., head_size:]      # (B, H, N, head_size_v), storage_offset + head_size
    """
    if meta.head_size is None:
        raise NoView(f"layer {meta.name} ({meta.kind}) does not store K and V side by "
                     "side in its cells (MLA latents, state layers and packed cells do not)",
                     hint="read its whole view (cache.views[layer]), or its cell parts "
                          "(cache.parts[layer]) where it names them")
    return view[..., :meta.head_size], view[..., meta.head_size:]


class NoView(KvspecError, KeyError):
    """A layer has no view of the kind asked for (K and V, cell parts). A
    ``KeyError`` too, so ``cache.kv`` and ``cache.parts`` keep the mapping
    protocol (``.get``, ``in``)."""


#: Kernel conventions and the order of the ``[B, H, N, C]`` axes they take.
CONVENTIONS: dict[str, tuple[int, int, int, int]] = {
    "NHD": (0, 2, 1, 3),  # (B, N, H, C): flashinfer/flash-attn "NHD"
    "HND": (0, 1, 2, 3),  # (B, H, N, C): "HND"
}


def conventions(view: torch.Tensor) -> tuple[str, ...]:
    """The conventions whose page axes the layout stores in that physical order.

    A convention is yielded without a copy when, inside a block, its axes
    (e.g. N, H, C for NHD) have non-increasing strides and C is contiguous;
    axes of size 1 do not count (an MLA page with one head slot is both).

    | layout | physical page | yields |
    | --- | --- | --- |
    | LBNHC, BLNHC | ``[N, H, C]`` dense | NHD |
    | LBHNC, BLHNC | ``[H, N, C]`` dense | HND |
    | LHBNC, BHLNC | H outside the block | HND (head stride spans blocks/layers) |
    """
    out = []
    for name, perm in CONVENTIONS.items():
        axes = [(view.shape[d], view.stride(d)) for d in perm[1:]]
        if axes[-1][0] > 1 and axes[-1][1] != 1:
            continue
        strides = [s for n, s in axes if n > 1]
        if all(a >= b for a, b in itertools.pairwise(strides)):
            out.append(name)
    return tuple(out)


class KVViews(Mapping[str, tuple[torch.Tensor, torch.Tensor]]):
    """``cache.kv[layer] -> (K, V)`` for the layers whose cell holds K||V.

    Made on first access (two slices of the layer's view) and kept.
    """

    def __init__(self, views: Mapping[str, torch.Tensor], metadata: Mapping[str, LayerMeta]):
        self._views = views
        self._meta = metadata
        self._kv_names: tuple[str, ...] | None = None  # found on first listing
        self._made: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def _names(self) -> tuple[str, ...]:
        if self._kv_names is None:
            self._kv_names = tuple(n for n, m in self._meta.items() if m.head_size is not None)
        return self._kv_names

    def __getitem__(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        made = self._made.get(name)
        if made is None:
            if name not in self._meta:
                raise NoView(f"no layer {name!r} in this stage's views",
                             hint="list(cache.kv) names the layers with K and V views")
            made = self._made[name] = split_kv(self._views[name], self._meta[name])
        return made

    def __contains__(self, name: object) -> bool:
        meta = self._meta.get(name) if isinstance(name, str) else None
        return meta is not None and meta.holds_kv

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


class LayoutViews:
    """Kernel-convention views of each layer, where the layout yields them.

    ``nhd(layer)`` is ``(B, N, H, C)``, ``hnd(layer)`` is ``(B, H, N, C)``; the
    ``kv_`` forms split C into K ``(..., head_size)`` and V ``(..., head_size_v)``.
    Each is a ``permute``/slice of the layer's view (no copy); asking for a
    convention the layout does not store raises :class:`LayoutMismatch`.
    """

    def __init__(self, views: Mapping[str, torch.Tensor], metadata: Mapping[str, LayerMeta],
                 axis_order: AxisOrder):
        self._views = views
        self._meta = metadata
        self.axis_order = axis_order

    def supports(self, name: str) -> tuple[str, ...]:
        """The conventions ``name``'s view yields, e.g. ``("NHD",)``."""
        return conventions(self._views[name])

    def _get(self, name: str, convention: str) -> torch.Tensor:
        view = self._views[name]
        if convention not in conventions(view):
            raise LayoutMismatch(
                f"layer {name}: layout {self.axis_order.name} does not store its pages as "
                f"{convention} (strides {tuple(view.stride())} of (B, H, N, C))",
                expected=convention, found=", ".join(conventions(view)) or "neither",
                hint="compile with layout LBNHC for NHD kernels, LBHNC or BLHNC for HND")
        return view.permute(CONVENTIONS[convention])

    def nhd(self, name: str) -> torch.Tensor:
        return self._get(name, "NHD")  # (B, N, H, C)

    def hnd(self, name: str) -> torch.Tensor:
        return self._get(name, "HND")  # (B, H, N, C)

    def kv_nhd(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = split_kv(self.nhd(name), self._meta[name])
        return k, v  # (B, N, H, head_size), (B, N, H, head_size_v)

    def kv_hnd(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = split_kv(self.hnd(name), self._meta[name])
        return k, v  # (B, H, N, head_size), (B, H, N, head_size_v)


class LayoutMismatch(KvspecError):
    """A kernel convention the artifact's layout does not store without a copy."""


# ---------------------------------------------------------------------------
# cell parts and per-tensor scales (quantized caches)
# ---------------------------------------------------------------------------


def part_view(view: torch.Tensor, part: CellPart) -> torch.Tensor:
    """One part of every cell of ``view``, in the part's dtype, without a copy::

        view:  (B, H, N, C)            any dtype; the cell is C * itemsize bytes
        bytes: (B, H, N, C * itemsize) the same memory as int8
        part:  bytes[..., off : off + count * size].view(part dtype)   # (B, H, N, count)

    e.g. an ``int8_per_token_head`` cell ``[K 128 B | K scale f32 | V 128 B | V scale f32]``
    gives ``k`` (B, H, N, 128) int8 and ``k_scale`` (B, H, N, 1) float32.
    """
    dtype = torch_dtype(part.dtype)
    size = dtype_size(part.dtype)
    raw = view.view(torch.int8)                                  # (B, H, N, C bytes)
    start = part.byte_offset
    piece = raw[..., start:start + part.count * size]            # (B, H, N, count*size)
    try:
        return piece.view(dtype)                                 # (B, H, N, count)
    except RuntimeError as exc:
        raise ArtifactError(
            f"cell part {part.name!r} ({part.dtype} at byte {start} of the cell) is "
            f"not aligned for a {part.dtype} view: {exc}",
            hint="view the raw bytes (views[layer].view(torch.int8)) instead") from None


class CellParts(Mapping[str, Mapping[str, torch.Tensor]]):
    """``cache.parts[layer] -> {part name: view}`` for layers whose artifact entry
    names the parts of its cells (K, V, in-cell scales, MLA NoPE/RoPE, ...).

    Made on first access and kept; layers with opaque cells (nvfp4, turboquant,
    state layers) are absent.
    """

    def __init__(self, views: Mapping[str, torch.Tensor],
                 parts: Mapping[str, tuple[CellPart, ...] | None]):
        self._views = views
        self._parts = {n: p for n, p in parts.items() if p and n in views}
        self._made: dict[str, dict[str, torch.Tensor]] = {}

    def __getitem__(self, name: str) -> dict[str, torch.Tensor]:
        made = self._made.get(name)
        if made is None:
            if name not in self._parts:
                raise NoView(f"layer {name!r} has no addressable cell parts",
                             hint="list(cache.parts) names the layers that have them; view "
                                  "the raw bytes otherwise (cache.views[layer].view(torch.int8))")
            made = self._made[name] = {p.name: part_view(self._views[name], p)
                                       for p in self._parts[name] or ()}
        return made

    def __contains__(self, name: object) -> bool:
        return name in self._parts

    def __iter__(self) -> Iterator[str]:
        return iter(self._parts)

    def __len__(self) -> int:
        return len(self._parts)


def per_tensor_scales(
        names: list[str], device: torch.device,
) -> tuple[torch.Tensor | None, dict[str, dict[str, torch.Tensor]]]:
    """One float32 allocation ``(layers, 2)`` of per-tensor K/V scale constants,
    set to 1.0 (the engine's default until calibrated scales are loaded), and
    each layer's ``{"k_scale": (), "v_scale": ()}`` views of it."""
    if not names:
        return None, {}
    if device.type == "meta":
        buf = torch.empty((len(names), 2), dtype=torch.float32, device=device)
    else:
        buf = torch.ones((len(names), 2), dtype=torch.float32, device=device)
    return buf, {n: {"k_scale": buf[i, 0], "v_scale": buf[i, 1]} for i, n in enumerate(names)}
