"""The artifact's KV-cache groups as vLLM's group specs, for the plugin's enforce mode.

Shared by the 0.33 and 0.32 builders: both versions declare the group and spec
classes used here alike (``vllm.v1.kv_cache_interface``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from vllm.v1.kv_cache_interface import KVCacheGroupSpec, UniformTypeKVCacheSpecs

from kvspec.integrations.vllm.guard import PLAN_NEUTRAL_FIELDS, Expectation
from kvspec.integrations.vllm.specs import same_value
from kvspec.integrations.vllm.v0_33 import specs as vspecs

__all__ = ["artifact_groups"]


def artifact_groups(exp: Expectation, specs: dict[str, Any]) -> list[KVCacheGroupSpec]:
    """The artifact's groups over the layers vLLM passed, with the engine's own
    per-layer specs (already checked equal) and the artifact's group spec."""
    out = []
    for view in exp.expected_groups(specs):
        names = view["layer_names"]
        desc = view["spec"]
        if desc["class"] == "UniformTypeKVCacheSpecs":
            spec = UniformTypeKVCacheSpecs(block_size=desc["block_size"],
                                           kv_cache_specs={n: specs[n] for n in names})
        else:
            spec = _like_engine(vspecs.materialize(desc), specs[names[0]])
        out.append(KVCacheGroupSpec(names, spec, is_eagle_group=view["is_eagle_group"]))
    return out


def _like_engine(spec: Any, engine_spec: Any) -> Any:
    """The artifact's group spec, with the plan-neutral fields the engine set (and the
    sliding-window lookahead tokens ``get_kv_cache_configs`` tagged, where the version
    has them), and the engine's storage dtype where both mean the same bytes: kvspec
    names an fp8 cache's storage ``float8_e4m3fn``, the engine ``uint8``, and its kernels
    read the views it makes from the group spec in that dtype ("key_cache must be uint8
    for FP8 path", vLLM 0.32's CPU engine)."""
    fields = {f.name for f in dataclasses.fields(spec) if f.init}
    keep = {f: getattr(engine_spec, f) for f in (*PLAN_NEUTRAL_FIELDS, "extra_retained_tokens")
            if f in fields and hasattr(engine_spec, f)}
    for name in ("dtype", "dtypes"):
        if name in fields and hasattr(engine_spec, name) and same_value(
                name, vspecs.plain(getattr(engine_spec, name)), vspecs.plain(getattr(spec, name))):
            keep[name] = getattr(engine_spec, name)
    return dataclasses.replace(spec, **keep) if keep else spec
