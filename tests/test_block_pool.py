"""Unit and property tests of the block pool and prefix-cache hashing.

The free queue is checked against a plain list model, the pool against a model
of the engine's allocate / cache / hit / free cycle across several groups that
share one pool. Block hash keys are checked against the reference's rules:
(hash, group id) keys and coarser-group views.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    precondition,
    rule,
)

from kvspec.errors import KvspecError
from kvspec.runtime import block_pool as block_pool_module
from kvspec.runtime.block_pool import (
    Block,
    BlockPool,
    BlockPoolError,
    BlockStateError,
    FreeBlockQueue,
    FreeKVCacheBlockQueue,
    NotEnoughFreeBlocksError,
)
from kvspec.runtime.hashing import (
    BlockHashListWithBlockSize,
    HashingError,
    get_block_hash,
    get_group_id,
    make_block_hash_with_group_id,
    resolve_block_hashes,
    split_block_hash_with_group_id,
)


def ids(blocks) -> list[int]:
    return [b.block_id for b in blocks]


def check_links(queue: FreeBlockQueue, universe: list[Block]) -> None:
    """The list is doubly linked both ways; unqueued blocks carry no links."""
    queued = queue.get_all_free_blocks()
    assert len(queued) == queue.num_free_blocks == len(queue)
    for before, after in itertools.pairwise(queued):
        assert before.next_free is after and after.prev_free is before
    queued_ids = {id(b) for b in queued}
    for block in universe:
        if id(block) not in queued_ids:
            assert block.prev_free is None and block.next_free is None


@pytest.fixture(autouse=True)
def every_error_says_how_to_put_it_right(monkeypatch: pytest.MonkeyPatch):
    """Each block-pool and hashing error a test here provokes carries a hint."""
    made: list[KvspecError] = []
    init = KvspecError.__init__

    def recording(self: KvspecError, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(KvspecError, "__init__", recording)
    yield
    bare = [f"{type(e).__name__}: {e.message}" for e in made if not e.hint]
    assert not bare, bare


def test_block_pool_and_hashing_do_not_import_torch() -> None:
    code = (
        "import sys, kvspec.runtime.block_pool, kvspec.runtime.hashing; "
        "sys.exit('torch' in sys.modules)"
    )
    repo = Path(__file__).resolve().parents[1]
    assert subprocess.run([sys.executable, "-c", code], cwd=repo, check=False).returncode == 0


# --------------------------------------------------------------------------
# Free-block queue
# --------------------------------------------------------------------------


def make_queue(n: int) -> tuple[list[Block], FreeBlockQueue]:
    blocks = [Block(i) for i in range(n)]
    return blocks, FreeBlockQueue(blocks)


def test_queue_starts_in_block_id_order() -> None:
    blocks, queue = make_queue(5)
    assert ids(queue.get_all_free_blocks()) == [0, 1, 2, 3, 4]
    assert queue.num_free_blocks == 5
    check_links(queue, blocks)


def test_empty_queue() -> None:
    queue = FreeBlockQueue([])
    assert queue.get_all_free_blocks() == []
    assert list(queue.iter_blocks_after(None)) == []
    assert queue.popleft_n(0) == []
    with pytest.raises(NotEnoughFreeBlocksError):
        queue.popleft()
    queue.append(Block(3))
    assert ids(queue) == [3]


def test_popleft_until_empty_then_error() -> None:
    blocks, queue = make_queue(3)
    assert [queue.popleft().block_id for _ in range(3)] == [0, 1, 2]
    with pytest.raises(NotEnoughFreeBlocksError) as err:
        queue.popleft()
    assert isinstance(err.value, KvspecError) and isinstance(err.value, ValueError)
    check_links(queue, blocks)


def test_popleft_n_all_and_too_many() -> None:
    blocks, queue = make_queue(4)
    with pytest.raises(NotEnoughFreeBlocksError):
        queue.popleft_n(5)
    assert ids(queue) == [0, 1, 2, 3]  # unchanged
    assert ids(queue.popleft_n(4)) == [0, 1, 2, 3]
    assert queue.num_free_blocks == 0
    check_links(queue, blocks)


def test_remove_head_middle_tail() -> None:
    blocks, queue = make_queue(5)
    queue.remove(blocks[0])
    queue.remove(blocks[2])
    queue.remove(blocks[4])
    assert ids(queue) == [1, 3]
    check_links(queue, blocks)


def test_remove_a_block_not_queued_raises() -> None:
    blocks, queue = make_queue(3)
    queue.remove(blocks[1])
    with pytest.raises(BlockStateError) as err:
        queue.remove(blocks[1])
    assert isinstance(err.value, KvspecError) and isinstance(err.value, RuntimeError)
    assert ids(queue) == [0, 2]


def test_appending_a_queued_block_raises() -> None:
    blocks, queue = make_queue(3)
    with pytest.raises(BlockStateError):
        queue.append(blocks[1])
    with pytest.raises(BlockStateError):
        queue.append_n([blocks[2]])
    with pytest.raises(BlockStateError):
        queue.prepend_n([blocks[0]])
    popped = queue.popleft()
    with pytest.raises(BlockStateError):
        queue.append_n([popped, popped])
    assert ids(queue) == [1, 2]
    check_links(queue, blocks)


def test_prepend_and_append_n_keep_order() -> None:
    blocks, queue = make_queue(6)
    a, b, c = queue.popleft_n(3)
    queue.append_n([c, a])
    queue.prepend_n([b])
    assert ids(queue) == [1, 3, 4, 5, 2, 0]
    check_links(queue, blocks)


def test_prepend_n_into_empty_queue() -> None:
    blocks, queue = make_queue(2)
    popped = queue.popleft_n(2)
    queue.prepend_n(popped[::-1])
    assert ids(queue) == [1, 0]
    check_links(queue, blocks)


def test_iter_blocks_after() -> None:
    blocks, queue = make_queue(5)
    assert ids(queue.iter_blocks_after(None)) == [0, 1, 2, 3, 4]
    assert ids(queue.iter_blocks_after(blocks[2])) == [3, 4]
    assert ids(queue.iter_blocks_after(blocks[4])) == []
    queue.remove(blocks[3])
    assert ids(queue.iter_blocks_after(blocks[3])) == []  # not queued: nothing after it


def test_reference_name_is_the_same_class() -> None:
    assert FreeKVCacheBlockQueue is FreeBlockQueue


class FreeQueueMachine(RuleBasedStateMachine):
    """FreeBlockQueue against a Python list of block ids."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks: list[Block] = []
        self.queue = FreeBlockQueue([])
        self.model: list[int] = []

    @initialize(n=st.integers(0, 12))
    def setup(self, n: int) -> None:
        self.blocks, self.queue = make_queue(n)
        self.model = list(range(n))

    def outside(self) -> list[int]:
        queued = set(self.model)
        return [b.block_id for b in self.blocks if b.block_id not in queued]

    @rule()
    def popleft(self) -> None:
        if not self.model:
            with pytest.raises(NotEnoughFreeBlocksError):
                self.queue.popleft()
            return
        assert self.queue.popleft().block_id == self.model.pop(0)

    @rule(n=st.integers(0, 14))
    def popleft_n(self, n: int) -> None:
        if n > len(self.model):
            with pytest.raises(NotEnoughFreeBlocksError):
                self.queue.popleft_n(n)
            return
        assert ids(self.queue.popleft_n(n)) == self.model[:n]
        del self.model[:n]

    @rule(data=st.data())
    def remove(self, data) -> None:
        if not self.model:
            return
        block_id = data.draw(st.sampled_from(self.model))
        self.queue.remove(self.blocks[block_id])
        self.model.remove(block_id)

    @rule(data=st.data())
    def append(self, data) -> None:
        if not self.outside():
            return
        block_id = data.draw(st.sampled_from(self.outside()))
        self.queue.append(self.blocks[block_id])
        self.model.append(block_id)

    @rule(data=st.data(), front=st.booleans())
    def add_many(self, data, front: bool) -> None:
        chosen = data.draw(st.permutations(self.outside())) if self.outside() else []
        chosen = chosen[: data.draw(st.integers(0, len(chosen)))]
        picked = [self.blocks[i] for i in chosen]
        if front:
            self.queue.prepend_n(picked)
            self.model[:0] = chosen
        else:
            self.queue.append_n(picked)
            self.model.extend(chosen)

    @rule(data=st.data())
    def iterate_after(self, data) -> None:
        if not self.model:
            assert ids(self.queue.iter_blocks_after(None)) == []
            return
        pos = data.draw(st.integers(0, len(self.model) - 1))
        cursor = self.blocks[self.model[pos]]
        assert ids(self.queue.iter_blocks_after(cursor)) == self.model[pos + 1 :]

    @invariant()
    def matches_model(self) -> None:
        assert ids(self.queue.get_all_free_blocks()) == self.model
        assert self.queue.num_free_blocks == len(self.model)
        check_links(self.queue, self.blocks)


FreeQueueMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None
)
TestFreeQueue = FreeQueueMachine.TestCase


# --------------------------------------------------------------------------
# Block pool
# --------------------------------------------------------------------------


def test_pool_reserves_the_null_block() -> None:
    pool = BlockPool(5)
    assert pool.null_block is pool.blocks[0]
    assert pool.null_block.is_null
    assert ids(pool.free_block_queue) == [1, 2, 3, 4]
    assert pool.num_free_blocks == 4
    assert pool.usage == 0.0
    assert all(b.block_id != 0 for b in pool.allocate(4))
    assert pool.usage == 1.0


def test_pool_needs_a_block() -> None:
    with pytest.raises(BlockPoolError):
        BlockPool(0)
    assert BlockPool(1).num_free_blocks == 0


def test_allocating_more_than_free_raises_and_changes_nothing() -> None:
    pool = BlockPool(4)
    pool.allocate(2)
    with pytest.raises(NotEnoughFreeBlocksError) as err:
        pool.allocate(2)
    assert isinstance(err.value, KvspecError)
    assert err.value.message == "cannot allocate 2 blocks: 1 free"
    assert pool.num_free_blocks == 1
    with pytest.raises(BlockPoolError):
        pool.allocate(-1)
    assert pool.allocate(0) == []


def test_double_free_raises_and_changes_nothing() -> None:
    pool = BlockPool(6)
    a = pool.allocate(2)
    b = pool.allocate(1)
    pool.free(a)
    before = ids(pool.free_block_queue)
    with pytest.raises(BlockStateError) as err:
        pool.free(b + a)  # b is held, a is not: nothing may change
    assert isinstance(err.value, KvspecError)
    assert b[0].ref_count == 1
    assert ids(pool.free_block_queue) == before
    with pytest.raises(BlockStateError):
        pool.free([b[0], b[0]])
    assert b[0].ref_count == 1


def test_blocks_of_another_pool_are_refused() -> None:
    pool, other = BlockPool(4), BlockPool(4)
    foreign = other.allocate(1)
    with pytest.raises(BlockStateError):
        pool.free(foreign)
    with pytest.raises(BlockStateError):
        pool.touch(foreign)
    with pytest.raises(BlockStateError):
        pool.free([Block(99)])


def test_request_frees_in_reverse_so_chain_tails_are_evicted_first() -> None:
    pool = BlockPool(10)
    req_a = pool.allocate(3)  # 1, 2, 3
    req_b = pool.allocate(2)  # 4, 5
    pool.free_request(req_a)
    pool.free_request(req_b)
    assert ids(pool.free_block_queue) == [6, 7, 8, 9, 3, 2, 1, 5, 4]
    # Allocation takes the never-used blocks first, then the least recently freed.
    assert ids(pool.allocate(6)) == [6, 7, 8, 9, 3, 2]


def test_free_keeps_held_blocks_out_of_the_queue() -> None:
    pool = BlockPool(4)
    (block,) = pool.allocate(1)
    pool.touch([block])
    assert block.ref_count == 2
    pool.free([block])
    assert block.ref_count == 1 and ids(pool.free_block_queue) == [2, 3]
    pool.free([block])
    assert ids(pool.free_block_queue) == [2, 3, 1]


def test_cache_hit_on_a_free_block_takes_it_off_the_queue() -> None:
    pool = BlockPool(6, hash_block_size=4)
    blocks = pool.allocate(2, group_id=0)
    pool.cache_full_blocks(blocks, [b"h0", b"h1"], 0, 2, group_id=0)
    assert blocks[1].block_hash == make_block_hash_with_group_id(b"h1", 0)
    assert blocks[1].block_hash_num_tokens == 8
    pool.free_request(blocks)
    assert ids(pool.free_block_queue) == [3, 4, 5, 2, 1]
    hits = pool.find_cached_prefix([b"h0", b"h1", b"h2"], group_id=0)
    assert hits == blocks
    pool.touch(hits, group_id=0)
    assert ids(pool.free_block_queue) == [3, 4, 5]
    assert [b.ref_count for b in blocks] == [1, 1]


def test_reusing_a_cached_block_evicts_its_hash() -> None:
    pool = BlockPool(3)
    blocks = pool.allocate(2)
    pool.cache_full_blocks(blocks, [b"h0", b"h1"], 0, 2, group_id=0)
    pool.free_request(blocks)  # queue: 2, 1
    (reused,) = pool.allocate(1, group_id=0)
    assert reused.block_id == 2 and reused.block_hash is None
    assert pool.lookup(b"h1", [0]) is None
    assert pool.lookup(b"h0", [0]) == [blocks[0]]
    assert pool.num_cached_blocks == 1


def test_a_hash_lookup_is_per_group() -> None:
    pool = BlockPool(6, num_groups=2)
    g0 = pool.allocate(1, group_id=0)
    g1 = pool.allocate(1, group_id=1)
    pool.cache_full_blocks(g0, [b"same"], 0, 1, group_id=0)
    pool.cache_full_blocks(g1, [b"same"], 0, 1, group_id=1)
    assert pool.lookup(b"same", [0, 1]) == [g0[0], g1[0]]
    assert pool.lookup(b"same", [1]) == g1
    assert pool.find_cached_prefix([b"same"], group_id=1) == g1


def test_a_block_belongs_to_one_group_at_a_time() -> None:
    pool = BlockPool(4, num_groups=2)
    (block,) = pool.allocate(1, group_id=0)
    assert block.group_id == 0
    with pytest.raises(BlockStateError):
        pool.touch([block], group_id=1)
    assert block.ref_count == 1
    with pytest.raises(BlockStateError):
        pool.cache_full_blocks([block], [b"h"], 0, 1, group_id=1)
    pool.free([block])
    assert block.group_id is None  # free and uncached: nobody's
    others = pool.allocate(3, group_id=1)
    assert block in others and block.group_id == 1


def test_group_ids_are_checked() -> None:
    pool = BlockPool(4, num_groups=2)
    with pytest.raises(BlockPoolError):
        pool.allocate(1, group_id=2)
    with pytest.raises(BlockPoolError):
        pool.allocate(1, group_id=-1)


def test_touching_an_uncached_free_block_raises() -> None:
    pool = BlockPool(4)
    with pytest.raises(BlockStateError):
        pool.touch([pool.blocks[2]])


def test_null_block_is_never_counted_queued_or_cached() -> None:
    pool = BlockPool(4, hash_block_size=4)
    blocks = [pool.null_block, *pool.allocate(1)]
    pool.touch([pool.null_block])
    pool.cache_full_blocks(blocks, [b"a", b"b"], 0, 2, group_id=0)
    assert pool.null_block.block_hash is None
    pool.free_request(blocks)
    pool.free([pool.null_block, pool.null_block])
    assert pool.null_block.ref_count == 0
    assert pool.null_block not in pool.free_block_queue.get_all_free_blocks()


def test_same_content_cached_in_two_blocks() -> None:
    pool = BlockPool(5)
    a = pool.allocate(1)
    b = pool.allocate(1)
    pool.cache_full_blocks(a, [b"h"], 0, 1, group_id=0)
    pool.cache_full_blocks(b, [b"h"], 0, 1, group_id=0)
    assert pool.num_cached_blocks == 2
    assert pool.lookup(b"h", [0])[0] in (a[0], b[0])
    assert pool.evict([a[0].block_id]) == [a[0].block_id]
    assert pool.lookup(b"h", [0]) == b
    assert pool.evict([a[0].block_id]) == []


def test_caching_a_block_twice_raises() -> None:
    pool = BlockPool(4)
    blocks = pool.allocate(1)
    pool.cache_full_blocks(blocks, [b"h"], 0, 1, group_id=0)
    with pytest.raises(BlockStateError):
        pool.cache_full_blocks(blocks, [b"h"], 0, 1, group_id=0)
    with pytest.raises(BlockPoolError):
        pool.cache_full_blocks(pool.allocate(1), [], 0, 1, group_id=0)


def test_cache_full_blocks_of_a_coarser_group_reads_the_coarse_hashes() -> None:
    pool = BlockPool(6, hash_block_size=16)
    blocks = pool.allocate(2, group_id=0)
    fine = [b"A", b"B", b"C", b"D", b"E"]
    pool.cache_full_blocks(blocks, fine, 0, 2, group_id=0, block_size=32)
    assert [get_block_hash(b.block_hash) for b in blocks] == [b"B", b"D"]
    assert [b.block_hash_num_tokens for b in blocks] == [32, 64]


def test_evict_keeps_held_blocks_held() -> None:
    pool = BlockPool(4)
    blocks = pool.allocate(2)
    pool.cache_full_blocks(blocks, [b"a", b"b"], 0, 2, group_id=0)
    assert pool.evict([1]) == [1]
    assert blocks[0].ref_count == 1 and blocks[0].group_id == 0 and blocks[0].block_hash is None
    pool.free_request(blocks)
    assert pool.evict([2]) == [2]
    assert blocks[1].group_id is None


def test_reset_prefix_cache_only_when_nothing_is_held() -> None:
    pool = BlockPool(4)
    blocks = pool.allocate(2)
    pool.cache_full_blocks(blocks, [b"a", b"b"], 0, 2, group_id=0)
    assert pool.reset_prefix_cache() is False
    pool.free_request(blocks)
    assert pool.reset_prefix_cache() is True
    assert pool.num_cached_blocks == 0
    assert all(b.block_hash is None and b.group_id is None for b in pool.blocks)


def test_caching_disabled_never_hits() -> None:
    pool = BlockPool(4, enable_caching=False)
    blocks = pool.allocate(2)
    pool.cache_full_blocks(blocks, [b"a", b"b"], 0, 2, group_id=0)
    assert pool.lookup(b"a", [0]) is None
    assert pool.find_cached_prefix([b"a"], 0) == []


def test_a_block_listed_twice_is_cached_once() -> None:
    pool = BlockPool(4)
    (block,) = pool.allocate(1)
    with pytest.raises(BlockStateError, match="already has a hash"):
        pool.cache_full_blocks([block, block], [b"a", b"b"], 0, 2, group_id=0)
    assert block.block_hash == make_block_hash_with_group_id(b"a", 0)
    assert pool.lookup(b"a", [0]) == [block] and pool.lookup(b"b", [0]) is None


def test_a_refused_free_in_mid_batch_restores_counts_and_links() -> None:
    pool = BlockPool(6)
    a, b, c = pool.allocate(3)
    pool.touch([b])  # b is held twice
    before = ids(pool.free_block_queue)
    for batch in ([a, b, c, a], [c, b, pool.null_block, a, c], [a, Block(9)]):
        with pytest.raises(BlockStateError):
            pool.free(batch)
        assert ids(pool.free_block_queue) == before
        assert [a.ref_count, b.ref_count, c.ref_count] == [1, 2, 1]
        assert [a.group_id, b.group_id, c.group_id] == [0, 0, 0]
        check_links(pool.free_block_queue, list(pool.blocks))
    pool.free_request((a, b, c))  # any sequence; b stays held
    assert ids(pool.free_block_queue) == [*before, 3, 1]
    pool.free(x for x in [b])  # any iterable
    assert ids(pool.free_block_queue)[-1] == 2 and pool.num_free_blocks == 5


def test_private_keys_stay_on_their_blocks() -> None:
    pool = BlockPool(5, private_keys=True)
    blocks = pool.allocate(3)
    pool.cache_run(blocks[:2], [-7, 5], 0, 16, 16)
    pool.cache_block(blocks[2], -9, 0, 48)
    assert pool.cached_map(0) == {5: blocks[1]}  # the shared key alone is in the map
    assert pool.lookup(-7, [0]) is None and pool.num_cached_blocks == 3
    pool.free_blocks(blocks[::-1])
    assert [b.block_id for b in pool.free_block_queue] == [4, 3, 2, 1]
    assert pool.evict([3]) == [3] and blocks[2]._hash is None
    taken = pool.allocate(4)  # evicts the rest: the private key from its block alone
    assert [b._hash for b in taken] == [None] * 4 and pool.cached_map(0) == {}
    assert pool.num_cached_blocks == 0


def test_touching_one_block_or_many_is_the_same() -> None:
    def cycle(touch_one_at_a_time: bool) -> list:
        pool = BlockPool(8, num_groups=2)
        blocks = pool.allocate(4, group_id=1)
        pool.cache_full_blocks(blocks, [b"a", b"b", b"c", b"d"], 0, 3, group_id=1)
        pool.free_request(blocks[2:])  # c cached and free, d free and uncached
        hits = [blocks[0], blocks[2], pool.null_block]
        if touch_one_at_a_time:
            for block in hits:
                pool.touch([block], group_id=1)
        else:
            pool.touch(hits, group_id=1)
        for bad in ([blocks[3]], [blocks[0]], [BlockPool(2).blocks[1]]):
            with pytest.raises(BlockStateError):
                pool.touch(bad, group_id=0 if bad == [blocks[0]] else None)
        check_links(pool.free_block_queue, list(pool.blocks))
        return [ids(pool.free_block_queue), pool.num_free_blocks,
                [(b.ref_count, b.group_id, b.block_hash) for b in pool.blocks]]

    assert cycle(True) == cycle(False)


def test_a_block_reads_its_group_from_its_key() -> None:
    block = Block(5)
    block.set_block_hash(make_block_hash_with_group_id(b"h", 7), 32)
    assert (block.group_id, block.block_hash_num_tokens) == (7, 32)
    assert get_block_hash(block.block_hash) == b"h"
    with pytest.raises(BlockStateError):
        block.set_block_hash(make_block_hash_with_group_id(b"h", 7))
    with pytest.raises(BlockStateError):
        Block(6).set_block_hash(b"\x00\x01")  # no room for a hash and a group id


def test_the_queue_module_is_re_exported() -> None:
    from kvspec.runtime import block_pool_queue

    for name in block_pool_queue.__all__:
        assert getattr(block_pool_module, name) is getattr(block_pool_queue, name), name
    assert set(block_pool_module.__all__) >= set(block_pool_queue.__all__)


def test_the_benchmark_runs_without_vllm() -> None:
    """A smoke run of benchmarks/bench_block_pool.py at a tiny size (no timings checked)."""
    repo = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "benchmarks/bench_block_pool.py", "--num-blocks", "65",
         "--touch-blocks", "33", "--repeat", "1", "--vllm", "off"],
        cwd=repo, capture_output=True, text=True, check=True,
    ).stdout
    for operation in ("allocate", "free", "evict", "hash lookup", "cache hit on a free block"):
        assert operation in out
    assert "vLLM comparison skipped" in out


GROUPS = 3
POOL_BLOCKS = 12


class BlockPoolMachine(RuleBasedStateMachine):
    """The engine's cycle on one pool shared by several groups.

    A request of group g with content c: find the cached prefix of its block
    hashes in g, touch the hits, allocate the rest, cache every full block;
    later free it, last block first. A list model predicts the free queue.
    """

    requests = Bundle("requests")

    def __init__(self) -> None:
        super().__init__()
        self.pool = BlockPool(POOL_BLOCKS, hash_block_size=4, num_groups=GROUPS)
        self.model = list(range(1, POOL_BLOCKS))
        self.live: dict[int, tuple[int, list[Block]]] = {}
        self.next_id = 0

    @rule(
        target=requests,
        group=st.integers(0, GROUPS - 1),
        content=st.lists(st.integers(0, 1), min_size=1, max_size=5),
    )
    def start_request(self, group: int, content: list[int]):
        hashes = [bytes(content[: i + 1]) for i in range(len(content))]
        hits = self.pool.find_cached_prefix(hashes, group)
        for i, block in enumerate(hits):
            assert block.block_hash == make_block_hash_with_group_id(hashes[i], group)
            assert block.group_id == group
        need = len(content) - len(hits)
        free_after_hits = len(self.model) - sum(1 for b in hits if b.ref_count == 0)
        if need > free_after_hits:  # the engine would not schedule it
            if need > self.pool.num_free_blocks:
                with pytest.raises(NotEnoughFreeBlocksError):
                    self.pool.allocate(need, group)
            return None
        self.pool.touch(hits, group)
        for block in hits:
            if block.block_id in self.model:
                self.model.remove(block.block_id)
        new = self.pool.allocate(need, group)
        assert ids(new) == self.model[:need]
        del self.model[:need]
        assert all(b.block_hash is None and b.ref_count == 1 for b in new)
        blocks = hits + new
        self.pool.cache_full_blocks(blocks, hashes, len(hits), len(blocks), group)
        self.next_id += 1
        self.live[self.next_id] = (group, blocks)
        return self.next_id

    @rule(request=consumes(requests))
    def finish_request(self, request) -> None:
        if request is None:
            return
        _, blocks = self.live.pop(request)
        self.pool.free_request(blocks)
        for block in reversed(blocks):
            if block.ref_count == 0:
                self.model.append(block.block_id)

    @rule(data=st.data())
    def freeing_an_unheld_block_is_refused(self, data) -> None:
        unheld = [b for b in self.pool.blocks if b.ref_count == 0 and not b.is_null]
        if not unheld:
            return
        held = [b for _, blocks in self.live.values() for b in blocks]
        batch = held[:1] + [data.draw(st.sampled_from(unheld))]
        with pytest.raises(BlockStateError):
            self.pool.free(batch)  # the held block's count must be restored

    @rule(block_ids=st.lists(st.integers(1, POOL_BLOCKS - 1), max_size=3))
    def evict(self, block_ids: list[int]) -> None:
        self.pool.evict(block_ids)
        for block_id in block_ids:
            assert self.pool.blocks[block_id].block_hash is None

    @precondition(lambda self: not self.live)
    @rule()
    def reset(self) -> None:
        assert self.pool.reset_prefix_cache()

    @invariant()
    def free_queue_matches_model(self) -> None:
        assert ids(self.pool.free_block_queue) == self.model
        assert self.pool.num_free_blocks == len(self.model)

    @invariant()
    def free_queue_is_exactly_the_unheld_blocks(self) -> None:
        unheld = sorted(b.block_id for b in self.pool.blocks if b.ref_count == 0 and not b.is_null)
        assert sorted(self.model) == unheld
        check_links(self.pool.free_block_queue, list(self.pool.blocks))

    @invariant()
    def ref_counts_count_live_requests(self) -> None:
        holders: dict[int, int] = {}
        for _, blocks in self.live.values():
            for block in blocks:
                holders[block.block_id] = holders.get(block.block_id, 0) + 1
        for block in self.pool.blocks:
            assert block.ref_count >= 0
            if not block.is_null:
                assert block.ref_count == holders.get(block.block_id, 0)

    @invariant()
    def a_block_is_held_by_one_group(self) -> None:
        owner: dict[int, int] = {}
        for group, blocks in self.live.values():
            for block in blocks:
                assert owner.setdefault(block.block_id, group) == group
                assert block.group_id == group

    @invariant()
    def cached_hashes_are_consistent(self) -> None:
        pool = self.pool
        count = 0
        for block in pool.blocks:
            if block.block_hash is None:
                if block.ref_count == 0 and not block.is_null:
                    assert block.group_id is None
                continue
            count += 1
            block_hash, group = split_block_hash_with_group_id(block.block_hash)
            assert group == block.group_id
            entry = pool._cached[group][block_hash]
            assert entry is block if isinstance(entry, Block) else entry[block.block_id] is block
            assert pool.lookup(block_hash, [group]) is not None
        assert pool.num_cached_blocks == count


BlockPoolMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=50, deadline=None
)
TestBlockPool = BlockPoolMachine.TestCase


# --------------------------------------------------------------------------
# (hash, group id) keys
# --------------------------------------------------------------------------


@given(block_hash=st.binary(min_size=1, max_size=40), group_id=st.integers(0, 2**32 - 1))
def test_group_key_round_trips(block_hash: bytes, group_id: int) -> None:
    key = make_block_hash_with_group_id(block_hash, group_id)
    assert key == block_hash + group_id.to_bytes(4, "big")
    assert get_block_hash(key) == block_hash
    assert get_group_id(key) == group_id
    assert split_block_hash_with_group_id(key) == (block_hash, group_id)


def test_group_key_rejects_ids_that_do_not_fit() -> None:
    for bad in (-1, 2**32):
        with pytest.raises(HashingError):
            make_block_hash_with_group_id(b"h", bad)


# --------------------------------------------------------------------------
# Coarser-group views
# --------------------------------------------------------------------------


@given(
    hashes=st.lists(st.binary(min_size=1, max_size=4), max_size=30),
    scale=st.integers(1, 5),
    hash_block_size=st.sampled_from([1, 4, 16]),
)
def test_coarse_view_takes_the_last_fine_hash_of_each_coarse_block(
    hashes: list[bytes], scale: int, hash_block_size: int
) -> None:
    view = BlockHashListWithBlockSize(hashes, hash_block_size, hash_block_size * scale)
    expected = [hashes[i + scale - 1] for i in range(0, len(hashes) - scale + 1, scale)]
    assert len(view) == len(expected)
    assert list(view) == expected
    assert [view[i] for i in range(len(view))] == expected
    assert [view[i] for i in range(-len(view), 0)] == expected
    assert view[1:] == expected[1:] and view[::-1] == expected[::-1]
    with pytest.raises(IndexError):
        view[len(view)]


def test_coarse_view_of_the_reference_example() -> None:
    view = BlockHashListWithBlockSize([b"A", b"B", b"C", b"D"], 16, 32)
    assert list(view) == [b"B", b"D"]
    with pytest.raises(HashingError):
        BlockHashListWithBlockSize([b"A"], 16, 24)
    with pytest.raises(TypeError):
        view["0"]  # type: ignore[index]


def test_resolve_block_hashes() -> None:
    hashes = [b"A", b"B", b"C", b"D"]
    assert resolve_block_hashes(hashes, 16, 16) is hashes
    view = resolve_block_hashes(hashes, 16, 64)
    assert isinstance(view, BlockHashListWithBlockSize) and list(view) == [b"D"]
    assert resolve_block_hashes(view, 16, 64) is view
    with pytest.raises(HashingError):
        resolve_block_hashes(view, 16, 32)
    fine = dict(supports_fine_grained_hash_lookup=True, alignment_tokens=16)
    assert resolve_block_hashes(hashes, 16, 64, **fine) is hashes
    # Alignment that does not divide the block size, or is not finer: a view.
    assert isinstance(
        resolve_block_hashes(
            hashes, 16, 64, supports_fine_grained_hash_lookup=True, alignment_tokens=24
        ),
        BlockHashListWithBlockSize,
    )
    assert isinstance(
        resolve_block_hashes(
            hashes, 16, 64, supports_fine_grained_hash_lookup=True, alignment_tokens=64
        ),
        BlockHashListWithBlockSize,
    )
    assert isinstance(
        resolve_block_hashes(hashes, 16, 64, alignment_tokens=16), BlockHashListWithBlockSize
    )
    with pytest.raises(HashingError):
        resolve_block_hashes(hashes, 16, 40)


@pytest.mark.parametrize("num_own", [1, 3, 5])
def test_allocate_with_own_keys_is_allocate_then_cache_run(num_own: int) -> None:
    """Blocks taken cached under private keys end as taking them, then caching them,
    would leave them: the same blocks, hashes, prefixes, groups and evictions."""
    def pool_after_a_round() -> BlockPool:
        pool = BlockPool(9, private_keys=True)
        blocks = pool.allocate(6)
        pool.cache_run(blocks[:2], [b"a", b"b"], 0, 16, 16)
        pool.cache_run(blocks[2:5], [-30, -29, -28], 0, 48, 16)
        pool.free_request(blocks)
        return pool

    def state(pool: BlockPool, taken: list) -> Any:
        return ([(b.block_id, b._hash, b.block_hash_num_tokens, b.group_id, b.ref_count)
                 for b in pool.blocks], [b.block_id for b in taken],
                [b.block_id for b in pool.free_block_queue],
                {g: {k: v.block_id for k, v in m.items()} for g, m in pool._cached.items()})

    fused = pool_after_a_round()
    taken = fused.allocate(7, 0, num_own, -10, 32, 16)  # evicts b"b" too
    plain = pool_after_a_round()
    blocks = plain.allocate(7)
    plain.cache_run(blocks[:num_own], list(range(-10, -10 + num_own)), 0, 32, 16)
    assert state(fused, taken) == state(plain, blocks)
