"""KV-cache quantization: every ``kv_cache_dtype`` of the reference, as data.

This module is kvspec's single source of truth for how a quantized KV cache is
stored. It is torch-free: dtypes are torch's names without the ``torch.``
prefix, sizes come from :data:`kvspec.dtypes.DTYPE_SIZES`.

Three layers of knowledge live here:

1. :class:`KVQuantMode` and :func:`quant_mode` -- the reference's enum (same
   integer values) and its ``get_kv_quant_mode`` string mapping, with the same
   precedence (exact per-token-head names, then ``nvfp4_ds_mla``, then the
   ``nvfp4`` prefix, then ``turboquant_*``, then the ``fp8`` prefix, else NONE).
2. :data:`FORMATS` -- one frozen :class:`QuantFormat` record per storage
   format: the strings that select it, its mode, storage dtype, bits for K and
   V, where scales / zero points live, which layer kinds it applies to, its
   page-size formula and the vLLM source it was read from. A mode may have
   several formats (``FP8_PER_TENSOR`` covers e4m3, e5m2, Gaudi's fp8_inc and
   DeepSeek's 656-byte ``fp8_ds_mla`` record).
3. :func:`resolve_layer_quant` -- what one layer's page looks like under a
   ``kv_cache_dtype``: the view dtype, the packed cell size ``C``
   (``state_content_bytes``), the head-slot count ``H`` (``num_head_slots``)
   and any scale tensors kept apart from the data. :func:`page_size_bytes` is
   then the reference's ``H * N * C``.

The packing values the reference leaves to attention backends
(``AttentionSpec.num_head_slots`` / ``state_content_bytes``, published through
``AttentionBackend.customize_spec``) are taken from vLLM's backends; each
record cites file and function in ``source``. Where no authoritative value was
found the record says ``verified=False`` and why.

>>> quant_mode("nvfp4_ds_mla"), quant_mode("nvfp4"), quant_mode("fp8_ds_mla")
(<KVQuantMode.NVFP4_DS_MLA: 10>, <KVQuantMode.NVFP4: 5>, <KVQuantMode.FP8_PER_TENSOR: 1>)
>>> q = resolve_layer_quant("fp8", model_dtype="bfloat16", kind="attention",
...                         head_size=128, head_size_v=128, num_kv_heads=8, block_size=16)
>>> q.dtype, q.state_content_bytes, page_size_bytes(q, num_kv_heads=8, head_size=128,
...                                                  head_size_v=128, block_size=16)
('float8_e4m3fn', None, 32768)
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum
from fractions import Fraction
from typing import Literal

from kvspec.dtypes import DTYPE_SIZES, canonical_dtype
from kvspec.errors import KvspecError

__all__ = [
    "DTYPE_SIZES",
    "FORMATS",
    "KV_CACHE_DTYPES",
    "KVQuantMode",
    "LayerQuant",
    "QuantFormat",
    "QuantizationError",
    "ScaleTensor",
    "bytes_per_token",
    "format_for",
    "formats_of_mode",
    "is_mixed_precision",
    "page_size_bytes",
    "quant_mode",
    "resolve_layer_quant",
    "scale_bytes_per_block",
    "state_content_size_bytes",
]


class QuantizationError(KvspecError, ValueError):
    """A ``kv_cache_dtype`` that does not fit a layer (kind, dtype or shape)."""


# ---------------------------------------------------------------------------
# The reference's mode enum and string mapping
# ---------------------------------------------------------------------------


class KVQuantMode(IntEnum):
    """KV-cache quantization mode; values equal the reference's ``KVQuantMode``."""

    NONE = 0
    FP8_PER_TENSOR = 1
    INT8_PER_TOKEN_HEAD = 2
    FP8_PER_TOKEN_HEAD = 3
    INT4_PER_TOKEN_HEAD = 4
    NVFP4 = 5
    TURBOQUANT_K8V4 = 6
    TURBOQUANT_4BIT_NC = 7
    TURBOQUANT_K3V4_NC = 8
    TURBOQUANT_3BIT_NC = 9
    NVFP4_DS_MLA = 10

    @property
    def is_per_token_head(self) -> bool:
        return self in (
            KVQuantMode.INT8_PER_TOKEN_HEAD,
            KVQuantMode.FP8_PER_TOKEN_HEAD,
            KVQuantMode.INT4_PER_TOKEN_HEAD,
        )

    @property
    def is_nvfp4(self) -> bool:
        """True for NVFP4 only (not NVFP4_DS_MLA), as in the reference."""
        return self == KVQuantMode.NVFP4

    @property
    def is_turboquant(self) -> bool:
        return self in (
            KVQuantMode.TURBOQUANT_K8V4,
            KVQuantMode.TURBOQUANT_4BIT_NC,
            KVQuantMode.TURBOQUANT_K3V4_NC,
            KVQuantMode.TURBOQUANT_3BIT_NC,
        )

    @property
    def is_quantized(self) -> bool:
        return self != KVQuantMode.NONE


def quant_mode(kv_cache_dtype: str) -> KVQuantMode:
    """Map a ``kv_cache_dtype`` string to its mode, exactly as the reference does.

    The mapping is total over strings, like the reference's: anything that
    matches no rule (``"auto"``, ``"bfloat16"``, ``"int8"``, ``""``) is NONE.
    Matching is case-sensitive. Two deliberate differences, both on inputs the
    reference fails on: a non-string raises :class:`TypeError` (the reference
    raises ``AttributeError``), and an unknown ``turboquant_*`` name raises
    :class:`QuantizationError` (the reference raises ``KeyError``).

    >>> quant_mode("fp8_per_token_head"), quant_mode("fp8_e5m2"), quant_mode("int8")
    (<KVQuantMode.FP8_PER_TOKEN_HEAD: 3>, <KVQuantMode.FP8_PER_TENSOR: 1>, <KVQuantMode.NONE: 0>)
    """
    if not isinstance(kv_cache_dtype, str):
        raise TypeError(f"kv_cache_dtype must be a str, got {type(kv_cache_dtype).__name__}")
    if kv_cache_dtype == "int4_per_token_head":
        return KVQuantMode.INT4_PER_TOKEN_HEAD
    if kv_cache_dtype == "int8_per_token_head":
        return KVQuantMode.INT8_PER_TOKEN_HEAD
    if kv_cache_dtype == "fp8_per_token_head":
        return KVQuantMode.FP8_PER_TOKEN_HEAD
    # Must precede the nvfp4 prefix rule, which would otherwise match.
    if kv_cache_dtype == "nvfp4_ds_mla":
        return KVQuantMode.NVFP4_DS_MLA
    if kv_cache_dtype.startswith("nvfp4"):
        return KVQuantMode.NVFP4
    if kv_cache_dtype.startswith("turboquant_"):
        try:
            return KVQuantMode[kv_cache_dtype.upper()]
        except KeyError:
            raise QuantizationError(
                f"unknown TurboQuant kv_cache_dtype {kv_cache_dtype!r}",
                expected=", ".join(s for s in KV_CACHE_DTYPES if s.startswith("turboquant_")),
                found=kv_cache_dtype,
                hint="TurboQuant presets are turboquant_k8v4, turboquant_4bit_nc, "
                "turboquant_k3v4_nc and turboquant_3bit_nc",
            ) from None
    if kv_cache_dtype.startswith("fp8"):
        return KVQuantMode.FP8_PER_TENSOR
    return KVQuantMode.NONE


# ---------------------------------------------------------------------------
# Format records
# ---------------------------------------------------------------------------

#: Layer kinds of standard attention (K and V per KV head) and of MLA (one latent).
ATTENTION_KINDS: frozenset[str] = frozenset(
    {"full", "sliding", "chunked", "cross", "encoder", "sink"}
)
MLA_KINDS: frozenset[str] = frozenset({"mla", "sliding_mla"})
DECODER_ATTENTION_KINDS: frozenset[str] = frozenset({"full", "sliding", "chunked", "sink"})

#: Spellings of a layer kind accepted by :func:`resolve_layer_quant`, mapped to
#: (family, sub-kind). Sub-kind None: only the family is checked.
_KIND_ALIASES: dict[str, tuple[str, str | None]] = {
    "attention": ("attention", None),
    "mla": ("mla", None),
    "full": ("attention", "full"),
    "full_attention": ("attention", "full"),
    "sliding": ("attention", "sliding"),
    "sliding_window": ("attention", "sliding"),
    "chunked": ("attention", "chunked"),
    "chunked_local": ("attention", "chunked"),
    "chunked_local_attention": ("attention", "chunked"),
    "cross": ("attention", "cross"),
    "cross_attention": ("attention", "cross"),
    "encoder": ("attention", "encoder"),
    "encoder_only": ("attention", "encoder"),
    "encoder_only_attention": ("attention", "encoder"),
    "sink": ("attention", "sink"),
    "sink_full_attention": ("attention", "sink"),
    "mla_attention": ("mla", "mla"),
    "sliding_mla": ("mla", "sliding_mla"),
    "sliding_window_mla": ("mla", "sliding_mla"),
}

ScalePlacement = Literal["none", "per_tensor", "in_cell", "separate"]
PerTokenHeadScales = Literal["in_cell", "separate"]

_MODEL_DTYPES = ("float16", "bfloat16", "float32")


@dataclass(frozen=True, slots=True)
class QuantFormat:
    """How one storage format lays a layer's KV out; encoded once, as data.

    ``k_bits`` / ``v_bits`` are the bits of one stored element of the data
    (scales and zero points excluded); ``None`` means "the model dtype's
    width" (``auto``). For MLA formats K is the latent and V is absent
    (``v_bits == 0``; the reference's ``head_size_v`` is 0).
    """

    name: str
    kv_cache_dtypes: tuple[str, ...]
    mode: KVQuantMode
    storage_dtype: str | None  # None: the model dtype ("auto")
    k_bits: int | None
    v_bits: int | None
    scale_placement: ScalePlacement
    scale_dtype: str | None
    scale_granularity: str
    zero_point: str | None
    per_tensor_scales: bool  # per-layer scalar k/v scales live outside the cache
    applies_to: frozenset[str]
    page_size_formula: str
    cell_layout: str
    source: str
    verified: bool
    notes: str = ""

    @property
    def families(self) -> frozenset[str]:
        fams = set()
        if self.applies_to & ATTENTION_KINDS:
            fams.add("attention")
        if self.applies_to & MLA_KINDS:
            fams.add("mla")
        return frozenset(fams)


_ALL_KINDS = ATTENTION_KINDS | MLA_KINDS
_DENSE_FORMULA = "H × N × (head_size + head_size_v) × itemsize(dtype)   [H = num_kv_heads, N = block_size / tokens_per_state]"

AUTO = QuantFormat(
    name="auto",
    kv_cache_dtypes=("auto",),
    mode=KVQuantMode.NONE,
    storage_dtype=None,
    k_bits=None,
    v_bits=None,
    scale_placement="none",
    scale_dtype=None,
    scale_granularity="none",
    zero_point=None,
    per_tensor_scales=False,
    applies_to=_ALL_KINDS,
    page_size_formula=_DENSE_FORMULA,
    cell_layout="[K head_size | V head_size_v] in the model dtype",
    source="reference kv_cache_interface AttentionSpec.state_content_size_bytes; "
    "vllm/utils/torch_utils.py kv_cache_dtype_str_to_dtype ('auto' -> model dtype)",
    verified=True,
)

EXPLICIT = QuantFormat(
    name="explicit",
    kv_cache_dtypes=("float16", "bfloat16"),
    mode=KVQuantMode.NONE,
    storage_dtype=None,  # the named dtype itself
    k_bits=16,
    v_bits=16,
    scale_placement="none",
    scale_dtype=None,
    scale_granularity="none",
    zero_point=None,
    per_tensor_scales=False,
    applies_to=_ALL_KINDS,
    page_size_formula=_DENSE_FORMULA,
    cell_layout="[K head_size | V head_size_v] in the named dtype",
    source="vllm/utils/torch_utils.py STR_DTYPE_TO_TORCH_DTYPE; vllm/config/cache.py CacheDType",
    verified=True,
    notes="Not quantized (mode NONE); stores the cache in the named dtype instead of the model's.",
)

FP8_E4M3 = QuantFormat(
    name="fp8_e4m3",
    kv_cache_dtypes=("fp8", "fp8_e4m3"),
    mode=KVQuantMode.FP8_PER_TENSOR,
    storage_dtype="float8_e4m3fn",
    k_bits=8,
    v_bits=8,
    scale_placement="per_tensor",
    scale_dtype="float32",
    scale_granularity="one K scale and one V scale per layer (layer._k_scale / _v_scale; "
    "from the checkpoint, else 1.0)",
    zero_point=None,
    per_tensor_scales=True,
    applies_to=_ALL_KINDS,
    page_size_formula=_DENSE_FORMULA + " with itemsize 1",
    cell_layout="[K head_size | V head_size_v] e4m3; MLA: 576 e4m3 (512 NoPE + 64 RoPE)",
    source="vllm/v1/attention/ops/triton_reshape_and_cache_flash.py "
    "triton_reshape_and_cache_flash (key / k_scale per tensor); "
    "vllm/v1/attention/backends/mla/flashmla.py FlashMLABackend.supported_kv_cache_dtypes "
    "+ FlashMLAImpl._forward_decode (descale_k=layer._k_scale, dense 576-byte latent)",
    verified=True,
    notes="The reference's conformance case syn-mixed-precision has fp8 layers with dtype "
    "float8_e4m3fn and state_content_size = (head_size + head_size_v) × 1; upstream vLLM "
    "allocates uint8 and views it as the platform fp8 dtype, same bytes. On DeepSeek-V3.2 "
    "sparse MLA (FlashMLA sparse) 'fp8' is an alias that the engine canonicalizes to "
    "fp8_ds_mla before specs are built.",
)

FP8_E5M2 = QuantFormat(
    name="fp8_e5m2",
    kv_cache_dtypes=("fp8_e5m2",),
    mode=KVQuantMode.FP8_PER_TENSOR,
    storage_dtype="float8_e5m2",
    k_bits=8,
    v_bits=8,
    scale_placement="per_tensor",
    scale_dtype="float32",
    scale_granularity=FP8_E4M3.scale_granularity,
    zero_point=None,
    per_tensor_scales=True,
    applies_to=_ALL_KINDS,
    page_size_formula=FP8_E4M3.page_size_formula,
    cell_layout="[K head_size | V head_size_v] e5m2",
    source="vllm/v1/attention/ops/triton_reshape_and_cache_flash.py "
    "triton_reshape_and_cache_flash (accepts float8_e5m2 caches)",
    verified=True,
    notes="MLA: the page math is the dense one, but FlashMLA lists only auto/fp8/fp8_e4m3; "
    "whether any vLLM MLA backend accepts fp8_e5m2 was not verified.",
)

FP8_INC = QuantFormat(
    name="fp8_inc",
    kv_cache_dtypes=("fp8_inc",),
    mode=KVQuantMode.FP8_PER_TENSOR,
    storage_dtype="float8_e4m3fn",
    k_bits=8,
    v_bits=8,
    scale_placement="per_tensor",
    scale_dtype="float32",
    scale_granularity="per layer, managed by Intel Neural Compressor (Gaudi/HPU)",
    zero_point=None,
    per_tensor_scales=True,
    applies_to=_ALL_KINDS,
    page_size_formula=FP8_E4M3.page_size_formula,
    cell_layout="[K head_size | V head_size_v] e4m3",
    source="vllm/utils/torch_utils.py STR_DTYPE_TO_TORCH_DTYPE ('fp8_inc' -> float8_e4m3fn)",
    verified=True,
    notes="Intel Gaudi (HPU) path. Storage dtype and width are verified; the HPU backends "
    "themselves (layer kinds, MLA) were not checked.",
)

FP8_DS_MLA = QuantFormat(
    name="fp8_ds_mla",
    kv_cache_dtypes=("fp8_ds_mla",),
    mode=KVQuantMode.FP8_PER_TENSOR,
    storage_dtype="uint8",
    k_bits=8,  # NoPE part; the 64-dim RoPE part stays bf16
    v_bits=0,
    scale_placement="in_cell",
    scale_dtype="float32",
    scale_granularity="one float32 per 128 NoPE values of a token (4 per 576-dim latent; "
    "1 per 128-dim indexer key)",
    zero_point=None,
    per_tensor_scales=False,
    applies_to=MLA_KINDS,
    page_size_formula="N × 656 for the 576-dim latent (512 e4m3 NoPE + 4×fp32 scales + "
    "64 bf16 RoPE); N × 132 for a 128-dim sparse-attention indexer key (128 e4m3 + 1 fp32)",
    cell_layout="576: [512 B e4m3 NoPE | 16 B = 4 fp32 scales | 128 B = 64 bf16 RoPE]; "
    "128 (indexer): [128 B e4m3 | 4 B fp32 scale]",
    source="vllm/v1/attention/backends/mla/flashmla_sparse.py module docstring "
    "('FP8 with scale' 656-byte V3.2 record) + FlashMLASparseBackend; "
    "vllm/model_executor/models/deepseek_v2.py Indexer.__init__ (k_cache head_dim = "
    "head_dim + head_dim // quant_block_size * 4 = 132)",
    verified=True,
    notes="Mode is FP8_PER_TENSOR by the reference mapping (prefix 'fp8') although scales "
    "are per tile and in the record. DeepSeek-V4 (584 B, 448 NoPE) and V4.1 (528 B) records "
    "share this string but need model_version: pass state_content_bytes explicitly.",
)

_PTH_SOURCE = (
    "vllm/v1/attention/backends/triton_attn.py TritonAttentionBackend.customize_spec "
    "(state_content_bytes = (hs_k + hs_v) × itemsize + 2 × sizeof(float32); int4: hs // 2) "
    "and TritonAttentionImpl._ensure_scale_caches (strided float32 views at byte hs of each "
    "K/V half); vllm-project/vllm PR #51704 (backend-published packing via customize_spec)"
)

INT8_PER_TOKEN_HEAD = QuantFormat(
    name="int8_per_token_head",
    kv_cache_dtypes=("int8_per_token_head",),
    mode=KVQuantMode.INT8_PER_TOKEN_HEAD,
    storage_dtype="int8",
    k_bits=8,
    v_bits=8,
    scale_placement="in_cell",
    scale_dtype="float32",
    scale_granularity="one float32 per (token, KV head) for K and one for V; dynamic "
    "(absmax / 127 at cache write)",
    zero_point=None,
    per_tensor_scales=False,
    applies_to=ATTENTION_KINDS,
    page_size_formula="H × N × ((head_size + head_size_v) × 1 + 8)",
    cell_layout="[K int8 × head_size | K scale fp32 | V int8 × head_size_v | V scale fp32]",
    source=_PTH_SOURCE,
    verified=True,
    notes="Triton attention backend only (no MLA path). Older vLLM kept the scales in "
    "separate [num_blocks, block_size, num_kv_heads] float32 tensors carved from the same "
    "allocation (same total bytes): resolve_layer_quant(per_token_head_scales='separate').",
)

FP8_PER_TOKEN_HEAD = QuantFormat(
    name="fp8_per_token_head",
    kv_cache_dtypes=("fp8_per_token_head",),
    mode=KVQuantMode.FP8_PER_TOKEN_HEAD,
    storage_dtype="float8_e4m3fn",
    k_bits=8,
    v_bits=8,
    scale_placement="in_cell",
    scale_dtype="float32",
    scale_granularity="one float32 per (token, KV head) for K and one for V; dynamic "
    "(absmax / 448 at cache write)",
    zero_point=None,
    per_tensor_scales=False,
    applies_to=ATTENTION_KINDS,
    page_size_formula=INT8_PER_TOKEN_HEAD.page_size_formula,
    cell_layout="[K e4m3 × head_size | K scale fp32 | V e4m3 × head_size_v | V scale fp32]",
    source=_PTH_SOURCE,
    verified=True,
    notes="Upstream vLLM allocates uint8 and views it as fp8 (1 byte either way); kvspec "
    "names the view float8_e4m3fn as the reference does for fp8. Triton needs SM89+ for fp8.",
)

INT4_PER_TOKEN_HEAD = QuantFormat(
    name="int4_per_token_head",
    kv_cache_dtypes=("int4_per_token_head",),
    mode=KVQuantMode.INT4_PER_TOKEN_HEAD,
    storage_dtype="uint8",
    k_bits=4,
    v_bits=4,
    scale_placement="in_cell",
    scale_dtype="float32",
    scale_granularity="one float32 per (token, KV head) for K and one for V; the 4-bit "
    "asymmetric zero point is packed into the scale word's low 4 mantissa bits",
    zero_point="4-bit, in the low bits of the fp32 scale word",
    per_tensor_scales=False,
    applies_to=ATTENTION_KINDS,
    page_size_formula="H × N × (head_size / 2 + head_size_v / 2 + 8)",
    cell_layout="[K 2×int4/byte × head_size/2 | K scale+zp fp32 | V 2×int4/byte × "
    "head_size_v/2 | V scale+zp fp32]; keys and values Hadamard-rotated (RHT)",
    source=_PTH_SOURCE + "; vllm/v1/attention/ops/triton_reshape_and_cache_flash.py "
    "_reshape_cache_per_token_head (int4: zp packed into the scale's low 4 bits)",
    verified=True,
    notes="Cell size verified (customize_spec). The zero-point packing was read from one "
    "version of the writer kernel; a later ROCm fast path describes a symmetric format, so "
    "the meaning of the scale word's low bits is kernel-version specific -- the byte "
    "layout is not.",
)

NVFP4 = QuantFormat(
    name="nvfp4",
    kv_cache_dtypes=("nvfp4", "nvfp4_4over6"),
    mode=KVQuantMode.NVFP4,
    storage_dtype="uint8",
    k_bits=4,
    v_bits=4,
    scale_placement="in_cell",
    scale_dtype="float8_e4m3fn",
    scale_granularity="one e4m3 block scale per 16 elements of a (token, head) vector, "
    "plus a per-tensor float32 global K / V scale (layer._k_scale / _v_scale)",
    zero_point=None,
    per_tensor_scales=True,
    applies_to=ATTENTION_KINDS,
    page_size_formula="(2 × H) × N × (head_size / 2 + head_size / 16)   [num_head_slots = 2 × H]",
    cell_layout="head slots [K heads 0..H-1 | V heads 0..H-1]; each K/V half of a page holds "
    "all its packed e2m1 data (H × N × head_size/2 B) followed by all its e4m3 block scales "
    "(H × N × head_size/16 B) -- the cell size counts both",
    source="vllm/v1/attention/backends/flashinfer.py FlashInferBackend.customize_spec "
    "(num_head_slots = 2 × num_kv_heads, state_content_bytes = nvfp4_kv_cache_full_dim("
    "head_size)); vllm/utils/torch_utils.py nvfp4_kv_cache_full_dim (head_size // 2 + "
    "head_size // 16) and nvfp4_split_data_scale; vllm-project/vllm PR #40177",
    verified=True,
    notes="K and V must have the same head size (customize_spec asserts it). 'nvfp4_4over6' "
    "(4-over-6 block-scale election) maps to the same mode and is stored as uint8 by vLLM; "
    "its layout is assumed identical to nvfp4 -- not verified against a backend.",
)

NVFP4_DS_MLA = QuantFormat(
    name="nvfp4_ds_mla",
    kv_cache_dtypes=("nvfp4_ds_mla",),
    mode=KVQuantMode.NVFP4_DS_MLA,
    storage_dtype="uint8",
    k_bits=4,  # NoPE part; RoPE is 8-bit e4m3
    v_bits=0,
    scale_placement="in_cell",
    scale_dtype="float8_e4m3fn",
    scale_granularity="one e4m3 scale per 16 NoPE values (32 per token, permuted 8×4 -> "
    "4×8); RoPE unscaled",
    zero_point=None,
    per_tensor_scales=False,
    applies_to=frozenset({"mla"}),
    page_size_formula="N × 352 for the 576-dim latent (256 B e2m1 NoPE + 64 B e4m3 RoPE + "
    "32 B e4m3 scales)",
    cell_layout="[256 B = 512 e2m1 NoPE, 2/byte, low nibble even | 64 B = 64 e4m3 RoPE | "
    "32 B e4m3 NoPE scales, scale of block s at byte 8·(s&3) + (s>>2)]",
    source="vllm/v1/attention/backends/mla/flashmla_sparse.py module docstring "
    "('nvfp4_ds_mla' format, 352 B/token) + FlashMLASparseBackend.supports_combination "
    "(SM100 only); vllm-project/FlashMLA PR #18 (nvfp4.fp8rope, 352 B/token)",
    verified=True,
    notes="FlashMLA sparse (SM100), DeepSeek-V3.2 geometry only. Other vLLM forks use the "
    "same string for different records (B12X sparse MLA: 432 B, or 368 B with FP8 RoPE; "
    "GLM variants 400/416 B): pass state_content_bytes explicitly for those.",
)


def _tq(name: str, mode: KVQuantMode, k_bits: int, v_bits: int) -> QuantFormat:
    if k_bits == 8:
        key = "head_size bytes of fp8 (no key scale)"
        kfo = "head_size"
    else:
        key = f"ceil(head_size × {k_bits} / 8) B Lloyd-Max indices + 2 B fp16 vector norm"
        kfo = f"ceil(head_size × {k_bits} / 8) + 2"
    return QuantFormat(
        name=name,
        kv_cache_dtypes=(name,),
        mode=mode,
        storage_dtype="uint8",
        k_bits=k_bits,
        v_bits=v_bits,
        scale_placement="in_cell",
        scale_dtype="float16",
        scale_granularity=(
            "values: one fp16 scale + one fp16 zero per (token, KV head)"
            + ("" if k_bits == 8 else "; keys: one fp16 vector norm per (token, KV head)")
        ),
        zero_point="values: fp16, in the cell",
        per_tensor_scales=False,
        applies_to=DECODER_ATTENTION_KINDS,
        page_size_formula=(
            f"H × N × round_up_even({kfo} + ceil(head_size × {v_bits} / 8) + 4)"
        ),
        cell_layout=f"[key: {key} | value: ceil(head_size × {v_bits} / 8) B uniform codes "
        "+ 2 B fp16 scale + 2 B fp16 zero | pad to even]; one packed K+V slot per (token, head)",
        source="vllm/model_executor/layers/quantization/turboquant/config.py "
        "TurboQuantConfig.key_packed_size / value_packed_size / slot_size_aligned; "
        "vllm/v1/attention/backends/turboquant_attn.py TurboQuantAttentionBackend."
        "get_kv_cache_shape ((num_blocks, num_kv_heads, block_size, slot_size_aligned) uint8) "
        "and supports_attn_type (DECODER only)",
        verified=True,
        notes="One head_size for K and V. Decoder self-attention only (full and sliding "
        "window: vLLM has TQFullAttentionSpec / TQSlidingWindowSpec); chunked-local and sink "
        "layers were not verified. The power-of-two head_size requirement is derived from "
        "_build_hadamard (Sylvester construction), not from an explicit vLLM check."
        + (" turboquant_k8v4 keeps FlashAttention-compatible fp8 keys: head_size <= 256 "
           "(TurboQuantAttentionBackend.supports_combination)." if k_bits == 8 else ""),
    )


TURBOQUANT_K8V4 = _tq("turboquant_k8v4", KVQuantMode.TURBOQUANT_K8V4, 8, 4)
TURBOQUANT_4BIT_NC = _tq("turboquant_4bit_nc", KVQuantMode.TURBOQUANT_4BIT_NC, 4, 4)
TURBOQUANT_K3V4_NC = _tq("turboquant_k3v4_nc", KVQuantMode.TURBOQUANT_K3V4_NC, 3, 4)
TURBOQUANT_3BIT_NC = _tq("turboquant_3bit_nc", KVQuantMode.TURBOQUANT_3BIT_NC, 3, 3)

#: Every storage format, in documentation order.
FORMATS: tuple[QuantFormat, ...] = (
    AUTO,
    EXPLICIT,
    FP8_E4M3,
    FP8_E5M2,
    FP8_INC,
    FP8_DS_MLA,
    INT8_PER_TOKEN_HEAD,
    FP8_PER_TOKEN_HEAD,
    INT4_PER_TOKEN_HEAD,
    NVFP4,
    NVFP4_DS_MLA,
    TURBOQUANT_K8V4,
    TURBOQUANT_4BIT_NC,
    TURBOQUANT_K3V4_NC,
    TURBOQUANT_3BIT_NC,
)

_BY_STRING: dict[str, QuantFormat] = {s: f for f in FORMATS for s in f.kv_cache_dtypes}

#: Every ``kv_cache_dtype`` string kvspec accepts (vLLM's ``CacheDType``).
KV_CACHE_DTYPES: tuple[str, ...] = tuple(_BY_STRING)


def format_for(kv_cache_dtype: str) -> QuantFormat:
    """The storage format a ``kv_cache_dtype`` selects; QuantizationError if unknown."""
    fmt = _BY_STRING.get(kv_cache_dtype)
    if fmt is None:
        raise QuantizationError(
            f"unknown kv_cache_dtype {kv_cache_dtype!r}",
            expected=", ".join(KV_CACHE_DTYPES),
            found=repr(kv_cache_dtype),
            hint="use 'auto' to store the cache in the model dtype",
        )
    return fmt


def formats_of_mode(mode: KVQuantMode) -> tuple[QuantFormat, ...]:
    """All storage formats of a mode (several for FP8_PER_TENSOR and NONE)."""
    return tuple(f for f in FORMATS if f.mode == mode)


# ---------------------------------------------------------------------------
# Per-layer resolution
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScaleTensor:
    """A scale / zero-point tensor kept apart from the KV data, one per layer.

    The loader allocates ``(num_blocks, *shape_per_block)`` of ``dtype`` beside
    the layer's data view.
    """

    name: str
    dtype: str
    shape_per_block: tuple[int, ...]

    @property
    def bytes_per_block(self) -> int:
        return math.prod(self.shape_per_block) * DTYPE_SIZES[self.dtype]


@dataclass(frozen=True, slots=True)
class LayerQuant:
    """How one layer's KV page is stored under a ``kv_cache_dtype``.

    ``state_content_bytes`` is the reference's C in bytes when packed (None:
    dense ``(head_size + head_size_v) × itemsize(dtype)``); ``num_head_slots``
    the page's H when it is not one slot per KV head. ``scales`` lists the
    tensors kept apart from the data (empty when scales are in the cell or
    per-tensor constants).
    """

    kv_cache_dtype: str
    mode: KVQuantMode
    dtype: str
    state_content_bytes: int | None
    num_head_slots: int | None
    scales: tuple[ScaleTensor, ...]
    format_name: str = ""
    scale_placement: ScalePlacement = "none"
    per_tensor_scales: bool = False


def _err(message: str, **kw: str) -> QuantizationError:
    return QuantizationError(message, **kw)


def _check_positive(name: str, value: object, *, allow_zero: bool = False) -> int:
    expected = "an integer >= 0" if allow_zero else "an integer >= 1"
    if isinstance(value, bool) or not isinstance(value, int):
        raise _err(f"{name} must be an integer", expected=expected, found=repr(value))
    if value < 0 or (value == 0 and not allow_zero):
        raise _err(
            f"{name} must be {'non-negative' if allow_zero else 'positive'}",
            expected=expected,
            found=str(value),
        )
    return value


def _canonical_model_dtype(model_dtype: str) -> str:
    try:
        name = canonical_dtype(model_dtype)
    except (KeyError, AttributeError):
        raise _err(
            f"unknown model dtype {model_dtype!r}",
            expected=", ".join(_MODEL_DTYPES),
            found=repr(model_dtype),
        ) from None
    if name not in _MODEL_DTYPES:
        raise _err(
            f"model dtype {name} cannot hold a KV cache",
            expected=", ".join(_MODEL_DTYPES),
            found=name,
            hint="the model dtype is the activation dtype (bfloat16, float16 or float32)",
        )
    return name


def _check_kind(fmt: QuantFormat, kv_cache_dtype: str, kind: str) -> tuple[str, str | None]:
    try:
        family, sub = _KIND_ALIASES[kind]
    except (KeyError, TypeError):
        raise _err(
            f"unknown layer kind {kind!r}",
            expected="attention, mla (or a specific kind: " + ", ".join(sorted(_KIND_ALIASES)) + ")",
            found=repr(kind),
        ) from None
    if family not in fmt.families:
        if family == "mla":
            hints = {
                "per_token_head": "per-token-head modes exist only in vLLM's Triton attention "
                "backend, which has no MLA path; for MLA use fp8 (dense 576 B latent), "
                "fp8_ds_mla or nvfp4_ds_mla (DeepSeek sparse MLA), or skip the layer",
                "nvfp4": "NVFP4 is a FlashInfer (standard attention) format; the MLA "
                "counterpart is nvfp4_ds_mla (FlashMLA sparse, 576-dim latent)",
                "turboquant": "TurboQuant packs separate K and V per KV head and its backend "
                "has no MLA path; use fp8 for an MLA layer or skip it",
            }
            key = (
                "per_token_head"
                if fmt.mode.is_per_token_head
                else "nvfp4"
                if fmt.mode.is_nvfp4
                else "turboquant"
                if fmt.mode.is_turboquant
                else None
            )
            raise _err(
                f"kv_cache_dtype {kv_cache_dtype!r} does not apply to MLA layers",
                expected="a kv_cache_dtype for MLA: "
                + ", ".join(s for s in KV_CACHE_DTYPES if "mla" in _BY_STRING[s].families),
                found=kv_cache_dtype,
                hint=hints.get(key or "", "add the layer to kv_cache_dtype_skip_layers"),
            )
        raise _err(
            f"kv_cache_dtype {kv_cache_dtype!r} applies to MLA layers only, not standard attention",
            expected="an MLA layer (one latent per token, head_size_v = 0)",
            found=f"kind {kind!r}",
            hint="use fp8 (or nvfp4 / a per-token-head mode) for standard attention layers, "
            "or skip this layer (kv_cache_dtype_skip_layers)",
        )
    if sub is not None and sub not in fmt.applies_to:
        raise _err(
            f"kv_cache_dtype {kv_cache_dtype!r} does not support {kind!r} layers",
            expected="one of: " + ", ".join(sorted(fmt.applies_to)),
            found=kind,
            hint="skip this layer (kv_cache_dtype_skip_layers) to keep it in the model dtype",
        )
    return family, sub


def _require(cond: bool, message: str, *, found: str, hint: str, expected: str | None = None) -> None:
    if not cond:
        raise _err(message, found=found, hint=hint, expected=expected)


def _tq_sizes(fmt: QuantFormat, head_size: int) -> int:
    """TurboQuantConfig.slot_size_aligned for ``head_size``."""
    assert fmt.k_bits is not None and fmt.v_bits is not None
    key = head_size if fmt.k_bits == 8 else math.ceil(head_size * fmt.k_bits / 8) + 2
    value = math.ceil(head_size * fmt.v_bits / 8) + 4
    slot = key + value
    return slot + (slot % 2)


def resolve_layer_quant(
    kv_cache_dtype: str,
    *,
    model_dtype: str,
    kind: str,
    head_size: int,
    head_size_v: int,
    num_kv_heads: int,
    block_size: int,
    state_content_bytes: int | None = None,
    num_head_slots: int | None = None,
    per_token_head_scales: PerTokenHeadScales = "in_cell",
) -> LayerQuant:
    """Resolve how one layer stores its KV under ``kv_cache_dtype``.

    ``kind`` is ``"attention"`` or ``"mla"`` (a specific kind such as
    ``"sliding_window"`` or ``"cross_attention"`` is also accepted and checked
    against the format's layer kinds). MLA layers have ``head_size_v == 0``.

    ``state_content_bytes`` / ``num_head_slots`` let a layer type override the
    backend-published packing explicitly (e.g. DeepSeek-V4's 584-byte
    ``fp8_ds_mla`` record); the format's own geometry checks are then skipped.
    ``per_token_head_scales="separate"`` models vLLM's older per-token-head
    layout: the data cell is dense and the float32 scales are two per-layer
    tensors of shape ``(block_size, num_kv_heads)`` per block.

    Raises :class:`QuantizationError` when the mode does not fit the layer.
    """
    fmt = format_for(kv_cache_dtype)
    mode = quant_mode(kv_cache_dtype)
    assert mode == fmt.mode, (kv_cache_dtype, mode, fmt.mode)
    mdt = _canonical_model_dtype(model_dtype)
    family, _sub = _check_kind(fmt, kv_cache_dtype, kind)
    hs = _check_positive("head_size", head_size)
    hv = _check_positive("head_size_v", head_size_v, allow_zero=True)
    nkv = _check_positive("num_kv_heads", num_kv_heads)
    _check_positive("block_size", block_size)
    if state_content_bytes is not None:
        _check_positive("state_content_bytes", state_content_bytes)
    if num_head_slots is not None:
        _check_positive("num_head_slots", num_head_slots)
    if per_token_head_scales not in ("in_cell", "separate"):
        raise _err(
            "per_token_head_scales must be 'in_cell' or 'separate'",
            expected="'in_cell' (the Triton backend's layout) or 'separate'",
            found=repr(per_token_head_scales),
        )
    overridden = state_content_bytes is not None or num_head_slots is not None

    if family == "mla":
        _require(
            hv == 0,
            "an MLA layer stores one latent per token: head_size_v must be 0",
            found=f"head_size_v={hv}",
            hint="put the whole latent (kv_lora_rank + rope dim, e.g. 576) in head_size",
        )
    elif hv == 0:
        raise _err(
            "a standard attention layer needs head_size_v > 0",
            found="head_size_v=0",
            hint="pass head_size_v = head_size unless V has its own width; use kind='mla' "
            "for a latent cache",
        )

    # Model dtypes the backends accept (supported_dtypes).
    if fmt is FP8_DS_MLA or fmt is NVFP4_DS_MLA:
        _require(
            mdt == "bfloat16",
            f"{kv_cache_dtype} needs a bfloat16 model (FlashMLA sparse supports bfloat16 only)",
            found=f"model dtype {mdt}",
            hint="serve the model in bfloat16 or use fp8 for this MLA layer",
        )
    elif fmt.mode.is_turboquant or fmt is NVFP4:
        _require(
            mdt in ("float16", "bfloat16"),
            f"{kv_cache_dtype} needs a float16 or bfloat16 model",
            found=f"model dtype {mdt}",
            hint="TurboQuant and FlashInfer NVFP4 backends do not take float32 activations",
        )

    scb: int | None = None
    slots: int | None = None
    scales: tuple[ScaleTensor, ...] = ()
    placement: ScalePlacement = fmt.scale_placement
    if fmt is AUTO:
        dtype = mdt
    elif fmt is EXPLICIT:
        dtype = kv_cache_dtype
    else:
        assert fmt.storage_dtype is not None
        dtype = fmt.storage_dtype

    if overridden:
        scb, slots = state_content_bytes, num_head_slots
    elif fmt is FP8_DS_MLA:
        _require(nkv == 1, "fp8_ds_mla stores one latent per token: num_kv_heads must be 1",
                 found=f"num_kv_heads={nkv}", hint="MLA layers have one KV head")
        known = {576: 656, 128: 132}
        _require(
            hs in known,
            f"fp8_ds_mla has no record size for a {hs}-dim latent",
            expected="head_size 576 (DeepSeek-V3.2 latent, 656 B) or 128 (indexer key, 132 B)",
            found=f"head_size={hs}",
            hint="DeepSeek-V4 records (584 B for 512 dims, V4.1: 528 B) depend on the model "
            "version: pass state_content_bytes explicitly",
        )
        scb = known[hs]
    elif fmt is NVFP4_DS_MLA:
        _require(nkv == 1, "nvfp4_ds_mla stores one latent per token: num_kv_heads must be 1",
                 found=f"num_kv_heads={nkv}", hint="MLA layers have one KV head")
        _require(
            hs == 576,
            "nvfp4_ds_mla (FlashMLA sparse) supports only the 576-dim DeepSeek-V3.2 latent",
            expected="head_size 576",
            found=f"head_size={hs}",
            hint="other nvfp4_ds_mla records (e.g. B12X's 432 B) need state_content_bytes "
            "passed explicitly",
        )
        scb = 352
    elif fmt.mode.is_per_token_head:
        _require(
            hs == hv,
            f"{kv_cache_dtype} needs equal K and V head sizes",
            found=f"head_size={hs}, head_size_v={hv}",
            hint="the Triton backend finds the V half of a cell at content // 2",
        )
        if fmt is INT4_PER_TOKEN_HEAD:
            _require(
                hs % 8 == 0,
                "int4_per_token_head packs 2 values per byte and aligns the fp32 scale after "
                "them: head_size must be a multiple of 8",
                found=f"head_size={hs}",
                hint="use int8_per_token_head for this layer",
            )
            data_k, data_v = hs // 2, hv // 2
        else:
            _require(
                hs % 4 == 0,
                f"{kv_cache_dtype} aligns a float32 scale after each head: head_size must be "
                "a multiple of 4",
                found=f"head_size={hs}",
                hint="skip this layer (kv_cache_dtype_skip_layers)",
            )
            data_k, data_v = hs, hv
        if per_token_head_scales == "in_cell":
            scb = (data_k + data_v) * DTYPE_SIZES[dtype] + 2 * DTYPE_SIZES["float32"]
        else:
            placement = "separate"
            scb = None if fmt is not INT4_PER_TOKEN_HEAD else (data_k + data_v)
            scales = (
                ScaleTensor("k_scale", "float32", (block_size, nkv)),
                ScaleTensor("v_scale", "float32", (block_size, nkv)),
            )
    elif fmt is NVFP4:
        _require(
            hs == hv,
            "nvfp4 needs equal K and V head sizes",
            found=f"head_size={hs}, head_size_v={hv}",
            hint="K and V take one head slot each of the same cell size",
        )
        _require(
            hs % 16 == 0,
            "nvfp4 quantizes in blocks of 16: head_size must be a multiple of 16",
            found=f"head_size={hs}",
            hint="use fp8 for this layer",
        )
        slots = 2 * nkv
        scb = (hs // 2 + hs // 16) * DTYPE_SIZES[dtype]
    elif fmt.mode.is_turboquant:
        _require(
            hs == hv,
            f"{kv_cache_dtype} needs equal K and V head sizes",
            found=f"head_size={hs}, head_size_v={hv}",
            hint="TurboQuant sizes one packed K+V slot from a single head_dim",
        )
        _require(
            hs & (hs - 1) == 0,
            f"{kv_cache_dtype} rotates keys with a Sylvester Hadamard matrix: head_size must "
            "be a power of two",
            found=f"head_size={hs}",
            hint="use fp8 or a per-token-head mode for this layer",
        )
        if fmt is TURBOQUANT_K8V4:
            _require(
                hs <= 256,
                "turboquant_k8v4 needs a FlashAttention-compatible head_size (<= 256)",
                found=f"head_size={hs}",
                hint="use turboquant_4bit_nc or fp8 for this layer",
            )
        scb = _tq_sizes(fmt, hs)
    # else: dense formats (auto, explicit, fp8 per-tensor): C = (hs + hv) × itemsize.

    return LayerQuant(
        kv_cache_dtype=kv_cache_dtype,
        mode=mode,
        dtype=dtype,
        state_content_bytes=scb,
        num_head_slots=slots,
        scales=scales,
        format_name=fmt.name,
        scale_placement=placement,
        per_tensor_scales=fmt.per_tensor_scales,
    )


# ---------------------------------------------------------------------------
# Page math
# ---------------------------------------------------------------------------


def state_content_size_bytes(q: LayerQuant, *, head_size: int, head_size_v: int) -> int:
    """C: bytes per (head slot, stored state) cell, as the reference computes it."""
    if q.state_content_bytes is not None:
        return q.state_content_bytes
    return (head_size + head_size_v) * DTYPE_SIZES[q.dtype]


def page_size_bytes(
    q: LayerQuant,
    *,
    num_kv_heads: int,
    head_size: int,
    head_size_v: int,
    block_size: int,
    tokens_per_state: int | Fraction = 1,
) -> int:
    """Unpadded page bytes of one block: ``H × N × C``.

    H = ``num_head_slots`` or ``num_kv_heads``; N = ``block_size //
    tokens_per_state`` (1 when ``tokens_per_state <= 0``, as the reference's
    ``get_num_kernel_states``); C = :func:`state_content_size_bytes`.
    Scale tensors kept apart (``q.scales``) are not included: see
    :func:`scale_bytes_per_block`.
    """
    heads = q.num_head_slots if q.num_head_slots is not None else num_kv_heads
    states = block_size // tokens_per_state if tokens_per_state > 0 else 1
    c = state_content_size_bytes(q, head_size=head_size, head_size_v=head_size_v)
    return int(heads * states * c)


def scale_bytes_per_block(q: LayerQuant) -> int:
    """Bytes of the separate scale tensors of one block (0 when none)."""
    return sum(s.bytes_per_block for s in q.scales)


def bytes_per_token(
    q: LayerQuant,
    *,
    num_kv_heads: int,
    head_size: int,
    head_size_v: int,
    block_size: int,
) -> Fraction:
    """KV bytes one token costs in one layer, separate scales included."""
    page = page_size_bytes(
        q, num_kv_heads=num_kv_heads, head_size=head_size, head_size_v=head_size_v,
        block_size=block_size,
    )
    return Fraction(page + scale_bytes_per_block(q), block_size)


def is_mixed_precision(quants: Iterable[LayerQuant]) -> bool:
    """The reference's ``has_mixed_precision_kv_cache`` over attention layers.

    More than one (dtype, mode) pair means a block reused across groups can be
    reinterpreted under another precision: new blocks must be zeroed.
    """
    return len({(q.dtype, q.mode) for q in quants}) > 1


# ---------------------------------------------------------------------------
# addressable parts of a cell (for the runtime's per-part views)
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CellPart:
    """One addressable run inside a (head slot, state) cell.

    ``count`` elements of ``dtype`` starting ``byte_offset`` bytes into the cell;
    the runtime views it as ``(B, H, N, count)`` without a copy.
    """

    name: str
    dtype: str
    byte_offset: int
    count: int

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "dtype": self.dtype, "byte_offset": self.byte_offset,
                "count": self.count}


def cell_parts(kv_cache_dtype: str, *, kind: str, dtype: str, head_size: int,
               head_size_v: int, cell_bytes: int) -> tuple[CellPart, ...] | None:
    """The parts of one cell, in cell order, or None when the format is opaque
    (nvfp4, turboquant: packed for one backend's kernels only).

    ``kind`` is ``"attention"`` or ``"mla"``; ``dtype`` the storage dtype of the
    view; ``cell_bytes`` the cell size the plan uses (checked against the parts).

    >>> [p.name for p in cell_parts("int8_per_token_head", kind="attention", dtype="int8",
    ...                             head_size=128, head_size_v=128, cell_bytes=264)]
    ['k', 'k_scale', 'v', 'v_scale']
    """
    fmt = format_for(kv_cache_dtype)
    size = DTYPE_SIZES[dtype]
    parts: list[CellPart]
    if fmt.mode in (KVQuantMode.NONE, KVQuantMode.FP8_PER_TENSOR) and fmt is not FP8_DS_MLA:
        if kind == "mla":
            parts = [CellPart("latent", dtype, 0, head_size)]
        else:
            parts = [CellPart("k", dtype, 0, head_size),
                     CellPart("v", dtype, head_size * size, head_size_v)]
    elif fmt is FP8_DS_MLA and kind == "mla":
        if cell_bytes == 656:     # 512 e4m3 NoPE | 4 fp32 tile scales | 64 bf16 RoPE
            parts = [CellPart("nope", "float8_e4m3fn", 0, 512),
                     CellPart("scale", "float32", 512, 4),
                     CellPart("rope", "bfloat16", 528, 64)]
        elif cell_bytes == head_size + 4 * max(1, head_size // 128):  # indexer: e4m3 | fp32
            parts = [CellPart("k", "float8_e4m3fn", 0, head_size),
                     CellPart("scale", "float32", head_size, max(1, head_size // 128))]
        else:
            return None
    elif fmt.mode in (KVQuantMode.INT8_PER_TOKEN_HEAD, KVQuantMode.FP8_PER_TOKEN_HEAD,
                      KVQuantMode.INT4_PER_TOKEN_HEAD):
        packed = fmt.mode == KVQuantMode.INT4_PER_TOKEN_HEAD
        k = head_size // 2 if packed else head_size
        v = head_size_v // 2 if packed else head_size_v
        data = "uint8" if packed else dtype
        item = DTYPE_SIZES[data]
        parts = [CellPart("k", data, 0, k),
                 CellPart("k_scale", "float32", k * item, 1),
                 CellPart("v", data, k * item + 4, v),
                 CellPart("v_scale", "float32", k * item + 4 + v * item, 1)]
    else:
        return None
    end = max(p.byte_offset + p.count * DTYPE_SIZES[p.dtype] for p in parts)
    if end != cell_bytes:
        return None  # an explicit or unusual cell: keep it opaque rather than guess
    return tuple(parts)
