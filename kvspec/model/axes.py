"""Axis orders: the physical order of the logical KV cache axes ``[L, B, H, N, C]``.

L layer, B block, H head slot, N state (token), C content bytes. An axis order
names the axes outermost first: ``LBNHC`` keeps each layer's region
contiguous, with the tokens of a block outside its heads; ``BLHNC`` keeps each
block's pages of all layers together (block-outermost), which is what packing
pages of different sizes side by side needs.

The word *layout* in kvspec means the whole memory plan a source describes
(``layouts/*.yaml`` compile to layout artifacts); the source and artifact key
``engine.layout`` holds the axis order, as vLLM's ``kv_cache_layout`` does.

The axis orders are declared once, here: the source schema, the artifact's
schema and the spec-dump schema take their names from :data:`AXIS_ORDER_NAMES`
(the default first).

>>> AXIS_ORDER_NAMES
('LBNHC', 'LBHNC', 'LHBNC', 'BLHNC', 'BLNHC', 'BHLNC')
>>> AxisOrder.LBNHC.stride_order
(0, 1, 3, 2, 4)
>>> AxisOrder.BLHNC.is_block_outermost, AxisOrder.LBNHC.is_layer_compact
(True, True)
>>> AxisOrder.LHBNC.heads_outside_blocks
True
"""

from __future__ import annotations

from enum import Enum
from typing import Literal

DIM_L, DIM_B, DIM_H, DIM_N, DIM_C = range(5)
AXES = "LBHNC"


class AxisOrder(Enum):
    """A permutation of the logical axes, outermost physical axis first (the
    default, vLLM's, first)."""

    LBNHC = (DIM_L, DIM_B, DIM_N, DIM_H, DIM_C)
    LBHNC = (DIM_L, DIM_B, DIM_H, DIM_N, DIM_C)
    LHBNC = (DIM_L, DIM_H, DIM_B, DIM_N, DIM_C)
    BLHNC = (DIM_B, DIM_L, DIM_H, DIM_N, DIM_C)
    BLNHC = (DIM_B, DIM_L, DIM_N, DIM_H, DIM_C)
    BHLNC = (DIM_B, DIM_H, DIM_L, DIM_N, DIM_C)

    @property
    def stride_order(self) -> tuple[int, ...]:
        """Logical axis indices, outermost physical axis first."""
        return self.value

    @property
    def is_layer_compact(self) -> bool:
        """L is outermost: every layer owns one contiguous region."""
        return self.value[0] == DIM_L

    @property
    def is_block_outermost(self) -> bool:
        """B is outermost: every block holds the pages of all its layers."""
        return self.value[0] == DIM_B

    @property
    def is_block_compact(self) -> bool:
        """L and B are the two outermost axes: each page is one contiguous run."""
        return set(self.value[:2]) == {DIM_L, DIM_B}

    @property
    def heads_outside_blocks(self) -> bool:
        """H lies outside B (``LHBNC``, ``BHLNC``): a block's page is split into
        one run per head slot, interleaved with the other blocks' runs."""
        return self.value.index(DIM_H) < self.value.index(DIM_B)

    @classmethod
    def parse(cls, name: str) -> AxisOrder:
        return cls[name.upper()]


#: The axis order vLLM resolves when no backend asks for another.
DEFAULT_AXIS_ORDER = AxisOrder.LBNHC

#: Every axis order's name, the default first: what ``engine.layout`` takes.
AXIS_ORDER_NAMES: tuple[str, ...] = tuple(order.name for order in AxisOrder)

#: An axis order's name as a type (for the source, artifact and dump schemas).
AxisOrderName = Literal[AXIS_ORDER_NAMES]  # type: ignore[valid-type]
