"""Token-indexed attention kinds: pages of ``[H, N, C]`` with one state per token.

::

    page = H * N * C           N = block_size // tokens_per_state
    C    = (head_size + head_size_v) * itemsize      (dense K||V cell)

>>> full = FullAttention(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16")
>>> full.page_size_bytes     # 8 heads x 16 tokens x (128 + 128) x 2 bytes
65536

The kinds and their inheritance follow the reference planner's spec family
(``kv_cache_interface``), because its grouping rules test kinds by family: a
sliding-window MLA layer *is* a sliding-window layer, and so on.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import ClassVar

from kvspec.model.dtypes import dtype_size
from kvspec.model.engine import Engine
from kvspec.model.specs.base import (
    LayerSpec,
    MergeConflict,
    MergeInvalid,
    PaddedPage,
    cdiv,
    merged,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Attention(PaddedPage, LayerSpec):
    """Token-indexed K/V pages: ``[H, N, C]`` with one state per token."""

    kind: ClassVar[str] = "attention"
    ref_class: ClassVar[str] = "AttentionSpec"

    dcp_sharded: bool = True
    #: Distinct shards across tensor parallelism (ranks beyond hold replicas).
    max_tp_shards: int | None = None
    num_kv_heads: int
    head_size: int
    dtype: str
    head_size_v: int | None = None
    #: ``KVQuantMode`` value of the layer's quantization (0: none).
    kv_quant_mode: int = 0
    page_size_padded: int | None = None
    #: H of the page when the backend packs heads differently from KV heads.
    num_head_slots: int | None = None
    #: C in bytes when the backend packs the cell (None: dense K||V).
    state_content_bytes: int | None = None
    tokens_per_state: int | Fraction = 1

    def __post_init__(self) -> None:
        if self.head_size_v is None:
            object.__setattr__(self, "head_size_v", self.head_size)

    @property
    def num_heads(self) -> int:
        return self.num_head_slots if self.num_head_slots is not None else self.num_kv_heads

    @property
    def tokens_per_state_value(self) -> int | Fraction:
        return self.tokens_per_state

    @property
    def state_content_size_bytes(self) -> int:
        if self.state_content_bytes is not None:
            return self.state_content_bytes
        assert self.head_size_v is not None
        return (self.head_size + self.head_size_v) * dtype_size(self.dtype)

    def _unpadded_page(self) -> int:
        return self.num_heads * self.num_states * self.state_content_size_bytes

    def max_num_blocks_per_req(self, engine: Engine, max_len: int) -> int:
        shards = engine.decode_context_parallel_size if self.dcp_sharded else 1
        return cdiv(max_len, self.block_size * shards)


@dataclass(frozen=True, slots=True, kw_only=True)
class FullAttention(Attention):
    """Every token's K/V kept for the whole request.

    Also the kind local-attention layers take when the hybrid manager is off:
    they keep their window for compute but are allocated as full attention.
    """

    kind: ClassVar[str] = "full_attention"
    ref_class: ClassVar[str] = "FullAttentionSpec"
    family: ClassVar[bool] = True
    bucket_by: ClassVar[tuple[str, ...]] = ()

    sliding_window: int | None = merged("window")
    attention_chunk_size: int | None = merged("window")
    non_causal: bool = merged("any", False)

    def max_memory_usage_bytes(self, engine: Engine) -> int:
        max_len = engine.max_model_len
        dcp = engine.decode_context_parallel_size
        if self.dcp_sharded and dcp > 1:
            max_len = cdiv(max_len, dcp)
        return cdiv(max_len, self.block_size) * self.page_size_bytes

    def check_merged(self) -> None:
        if self.sliding_window is not None and self.attention_chunk_size is not None:
            raise MergeConflict("sliding-window and chunked-local layers cannot share a group")


@dataclass(frozen=True, slots=True, kw_only=True)
class RSWA(FullAttention):
    """Reference sliding-window attention: prefill kept, decode windowed."""

    kind: ClassVar[str] = "rswa"
    ref_class: ClassVar[str] = "RSWASpec"
    family: ClassVar[bool] = True

    rswa_window: int


@dataclass(frozen=True, slots=True, kw_only=True)
class SinkFullAttention(FullAttention):
    """Full attention with ``sink_len`` learned sink tokens."""

    kind: ClassVar[str] = "sink_full_attention"
    ref_class: ClassVar[str] = "SinkFullAttentionSpec"

    sink_len: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ChunkedLocal(Attention):
    """Attention within fixed chunks of ``attention_chunk_size`` tokens (Llama 4)."""

    kind: ClassVar[str] = "chunked_local"
    ref_class: ClassVar[str] = "ChunkedLocalAttentionSpec"
    bucket_by: ClassVar[tuple[str, ...]] = ("attention_chunk_size",)

    attention_chunk_size: int

    def max_admission_blocks(self, in_flight: int, max_model_len: int) -> int:
        # One chunk plus the in-flight tokens, never more than the whole request.
        return cdiv(min(self.attention_chunk_size + in_flight, max_model_len),
                    self.block_size)

    def max_memory_usage_bytes(self, engine: Engine) -> int:
        blocks = self.max_admission_blocks(engine.max_in_flight_tokens, engine.max_model_len)
        return blocks * self.page_size_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class SlidingWindow(Attention):
    """Attention over the last ``sliding_window`` tokens; older blocks are freed."""

    kind: ClassVar[str] = "sliding_window"
    ref_class: ClassVar[str] = "SlidingWindowSpec"
    bucket_by: ClassVar[tuple[str, ...]] = ("sliding_window",)

    sliding_window: int
    #: Trailing tokens kept below the window for multi-module speculation.
    extra_retained_tokens: int = 0

    def max_admission_blocks(self, in_flight: int, max_model_len: int) -> int:
        # The window minus the current token, the retained tail and the in-flight
        # tokens; +1 because the window need not start at a block boundary
        # (block 4, window [CDEF] spans [XXCD][EF]).
        tokens = min(self.sliding_window - 1 + self.extra_retained_tokens + in_flight,
                     max_model_len)
        return cdiv(tokens, self.block_size) + 1

    def max_memory_usage_bytes(self, engine: Engine) -> int:
        if self.dcp_sharded and engine.decode_context_parallel_size != 1:
            raise MergeInvalid("decode context parallelism does not support sliding window")
        blocks = self.max_admission_blocks(engine.max_in_flight_tokens, engine.max_model_len)
        return blocks * self.page_size_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class DraftSlidingWindow(SlidingWindow):
    """A drafter's sliding-window layer on the state-slot layout (not prefix-cached)."""

    kind: ClassVar[str] = "draft_sliding_window"
    ref_class: ClassVar[str] = "DraftSlidingWindowSpec"

    @property
    def prefix_cacheable(self) -> bool:
        return False


class _OneBlockRing:
    """Mixin: one ring block per request, never prefix-cached."""

    __slots__ = ()

    def max_num_blocks_per_req(self, engine: Engine, max_len: int) -> int:
        return 1

    @property
    def prefix_cacheable(self) -> bool:
        return False

    @property
    def uses_slot_mapping(self) -> bool:
        return False


@dataclass(frozen=True, slots=True, kw_only=True)
class CircularBuffer(_OneBlockRing, Attention):
    """One ring block per request holding the raw keys still being compressed."""

    kind: ClassVar[str] = "circular_buffer"
    ref_class: ClassVar[str] = "CircularBufferSpec"
    bucket_by: ClassVar[tuple[str, ...]] = ()

    @property
    def block_table_token_alignment(self) -> int | None:
        return None

    def max_memory_usage_bytes(self, engine: Engine) -> int:
        return self.page_size_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class KpoolTail(_OneBlockRing, SlidingWindow):
    """One-block ring of a kpool indexer's raw tail (``block_size`` = ring length)."""

    kind: ClassVar[str] = "kpool_tail"
    ref_class: ClassVar[str] = "KpoolTailSpec"
    bucket_by: ClassVar[tuple[str, ...]] = ()

    def max_admission_blocks(self, in_flight: int, max_model_len: int) -> int:
        return 1


@dataclass(frozen=True, slots=True, kw_only=True)
class EncoderOnly(Attention):
    """Encoder self-attention: nothing is cached across steps."""

    kind: ClassVar[str] = "encoder_only"
    ref_class: ClassVar[str] = "EncoderOnlyAttentionSpec"
    bucket_by: ClassVar[tuple[str, ...]] = ()

    def max_memory_usage_bytes(self, engine: Engine) -> int:
        return 0


@dataclass(frozen=True, slots=True, kw_only=True)
class CrossAttention(Attention):
    """Decoder cross-attention over the cached encoder states (e.g. Whisper)."""

    kind: ClassVar[str] = "cross_attention"
    ref_class: ClassVar[str] = "CrossAttentionSpec"
    bucket_by: ClassVar[tuple[str, ...]] = ()

    def max_memory_usage_bytes(self, engine: Engine) -> int:
        return cdiv(engine.encoder_tokens, self.block_size) * self.page_size_bytes
