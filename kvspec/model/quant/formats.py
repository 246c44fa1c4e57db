"""Storage formats of a quantized KV cache: objects that carry their own rules.

Each ``kv_cache_dtype`` selects one :class:`QuantFormat`. A format knows the
layers it applies to, the model dtypes its backends take, its storage dtype,
and how it packs a cell: the reference's ``state_content_bytes`` (C, when not
dense K||V), ``num_head_slots`` (H, when not one slot per KV head) and any
scale tensors kept apart from the data. :meth:`QuantFormat.resolve` checks a
layer against those rules and returns a :class:`LayerQuant`; the page is then
the layer spec's ``H * N * C``. What each format stores and where its numbers
come from in vLLM is in docs/quantization.md.

>>> q = format_for("int4_per_token_head").resolve(
...     "int4_per_token_head", model_dtype="bfloat16", kind="attention",
...     head_size=128, head_size_v=128, num_kv_heads=8, block_size=16)
>>> q.dtype, q.state_content_bytes, q.num_head_slots
('uint8', 136, None)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from kvspec.model.dtypes import DTYPE_SIZES
from kvspec.model.quant.check import Layer, check_layer, require
from kvspec.model.quant.modes import KVQuantMode, QuantizationError

ScalePlacement = Literal["none", "per_tensor", "in_cell", "separate"]
PerTokenHeadScales = Literal["in_cell", "separate"]

#: Quantization classes of standard attention (K and V per KV head) and of MLA.
ATTENTION_CLASSES = frozenset({"full", "sliding", "chunked", "cross", "encoder", "sink"})
MLA_CLASSES = frozenset({"mla", "sliding_mla"})
DECODER_CLASSES = frozenset({"full", "sliding", "chunked", "sink"})
_16_BIT = ("float16", "bfloat16")


@dataclass(frozen=True, slots=True)
class ScaleTensor:
    """A scale tensor kept apart from the KV data, one per layer: the loader
    allocates ``(num_blocks, *shape_per_block)`` of ``dtype`` beside the view."""

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
    dense ``(head_size + head_size_v) x itemsize(dtype)``); ``num_head_slots``
    the page's H when it is not one slot per KV head; ``scales`` the tensors
    kept apart from the data (empty when scales are in the cell or constants).
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


@dataclass(frozen=True, slots=True)
class QuantFormat:
    """One storage format. Subclasses override :meth:`packing` (and checks)."""

    name: str
    kv_cache_dtypes: tuple[str, ...]
    mode: KVQuantMode
    #: The view dtype; None: the model dtype (``auto``) or the named dtype.
    storage_dtype: str | None
    applies_to: frozenset[str]
    scale_placement: ScalePlacement = "none"
    #: Per-layer scalar K/V scales live outside the cache (model parameters).
    per_tensor_scales: bool = False
    #: Model dtypes its backends accept (None: any model dtype).
    model_dtypes: tuple[str, ...] | None = None

    @property
    def families(self) -> frozenset[str]:
        out = set()
        if self.applies_to & ATTENTION_CLASSES:
            out.add("attention")
        if self.applies_to & MLA_CLASSES:
            out.add("mla")
        return frozenset(out)

    def dtype_for(self, kv_cache_dtype: str, model_dtype: str) -> str:
        return self.storage_dtype or model_dtype

    def packing(self, layer: Layer, separate_scales: bool
                ) -> tuple[int | None, int | None, tuple[ScaleTensor, ...]]:
        """``(state_content_bytes, num_head_slots, scales)``: dense by default."""
        return None, None, ()

    def resolve(self, kv_cache_dtype: str, *, model_dtype: str, kind: str, head_size: int,
                head_size_v: int, num_kv_heads: int, block_size: int,
                state_content_bytes: int | None = None, num_head_slots: int | None = None,
                per_token_head_scales: PerTokenHeadScales = "in_cell") -> LayerQuant:
        """How one layer stores its KV; :class:`QuantizationError` when it cannot.

        ``kind`` is ``"attention"``, ``"mla"`` or a layer kind's name.
        ``state_content_bytes`` / ``num_head_slots`` override the
        backend-published packing (e.g. DeepSeek-V4's 584-byte ``fp8_ds_mla``
        record); the format's own geometry checks are then skipped.
        """
        layer = check_layer(self, kv_cache_dtype, model_dtype=model_dtype, kind=kind,
                            head_size=head_size, head_size_v=head_size_v,
                            num_kv_heads=num_kv_heads, block_size=block_size,
                            state_content_bytes=state_content_bytes,
                            num_head_slots=num_head_slots)
        if per_token_head_scales not in ("in_cell", "separate"):
            raise QuantizationError(
                "per_token_head_scales must be 'in_cell' or 'separate'",
                expected="'in_cell' (the Triton backend's layout) or 'separate'",
                found=repr(per_token_head_scales),
                hint="'in_cell' unless the backend keeps the scales in a tensor of their own")
        if self.model_dtypes is not None:
            self.check_model_dtype(kv_cache_dtype, layer.model_dtype)
        dtype = self.dtype_for(kv_cache_dtype, layer.model_dtype)
        placement = self.scale_placement
        if state_content_bytes is not None or num_head_slots is not None:
            scb, slots, scales = state_content_bytes, num_head_slots, ()
        else:
            scb, slots, scales = self.packing(layer, per_token_head_scales == "separate")
            if scales:
                placement = "separate"
        return LayerQuant(kv_cache_dtype=kv_cache_dtype, mode=self.mode, dtype=dtype,
                          state_content_bytes=scb, num_head_slots=slots, scales=scales,
                          format_name=self.name, scale_placement=placement,
                          per_tensor_scales=self.per_tensor_scales)

    def check_model_dtype(self, kv_cache_dtype: str, model_dtype: str) -> None:
        assert self.model_dtypes is not None
        require(model_dtype in self.model_dtypes,
                f"{kv_cache_dtype} needs a float16 or bfloat16 model",
                found=f"model dtype {model_dtype}",
                hint="TurboQuant and FlashInfer NVFP4 backends do not take float32 "
                     "activations")


@dataclass(frozen=True, slots=True)
class Explicit(QuantFormat):
    """Not quantized: the cache in a named 16-bit dtype instead of the model's."""

    def dtype_for(self, kv_cache_dtype: str, model_dtype: str) -> str:
        return kv_cache_dtype


@dataclass(frozen=True, slots=True)
class DeepSeekMLA(QuantFormat):
    """FlashMLA sparse records: fixed bytes per token for known latent widths."""

    #: head_size -> record bytes.
    records: tuple[tuple[int, int], ...] = ()
    geometry_hint: str = ""

    def check_model_dtype(self, kv_cache_dtype: str, model_dtype: str) -> None:
        require(model_dtype == "bfloat16",
                f"{kv_cache_dtype} needs a bfloat16 model (FlashMLA sparse supports "
                "bfloat16 only)", found=f"model dtype {model_dtype}",
                hint="serve the model in bfloat16 or use fp8 for this MLA layer")

    def packing(self, layer: Layer, separate_scales: bool
                ) -> tuple[int | None, int | None, tuple[ScaleTensor, ...]]:
        require(layer.num_kv_heads == 1,
                f"{self.name} stores one latent per token: num_kv_heads must be 1",
                found=f"num_kv_heads={layer.num_kv_heads}", hint="MLA layers have one KV head")
        known = dict(self.records)
        if self.name == "nvfp4_ds_mla":
            require(layer.head_size in known,
                    "nvfp4_ds_mla (FlashMLA sparse) supports only the 576-dim DeepSeek-V3.2 "
                    "latent", expected="head_size 576", found=f"head_size={layer.head_size}",
                    hint=self.geometry_hint)
        else:
            require(layer.head_size in known,
                    f"fp8_ds_mla has no record size for a {layer.head_size}-dim latent",
                    expected="head_size 576 (DeepSeek-V3.2 latent, 656 B) or 128 (indexer "
                             "key, 132 B)", found=f"head_size={layer.head_size}",
                    hint=self.geometry_hint)
        return known[layer.head_size], None, ()


@dataclass(frozen=True, slots=True)
class PerTokenHead(QuantFormat):
    """Triton's per-token-head formats: a float32 scale after each K and V head."""

    #: Values stored per byte (2 for int4).
    per_byte: int = 1

    def packing(self, layer: Layer, separate_scales: bool
                ) -> tuple[int | None, int | None, tuple[ScaleTensor, ...]]:
        hs, hv = layer.head_size, layer.head_size_v
        require(hs == hv, f"{self.name} needs equal K and V head sizes",
                found=f"head_size={hs}, head_size_v={hv}",
                hint="the Triton backend finds the V half of a cell at content // 2")
        if self.per_byte == 2:
            require(hs % 8 == 0, "int4_per_token_head packs 2 values per byte and aligns "
                    "the fp32 scale after them: head_size must be a multiple of 8",
                    found=f"head_size={hs}", hint="use int8_per_token_head for this layer")
        else:
            require(hs % 4 == 0, f"{self.name} aligns a float32 scale after each head: "
                    "head_size must be a multiple of 4", found=f"head_size={hs}",
                    hint="skip this layer (kv_cache_dtype_skip_layers)")
        data = (hs + hv) // self.per_byte * DTYPE_SIZES[self.storage_dtype or "int8"]
        if not separate_scales:
            return data + 2 * DTYPE_SIZES["float32"], None, ()
        scales = (ScaleTensor("k_scale", "float32", (layer.block_size, layer.num_kv_heads)),
                  ScaleTensor("v_scale", "float32", (layer.block_size, layer.num_kv_heads)))
        return (data if self.per_byte == 2 else None), None, scales


@dataclass(frozen=True, slots=True)
class NvFp4(QuantFormat):
    """FlashInfer NVFP4: K and V heads in separate slots, e2m1 data + e4m3 scales."""

    def packing(self, layer: Layer, separate_scales: bool
                ) -> tuple[int | None, int | None, tuple[ScaleTensor, ...]]:
        hs, hv = layer.head_size, layer.head_size_v
        require(hs == hv, "nvfp4 needs equal K and V head sizes",
                found=f"head_size={hs}, head_size_v={hv}",
                hint="K and V take one head slot each of the same cell size")
        require(hs % 16 == 0, "nvfp4 quantizes in blocks of 16: head_size must be a "
                "multiple of 16", found=f"head_size={hs}", hint="use fp8 for this layer")
        return hs // 2 + hs // 16, 2 * layer.num_kv_heads, ()


@dataclass(frozen=True, slots=True)
class TurboQuant(QuantFormat):
    """TurboQuant: one packed K+V slot per (token, head), Lloyd-Max keys."""

    k_bits: int = 4
    v_bits: int = 4

    def packing(self, layer: Layer, separate_scales: bool
                ) -> tuple[int | None, int | None, tuple[ScaleTensor, ...]]:
        hs, hv = layer.head_size, layer.head_size_v
        require(hs == hv, f"{self.name} needs equal K and V head sizes",
                found=f"head_size={hs}, head_size_v={hv}",
                hint="TurboQuant sizes one packed K+V slot from a single head_dim")
        require(hs & (hs - 1) == 0, f"{self.name} rotates keys with a Sylvester Hadamard "
                "matrix: head_size must be a power of two", found=f"head_size={hs}",
                hint="use fp8 or a per-token-head mode for this layer")
        if self.k_bits == 8:
            require(hs <= 256, "turboquant_k8v4 needs a FlashAttention-compatible head_size "
                    "(<= 256)", found=f"head_size={hs}",
                    hint="use turboquant_4bit_nc or fp8 for this layer")
        # TurboQuantConfig.slot_size_aligned
        key = hs if self.k_bits == 8 else math.ceil(hs * self.k_bits / 8) + 2
        slot = key + math.ceil(hs * self.v_bits / 8) + 4
        return slot + slot % 2, None, ()


_ALL = ATTENTION_CLASSES | MLA_CLASSES
_FP8 = dict(storage_dtype="float8_e4m3fn", applies_to=_ALL, scale_placement="per_tensor",
            per_tensor_scales=True)
_PTH = dict(applies_to=ATTENTION_CLASSES, scale_placement="in_cell")


def _tq(name: str, k_bits: int, v_bits: int) -> TurboQuant:
    return TurboQuant(name, (name,), KVQuantMode[name.upper()], "uint8", DECODER_CLASSES,
                      "in_cell", model_dtypes=_16_BIT, k_bits=k_bits, v_bits=v_bits)


#: Every storage format, in documentation order.
FORMATS: tuple[QuantFormat, ...] = (
    QuantFormat("auto", ("auto",), KVQuantMode.NONE, None, _ALL),
    Explicit("explicit", ("float16", "bfloat16"), KVQuantMode.NONE, None, _ALL),
    QuantFormat("fp8_e4m3", ("fp8", "fp8_e4m3"), KVQuantMode.FP8_PER_TENSOR, **_FP8),
    QuantFormat("fp8_e5m2", ("fp8_e5m2",), KVQuantMode.FP8_PER_TENSOR,
                **{**_FP8, "storage_dtype": "float8_e5m2"}),
    QuantFormat("fp8_inc", ("fp8_inc",), KVQuantMode.FP8_PER_TENSOR, **_FP8),
    DeepSeekMLA("fp8_ds_mla", ("fp8_ds_mla",), KVQuantMode.FP8_PER_TENSOR, "uint8",
                MLA_CLASSES, "in_cell", model_dtypes=("bfloat16",),
                records=((576, 656), (128, 132)),
                geometry_hint="DeepSeek-V4 records (584 B for 512 dims, V4.1: 528 B) depend "
                              "on the model version: pass state_content_bytes explicitly"),
    PerTokenHead("int8_per_token_head", ("int8_per_token_head",),
                 KVQuantMode.INT8_PER_TOKEN_HEAD, "int8", **_PTH),
    PerTokenHead("fp8_per_token_head", ("fp8_per_token_head",),
                 KVQuantMode.FP8_PER_TOKEN_HEAD, "float8_e4m3fn", **_PTH),
    PerTokenHead("int4_per_token_head", ("int4_per_token_head",),
                 KVQuantMode.INT4_PER_TOKEN_HEAD, "uint8", **_PTH, per_byte=2),
    NvFp4("nvfp4", ("nvfp4", "nvfp4_4over6"), KVQuantMode.NVFP4, "uint8", ATTENTION_CLASSES,
          "in_cell", per_tensor_scales=True, model_dtypes=_16_BIT),
    DeepSeekMLA("nvfp4_ds_mla", ("nvfp4_ds_mla",), KVQuantMode.NVFP4_DS_MLA, "uint8",
                frozenset({"mla"}), "in_cell", model_dtypes=("bfloat16",),
                records=((576, 352),),
                geometry_hint="other nvfp4_ds_mla records (e.g. B12X's 432 B) need "
                              "state_content_bytes passed explicitly"),
    _tq("turboquant_k8v4", 8, 4),
    _tq("turboquant_4bit_nc", 4, 4),
    _tq("turboquant_k3v4_nc", 3, 4),
    _tq("turboquant_3bit_nc", 3, 3),
)

_BY_STRING: dict[str, QuantFormat] = {s: f for f in FORMATS for s in f.kv_cache_dtypes}

#: Every ``kv_cache_dtype`` string kvspec accepts (vLLM's ``CacheDType``).
KV_CACHE_DTYPES: tuple[str, ...] = tuple(_BY_STRING)


def format_for(kv_cache_dtype: str) -> QuantFormat:
    """The storage format a ``kv_cache_dtype`` selects; QuantizationError if unknown."""
    fmt = _BY_STRING.get(kv_cache_dtype) if isinstance(kv_cache_dtype, str) else None
    if fmt is None:
        raise QuantizationError(
            f"unknown kv_cache_dtype {kv_cache_dtype!r}", expected=", ".join(KV_CACHE_DTYPES),
            found=repr(kv_cache_dtype), hint="use 'auto' to store the cache in the model dtype")
    return fmt


def formats_of_mode(mode: KVQuantMode) -> tuple[QuantFormat, ...]:
    """All storage formats of a mode (several for FP8_PER_TENSOR and NONE)."""
    return tuple(f for f in FORMATS if f.mode == mode)


def resolve_layer_quant(kv_cache_dtype: str, **layer: object) -> LayerQuant:
    """:meth:`QuantFormat.resolve` of the format ``kv_cache_dtype`` selects."""
    return format_for(kv_cache_dtype).resolve(kv_cache_dtype, **layer)  # type: ignore[arg-type]
