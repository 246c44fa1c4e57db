"""The artifact body: the Layout IR as plain, canonical JSON data, and back.

:func:`encode` is pure serialisation (every figure is already in the IR).
:func:`decode_inputs` reads back what the plan was made *from* -- the engine,
each layer's spec, stage and quantization mode, the budget -- so the reader
can plan it again and require the same body (:mod:`kvspec.artifact.verify`).

>>> from kvspec.compiler import compile
>>> body = encode(compile("layouts/llama-3.1-8b.yaml").layout)
>>> body["groups"][0]["strategy"], body["engine"]["layout"]
('uniform', 'LBNHC')
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from kvspec.model import kinds
from kvspec.model.affine import Affine
from kvspec.model.axes import AxisOrder
from kvspec.model.engine import Engine
from kvspec.model.plan import Group, Layout, Stage, Tensor
from kvspec.model.quant.cells import CellPart
from kvspec.model.specs import LayerSpec
from kvspec.model.specs.base import once_per_object

# ---------------------------------------------------------------------------
# encode
# ---------------------------------------------------------------------------


def _fields(obj: Any) -> dict[str, Any]:
    """A dataclass of plain values as a dict (``dataclasses.asdict`` deep-copies
    every value, which costs more than the rest of encoding)."""
    return {name: getattr(obj, name) for name in _field_names(type(obj))}


@cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def encode_engine(layout: Layout) -> dict[str, Any]:
    """The engine settings the plan was made for, derived values resolved."""
    planned, final = layout.plan.engine, layout.engine
    out = _fields(planned)
    out["layout"] = out.pop("axis_order").name
    out["max_model_len"] = final.max_model_len
    out["model_max_len"] = planned.max_model_len
    out["max_in_flight_tokens"] = final.max_in_flight_tokens
    out["async_scheduling"] = final.async_scheduling_resolved
    out["num_blocks"] = out.pop("num_gpu_blocks_override")
    if out["pp_layer_partition"] is not None:
        out["pp_layer_partition"] = list(out["pp_layer_partition"])
    return out


Describe = Callable[[LayerSpec], dict[str, Any]]


def _cell_dicts(parts: tuple[CellPart, ...] | None) -> list[dict[str, Any]] | None:
    return [p.as_dict() for p in parts] if parts else None


def _group(gid: int, g: Group, layout: Layout, describe: Describe) -> dict[str, Any]:
    fig = layout.group_figures[gid]
    spec = g.spec
    return {
        "id": gid, "kind": kinds.ref_kind_name(spec), "class": spec.ref_class,
        "strategy": g.strategy, "role": g.role, "layers": list(g.layer_names),
        "block_size": spec.block_size, "page_size_bytes": spec.page_size_bytes,
        "page_size_padded": getattr(spec, "page_size_padded", None),
        "padding_slots": g.padding_slots,
        "useful_bytes_per_block": fig.useful_bytes_per_block,
        "padding_bytes_per_block": fig.padding_bytes_per_block,
        "own_pool": g.own_pool, "is_eagle": g.is_eagle,
        "prefix_cacheable": spec.prefix_cacheable,
        "max_memory_usage_bytes": fig.max_memory_usage_bytes,
        "blocks_per_request": fig.blocks_per_request,
        "max_num_blocks_per_req": fig.max_num_blocks_per_req,
        "spec": describe(spec),
    }


def _tensor(t: Tensor, stage: Stage, describe: Describe) -> dict[str, Any]:
    group = stage.groups[t.group]
    return {"layers": list(t.layers), "size": t.size.to_json(),
            "layer_stride": t.layer_stride.to_json(), "block_stride": t.block_stride.to_json(),
            "offset": t.offset.to_json(), "host_resident": t.host_resident, "pool": t.pool,
            "role": t.role, "group": t.group,
            "spec": describe(group.layer_spec(t.layers[0]))}


def _stage(st: Stage, layout: Layout, describe: Describe) -> dict[str, Any]:
    fig = layout.stage_figures[st.index]
    return {"index": st.index, "layers": list(st.layer_names),
            "bytes_per_block": st.bytes_per_block, "fixed_bytes": st.fixed_bytes,
            "draft_num_blocks": st.draft_num_blocks,
            "draft_layers": list(st.draft_layer_names),
            "memory_per_request": fig.memory_per_request, "min_num_blocks": fig.min_num_blocks,
            "groups": [list(g.layer_names) for g in st.groups],
            "tensors": [_tensor(t, st, describe) for t in st.tensors]}


def encode(layout: Layout) -> dict[str, Any]:
    """The artifact body of ``layout`` (plain JSON data)."""
    layers = {}
    describe: Describe = once_per_object(kinds.describe)
    cells = once_per_object(_cell_dicts)
    # Layers alike in everything share one entry.
    entries: dict[tuple, dict[str, Any]] = {}
    for name, e in layout.layers.items():
        key = (e.group, e.stage, id(e.spec), e.kv_cache_dtype, id(e.cell_parts),
               e.per_tensor_scales)
        entry = entries.get(key)
        if entry is None:
            entry = entries[key] = {"group": e.group, "stage": e.stage,
                                    "spec": describe(e.spec),
                                    "kv_cache_dtype": e.kv_cache_dtype,
                                    "cell_parts": cells(e.cell_parts),
                                    "per_tensor_scales": e.per_tensor_scales}
        layers[name] = entry
    b = layout.budget
    return {
        "name": layout.name, "model": layout.model, "engine": encode_engine(layout),
        "layers": layers,
        "groups": [_group(i, g, layout, describe) for i, g in enumerate(layout.groups)],
        "stages": [_stage(st, layout, describe) for st in layout.stages],
        "scheduler_block_size": layout.scheduler_block_size,
        "hash_block_size": layout.hash_block_size, "needs_zeroing": layout.needs_zeroing,
        "budget": None if b is None else _fields(b),
        "log": [{"level": lv, "message": m} for lv, m in layout.plan.log],
        "warnings": list(layout.warnings),
    }


# ---------------------------------------------------------------------------
# decode: what the plan was made from
# ---------------------------------------------------------------------------

_DERIVED_ENGINE = ("layout", "max_model_len", "model_max_len", "max_in_flight_tokens",
                   "num_blocks", "pp_layer_partition")


@dataclass(frozen=True, slots=True)
class Inputs:
    """What a layout was planned from: enough to plan it again."""

    name: str
    model: str | None
    engine: Engine
    stage_specs: tuple[dict[str, LayerSpec], ...]
    kv_cache_dtypes: dict[str, str | None]
    memory: int | None


def decode_engine(data: Mapping[str, Any]) -> Engine:
    fields = {f.name for f in dataclasses.fields(Engine)}
    kw = {k: v for k, v in data.items() if k in fields and k not in _DERIVED_ENGINE}
    partition = data["pp_layer_partition"]
    return Engine(**kw, axis_order=AxisOrder.parse(data["layout"]),
                  max_model_len=data["model_max_len"],
                  num_gpu_blocks_override=data["num_blocks"],
                  pp_layer_partition=tuple(partition) if partition is not None else None)


def decode_inputs(body: Mapping[str, Any]) -> Inputs:
    """The planning inputs of a body; ``KeyError``/``TypeError``/``ValueError``
    when it is not one."""
    layers = body["layers"]
    by_id: dict[int, LayerSpec] = {}  # a compiled body shares one description per spec
    recent: list[tuple[Any, LayerSpec]] = []  # a read one: equal descriptions, one spec
    by_text: dict[Any, LayerSpec] = {}  # past a handful of distinct specs

    def spec_of(name: str) -> LayerSpec:
        data = layers[name]["spec"]
        spec = by_id.get(id(data))
        if spec is not None:
            return spec
        for seen, spec in recent:  # one dict compare (C) finds a layer's spec among a few
            if seen == data:
                by_id[id(data)] = spec
                return spec
        try:  # JSON read from canonical text keeps its keys sorted
            key: Any = tuple(data.items())
            hash(key)
        except TypeError:  # a list among the values (state shapes)
            key = repr(data)
        spec = by_text.get(key)
        if spec is None:
            spec = by_text[key] = kinds.spec_from_dict(data)
        if len(recent) < 8:
            recent.append((data, spec))
        by_id[id(data)] = spec
        return spec

    stages = tuple({n: spec_of(n) for n in st["layers"]} for st in body["stages"])
    budget = body["budget"]
    return Inputs(body["name"], body["model"], decode_engine(body["engine"]), stages,
                  {n: layers[n]["kv_cache_dtype"] for st in stages for n in st},
                  None if budget is None else int(budget["memory"]))


def affine(value: Any) -> Affine:
    return Affine.from_json(value)
