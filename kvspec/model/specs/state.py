"""State layers: recurrent states (Mamba, Gated DeltaNet, short conv, linear attention).

A state layer's page holds whole states, one tensor per entry of ``shapes``::

    page = sum(prod(shape) * itemsize(dtype) for shape, dtype in states)

>>> s = MambaState(block_size=8192, shapes=((3, 4096), (8, 64, 64)),
...                dtypes=("bfloat16", "float32"))
>>> s.page_size_bytes          # 3*4096*2 + 8*64*64*4
155648
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod
from typing import ClassVar

from kvspec.model.dtypes import dtype_size
from kvspec.model.engine import Engine
from kvspec.model.specs.base import LayerSpec, PaddedPage, cdiv

#: The reference's ``MambaAttentionBackendEnum`` names, by kvspec mamba type.
MAMBA_TYPES: dict[str, str] = {
    "mamba1": "MAMBA1",
    "mamba2": "MAMBA2",
    "gdn_attention": "GDN_ATTN",
    "short_conv": "SHORT_CONV",
    "linear_attention": "LINEAR",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class MambaState(PaddedPage, LayerSpec):
    """A recurrent state layer (Mamba, GDN, short conv, linear attention)."""

    kind: ClassVar[str] = "mamba"
    ref_class: ClassVar[str] = "MambaSpec"
    bucket_by: ClassVar[tuple[str, ...]] = (
        "num_speculative_blocks", "num_prefill_checkpoint_blocks",
        "prefill_checkpoint_alignment", "page_size_bytes", "tp_replicated")

    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    page_size_padded: int | None = None
    mamba_type: str = "mamba2"
    mamba_cache_mode: str = "none"
    num_speculative_blocks: int = 0
    num_prefill_checkpoint_blocks: int = 0
    prefill_checkpoint_alignment: int | None = None
    num_heads_: int = field(default=1, repr=False)
    tp_replicated: bool = False

    @property
    def num_heads(self) -> int:
        return self.num_heads_

    @property
    def tokens_per_state_value(self) -> int:
        return -1

    @property
    def state_content_size_bytes(self) -> int:
        return sum(prod(shape) * dtype_size(dt) for shape, dt in zip(self.shapes, self.dtypes))

    def _unpadded_page(self) -> int:
        return self.state_content_size_bytes

    @property
    def block_table_token_alignment(self) -> int | None:
        return None

    def max_memory_usage_bytes(self, engine: Engine) -> int:
        mode = engine.mamba_cache_mode
        if mode == "all":
            blocks = cdiv(engine.max_model_len, self.block_size) + self.num_speculative_blocks
        elif mode == "align":
            blocks = 2 + self.num_speculative_blocks + self.num_prefill_checkpoint_blocks
        else:
            blocks = 1 + self.num_speculative_blocks
        return blocks * self.page_size_bytes

    def max_num_blocks_per_req(self, engine: Engine, max_len: int) -> int:
        if engine.mamba_cache_mode == "align":
            # Rows are position-indexed over the whole sequence even though only
            # a few state blocks are resident at once.
            return cdiv(max_len, self.block_size) + self.num_speculative_blocks
        return cdiv(self.max_memory_usage_bytes(engine), self.page_size_bytes)


def mamba_prefill_checkpoint_position(num_tokens: int, hash_block_size: int,
                                      drop_eagle_block: bool) -> int:
    """The last hash-block boundary before the prompt's final token, where a
    prefill can leave a reusable state checkpoint.

    >>> mamba_prefill_checkpoint_position(1000, 256, drop_eagle_block=False)
    768
    """
    position = (num_tokens - 1) // hash_block_size * hash_block_size
    if drop_eagle_block:
        position -= hash_block_size
    return max(position, 0)


def mamba_prefill_checkpoint_valid(query_start: int, query_end: int, checkpoint: int,
                                   hash_block_size: int, mamba_block_size: int,
                                   alignment: int | None) -> bool:
    """Whether a prefill chunk ``[query_start, query_end)`` can export ``checkpoint``.

    >>> mamba_prefill_checkpoint_valid(0, 2048, 1024, 256, 512, 256)
    True
    """
    if alignment is None:
        return False
    if alignment <= 0:
        raise ValueError("prefill_checkpoint_alignment must be positive")
    initial_col = (query_start - 1) // mamba_block_size
    checkpoint_col = cdiv(query_end, mamba_block_size) - 2
    return (query_start % hash_block_size == 0
            and checkpoint_col > initial_col
            and query_start + hash_block_size <= checkpoint
            and query_start < checkpoint < query_end
            and (checkpoint - query_start) % alignment == 0)
