"""The expand pass: a source -> one layer spec per layer on each rank.

Patterns are repeated, defaults and types merged into each layer (defaults <
type < entry), names rendered from templates, KV heads split across
tensor-parallel ranks (replicated when there are fewer heads than ranks, as
vLLM does), quantization resolved per layer, and layers assigned to pipeline
stages. Specs are built from the layer kinds' registry
(:mod:`kvspec.model.kinds`); every problem is collected and reported together.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvspec.errors import KvspecError, Location, PlanError, raise_all
from kvspec.model import kinds
from kvspec.model.engine import Engine
from kvspec.model.names import layers_brief
from kvspec.model.specs import LayerSpec
from kvspec.planner.stages import split_stages
from kvspec.source.document import Document, format_path
from kvspec.source.layers import ExpandedLayer, expand_layers
from kvspec.source.schema import Source
from kvspec.source.specs import build_spec

__all__ = ["Expanded", "ExpandedLayer", "build_engine", "expand", "layer_cache_dtype"]


@dataclass(frozen=True)
class Expanded:
    engine: Engine
    layers: tuple[ExpandedLayer, ...]
    stage_specs: tuple[dict[str, LayerSpec], ...]
    layer_paths: dict[str, tuple[str | int, ...]] = field(default_factory=dict)
    #: Each layer's quantization mode (None for state layers).
    kv_cache_dtypes: dict[str, str | None] = field(default_factory=dict)


def build_engine(source: Source, max_index: int | None) -> Engine:
    """The engine settings a source's ``engine`` and ``parallel`` sections give."""
    from kvspec.model.axes import AxisOrder

    e, par = source.engine, source.parallel
    auto = e.max_model_len == "auto"
    max_len = e.model_max_len if auto else e.max_model_len
    return Engine(
        block_size=e.block_size, max_model_len=int(max_len or 0),
        original_max_model_len=-1 if auto else int(e.max_model_len),  # type: ignore[arg-type]
        max_num_batched_tokens=e.max_num_batched_tokens, max_num_seqs=e.max_num_seqs,
        max_num_encoder_input_tokens=e.max_num_encoder_input_tokens,
        async_scheduling=e.async_scheduling, enable_prefix_caching=e.prefix_caching,
        hybrid=e.hybrid, axis_order=AxisOrder.parse(e.layout),
        kv_cache_dtype=source.quantization.kv_cache_dtype, tensor_parallel_size=par.tensor,
        pipeline_parallel_size=par.pipeline, decode_context_parallel_size=par.decode_context,
        num_gpu_blocks_override=e.num_blocks, mamba_cache_mode=e.mamba_cache_mode,
        mamba_block_size=e.mamba_block_size, prefix_match_unit=e.prefix_match_unit,
        num_prefill_lookahead_tokens=e.prefill_lookahead_tokens,
        speculative_method=e.speculative_method, draft_pool=e.draft.pool,
        draft_block_size=e.draft.block_size, draft_pool_blocks=e.draft.pool_blocks,
        total_num_hidden_layers=par.num_hidden_layers
        or (max_index + 1 if max_index is not None else None),
        pp_layer_partition=tuple(par.pipeline_partition) if par.pipeline_partition else None)


def layer_cache_dtype(layer: ExpandedLayer, source: Source) -> str:
    """The layer's quantization mode: its own, ``auto`` when skipped, else the source's."""
    cache = layer.fields.get("kv_cache_dtype")
    if cache is None:
        skipped = layer.index is not None and layer.index in source.quantization.skip_layers
        cache = "auto" if skipped else source.quantization.kv_cache_dtype
    return cache


def _loc(doc: Document, path: tuple) -> Location:
    pos = doc.position(path)
    return Location(doc.file, pos[0] if pos else None, pos[1] if pos else None,
                    format_path(path))


def _duplicates(layers: list[ExpandedLayer], doc: Document) -> list[KvspecError]:
    seen: set[str] = set()
    errors = []
    for layer in layers:
        if layer.name in seen:
            errors.append(doc.error(f"layer name {layer.name!r} is used twice", layer.path,
                                    hint="each layer needs its own name; check layer_name "
                                    "templates and explicit names"))
        seen.add(layer.name)
    return errors


def _spec_key(fields: dict[str, Any], cache: str) -> tuple | None:
    """What a layer's spec is built from, hashable (None when it is not): the
    fields but the name, which a flat layer list gives every layer. Equal keys
    mean equal fields (fields in another order only miss the cache)."""
    key = (cache, *((k, v) for k, v in fields.items() if k != "layer_name"))
    try:
        hash(key)  # scalars only: the common case
    except TypeError:
        key = (cache, *((k, _frozen(v)) for k, v in fields.items() if k != "layer_name"))
        try:
            hash(key)
        except TypeError:
            return None
    return key


def _frozen(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    return value


def _specs(layers: list[ExpandedLayer], engine: Engine, source: Source, doc: Document,
           errors: list[KvspecError]) -> tuple[dict[str, LayerSpec], dict[str, str | None]]:
    specs: dict[str, LayerSpec] = {}
    dtypes: dict[str, str | None] = {}
    memo: dict[tuple, tuple[LayerSpec, str | None]] = {}
    failed: dict[str, tuple[KvspecError, list[str]]] = {}
    by_value: dict[tuple, LayerSpec] = {}
    for layer in layers:
        cache = layer_cache_dtype(layer, source)
        key = (id(layer.fields), cache)  # layers of one type share their fields
        try:
            found = memo.get(key)
            if found is None:  # identical layers share one spec object
                value = _spec_key(layer.fields, cache)
                spec = by_value.get(value) if value is not None else None
                if spec is None:
                    spec = build_spec(layer, engine, cache, doc)
                    if value is not None:
                        by_value[value] = spec
                kind = layer.fields.get("kind")
                state = kind is not None and kinds.by_name(kind).state
                found = memo[key] = (spec, None if state else cache)
        except KvspecError as exc:
            err = exc if exc.file else exc.at(_loc(doc, layer.path))
            failed.setdefault(err.render(), (err, []))[1].append(layer.name)
            continue
        specs[layer.name], dtypes[layer.name] = found
    for err, names in failed.values():  # one problem, once, naming every layer it hits
        errors.append(err.replace(message=f"{err.message} (in {len(names)} layers: "
                                  f"{layers_brief(names)})") if len(names) > 1 else err)
    return specs, dtypes


def expand(source: Source, doc: Document) -> Expanded:
    """Expand and build every rank's layer specs; report every problem at once."""
    layers, errors = expand_layers(source, doc)
    errors += _duplicates(layers, doc)
    indices = [layer.index for layer in layers if layer.index is not None]
    engine = build_engine(source, max(indices) if indices else None)
    if source.engine.max_model_len == "auto" and source.engine.model_max_len is None:
        errors.append(doc.error("max_model_len: auto needs the model's maximum length",
                                ("engine", "max_model_len"),
                                expected="engine.model_max_len: <the model's max tokens>",
                                hint="e.g. model_max_len: 131072"))
    specs, dtypes = _specs(layers, engine, source, doc, errors)
    raise_all(errors)
    try:
        stages = split_stages(list(specs), engine.pipeline_parallel_size,
                              engine.total_num_hidden_layers, engine.pp_layer_partition)
    except PlanError as exc:
        raise exc.at(_loc(doc, ("parallel",))) from None
    return Expanded(engine, tuple(layers), tuple({n: specs[n] for n in st} for st in stages),
                    {layer.name: layer.path for layer in layers}, dtypes)
