"""One type, several shapes: a group of layers that need the same token slots
but whose pages differ (the reference's ``UniformTypeKVCacheSpecs``).

One block of such a group holds one page of every member, so its page is the
sum of theirs.

>>> from kvspec.model.specs.attention import FullAttention
>>> a = FullAttention(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16")
>>> b = FullAttention(block_size=16, num_kv_heads=4, head_size=128, dtype="bfloat16")
>>> u = UniformType.of({"a": a, "b": b})
>>> u.page_size_bytes == a.page_size_bytes + b.page_size_bytes
True
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from kvspec.model.engine import Engine
from kvspec.model.specs.base import LayerSpec, MergeInvalid, distinct


@dataclass(frozen=True, slots=True, kw_only=True)
class UniformType(LayerSpec):
    """Layers of one type (same token slots) whose pages differ in size."""

    kind: ClassVar[str] = "uniform_type"
    ref_class: ClassVar[str] = "UniformTypeKVCacheSpecs"

    members: tuple[tuple[str, LayerSpec], ...]
    _by_name: dict[str, LayerSpec] | None = field(default=None, init=False, repr=False,
                                                  compare=False)
    #: :meth:`distinct`, and the last :meth:`request_blocks` with its engine,
    #: computed on first use (a spec never changes; sizing asks them again and again).
    _distinct: tuple[LayerSpec, ...] | None = field(default=None, init=False, repr=False,
                                                    compare=False)
    _usage: tuple[Engine, int] | None = field(default=None, init=False, repr=False,
                                              compare=False)

    def __post_init__(self) -> None:
        if self.members:
            object.__setattr__(self, "dcp_sharded", self.members[0][1].dcp_sharded)

    @property
    def specs(self) -> dict[str, LayerSpec]:
        """Member specs by layer name (built once)."""
        by_name = self._by_name
        if by_name is None:
            by_name = dict(self.members)
            object.__setattr__(self, "_by_name", by_name)
        return by_name

    @property
    def first(self) -> LayerSpec:
        return self.members[0][1]

    @property
    def prefix_cacheable(self) -> bool:
        return all(s.prefix_cacheable for _, s in self.members)

    @property
    def prefix_replay_tokens(self) -> int:
        return max(s.prefix_replay_tokens for _, s in self.members)

    @property
    def page_size_bytes(self) -> int:
        page = self._page_memo
        if not page:
            page = sum(s.page_size_bytes for _, s in self.members)
            object.__setattr__(self, "_page_memo", page)
        return page

    def distinct(self) -> tuple[LayerSpec, ...]:
        """The members' distinct specs, in first-seen order (computed once)."""
        found = self._distinct
        if found is None:
            found = distinct(s for _, s in self.members)
            object.__setattr__(self, "_distinct", found)
        return found

    @property
    def block_table_token_alignment(self) -> int | None:
        return self.first.block_table_token_alignment

    @property
    def uses_slot_mapping(self) -> bool:
        return self.first.uses_slot_mapping

    def request_blocks(self, engine: Engine) -> int:
        """The most blocks any of its distinct specs takes."""
        last = self._usage
        if last is not None and last[0] is engine:
            return last[1]
        pages = max(s.request_blocks(engine) for s in self.distinct())
        object.__setattr__(self, "_usage", (engine, pages))
        return pages

    def max_memory_usage_bytes(self, engine: Engine) -> int:
        return self.request_blocks(engine) * self.page_size_bytes

    def max_num_blocks_per_req(self, engine: Engine, max_len: int) -> int:
        widths = {s.max_num_blocks_per_req(engine, max_len) for _, s in self.members}
        if len(widths) != 1:
            raise MergeInvalid(
                f"layers of one group need different block-table widths {sorted(widths)}")
        return widths.pop()

    def max_layers_per_page_size(self) -> int:
        """Most layers sharing one page size: the repeats of a balanced pattern."""
        return Counter(s.page_size_bytes for _, s in self.members).most_common(1)[0][1]

    @staticmethod
    def is_uniform_type(specs: Mapping[str, LayerSpec] | Sequence[LayerSpec]) -> bool:
        values = list(specs.values()) if isinstance(specs, Mapping) else list(specs)
        if len({s.block_size for s in values}) > 1:
            return False
        if len({s.dcp_sharded for s in values}) > 1:
            return False
        return values[0].same_type_as_all(values)

    @classmethod
    def of(cls, specs: Mapping[str, LayerSpec]) -> UniformType | None:
        if not cls.is_uniform_type(specs):
            return None
        return cls(block_size=next(iter(specs.values())).block_size,
                   members=tuple(specs.items()))

    def restricted(self, names: Sequence[str]) -> UniformType:
        """The same group over a subset of its layers (a pipeline stage's)."""
        mine = self.specs
        return UniformType(block_size=self.block_size,
                           members=tuple((n, mine[n]) for n in names))


def layer_specs(spec: LayerSpec) -> list[LayerSpec]:
    """The per-layer specs a group spec stands for."""
    if isinstance(spec, UniformType):
        return [s for _, s in spec.members]
    return [spec]
