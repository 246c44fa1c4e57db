"""Element types by name (torch's names without the ``torch.`` prefix) and sizes.

The compiler never imports torch: dtypes are names here, resolved to
``torch.dtype`` objects only by the runtime loader.

>>> dtype_size("bfloat16")
2
"""

from __future__ import annotations

#: Bytes per element of every dtype a KV cache page may be viewed as.
DTYPE_SIZES: dict[str, int] = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2": 1,
    "float8_e5m2fnuz": 1,
    "uint8": 1,
    "int8": 1,
    "int16": 2,
    "int32": 4,
    "int64": 8,
}

#: Spellings users write that mean one of the names above.
DTYPE_ALIASES: dict[str, str] = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
    "fp32": "float32",
    "float": "float32",
    "fp8_e4m3": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2",
}


def canonical_dtype(name: str) -> str:
    """Return the canonical dtype name, or raise ``KeyError`` if unknown.

    >>> canonical_dtype("torch.bfloat16"), canonical_dtype("fp16")
    ('bfloat16', 'float16')
    """
    name = name.removeprefix("torch.")
    name = DTYPE_ALIASES.get(name, name)
    if name not in DTYPE_SIZES:
        raise KeyError(name)
    return name


def dtype_size(name: str) -> int:
    """Bytes per element of the dtype ``name``."""
    return DTYPE_SIZES[canonical_dtype(name)]
