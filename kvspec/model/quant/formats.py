"""Storage formats of a quantized KV cache: objects that carry their own rules.

Each ``kv_cache_dtype`` selects one :class:`QuantFormat`. A format knows the
layers it applies to, the model dtypes its backends take, its storage dtype,
and how it packs a cell: the reference's ``state_content_bytes`` (C, when not
dense K||V), ``num_head_slots`` (H, when not one slot per KV head) and any
scale tensors kept apart from the data. :meth:`QuantFormat.layer_quant` checks a
layer against those rules and returns a :class:`LayerQuant`; the page is then
the layer spec's ``H * N * C``. What each format stores and where its numbers
come from in vLLM is in docs/quantization.md.

>>> q = format_for("int4_per_token_head").layer_quant(
...     "int4_per_token_head", model_dtype="bfloat16", kind="attention",
...     head_size=128, head_size_v=128, num_kv_heads=8, block_size=16)
>>> q.dtype, q.state_content_bytes, q.num_head_slots
('uint8', 136, None)
"""

# one idea: the formats and the layer checks they all make first (the checks name
# the formats in their messages, the formats run the checks), in one module.

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from kvspec.model import kinds
from kvspec.model.dtypes import DTYPE_SIZES, canonical_dtype
from kvspec.model.quant.modes import KVQuantMode, QuantizationError

ScalePlacement = Literal["none", "per_tensor", "in_cell", "separate"]
PerTokenHeadScales = Literal["in_cell", "separate"]

#: Quantization classes of standard attention (K and V per KV head) and of MLA.
ATTENTION_CLASSES = frozenset({"full", "sliding", "chunked", "cross", "encoder", "sink"})
MLA_CLASSES = frozenset({"mla", "sliding_mla"})
DECODER_CLASSES = frozenset({"full", "sliding", "chunked", "sink"})
_16_BIT = ("float16", "bfloat16")


# ---------------------------------------------------------------------------
# the checks every format makes of a layer before its own rules: a layer is
# described by its kind ("attention", "mla" or a layer kind's name from
# kvspec.model.kinds), its model dtype and its shape
# ---------------------------------------------------------------------------

_MODEL_DTYPES = ("float16", "bfloat16", "float32")

#: Hints for a format that has no MLA path, by what it is.
_NO_MLA_HINTS = {
    "per_token_head": "per-token-head modes exist only in vLLM's Triton attention backend, "
    "which has no MLA path; for MLA use fp8 (dense 576 B latent), fp8_ds_mla or "
    "nvfp4_ds_mla (DeepSeek sparse MLA), or skip the layer",
    "nvfp4": "NVFP4 is a FlashInfer (standard attention) format; the MLA counterpart is "
    "nvfp4_ds_mla (FlashMLA sparse, 576-dim latent)",
    "turboquant": "TurboQuant packs separate K and V per KV head and its backend has no MLA "
    "path; use fp8 for an MLA layer or skip it",
}


@dataclass(frozen=True, slots=True)
class Layer:
    """A layer as a format sees it, checked and canonical."""

    family: str  # "attention" | "mla"
    quant_class: str | None  # e.g. "full", "sliding", "mla"; None: family only
    model_dtype: str
    head_size: int
    head_size_v: int
    num_kv_heads: int
    block_size: int


def require(cond: bool, message: str, *, found: str, hint: str,
            expected: str | None = None) -> None:
    if not cond:
        raise QuantizationError(message, found=found, hint=hint, expected=expected)


def _positive(name: str, value: object, *, allow_zero: bool = False) -> int:
    expected = "an integer >= 0" if allow_zero else "an integer >= 1"
    if isinstance(value, bool) or not isinstance(value, int):
        raise QuantizationError(f"{name} must be an integer", expected=expected,
                                found=repr(value), hint=f"give {name} as a whole number")
    if value < 0 or (value == 0 and not allow_zero):
        raise QuantizationError(
            f"{name} must be {'non-negative' if allow_zero else 'positive'}",
            expected=expected, found=str(value), hint=f"give {name} as a count of at least "
            f"{0 if allow_zero else 1}")
    return value


def model_dtype_of(model_dtype: str) -> str:
    """The canonical model (activation) dtype; QuantizationError if it cannot
    hold a KV cache."""
    try:
        name = canonical_dtype(model_dtype)
    except (KeyError, AttributeError):
        raise QuantizationError(f"unknown model dtype {model_dtype!r}",
                                expected=", ".join(_MODEL_DTYPES),
                                found=repr(model_dtype),
                                hint="the model dtype is the activation dtype, named as "
                                "torch names it") from None
    if name not in _MODEL_DTYPES:
        raise QuantizationError(
            f"model dtype {name} cannot hold a KV cache", expected=", ".join(_MODEL_DTYPES),
            found=name, hint="the model dtype is the activation dtype (bfloat16, float16 "
                             "or float32)")
    return name


def _kind(kind: str) -> tuple[str, str | None]:
    """``(family, quant class)`` of a kind name, or of a bare family."""
    if kind in ("attention", "mla"):
        return kind, None
    try:
        k = kinds.by_name(kind)
    except (KeyError, TypeError):
        k = None
    if k is None or k.quant_class is None:
        names = sorted(x.name for x in kinds.KINDS if x.quant_class is not None)
        raise QuantizationError(f"unknown layer kind {kind!r}",
                                expected="attention, mla (or a specific kind: "
                                + ", ".join(names) + ")", found=repr(kind),
                                hint="a layer kind of kvspec.model.kinds, or attention / mla")
    return ("mla" if k.latent else "attention"), k.quant_class


def _check_family(fmt: QuantFormat, kv_cache_dtype: str, family: str, kind: str) -> None:
    if family in fmt.families:
        return
    if family == "mla":
        what = ("per_token_head" if fmt.mode.is_per_token_head else "nvfp4"
                if fmt.mode.is_nvfp4 else "turboquant" if fmt.mode.is_turboquant else "")
        raise QuantizationError(
            f"kv_cache_dtype {kv_cache_dtype!r} does not apply to MLA layers",
            expected="a kv_cache_dtype for MLA: " + ", ".join(
                s for s in KV_CACHE_DTYPES if "mla" in format_for(s).families),
            found=kv_cache_dtype,
            hint=_NO_MLA_HINTS.get(what, "add the layer to kv_cache_dtype_skip_layers"))
    raise QuantizationError(
        f"kv_cache_dtype {kv_cache_dtype!r} applies to MLA layers only, not standard "
        "attention", expected="an MLA layer (one latent per token, head_size_v = 0)",
        found=f"kind {kind!r}",
        hint="use fp8 (or nvfp4 / a per-token-head mode) for standard attention layers, "
             "or skip this layer (kv_cache_dtype_skip_layers)")


def check_layer(fmt: QuantFormat, kv_cache_dtype: str, *, model_dtype: str, kind: str,
                head_size: int, head_size_v: int, num_kv_heads: int, block_size: int,
                state_content_bytes: int | None, num_head_slots: int | None) -> Layer:
    """The checks common to every format; the layer as the format's rules see it."""
    mdt = model_dtype_of(model_dtype)
    family, qclass = _kind(kind)
    _check_family(fmt, kv_cache_dtype, family, kind)
    if qclass is not None and qclass not in fmt.applies_to:
        raise QuantizationError(
            f"kv_cache_dtype {kv_cache_dtype!r} does not support {kind!r} layers",
            expected="one of: " + ", ".join(sorted(fmt.applies_to)), found=kind,
            hint="skip this layer (kv_cache_dtype_skip_layers) to keep it in the model dtype")
    hs = _positive("head_size", head_size)
    hv = _positive("head_size_v", head_size_v, allow_zero=True)
    nkv = _positive("num_kv_heads", num_kv_heads)
    _positive("block_size", block_size)
    for name, value in (("state_content_bytes", state_content_bytes),
                        ("num_head_slots", num_head_slots)):
        if value is not None:
            _positive(name, value)
    if family == "mla":
        require(hv == 0, "an MLA layer stores one latent per token: head_size_v must be 0",
                found=f"head_size_v={hv}",
                hint="put the whole latent (kv_lora_rank + rope dim, e.g. 576) in head_size")
    elif hv == 0:
        raise QuantizationError(
            "a standard attention layer needs head_size_v > 0", found="head_size_v=0",
            hint="pass head_size_v = head_size unless V has its own width; use kind='mla' "
                 "for a latent cache")
    return Layer(family, qclass, mdt, hs, hv, nkv, block_size)


# ---------------------------------------------------------------------------
# the formats
# ---------------------------------------------------------------------------

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

    def layer_quant(self, kv_cache_dtype: str, *, model_dtype: str, kind: str, head_size: int,
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
        scales: tuple[ScaleTensor, ...]
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


def _fp8(name: str, kv_cache_dtypes: tuple[str, ...],
         storage_dtype: str = "float8_e4m3fn") -> QuantFormat:
    return QuantFormat(name, kv_cache_dtypes, KVQuantMode.FP8_PER_TENSOR, storage_dtype, _ALL,
                       "per_tensor", per_tensor_scales=True)


def _pth(name: str, mode: KVQuantMode, storage_dtype: str, per_byte: int = 1) -> PerTokenHead:
    return PerTokenHead(name, (name,), mode, storage_dtype, ATTENTION_CLASSES, "in_cell",
                        per_byte=per_byte)


def _tq(name: str, k_bits: int, v_bits: int) -> TurboQuant:
    return TurboQuant(name, (name,), KVQuantMode[name.upper()], "uint8", DECODER_CLASSES,
                      "in_cell", model_dtypes=_16_BIT, k_bits=k_bits, v_bits=v_bits)


#: Every storage format, in documentation order.
FORMATS: tuple[QuantFormat, ...] = (
    QuantFormat("auto", ("auto",), KVQuantMode.NONE, None, _ALL),
    Explicit("explicit", ("float16", "bfloat16"), KVQuantMode.NONE, None, _ALL),
    _fp8("fp8_e4m3", ("fp8", "fp8_e4m3")),
    _fp8("fp8_e5m2", ("fp8_e5m2",), "float8_e5m2"),
    _fp8("fp8_inc", ("fp8_inc",)),
    DeepSeekMLA("fp8_ds_mla", ("fp8_ds_mla",), KVQuantMode.FP8_PER_TENSOR, "uint8",
                MLA_CLASSES, "in_cell", model_dtypes=("bfloat16",),
                records=((576, 656), (128, 132)),
                geometry_hint="DeepSeek-V4 records (584 B for 512 dims, V4.1: 528 B) depend "
                              "on the model version: pass state_content_bytes explicitly"),
    _pth("int8_per_token_head", KVQuantMode.INT8_PER_TOKEN_HEAD, "int8"),
    _pth("fp8_per_token_head", KVQuantMode.FP8_PER_TOKEN_HEAD, "float8_e4m3fn"),
    _pth("int4_per_token_head", KVQuantMode.INT4_PER_TOKEN_HEAD, "uint8", per_byte=2),
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


def layer_quant(kv_cache_dtype: str, **layer: object) -> LayerQuant:
    """:meth:`QuantFormat.layer_quant` of the format ``kv_cache_dtype`` selects."""
    return format_for(kv_cache_dtype).layer_quant(kv_cache_dtype, **layer)  # type: ignore[arg-type]
