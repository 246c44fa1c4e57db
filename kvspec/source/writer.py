"""Writing sources: per-layer records -> a readable ``layouts/*.yaml``.

What ``kvspec import`` (a spec dump), ``kvspec init --from-hf`` (a config.json)
and ``kvspec init --from-vllm`` (vLLM's own layers) write is the same kind of
file: a layer-name template, defaults for the fields most layers share, one
named layer type per distinct layer, and the decoder-layer sequence folded
into repeated patterns (``-`` for decoder layers without a cache, ``a+b`` for
one decoder layer with several caches).

>>> fold(["a", "b", "a", "b", "a", "b", "c"])
[(3, ['a', 'b']), (1, ['c'])]
>>> recs = [Record(f"model.layers.{i}.attn", i, {"kind": "full_attention",
...         "num_kv_heads": 8, "head_size": 128, "dtype": "bfloat16"}, "full") for i in range(4)]
>>> src = layers_section(recs)
>>> src["layer_name"], src["defaults"], src["layer_types"], src["layers"]
... # doctest: +NORMALIZE_WHITESPACE
('model.layers.{index}.attn', {'num_kv_heads': 8, 'head_size': 128, 'dtype': 'bfloat16'},
 {'full': {'kind': 'full_attention'}}, [{'repeat': 4, 'pattern': ['full']}])
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from kvspec.source.layers import SKIP

_LAYER_RE = re.compile(r"(^|\.)layers\.(\d+)(\.|$)")
DEFAULT_KEYS = ("num_kv_heads", "head_size", "dtype")


@dataclass(frozen=True)
class Record:
    """One layer as a source describes it: fields in source terms (global heads)."""

    name: str
    #: Decoder-layer index (None: the layer is listed by its name).
    index: int | None
    fields: dict[str, Any]
    #: The layer type's name (numbered when several types share it).
    type_name: str
    #: Fields that stay on the type even when they equal a default.
    keep: frozenset[str] = field(default_factory=frozenset)


def template_of(name: str) -> tuple[str, int | None]:
    """``model.layers.7.attn`` -> ``("model.layers.{index}.attn", 7)``."""
    m = _LAYER_RE.search(name)
    if not m:
        return name, None
    start, end = m.span(2)
    return name[:start] + "{index}" + name[end:], int(m.group(2))


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


def most_common(values: Sequence[Any]) -> Any:
    """The most frequent value (first seen wins a tie); values may be unhashable."""
    counts = Counter(repr(v) for v in values)
    best = counts.most_common(1)[0][0]
    return next(v for v in values if repr(v) == best)


def defaults_of(records: Sequence[Record], keys: Sequence[str] = DEFAULT_KEYS) -> dict[str, Any]:
    """The most common value of each of ``keys`` among the attention layers."""
    attn = [r.fields for r in records if r.fields.get("kind") != "mamba"]
    out: dict[str, Any] = {}
    for key in keys:
        values = [f[key] for f in attn if key in f]
        if values:
            out[key] = most_common(values)
    return out


def _types(records: Sequence[Record], defaults: dict[str, Any], main: str
           ) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Named layer types, and each record's type name."""
    types: dict[str, dict[str, Any]] = {}
    by_key: dict[str, str] = {}
    names = []
    for r in records:
        own = {k: v for k, v in r.fields.items()
               if k in r.keep or not (k in defaults and defaults[k] == v)}
        template, index = template_of(r.name)
        if index is not None and template != main:
            own["layer_name"] = template
        key = repr(sorted(own.items()))
        if key not in by_key:
            name, n = r.type_name, 2
            while name in types:
                name, n = f"{r.type_name}{n}", n + 1
            by_key[key] = name
            types[name] = own
        names.append(by_key[key])
    return types, names


def pattern_entries(decoder: list[tuple[int, list[str]]], max_skip: int | None = None
                    ) -> list[dict[str, Any]]:
    """``(decoder index, type names)`` in order -> ``layers:`` entries of folded
    patterns; gaps of at most ``max_skip`` decoder layers (any, when None) become
    ``-`` items, longer ones start a new entry at its ``index``."""
    entries: list[dict[str, Any]] = []
    run: list[list[str]] = []
    start = expect = 0
    for idx, names in decoder:
        if run and expect < idx and (max_skip is None or idx <= expect + max_skip):
            run.extend([SKIP] for _ in range(expect, idx))  # layers without a cache
        elif idx != expect and run:
            entries += _folded(run, start)
            run = []
        if not run:
            start = idx
        run.append(names)
        expect = idx + 1
    if run:
        entries += _folded(run, start)
    return entries


def _folded(run: list[list[str]], start: int) -> list[dict[str, Any]]:
    out = []
    for i, (repeat, pattern) in enumerate(fold(["+".join(t) for t in run])):
        entry: dict[str, Any] = {}
        if i == 0 and start != 0:
            entry["index"] = start
        if repeat > 1:
            entry["repeat"] = repeat
        entry["pattern"] = flow(pattern)
        out.append(entry)
    return out


def assign_types(records: Sequence[Record], defaults: dict[str, Any] | None = None
                 ) -> tuple[str, dict[str, Any], dict[str, dict[str, Any]], list[str]]:
    """``(main layer-name template, defaults, layer types, each record's type name)``."""
    templates = Counter(t for t, i in map(template_of, (r.name for r in records))
                        if i is not None)
    main = templates.most_common(1)[0][0] if templates else "model.layers.{index}"
    defaults = defaults_of(records) if defaults is None else defaults
    types, names = _types(records, defaults, main)
    return main, defaults, types, names


def layers_section(records: Sequence[Record], *, defaults: dict[str, Any] | None = None,
                   max_skip: int | None = None) -> dict[str, Any]:
    """``layer_name``, ``defaults``, ``layer_types`` and ``layers`` of a source."""
    main, defaults, types, names = assign_types(records, defaults)
    decoder: list[tuple[int, list[str]]] = []
    extras: list[dict[str, Any]] = []
    for r, tname in zip(records, names):
        if r.index is None:
            extras.append(flow({"type": tname, "name": r.name}))
        elif decoder and decoder[-1][0] == r.index:
            decoder[-1][1].append(tname)
        else:
            decoder.append((r.index, [tname]))
    out: dict[str, Any] = {"layer_name": main}
    if defaults:
        out["defaults"] = flow(defaults)
    out["layer_types"] = {n: flow(f) for n, f in types.items()}
    out["layers"] = [flow(e) for e in pattern_entries(decoder, max_skip)] + extras
    return out


# ---------------------------------------------------------------------------
# YAML text
# ---------------------------------------------------------------------------


class _Flow(dict):
    """A mapping written in YAML flow style (one line)."""


class _FlowList(list):
    """A list written in YAML flow style (one line)."""


def flow(value: Any) -> Any:
    """``value`` (a dict or list) marked to be written on one line."""
    if isinstance(value, dict):
        return _Flow({k: flow(v) if isinstance(v, list) else v for k, v in value.items()})
    if isinstance(value, list):
        return _FlowList(flow(v) if isinstance(v, list) else v for v in value)
    return value


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(_Flow, lambda d, v: d.represent_mapping(
    "tag:yaml.org,2002:map", v.items(), flow_style=True))
_Dumper.add_representer(_FlowList, lambda d, v: d.represent_sequence(
    "tag:yaml.org,2002:seq", v, flow_style=True))


def to_yaml(source: dict[str, Any], width: int = 100) -> str:
    """The YAML text of a source (key order as given, flow-marked parts on one line)."""
    return yaml.dump(source, Dumper=_Dumper, sort_keys=False, width=width,
                     default_flow_style=False, allow_unicode=True)


def exact_size(n: int) -> str | int:
    """A size as a source writes it: ``40GiB`` when exact in a unit, else bytes."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n and n % size == 0:
            return f"{n // size}{unit}"
    return n
