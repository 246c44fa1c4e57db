"""The expand pass: a source -> one layer spec per layer on each rank.

Patterns are repeated, defaults and types merged into each layer (defaults <
type < entry), names rendered from templates, KV heads split across
tensor-parallel ranks (replicated when there are fewer heads than ranks, as
vLLM does), quantization resolved per layer, and layers assigned to pipeline
stages. Every problem is collected and reported together.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvspec.dtypes import canonical_dtype
from kvspec.engine import Engine
from kvspec.errors import KvspecError, PlanError
from kvspec.layouts import Layout
from kvspec.planner.stages import split_stages
from kvspec.source.model import LayerFields, LayerEntry, PatternEntry, Source
from kvspec.source.yamlpos import Document
from kvspec.spec import LayerSpec

#: Kinds whose KV heads are not split across tensor-parallel ranks (a latent).
_UNSPLIT = ("mla", "sliding_window_mla", "hidden_state")

#: Fields each kind requires.
_REQUIRED: dict[str, tuple[str, ...]] = {
    "sliding_window": ("sliding_window",),
    "sliding_window_mla": ("sliding_window",),
    "kpool_tail": ("sliding_window",),
    "chunked_local": ("attention_chunk_size",),
    "rswa": ("rswa_window",),
    "mamba": ("shapes", "dtypes"),
}

_ATTN_COMMON = ("num_kv_heads", "head_size", "dtype")

#: More layers than any model has: a typo in a repeat count, not a model.
MAX_LAYERS = 100_000

#: A pattern item for a decoder layer that holds no cache: it only takes an index.
SKIP = "-"


@dataclass(frozen=True, slots=True)
class ExpandedLayer:
    name: str
    index: int | None
    fields: dict[str, Any]
    #: YAML path of the entry that produced this layer (for error positions).
    path: tuple[str | int, ...]
    type_name: str | None = None


@dataclass(frozen=True)
class Expanded:
    engine: Engine
    layers: tuple[ExpandedLayer, ...]
    stage_specs: tuple[dict[str, LayerSpec], ...]
    layer_paths: dict[str, tuple[str | int, ...]] = field(default_factory=dict)


def _merge(*parts: LayerFields | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part in parts:
        if part is None:
            continue
        for key, value in part.model_dump(exclude_none=True).items():
            if key in ("type", "name", "index", "repeat"):
                continue
            out[key] = value
    return out


def expand_layers(source: Source, doc: Document) -> tuple[list[ExpandedLayer], list[KvspecError]]:
    """Repeat patterns and entries into one :class:`ExpandedLayer` per layer."""
    layers: list[ExpandedLayer] = []
    errors: list[KvspecError] = []
    index = 0
    total = 0
    for e, entry in enumerate(source.layers):
        base_path: tuple[str | int, ...] = ("layers", e)
        per_repeat = sum(len(item.split("+")) for item in entry.pattern) \
            if isinstance(entry, PatternEntry) else 1
        total += entry.repeat * per_repeat
        if total > MAX_LAYERS:
            errors.append(doc.error(
                f"the model would have more than {MAX_LAYERS:,} layers", base_path + ("repeat",),
                expected=f"at most {MAX_LAYERS:,} layers in all", found=f"{total:,} so far",
                hint="check the repeat counts"))
            break
        if entry.index is not None:
            index = entry.index
        if isinstance(entry, PatternEntry):
            for _ in range(entry.repeat):
                for p, item in enumerate(entry.pattern):
                    path = base_path + ("pattern", p)
                    if item.strip() == SKIP:
                        index += 1  # a decoder layer without a cache (MLP/MoE only)
                        continue
                    for type_name in item.split("+"):
                        type_name = type_name.strip()
                        t = source.layer_types.get(type_name)
                        if t is None:
                            errors.append(_unknown_type(doc, path, type_name, source))
                            continue
                        fields = _merge(source.defaults, t)
                        name = _render(fields.get("layer_name") or source.layer_name, index,
                                       doc, path, errors)
                        layers.append(ExpandedLayer(name, index, fields, path, type_name))
                    index += 1
            continue
        assert isinstance(entry, LayerEntry)
        t = None
        if entry.type is not None:
            t = source.layer_types.get(entry.type)
            if t is None:
                errors.append(_unknown_type(doc, base_path + ("type",), entry.type, source))
                continue
        fields = _merge(source.defaults, t, entry)
        for _ in range(entry.repeat):
            if entry.name is not None:
                if entry.repeat > 1:
                    errors.append(doc.error("an entry with an explicit name cannot repeat",
                                            base_path + ("repeat",),
                                            hint="use a name template (layer_name) instead"))
                    break
                layers.append(ExpandedLayer(entry.name, None, fields, base_path, entry.type))
            else:
                name = _render(fields.get("layer_name") or source.layer_name, index, doc,
                               base_path, errors)
                layers.append(ExpandedLayer(name, index, fields, base_path, entry.type))
                index += 1
    return layers, errors


def _unknown_type(doc: Document, path: tuple, name: str, source: Source) -> KvspecError:
    import difflib
    known = sorted(source.layer_types)
    close = difflib.get_close_matches(name, known, n=1)
    return doc.error(f"unknown layer type {name!r}", path,
                     expected="one of " + (", ".join(known) or "(no layer_types defined)"),
                     found=name, hint=f"did you mean {close[0]!r}?" if close
                     else "define it under layer_types")


def _render(template: str, index: int, doc: Document, path: tuple, errors: list) -> str:
    try:
        return template.format(index=index)
    except (KeyError, IndexError, ValueError) as exc:
        errors.append(doc.error(f"bad layer_name template {template!r}: {exc}", path,
                                expected="a template using {index} only",
                                found=template))
        return template


def build_engine(source: Source, max_index: int | None) -> Engine:
    e = source.engine
    auto = e.max_model_len == "auto"
    max_len = e.model_max_len if auto else e.max_model_len
    return Engine(
        block_size=e.block_size,
        max_model_len=int(max_len or 0),
        original_max_model_len=-1 if auto else int(e.max_model_len),  # type: ignore[arg-type]
        max_num_batched_tokens=e.max_num_batched_tokens,
        max_num_seqs=e.max_num_seqs,
        max_num_encoder_input_tokens=e.max_num_encoder_input_tokens,
        async_scheduling=e.async_scheduling,
        enable_prefix_caching=e.prefix_caching,
        hybrid=e.hybrid,
        layout=Layout.parse(e.layout),
        kv_cache_dtype=source.quantization.kv_cache_dtype,
        tensor_parallel_size=source.parallel.tensor,
        pipeline_parallel_size=source.parallel.pipeline,
        decode_context_parallel_size=source.parallel.decode_context,
        num_gpu_blocks_override=e.num_blocks,
        mamba_cache_mode=e.mamba_cache_mode,
        mamba_block_size=e.mamba_block_size,
        prefix_match_unit=e.prefix_match_unit,
        num_prefill_lookahead_tokens=e.prefill_lookahead_tokens,
        speculative_method=e.speculative_method,
        draft_pool=e.draft.pool,
        draft_block_size=e.draft.block_size,
        draft_pool_blocks=e.draft.pool_blocks,
        total_num_hidden_layers=source.parallel.num_hidden_layers or
        (max_index + 1 if max_index is not None else None),
        pp_layer_partition=tuple(source.parallel.pipeline_partition)
        if source.parallel.pipeline_partition else None,
    )


def layer_to_spec(layer: ExpandedLayer, engine: Engine, source: Source,
                  doc: Document) -> LayerSpec:
    """One expanded layer as a spec for one rank (heads split, quantization resolved)."""
    f = layer.fields
    kind = f.get("kind")
    path = layer.path
    what = f"layer type {layer.type_name!r}" if layer.type_name else f"layer {layer.name}"
    if kind is None:
        raise doc.error(f"{what}: no kind", path,
                        expected="kind: full_attention | sliding_window | mla | mamba | ...",
                        hint="set kind in the layer type or in defaults")
    missing = [k for k in _REQUIRED.get(kind, ()) if f.get(k) is None]
    if kind != "mamba":
        missing += [k for k in _ATTN_COMMON if f.get(k) is None]
    if missing:
        raise doc.error(f"{what} ({kind}) is missing {', '.join(missing)}", path,
                        expected=", ".join(missing), hint="set them in defaults, the layer "
                        "type or the entry")
    tp = engine.tensor_parallel_size
    dump: dict[str, Any] = {"name": layer.name, "kind": kind}
    for key in ("shapes", "dtypes", "mamba_type", "num_speculative_blocks",
                "num_prefill_checkpoint_blocks", "prefill_checkpoint_alignment",
                "tp_replicated", "block_size", "page_size_padded", "sliding_window",
                "attention_chunk_size", "sink_len", "rswa_window", "tokens_per_state",
                "state_content_bytes", "num_head_slots", "block_stride_alignment",
                "alignment", "model_version", "bounded_replay", "head_size_v"):
        if f.get(key) is not None:
            dump[key] = f[key]
    if kind == "mamba":
        try:
            dump["dtypes"] = [canonical_dtype(d) for d in f["dtypes"]]
        except KeyError as exc:
            raise doc.error(f"unknown dtype {exc.args[0]!r}", path + ("dtypes",),
                            hint="use torch dtype names: bfloat16, float16, float32") from exc
        if len(f["dtypes"]) != len(f["shapes"]):
            raise doc.error(f"{what}: {len(f['shapes'])} state shapes but "
                            f"{len(f['dtypes'])} dtypes", path,
                            hint="give one dtype per state shape")
        return _dump_spec(dump, engine)

    try:
        model_dtype = canonical_dtype(f["dtype"])
    except KeyError:
        import difflib
        from kvspec.dtypes import DTYPE_SIZES
        close = difflib.get_close_matches(str(f["dtype"]), list(DTYPE_SIZES), n=1)
        raise doc.error(f"unknown dtype {f['dtype']!r}", path,
                        expected=", ".join(DTYPE_SIZES), found=str(f["dtype"]),
                        hint=f"did you mean {close[0]!r}?" if close else None) from None
    heads = f["num_kv_heads"]
    if kind not in _UNSPLIT:
        if heads >= tp and heads % tp:
            raise doc.error(f"{what}: {heads} KV heads do not split evenly over "
                            f"{tp} tensor-parallel ranks", path,
                            expected=f"a multiple of {tp}, or a divisor of it",
                            found=str(heads))
        if heads < tp and tp % heads:
            raise doc.error(f"{what}: {tp} ranks cannot replicate {heads} KV heads",
                            path, expected=f"a divisor of {tp}", found=str(heads))
        heads = max(1, heads // tp)
    dump["num_kv_heads"] = heads
    cache = layer_cache_dtype(layer, source)
    dump["cache_dtype_str"] = cache
    dump["dtype"] = model_dtype
    dump["head_size"] = f["head_size"]
    if cache != "auto" and f.get("state_content_bytes") is None:
        _apply_quant(dump, f, kind, cache, engine, doc, path)
    return _dump_spec(dump, engine)


def layer_cache_dtype(layer: ExpandedLayer, source: Source) -> str:
    """The layer's quantization mode: its own, ``auto`` when skipped, else the source's."""
    cache = layer.fields.get("kv_cache_dtype")
    if cache is None:
        skipped = layer.index is not None and layer.index in source.quantization.skip_layers
        cache = "auto" if skipped else source.quantization.kv_cache_dtype
    return cache


def _apply_quant(dump: dict, f: dict, kind: str, cache: str, engine: Engine,
                 doc: Document, path: tuple) -> None:
    from kvspec import quantization

    try:
        q = quantization.resolve_layer_quant(
            cache, model_dtype=dump["dtype"],
            kind="mla" if kind in _UNSPLIT else "attention",
            head_size=dump["head_size"],
            head_size_v=0 if kind in _UNSPLIT else f.get("head_size_v", dump["head_size"]),
            num_kv_heads=dump["num_kv_heads"], block_size=f.get("block_size", engine.block_size))
    except KvspecError as exc:
        raise doc.error(exc.message, path + ("kv_cache_dtype",) if f.get("kv_cache_dtype")
                        else ("quantization", "kv_cache_dtype"), expected=exc.expected,
                        found=exc.found, hint=exc.hint or "see docs/quantization.md for the "
                        "modes each layer kind supports") from exc
    except ValueError as exc:
        raise doc.error(str(exc), ("quantization", "kv_cache_dtype"),
                        hint="see docs/quantization.md") from exc
    dump["dtype"] = q.dtype
    if q.state_content_bytes is not None:
        dump["state_content_bytes"] = q.state_content_bytes
    if q.num_head_slots is not None:
        dump["num_head_slots"] = q.num_head_slots


def _dump_spec(dump: dict, engine: Engine) -> LayerSpec:
    from kvspec.specdump import layer_spec
    return layer_spec(dump, engine)


def expand(source: Source, doc: Document) -> Expanded:
    """Expand and build every rank's layer specs; report every problem at once."""
    layers, errors = expand_layers(source, doc)
    seen: dict[str, tuple] = {}
    for layer in layers:
        if layer.name in seen:
            errors.append(doc.error(f"layer name {layer.name!r} is used twice", layer.path,
                                    hint="each layer needs its own name; check layer_name "
                                    "templates and explicit names"))
        seen.setdefault(layer.name, layer.path)
    indices = [layer.index for layer in layers if layer.index is not None]
    engine = build_engine(source, max(indices) if indices else None)
    if source.engine.max_model_len == "auto" and source.engine.model_max_len is None:
        errors.append(doc.error("max_model_len: auto needs the model's maximum length",
                                ("engine", "max_model_len"),
                                expected="engine.model_max_len: <the model's max tokens>",
                                hint="e.g. model_max_len: 131072"))
    specs: dict[str, LayerSpec] = {}
    for layer in layers:
        try:
            specs[layer.name] = layer_to_spec(layer, engine, source, doc)
        except KvspecError as exc:
            errors.append(exc if exc.file else exc.at(_loc(doc, layer.path)))
        except (TypeError, ValueError) as exc:
            errors.append(doc.error(f"layer {layer.name}: {exc}", layer.path))
    if errors:
        from kvspec.errors import raise_all
        raise_all(errors)
    try:
        stages = split_stages(list(specs), engine.pipeline_parallel_size,
                              engine.total_num_hidden_layers, engine.pp_layer_partition)
    except PlanError as exc:
        raise exc.at(_loc(doc, ("parallel",))) from None
    return Expanded(engine, tuple(layers),
                    tuple({n: specs[n] for n in st} for st in stages),
                    {layer.name: layer.path for layer in layers})


def _loc(doc: Document, path: tuple):
    from kvspec.errors import Location
    from kvspec.source.yamlpos import format_path
    pos = doc.position(path)
    return Location(doc.file, pos[0] if pos else None, pos[1] if pos else None,
                    format_path(path))
