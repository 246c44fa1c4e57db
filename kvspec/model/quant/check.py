"""The checks every quantization format makes of a layer before its own rules.

A layer is described by its kind (``"attention"``, ``"mla"`` or a layer
kind's name from :mod:`kvspec.model.kinds`), its model dtype and its shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvspec.model import kinds
from kvspec.model.dtypes import canonical_dtype
from kvspec.model.quant.modes import QuantizationError

if TYPE_CHECKING:  # pragma: no cover
    from kvspec.model.quant.formats import QuantFormat

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
    from kvspec.model.quant.formats import KV_CACHE_DTYPES, format_for

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
