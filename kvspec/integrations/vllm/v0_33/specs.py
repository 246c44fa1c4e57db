"""vLLM 0.33.0 spec objects <-> the bridge's plain descriptions (:mod:`..specs`).

``materialize`` builds the real ``KVCacheSpec`` (torch dtypes, enums) from a
description; ``describe`` reads one back; ``config_view`` turns a
``KVCacheConfig`` into the reference view's field names.
"""

from __future__ import annotations

import dataclasses
import enum
from fractions import Fraction
from functools import cache
from typing import Any

import torch
from vllm.v1 import kv_cache_interface as kvi
from vllm.v1.attention.backend import MultipleOf
from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum


class NotUpstream(Exception):
    """A spec class the installed vLLM does not have (the message names it)."""


def _dtype(name: str) -> torch.dtype:
    value = getattr(torch, name, None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return value


def _real(field: str, value: Any) -> Any:
    if value is None:
        return None
    if field == "dtype":
        return _dtype(value)
    if field == "dtypes":
        return tuple(_dtype(d) for d in value)
    if field == "shapes":
        return tuple(tuple(int(x) for x in s) for s in value)
    if field == "kv_quant_mode":
        return kvi.KVQuantMode(value)
    if field == "mamba_type":
        return MambaAttentionBackendEnum[value]
    if field == "cache_role":
        return kvi.SparseCacheRole(value)
    if field == "block_stride_alignment" and isinstance(value, dict):
        return MultipleOf(value["MultipleOf"])
    if field == "tokens_per_state" and isinstance(value, str):
        return Fraction(value)
    return value


def spec_class(name: str) -> type:
    cls = getattr(kvi, name, None)
    if not (isinstance(cls, type) and issubclass(cls, kvi.KVCacheSpec)):
        raise NotUpstream(f"vLLM {_version()} has no {name}")
    return cls


def _version() -> str:
    # deferred: vLLM (and torch)
    import vllm
    return vllm.__version__


def materialize(desc: dict[str, Any]) -> kvi.KVCacheSpec:
    """The real vLLM spec of a description; fields the class lacks must hold
    their kvspec default (None/False/0), else :class:`NotUpstream`."""
    cls = spec_class(desc["class"])
    if cls is kvi.UniformTypeKVCacheSpecs:
        return cls(block_size=desc["block_size"],
                   kv_cache_specs={n: materialize(d) for n, d in desc["kv_cache_specs"].items()})
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    kwargs = {}
    for field, value in desc.items():
        if field in ("class", "page_size_bytes"):  # the page size is derived
            continue
        if field not in names:
            if value not in (None, False, 0):
                raise NotUpstream(f"vLLM {_version()}'s {desc['class']} has no field "
                                  f"{field} (kvspec: {value!r})")
            continue
        kwargs[field] = _real(field, value)
    spec = cls(**kwargs)
    padded = desc.get("page_size_padded")
    if padded is not None and getattr(spec, "page_size_padded", None) != padded:
        object.__setattr__(spec, "page_size_padded", padded)
    return spec


def plain(value: Any) -> Any:
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if isinstance(value, MambaAttentionBackendEnum):
        return value.name
    if isinstance(value, enum.IntEnum):
        return int(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, MultipleOf):
        return {"MultipleOf": value.base}
    if isinstance(value, Fraction):
        return value.numerator if value.denominator == 1 else str(value)
    if isinstance(value, (tuple, list)):
        return [plain(v) for v in value]
    return value


def describe(spec: kvi.KVCacheSpec) -> dict[str, Any]:
    """The plain description of a vLLM spec, with its ``page_size_bytes``."""
    if isinstance(spec, kvi.UniformTypeKVCacheSpecs):
        return {"class": type(spec).__name__, "block_size": spec.block_size,
                "kv_cache_specs": {n: describe(s) for n, s in spec.kv_cache_specs.items()},
                "page_size_bytes": spec.page_size_bytes}
    out: dict[str, Any] = {"class": type(spec).__name__}
    for f in dataclasses.fields(spec):
        if f.init:
            out[f.name] = plain(getattr(spec, f.name))
    out["page_size_bytes"] = spec.page_size_bytes
    return out


@cache
def class_defaults() -> dict[str, dict[str, Any]]:
    """Every spec class's field defaults, as plain values."""
    out: dict[str, dict[str, Any]] = {}
    for name in dir(kvi):
        cls = getattr(kvi, name)
        if isinstance(cls, type) and issubclass(cls, kvi.KVCacheSpec) \
                and dataclasses.is_dataclass(cls):
            out[name] = {f.name: plain(f.default) for f in dataclasses.fields(cls)
                         if f.init and f.default is not dataclasses.MISSING}
    return out


def group_view(group: kvi.KVCacheGroupSpec, vllm_config: Any) -> dict[str, Any]:
    """A group in the reference view's field names (``reports.refview``)."""
    s = group.kv_cache_spec
    view = {"layer_names": list(group.layer_names), "spec_class": type(s).__name__,
            "block_size": s.block_size, "page_size_bytes": s.page_size_bytes,
            "page_size_padded": getattr(s, "page_size_padded", None),
            "sliding_window": getattr(s, "sliding_window", None),
            "attention_chunk_size": getattr(s, "attention_chunk_size", None),
            "is_eagle_group": group.is_eagle_group}
    for field, call in (("max_memory_usage_bytes", lambda: s.max_memory_usage_bytes(vllm_config)),
                        ("max_num_blocks_per_req", lambda: s.max_num_blocks_per_req(
                            vllm_config, vllm_config.model_config.max_model_len))):
        try:
            view[field] = call()
        except (ValueError, AssertionError, NotImplementedError):
            view[field] = None
    return view


def tensor_view(t: kvi.KVCacheTensor) -> dict[str, Any]:
    return {"size": t.size, "layers": list(t.layers), "layer_stride": t.layer_stride,
            "block_stride": t.block_stride, "offset": t.offset,
            "host_resident": t.host_resident}


def config_view(config: kvi.KVCacheConfig) -> dict[str, Any]:
    """One worker's ``KVCacheConfig``: blocks, tensors, its groups' layers."""
    return {"num_blocks": config.num_blocks,
            "kv_cache_tensors": [tensor_view(t) for t in config.kv_cache_tensors],
            "groups": [list(g.layer_names) for g in config.kv_cache_groups]}
