"""The fast canonical JSON writers give exactly ``json.dumps``' text."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kvspec.artifact import canonical_json
from kvspec.artifact.jsontext import compact, pretty
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
