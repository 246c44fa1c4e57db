"""The expand pass: a source -> one layer spec per layer on each rank.

Patterns are repeated, defaults and types merged into each layer (defaults <
type < entry), names rendered from templates, KV heads split across
tensor-parallel ranks (replicated when there are fewer heads than ranks, as
vLLM does), each layer's quantization decided (once: the plan and the artifact
take it from here), and layers assigned to pipeline stages. Specs are built
from the layer kinds' registry (:mod:`kvspec.model.kinds`); every problem is
collected and reported together.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvspec.errors import KvspecError, Location, PlanError, format_path, raise_all
from kvspec.model import kinds
from kvspec.model.engine import SETTINGS, Engine
from kvspec.model.names import layers_brief
from kvspec.model.pooling import Pooling
from kvspec.model.quant.cells import Quantized, quantized
from kvspec.model.specs import LayerSpec
from kvspec.model.stages import split_stages
from kvspec.source.document import Document
from kvspec.source.layers import ExpandedLayer, expand_layers
from kvspec.source.pooling import pooling_of
from kvspec.source.schema import Source
from kvspec.source.specs import build_spec

__all__ = ["Expansion", "ExpandedLayer", "build_engine", "expand_source", "layer_cache_dtype"]


@dataclass(frozen=True)
class Expansion:
    """A source expanded: the engine, every layer, each stage's specs."""

    engine: Engine
    layers: tuple[ExpandedLayer, ...]
    stage_specs: tuple[dict[str, LayerSpec], ...]
    layer_paths: dict[str, tuple[str | int, ...]] = field(default_factory=dict)
    #: Each layer's quantization, decided here once (None for state layers).
    quantization: dict[str, Quantized | None] = field(default_factory=dict)
    #: How memory is pooled, and the workload it is chosen for.
    pooling: Pooling = field(default_factory=Pooling)


def _source_value(source: Source, key: str) -> Any:
    value: Any = source
    for part in key.split("."):
        value = getattr(value, part)
    return value


def build_engine(source: Source, max_index: int | None) -> Engine:
    """The engine settings a source gives: each setting read at its source key
    (:data:`kvspec.model.engine.SETTINGS`), ``max_model_len: auto`` standing for
    the model's own maximum (fitted later), the model's decoder layers counted
    from its highest layer index unless given."""
    kw = {s.name: s.from_data(_source_value(source, s.source_key)) for s in SETTINGS
          if s.source_key is not None}
    auto = source.engine.max_model_len == "auto"
    kw["max_model_len"] = int(source.engine.model_max_len or 0) if auto \
        else int(source.engine.max_model_len)
    kw["original_max_model_len"] = -1 if auto else kw["max_model_len"]
    if kw["total_num_hidden_layers"] is None and max_index is not None:
        kw["total_num_hidden_layers"] = max_index + 1
    kw["pp_layer_partition"] = kw["pp_layer_partition"] or None  # []: no partition
    return Engine(**kw)


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
    errors: list[KvspecError] = []
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
           errors: list[KvspecError]
           ) -> tuple[dict[str, LayerSpec], dict[str, Quantized | None]]:
    specs: dict[str, LayerSpec] = {}
    quant: dict[str, Quantized | None] = {}
    memo: dict[tuple, tuple[LayerSpec, Quantized | None]] = {}
    failed: dict[str, tuple[KvspecError, list[str]]] = {}
    by_value: dict[tuple, LayerSpec] = {}
    by_spec: dict[tuple[int, str], Quantized | None] = {}  # layers sharing a spec share it
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
                if (id(spec), cache) not in by_spec:
                    by_spec[id(spec), cache] = None if state else quantized(spec, cache)
                found = memo[key] = (spec, by_spec[id(spec), cache])
        except KvspecError as exc:
            err = exc if exc.file else exc.at(_loc(doc, layer.path))
            failed.setdefault(err.render(), (err, []))[1].append(layer.name)
            continue
        specs[layer.name], quant[layer.name] = found
    for err, names in failed.values():  # one problem, once, naming every layer it hits
        errors.append(err.replace(message=f"{err.message} (in {len(names)} layers: "
                                  f"{layers_brief(names)})") if len(names) > 1 else err)
    return specs, quant


def expand_source(source: Source, doc: Document) -> Expansion:
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
    specs, quant = _specs(layers, engine, source, doc, errors)
    pooling = pooling_of(source, doc, errors)
    raise_all(errors)
    try:
        stages = split_stages(list(specs), engine.pipeline_parallel_size,
                              engine.total_num_hidden_layers, engine.pp_layer_partition)
    except PlanError as exc:
        raise exc.at(_loc(doc, ("parallel",))) from None
    return Expansion(engine, tuple(layers), tuple({n: specs[n] for n in st} for st in stages),
                     {layer.name: layer.path for layer in layers}, quant, pooling)
