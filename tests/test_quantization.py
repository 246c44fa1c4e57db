"""Tests of kvspec.model.quant: mode mapping, page math, rejections, properties."""

from __future__ import annotations

import json
import math
import re
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvspec.errors import KvspecError
from kvspec.model.dtypes import DTYPE_SIZES
from kvspec.model.quant import (
    FORMATS,
    KV_CACHE_DTYPES,
    KVQuantMode,
    LayerQuant,
    QuantizationError,
    ScaleTensor,
    format_for,
    formats_of_mode,
    layer_quant,
    quant_mode,
)
from kvspec.model.quant.formats import TurboQuant
from kvspec.model.specs import MLA, FullAttention
from tests.conftest import CONFORMANCE, REFERENCE

REPO = Path(__file__).resolve().parents[1]

LLAMA = dict(kind="attention", head_size=128, head_size_v=128, num_kv_heads=8)
DSV3 = dict(kind="mla", head_size=576, head_size_v=0, num_kv_heads=1)


def resolve(s: str, *, model_dtype: str = "bfloat16", block_size: int = 16, **shape):
    return layer_quant(s, model_dtype=model_dtype, block_size=block_size, **shape)


def spec_of(q: LayerQuant, *, block_size: int = 16, tokens_per_state=1, num_kv_heads: int,
         head_size: int, head_size_v: int, **_: object):
    """The layer spec a resolved quantization gives: the page math is the spec's."""
    cls = MLA if head_size_v == 0 else FullAttention
    return cls(block_size=block_size, num_kv_heads=num_kv_heads, head_size=head_size,
               head_size_v=head_size_v, dtype=q.dtype, tokens_per_state=tokens_per_state,
               state_content_bytes=q.state_content_bytes, num_head_slots=q.num_head_slots,
               kv_quant_mode=int(q.mode))


def page(q: LayerQuant, **shape) -> int:
    return spec_of(q, **shape).page_size_bytes


def scale_bytes_per_block(q: LayerQuant) -> int:
    return sum(t.bytes_per_block for t in q.scales)


def bytes_per_token(q: LayerQuant, *, block_size: int, **shape) -> Fraction:
    return Fraction(page(q, block_size=block_size, **shape) + scale_bytes_per_block(q),
                    block_size)


# ---------------------------------------------------------------------------
# Mode enum and string mapping
# ---------------------------------------------------------------------------

REFERENCE_VALUES = {
    "NONE": 0,
    "FP8_PER_TENSOR": 1,
    "INT8_PER_TOKEN_HEAD": 2,
    "FP8_PER_TOKEN_HEAD": 3,
    "INT4_PER_TOKEN_HEAD": 4,
    "NVFP4": 5,
    "TURBOQUANT_K8V4": 6,
    "TURBOQUANT_4BIT_NC": 7,
    "TURBOQUANT_K3V4_NC": 8,
    "TURBOQUANT_3BIT_NC": 9,
    "NVFP4_DS_MLA": 10,
}


def test_enum_values_equal_the_reference():
    assert {m.name: int(m) for m in KVQuantMode} == REFERENCE_VALUES


@pytest.mark.skipif(not REFERENCE.exists(), reason="reference text not present")
def test_enum_values_parsed_from_the_reference_text():
    text = REFERENCE.read_text()
    block = text[text.index("class KVQuantMode(IntEnum):") : text.index("def is_per_token_head")]
    parsed = {m: int(v) for m, v in re.findall(r"^\s+([A-Z0-9_]+) = (\d+)", block, re.MULTILINE)}
    assert parsed == REFERENCE_VALUES


MAPPING = {
    # exact names first
    "int4_per_token_head": KVQuantMode.INT4_PER_TOKEN_HEAD,
    "int8_per_token_head": KVQuantMode.INT8_PER_TOKEN_HEAD,
    "fp8_per_token_head": KVQuantMode.FP8_PER_TOKEN_HEAD,  # before the fp8 prefix
    "nvfp4_ds_mla": KVQuantMode.NVFP4_DS_MLA,  # before the nvfp4 prefix
    "nvfp4": KVQuantMode.NVFP4,
    "nvfp4_4over6": KVQuantMode.NVFP4,  # prefix
    "nvfp4_ds_mla_v2": KVQuantMode.NVFP4,  # only the exact string is DS-MLA
    "nvfp4x": KVQuantMode.NVFP4,
    "turboquant_k8v4": KVQuantMode.TURBOQUANT_K8V4,
    "turboquant_4bit_nc": KVQuantMode.TURBOQUANT_4BIT_NC,
    "turboquant_k3v4_nc": KVQuantMode.TURBOQUANT_K3V4_NC,
    "turboquant_3bit_nc": KVQuantMode.TURBOQUANT_3BIT_NC,
    "fp8": KVQuantMode.FP8_PER_TENSOR,
    "fp8_e4m3": KVQuantMode.FP8_PER_TENSOR,
    "fp8_e5m2": KVQuantMode.FP8_PER_TENSOR,
    "fp8_inc": KVQuantMode.FP8_PER_TENSOR,
    "fp8_ds_mla": KVQuantMode.FP8_PER_TENSOR,  # prefix rule, not a mode of its own
    "fp8_per_token_head_x": KVQuantMode.FP8_PER_TENSOR,  # not exact -> prefix
    "fp8anything": KVQuantMode.FP8_PER_TENSOR,
    "auto": KVQuantMode.NONE,
    "bfloat16": KVQuantMode.NONE,
    "float16": KVQuantMode.NONE,
    "int8": KVQuantMode.NONE,
    "int4": KVQuantMode.NONE,
    "": KVQuantMode.NONE,
    "FP8": KVQuantMode.NONE,  # case-sensitive
    "TURBOQUANT_K8V4": KVQuantMode.NONE,
    "NVFP4": KVQuantMode.NONE,
    "xfp8": KVQuantMode.NONE,
    "int4_per_token_head ": KVQuantMode.NONE,
}


@pytest.mark.parametrize("s,mode", sorted(MAPPING.items()))
def test_string_to_mode(s, mode):
    assert quant_mode(s) is mode


def test_every_accepted_string_maps_to_its_format_mode():
    assert len(KV_CACHE_DTYPES) == len(set(KV_CACHE_DTYPES)) == 18
    for s in KV_CACHE_DTYPES:
        assert quant_mode(s) == format_for(s).mode


def test_every_mode_has_a_format():
    for mode in KVQuantMode:
        assert formats_of_mode(mode), mode
    assert {f.name for f in formats_of_mode(KVQuantMode.FP8_PER_TENSOR)} == {
        "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla"}


def test_mode_predicates():
    pth = {m for m in KVQuantMode if m.is_per_token_head}
    assert pth == {KVQuantMode.INT8_PER_TOKEN_HEAD, KVQuantMode.FP8_PER_TOKEN_HEAD,
                   KVQuantMode.INT4_PER_TOKEN_HEAD}
    assert {m for m in KVQuantMode if m.is_nvfp4} == {KVQuantMode.NVFP4}
    assert {m for m in KVQuantMode if m.is_turboquant} == {
        KVQuantMode.TURBOQUANT_K8V4, KVQuantMode.TURBOQUANT_4BIT_NC,
        KVQuantMode.TURBOQUANT_K3V4_NC, KVQuantMode.TURBOQUANT_3BIT_NC}
    assert not KVQuantMode.NONE.is_quantized and KVQuantMode.NVFP4_DS_MLA.is_quantized


def test_unknown_turboquant_and_non_strings():
    with pytest.raises(QuantizationError, match="TurboQuant"):
        quant_mode("turboquant_2bit")
    with pytest.raises(TypeError):
        quant_mode(None)  # type: ignore[arg-type]


def _reference_get_kv_quant_mode():
    """The reference's own mapping function, executed against its own enum."""
    text = REFERENCE.read_text()
    start = text.index("def get_kv_quant_mode")
    end = text.index("def is_quantized_kv_cache")
    ns: dict = {}
    enum_block = text[text.index("class KVQuantMode(IntEnum):") : text.index("    @property")]
    exec("from enum import IntEnum\n" + enum_block, ns)  # the spec under test
    exec(text[start:end], ns)
    return ns["get_kv_quant_mode"]


_ALPHABET = st.sampled_from(list("fp8_nvf4ds mlaturboqk3v2chintekdeau") + ["fp8", "nvfp4",
                            "turboquant_", "_per_token_head", "_ds_mla", "int4", "int8"])


@pytest.mark.skipif(not REFERENCE.exists(), reason="reference text not present")
@settings(max_examples=400, deadline=None)
@given(st.lists(_ALPHABET, max_size=6).map("".join))
def test_mapping_agrees_with_the_reference_function(s):
    ref = _reference_get_kv_quant_mode()
    try:
        expected = ref(s)
    except KeyError:  # the reference fails on unknown turboquant_* names
        with pytest.raises(QuantizationError):
            quant_mode(s)
        return
    assert int(quant_mode(s)) == int(expected)


@pytest.mark.skipif(not REFERENCE.exists(), reason="reference text not present")
def test_known_strings_agree_with_the_reference_function():
    ref = _reference_get_kv_quant_mode()
    for s in list(KV_CACHE_DTYPES) + [k for k in MAPPING if not k.startswith("turboquant_2")]:
        assert int(quant_mode(s)) == int(ref(s)), s


# ---------------------------------------------------------------------------
# Page sizes against the documented formulas
# ---------------------------------------------------------------------------

# (kv_cache_dtype, dtype, C, H-slots, bytes/token) for 8 KV heads × 128, block 16, bf16 model
ATTENTION_EXPECTED = {
    "auto": ("bfloat16", None, None, 8 * 256 * 2),
    "bfloat16": ("bfloat16", None, None, 4096),
    "float16": ("float16", None, None, 4096),
    "fp8": ("float8_e4m3fn", None, None, 8 * 256),
    "fp8_e4m3": ("float8_e4m3fn", None, None, 2048),
    "fp8_e5m2": ("float8_e5m2", None, None, 2048),
    "fp8_inc": ("float8_e4m3fn", None, None, 2048),
    # (hs + hv) × 1 + 2 × fp32 scale per (token, head)
    "int8_per_token_head": ("int8", 264, None, 8 * 264),
    "fp8_per_token_head": ("float8_e4m3fn", 264, None, 8 * 264),
    # hs/2 + hv/2 + 8
    "int4_per_token_head": ("uint8", 136, None, 8 * 136),
    # 2H slots × (hs/2 + hs/16)
    "nvfp4": ("uint8", 72, 16, 16 * 72),
    "nvfp4_4over6": ("uint8", 72, 16, 16 * 72),
    # TurboQuantConfig.slot_size_aligned at head_dim 128 (vLLM's own test table)
    "turboquant_k8v4": ("uint8", 196, None, 8 * 196),
    "turboquant_4bit_nc": ("uint8", 134, None, 8 * 134),
    "turboquant_k3v4_nc": ("uint8", 118, None, 8 * 118),
    "turboquant_3bit_nc": ("uint8", 102, None, 8 * 102),
}

# 576-dim MLA latent, 1 head, block 64
MLA_EXPECTED = {
    "auto": ("bfloat16", None, 1152),
    "bfloat16": ("bfloat16", None, 1152),
    "float16": ("float16", None, 1152),
    "fp8": ("float8_e4m3fn", None, 576),
    "fp8_e4m3": ("float8_e4m3fn", None, 576),
    "fp8_e5m2": ("float8_e5m2", None, 576),
    "fp8_inc": ("float8_e4m3fn", None, 576),
    "fp8_ds_mla": ("uint8", 656, 656),  # 512 e4m3 + 4 × fp32 + 64 × bf16
    "nvfp4_ds_mla": ("uint8", 352, 352),  # 256 e2m1 + 64 e4m3 RoPE + 32 e4m3 scales
}


def test_tables_cover_every_string():
    assert set(ATTENTION_EXPECTED) | set(MLA_EXPECTED) == set(KV_CACHE_DTYPES)


@pytest.mark.parametrize("s", sorted(ATTENTION_EXPECTED))
def test_attention_page_sizes(s):
    dtype, c, slots, bpt = ATTENTION_EXPECTED[s]
    q = resolve(s, **LLAMA)
    assert (q.dtype, q.state_content_bytes, q.num_head_slots) == (dtype, c, slots)
    assert q.mode == quant_mode(s) and q.kv_cache_dtype == s and q.scales == ()
    assert page(q, **LLAMA) == 16 * bpt
    assert (
        bytes_per_token(q, block_size=16, **{k: v for k, v in LLAMA.items() if k != "kind"}) == bpt
    )


@pytest.mark.parametrize("s", sorted(MLA_EXPECTED))
def test_mla_page_sizes(s):
    dtype, c, bpt = MLA_EXPECTED[s]
    q = resolve(s, block_size=64, **DSV3)
    assert (q.dtype, q.state_content_bytes, q.num_head_slots) == (dtype, c, None)
    assert page(q, block_size=64, **DSV3) == 64 * bpt


@pytest.mark.parametrize("s", sorted(ATTENTION_EXPECTED))
@pytest.mark.parametrize("hs,h", [(64, 2), (128, 4), (256, 8)])
def test_attention_formulas_other_shapes(s, hs, h):
    bs = 32
    q = resolve(s, kind="attention", head_size=hs, head_size_v=hs, num_kv_heads=h, block_size=bs)
    got = page(q, block_size=bs, head_size=hs, head_size_v=hs, num_kv_heads=h)
    fmt = format_for(s)
    if fmt.name in ("auto", "explicit", "fp8_e4m3", "fp8_e5m2", "fp8_inc"):
        want = h * bs * 2 * hs * DTYPE_SIZES[q.dtype]
    elif fmt.name in ("int8_per_token_head", "fp8_per_token_head"):
        want = h * bs * (2 * hs + 8)
    elif fmt.name == "int4_per_token_head":
        want = h * bs * (hs + 8)
    elif fmt.name == "nvfp4":
        want = 2 * h * bs * (hs // 2 + hs // 16)
    else:
        assert isinstance(fmt, TurboQuant) and fmt.mode.is_turboquant
        key = hs if fmt.k_bits == 8 else math.ceil(hs * fmt.k_bits / 8) + 2
        slot = key + math.ceil(hs * fmt.v_bits / 8) + 4
        want = h * bs * (slot + slot % 2)
    assert got == want


def test_turboquant_slot_sizes_match_vllm_for_other_head_dims():
    # vLLM tests: tq_slot_size 262 for 4bit_nc at 256, 518 at 512
    for hs, slot in [(256, 262), (512, 518)]:
        q = resolve("turboquant_4bit_nc", kind="attention", head_size=hs, head_size_v=hs,
                    num_kv_heads=2)
        assert q.state_content_bytes == slot


def test_fp8_ds_mla_indexer_and_override():
    q = resolve("fp8_ds_mla", kind="mla", head_size=128, head_size_v=0, num_kv_heads=1,
                block_size=64)
    assert q.state_content_bytes == 132 and q.dtype == "uint8"
    assert page(q, block_size=64, head_size=128, head_size_v=0, num_kv_heads=1) == 8448
    # one stored state per 4 tokens (compressed indexer), block 512
    assert page(q, block_size=512, tokens_per_state=4, head_size=128, head_size_v=0,
                num_kv_heads=1) == 16896
    # DeepSeek-V4 record: explicit override
    q4 = resolve("fp8_ds_mla", kind="mla", head_size=512, head_size_v=0, num_kv_heads=1,
                 state_content_bytes=584)
    assert q4.state_content_bytes == 584 and q4.mode is KVQuantMode.FP8_PER_TENSOR


def test_override_num_head_slots_and_cell():
    q = resolve("auto", state_content_bytes=4096, num_head_slots=2, **LLAMA)
    assert page(q, **LLAMA) == 2 * 16 * 4096


def test_tokens_per_state_fraction_and_nonpositive():
    q = resolve("auto", **LLAMA)
    assert page(q, tokens_per_state=Fraction(1, 4), **LLAMA) == 4 * page(q, **LLAMA)
    assert page(q, tokens_per_state=-1, **LLAMA) == page(q, block_size=1, **LLAMA)


def test_state_content_size_bytes_matches_reference_rule():
    q = resolve("fp8", **LLAMA)
    assert spec_of(q, **LLAMA).state_content_size_bytes == 256
    q = resolve("nvfp4", **LLAMA)
    assert spec_of(q, **LLAMA).state_content_size_bytes == 72


def test_auto_follows_the_model_dtype():
    for mdt, size in [("float16", 2), ("bfloat16", 2), ("float32", 4), ("torch.bfloat16", 2),
                      ("bf16", 2)]:
        q = resolve("auto", model_dtype=mdt, **LLAMA)
        assert DTYPE_SIZES[q.dtype] == size
    assert resolve("float16", model_dtype="bfloat16", **LLAMA).dtype == "float16"


def test_fp8_matches_the_mixed_precision_conformance_numbers():
    q = resolve("fp8", kind="sliding_window", head_size=96, head_size_v=96, num_kv_heads=8)
    assert q.dtype == "float8_e4m3fn" and q.state_content_bytes is None
    assert page(q, head_size=96, head_size_v=96, num_kv_heads=8) == 24576
    bf = resolve("auto", kind="full_attention", head_size=128, head_size_v=128, num_kv_heads=4)
    assert page(bf, head_size=128, head_size_v=128, num_kv_heads=4) == 32768
    assert {(x.dtype, x.mode) for x in (q, bf)} != {(q.dtype, q.mode)}


def test_per_token_head_separate_scales():
    for s in ("int8_per_token_head", "fp8_per_token_head", "int4_per_token_head"):
        inc = resolve(s, **LLAMA)
        sep = resolve(s, per_token_head_scales="separate", **LLAMA)
        assert inc.scale_placement == "in_cell" and sep.scale_placement == "separate"
        assert sep.scales == (ScaleTensor("k_scale", "float32", (16, 8)),
                              ScaleTensor("v_scale", "float32", (16, 8)))
        assert scale_bytes_per_block(sep) == 2 * 16 * 8 * 4
        assert page(sep, **LLAMA) + scale_bytes_per_block(sep) == page(inc, **LLAMA)
        assert bytes_per_token(sep, block_size=16, head_size=128, head_size_v=128,
                               num_kv_heads=8) == page(inc, **LLAMA) // 16


def test_layer_quant_is_frozen_and_hashable():
    q = resolve("nvfp4", **LLAMA)
    with pytest.raises(AttributeError):
        q.dtype = "int8"  # type: ignore[misc]
    assert hash(q) == hash(resolve("nvfp4", **LLAMA))
    assert q.per_tensor_scales and q.format_name == "nvfp4"


def test_records_are_complete_and_documented():
    doc = DOC.read_text()
    for f in FORMATS:
        assert f.kv_cache_dtypes and f.applies_to and f.families
        assert f.scale_placement in ("none", "per_tensor", "in_cell", "separate")
        # the prose (cell layout, scales, vLLM sources) lives in docs/quantization.md
        heading = "### " + ", ".join(f"`{s}`" for s in f.kv_cache_dtypes)
        assert heading in doc, heading


# ---------------------------------------------------------------------------
# Rejections
# ---------------------------------------------------------------------------

REJECTIONS = [
    ("nvfp4_ds_mla", dict(LLAMA), "MLA layers only"),
    ("fp8_ds_mla", dict(LLAMA), "MLA layers only"),
    ("int8_per_token_head", dict(DSV3), "does not apply to MLA"),
    ("fp8_per_token_head", dict(DSV3), "does not apply to MLA"),
    ("int4_per_token_head", dict(DSV3), "does not apply to MLA"),
    ("nvfp4", dict(DSV3), "does not apply to MLA"),
    ("nvfp4_4over6", dict(DSV3), "does not apply to MLA"),
    ("turboquant_k8v4", dict(DSV3), "does not apply to MLA"),
    ("turboquant_3bit_nc", dict(DSV3), "does not apply to MLA"),
    ("int8", dict(LLAMA), "unknown kv_cache_dtype"),
    ("fp8_e4m3fn", dict(LLAMA), "unknown kv_cache_dtype"),
    ("auto", dict(LLAMA, kind="mamba"), "unknown layer kind"),
    ("auto", dict(DSV3, head_size_v=576), "head_size_v must be 0"),
    ("auto", dict(LLAMA, head_size_v=0), "head_size_v > 0"),
    ("auto", dict(LLAMA, head_size=0), "head_size must be positive"),
    ("auto", dict(LLAMA, num_kv_heads=0), "num_kv_heads must be positive"),
    ("nvfp4", dict(LLAMA, head_size=72, head_size_v=72), "multiple of 16"),
    ("nvfp4", dict(LLAMA, head_size_v=64), "equal K and V"),
    ("int4_per_token_head", dict(LLAMA, head_size=36, head_size_v=36), "multiple of 8"),
    ("int8_per_token_head", dict(LLAMA, head_size=18, head_size_v=18), "multiple of 4"),
    ("fp8_per_token_head", dict(LLAMA, head_size_v=64), "equal K and V"),
    ("turboquant_4bit_nc", dict(LLAMA, head_size=96, head_size_v=96), "power of two"),
    ("turboquant_4bit_nc", dict(LLAMA, head_size_v=64), "equal K and V"),
    ("turboquant_k8v4", dict(LLAMA, head_size=512, head_size_v=512), "<= 256"),
    ("turboquant_k8v4", dict(LLAMA, kind="cross_attention"), "does not support"),
    ("turboquant_4bit_nc", dict(LLAMA, kind="encoder_only"), "does not support"),
    ("fp8_ds_mla", dict(DSV3, head_size=512), "no record size"),
    ("fp8_ds_mla", dict(DSV3, num_kv_heads=2), "num_kv_heads must be 1"),
    ("nvfp4_ds_mla", dict(DSV3, head_size=512), "576-dim"),
    ("nvfp4_ds_mla", dict(DSV3, kind="sliding_window_mla"), "does not support"),
]


@pytest.mark.parametrize("s,shape,match", REJECTIONS)
def test_rejections(s, shape, match):
    with pytest.raises(QuantizationError, match=re.escape(match)) as info:
        resolve(s, **shape)
    err = info.value
    assert isinstance(err, ValueError) and isinstance(err, KvspecError)
    assert err.message and (err.hint or err.expected)


@pytest.mark.parametrize("s,mdt", [
    ("fp8_ds_mla", "float16"),
    ("nvfp4_ds_mla", "float32"),
])
def test_ds_mla_needs_bf16(s, mdt):
    with pytest.raises(QuantizationError, match="bfloat16"):
        resolve(s, model_dtype=mdt, block_size=64, **DSV3)


@pytest.mark.parametrize("s", ["turboquant_k8v4", "nvfp4"])
def test_float32_models_rejected_where_backends_need_16_bit(s):
    with pytest.raises(QuantizationError, match="float16 or bfloat16"):
        resolve(s, model_dtype="float32", **LLAMA)


@pytest.mark.parametrize("mdt", ["int8", "float8_e4m3fn", "nope"])
def test_bad_model_dtypes(mdt):
    with pytest.raises(QuantizationError):
        resolve("auto", model_dtype=mdt, **LLAMA)


def test_bad_option_values():
    with pytest.raises(QuantizationError):
        resolve("int8_per_token_head", per_token_head_scales="beside", **LLAMA)  # type: ignore[arg-type]
    with pytest.raises(QuantizationError):
        resolve("auto", state_content_bytes=0, **LLAMA)
    with pytest.raises(QuantizationError):
        resolve("auto", block_size=0, **LLAMA)


def test_error_renders_with_hint():
    with pytest.raises(QuantizationError) as info:
        resolve("int4_per_token_head", **DSV3)
    text = str(info.value)
    assert "error:" in text and "hint:" in text and "Triton" in text


@pytest.mark.parametrize("kind", ["full_attention", "sliding_window", "chunked_local",
                                  "sink_full_attention", "attention"])
def test_decoder_kinds_accept_turboquant(kind):
    """Accepted, and the same cell as on a plain attention layer."""
    q = resolve("turboquant_4bit_nc", **dict(LLAMA, kind=kind))
    assert q.mode == KVQuantMode.TURBOQUANT_4BIT_NC and q.dtype == "uint8"
    assert q == resolve("turboquant_4bit_nc", **LLAMA)


@pytest.mark.parametrize("kind", ["cross_attention", "encoder_only", "sliding_window"])
def test_per_token_head_and_nvfp4_accept_attention_kinds(kind):
    """Accepted, and the same cells as on a plain attention layer."""
    for mode in ("int8_per_token_head", "nvfp4"):
        q = resolve(mode, **dict(LLAMA, kind=kind))
        assert q.mode == quant_mode(mode)
        assert q == resolve(mode, **LLAMA)


# ---------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------

DENSE = [s for s in KV_CACHE_DTYPES if format_for(s).name in
         ("auto", "explicit", "fp8_e4m3", "fp8_e5m2", "fp8_inc")]
ATTN_STRINGS = sorted(ATTENTION_EXPECTED)
MLA_STRINGS = sorted(MLA_EXPECTED)


#: Bits of one stored K and V element (scales excluded), by format; None: the dtype's.
_BITS = {"int4_per_token_head": (4, 4), "nvfp4": (4, 4), "fp8_ds_mla": (8, 0),
         "nvfp4_ds_mla": (4, 0), "turboquant_k8v4": (8, 4), "turboquant_4bit_nc": (4, 4),
         "turboquant_k3v4_nc": (3, 4), "turboquant_3bit_nc": (3, 3)}


def _min_data_bits(q: LayerQuant, hs: int, hv: int, h: int) -> int:
    item = 8 * DTYPE_SIZES[q.dtype]
    kb, vb = _BITS.get(format_for(q.kv_cache_dtype).name, (item, item))
    return h * (hs * kb + hv * vb)


@settings(max_examples=300, deadline=None)
@given(
    s=st.sampled_from(DENSE),
    hs=st.integers(1, 1024),
    hv=st.integers(1, 1024),
    h=st.integers(1, 64),
    bs=st.integers(1, 2048),
    k=st.integers(1, 8),
    mdt=st.sampled_from(["float16", "bfloat16", "float32"]),
)
def test_dense_page_is_linear_in_block_size(s, hs, hv, h, bs, k, mdt):
    shape = dict(kind="attention", head_size=hs, head_size_v=hv, num_kv_heads=h)
    q = resolve(s, model_dtype=mdt, block_size=bs, **shape)
    p1 = page(q, block_size=bs, **shape)
    assert page(q, block_size=k * bs, **shape) == k * p1
    assert p1 == bs * page(q, block_size=1, **shape)
    assert p1 == h * bs * (hs + hv) * DTYPE_SIZES[q.dtype]
    assert 8 * p1 >= bs * _min_data_bits(q, hs, hv, h)


@settings(max_examples=300, deadline=None)
@given(
    s=st.sampled_from(ATTN_STRINGS),
    hs=st.sampled_from([32, 64, 128, 256]),
    h=st.integers(1, 64),
    bs=st.integers(1, 1024),
    k=st.integers(1, 8),
    sep=st.booleans(),
)
def test_every_attention_format_is_linear_and_holds_its_bits(s, hs, h, bs, k, sep):
    shape = dict(kind="attention", head_size=hs, head_size_v=hs, num_kv_heads=h)
    opts = {"per_token_head_scales": "separate"} if sep else {}
    q = resolve(s, block_size=bs, **opts, **shape)
    p = page(q, block_size=bs, **shape)
    assert page(q, block_size=k * bs, **shape) == k * p
    total = p + scale_bytes_per_block(q)
    assert 8 * total >= bs * _min_data_bits(q, hs, hs, h)
    fmt = format_for(s)
    if fmt.scale_placement == "in_cell" and not sep:
        # scales / norms take room beyond the data bits
        assert 8 * p > bs * _min_data_bits(q, hs, hs, h)


@settings(max_examples=100, deadline=None)
@given(s=st.sampled_from(MLA_STRINGS), bs=st.sampled_from([16, 64, 128, 512, 1024]),
       k=st.integers(1, 8))
def test_every_mla_format_is_linear_and_holds_its_bits(s, bs, k):
    q = resolve(s, block_size=bs, **DSV3)
    p = page(q, block_size=bs, **DSV3)
    assert page(q, block_size=k * bs, **DSV3) == k * p
    assert 8 * p >= bs * _min_data_bits(q, 576, 0, 1)


# ---------------------------------------------------------------------------
# Conformance cases: every attention layer's spec numbers
# ---------------------------------------------------------------------------

_CASE_KINDS = {
    "full_attention": "attention", "sliding_window": "attention", "chunked_local": "attention",
    "cross_attention": "attention", "encoder_only": "attention",
    "sink_full_attention": "attention", "mla": "mla", "sliding_window_mla": "mla",
}


def _conformance_layers():
    if not (CONFORMANCE / "cases").is_dir():
        return []
    out = []
    for case in sorted((CONFORMANCE / "cases").glob("*.json")):
        expected_file = CONFORMANCE / "expected" / case.name
        if not expected_file.exists():
            continue
        c = json.loads(case.read_text())
        specs = json.loads(expected_file.read_text()).get("input_specs") or {}
        for layer in c["layers"]:
            if layer.get("kind") in _CASE_KINDS and layer["name"] in specs:
                out.append(pytest.param(c["config"], layer, specs[layer["name"]],
                                        id=f"{case.stem}:{layer['name']}"))
    # one layer per distinct shape keeps the run short
    seen, unique = set(), []
    for p in out:
        cfg, layer, _ = p.values
        key = json.dumps([cfg.get("kv_cache_dtype"), {k: v for k, v in layer.items()
                                                       if k != "name"}], sort_keys=True)
        if key not in seen:
            seen.add(key)
            unique.append(p)
    return unique


@pytest.mark.parametrize("config,layer,spec", _conformance_layers())
def test_conformance_layer_specs(config, layer, spec):
    s = layer.get("cache_dtype_str") or config.get("kv_cache_dtype", "auto")
    family = _CASE_KINDS[layer["kind"]]
    hs = layer["head_size"]
    hv = 0 if family == "mla" else layer.get("head_size_v", hs)
    model_dtype = layer["dtype"] if quant_mode(s) is KVQuantMode.NONE else "bfloat16"
    q = layer_quant(
        s, model_dtype=model_dtype, kind=layer["kind"], head_size=hs, head_size_v=hv,
        num_kv_heads=layer["num_kv_heads"], block_size=spec["block_size"],
    )
    assert int(q.mode) == spec["kv_quant_mode"]
    assert q.dtype == spec["dtype"]
    tps = layer.get("tokens_per_state", 1)
    got = spec_of(q, num_kv_heads=layer["num_kv_heads"], head_size=hs,
                            head_size_v=hv, block_size=spec["block_size"],
                            tokens_per_state=Fraction(tps) if isinstance(tps, str) else tps)
    assert got.state_content_size_bytes == spec["state_content_size_bytes"]
    assert (q.num_head_slots or layer["num_kv_heads"]) == spec["num_heads"]
    assert got.unpadded_page_size_bytes == spec["unpadded_page_size_bytes"]


# ---------------------------------------------------------------------------
# The docs table is the module's numbers
# ---------------------------------------------------------------------------

DOC = REPO / "docs" / "quantization.md"


def _doc_table_rows():
    """The rows of the table the page's code prints (its ``output`` block): per
    kv_cache_dtype, ``[mode, llama, x, deepseek, x]`` with ``-`` where it does not apply."""
    text = DOC.read_text()
    section = text[text.index("## Bytes per token per layer"):]
    table = section.split("```output\n", 1)[1].split("```", 1)[0]
    rows = {}
    for line in table.splitlines()[1:]:
        m = re.match(r"(\S+)\s+(\S+ \(\d+\))\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)$", line)
        assert m, line
        rows[m.group(1)] = list(m.groups()[1:])
    return rows


@pytest.mark.skipif(not DOC.exists(), reason="docs/quantization.md not written")
def test_docs_table_matches_the_module():
    rows = _doc_table_rows()
    assert set(rows) == set(KV_CACHE_DTYPES)
    for s, cells in rows.items():
        mode_cell, llama_cell, _, ds_cell, _ = cells
        assert mode_cell == f"{quant_mode(s).name} ({int(quant_mode(s))})"
        for cell, shape, bs in ((llama_cell, LLAMA, 16), (ds_cell, DSV3, 64)):
            try:
                q = resolve(s, block_size=bs, **shape)
            except QuantizationError:
                assert cell == "-", (s, cell)
                continue
            want = bytes_per_token(q, block_size=bs, **{k: v for k, v in shape.items()
                                                       if k != "kind"})
            assert cell == str(want), (s, cell, want)
