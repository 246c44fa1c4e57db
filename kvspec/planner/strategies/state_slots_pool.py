"""The state-slot arrangement's pools: bytes per block, the drafter's pool, placement.

One block of the main pool holds ``len(mla) * mla_page + len(indexer) *
idx_page`` bytes; the memory is split into per-layer regions, state layer *i*
of every state group in MLA layer *i*'s region, each tail ring in its
indexer's, the drafter's layers after them (in a pool of their own)::

    | mla0 (+state0,i) | mla1 (+state1,i) | ... | idx0 (+tail0) | ... | draft... |
    |<- mla_page * N ->|                        |<- idx_page*N ->|

The arrangement is read back from the groups' recorded roles (``attention``,
``tail``, ``state``, ``draft``), for the whole model or one pipeline stage.
Within a region each layer's strides follow the axis order, so a drafter with
several heads under ``LHBNC`` or ``BHLNC`` stays inside its region.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvspec.model.affine import Affine
from kvspec.model.axes import DIM_B, DIM_L
from kvspec.model.engine import Engine
from kvspec.model.geometry import spec_strides
from kvspec.model.plan import Group, Tensor
from kvspec.model.specs import LayerSpec, UniformType, cdiv
from kvspec.planner.strategies.state_slots import STRATEGY


@dataclass(frozen=True, slots=True)
class SlotArrangement:
    """The state-slot arrangement of (possibly stage-projected) groups."""

    attn: Group
    attn_id: int
    states: tuple[tuple[int, Group], ...]
    mla_names: tuple[str, ...]
    idx_names: tuple[str, ...]
    mla_page: int
    idx_page: int
    tail: tuple[int, Group] | None
    drafts: tuple[tuple[int, Group], ...]

    @property
    def target_bytes_per_block(self) -> int:
        return len(self.mla_names) * self.mla_page + len(self.idx_names) * self.idx_page

    @property
    def draft_bytes_per_block(self) -> int:
        return sum(len(g.layer_names) * g.spec.page_size_bytes for _, g in self.drafts)


def arrangement_of(groups: Sequence[Group]) -> SlotArrangement | None:
    """The arrangement the groups record, or None when they are not of this strategy
    or this stage holds no MLA or indexer layer (its groups place as usual)."""
    if not groups or any(g.strategy != STRATEGY for g in groups):
        return None
    by_role: dict[str, list[tuple[int, Group]]] = {}
    for i, g in enumerate(groups):
        by_role.setdefault(g.role, []).append((i, g))
    attn_id, attn = by_role["attention"][0]
    assert isinstance(attn.spec, UniformType)
    inner = attn.spec.specs
    mla = tuple(n for n in attn.layer_names if inner[n].tokens_per_state_value == 1)
    idx = tuple(n for n in attn.layer_names if inner[n].tokens_per_state_value > 1)
    if not mla or not idx:
        return None
    tails = by_role.get("tail")
    return SlotArrangement(attn, attn_id, tuple(by_role.get("state", ())), mla, idx,
                      inner[mla[0]].page_size_bytes, inner[idx[0]].page_size_bytes,
                      tails[0] if tails else None, tuple(by_role.get("draft", ())))


def draft_pool_blocks(engine: Engine, arrangement: SlotArrangement) -> int | None:
    """Blocks in the drafter's own pool, or None when it rides the target pool.

    A sliding-window drafter holds its window, the block it fills, one more
    across a block boundary, and the blocks one prefill chunk writes.
    """
    if not arrangement.drafts or not engine.draft_pool:
        return None
    if engine.draft_pool_blocks is not None:
        return engine.draft_pool_blocks
    need = 1  # the null block
    for _, g in arrangement.drafts:
        spec = g.spec
        window = getattr(spec, "sliding_window", None) or spec.block_size
        per_seq = cdiv(window, spec.block_size) + 2
        need = max(need, engine.max_num_seqs * per_seq
                   + cdiv(engine.max_num_batched_tokens, spec.block_size) + 1)
    return need


def bytes_per_block(engine: Engine, arrangement: SlotArrangement) -> int:
    extra = 0 if engine.draft_pool else arrangement.draft_bytes_per_block
    return arrangement.target_bytes_per_block + extra


def draft_pool_bytes(engine: Engine, arrangement: SlotArrangement) -> int:
    blocks = draft_pool_blocks(engine, arrangement)
    return blocks * arrangement.draft_bytes_per_block if blocks else 0


def memory_usage(engine: Engine, arrangement: SlotArrangement) -> int:
    """Bytes one request at ``engine.max_model_len`` needs from the pools."""
    blocks = arrangement.attn.spec.request_blocks(engine)
    blocks += sum(g.spec.request_blocks(engine) for _, g in arrangement.states)
    if arrangement.tail is not None and arrangement.tail[1].layer_names:
        blocks += 1
    if draft_pool_blocks(engine, arrangement):
        return blocks * arrangement.target_bytes_per_block + draft_pool_bytes(engine, arrangement)
    for _, g in arrangement.drafts:
        if g.layer_names:
            blocks += g.spec.request_blocks(engine)
    return blocks * (arrangement.target_bytes_per_block + arrangement.draft_bytes_per_block)


def place(engine: Engine, arrangement: SlotArrangement) -> list[Tensor]:
    """Tensors of the state-slot arrangement, affine in the pool's block count ``N``."""
    n = Affine(1, 0)
    d_blocks = draft_pool_blocks(engine, arrangement)
    size = n * bytes_per_block(engine, arrangement) + draft_pool_bytes(engine, arrangement)
    order = engine.axis_order
    tensors: list[Tensor] = []
    strides_of: dict[tuple[int, Affine], list[Affine]] = {}  # layers sharing a spec

    def add(name: str, group: int, spec: LayerSpec, offset: Affine, blocks: Affine,
            pool: str, role: str) -> None:
        strides = strides_of.get((id(spec), blocks))
        if strides is None:
            strides = strides_of[id(spec), blocks] = spec_strides(spec, blocks, 1, order)
        tensors.append(Tensor(size=size, layers=(name,), layer_stride=strides[DIM_L],
                              block_stride=strides[DIM_B], offset=offset, group=group,
                              pool=pool, role=role))

    attn = arrangement.attn
    for i, name in enumerate(arrangement.mla_names):
        offset = n * (i * arrangement.mla_page)
        add(name, arrangement.attn_id, attn.layer_spec(name), offset, n, "device", "mla")
        for gid, g in arrangement.states:
            if i < len(g.layer_names):
                add(g.layer_names[i], gid, g.spec, offset, n, "device", "state in mla slot")
    idx_base = n * (len(arrangement.mla_names) * arrangement.mla_page)
    for i, name in enumerate(arrangement.idx_names):
        offset = idx_base + n * (i * arrangement.idx_page)
        add(name, arrangement.attn_id, attn.layer_spec(name), offset, n, "device", "indexer")
        if arrangement.tail is not None and i < len(arrangement.tail[1].layer_names):
            tid, tail = arrangement.tail
            tname = tail.layer_names[i]
            add(tname, tid, tail.layer_spec(tname), offset, n, "device", "tail in indexer slot")
    offset = idx_base + n * (len(arrangement.idx_names) * arrangement.idx_page)
    blocks = Affine.of(d_blocks) if d_blocks else n
    for gid, g in arrangement.drafts:
        for name in g.layer_names:
            add(name, gid, g.spec, offset, blocks, "draft" if d_blocks else "device",
                "drafter")
            offset = offset + blocks * g.spec.page_size_bytes
    return tensors
