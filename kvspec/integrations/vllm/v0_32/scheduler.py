"""vLLM 0.32.0's own ``Scheduler`` and ``KVCacheManager``, built on CPU for a plan.

As :mod:`..v0_33.scheduler` (whose :class:`VllmEngine` drives it: the
scheduler's interface is the same in 0.32), with 0.32's planning calls:
``get_kv_cache_configs`` groups the layers itself.
"""

from __future__ import annotations

from typing import Any

from kvspec.integrations.vllm.v0_33.config import planning_config
from kvspec.integrations.vllm.v0_33.planning import worker_specs
from kvspec.integrations.vllm.v0_33.scheduler import VllmEngine

__all__ = ["VllmEngine", "build"]


def build(settings: dict[str, Any], stages: list[dict[str, dict[str, Any]]], memory: int,
          num_blocks: int, *, hash_fn: str = "sha256") -> tuple[Any, Any]:
    """(scheduler, block hasher or None) for the plan of ``stages`` at ``memory``."""
    # deferred: vllm, imported only in its own environment
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils as U
    from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
    from vllm.v1.engine import core
    from vllm.v1.structured_output import StructuredOutputManager

    vc, _ = planning_config(settings)
    register_all_kvcache_specs(vc)
    workers = worker_specs(stages)
    configs = core.get_kv_cache_configs(vc, workers, [memory] * len(workers))
    config = core.generate_scheduler_kv_cache_config(configs)
    config.num_blocks = num_blocks
    vc.cache_config.num_gpu_blocks = num_blocks
    cacheable = [g.kv_cache_spec.block_size for g in config.kv_cache_groups
                 if g.kv_cache_spec.prefix_cacheable]
    vc.cache_config.block_size = min(cacheable or [g.kv_cache_spec.block_size
                                                   for g in config.kv_cache_groups])
    if settings.get("mamba_cache_mode", "none") in ("none", None) and config.has_mamba_layers:
        vc.cache_config.enable_prefix_caching = False  # vLLM caches states only in "align"
    core.update_kv_cache_capacity(vc, config)
    scheduler_block_size, hash_block_size = core.resolve_kv_cache_block_sizes(config, vc)
    cls = vc.scheduler_config.get_scheduler_cls()
    scheduler = cls(vllm_config=vc, kv_cache_config=config,
                    structured_output_manager=StructuredOutputManager(vc),
                    block_size=scheduler_block_size, hash_block_size=hash_block_size,
                    log_stats=False)
    hasher = None
    if vc.cache_config.enable_prefix_caching:
        fn = get_hash_fn_by_name(hash_fn)
        U.init_none_hash(fn)
        hasher = U.get_request_block_hasher(hash_block_size, fn)
    return scheduler, hasher
