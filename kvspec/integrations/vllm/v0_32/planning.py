"""vLLM 0.32.0's own KV-cache planning, run on a plan's per-stage specs.

:func:`plan` makes the calls ``EngineCore._initialize_kv_caches`` makes in
0.32 (v1/engine/core.py), looked up where the engine core looks them up (so
the plugin's wrapped functions are exercised too)::

    register_all_kvcache_specs -> get_kv_cache_configs (which groups the
    layers itself: kv_cache_utils.get_kv_cache_groups) ->
    generate_scheduler_kv_cache_config ->
    (cache_config.block_size = the smallest prefix-cacheable group's) ->
    update_kv_cache_capacity -> resolve_kv_cache_block_sizes

and returns the result in the reference view's field names, as
:func:`..v0_33.planning.plan` does. 0.32's engine core does not pass global
groups to ``get_kv_cache_configs``; the groups reported are the ones
``get_kv_cache_groups`` makes of the merged specs, computed first the way
``get_kv_cache_configs`` does (merged over the stages, sliding-window layers
tagged with the retained lookahead tokens).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kvspec.integrations.vllm.v0_33 import specs as vspecs
from kvspec.integrations.vllm.v0_33.config import planning_config
from kvspec.integrations.vllm.v0_33.planning import settle, worker_specs

__all__ = ["global_groups", "plan", "worker_specs"]


def global_groups(vc: Any, workers: list[dict[str, Any]]) -> list[Any]:
    """The groups ``get_kv_cache_configs`` makes of the stages' merged specs."""
    # deferred: vLLM (and torch)
    from vllm.v1.core import kv_cache_utils as U
    from vllm.v1.kv_cache_interface import SlidingWindowSpec

    merged: dict[str, Any] = {}
    for worker in workers:
        for name, spec in worker.items():
            merged.setdefault(name, spec)
    extra = max(0, vc.num_prefill_lookahead_tokens - 1)
    for name, spec in merged.items():
        if isinstance(spec, SlidingWindowSpec):
            merged[name] = dataclasses.replace(spec, extra_retained_tokens=extra)
    return U.get_kv_cache_groups(vc, merged)


def plan(settings: dict[str, Any], stages: list[dict[str, dict[str, Any]]],
         memory: int) -> dict[str, Any]:
    """vLLM 0.32's plan of ``stages`` (vLLM descriptions, per stage) for ``memory``
    bytes per rank: the reference view's fields, or ``ok: False`` and the error."""
    vc, adjusted = planning_config(settings)
    out: dict[str, Any] = {"ok": False, "error": None, "config_adjustments": adjusted}
    try:
        workers = worker_specs(stages)
    except vspecs.NotUpstream as exc:
        out["error"] = {"type": "NotUpstream", "message": str(exc), "stage": "specs"}
        return out
    out["input_specs"] = {n: vspecs.describe(s) for w in workers for n, s in w.items()}
    try:
        out.update(_run(vc, workers, memory, out))
        out["ok"] = True
    except Exception as exc:  # noqa: BLE001 - vLLM's code refusing (or failing on) the plan
        out["error"] = {"type": type(exc).__name__, "message": str(exc),
                        "stage": out.get("stage", "groups")}
    return out


def _run(vc: Any, workers: list[dict[str, Any]], memory: int, out: dict[str, Any]
         ) -> dict[str, Any]:
    # deferred: vLLM (and torch)
    from vllm.v1.core import kv_cache_utils as U
    from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
    from vllm.v1.engine import core

    register_all_kvcache_specs(vc)
    out["stage"] = "get_kv_cache_groups"
    groups = global_groups(vc, workers)
    out["builder"] = f"{U.get_kv_cache_groups.__module__}.{U.get_kv_cache_groups.__qualname__}"
    projected = [U._project_kv_cache_groups_to_worker(groups, w) for w in workers]
    pool = [U._pool_bytes_per_block(vc, g) if g else 0 for g in projected]
    out["pool_bytes_per_block"] = pool[0]
    out["stage_pool_bytes_per_block"] = pool
    out["estimated_max_model_len"] = min(
        U._estimate_max_model_len_from_groups(vc, g, memory - b)
        for g, b in zip(projected, pool) if g) if any(projected) else None
    out["stage"] = "get_kv_cache_configs"
    # as the engine core: an attention-free model (no layer planned) gets no memory
    available = [memory if any(workers) else 0] * len(workers)
    configs = core.get_kv_cache_configs(vc, workers, available)
    result = settle(vc, configs)
    out["groups"] = [vspecs.group_view(g, vc) for g in groups]
    for view, pool_bytes in zip(result["workers"], pool):
        view["pool_bytes_per_block"] = pool_bytes
    return result
