"""Temporary: maps kv_cache_dtype strings to KVQuantMode (replaced by kvspec.quantization)."""

from __future__ import annotations

try:
    from kvspec.quantization import KVQuantMode, quant_mode  # noqa: F401
except ImportError:  # pragma: no cover
    from enum import IntEnum

    class KVQuantMode(IntEnum):  # type: ignore[no-redef]
        NONE = 0
        FP8_PER_TENSOR = 1

    def quant_mode(kv_cache_dtype: str) -> KVQuantMode:  # type: ignore[misc]
        return KVQuantMode.FP8_PER_TENSOR if kv_cache_dtype.startswith("fp8") else KVQuantMode.NONE
