"""vLLM 0.32.0's own ``Scheduler`` and ``KVCacheManager``, built on CPU for a plan.

As :mod:`..v0_33.scheduler` (whose :class:`VllmEngine` drives it: the
scheduler's interface is the same in 0.32), with 0.32's planning calls:
``get_kv_cache_configs`` groups the layers itself.
"""

from __future__ import annotations

from typing import Any

from kvspec.integrations.vllm.v0_33.scheduler import VllmEngine
from kvspec.integrations.vllm.v0_33.scheduler import build as shared_build

__all__ = ["VllmEngine", "build"]


def kv_cache_configs(vc: Any, workers: list[Any], memory: int) -> list[Any]:
    """The engine core's per-worker KV-cache configs at ``memory`` each (vLLM 0.32 has
    no global groups step: ``get_kv_cache_configs`` groups the layers itself)."""
    # deferred: vllm, imported only in its own environment
    from vllm.v1.engine import core

    return core.get_kv_cache_configs(vc, workers, [memory] * len(workers))


def build(settings: dict[str, Any], stages: list[dict[str, dict[str, Any]]], memory: int,
          num_blocks: int, *, hash_fn: str = "sha256") -> tuple[Any, Any]:
    """(scheduler, block hasher or None) for the plan of ``stages`` at ``memory``: 0.33's
    construction, with 0.32's configs."""
    return shared_build(settings, stages, memory, num_blocks, hash_fn=hash_fn,
                        configs_of=kv_cache_configs)
