"""Page math and per-request memory of every layer kind, from hand-derived numbers
(the kinds the conformance cases do not cover are checked here)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from kvspec.model.engine import Engine
from kvspec.model.kinds import describe, spec_from_dict
from kvspec.model.specs import (
    MLA,
    RSWA,
    ChunkedLocal,
    CircularBuffer,
    CrossAttention,
    EncoderOnly,
    FullAttention,
    KpoolTail,
    LayerSpec,
    MambaState,
    MergeConflict,
    SinkFullAttention,
    SlidingWindow,
    SlidingWindowMLA,
    UniformType,
)
from kvspec.model.specs.state import (
    mamba_prefill_checkpoint_position,
    mamba_prefill_checkpoint_valid,
)
from kvspec.planner.group import group_layers

# 2048 batched tokens x 2 batches (async scheduling on one stage) = 4096 in flight
E = Engine(block_size=16, max_model_len=8192, max_num_batched_tokens=2048,
           max_num_encoder_input_tokens=1500)
ATTN = dict(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16")
PAGE = 8 * 16 * 256 * 2  # 65536


def test_in_flight_tokens() -> None:
    assert E.max_in_flight_tokens == 4096
    assert (
        Engine(max_num_batched_tokens=2048, pipeline_parallel_size=2).max_in_flight_tokens == 4096
    )
    assert Engine(max_num_batched_tokens=2048, async_scheduling=False).max_in_flight_tokens == 2048


def test_full_attention() -> None:
    s = FullAttention(**ATTN)
    assert s.page_size_bytes == PAGE
    assert s.max_memory_usage_bytes(E) == 512 * PAGE          # 8192 / 16 blocks
    dcp = Engine(block_size=16, max_model_len=8192, decode_context_parallel_size=2)
    assert s.max_memory_usage_bytes(dcp) == 256 * PAGE
    assert s.max_num_blocks_per_req(dcp, 8192) == 256


def test_sliding_window_holds_window_plus_in_flight_plus_one() -> None:
    s = SlidingWindow(**ATTN, sliding_window=1024)
    # min(1023 + 4096, 8192) = 5119 tokens -> 320 blocks, +1 for a window not block-aligned
    assert s.max_memory_usage_bytes(E) == 321 * PAGE


def test_chunked_local() -> None:
    s = ChunkedLocal(**ATTN, attention_chunk_size=1024)
    assert s.max_memory_usage_bytes(E) == 320 * PAGE          # min(1024 + 4096, 8192) / 16


def test_cross_and_encoder_only() -> None:
    assert CrossAttention(**ATTN).max_memory_usage_bytes(E) == 94 * PAGE   # cdiv(1500, 16)
    assert EncoderOnly(**ATTN).max_memory_usage_bytes(E) == 0


def test_ring_kinds_hold_one_block_and_are_not_prefix_cached() -> None:
    ring = CircularBuffer(**ATTN)
    tail = KpoolTail(**{**ATTN, "block_size": 64}, sliding_window=64)
    for s in (ring, tail):
        assert s.max_num_blocks_per_req(E, 8192) == 1
        assert s.max_memory_usage_bytes(E) == s.page_size_bytes
        assert not s.prefix_cacheable and not s.uses_slot_mapping


def test_sliding_window_mla_bounded_replay() -> None:
    s = SlidingWindowMLA(block_size=16, num_kv_heads=1, head_size=576, dtype="bfloat16",
                         sliding_window=1024, bounded_replay=True)
    assert s.page_size_bytes == 16 * 576 * 2                  # no separate V
    assert not s.prefix_cacheable and s.prefix_replay_tokens == 1024


def test_mla_alignment_pads_the_page() -> None:
    s = MLA(block_size=16, num_kv_heads=1, head_size=576, dtype="bfloat16", alignment=4096)
    assert s.unpadded_page_size_bytes == 18432 and s.page_size_bytes == 20480


def test_fractional_tokens_per_state() -> None:
    s = FullAttention(**ATTN, tokens_per_state=Fraction(1, 2))
    assert s.num_states == 32 and s.page_size_bytes == 2 * PAGE
    assert spec_from_dict(describe(s)) == s


def test_sink_and_rswa_merge() -> None:
    sink = SinkFullAttention(**ATTN, sink_len=4)
    assert SinkFullAttention.merge([sink, sink]) == sink
    a, b = RSWA(**ATTN, rswa_window=512), RSWA(**ATTN, rswa_window=256)
    with pytest.raises(MergeConflict, match="rswa_window"):
        RSWA.merge([a, b])


@pytest.mark.parametrize("mode,blocks", [("none", 1 + 1), ("align", 2 + 1 + 2),
                                         ("all", 8192 // 256 + 1)])
def test_mamba_modes(mode: str, blocks: int) -> None:
    s = MambaState(block_size=256, shapes=((3, 1024), (8, 64, 64)),
                   dtypes=("bfloat16", "float32"), num_speculative_blocks=1,
                   num_prefill_checkpoint_blocks=2)
    page = 3 * 1024 * 2 + 8 * 64 * 64 * 4
    assert s.page_size_bytes == page
    engine = Engine(block_size=16, max_model_len=8192, mamba_cache_mode=mode)
    assert s.max_memory_usage_bytes(engine) == blocks * page


def test_mamba_prefill_checkpoints() -> None:
    assert mamba_prefill_checkpoint_position(1000, 256, drop_eagle_block=True) == 512
    assert mamba_prefill_checkpoint_position(100, 256, drop_eagle_block=True) == 0
    assert not mamba_prefill_checkpoint_valid(0, 2048, 1024, 256, 512, None)
    assert not mamba_prefill_checkpoint_valid(100, 2048, 1024, 256, 512, 256)  # unaligned start


def test_uniform_type_page_is_the_sum() -> None:
    mla = MLA(block_size=64, num_kv_heads=1, head_size=576, dtype="uint8", state_content_bytes=656)
    idx = MLA(block_size=64, num_kv_heads=1, head_size=128, dtype="uint8",
              state_content_bytes=132, tokens_per_state=4)
    u = UniformType.of({"a": mla, "i": idx})
    assert u is not None and u.page_size_bytes == 64 * 656 + 16 * 132


#: request_blocks: (spec, blocks one request at E.max_model_len takes) -- the one rule
#: every caller (plan groups, separate pools, state slots, pooling figures) uses.
REQUEST_BLOCKS = [
    (FullAttention(**ATTN), 512),                                   # 8192 / 16
    (SlidingWindow(**ATTN, sliding_window=1024), 321),              # (1023 + 4096) / 16 + 1
    (ChunkedLocal(**ATTN, attention_chunk_size=1024), 320),         # (1024 + 4096) / 16
    (CrossAttention(**ATTN), 94),                                   # cdiv(1500, 16)
    (MambaState(block_size=256, shapes=((3, 1024),), dtypes=("bfloat16",)), 1),
]


@pytest.mark.parametrize("spec,blocks", REQUEST_BLOCKS)
def test_request_blocks(spec: object, blocks: int) -> None:
    assert spec.request_blocks(E) == blocks  # type: ignore[attr-defined]


def test_uniform_type_request_blocks_is_its_largest_members() -> None:
    mla = MLA(block_size=64, num_kv_heads=1, head_size=576, dtype="uint8", state_content_bytes=656)
    idx = MLA(block_size=64, num_kv_heads=1, head_size=128, dtype="uint8",
              state_content_bytes=132, tokens_per_state=4)
    u = UniformType.of({"a": mla, "i": idx})
    assert u is not None and u.request_blocks(E) == mla.request_blocks(E) == 128  # 8192 / 64
    assert u.max_memory_usage_bytes(E) == 128 * u.page_size_bytes


def test_mtp_drafter_group_is_annotated() -> None:
    f = FullAttention(**ATTN)
    w = SlidingWindow(**ATTN, sliding_window=1024)
    specs = {"l0": w, "l1": f, "l2": w, "l3": f, "mtp": f}
    groups = group_layers(Engine(speculative_method="mtp"), specs)
    # 2 sliding + 3 full -> groups of 2: (l0, l2), (l1, mtp), (l3,) + a padding slot
    assert [g.is_eagle for g in groups] == [False, True, False]
    assert not any(g.is_eagle for g in group_layers(Engine(), specs))


#: Each kind's merge family and the class it buckets with (the reference's
#: ``is_uniform_type``), as the kinds declare them (``family``, ``bucket_by``).
FAMILIES = [
    (FullAttention, FullAttention, FullAttention, ()),
    (SinkFullAttention, FullAttention, FullAttention, ()),
    (RSWA, RSWA, FullAttention, ()),
    (MLA, MLA, FullAttention, ()),
    (SlidingWindowMLA, SlidingWindowMLA, SlidingWindowMLA, ("sliding_window",
                                                           "bounded_replay")),
    (SlidingWindow, None, SlidingWindow, ("sliding_window",)),
    (ChunkedLocal, None, ChunkedLocal, ("attention_chunk_size",)),
    (KpoolTail, None, KpoolTail, ()),
    (CircularBuffer, None, CircularBuffer, ()),
    (EncoderOnly, None, EncoderOnly, ()),
    (CrossAttention, None, CrossAttention, ()),
    (MambaState, None, MambaState, ("num_speculative_blocks", "num_prefill_checkpoint_blocks",
                                    "prefill_checkpoint_alignment", "page_size_bytes",
                                    "tp_replicated")),
]


@pytest.mark.parametrize(("kind", "family", "buckets_with", "fields"), FAMILIES,
                         ids=[k.__name__ for k, *_ in FAMILIES])
def test_merge_family_and_bucket_are_declared(kind: type[LayerSpec], family: type | None,
                                              buckets_with: type, fields: tuple[str, ...]
                                              ) -> None:
    assert kind.merge_family() is family
    assert kind.bucket_by == fields
    assert next(c for c in kind.__mro__ if "bucket_by" in vars(c)) is buckets_with


def test_a_kind_without_a_bucketing_rule_says_so() -> None:
    with pytest.raises(MergeConflict, match="no bucketing rule for UniformType"):
        UniformType(block_size=16, members=()).same_type_as_all([])
