"""Canonical JSON text of an artifact, fast: the same bytes as ``json.dumps``.

An artifact body repeats a few objects many times (every layer of a model
shares its spec's description and cell parts, :func:`kvspec.artifact.codec.encode`),
and ``json``'s pretty form goes through its pure-Python encoder. These
encoders write each shared object once and reuse its text, a layer's entry in
one f-string; the rest goes through ``json``'s C encoder (compact) or a
small recursive writer (pretty). The output is exactly
``json.dumps(obj, sort_keys=True, ensure_ascii=False)`` with the compact
separators (:func:`compact`) or ``indent=1`` (:func:`pretty`), which the tests
check against ``json`` itself.

>>> shared = {"b": 1, "a": [1, 2]}
>>> obj = {"y": shared, "x": [shared, None, "é"]}
>>> compact(obj) == json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
True
>>> pretty(obj) == json.dumps(obj, sort_keys=True, indent=1, ensure_ascii=False)
True
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from json.encoder import encode_basestring
from typing import Any

import orjson

_SCALARS = (str, int, float, bool, type(None))
_dump_compact = json.JSONEncoder(sort_keys=True, separators=(",", ":"),
                                 ensure_ascii=False).encode
_key = encode_basestring  # a str as JSON (C), as json.dumps(ensure_ascii=False) writes it


def _scalar(o: Any) -> str:
    """A JSON scalar's text, without the encoder's per-call overhead."""
    if o is None:
        return "null"
    if o is True:
        return "true"
    if o is False:
        return "false"
    if type(o) is int:
        return int.__repr__(o)
    if type(o) is str:
        return encode_basestring(o)
    return _dump_compact(o)  # floats (nan, inf) and subclasses, as json writes them


#: The keys of a layer's entry in the body (kvspec.artifact.codec.encode), sorted.
_ENTRY = ("cell_parts", "group", "kv_cache_dtype", "per_tensor_scales", "spec", "stage")
_HOLE = "\x00layers\x00"  # never in a body: sources refuse control characters


def _layers_compact(layers: dict[str, Any], memo: dict[int, str], enc: Any) -> str:
    """The ``layers`` map: one f-string per entry, shared values written once."""
    out = []
    for name in sorted(layers):
        e = layers[name]
        text = memo.get(id(e))  # an entry shared by layers alike (codec.encode)
        if text is None:
            if not isinstance(e, dict) or tuple(sorted(e)) != _ENTRY:
                text = enc(e)
            else:
                text = (f'{{"cell_parts":{enc(e["cell_parts"])},"group":'
                        f'{enc(e["group"])},"kv_cache_dtype":{enc(e["kv_cache_dtype"])},'
                        f'"per_tensor_scales":{enc(e["per_tensor_scales"])},"spec":'
                        f'{enc(e["spec"])},"stage":{enc(e["stage"])}}}')
                memo[id(e)] = text
        out.append(_key(name) + ":" + text)
    return "{" + ",".join(out) + "}"


def compact(obj: Any) -> str:
    """``json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)``.

    A body's (or an envelope's) ``layers`` map is written entry by entry with
    each shared spec once; everything else goes through the C encoder."""
    memo: dict[int, str] = {}

    def enc(o: Any) -> str:
        if o is None or isinstance(o, (str, int, float)):
            return _scalar(o)
        oid = id(o)
        text = memo.get(oid)
        if text is None:
            text = memo[oid] = _dump_compact(o)
        return text

    body = obj.get("body", obj) if isinstance(obj, dict) else None
    layers = body.get("layers") if isinstance(body, dict) else None
    if not isinstance(layers, dict):
        return _dump_compact(obj)
    holed = {**body, "layers": _HOLE}
    outer = {**obj, "body": holed} if body is not obj else holed
    text = _dump_compact(outer)
    hole = _dump_compact(_HOLE)
    assert text.count(hole) == 1
    return text.replace(hole, _layers_compact(layers, memo, enc))


#: orjson's compact form with sorted keys; everything but plain ``dict``, ``list``,
#: ``str`` and ``int`` (a subclass, a dataclass, a date) goes to its ``default``,
#: which there is none of: orjson raises, and :func:`compact` writes it as json does.
ORJSON_SORTED = _ORJSON = (orjson.OPT_SORT_KEYS | orjson.OPT_PASSTHROUGH_SUBCLASS
           | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME)


def writes_as_json(x: Any) -> bool:
    """Whether orjson writes ``x`` as ``json`` does: every value but a float under
    1e-4 (``1e-05`` against ``0.00001``) or one not finite (``NaN`` against ``null``)."""
    return type(x) is not float or x == 0 or (abs(x) >= 1e-4 and math.isfinite(x))


def compact_of_known(obj: Any, floats: Iterable[Any]) -> str:
    """:func:`compact` of data whose every float is among ``floats`` (an artifact
    body the codec built has one, ``budget.max_concurrency``): the same text,
    written by orjson's C encoder, several times faster on a body. Whatever orjson
    would write otherwise (a float above, an int past 64 bits, a string with a lone
    surrogate, a key that is not a string, a type it would write and json would
    not) is written by :func:`compact`.

    >>> data = {"b": [1, "é", None], "a": {"max_concurrency": 2.5}}
    >>> compact_of_known(data, [2.5]) == compact(data)
    True
    >>> compact_of_known({"x": 1e-05}, [1e-05])
    '{"x":1e-05}'
    """
    if all(writes_as_json(x) for x in floats):
        try:
            return orjson.dumps(obj, option=_ORJSON).decode()
        except orjson.JSONEncodeError:
            pass
    return compact(obj)


def _generic_pretty(obj: Any) -> str:
    """Shared containers written once per depth; a layer's entry in one f-string."""
    memo: dict[tuple[int, int], str] = {}

    def enc(o: Any, depth: int) -> str:
        if isinstance(o, _SCALARS):
            return _scalar(o)
        key = (id(o), depth)
        text = memo.get(key)
        if text is not None:
            return text
        i, d = "\n" + " " * (depth + 1), depth + 1
        if not o:
            text = "{}" if isinstance(o, dict) else "[]"
        elif isinstance(o, dict) and len(o) == 6 and tuple(sorted(o)) == _ENTRY:
            text = (f'{{{i}"cell_parts": {enc(o["cell_parts"], d)},{i}"group": '
                    f'{_scalar(o["group"])},{i}"kv_cache_dtype": '
                    f'{_scalar(o["kv_cache_dtype"])},{i}"per_tensor_scales": '
                    f'{_scalar(o["per_tensor_scales"])},{i}"spec": {enc(o["spec"], d)},'
                    f'{i}"stage": {_scalar(o["stage"])}\n{" " * depth}}}')
        elif isinstance(o, dict):
            items = (_key(str(k)) + ": " + enc(o[k], d) for k in sorted(o))
            text = "{" + i + ("," + i).join(items) + "\n" + " " * depth + "}"
        elif all(type(v) is str for v in o):  # layer names: most of a body's text
            text = "[" + i + ("," + i).join(map(encode_basestring, o)) + "\n" + " " * depth + "]"
        else:
            items = (enc(v, d) for v in o)
            text = "[" + i + ("," + i).join(items) + "\n" + " " * depth + "]"
        memo[key] = text
        return text

    return enc(obj, 0)


def pretty(obj: Any) -> str:
    """``json.dumps(obj, sort_keys=True, indent=1, ensure_ascii=False)``."""
    return _generic_pretty(obj)
