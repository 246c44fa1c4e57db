"""The request-level manager: hand-checked decisions and invariants under hypothesis."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvspec.artifact import Artifact
from kvspec.runtime.manager import (
    KVCacheManager,
    ManagedGroup,
    ManagedLayout,
    ManagedPool,
    ManagerError,
    from_artifact,
)
from tests.planned_manager import from_layouts


def layout(*groups: ManagedGroup, blocks: int = 32, caching: bool = True,
           pools: tuple[ManagedPool, ...] | None = None) -> ManagedLayout:
    pools = pools or (ManagedPool("p", blocks, hash_block_size=4, bytes_per_block=64),)
    return ManagedLayout("t", groups, pools, scheduler_block_size=4, max_model_len=1024,
                         max_in_flight_tokens=64, enable_caching=caching)


def full(pool: str = "p", block_size: int = 4) -> ManagedGroup:
    return ManagedGroup("full", kind="full", block_size=block_size, pool=pool, full_like=True,
                        spec_key="full", useful_bytes_per_block=64)


def sliding(window: int = 8, pool: str = "p") -> ManagedGroup:
    return ManagedGroup("swa", kind="sliding", block_size=4, pool=pool, sliding_window=window,
                        spec_key=("swa", window), useful_bytes_per_block=64)


def ids(manager: KVCacheManager, r) -> tuple[list[int], ...]:
    return manager.block_ids(r)


def test_full_attention_takes_blocks_in_queue_order_and_frees_last_first() -> None:
    m = KVCacheManager(layout(full(), blocks=8))
    a = m.new_request(0, 10)
    assert m.allocate_slots(a, 10) and ids(m, a) == ([1, 2, 3],)
    b = m.new_request(1, 6)
    assert m.allocate_slots(b, 6) and ids(m, b) == ([4, 5],)
    m.free(a)  # two full blocks cached (tail of the queue), the partial one reused first
    assert [x.block_id for x in m.pools[0].free_block_queue] == [3, 6, 7, 2, 1]


def test_a_prefix_hit_shares_cached_blocks_and_stops_one_token_short() -> None:
    m = KVCacheManager(layout(full()))
    a = m.new_request(0, 12, prefix=1, prefix_tokens=12)
    assert m.allocate_slots(a, 12)
    b = m.new_request(1, 12, prefix=1, prefix_tokens=12)
    hits, tokens, _ = m.get_computed_blocks(b)
    assert tokens == 8, "the last token is recomputed: the hit stops at 11 -> 8"
    assert m.allocate_slots(b, 4, tokens, hits, full_sequence_must_fit=True)
    assert ids(m, b)[0][:2] == ids(m, a)[0][:2] and ids(m, b)[0][2] != ids(m, a)[0][2]


def test_sliding_window_blocks_that_left_the_window_become_null() -> None:
    m = KVCacheManager(layout(sliding(window=8)))
    r = m.new_request(0, 24)
    assert m.allocate_slots(r, 24)
    r.num_computed_tokens = 24
    free = m.num_free(0)
    assert m.allocate_slots(r, 1)  # skipped: 24 - 8 + 1 = 17 tokens, 4 blocks
    assert ids(m, r)[0][:4] == [0, 0, 0, 0] and ids(m, r)[0][4] != 0
    assert m.num_free(0) == free + 4 - 1


def test_an_admission_must_fit_the_whole_prompt() -> None:
    m = KVCacheManager(layout(full(), blocks=6))
    r = m.new_request(0, 40)
    assert not m.allocate_slots(r, 8, full_sequence_must_fit=True)
    assert m.allocate_slots(r, 8) and len(ids(m, r)[0]) == 2


@pytest.mark.parametrize("taken", range(8))
def test_cannot_admit_says_no_exactly_when_the_admission_fails(taken: int) -> None:
    """A preempted request sharing no keys, its blocks cached and free: told no before
    its lookup exactly when admitting it fails (its own hits count as taken)."""
    m = KVCacheManager(layout(full(), blocks=8))  # 7 free
    r = m.new_request(0, 20)  # 5 blocks
    assert m.allocate_slots(r, 12)
    m.free(r, resumes=True)
    if taken:
        assert m.allocate_slots(m.new_request(1, 4 * taken), 4 * taken)
    told_no = m.cannot_admit(r)
    hits, hit, _ = m.get_computed_blocks(r)
    assert hit == 4 * min(3, 7 - taken)  # its cached blocks left in the free queue
    assert told_no is not m.allocate_slots(r, 20 - hit, hit, hits, full_sequence_must_fit=True)
    assert told_no is (taken > 2)  # 5 blocks, 7 - taken free

    state = ManagedGroup("mamba", kind="state", block_size=8, pool="p", state_mode="align",
                         spec_key="m", useful_bytes_per_block=64)
    lay = ManagedLayout("t", (full(block_size=8), state),
                        (ManagedPool("p", 40, hash_block_size=8),),
                        scheduler_block_size=8, max_model_len=1024)
    m = KVCacheManager(lay)
    r = m.new_request(0, 16)
    assert m.allocate_slots(r, 16)
    table = ids(m, r)[1]
    assert table[0] == 0 and table[1] != 0
    r.num_computed_tokens, r.num_tokens = 16, 17
    assert m.allocate_slots(r, 1)  # a new state block for token 17
    r.num_computed_tokens, r.num_tokens = 17, 18
    assert m.allocate_slots(r, 1)  # the state block before it is freed
    assert [b != 0 for b in ids(m, r)[1]] == [False, False, True]


def test_hybrid_hits_agree_across_groups() -> None:
    m = KVCacheManager(layout(full(), sliding(window=8), blocks=64))
    a = m.new_request(0, 40, prefix=1, prefix_tokens=40)
    assert m.allocate_slots(a, 40)
    b = m.new_request(1, 40, prefix=1, prefix_tokens=40)
    hits, tokens, boundary = m.get_computed_blocks(b)
    # the window's blocks are cached only around a's replay boundary (token 39)
    assert tokens == 36 and boundary == 0
    assert sum(blk.block_id != 0 for blk in hits[1]) == 2  # the window: 7 tokens, 2 blocks


def test_a_state_group_in_mode_none_refuses_prefix_caching() -> None:
    state = ManagedGroup("mamba", kind="state", block_size=4, pool="p")
    with pytest.raises(ManagerError, match="mode 'none' with prefix caching"):
        KVCacheManager(layout(state))


def test_layout_errors_name_the_problem() -> None:
    with pytest.raises(ManagerError, match="unknown manager kind"):
        layout(ManagedGroup("g", kind="ssm", block_size=4, pool="p"))
    with pytest.raises(ManagerError, match="not declared"):
        layout(ManagedGroup("g", kind="full", block_size=4, pool="q"))
    with pytest.raises(ManagerError, match="needs its window"):
        layout(ManagedGroup("g", kind="sliding", block_size=4, pool="p"))


@pytest.mark.parametrize("name,kinds", [
    ("llama-3.1-8b", ["full"]),
    ("gemma-3-27b-it", ["sliding"] * 6 + ["full"]),
    ("llama-4-scout-17b-16e-instruct", ["local"] * 3 + ["full"]),
    ("jamba-v0.1", ["state"] * 7 + ["full"]),
    ("example-glm5-next-drafter", ["full", "ring", "state", "state", "state", "sliding"]),
])
def test_the_adapter_reads_each_group_kind(name: str, kinds: list[str]) -> None:
    lay = from_artifact(Artifact.read(f"layouts/{name}.kvlayout.json"), 100)
    assert [g.kind for g in lay.groups] == kinds
    assert lay.pools[0].num_blocks == 100


def test_the_adapter_turns_caching_off_for_state_mode_none() -> None:
    from kvspec.compiler import compile_source
    from tests.vllm.cases import source

    art = compile_source(source("synthetic-mamba-hybrid"), "m.yaml")
    lay = from_artifact(art, 50)
    assert not lay.enable_caching and lay.groups[0].block_size == 32768


def test_a_drafter_with_its_own_pool_gets_a_second_pool() -> None:
    lay = from_artifact(Artifact.read("layouts/example-glm5-next-drafter.kvlayout.json"), 100)
    assert [p.name for p in lay.pools] == ["device", "draft"]
    assert lay.groups[-1].pool == "draft" and lay.pools[1].num_blocks > 1


LAYOUTS = sorted(Path("layouts").glob("*.kvlayout.json"))


def _keys_as_order(lay: ManagedLayout) -> ManagedLayout:
    """``lay`` with each group's spec key replaced by the order it first appears in
    (the artifact's keys are spec-table indices, a plan's are specs)."""
    order: dict[object, int] = {}
    groups = tuple(dataclasses.replace(g, spec_key=order.setdefault(g.spec_key, len(order)))
                   for g in lay.groups)
    return dataclasses.replace(lay, groups=groups)


@pytest.mark.parametrize("path", LAYOUTS, ids=lambda p: p.name.split(".")[0])
def test_the_artifact_reads_as_the_plan_it_froze(path: Path) -> None:
    """The frozen body gives the manager exactly what the re-planned layout does
    (read by the oracle in tests/planned_manager.py)."""
    from kvspec.compiled import read

    art = read(path)
    for n in (None, 100, 5000):
        if art.pools:
            planned = from_layouts([(p.name, p.layout) for p in art.pools])
        elif n is None and art.body.budget is None and art.body.engine.num_blocks is None:
            continue
        else:
            planned = from_layouts([("device", art.layout)], None if n is None else {"device": n})
        frozen = from_artifact(Artifact.read(path), n)
        assert _keys_as_order(frozen) == _keys_as_order(planned)


# -- invariants under random traffic ------------------------------------------------

GROUPS = st.sampled_from([
    (full(),), (sliding(8),), (full(), sliding(8)), (full(), sliding(12), sliding(12)),
    (ManagedGroup("loc", kind="local", block_size=4, pool="p", attention_chunk_size=8,
                  spec_key="loc"), full()),
    (full(), ManagedGroup("m", kind="state", block_size=4, pool="p", state_mode="align",
                          spec_key="m")),
    (full(), sliding(8, pool="q")),
])


@st.composite
def scenarios(draw):
    groups = draw(GROUPS)
    names = sorted({g.pool for g in groups})
    pools = tuple(ManagedPool(n, draw(st.integers(12, 60)), hash_block_size=4) for n in names)
    ops = draw(st.lists(st.tuples(st.sampled_from("aadf"), st.integers(1, 40),
                                  st.integers(0, 2)), min_size=5, max_size=60))
    return groups, pools, draw(st.booleans()), ops


def check_invariants(m: KVCacheManager, live: list) -> None:
    for p, pool in enumerate(m.pools):
        refs: Counter = Counter()
        holders: dict[int, set[int]] = {}
        for r in live:
            for g, table in enumerate(r.tables):
                if m.group_pool[g] != p:
                    continue
                for b in table:
                    if not b.is_null:
                        refs[b.block_id] += 1
                        holders.setdefault(b.block_id, set()).add(r.index)
        for block in pool.blocks[1:]:
            assert block.ref_count == refs[block.block_id], "a hold per table entry"
            assert (block.prev_free is not None) == (block.ref_count == 0), "queued iff free"
        for block_id, owners in holders.items():
            if len(owners) > 1:
                assert pool.blocks[block_id]._hash is not None, "shared only by a cache hit"
        held = sum(1 for b in pool.blocks[1:] if b.ref_count)
        assert pool.free_block_queue.num_free_blocks + held == pool.num_blocks - 1


def check_windows(m: KVCacheManager, r, processed: int) -> None:
    """Blocks no attention reads after ``processed`` tokens are null."""
    for manager, table in zip(m.managers, r.tables):
        skipped = manager.skipped_tokens(processed) // manager.bs
        if manager.group.kind == "sliding":
            assert all(b.is_null for b in table[:min(skipped, len(table))])


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_blocks_are_never_lost_or_shared_unless_cached(scenario) -> None:
    groups, pools, caching, ops = scenario
    lay = ManagedLayout("t", groups, pools, scheduler_block_size=4, max_model_len=256,
                        max_in_flight_tokens=64, enable_caching=caching)
    m = KVCacheManager(lay)
    live: list = []
    for i, (op, size, prefix) in enumerate(ops):
        if op == "a":  # admit a request, with its prefix-cache hit
            r = m.new_request(i, size, prefix=prefix, prefix_tokens=min(size, 24))
            hits, hit, r.shared_prefix_boundary = m.get_computed_blocks(r)
            if m.allocate_slots(r, size - hit, hit, hits, full_sequence_must_fit=True):
                r.num_computed_tokens = size
                r.num_tokens = size + 1
                live.append(r)
        elif op == "d" and live:  # one decode step
            r = live[size % len(live)]
            if m.allocate_slots(r, 1):
                check_windows(m, r, r.num_computed_tokens)
                r.num_computed_tokens += 1
                r.num_tokens += 1
        elif op == "f" and live:
            m.free(live.pop(size % len(live)))
        m.new_step_starts()
        check_invariants(m, live)
    for r in live:
        m.free(r)
    check_invariants(m, [])
