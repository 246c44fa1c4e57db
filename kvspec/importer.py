"""``kvspec import``: a per-layer spec dump -> a readable kvspec source.

The dump (``../shared/conformance/FORMAT.md``) lists every layer of one rank.
The importer recovers what a person would write: a layer-name template per
kind, named layer types, defaults for the fields most layers share, global KV
heads (per-rank heads x tensor parallelism) and the decoder-layer sequence
folded into repeated patterns.

>>> fold(["a", "b", "a", "b", "a", "b", "c"])
[(3, ['a', 'b']), (1, ['c'])]
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import yaml

from kvspec.errors import SourceError
from kvspec.source.expand import SKIP
from kvspec.specdump import KINDS

#: Short, readable type names by kind.
_TYPE_NAMES = {
    "full_attention": "full", "sliding_window": "sliding", "chunked_local": "local",
    "mla": "mla", "sliding_window_mla": "swa_mla", "mamba": "mamba",
    "cross_attention": "cross", "encoder_only": "encoder", "sink_full_attention": "sink",
    "hidden_state": "hidden", "kpool_tail": "tail", "circular_buffer": "ring", "rswa": "rswa",
}
_UNSPLIT = {"mla", "sliding_window_mla", "hidden_state"}
_DEFAULT_KEYS = ("num_kv_heads", "head_size", "dtype")
#: Decoder layers without a cache written as ``-`` items rather than a new entry.
_MAX_SKIP = 8
_LAYER_RE = re.compile(r"(^|\.)layers\.(\d+)(\.|$)")


def fold(items: list[str], max_period: int = 24) -> list[tuple[int, list[str]]]:
    """Fold a sequence into ``(repeat, pattern)`` runs, longest coverage first."""
    out: list[tuple[int, list[str]]] = []
    singles: list[str] = []
    i, n = 0, len(items)
    while i < n:
        best = (1, 1)  # (period, repeats)
        for p in range(1, min(max_period, (n - i) // 2) + 1):
            r = 1
            while i + (r + 1) * p <= n and items[i + r * p:i + (r + 1) * p] == items[i:i + p]:
                r += 1
            if r >= 2 and p * r > best[0] * best[1]:
                best = (p, r)
        p, r = best
        if r >= 2:
            if singles:
                out.append((1, singles))
                singles = []
            out.append((r, items[i:i + p]))
            i += p * r
        else:
            singles.append(items[i])
            i += 1
    if singles:
        out.append((1, singles))
    return out


def _template(name: str) -> tuple[str, int | None]:
    m = _LAYER_RE.search(name)
    if not m:
        return name, None
    idx = int(m.group(2))
    start, end = m.span(2)
    return name[:start] + "{index}" + name[end:], idx


def import_dump(data: dict[str, Any]) -> dict[str, Any]:
    """The source (as plain data) for a dump; see :func:`dump_to_yaml`."""
    cfg = data.get("config") or {}
    layers = data.get("layers")
    if not isinstance(layers, list):
        raise SourceError("a spec dump needs a 'layers' list", path="layers")
    tp = int(cfg.get("tensor_parallel_size", 1))
    global_cache = cfg.get("kv_cache_dtype", "auto")
    for layer in layers:
        if layer.get("kind") not in KINDS:
            raise SourceError(
                f"layer {layer.get('name')!r}: kind {layer.get('kind')!r} is not supported yet",
                expected=", ".join(KINDS), found=str(layer.get("kind")),
                hint="open an issue with the layer's spec")
    model_dtypes = Counter(layer["dtype"] for layer in layers if "dtype" in layer
                           and (layer.get("cache_dtype_str") or global_cache) == "auto")
    model_dtype = model_dtypes.most_common(1)[0][0] if model_dtypes else "bfloat16"

    described = []
    for layer in layers:
        fields = {k: v for k, v in layer.items() if k not in ("name", "cache_dtype_str")}
        kind = fields["kind"]
        cache = layer.get("cache_dtype_str") or global_cache
        if kind != "mamba":
            if kind not in _UNSPLIT:
                fields["num_kv_heads"] = fields["num_kv_heads"] * tp
            if cache != "auto" and "state_content_bytes" not in fields:
                fields["dtype"] = model_dtype  # the storage dtype follows from the mode
        if cache != global_cache:
            fields["kv_cache_dtype"] = cache
        template, idx = _template(layer["name"])
        described.append((layer["name"], template, idx, fields))

    # defaults: the most common value of each shared field among attention layers
    defaults: dict[str, Any] = {}
    attn = [f for _, _, _, f in described if f["kind"] != "mamba"]
    for key in _DEFAULT_KEYS:
        values = Counter(repr(f.get(key)) for f in attn if key in f)
        if values:
            common = values.most_common(1)[0][0]
            defaults[key] = next(f[key] for f in attn if repr(f.get(key)) == common)
    templates = Counter(t for _, t, i, _ in described if i is not None)
    main_template = templates.most_common(1)[0][0] if templates else "model.layers.{index}"

    types: dict[str, dict[str, Any]] = {}
    type_of_key: dict[str, str] = {}

    def type_for(fields: dict[str, Any], template: str) -> str:
        own = {k: v for k, v in fields.items() if not (k in defaults and defaults[k] == v)}
        if template != main_template:
            own["layer_name"] = template
        key = repr(sorted(own.items()))
        if key not in type_of_key:
            base = _TYPE_NAMES.get(fields["kind"], fields["kind"])
            if fields.get("kind") == "mla" and str(fields.get("tokens_per_state", 1)) != "1":
                base = "indexer"
            name = base
            n = 2
            while name in types:
                name = f"{base}{n}"
                n += 1
            type_of_key[key] = name
            types[name] = _flow(own)
        return type_of_key[key]

    # the decoder-layer sequence; a decoder layer may own several caches
    entries: list[dict[str, Any]] = []
    decoder: list[tuple[int, list[str]]] = []
    extras: list[dict[str, Any]] = []
    for name, template, idx, fields in described:
        tname = type_for(fields, template if idx is not None else main_template)
        if idx is None:
            extras.append({"type": tname, "name": name})
        elif decoder and decoder[-1][0] == idx:
            decoder[-1][1].append(tname)
        else:
            decoder.append((idx, [tname]))
    expect = 0
    run: list[tuple[int, list[str]]] = []

    def flush() -> None:
        if not run:
            return
        seq = ["+".join(t) for _, t in run]
        first = True
        for repeat, pattern in fold(seq):
            entry: dict[str, Any] = {}
            if first and run[0][0] != 0:
                entry["index"] = run[0][0]
            first = False
            if repeat > 1:
                entry["repeat"] = repeat
            entry["pattern"] = _flow(pattern)
            entries.append(entry)
        run.clear()

    for idx, tnames in decoder:
        if run and expect < idx <= expect + _MAX_SKIP:
            run.extend((i, [SKIP]) for i in range(expect, idx))  # layers without a cache
        elif idx != expect and run:
            flush()
        run.append((idx, tnames))
        expect = idx + 1
    flush()
    entries += extras

    engine: dict[str, Any] = {"block_size": cfg.get("block_size", 16)}
    original = cfg.get("original_max_model_len")
    if original == -1:
        engine["max_model_len"] = "auto"
        engine["model_max_len"] = cfg["max_model_len"]
    else:
        engine["max_model_len"] = cfg.get("max_model_len")
    for src, dst in (("max_num_batched_tokens", "max_num_batched_tokens"),
                     ("max_num_seqs", "max_num_seqs"), ("kv_cache_layout", "layout"),
                     ("async_scheduling", "async_scheduling"),
                     ("prefix_match_unit", "prefix_match_unit"),
                     ("mamba_block_size", "mamba_block_size"),
                     ("num_gpu_blocks_override", "num_blocks"),
                     ("max_num_encoder_input_tokens", "max_num_encoder_input_tokens")):
        if cfg.get(src) is not None:
            engine[dst] = cfg[src]
    if cfg.get("disable_hybrid_kv_cache_manager"):
        engine["hybrid"] = False
    if cfg.get("enable_prefix_caching") is False:
        engine["prefix_caching"] = False
    if cfg.get("mamba_cache_mode") not in (None, "none"):
        engine["mamba_cache_mode"] = cfg["mamba_cache_mode"]
    if cfg.get("available_memory_bytes") is not None:
        engine["memory"] = _format_bytes(int(cfg["available_memory_bytes"]))

    parallel = {"tensor": tp, "pipeline": cfg.get("pipeline_parallel_size", 1),
                "decode_context": cfg.get("decode_context_parallel_size", 1)}
    source: dict[str, Any] = {"kvspec": 1, "name": data.get("name") or "imported"}
    if data.get("model"):
        source["model"] = data["model"]
    if data.get("facts"):
        source["description"] = data["facts"]
    source["layer_name"] = main_template
    source["engine"] = engine
    source["parallel"] = _flow(parallel)
    if defaults:
        source["defaults"] = _flow(defaults)
    if global_cache != "auto":
        source["quantization"] = {"kv_cache_dtype": global_cache}
    source["layer_types"] = types
    source["layers"] = [_flow(e) if "pattern" in e or "type" in e else e for e in entries]
    return source


def _format_bytes(n: int) -> str | int:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n % size == 0:
            return f"{n // size}{unit}"
    return n


class _Flow(dict):
    """A mapping written in YAML flow style (one line)."""


class _FlowList(list):
    pass


def _flow(value: Any) -> Any:
    if isinstance(value, dict):
        return _Flow({k: _flow(v) if isinstance(v, list) else v for k, v in value.items()})
    if isinstance(value, list):
        return _FlowList(_flow(v) if isinstance(v, list) else v for v in value)
    return value


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(_Flow, lambda d, v: d.represent_mapping(
    "tag:yaml.org,2002:map", v.items(), flow_style=True))
_Dumper.add_representer(_FlowList, lambda d, v: d.represent_sequence(
    "tag:yaml.org,2002:seq", v, flow_style=True))


def dump_to_yaml(data: dict[str, Any], *,
                 schema: str = "../schemas/source.schema.json") -> str:
    """The YAML text of the imported source, with the schema comment on top
    (``schema`` is relative to where the file will live; layouts/ by default)."""
    source = import_dump(data)
    body = yaml.dump(source, Dumper=_Dumper, sort_keys=False, width=100,
                     default_flow_style=False, allow_unicode=True)
    return (f"# yaml-language-server: $schema={schema}\n"
            f"# Imported by `kvspec import` from a per-layer spec dump"
            f"{' of ' + data['model'] if data.get('model') else ''}.\n" + body)
