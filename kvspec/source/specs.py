"""One expanded layer -> its spec on one rank, built from the kinds' registry.

The fields a source gives a layer are the spec class's own (the registry says
which a kind has); expansion adds what follows from the deployment: KV heads
per tensor-parallel rank, the storage dtype and cell packing of the layer's
quantization mode, each layer's block size (:meth:`Engine.layer_block_size`).
"""

from __future__ import annotations

import difflib
from fractions import Fraction
from typing import Any

from kvspec.errors import KvspecError
from kvspec.model import kinds
from kvspec.model.dtypes import DTYPE_SIZES, canonical_dtype
from kvspec.model.engine import Engine
from kvspec.model.quant import QuantizationError, layer_quant, quant_mode
from kvspec.model.quant.formats import KV_CACHE_DTYPES, format_for
from kvspec.model.specs import LayerSpec
from kvspec.source.document import Document
from kvspec.source.layers import ExpandedLayer

#: Fields every non-state layer needs.
ATTENTION_REQUIRED = ("num_kv_heads", "head_size", "dtype")


def tokens_per_state(value: Any) -> int | Fraction:
    """``4``, ``"4"`` or ``"1/2"`` -> an int or a Fraction."""
    if isinstance(value, str):
        frac = Fraction(value)
        return int(frac) if frac.denominator == 1 else frac
    return int(value)


def spec_kwargs(kind: kinds.Kind, fields: dict[str, Any]) -> dict[str, Any]:
    """The fields of ``fields`` the kind's spec class takes, converted."""
    out: dict[str, Any] = {}
    for name in kinds.spec_fields(kind.name):
        value = fields.get(name)
        if value is None:
            continue
        if name == "shapes":
            value = tuple(tuple(int(d) for d in s) for s in value)
        elif name == "dtypes":
            value = tuple(value)
        elif name == "tokens_per_state":
            value = tokens_per_state(value)
        out[name] = value
    return out


def _what(layer: ExpandedLayer) -> str:
    if layer.type_name:
        return f"layer type {layer.type_name!r}"
    return f"layer {layer.name}" if layer.index is None else "the layer entry"


def _check_required(layer: ExpandedLayer, kind: kinds.Kind, doc: Document) -> None:
    f = layer.fields
    missing = [k for k in kind.required if f.get(k) is None]
    if not kind.state:
        missing += [k for k in ATTENTION_REQUIRED if f.get(k) is None]
    if missing:
        raise doc.error(f"{_what(layer)} ({kind.name}) is missing {', '.join(missing)}",
                        layer.path, expected=", ".join(missing),
                        hint="set them in defaults, the layer type or the entry")


def _state_spec(layer: ExpandedLayer, kind: kinds.Kind, engine: Engine,
                doc: Document) -> LayerSpec:
    f = layer.fields
    try:
        dtypes = [canonical_dtype(d) for d in f["dtypes"]]
    except KeyError as exc:
        raise doc.error(f"unknown dtype {exc.args[0]!r}", layer.origin("dtypes"),
                        hint="use torch dtype names: bfloat16, float16, float32") from exc
    if len(dtypes) != len(f["shapes"]):
        raise doc.error(f"{_what(layer)}: {len(f['shapes'])} state shapes but "
                        f"{len(dtypes)} dtypes", layer.origin("dtypes"),
                        hint="give one dtype per state shape")
    kw = spec_kwargs(kind, {**f, "dtypes": dtypes})
    kw["block_size"] = engine.layer_block_size(f.get("block_size"), state=True)
    kw["mamba_cache_mode"] = engine.mamba_cache_mode
    return _padding_fits(kind.spec(**kw), layer, doc)


def _padding_fits(spec: LayerSpec, layer: ExpandedLayer, doc: Document) -> LayerSpec:
    """``spec``, if its ``page_size_padded`` (where set) holds its page."""
    padded = getattr(spec, "page_size_padded", None)
    if padded is not None and padded < spec.unpadded_page_size_bytes:
        raise doc.error(f"{_what(layer)}: page_size_padded {padded:,} is smaller than the "
                        f"page it pads ({spec.unpadded_page_size_bytes:,} bytes on each rank)",
                        layer.origin("page_size_padded"),
                        expected=f"at least {spec.unpadded_page_size_bytes:,}",
                        hint="padding only adds bytes at a page's end; leave "
                             "page_size_padded out for the page as it is")
    return spec


def _heads_per_rank(layer: ExpandedLayer, kind: kinds.Kind, tp: int, doc: Document) -> int:
    heads = layer.fields["num_kv_heads"]
    if kind.latent:
        return heads
    if heads >= tp and heads % tp:
        raise doc.error(f"{_what(layer)}: {heads} KV heads do not split evenly over "
                        f"{tp} tensor-parallel ranks", layer.origin("num_kv_heads"),
                        expected=f"a multiple of {tp}, or a divisor of it", found=str(heads),
                        hint="check num_kv_heads against the model's config, or pick a "
                             "tensor-parallel size that splits it")
    if heads < tp and tp % heads:
        raise doc.error(f"{_what(layer)}: {tp} ranks cannot replicate {heads} KV heads",
                        layer.origin("num_kv_heads"), expected=f"a divisor of {tp}",
                        found=str(heads),
                        hint="fewer KV heads than ranks are replicated, so the ranks must be a "
                             "multiple of the heads; pick another tensor-parallel size")
    return max(1, heads // tp)


def _model_dtype(layer: ExpandedLayer, doc: Document) -> str:
    value = layer.fields["dtype"]
    try:
        return canonical_dtype(value)
    except KeyError:
        close = difflib.get_close_matches(str(value), list(DTYPE_SIZES), n=1)
        raise doc.error(f"unknown dtype {value!r}", layer.origin("dtype"),
                        expected=", ".join(DTYPE_SIZES),
                        found=str(value),
                        hint=f"did you mean {close[0]!r}?" if close else
                        "use a torch dtype name, e.g. bfloat16") from None


def _quantized(kw: dict[str, Any], layer: ExpandedLayer, kind: kinds.Kind, cache: str,
               doc: Document) -> None:
    """The storage dtype and cell packing of ``cache`` for this layer, into ``kw``
    (which holds the layer's block size)."""
    f = layer.fields
    try:
        q = layer_quant(
            cache, model_dtype=kw["dtype"], kind="mla" if kind.latent else "attention",
            head_size=kw["head_size"],
            head_size_v=0 if kind.latent else f.get("head_size_v", kw["head_size"]),
            num_kv_heads=kw["num_kv_heads"], block_size=kw["block_size"])
    except KvspecError as exc:
        path = layer.origin("kv_cache_dtype") if f.get("kv_cache_dtype") \
            else ("quantization", "kv_cache_dtype")
        raise doc.error(exc.message, path, expected=exc.expected, found=exc.found,
                        hint=exc.hint or "see docs/quantization.md for the modes each "
                        "layer kind supports") from exc
    kw["dtype"] = q.dtype
    if q.state_content_bytes is not None:
        kw["state_content_bytes"] = q.state_content_bytes
    if q.num_head_slots is not None:
        kw["num_head_slots"] = q.num_head_slots


def _known_cache_dtype(cache: str, layer: ExpandedLayer, doc: Document) -> None:
    """Refuse a ``kv_cache_dtype`` no format has, at the field that names it."""
    try:
        format_for(cache)
    except QuantizationError as exc:
        path = layer.origin("kv_cache_dtype") if layer.fields.get("kv_cache_dtype") \
            else ("quantization", "kv_cache_dtype")
        close = difflib.get_close_matches(cache, KV_CACHE_DTYPES, n=1)
        raise doc.error(exc.message, path, expected=exc.expected, found=exc.found,
                        hint=f"did you mean {close[0]!r}?" if close else exc.hint) from exc


def build_spec(layer: ExpandedLayer, engine: Engine, cache: str, doc: Document) -> LayerSpec:
    """One expanded layer as a spec for one rank (heads split, quantization resolved)."""
    name = layer.fields.get("kind")
    if name is None:
        raise doc.error(f"{_what(layer)}: no kind", layer.path,
                        expected="kind: full_attention | sliding_window | mla | mamba | ...",
                        hint="set kind in the layer type or in defaults")
    kind = kinds.by_name(name)
    _check_required(layer, kind, doc)
    if kind.state:
        return _state_spec(layer, kind, engine, doc)
    kw = spec_kwargs(kind, layer.fields)
    kw["num_kv_heads"] = _heads_per_rank(layer, kind, engine.tensor_parallel_size, doc)
    kw["dtype"] = _model_dtype(layer, doc)
    kw["block_size"] = engine.layer_block_size(kw.get("block_size"))
    try:
        kw["kv_quant_mode"] = int(quant_mode(cache))
    except QuantizationError as exc:
        raise doc.error(exc.message, ("quantization", "kv_cache_dtype"), expected=exc.expected,
                        found=exc.found, hint=exc.hint) from exc
    if kind.latent:
        kw["cache_dtype_str"] = cache
    if cache != "auto" and layer.fields.get("state_content_bytes") is not None:
        _known_cache_dtype(cache, layer, doc)  # opaque cells: no packing, but a known mode
    if cache != "auto" and layer.fields.get("state_content_bytes") is None:
        _quantized(kw, layer, kind, cache, doc)
    spec = kind.spec(**kw)
    if spec.num_states < 1:  # tokens_per_state larger than a block: nothing to store
        raise doc.error(f"{_what(layer)}: tokens_per_state {spec.tokens_per_state_value} is "
                        f"more than the block size {spec.block_size}: a block holds no state",
                        layer.origin("tokens_per_state"),
                        expected=f"tokens_per_state at most {spec.block_size}",
                        hint="a compressed indexer stores one state per few tokens (e.g. 4)")
    return _padding_fits(spec, layer, doc)
