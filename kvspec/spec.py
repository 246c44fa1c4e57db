"""Layer specs: what one layer stores per block, and what a request costs it.

One frozen class per layer kind. A *page* is one layer's bytes for one block,
laid out as ``[H, N, C]``: head slots x states per block x bytes per cell::

    page = H * N * C           N = block_size // tokens_per_state
    C    = (head_size + head_size_v) * itemsize      (dense K||V cell)

>>> full = FullAttention(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16")
>>> full.page_size_bytes     # 8 heads x 16 tokens x (128 + 128) x 2 bytes
65536
>>> MLA(block_size=64, num_kv_heads=1, head_size=576, dtype="bfloat16").page_size_bytes
73728

The kinds and their inheritance follow the reference planner's spec family
(``../shared/reference/kv_cache_interface.txt``), because its grouping rules
test kinds by family: an MLA layer *is* a full-attention layer, a sliding-window
MLA layer *is* a sliding-window layer, and so on.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field
from fractions import Fraction
from math import prod
from typing import Any, ClassVar

from kvspec.dtypes import dtype_size
from kvspec.engine import Engine


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative integers."""
    return -(-a // b)


def round_up(x: int, multiple: int) -> int:
    return cdiv(x, multiple) * multiple


class MergeConflict(Exception):
    """Layers that cannot share one block table (internal; the planner decides)."""


class MergeInvalid(ValueError):
    """Layers that could share a table but disagree on a value that must agree."""


def replace(spec: Any, **changes: Any) -> Any:
    """``dataclasses.replace`` (re-runs ``__post_init__``, as the reference does)."""
    return dataclasses.replace(spec, **changes)


def recast(spec: LayerSpec, target: type[LayerSpec], *, drop: tuple[str, ...] = (),
           **changes: Any) -> LayerSpec:
    """Rebuild ``spec`` as kind ``target`` (e.g. sliding window -> full attention).

    Fields the target lacks must be named in ``drop``; fields only the target has
    keep their defaults.
    """
    kwargs = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)
              if f.init and f.name not in drop}
    kwargs.update(changes)
    return target(**kwargs)


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerSpec:
    """One layer's KV memory format. Subclasses are the layer kinds."""

    kind: ClassVar[str] = "layer"
    #: The reference planner's class name for this kind (conformance output).
    ref_class: ClassVar[str] = "KVCacheSpec"

    block_size: int
    #: Decode-context parallelism shards this cache's tokens across ranks.
    dcp_sharded: bool = False
    #: Bytes the distance between physical blocks must be a multiple of.
    block_stride_alignment: int | None = None

    # -- page geometry -------------------------------------------------------
    @property
    def num_heads(self) -> int:
        raise NotImplementedError

    @property
    def tokens_per_state_value(self) -> int | Fraction:
        raise NotImplementedError

    @property
    def state_content_size_bytes(self) -> int:
        raise NotImplementedError

    @property
    def page_size_bytes(self) -> int:
        raise NotImplementedError

    @property
    def unpadded_page_size_bytes(self) -> int:
        return self.page_size_bytes

    @property
    def num_states(self) -> int:
        return self.kernel_states(self.block_size)

    def kernel_states(self, kernel_block_size: int) -> int:
        """States (N) in a block of ``kernel_block_size`` tokens."""
        tps = self.tokens_per_state_value
        if tps > 0:
            return int(kernel_block_size // tps)
        return 1

    # -- behaviour ------------------------------------------------------------
    @property
    def prefix_cacheable(self) -> bool:
        return True

    @property
    def prefix_replay_tokens(self) -> int:
        return 0

    @property
    def block_table_token_alignment(self) -> int | None:
        return 128

    @property
    def has_layer_views(self) -> bool:
        return True

    @property
    def uses_slot_mapping(self) -> bool:
        return True

    def max_memory_usage_bytes(self, engine: Engine) -> int:
        """Bytes one request at ``engine.max_model_len`` can hold at most."""
        raise NotImplementedError

    def max_num_blocks_per_req(self, engine: Engine, max_len: int) -> int:
        """Block-table row length for a request of ``max_len`` tokens."""
        return cdiv(max_len, self.block_size)

    def with_block_size(self, block_size: int) -> LayerSpec:
        return replace(self, block_size=block_size)

    # -- merging and bucketing --------------------------------------------------
    @classmethod
    def merge(cls, specs: list[LayerSpec]) -> LayerSpec:
        """One spec for a group of layers; raise ``MergeConflict`` if they differ."""
        if any(s != specs[0] for s in specs[1:]):
            raise MergeConflict("layers in one group must have the same spec")
        return specs[0]

    #: The family a bucket of one type may hold (``UniformType`` test).
    family: ClassVar[type | None] = None

    def same_type_as_all(self, specs: list[LayerSpec]) -> bool:
        """Whether every spec needs the same token slots as this one."""
        fam = type(self).family
        if fam is None:
            raise MergeConflict(f"no bucketing rule for {type(self).__name__}")
        return all(isinstance(s, fam) for s in specs)

    def describe(self) -> dict[str, Any]:
        """Every field and derived page quantity, for artifacts and reports."""
        out: dict[str, Any] = {"kind": self.kind, "class": self.ref_class}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Fraction):
                value = str(value)
            elif isinstance(value, tuple):
                value = [list(v) if isinstance(v, tuple) else v for v in value]
            out[f.name] = value
        out["page_size_bytes"] = self.page_size_bytes
        out["prefix_cacheable"] = self.prefix_cacheable
        return out


# ---------------------------------------------------------------------------
# attention kinds
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Attention(LayerSpec):
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

    @property
    def unpadded_page_size_bytes(self) -> int:
        return self.num_heads * self.num_states * self.state_content_size_bytes

    @property
    def page_size_bytes(self) -> int:
        if self.page_size_padded is not None:
            return self.page_size_padded
        return self.unpadded_page_size_bytes

    def max_num_blocks_per_req(self, engine: Engine, max_len: int) -> int:
        shards = engine.decode_context_parallel_size if self.dcp_sharded else 1
        return cdiv(max_len, self.block_size * shards)

    def attention_fields(self) -> tuple[Any, ...]:
        """The fields every layer of one attention group must agree on."""
        return tuple(getattr(self, f.name) for f in dataclasses.fields(Attention))


@dataclass(frozen=True, slots=True, kw_only=True)
class FullAttention(Attention):
    """Every token's K/V kept for the whole request.

    Also the kind local-attention layers take when the hybrid manager is off:
    they keep their window for compute but are allocated as full attention.
    """

    kind: ClassVar[str] = "full_attention"
    ref_class: ClassVar[str] = "FullAttentionSpec"

    sliding_window: int | None = None
    attention_chunk_size: int | None = None
    non_causal: bool = False

    def max_memory_usage_bytes(self, engine: Engine) -> int:
        max_len = engine.max_model_len
        dcp = engine.decode_context_parallel_size
        if self.dcp_sharded and dcp > 1:
            max_len = cdiv(max_len, dcp)
        return cdiv(max_len, self.block_size) * self.page_size_bytes

    @staticmethod
    def merged_window(values: set[int]) -> int | None:
        if len(values) > 1:
            raise MergeInvalid(
                "all attention layers in one group must have the same window size, "
                f"found {sorted(values)}")
        return next(iter(values), None)

    @classmethod
    def merge(cls, specs: list[LayerSpec]) -> LayerSpec:
        if not all(isinstance(s, FullAttention) for s in specs):
            raise MergeConflict("not all layers are full attention")
        if any(isinstance(s, MLA) for s in specs):
            raise MergeConflict("MLA layers merge only with MLA layers")
        first = specs[0]
        assert isinstance(first, FullAttention)
        windows = {s.sliding_window for s in specs if s.sliding_window is not None}  # type: ignore[union-attr]
        chunks = {s.attention_chunk_size for s in specs  # type: ignore[union-attr]
                  if s.attention_chunk_size is not None}
        merged = cls._merged_from(first, specs, cls.merged_window(windows),
                                  cls.merged_window(chunks))
        for s in specs:
            if s.attention_fields() != merged.attention_fields():  # type: ignore[union-attr]
                raise MergeConflict("attention layers of one group differ in their page")
        if merged.sliding_window is not None and merged.attention_chunk_size is not None:
            raise MergeConflict(
                "sliding-window and chunked-local layers cannot share a group")
        return merged

    @classmethod
    def _merged_from(cls, first: FullAttention, specs: list[LayerSpec],
                     window: int | None, chunk: int | None) -> FullAttention:
        base = {f.name: getattr(first, f.name) for f in dataclasses.fields(Attention)}
        return cls(**base, sliding_window=window, attention_chunk_size=chunk,
                   non_causal=any(getattr(s, "non_causal", False) for s in specs))


def _apply_alignment(spec: MLA | SlidingWindowMLA) -> None:
    """Pad an MLA page up to its row alignment (DeepSeek-V4 sparse layouts)."""
    if spec.alignment is None:
        return
    real = spec.unpadded_page_size_bytes
    padded = round_up(real, spec.alignment)
    if padded != real:
        object.__setattr__(spec, "page_size_padded", padded)


@dataclass(frozen=True, slots=True, kw_only=True)
class MLA(FullAttention):
    """Multi-head latent attention: one latent vector per token, no separate V."""

    kind: ClassVar[str] = "mla"
    ref_class: ClassVar[str] = "MLAAttentionSpec"

    head_size_v: int | None = 0
    cache_dtype_str: str | None = None
    alignment: int | None = None
    model_version: str | None = None
    cache_role: str = "sparse"
    is_index_group_leader: bool = False
    storage_block_size: int | None = None
    non_causal_multi_token_decode: bool = False

    def __post_init__(self) -> None:
        Attention.__post_init__(self)
        _apply_alignment(self)

    _AGREE: ClassVar[tuple[str, ...]] = (
        "cache_dtype_str", "tokens_per_state", "model_version", "cache_role",
        "is_index_group_leader", "storage_block_size", "block_stride_alignment")

    @classmethod
    def merge(cls, specs: list[LayerSpec]) -> LayerSpec:
        if not all(isinstance(s, MLA) for s in specs):
            raise MergeConflict("not all layers are MLA")
        for name in cls._AGREE:
            if len({getattr(s, name) for s in specs}) != 1:
                raise MergeConflict(f"MLA layers of one group differ in {name}")
        first = specs[0]
        assert isinstance(first, MLA)
        merged = cls(
            block_size=first.block_size, num_kv_heads=first.num_kv_heads,
            head_size=first.head_size, dtype=first.dtype,
            kv_quant_mode=first.kv_quant_mode, dcp_sharded=first.dcp_sharded,
            max_tp_shards=first.max_tp_shards, page_size_padded=first.page_size_padded,
            num_head_slots=first.num_head_slots,
            state_content_bytes=first.state_content_bytes,
            cache_dtype_str=first.cache_dtype_str, tokens_per_state=first.tokens_per_state,
            model_version=first.model_version, cache_role=first.cache_role,
            is_index_group_leader=first.is_index_group_leader,
            storage_block_size=first.storage_block_size,
            block_stride_alignment=first.block_stride_alignment,
            non_causal_multi_token_decode=any(
                s.non_causal_multi_token_decode for s in specs),  # type: ignore[union-attr]
        )
        for s in specs:
            if s.attention_fields() != merged.attention_fields():  # type: ignore[union-attr]
                raise MergeConflict("MLA layers of one group differ in their page")
        return merged


@dataclass(frozen=True, slots=True, kw_only=True)
class HiddenState(MLA):
    """A hidden-state cache (extract_hidden_states): an MLA-shaped page per token."""

    kind: ClassVar[str] = "hidden_state"
    ref_class: ClassVar[str] = "HiddenStateCacheSpec"


@dataclass(frozen=True, slots=True, kw_only=True)
class RSWA(FullAttention):
    """Reference sliding-window attention: prefill kept, decode windowed."""

    kind: ClassVar[str] = "rswa"
    ref_class: ClassVar[str] = "RSWASpec"

    rswa_window: int

    @classmethod
    def merge(cls, specs: list[LayerSpec]) -> LayerSpec:
        if not all(isinstance(s, RSWA) for s in specs):
            raise MergeConflict("not all layers are R-SWA")
        windows = {s.rswa_window for s in specs}  # type: ignore[union-attr]
        if len(windows) != 1:
            raise MergeConflict(f"R-SWA layers differ in rswa_window: {sorted(windows)}")
        base = FullAttention.merge(specs)
        fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(FullAttention)}
        return cls(**fields, rswa_window=windows.pop())


@dataclass(frozen=True, slots=True, kw_only=True)
class SinkFullAttention(FullAttention):
    """Full attention with ``sink_len`` learned sink tokens."""

    kind: ClassVar[str] = "sink_full_attention"
    ref_class: ClassVar[str] = "SinkFullAttentionSpec"

    sink_len: int | None = None

    @classmethod
    def _merged_from(cls, first: FullAttention, specs: list[LayerSpec],
                     window: int | None, chunk: int | None) -> FullAttention:
        base = {f.name: getattr(first, f.name) for f in dataclasses.fields(Attention)}
        return cls(**base, sliding_window=window, attention_chunk_size=chunk,
                   non_causal=any(getattr(s, "non_causal", False) for s in specs),
                   sink_len=getattr(first, "sink_len", None))


@dataclass(frozen=True, slots=True, kw_only=True)
class ChunkedLocal(Attention):
    """Attention within fixed chunks of ``attention_chunk_size`` tokens (Llama 4)."""

    kind: ClassVar[str] = "chunked_local"
    ref_class: ClassVar[str] = "ChunkedLocalAttentionSpec"

    attention_chunk_size: int

    def max_admission_blocks(self, in_flight: int, max_model_len: int) -> int:
        # One chunk plus the in-flight tokens, never more than the whole request.
        return cdiv(min(self.attention_chunk_size + in_flight, max_model_len),
                    self.block_size)

    def max_memory_usage_bytes(self, engine: Engine) -> int:
        blocks = self.max_admission_blocks(engine.max_in_flight_tokens, engine.max_model_len)
        return blocks * self.page_size_bytes

    def same_type_as_all(self, specs: list[LayerSpec]) -> bool:
        return all(isinstance(s, ChunkedLocal)
                   and s.attention_chunk_size == self.attention_chunk_size for s in specs)


@dataclass(frozen=True, slots=True, kw_only=True)
class SlidingWindow(Attention):
    """Attention over the last ``sliding_window`` tokens; older blocks are freed."""

    kind: ClassVar[str] = "sliding_window"
    ref_class: ClassVar[str] = "SlidingWindowSpec"

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

    def same_type_as_all(self, specs: list[LayerSpec]) -> bool:
        return all(isinstance(s, SlidingWindow)
                   and s.sliding_window == self.sliding_window for s in specs)


@dataclass(frozen=True, slots=True, kw_only=True)
class DraftSlidingWindow(SlidingWindow):
    """A drafter's sliding-window layer on the GLM-5-Next layout (not prefix-cached)."""

    kind: ClassVar[str] = "draft_sliding_window"
    ref_class: ClassVar[str] = "DraftSlidingWindowSpec"

    @property
    def prefix_cacheable(self) -> bool:
        return False


@dataclass(frozen=True, slots=True, kw_only=True)
class CircularBuffer(Attention):
    """One ring block per request holding the raw keys still being compressed."""

    kind: ClassVar[str] = "circular_buffer"
    ref_class: ClassVar[str] = "CircularBufferSpec"

    @property
    def block_table_token_alignment(self) -> int | None:
        return None

    def max_memory_usage_bytes(self, engine: Engine) -> int:
        return self.page_size_bytes

    def max_num_blocks_per_req(self, engine: Engine, max_len: int) -> int:
        return 1

    def same_type_as_all(self, specs: list[LayerSpec]) -> bool:
        return all(isinstance(s, CircularBuffer) for s in specs)

    @property
    def prefix_cacheable(self) -> bool:
        return False

    @property
    def uses_slot_mapping(self) -> bool:
        return False


@dataclass(frozen=True, slots=True, kw_only=True)
class SlidingWindowMLA(SlidingWindow):
    """Sliding-window attention over MLA latents (DeepSeek-V4 style)."""

    kind: ClassVar[str] = "sliding_window_mla"
    ref_class: ClassVar[str] = "SlidingWindowMLASpec"

    head_size_v: int | None = 0
    cache_dtype_str: str | None = None
    alignment: int | None = None
    model_version: str | None = None
    bounded_replay: bool = False

    def __post_init__(self) -> None:
        if self.model_version not in (None, "deepseek_v4"):
            raise MergeInvalid(f"unsupported MLA model version {self.model_version!r}")
        Attention.__post_init__(self)
        _apply_alignment(self)

    @property
    def prefix_cacheable(self) -> bool:
        return not self.bounded_replay

    @property
    def prefix_replay_tokens(self) -> int:
        return self.sliding_window if self.bounded_replay else 0

    _AGREE: ClassVar[tuple[str, ...]] = (
        "cache_dtype_str", "tokens_per_state", "model_version", "sliding_window",
        "extra_retained_tokens", "bounded_replay", "block_stride_alignment",
        "dcp_sharded", "max_tp_shards")

    @classmethod
    def merge(cls, specs: list[LayerSpec]) -> LayerSpec:
        if not all(isinstance(s, SlidingWindowMLA) for s in specs):
            raise MergeConflict("not all layers are sliding-window MLA")
        for name in cls._AGREE:
            if len({getattr(s, name) for s in specs}) != 1:
                raise MergeConflict(f"sliding-window MLA layers differ in {name}")
        first = specs[0]
        assert isinstance(first, SlidingWindowMLA)
        return cls(
            block_size=first.block_size, block_stride_alignment=first.block_stride_alignment,
            num_kv_heads=first.num_kv_heads, head_size=first.head_size, dtype=first.dtype,
            dcp_sharded=first.dcp_sharded, max_tp_shards=first.max_tp_shards,
            page_size_padded=first.page_size_padded, num_head_slots=first.num_head_slots,
            state_content_bytes=first.state_content_bytes,
            sliding_window=first.sliding_window,
            extra_retained_tokens=first.extra_retained_tokens,
            cache_dtype_str=first.cache_dtype_str, tokens_per_state=first.tokens_per_state,
            model_version=first.model_version, bounded_replay=first.bounded_replay)

    def same_type_as_all(self, specs: list[LayerSpec]) -> bool:
        return all(isinstance(s, SlidingWindowMLA)
                   and s.sliding_window == self.sliding_window
                   and s.bounded_replay == self.bounded_replay for s in specs)


@dataclass(frozen=True, slots=True, kw_only=True)
class KpoolTail(SlidingWindow):
    """One-block ring of a kpool indexer's raw tail (``block_size`` = ring length)."""

    kind: ClassVar[str] = "kpool_tail"
    ref_class: ClassVar[str] = "KpoolTailSpec"

    def max_admission_blocks(self, in_flight: int, max_model_len: int) -> int:
        return 1

    def max_num_blocks_per_req(self, engine: Engine, max_len: int) -> int:
        return 1

    def same_type_as_all(self, specs: list[LayerSpec]) -> bool:
        return all(isinstance(s, KpoolTail) for s in specs)

    @property
    def prefix_cacheable(self) -> bool:
        return False

    @property
    def uses_slot_mapping(self) -> bool:
        return False


@dataclass(frozen=True, slots=True, kw_only=True)
class EncoderOnly(Attention):
    """Encoder self-attention: nothing is cached across steps."""

    kind: ClassVar[str] = "encoder_only"
    ref_class: ClassVar[str] = "EncoderOnlyAttentionSpec"

    def max_memory_usage_bytes(self, engine: Engine) -> int:
        return 0


@dataclass(frozen=True, slots=True, kw_only=True)
class CrossAttention(Attention):
    """Decoder cross-attention over the cached encoder states (e.g. Whisper)."""

    kind: ClassVar[str] = "cross_attention"
    ref_class: ClassVar[str] = "CrossAttentionSpec"

    def max_memory_usage_bytes(self, engine: Engine) -> int:
        return cdiv(engine.encoder_tokens, self.block_size) * self.page_size_bytes


# ---------------------------------------------------------------------------
# state layers
# ---------------------------------------------------------------------------

#: The reference's ``MambaAttentionBackendEnum`` names, by kvspec mamba type.
MAMBA_TYPES: dict[str, str] = {
    "mamba1": "MAMBA1",
    "mamba2": "MAMBA2",
    "short_conv": "SHORT_CONV",
    "linear_attention": "LINEAR",
    "gdn_attention": "GDN_ATTN",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class MambaState(LayerSpec):
    """A recurrent state layer (Mamba, GDN, short conv, linear attention).

    Its page holds whole states, one tensor per entry of ``shapes``::

        page = sum(prod(shape) * itemsize(dtype) for shape, dtype in states)
    """

    kind: ClassVar[str] = "mamba"
    ref_class: ClassVar[str] = "MambaSpec"

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

    @property
    def unpadded_page_size_bytes(self) -> int:
        return self.state_content_size_bytes

    @property
    def page_size_bytes(self) -> int:
        if self.page_size_padded is not None:
            return self.page_size_padded
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

    def same_type_as_all(self, specs: list[LayerSpec]) -> bool:
        return all(
            isinstance(s, MambaState)
            and s.num_speculative_blocks == self.num_speculative_blocks
            and s.num_prefill_checkpoint_blocks == self.num_prefill_checkpoint_blocks
            and s.prefill_checkpoint_alignment == self.prefill_checkpoint_alignment
            and s.page_size_bytes == self.page_size_bytes
            and s.tp_replicated == self.tp_replicated
            for s in specs)

    def describe(self) -> dict[str, Any]:
        out = LayerSpec.describe(self)
        out["num_heads"] = out.pop("num_heads_")
        out["mamba_type"] = MAMBA_TYPES.get(self.mamba_type, self.mamba_type)
        out["tokens_per_state"] = -1
        return out


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


# ---------------------------------------------------------------------------
# one type, several shapes
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class UniformType(LayerSpec):
    """Layers of one type (same token slots) whose pages differ in size.

    One block of the group holds one page of every member, so its page is the
    sum of theirs.
    """

    kind: ClassVar[str] = "uniform_type"
    ref_class: ClassVar[str] = "UniformTypeKVCacheSpecs"

    members: tuple[tuple[str, LayerSpec], ...]

    def __post_init__(self) -> None:
        if self.members:
            object.__setattr__(self, "dcp_sharded", self.members[0][1].dcp_sharded)

    @property
    def specs(self) -> dict[str, LayerSpec]:
        return dict(self.members)

    @property
    def first(self) -> LayerSpec:
        return self.members[0][1]

    @property
    def prefix_cacheable(self) -> bool:
        return all(s.prefix_cacheable for _, s in self.members)

    @property
    def prefix_replay_tokens(self) -> int:
        return max(s.prefix_replay_tokens for _, s in self.members)

    @property
    def page_size_bytes(self) -> int:
        return sum(s.page_size_bytes for _, s in self.members)

    @property
    def block_table_token_alignment(self) -> int | None:
        return self.first.block_table_token_alignment

    @property
    def uses_slot_mapping(self) -> bool:
        return self.first.uses_slot_mapping

    def max_memory_usage_pages(self, engine: Engine) -> int:
        return max(cdiv(s.max_memory_usage_bytes(engine), s.page_size_bytes)
                   for _, s in self.members)

    def max_memory_usage_bytes(self, engine: Engine) -> int:
        return self.max_memory_usage_pages(engine) * self.page_size_bytes

    def max_num_blocks_per_req(self, engine: Engine, max_len: int) -> int:
        widths = {s.max_num_blocks_per_req(engine, max_len) for _, s in self.members}
        if len(widths) != 1:
            raise MergeInvalid(
                f"layers of one group need different block-table widths {sorted(widths)}")
        return widths.pop()

    def max_layers_per_page_size(self) -> int:
        """Most layers sharing one page size: the repeats of a balanced pattern."""
        return Counter(s.page_size_bytes for _, s in self.members).most_common(1)[0][1]

    @staticmethod
    def is_uniform_type(specs: dict[str, LayerSpec] | list[LayerSpec]) -> bool:
        values = list(specs.values()) if isinstance(specs, dict) else list(specs)
        if len({s.block_size for s in values}) > 1:
            return False
        if len({s.dcp_sharded for s in values}) > 1:
            return False
        return values[0].same_type_as_all(values)

    @classmethod
    def of(cls, specs: dict[str, LayerSpec]) -> UniformType | None:
        if not cls.is_uniform_type(specs):
            return None
        return cls(block_size=next(iter(specs.values())).block_size,
                   members=tuple(specs.items()))

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "class": self.ref_class, "block_size": self.block_size,
                "page_size_bytes": self.page_size_bytes,
                "prefix_cacheable": self.prefix_cacheable,
                "kv_cache_specs": {n: s.describe() for n, s in self.members}}


def layer_specs(spec: LayerSpec) -> list[LayerSpec]:
    """The per-layer specs a group spec stands for."""
    if isinstance(spec, UniformType):
        return [s for _, s in spec.members]
    return [spec]


# The bucketing family of each kind: which kinds count as "the same type".
FullAttention.family = FullAttention
SlidingWindow.family = SlidingWindow
ChunkedLocal.family = ChunkedLocal
MambaState.family = MambaState
EncoderOnly.family = EncoderOnly
CrossAttention.family = CrossAttention
CircularBuffer.family = CircularBuffer


def spec_kind_name(spec: LayerSpec) -> str:
    """The reference's ``KVCacheSpecKind`` value of a group spec."""
    if isinstance(spec, UniformType):
        kinds = {spec_kind_name(s) for _, s in spec.members}
        if len(kinds) == 1:
            return kinds.pop()
        if all(isinstance(s, FullAttention) for _, s in spec.members):
            return "full_attention"
        return "unknown"
    for cls, name in ((SlidingWindowMLA, "sliding_window_mla"), (MLA, "mla_attention"),
                      (SinkFullAttention, "sink_full_attention"),
                      (FullAttention, "full_attention"),
                      (ChunkedLocal, "chunked_local_attention"),
                      (SlidingWindow, "sliding_window"), (MambaState, "mamba"),
                      (EncoderOnly, "encoder_only_attention"),
                      (CrossAttention, "cross_attention")):
        if isinstance(spec, cls):
            return name
    return "unknown"


def sliding_window_of(spec: LayerSpec) -> int | None:
    if isinstance(spec, UniformType):
        windows = {sliding_window_of(s) for _, s in spec.members}
        return windows.pop() if len(windows) == 1 else None
    if isinstance(spec, SlidingWindow):
        return spec.sliding_window
    return None


# ---------------------------------------------------------------------------
# round trip through artifacts
# ---------------------------------------------------------------------------

_ALL_KINDS: tuple[type[LayerSpec], ...] = (
    FullAttention, MLA, HiddenState, RSWA, SinkFullAttention, ChunkedLocal, SlidingWindow,
    DraftSlidingWindow, CircularBuffer, SlidingWindowMLA, KpoolTail, EncoderOnly,
    CrossAttention, MambaState, UniformType)

#: kvspec kind name -> spec class.
SPEC_KINDS: dict[str, type[LayerSpec]] = {cls.kind: cls for cls in _ALL_KINDS}


def spec_from_dict(data: dict[str, Any]) -> LayerSpec:
    """Rebuild a spec from :meth:`LayerSpec.describe` output.

    >>> f = FullAttention(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16")
    >>> spec_from_dict(f.describe()) == f
    True
    """
    cls = SPEC_KINDS[data["kind"]]
    if cls is UniformType:
        members = tuple((n, spec_from_dict(s)) for n, s in data["kv_cache_specs"].items())
        return UniformType(block_size=data["block_size"], members=members)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        key = "num_heads" if f.name == "num_heads_" else f.name
        if key not in data:
            continue
        value = data[key]
        if f.name == "shapes":
            value = tuple(tuple(s) for s in value)
        elif f.name == "dtypes":
            value = tuple(value)
        elif f.name == "tokens_per_state" and isinstance(value, str):
            frac = Fraction(value)
            value = int(frac) if frac.denominator == 1 else frac
        elif f.name == "mamba_type":
            rev = {v: k for k, v in MAMBA_TYPES.items()}
            value = rev.get(value, value)
        kwargs[f.name] = value
    spec = cls(**kwargs)
    # Alignment padding is recomputed by __post_init__; an explicit pad wins.
    if data.get("page_size_padded") is not None and getattr(spec, "page_size_padded", None) != data["page_size_padded"]:
        object.__setattr__(spec, "page_size_padded", data["page_size_padded"])
    return spec
