"""The reference view: a plan in the field names of the reference planner.

``kvspec plan --json`` prints this so any plan can be compared field by field
with the reference planner's output (``tests/conformance/REFERENCE-README.md``).
"""

from __future__ import annotations

from typing import Any

from kvspec.errors import KvspecError
from kvspec.model.geometry import view_geometry
from kvspec.model.kinds import ref_kind_name
from kvspec.model.plan import Group, Plan
from kvspec.planner import Sizing


def group_view(group: Group, engine) -> dict[str, Any]:
    spec = group.spec
    try:
        max_blocks = spec.max_num_blocks_per_req(engine, engine.max_model_len)
    except ValueError:
        max_blocks = None
    return {
        "layer_names": list(group.layer_names),
        "kind": ref_kind_name(spec),
        "spec_class": spec.ref_class,
        "block_size": spec.block_size,
        "page_size_bytes": spec.page_size_bytes,
        "page_size_padded": getattr(spec, "page_size_padded", None),
        "sliding_window": getattr(spec, "sliding_window", None),
        "attention_chunk_size": getattr(spec, "attention_chunk_size", None),
        "is_eagle_group": group.is_eagle,
        "padding_slots": group.padding_slots,
        "max_memory_usage_bytes": spec.max_memory_usage_bytes(engine),
        "max_num_blocks_per_req": max_blocks,
    }


def views_of(sizing: Sizing, stage: int = 0) -> list[dict[str, Any]]:
    """Per tensor and layer, the ``[B, H, N, C]`` view for the sized block count."""
    plan = sizing.plan
    st = plan.stages[stage]
    result = sizing.stages[stage]
    out = []
    for index, (tensor, fields) in enumerate(zip(st.tensors, result.tensors)):
        spec = st.groups[tensor.group].layer_spec(tensor.layers[0])
        blocks = sizing.num_blocks
        if tensor.pool == "draft":
            assert st.draft_num_blocks is not None, "a draft tensor's stage has a draft pool"
            blocks = st.draft_num_blocks
        geoms = view_geometry(tensor.layers, int(fields["layer_stride"]),
                              int(fields["block_stride"]), int(fields["offset"]), spec, blocks,
                              plan.engine.axis_order)
        out.append({"tensor": index, "num_blocks": blocks, "layers": [
            {"layer": g.layer, "dtype": g.dtype, "shape": list(g.shape),
             "stride": list(g.stride), "storage_offset": g.storage_offset} for g in geoms]})
    return out


def reference_view(plan: Plan, sizing: Sizing, *, with_views: bool = False) -> dict[str, Any]:
    engine = sizing.engine
    st0 = plan.stages[0]
    view: dict[str, Any] = {
        "ok": True,
        "error": None,
        "num_blocks": sizing.num_blocks,
        "draft_num_blocks": st0.draft_num_blocks,
        "pool_bytes_per_block": st0.bytes_per_block,
        "groups": [group_view(g, engine) for g in plan.groups],
        "kv_cache_tensors": list(sizing.stages[0].tensors),
        "workers": [{"num_blocks": r.num_blocks, "kv_cache_tensors": list(r.tensors)}
                    for r in sizing.stages],
        "scheduler_block_size": sizing.scheduler_block_size,
        "hash_block_size": sizing.hash_block_size,
        "max_concurrency": sizing.max_concurrency,
        "kv_cache_size_tokens": sizing.kv_cache_size_tokens,
        "max_model_len": engine.max_model_len,
        "estimated_max_model_len": sizing.estimated_max_model_len,
        "kv_cache_layout": engine.axis_order.name,
        "planner_log": [{"level": lv, "message": m} for lv, m in plan.log],
    }
    if with_views:
        view["views"] = views_of(sizing)
    return view


def error_view(error: KvspecError) -> dict[str, Any]:
    data = error.as_dict()
    return {"ok": False, "error": {"type": type(error).__name__, "message": error.message},
            "errors": data.get("errors", [data]),
            "num_blocks": None, "draft_num_blocks": None, "pool_bytes_per_block": None,
            "groups": None, "kv_cache_tensors": None, "workers": None,
            "scheduler_block_size": None, "hash_block_size": None, "max_concurrency": None,
            "kv_cache_size_tokens": None, "max_model_len": None,
            "estimated_max_model_len": getattr(error, "estimated_max_model_len", None)}
