"""Repeat patterns and entries into one :class:`ExpandedLayer` per layer.

A pattern item is a layer type's name, several joined by ``+`` for one decoder
layer that owns several caches (``mla+indexer``), or ``-`` for a decoder layer
without a cache (it only takes an index). Fields merge defaults < layer type <
entry; the layers of one type share one fields mapping.
"""

from __future__ import annotations

import difflib
import re
import string
from typing import Any, NamedTuple

from kvspec.errors import KvspecError
from kvspec.source.document import Document
from kvspec.source.schema import LayerEntry, LayerFields, PatternEntry, Source

#: More layers than any model has: a typo in a repeat count, not a model.
MAX_LAYERS = 100_000

#: A pattern item for a decoder layer that holds no cache: it only takes an index.
SKIP = "-"

_ENTRY_ONLY = ("type", "name", "index", "repeat")

#: What a layer name may not hold: control characters (an escape sequence would
#: rewrite the terminal a report is shown on), and invisible or bidirectional marks.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069\ufeff]")


Path = tuple[str | int, ...]


class ExpandedLayer(NamedTuple):
    """One layer of the model as the source gives it (a named tuple: one is made per
    layer of every compile, in a quarter of a frozen dataclass's time)."""

    name: str
    # the layer's index; the field hides tuple.index, which nothing calls on a layer
    index: int | None  # type: ignore[assignment]
    fields: dict[str, Any]
    #: YAML path of the entry that produced this layer (for error positions).
    path: Path
    type_name: str | None = None
    #: Where each field was set (defaults, the layer type or the entry).
    origins: dict[str, Path] | None = None

    def origin(self, name: str) -> Path:
        """The YAML path that set field ``name`` (the entry's when unknown)."""
        return (self.origins or {}).get(name, self.path)


def merge_fields(*parts: tuple[LayerFields | None, Path]
                 ) -> tuple[dict[str, Any], dict[str, Path]]:
    """Fields set by ``(part, its path)``, later ones winning, and where each was set."""
    out: dict[str, Any] = {}
    origins: dict[str, Path] = {}
    for part, path in parts:
        if part is None:
            continue
        for k, v in part.model_dump(exclude_none=True).items():
            if k not in _ENTRY_ONLY:
                out[k] = v
                origins[k] = path + (k,)
    return out, origins


def template_problem(template: str) -> str | None:
    """Why ``template`` is not a layer-name template (only ``{index}`` may be
    filled in, with no format spec or conversion), or None."""
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as exc:
        return str(exc)
    for _, field, spec, conversion in parts:
        if field is None:
            continue
        if field != "index" or spec or conversion:
            return (f"{{{field}{'!' + conversion if conversion else ''}"
                    f"{':' + spec if spec else ''}}} is not {{index}}")
    return None


def control_problem(doc: Document, path: tuple, name: str, what: str) -> KvspecError | None:
    """An error at ``path`` when the layer name (or template) ``name`` holds a control
    character, or None.

    >>> control_problem(None, (), "model.layers.{index}.attn", "layer_name") is None
    True
    """
    m = _CONTROL.search(name)
    if m is None:
        return None
    char = m.group().encode("unicode_escape").decode("ascii")
    return doc.error(f"{what} holds a control character ({char}) at character "
                     f"{m.start() + 1}", path, expected="printable characters",
                     found=repr(name), hint="layer names are the engine's module names; "
                     "remove it (an escape sequence would rewrite the terminal a report "
                     "is printed on)")


def unknown_type(doc: Document, path: tuple, name: str, source: Source) -> KvspecError:
    known = sorted(source.layer_types)
    close = difflib.get_close_matches(name, known, n=1)
    return doc.error(f"unknown layer type {name!r}", path,
                     expected="one of " + (", ".join(known) or "(no layer_types defined)"),
                     found=name, hint=f"did you mean {close[0]!r}?" if close
                     else "define it under layer_types")


class _Expander:
    """Walks the entries once, numbering decoder layers."""

    def __init__(self, source: Source, doc: Document) -> None:
        self.source, self.doc = source, doc
        self.layers: list[ExpandedLayer] = []
        self.errors: list[KvspecError] = []
        self.index = 0
        self._typed: dict[str | None, tuple[dict[str, Any], dict[str, Path]]] = {}
        self._templates: dict[str, str | None] = {}

    def typed_fields(self, type_name: str | None) -> tuple[dict[str, Any], dict[str, Path]]:
        """The defaults merged with a layer type's fields (None: the defaults alone),
        once per type."""
        if type_name not in self._typed:
            parts: list[tuple[LayerFields | None, Path]] = [(self.source.defaults, ("defaults",))]
            if type_name is not None:
                parts.append((self.source.layer_types[type_name], ("layer_types", type_name)))
            self._typed[type_name] = merge_fields(*parts)
        return self._typed[type_name]

    def render(self, template: str, path: tuple) -> str:
        if template not in self._templates:
            self._templates[template] = template_problem(template)
            self._control(template, path)
        problem = self._templates[template]
        if problem is not None:
            self.errors.append(self.doc.error(f"bad layer_name template {template!r}: {problem}",
                                              path, expected="a name with {index} where the "
                                              "decoder-layer index goes", found=template,
                                              hint="write {index} as it is (no format spec, "
                                              "attribute or index), and {{ }} for a brace, e.g. "
                                              "model.layers.{index}.self_attn.attn"))
            return f"{template}\0{self.index}"  # unique: no second error for a repeated name
        return template.format(index=self.index)

    def _control(self, template: str, path: tuple) -> None:
        """A control character in a template is an error (once per template)."""
        problem = control_problem(self.doc, path, template, "layer_name template")
        if problem is not None:
            self.errors.append(problem)

    def pattern(self, entry: PatternEntry, base: tuple) -> None:
        plan = self._pattern_plan(entry, base)
        if plan is None:  # a problem in the pattern: reported layer by layer below
            self._pattern_slow(entry, base)
            return
        layers, index = self.layers, self.index
        for _ in range(entry.repeat):
            for path, members in plan:
                for type_name, fields, origins, template in members:
                    layers.append(ExpandedLayer(template.format(index=index), index, fields,
                                                path, type_name, origins))
                index += 1
        self.index = index

    def _pattern_plan(self, entry: PatternEntry, base: tuple) -> list[tuple] | None:
        """Per pattern item: its path and its layers' (type, fields, origins, name
        template), worked out once for every repeat; None if any item has a problem."""
        plan = []
        for p, item in enumerate(entry.pattern):
            members = []
            if item.strip() != SKIP:
                for type_name in (t.strip() for t in item.split("+")):
                    if type_name not in self.source.layer_types:
                        return None
                    fields, origins = self.typed_fields(type_name)
                    template = fields.get("layer_name") or self.source.layer_name
                    if template not in self._templates:
                        self._templates[template] = template_problem(template)
                        self._control(template, origins.get("layer_name", ("layer_name",)))
                    if self._templates[template] is not None:
                        return None
                    members.append((type_name, fields, origins, template))
            plan.append((base + ("pattern", p), members))
        return plan

    def _pattern_slow(self, entry: PatternEntry, base: tuple) -> None:
        for _ in range(entry.repeat):
            for p, item in enumerate(entry.pattern):
                path = base + ("pattern", p)
                if item.strip() == SKIP:
                    self.index += 1  # a decoder layer without a cache (MLP/MoE only)
                    continue
                for type_name in (t.strip() for t in item.split("+")):
                    if type_name not in self.source.layer_types:
                        self.errors.append(unknown_type(self.doc, path, type_name, self.source))
                        continue
                    fields, origins = self.typed_fields(type_name)
                    name = self.render(fields.get("layer_name") or self.source.layer_name,
                                       origins.get("layer_name", ("layer_name",)))
                    self.layers.append(ExpandedLayer(name, self.index, fields, path, type_name,
                                                     origins))
                self.index += 1

    def entry(self, entry: LayerEntry, base: tuple) -> None:
        t = None
        if entry.type is not None:
            t = self.source.layer_types.get(entry.type)
            if t is None:
                self.errors.append(unknown_type(self.doc, base + ("type",), entry.type,
                                                self.source))
                return
        typed, typed_origins = self.typed_fields(entry.type if t is not None else None)
        own, own_origins = merge_fields((entry, base))
        fields, origins = {**typed, **own}, {**typed_origins, **own_origins}
        if entry.name is not None:
            control = control_problem(self.doc, base + ("name",), entry.name, "layer name")
            if control is not None:
                self.errors.append(control)
            if entry.repeat > 1:
                self.errors.append(self.doc.error(
                    "an entry with an explicit name cannot repeat", base + ("repeat",),
                    hint="use a name template (layer_name) instead"))
                return
            self.layers.append(ExpandedLayer(entry.name, None, fields, base, entry.type,
                                             origins))
            return
        for _ in range(entry.repeat):
            name = self.render(fields.get("layer_name") or self.source.layer_name,
                               origins.get("layer_name", ("layer_name",)))
            self.layers.append(ExpandedLayer(name, self.index, fields, base, entry.type,
                                             origins))
            self.index += 1


def expand_layers(source: Source, doc: Document) -> tuple[list[ExpandedLayer], list[KvspecError]]:
    """Every layer of ``source`` in model order, and the problems found."""
    walker = _Expander(source, doc)
    total = 0
    for e, entry in enumerate(source.layers):
        base: tuple[str | int, ...] = ("layers", e)
        per_repeat = sum(len(item.split("+")) for item in entry.pattern) \
            if isinstance(entry, PatternEntry) else 1
        total += entry.repeat * per_repeat
        if total > MAX_LAYERS:
            walker.errors.append(doc.error(
                f"the model would have more than {MAX_LAYERS:,} layers", base + ("repeat",),
                expected=f"at most {MAX_LAYERS:,} layers in all", found=f"{total:,} so far",
                hint="check the repeat counts"))
            break
        if entry.index is not None:
            walker.index = entry.index
        if isinstance(entry, PatternEntry):
            walker.pattern(entry, base)
        else:
            walker.entry(entry, base)
    return walker.layers, walker.errors
