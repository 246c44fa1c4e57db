"""The reference's quantization modes and its ``kv_cache_dtype`` -> mode mapping.

>>> quant_mode("nvfp4_ds_mla"), quant_mode("nvfp4"), quant_mode("fp8_ds_mla")
(<KVQuantMode.NVFP4_DS_MLA: 10>, <KVQuantMode.NVFP4: 5>, <KVQuantMode.FP8_PER_TENSOR: 1>)
"""

from __future__ import annotations

from enum import IntEnum

from kvspec.errors import KvspecError


class QuantizationError(KvspecError, ValueError):
    """A ``kv_cache_dtype`` that does not fit a layer (kind, dtype or shape)."""


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
        return self in (KVQuantMode.INT8_PER_TOKEN_HEAD, KVQuantMode.FP8_PER_TOKEN_HEAD,
                        KVQuantMode.INT4_PER_TOKEN_HEAD)

    @property
    def is_nvfp4(self) -> bool:
        """True for NVFP4 only (not NVFP4_DS_MLA), as in the reference."""
        return self == KVQuantMode.NVFP4

    @property
    def is_turboquant(self) -> bool:
        return self.name.startswith("TURBOQUANT_")

    @property
    def is_quantized(self) -> bool:
        return self != KVQuantMode.NONE


_EXACT = {
    "int4_per_token_head": KVQuantMode.INT4_PER_TOKEN_HEAD,
    "int8_per_token_head": KVQuantMode.INT8_PER_TOKEN_HEAD,
    "fp8_per_token_head": KVQuantMode.FP8_PER_TOKEN_HEAD,
    # Must precede the nvfp4 prefix rule, which would otherwise match.
    "nvfp4_ds_mla": KVQuantMode.NVFP4_DS_MLA,
}

TURBOQUANT_PRESETS = ("turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc",
                      "turboquant_3bit_nc")


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
    if kv_cache_dtype in _EXACT:
        return _EXACT[kv_cache_dtype]
    if kv_cache_dtype.startswith("nvfp4"):
        return KVQuantMode.NVFP4
    if kv_cache_dtype.startswith("turboquant_"):
        if kv_cache_dtype not in TURBOQUANT_PRESETS:
            raise QuantizationError(
                f"unknown TurboQuant kv_cache_dtype {kv_cache_dtype!r}",
                expected=", ".join(TURBOQUANT_PRESETS), found=kv_cache_dtype,
                hint="TurboQuant presets are " + ", ".join(TURBOQUANT_PRESETS))
        return KVQuantMode[kv_cache_dtype.upper()]
    if kv_cache_dtype.startswith("fp8"):
        return KVQuantMode.FP8_PER_TENSOR
    return KVQuantMode.NONE
