"""One block of the main pool: where each layer's page sits, and the bytes
no layer of a group uses, by cause.

>>> from kvspec.artifact import Artifact
>>> from kvspec.reports.explain.frozen import frozen
>>> bm = block_map(frozen(Artifact.read("layouts/llama-3.1-8b.kvlayout.json").body))
>>> bm.bytes_per_block, len(bm.slots), bm.used, bm.waste(0).total
(2097152, 32, 2097152, 0)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from kvspec.artifact import format as fmt
from kvspec.model.specs.base import LayerSpec
from kvspec.reports.explain.frozen import FrozenLayout

__all__ = ["BlockMap", "Segment", "Waste", "block_map", "pages_of", "tensor_spec"]


@dataclass(frozen=True)
class Segment:
    """One layer's page inside one block: ``[start, start + page)``, of which
    the first ``useful`` bytes hold state."""

    group: int
    layer: str
    start: int
    page: int
    useful: int

    @property
    def end(self) -> int:
        return self.start + self.page


@dataclass(frozen=True)
class Waste:
    """Bytes of a block that hold no state, by cause."""

    padding_slots: int = 0
    padded_pages: int = 0
    alignment: int = 0

    @property
    def total(self) -> int:
        return self.padding_slots + self.padded_pages + self.alignment


def _measure(intervals: list[tuple[int, int]]) -> int:
    """Bytes covered by the union of ``[start, end)`` intervals."""
    total, end = 0, -1
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


@dataclass(frozen=True)
class BlockMap:
    """Where every layer of one pipeline stage sits inside one main-pool block."""

    stage: int
    bytes_per_block: int
    segments: tuple[Segment, ...]
    #: Distinct ``(start, end)`` page positions, in order: the block's slots.
    slots: tuple[tuple[int, int], ...]
    #: Bytes any group uses (the union of all pages).
    used: int

    def of(self, group: int) -> tuple[Segment, ...]:
        """The segments of ``group``, in block order."""
        return self._by_group.get(group, ())

    @cached_property
    def _by_group(self) -> dict[int, tuple[Segment, ...]]:
        out: dict[int, list[Segment]] = {}
        for s in self.segments:
            out.setdefault(s.group, []).append(s)
        return {g: tuple(segs) for g, segs in out.items()}

    def waste(self, group: int) -> Waste:
        mine = self.of(group)
        own = _measure([(s.start, s.end) for s in mine])
        return Waste(padding_slots=self.used - own,
                     padded_pages=sum(s.page - s.useful for s in mine),
                     alignment=self.bytes_per_block - self.used)


def pages_of(spec: LayerSpec) -> tuple[int, int]:
    """``(page, unpadded page)`` of a layer spec."""
    page = spec.page_size_bytes
    return page, min(spec.unpadded_page_size_bytes, page)


def tensor_spec(layout: FrozenLayout, tensor: fmt.Tensor) -> LayerSpec:
    """The spec of a tensor's layers (they share one shape)."""
    return layout.groups[tensor.group].layer_spec(tensor.layers[0])


def _form(value: fmt.Bytes) -> tuple[int, int]:
    """``(a, b)`` of ``a * N + b`` bytes."""
    return (value.per_block, value.fixed) if isinstance(value, fmt.Affine) else (0, value)


def _starts(tensor: fmt.Tensor, per_block: int, page: int) -> list[int]:
    """Where each layer of ``tensor`` starts inside a block.

    A layer ``l`` starts at ``offset + l * layer_stride + b * block_stride`` in
    its pool. Block-outermost layouts (``block_stride == bytes_per_block``)
    keep the position inside a block in the constant part; layer-outermost
    ones (``layer_stride = page * N``) in the coefficient of ``N``.
    """
    outer = tensor.block_stride == per_block and per_block != page
    (off_a, off_b), (step_a, step_b) = _form(tensor.offset), _form(tensor.layer_stride)
    out = []
    for i in range(len(tensor.layers)):
        a, b = off_a + step_a * i, off_b + step_b * i
        out.append(b if outer else (a or b))
    return out


def block_map(layout: FrozenLayout, stage: int = 0) -> BlockMap:
    """The main-pool block of ``stage``, from the layout's tensors (a drafter's
    own pool and host-resident tensors are not in it)."""
    st = layout.stages[stage]
    per_block = st.bytes_per_block
    own = {i for i, g in enumerate(layout.groups) if g.own_pool}
    segments = []
    for t in st.record.tensors:
        if t.group in own or t.pool == "host":
            continue
        page, useful = pages_of(tensor_spec(layout, t))
        for name, start in zip(t.layers, _starts(t, per_block, page)):
            segments.append(Segment(t.group, name, start, page, useful))
    segments.sort(key=lambda s: (s.start, s.group))
    slots = tuple(sorted({(s.start, s.end) for s in segments}))
    return BlockMap(stage, per_block, tuple(segments), slots, _measure(list(slots)))
