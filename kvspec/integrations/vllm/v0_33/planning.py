"""vLLM 0.33.0's own KV-cache planning, run on a plan's per-stage specs.

:func:`plan` makes the calls ``EngineCore._initialize_kv_caches`` makes
(v1/engine/core.py), looked up where the engine core looks them up, so a
plugin that wraps them is exercised too::

    register_all_kvcache_specs -> get_global_kv_cache_groups ->
    get_kv_cache_configs -> generate_scheduler_kv_cache_config ->
    (cache_config.block_size = the smallest prefix-cacheable group's) ->
    update_kv_cache_capacity -> resolve_kv_cache_block_sizes

and returns the result in the reference view's field names.
"""

from __future__ import annotations

from typing import Any

from kvspec.integrations.vllm.v0_33 import specs as vspecs
from kvspec.integrations.vllm.v0_33.config import planning_config

#: Layers vLLM 0.33.0's model runner leaves out of planning: an encoder-only
#: attention layer's ``get_kv_cache_spec`` is None, and the runner adds its group
#: after planning, without memory (``may_add_encoder_only_layers_to_kv_cache_config``).
UNPLANNED = frozenset({"EncoderOnlyAttentionSpec"})


def worker_specs(stages: list[dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """One dict of real specs per pipeline stage (its tensor-parallel ranks are
    alike), as vLLM's model runner reports them: without :data:`UNPLANNED` layers."""
    return [{n: vspecs.materialize(d) for n, d in st.items() if d["class"] not in UNPLANNED}
            for st in stages]


def plan(settings: dict[str, Any], stages: list[dict[str, dict[str, Any]]],
         memory: int) -> dict[str, Any]:
    """vLLM's plan of ``stages`` (vLLM descriptions, per stage) for ``memory``
    bytes per rank: the reference view's fields, or ``ok: False`` and the error."""
    vc, adjusted = planning_config(settings)
    out: dict[str, Any] = {"ok": False, "error": None, "config_adjustments": adjusted}
    try:
        workers = worker_specs(stages)
    except vspecs.NotUpstream as exc:
        out["error"] = {"type": "NotUpstream", "message": str(exc), "stage": "specs"}
        return out
    out["input_specs"] = {n: vspecs.describe(s) for w in workers for n, s in w.items()}
    stage = "groups"
    try:
        out.update(_run(vc, workers, memory, out))
        out["ok"] = True
    except Exception as exc:  # noqa: BLE001 - vLLM's code refusing (or failing on) the plan
        out["error"] = {"type": type(exc).__name__, "message": str(exc),
                        "stage": out.get("stage", stage)}
    return out


def _run(vc: Any, workers: list[dict[str, Any]], memory: int, out: dict[str, Any]
         ) -> dict[str, Any]:
    # deferred: vLLM (and torch)
    from vllm.v1.core import kv_cache_planning as P
    from vllm.v1.core.kv_cache_config_builder import get_kv_cache_config_builder
    from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
    from vllm.v1.engine import core

    register_all_kvcache_specs(vc)
    out["stage"] = "get_global_kv_cache_groups"
    groups = core.get_global_kv_cache_groups(vc, workers)
    builder = get_kv_cache_config_builder(vc)
    out["builder"] = f"{type(builder).__module__}.{type(builder).__qualname__}"
    projected = [P._project_kv_cache_groups_to_worker(groups, w) for w in workers]
    pool = [P._pool_bytes_per_block_from_builder(builder, vc, g) for g in projected]
    out["pool_bytes_per_block"] = pool[0]
    out["stage_pool_bytes_per_block"] = pool
    out["estimated_max_model_len"] = min(
        P._estimate_max_model_len_from_groups(builder, vc, g, memory - b)
        for g, b in zip(projected, pool) if g) if any(projected) else None
    out["stage"] = "get_kv_cache_configs"
    # as the engine core: an attention-free model (no layer planned) gets no memory
    available = [memory if any(workers) else 0] * len(workers)
    configs = core.get_kv_cache_configs(vc, workers, available, groups)
    result = settle(vc, configs)
    # at the max_model_len planning settled on (fitted to memory when it was auto),
    # as kvspec reports a group's figures
    out["groups"] = [vspecs.group_view(g, vc) for g in groups]
    for view, pool_bytes in zip(result["workers"], pool):
        view["pool_bytes_per_block"] = pool_bytes
    return result


def settle(vc: Any, configs: list[Any]) -> dict[str, Any]:
    # deferred: vLLM (and torch)
    from vllm.v1.core import kv_cache_utils as U
    from vllm.v1.engine import core

    sched = core.generate_scheduler_kv_cache_config(configs)
    kgs = sched.kv_cache_groups
    concurrency = None  # the engine core asks it only of a model with layers planned
    if kgs:
        part = [g.kv_cache_spec.block_size for g in kgs if g.kv_cache_spec.prefix_cacheable]
        vc.cache_config.block_size = min(part or [g.kv_cache_spec.block_size for g in kgs])
        core.update_kv_cache_capacity(vc, sched)
        concurrency = U.get_max_concurrency_for_kv_cache_config(vc, sched)
    sbs, hbs = core.resolve_kv_cache_block_sizes(sched, vc)
    workers = [vspecs.config_view(c) for c in configs]
    return {
        "num_blocks": sched.num_blocks,
        "draft_num_blocks": None,
        "kv_cache_tensors": workers[0]["kv_cache_tensors"],
        "workers": workers,
        "scheduler_block_size": sbs,
        "hash_block_size": hbs,
        "engine_block_size": vc.cache_config.block_size,
        "max_concurrency": concurrency,
        "kv_cache_size_tokens": vc.cache_config.kv_cache_size_tokens,
        "max_model_len": vc.model_config.max_model_len,
        "kv_tp_replicas": configs[0].kv_tp_replicas,
        "kv_cache_layout": vc.cache_config.kv_cache_layout,
    }
