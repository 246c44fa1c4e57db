"""The fast canonical JSON writers give exactly ``json.dumps``' text."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvspec.artifact import canonical_json
from kvspec.artifact.jsontext import compact, compact_of_known, pretty
from kvspec.compiler import compile
from tests.conftest import ROOT

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | \
    st.text(max_size=8)
trees = st.recursive(scalars, lambda inner: st.lists(inner, max_size=5)
                     | st.dictionaries(st.text(max_size=6), inner, max_size=5), max_leaves=40)


def _reference(obj: Any) -> tuple[str, str]:
    return (json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False),
            json.dumps(obj, sort_keys=True, indent=1, ensure_ascii=False))


@settings(max_examples=300, deadline=None)
@given(trees, trees)
def test_any_json_tree_with_shared_parts(a: Any, b: Any) -> None:
    entry = {"cell_parts": None, "group": 0, "kv_cache_dtype": "auto",
             "per_tensor_scales": False, "spec": a, "stage": 1}
    for obj in (a, [a, b, a], {"x": a, "y": [a, {"z": a}]},
                {"body": {"layers": {"l1": entry, "l0": entry, "l2": {"odd": b}}, "n": b},
                 "format": "f"},
                {"layers": {"b": entry, "a": dict(entry, spec=b)}}):
        assert (compact(obj), pretty(obj)) == _reference(obj)


def test_every_committed_artifact_is_written_byte_for_byte() -> None:
    for path in sorted((ROOT / "layouts").glob("*.kvlayout.json")):
        art = compile(path.with_name(path.name.replace(".kvlayout.json", ".yaml")))
        assert art.text() == path.read_text(encoding="utf-8"), path.name
        data = art.data
        assert canonical_json(data) == _reference(data)[0]
        assert canonical_json(data, pretty=True) == _reference(data)[1] + "\n"


def _floats(obj: Any) -> list[float]:
    if isinstance(obj, float):
        return [obj]
    if isinstance(obj, dict):
        return [f for v in obj.values() for f in _floats(v)]
    if isinstance(obj, list):
        return [f for v in obj for f in _floats(v)]
    return []


@settings(max_examples=500, deadline=None)
@given(trees)
def test_orjson_writes_what_json_writes_or_hands_over(obj: Any) -> None:
    """Any JSON tree (tiny, huge and non-finite floats, big ints, lone surrogates
    included), its floats named: the text json writes, whichever writer wrote it."""
    assert compact_of_known(obj, _floats(obj)) == _reference(obj)[0]


class _Str(str):
    pass


@dataclass
class _Point:
    x: int


def test_what_orjson_writes_otherwise_json_writes() -> None:
    for obj in ({"x": 1e-05}, {"x": 1.5e-7}, {"x": math.nan}, {"x": -math.inf},
                {"x": 2**64}, {"x": -(2**63) - 1}, {"x": "\ud800"}, {1: "int key"},
                {"x": _Str("sub")}, {"x": (1, 2)}, {"b": 1, "a": [None, True, "é\n\x7f"]}):
        assert compact_of_known(obj, _floats(obj)) == _reference(obj)[0], obj
    with pytest.raises(TypeError):  # json writes no dataclass; neither does this
        compact_of_known({"x": _Point(1)}, [])
    # A float left out of ``floats`` is the caller's promise broken: orjson writes it.
    assert compact_of_known({"x": 1e-05}, []) == '{"x":0.00001}'


def test_the_artifact_schema_has_one_number_the_encoded_hash_checks() -> None:
    """encoded_text() hands orjson a body whose only float is budget.max_concurrency:
    the artifact schema must have no other number field, or the check misses one."""
    found: list[str] = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            if node.get("type") == "number" or "number" in (node.get("type") or []):
                found.append(path)
            for key, value in node.items():
                walk(value, f"{path}/{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{path}/{i}")

    walk(json.loads((ROOT / "schemas" / "artifact.schema.json").read_text()), "")
    assert found == ["/$defs/BudgetEntry/properties/max_concurrency"], found
