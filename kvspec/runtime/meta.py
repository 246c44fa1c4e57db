"""What a kernel needs to know about each layer's view (torch-free records).

The layers of one artifact tensor share their kind, block sizes, window, pool,
dtype, shape and strides (:class:`TensorMeta`); each layer adds its name, its
slot in the tensor and its offsets (:class:`LayerMeta`, which reads the shared
fields through). Loading 1,000 layers thus makes 1,000 five-field records, not
1,000 twenty-field ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import itemgetter
from typing import Any

__all__ = ["LayerMeta", "TensorMeta"]


@dataclass(frozen=True, slots=True)
class TensorMeta:
    """What the layers of one artifact tensor share (every field of
    :class:`LayerMeta` but the layer's name, slot and offsets)."""

    #: Global KV cache group id (the block table these layers read).
    group: int
    #: The layers' kind, e.g. ``full_attention``, ``sliding_window``, ``mamba``.
    kind: str
    #: Tokens per manager block (the block pool's unit).
    block_size: int
    #: Tokens per B entry of the view (== block_size unless kernel-block split).
    kernel_block_size: int
    sliding_window: int | None
    attention_chunk_size: int | None
    #: ``device``, ``draft`` (a drafter's own region of the device allocation)
    #: or ``host``.
    pool: str
    #: Manager blocks of that pool.
    num_blocks: int
    dtype: str
    #: Index of the artifact tensor in the stage.
    tensor: int
    #: ``(B, H, N, C)`` and strides in elements of ``dtype``.
    shape: tuple[int, int, int, int]
    stride: tuple[int, int, int, int]
    #: The strides in bytes of the pool allocation.
    byte_stride: tuple[int, int, int, int]
    #: K and V head sizes when a cell holds K||V (dense attention), else None.
    head_size: int | None
    head_size_v: int | None
    role: str


class LayerMeta(tuple):
    """What a kernel needs to know about one layer's view, besides the view:
    its name, its place in its tensor (``slot``) and offsets (in elements of
    ``dtype`` and in bytes), and every :class:`TensorMeta` field, shared with
    the other layers of its tensor (so loading makes one small record per layer).

    Read-only (a tuple underneath); equal when every field is.
    """

    __slots__ = ()
    #: Every field, in order (as a dataclass would list them).
    FIELDS = ("name", "group", "kind", "block_size", "kernel_block_size", "sliding_window",
              "attention_chunk_size", "pool", "num_blocks", "dtype", "tensor", "slot", "shape",
              "stride", "storage_offset", "byte_offset", "byte_stride", "head_size",
              "head_size_v", "role")

    def __new__(cls, name: str, slot: int, storage_offset: int, byte_offset: int,
                shared: TensorMeta) -> LayerMeta:
        return tuple.__new__(cls, (name, slot, storage_offset, byte_offset, shared))

    name: str = property(itemgetter(0))  # type: ignore[assignment]
    slot: int = property(itemgetter(1))  # type: ignore[assignment]
    storage_offset: int = property(itemgetter(2))  # type: ignore[assignment]
    byte_offset: int = property(itemgetter(3))  # type: ignore[assignment]
    shared: TensorMeta = property(itemgetter(4))  # type: ignore[assignment]

    def __getattr__(self, name: str) -> Any:  # the tensor's shared fields
        return getattr(self[4], name)

    def __getnewargs__(self) -> tuple:
        return tuple(self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LayerMeta) and tuple.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = tuple.__hash__

    def __repr__(self) -> str:
        return "LayerMeta(" + ", ".join(f"{f}={getattr(self, f)!r}" for f in self.FIELDS) + ")"

    def as_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.FIELDS}

    @property
    def kernel_blocks_per_block(self) -> int:
        return self.block_size // self.kernel_block_size

    @property
    def holds_kv(self) -> bool:
        return self.head_size is not None
