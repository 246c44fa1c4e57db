"""Physical orders of the logical KV cache axes ``[L, B, H, N, C]``.

L layer, B block, H head slot, N state (token), C content bytes. A layout names
the axes outermost first: ``LBNHC`` keeps each layer's region contiguous, with
the tokens of a block outside its heads; ``BLHNC`` keeps each block's pages of
all layers together (block-outermost), which is what packing pages of different
sizes side by side needs.

>>> Layout.LBNHC.stride_order
(0, 1, 3, 2, 4)
>>> Layout.BLHNC.is_block_outermost, Layout.LBNHC.is_layer_compact
(True, True)
"""

from __future__ import annotations

from enum import Enum

DIM_L, DIM_B, DIM_H, DIM_N, DIM_C = range(5)
AXES = "LBHNC"


class Layout(Enum):
    """A permutation of the logical axes, outermost physical axis first."""

    LBHNC = (DIM_L, DIM_B, DIM_H, DIM_N, DIM_C)
    LBNHC = (DIM_L, DIM_B, DIM_N, DIM_H, DIM_C)
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
    def is_block_contiguous(self) -> bool:
        """``[H, N, C]`` is contiguous inside a block."""
        return self.value[-3:] == (DIM_H, DIM_N, DIM_C)

    @classmethod
    def parse(cls, name: str) -> Layout:
        return cls[name.upper()]


#: The layout vLLM resolves when no backend asks for another.
DEFAULT_LAYOUT = Layout.LBNHC
