"""The source reader's speed-ups change nothing it reads.

``kvspec.source.document`` resolves tags with its own loop (no path
resolvers), builds plain strings and decimal ints without the constructor, and
finds positions only when an error needs them; each is checked here against
PyYAML's own ``SafeLoader``.
"""

from __future__ import annotations

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from kvspec.errors import SourceError
from kvspec.source.document import _Loader, parse_yaml

WORDS = ["", "yes", "No", "~", "null", "1", "0x1f", "012", "0", "00", "1_0", "1.5", ".inf",
         "-.NaN", "2001-12-14", "true", "abc", "+1", "-0", "0o7", "1e3", "<<", ".5", "0b11",
         "1:20", "8", "16GiB"]


def _tags(node: yaml.Node | None) -> object:
    if node is None:
        return None
    if isinstance(node, yaml.ScalarNode):
        return node.tag, node.value
    if isinstance(node, yaml.SequenceNode):
        return node.tag, [_tags(n) for n in node.value]
    return node.tag, [(_tags(k), _tags(v)) for k, v in node.value]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(WORDS) | st.text(alphabet="0123456789abexo+-._:~", max_size=6),
                min_size=1, max_size=6))
def test_tags_resolve_as_safe_loader_does(words: list[str]) -> None:
    text = "a: [" + ", ".join(w or "''" for w in words) + "]\nb: " + (words[0] or "x") + "\n"
    try:  # (libyaml's scanner refuses a few plain scalars the Python one takes)
        expected = yaml.compose(text, Loader=yaml.SafeLoader)
        got = yaml.compose(text, Loader=_Loader)
    except yaml.YAMLError:
        return
    assert _tags(got) == _tags(expected)
    try:
        data = parse_yaml(text, "t.yaml").data
    except SourceError:  # refused on purpose (a merge key as a value, a bad timestamp)
        return
    assert data == yaml.load(text, Loader=yaml.SafeLoader)


def test_positions_are_found_when_asked_for() -> None:
    text = "kvspec: 1\nengine:\n  block_size: 16\n  memory: 8GiB\nlayers:\n  - {type: full}\n"
    doc = parse_yaml(text, "t.yaml")
    assert not doc.positions  # nothing recorded while reading
    assert doc.position(("engine", "memory")) == (4, 11)
    assert doc.key_position(("engine", "memory")) == (4, 3)
    assert doc.position(("layers", 0, "type")) == (6, 12)
    assert doc.position(("layers", 5)) == (6, 3)  # the nearest parent that exists
