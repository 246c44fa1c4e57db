"""The layer-spec base class and the merge rules every kind derives from its fields.

A *page* is one layer's bytes for one block, laid out as ``[H, N, C]``: head
slots x states per block x bytes per cell. Each kind is a frozen dataclass;
what a group of layers shares is the *merge* of their specs, and that merge is
derived from the fields themselves: every field says how layers of one group
combine it (``merge=`` in its metadata)::

    agree   every layer must have the same value (the default)
    any     true when any layer's is (e.g. ``non_causal``)
    window  the one non-None value, if any (sliding windows, attention chunks)

so a field added to a kind is merged correctly without touching a merge
method. Layers may merge only within one *merge family* (a class and its
subclasses, less the kinds that merge on their own).

>>> from kvspec.model.specs.attention import FullAttention
>>> f = FullAttention(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16")
>>> FullAttention.merge([f, f]) == f
True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cache
from typing import Any, ClassVar, TypeVar

from kvspec.model.engine import Engine

_T = TypeVar("_T")


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative integers."""
    return -(-a // b)


def round_up(x: int, multiple: int) -> int:
    return cdiv(x, multiple) * multiple


class MergeConflict(Exception):
    """Layers that cannot share one block table (internal; the planner decides)."""


class MergeInvalid(ValueError):
    """Layers that could share a table but disagree on a value that must agree."""


def merged(how: str, default: Any = None, **kw: Any) -> Any:
    """A dataclass field with a merge rule other than ``agree``."""
    return field(default=default, metadata={"merge": how}, **kw)


def _agree(name: str, values: list[Any]) -> Any:
    first = values[0]
    if any(v != first for v in values[1:]):
        raise MergeConflict(f"layers of one group differ in {name}")
    return first


def _any(name: str, values: list[Any]) -> Any:
    return any(values)


def _window(name: str, values: list[Any]) -> Any:
    distinct = {v for v in values if v is not None}
    if len(distinct) > 1:
        raise MergeInvalid(f"all attention layers in one group must have the same "
                           f"{name.replace('_', ' ')}, found {sorted(distinct)}")
    return next(iter(distinct), None)


MERGE_RULES: dict[str, Callable[[str, list[Any]], Any]] = {
    "agree": _agree, "any": _any, "window": _window}


def per_class(fn: Callable[[type], _T]) -> Callable[[type], _T]:
    """``functools.cache`` for a function of a class, typed as taking any class:
    mypy does not see ``type[X]`` as ``Hashable`` (python/mypy#11470), so the
    cache wrapper's own signature would refuse a ``type[LayerSpec]`` variable."""
    return cache(fn)


@per_class
def merge_fields(cls: type) -> tuple[tuple[str, Callable[[str, list[Any]], Any]], ...]:
    """``(field name, rule)`` of every init field of ``cls``, once per class.

    Window fields come first, as in the reference: two windows that differ are
    an invalid model (:class:`MergeInvalid`), not just two groups."""
    rules = [(f.metadata.get("merge", "agree"), f.name) for f in dataclasses.fields(cls)
             if f.init]
    rules.sort(key=lambda r: r[0] != "window")
    return tuple((name, MERGE_RULES[how]) for how, name in rules)


@per_class
def init_field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if f.init)


@per_class
def init_field_set(cls: type) -> frozenset[str]:
    return frozenset(init_field_names(cls))


def distinct(specs: Iterable[LayerSpec]) -> tuple[LayerSpec, ...]:
    """The distinct specs among ``specs``, in first-seen order. Layers alike share
    one spec object, so equal specs are looked for among the distinct objects
    (hashing a spec hashes every field)."""
    return tuple(dict.fromkeys({id(s): s for s in specs}.values()))


def by_spec(layers: Iterable[tuple[str, LayerSpec]]) -> dict[LayerSpec, list[str]]:
    """Layer names by spec, in first-seen order, equal specs together: each spec
    object is hashed once, not once per layer (layers alike share one object).

    >>> from kvspec.model.specs import FullAttention
    >>> a = FullAttention(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16")
    >>> b = FullAttention(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16")
    >>> list(by_spec([("x", a), ("y", b), ("z", a)]).values())
    [['x', 'y', 'z']]
    """
    out: dict[LayerSpec, list[str]] = {}
    seen: dict[int, list[str]] = {}
    for name, spec in layers:
        names = seen.get(id(spec))
        if names is None:
            names = seen[id(spec)] = out.setdefault(spec, [])
        names.append(name)
    return out


def once_per_object(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``fn`` computed once per argument object: layers alike share one spec object
    (and one cell-parts tuple), so what is made from it is made once and shared.
    The arguments must outlive the returned function's use (the key is ``id``)."""
    done: dict[int, Any] = {}

    def once(obj: Any) -> Any:
        key = id(obj)
        if key not in done:
            done[key] = fn(obj)
        return done[key]

    return once


def replace(spec: Any, **changes: Any) -> Any:
    """``dataclasses.replace`` (re-runs ``__post_init__``, as the reference does)."""
    return dataclasses.replace(spec, **changes)


def recast(spec: LayerSpec, target: type[LayerSpec], **changes: Any) -> LayerSpec:
    """Rebuild ``spec`` as kind ``target`` (e.g. sliding window -> full attention).

    Fields the target lacks are dropped; fields only the target has keep their
    defaults.
    """
    names = set(init_field_names(target))
    kwargs = {n: getattr(spec, n) for n in init_field_names(type(spec)) if n in names}
    kwargs.update(changes)
    return target(**kwargs)


class PaddedPage:
    """Mixin of the kinds whose page ``page_size_padded`` may pad at its end: the
    page the kind computes (:meth:`_unpadded_page`), once per spec, and padded."""

    __slots__ = ()
    # fields of the LayerSpec dataclass this is mixed into (annotations only: the
    # mixin is no dataclass, so they are not fields of its own)
    _page_memo: int
    page_size_padded: int | None

    def _unpadded_page(self) -> int:
        raise NotImplementedError

    @property
    def unpadded_page_size_bytes(self) -> int:
        page = self._page_memo
        if not page:
            page = self._unpadded_page()
            object.__setattr__(self, "_page_memo", page)
        return page

    @property
    def page_size_bytes(self) -> int:
        padded = self.page_size_padded
        return padded if padded is not None else self.unpadded_page_size_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerSpec:
    """One layer's KV memory format. Subclasses are the layer kinds."""

    #: The kind's name in sources, dumps and artifacts (see :mod:`kvspec.model.kinds`).
    kind: ClassVar[str] = "layer"
    #: The reference planner's class name for this kind (conformance output).
    ref_class: ClassVar[str] = "KVCacheSpec"
    #: Inside its :meth:`merge_family`, this kind merges only with kinds that also
    #: merge apart (MLA inside full attention's family).
    merges_apart: ClassVar[bool] = False
    #: The reference's uniform-type test (``UniformTypeKVCacheSpecs.is_uniform_type``):
    #: a layer buckets with instances of the class that sets this, agreeing on
    #: these fields (:meth:`same_type_as_all`; no class sets it: no bucketing rule).
    bucket_by: ClassVar[tuple[str, ...]]
    #: Set by a kind whose layers merge with instances of it and of its subclasses
    #: (its merge family: :meth:`merge_family`).
    family: ClassVar[bool]

    block_size: int
    #: Decode-context parallelism shards this cache's tokens across ranks.
    dcp_sharded: bool = False
    #: Bytes the distance between physical blocks must be a multiple of.
    block_stride_alignment: int | None = None
    #: The unpadded page, computed on first use (a spec's fields never change
    #: after construction; not a field of the format: no init, compare or repr).
    _page_memo: int = field(default=0, init=False, repr=False, compare=False)

    # -- page geometry -------------------------------------------------------
    @property
    def num_heads(self) -> int:
        raise NotImplementedError

    @property
    def tokens_per_state_value(self) -> int | Fraction:
        raise NotImplementedError

    @property
    def state_content_size_bytes(self) -> int:
        raise NotImplementedError

    @property
    def page_size_bytes(self) -> int:
        raise NotImplementedError

    @property
    def unpadded_page_size_bytes(self) -> int:
        return self.page_size_bytes

    @property
    def num_states(self) -> int:
        return self.kernel_states(self.block_size)

    def kernel_states(self, kernel_block_size: int) -> int:
        """States (N) in a block of ``kernel_block_size`` tokens."""
        tps = self.tokens_per_state_value
        if tps > 0:
            return int(kernel_block_size // tps)
        return 1

    # -- behaviour ------------------------------------------------------------
    @property
    def prefix_cacheable(self) -> bool:
        return True

    @property
    def prefix_replay_tokens(self) -> int:
        return 0

    @property
    def block_table_token_alignment(self) -> int | None:
        return 128

    @property
    def uses_slot_mapping(self) -> bool:
        return True

    def max_memory_usage_bytes(self, engine: Engine) -> int:
        """Bytes one request at ``engine.max_model_len`` can hold at most."""
        raise NotImplementedError

    def request_blocks(self, engine: Engine) -> int:
        """Blocks one request at ``engine.max_model_len`` takes (the one place that
        decides it): its most bytes over the page, rounded up."""
        return cdiv(self.max_memory_usage_bytes(engine), self.page_size_bytes)

    def max_num_blocks_per_req(self, engine: Engine, max_len: int) -> int:
        """Block-table row length for a request of ``max_len`` tokens."""
        return cdiv(max_len, self.block_size)

    def with_block_size(self, block_size: int) -> LayerSpec:
        return dataclasses.replace(self, block_size=block_size)

    # -- merging and bucketing --------------------------------------------------
    @classmethod
    def merge(cls, specs: Sequence[LayerSpec]) -> LayerSpec:
        """One spec for a group of layers (the first layer's kind), combining
        each field by its rule; ``MergeConflict`` when they cannot share a table."""
        first = specs[0]
        kind = type(first)
        family, apart = first.merge_family(), first.merges_apart
        # Layers alike share one spec object, and every rule gives the same for a
        # value repeated: merge the distinct objects, in first-seen order.
        unique = distinct(specs)
        for s in unique:
            if (type(s) is not kind) if family is None else (
                    not isinstance(s, family) or (s.merges_apart and not apart)):
                raise MergeConflict(f"{s.kind} layers cannot share a block table with "
                                    f"{first.kind} layers")
        if all(s is first or s == first for s in unique):
            out = first
        else:
            having = [(s, init_field_set(type(s))) for s in unique]
            values = {}
            for name, rule in merge_fields(kind):
                values[name] = rule(name, [getattr(s, name) for s, names in having
                                           if name in names])
            out = kind(**values)
        out.check_merged()
        return out

    @classmethod
    def merge_family(cls) -> type | None:
        """Layers merge only with instances of this class, the nearest that sets
        :attr:`family` (None: only with layers of exactly their own kind)."""
        return _setter(cls, "family")

    def check_merged(self) -> None:
        """Reject a merged spec that no group may have (hook for kinds)."""

    def same_type_as_all(self, specs: Sequence[LayerSpec]) -> bool:
        """Whether every spec needs the same token slots as this one: each is an
        instance of the class that sets :attr:`bucket_by`, agreeing on its fields."""
        owner = _setter(type(self), "bucket_by")
        if owner is None:
            raise MergeConflict(f"no bucketing rule for {type(self).__name__}")
        return all(isinstance(s, owner) and all(getattr(s, f) == getattr(self, f)
                                                for f in self.bucket_by) for s in specs)


def _setter(cls: type, name: str) -> type | None:
    """The nearest class of ``cls``'s MRO that sets the class variable ``name``
    (None: none does)."""
    return next((c for c in cls.__mro__ if name in vars(c)), None)
