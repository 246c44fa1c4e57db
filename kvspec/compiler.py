"""``compile()``: a fold over the compiler passes, source bytes -> artifact.

The pipeline is data: :data:`PASSES` is an ordered tuple of pure functions
``Unit -> Unit``, so a test can run any prefix of it and look at the result::

    load -> parse -> expand -> plan -> size -> freeze

>>> from pathlib import Path
>>> art = compile_source(Path("layouts/llama-3.1-8b.yaml").read_text(), "llama.yaml")
>>> art.body["groups"][0]["kind"], art.body["stages"][0]["bytes_per_block"]
('full_attention', 2097152)
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from kvspec.artifact import Artifact, freeze, sha256_text
from kvspec.errors import ErrorList, KvspecError, Location, PlanError, SourceError
from kvspec.planner.checks import early_checks
from kvspec.planner.plan import Plan, Resolved, min_blocks_to_serve, plan_layers, resolve
from kvspec.planner.size import block_sizes, group_blocks_per_request, memory_usage
from kvspec.source.expand import Expanded, expand
from kvspec.source.model import LayerFields, Source
from kvspec.source.yamlpos import Document, format_path, parse_yaml
from kvspec.spec import (
    Attention,
    MambaState,
    layer_specs,
    spec_kind_name,
)


@dataclass(frozen=True)
class Unit:
    """Everything the compiler knows about one source, pass by pass."""

    text: str
    file: str
    memory: int | None = None
    doc: Document | None = None
    source: Source | None = None
    expanded: Expanded | None = None
    plan: Plan | None = None
    resolved: Resolved | None = None
    artifact: Artifact | None = None


Pass = Callable[[Unit], Unit]


def load(unit: Unit) -> Unit:
    """Bytes -> YAML document with positions."""
    doc = parse_yaml(unit.text, unit.file)
    if not isinstance(doc.data, dict):
        raise SourceError("a kvspec source must be a YAML mapping", file=unit.file, line=1,
                          column=1, expected="kvspec: 1, name: ..., engine: ..., layers: ...",
                          found=type(doc.data).__name__)
    return dataclasses.replace(unit, doc=doc)


def parse(unit: Unit) -> Unit:
    """YAML document -> the source model (schema version 1); all problems at once."""
    doc = unit.doc
    assert doc is not None
    try:
        source = Source.model_validate(doc.data)
    except ValidationError as exc:
        raise ErrorList([_schema_error(doc, e) for e in exc.errors(include_url=False)]) from None
    return dataclasses.replace(unit, source=source)


def _schema_error(doc: Document, err: dict[str, Any]) -> SourceError:
    loc = _clean_loc(err["loc"])
    kind = err["type"]
    found = err.get("input")
    found_s = None if isinstance(found, (dict, list)) else repr(found)
    if kind == "extra_forbidden":
        key = loc[-1]
        allowed = _allowed_fields(loc[:-1])
        close = difflib.get_close_matches(str(key), allowed, n=1)
        return doc.error(f"unknown field {key!r}", loc, key=True,
                         expected="one of " + ", ".join(sorted(allowed)) if allowed else None,
                         hint=f"did you mean {close[0]!r}?" if close else
                         "remove it, or check the indentation")
    if kind == "missing":
        return doc.error(f"missing required field {loc[-1]!r}", loc[:-1],
                         expected=f"{loc[-1]}: ...", hint="see docs/format.md")
    if kind == "literal_error":
        return doc.error(f"invalid value for {loc[-1]!r}", loc,
                         expected=err.get("ctx", {}).get("expected"), found=found_s)
    return doc.error(f"invalid value for {format_path(loc)}: {err['msg']}", loc, found=found_s)


def _clean_loc(loc: tuple) -> tuple:
    out: list = []
    for i, part in enumerate(loc):
        # discriminated-union tags and type names pydantic inserts into locations
        if isinstance(part, str) and i > 0 and isinstance(loc[i - 1], int) and \
                part in ("pattern", "layer") and len(loc) > i + 1:
            continue
        if isinstance(part, str) and part in ("int", "str", "literal['auto']",
                                              "function-after[validate(), str]") \
                and i > 0:
            continue
        out.append(part)
    return tuple(out)


def _allowed_fields(parent: tuple) -> list[str]:
    from kvspec.source import model as m
    table = {(): m.Source, ("engine",): m.EnginePolicy, ("parallel",): m.Parallelism,
             ("quantization",): m.Quantization, ("defaults",): m.LayerFields,
             ("engine", "draft"): m.DraftPolicy}
    if parent in table:
        return list(table[parent].model_fields)
    if len(parent) == 2 and parent[0] == "layer_types":
        return list(LayerFields.model_fields)
    if len(parent) == 2 and parent[0] == "layers":
        return sorted(set(m.LayerEntry.model_fields) | set(m.PatternEntry.model_fields))
    return []


def expand_pass(unit: Unit) -> Unit:
    """Source -> one spec per layer per rank (patterns, defaults, TP, quantization)."""
    assert unit.source is not None and unit.doc is not None
    return dataclasses.replace(unit, expanded=expand(unit.source, unit.doc))


def plan_pass(unit: Unit) -> Unit:
    """Layer specs -> groups, per-stage projection and placement (no budget needed)."""
    ex = unit.expanded
    assert ex is not None and unit.doc is not None
    try:
        plan = plan_layers(ex.engine, list(ex.stage_specs))
    except KvspecError as err:
        raise _place_error(err, unit) from None
    return dataclasses.replace(unit, plan=plan)


def size_pass(unit: Unit) -> Unit:
    """Check one request fits and size the pool for the budget, when there is one."""
    plan = unit.plan
    assert plan is not None and unit.source is not None
    memory = unit.memory
    if memory is None and unit.source.engine.memory is not None:
        memory = int(unit.source.engine.memory)
    if memory is None and plan.engine.num_gpu_blocks_override is None:
        if plan.engine.auto_max_model_len:
            raise _place_error(PlanError(
                "max_model_len: auto needs a memory budget to fit it to",
                path="engine.memory", hint="set engine.memory, or a fixed max_model_len"),
                unit)
        return unit
    try:
        resolved = resolve(plan, memory=memory)
    except KvspecError as err:
        raise _place_error(err, unit) from None
    return dataclasses.replace(unit, resolved=resolved, memory=memory)


def freeze_pass(unit: Unit) -> Unit:
    """The plan -> the frozen, hashed artifact."""
    body = artifact_body(unit)
    return dataclasses.replace(unit, artifact=Artifact(freeze(body, source_sha256=sha256_text(unit.text))))


def locate(err: KvspecError, unit: Unit) -> KvspecError:
    """Place a planner error at the YAML position its path names."""
    return _place_error(err, unit)


def _place_error(err: KvspecError, unit: Unit) -> KvspecError:
    doc = unit.doc
    if err.file or doc is None:
        return err
    layer = getattr(err, "layer", None)
    if layer and not err.path and unit.expanded is not None and layer in unit.expanded.layer_paths:
        lpath = unit.expanded.layer_paths[layer]
        pos = doc.position(lpath)
        return err.at(Location(doc.file, pos[0] if pos else None, pos[1] if pos else None,
                               format_path(lpath)))
    path = _path_tuple(err.path) if err.path else ("layers",)
    pos = doc.position(path)
    return err.at(Location(doc.file, pos[0] if pos else None, pos[1] if pos else None,
                           err.path or "layers"))


def _path_tuple(path: str) -> tuple:
    out: list = []
    for part in path.replace("]", "").replace("[", ".").split("."):
        if part:
            out.append(int(part) if part.isdigit() else part)
    return tuple(out)


PASSES: tuple[Pass, ...] = (load, parse, expand_pass, plan_pass, size_pass, freeze_pass)


def run(unit: Unit, passes: tuple[Pass, ...] = PASSES) -> Unit:
    for p in passes:
        unit = p(unit)
    return unit


def compile_source(text: str, file: str = "<input>", *, memory: int | None = None) -> Artifact:
    """Compile source text; raise :class:`KvspecError` on bad input."""
    unit = run(Unit(text=text, file=file, memory=memory))
    assert unit.artifact is not None
    return unit.artifact


def read_source(path: str | Path) -> str:
    from kvspec.files import read_text
    return read_text(path, what="the source",
                     hint="give the path of a layout source, e.g. layouts/llama-3.1-8b.yaml")


def compile(path: str | Path, *, memory: int | None = None) -> Artifact:  # noqa: A001
    """Compile the source file at ``path`` into a verified artifact."""
    return compile_source(read_source(path), str(path), memory=memory)


def compile_unit(path: str | Path, *, memory: int | None = None,
                 passes: tuple[Pass, ...] = PASSES) -> Unit:
    return run(Unit(text=read_source(path), file=str(path), memory=memory), passes)


# ---------------------------------------------------------------------------
# the artifact body
# ---------------------------------------------------------------------------


def _group_entry(gid: int, group: Any, engine: Any, stage0: Any) -> dict[str, Any]:
    """A group as the artifact lists it; its byte accounting is that of one
    block on stage 0 (the block a request holds in this group)."""
    spec = group.spec
    local = stage0.groups[gid] if gid < len(stage0.groups) else None  # same order
    names = local.layer_names if local is not None else ()
    useful = sum(group.layer_spec(n).unpadded_page_size_bytes for n in names)
    allocated = local.page_bytes() if (local is not None and group.own_pool) \
        else stage0.bytes_per_block
    return {
        "id": gid,
        "kind": spec_kind_name(spec),
        "class": spec.ref_class,
        "layers": list(group.layer_names),
        "block_size": spec.block_size,
        "page_size_bytes": spec.page_size_bytes,
        "page_size_padded": getattr(spec, "page_size_padded", None),
        "padding_slots": group.padding_slots,
        "useful_bytes_per_block": useful,
        "padding_bytes_per_block": allocated - useful,
        "own_pool": group.own_pool,
        "is_eagle": group.is_eagle,
        "prefix_cacheable": spec.prefix_cacheable,
        "max_memory_usage_bytes": spec.max_memory_usage_bytes(engine),
        "blocks_per_request": group_blocks_per_request(engine, group),
        "max_num_blocks_per_req": _safe_width(spec, engine),
        "spec": spec.describe(),
    }


def _safe_width(spec: Any, engine: Any) -> int | None:
    try:
        return spec.max_num_blocks_per_req(engine, engine.max_model_len)
    except ValueError:
        return None


def _quant_entry(spec: Any, layer: Any, source: Source) -> dict[str, Any]:
    """The layer's quantization mode and the addressable parts of its cells."""
    from kvspec import quantization
    from kvspec.source.expand import layer_cache_dtype
    from kvspec.spec import MLA, SlidingWindowMLA

    if not isinstance(spec, Attention) or layer is None:
        return {"kv_cache_dtype": None, "cell_parts": None, "per_tensor_scales": False}
    cache = layer_cache_dtype(layer, source)
    mla = isinstance(spec, (MLA, SlidingWindowMLA))
    try:
        parts = quantization.cell_parts(
            cache, kind="mla" if mla else "attention", dtype=spec.dtype,
            head_size=spec.head_size, head_size_v=spec.head_size_v or 0,
            cell_bytes=spec.state_content_size_bytes)
        per_tensor = quantization.format_for(cache).per_tensor_scales
    except KvspecError:
        parts, per_tensor = None, False
    return {"kv_cache_dtype": cache,
            "cell_parts": [p.as_dict() for p in parts] if parts else None,
            "per_tensor_scales": per_tensor}


def _needs_zeroing(groups: list) -> bool:
    """State layers read before fully written, or mixed precision: zero new blocks."""
    specs = [s for g in groups for s in layer_specs(g.spec)]
    if any(isinstance(s, MambaState) for s in specs):
        return True
    precisions = {(s.dtype, s.kv_quant_mode) for s in specs if isinstance(s, Attention)}
    return len(precisions) > 1


def artifact_body(unit: Unit) -> dict[str, Any]:
    plan, source, ex = unit.plan, unit.source, unit.expanded
    assert plan is not None and source is not None and ex is not None
    engine = unit.resolved.engine if unit.resolved is not None else plan.engine
    eng = dataclasses.asdict(plan.engine)
    eng["layout"] = plan.engine.layout.name
    eng["max_model_len"] = engine.max_model_len
    eng["model_max_len"] = plan.engine.max_model_len
    eng["max_in_flight_tokens"] = engine.max_in_flight_tokens
    eng["async_scheduling"] = engine.async_scheduling_resolved
    eng["num_blocks"] = eng.pop("num_gpu_blocks_override")
    eng["pp_layer_partition"] = list(eng["pp_layer_partition"]) if eng["pp_layer_partition"] else None
    st0 = plan.stages[0]
    groups = [_group_entry(i, g, engine, st0) for i, g in enumerate(plan.groups)]
    layers = {}
    group_of = {n: i for i, g in enumerate(plan.groups) for n in g.layer_names}
    expanded = {layer.name: layer for layer in ex.layers}
    for st in plan.stages:
        for name, spec in ((n, s) for n, s in plan.specs.items() if n in st.layer_names):
            layers[name] = {"group": group_of.get(name), "stage": st.index,
                            "spec": spec.describe(),
                            **_quant_entry(spec, expanded.get(name), source)}
    stages = []
    for st in plan.stages:
        stage_groups = list(st.groups)
        tensors = []
        for t in st.tensors:
            g = next(g for g in stage_groups if t.layers[0] in g.layer_names)
            tensors.append({
                "layers": list(t.layers), "size": t.size.to_json(),
                "layer_stride": t.layer_stride.to_json(),
                "block_stride": t.block_stride.to_json(), "offset": t.offset.to_json(),
                "host_resident": t.host_resident, "pool": t.pool, "role": t.role,
                "group": group_of[t.layers[0]],
                "spec": g.layer_spec(t.layers[0]).describe()})
        usage = memory_usage(engine, stage_groups) if stage_groups else 0
        stages.append({
            "index": st.index, "layers": list(st.layer_names),
            "bytes_per_block": st.bytes_per_block, "fixed_bytes": st.fixed_bytes,
            "draft_num_blocks": st.draft_num_blocks,
            "draft_layers": list(st.draft_layer_names),
            "memory_per_request": usage,
            "min_num_blocks": min_blocks_to_serve(dataclasses.replace(plan, engine=engine)),
            "groups": [list(g.layer_names) for g in stage_groups],
            "tensors": tensors})
    sched, hashed = block_sizes(engine, list(st0.groups)) if st0.groups else (
        engine.block_size, engine.block_size)
    budget = None
    if unit.resolved is not None:
        r = unit.resolved
        budget = {"memory": r.available, "num_blocks": r.num_blocks,
                  "max_concurrency": r.max_concurrency,
                  "kv_cache_size_tokens": r.kv_cache_size_tokens,
                  "max_model_len": r.engine.max_model_len,
                  "estimated_max_model_len": min(s.estimated_max_model_len for s in r.stages)}
    return {
        "name": source.name,
        "model": source.model,
        "engine": eng,
        "layers": layers,
        "groups": groups,
        "stages": stages,
        "scheduler_block_size": sched,
        "hash_block_size": hashed,
        "needs_zeroing": _needs_zeroing(list(plan.groups)),
        "budget": budget,
        "log": [{"level": lv, "message": m} for lv, m in plan.log.entries],
        "warnings": early_checks(plan, unit.resolved),
    }
