"""The block pool a serving process hands KV-cache blocks out of.

Behaviour follows the reference planner's block metadata and free-block queue
(``KVCacheBlock``, ``FreeKVCacheBlockQueue``) and the engine's block pool:

- Block 0 is the *null block*: taken off the free queue when the pool is made,
  never cached, never counted, handed to groups as a placeholder.
- Free blocks wait in a doubly linked queue in eviction order: the least
  recently used block at the head. A request frees its blocks in reverse, so
  the tail of its chain (the longest prefix, least likely to be shared) is
  evicted first.
- A freed block keeps its hash and stays findable by prefix-cache lookup until
  it is allocated again; only then is its hash dropped (evicted).
- One pool serves every KV-cache group whose layers alias the same bytes, so a
  block belongs to one group at a time: allocation gives it to a group, a cache
  hit can only be taken by the group that cached it.

>>> pool = BlockPool(8, hash_block_size=16)
>>> blocks = pool.allocate(3, group_id=0)
>>> [b.block_id for b in blocks], pool.num_free_blocks
([1, 2, 3], 4)
>>> pool.cache_full_blocks(blocks, [b"h1", b"h2"], 0, 2, group_id=0)
>>> pool.free_request(blocks)
>>> [b.block_id for b in pool.free_block_queue]
[4, 5, 6, 7, 3, 2, 1]
>>> [b.block_id for b in pool.find_cached_prefix([b"h1", b"h2", b"h3"], group_id=0)]
[1, 2]

The pieces live in ``block_pool_block`` (:class:`Block`, the errors),
``block_pool_queue`` (:class:`FreeBlockQueue`) and ``block_pool_cache`` (the
prefix-cache half of :class:`BlockPool`); every name is importable from here.

Allocation, freeing and cache hits run once per request block, so they are
written as one pass over the request's blocks, editing the queue's links in
place, with the checks that fail folded into one branch (see
``benchmarks/bench_block_pool.py``). This module does not import torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from operator import length_hint
from typing import Any

from kvspec.runtime.block_pool_block import (
    Block,
    BlockPoolError,
    BlockStateError,
    KVCacheBlock,
    NotEnoughFreeBlocksError,
)
from kvspec.runtime.block_pool_cache import GROUP_ID_LIMIT, PrefixCachePool
from kvspec.runtime.block_pool_queue import FreeBlockQueue, FreeKVCacheBlockQueue

__all__ = [
    "Block",
    "BlockPool",
    "BlockPoolError",
    "BlockStateError",
    "FreeBlockQueue",
    "FreeKVCacheBlockQueue",
    "KVCacheBlock",
    "NotEnoughFreeBlocksError",
]

#: Hints of the block-state errors.
_OURS = "pass blocks this pool handed out (get_new_blocks, get_cached_block)"
_STATE = ("the pool's blocks were changed outside its methods; change them only "
          "through the pool")


class BlockPool(PrefixCachePool):
    """Blocks ``0 .. num_blocks - 1`` of one pool, shared by the groups aliasing it.

    ``hash_block_size`` is the token count the request block hashes were
    computed at (hashes of coarser groups are read through
    :class:`~kvspec.runtime.hashing.BlockHashListWithBlockSize`); ``num_groups``,
    when given, bounds the group ids. With ``enable_caching=False`` nothing is
    ever cached and lookups always miss.

    >>> pool = BlockPool(4)
    >>> pool.null_block.block_id, pool.num_free_blocks, pool.usage
    (0, 3, 0.0)
    >>> a = pool.allocate(2, group_id=0)
    >>> try:
    ...     pool.allocate(2, group_id=1)
    ... except NotEnoughFreeBlocksError as err:
    ...     print(err.message)
    cannot allocate 2 blocks: 1 free
    """

    __slots__ = ("num_blocks", "blocks", "free_block_queue", "null_block")

    def __init__(
        self,
        num_blocks: int,
        *,
        enable_caching: bool = True,
        hash_block_size: int | None = None,
        num_groups: int | None = None,
    ) -> None:
        if not isinstance(num_blocks, int) or num_blocks < 1:
            raise BlockPoolError(
                "a block pool needs at least one block (the null block)",
                expected=">= 1",
                found=repr(num_blocks),
                hint="give the loaded cache's num_blocks (LoadedCache.block_pool has it)",
            )
        self._init_cache(enable_caching, hash_block_size, num_groups)
        self.num_blocks = num_blocks
        self.blocks: tuple[Block, ...] = tuple(map(Block, range(num_blocks)))
        for block in self.blocks:
            block.pool = self
        self.free_block_queue = FreeBlockQueue(self.blocks)
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True

    # -- queries ----------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be allocated now (cached free blocks included)."""
        return self.free_block_queue.num_free_blocks

    @property
    def usage(self) -> float:
        """Fraction of the usable blocks (all but the null block) held now."""
        usable = self.num_blocks - 1
        return 0.0 if usable == 0 else 1.0 - self.num_free_blocks / usable

    # -- allocation -------------------------------------------------------

    def allocate(self, num_blocks: int, group_id: int = 0) -> list[Block]:
        """Take ``num_blocks`` blocks from the head of the free queue for ``group_id``.

        A taken block that was still cached loses its hash (it is evicted).
        Each comes back with ``ref_count == 1``.

        >>> pool = BlockPool(4)
        >>> [(b.block_id, b.ref_count, b.group_id) for b in pool.allocate(2, group_id=1)]
        [(1, 1, 1), (2, 1, 1)]
        """
        if group_id.__class__ is not int or not 0 <= group_id < (self.num_groups or GROUP_ID_LIMIT):
            self._check_group(group_id)
        queue = self.free_block_queue
        num_free = queue.num_free_blocks
        if not 0 < num_blocks <= num_free:
            return _refuse_allocate(num_blocks, num_free)
        cached = self._cached
        head = queue._head
        block: Any = head.next_free  # Any: a queued block's links are never None
        taken: list[Block] = []
        for _ in range(num_blocks):  # popleft_n, evicting and handing out as it goes
            taken.append(block)
            following = block.next_free
            block.prev_free = block.next_free = None
            if block._hash is not None:  # a cached block is reused: evict its hash
                try:
                    group_map = cached[block._group]
                    entry = group_map[block._hash]
                except KeyError:  # not in the map: nothing to drop there
                    entry = None
                if entry is block:
                    del group_map[block._hash]
                elif entry is not None:  # one of several blocks of the same content
                    self._uncache(block)
                block._hash = block._block_hash_num_tokens = None
            block.ref_count = 1
            block._group = group_id
            block = following
        head.next_free = block
        block.prev_free = head
        queue.num_free_blocks = num_free - num_blocks
        return taken

    def touch(self, blocks: Iterable[Block], group_id: int | None = None) -> None:
        """Take a hold on cache-hit blocks: a free one leaves the free queue.

        Every block must be held or cached by ``group_id`` (when given, else by
        its own group); the null block is passed over. Nothing changes if any
        block is refused.

        >>> pool = BlockPool(4)
        >>> blocks = pool.allocate(1, group_id=0)
        >>> pool.cache_full_blocks(blocks, [b"h"], 0, 1, group_id=0)
        >>> pool.free(blocks); pool.num_free_blocks
        3
        >>> pool.touch(pool.lookup(b"h", [0]), group_id=0)
        >>> pool.num_free_blocks, blocks[0].ref_count
        (2, 1)
        """
        if blocks.__class__ is list and len(blocks) == 1:  # one hit: check and take at once
            block = blocks[0]
            if block.pool is self and (group_id is None or block._group == group_id):
                ref = block.ref_count
                if ref > 0:  # held: one more holder
                    block.ref_count = ref + 1
                    return
                prev, after = block.prev_free, block.next_free
                if block._hash is not None and prev is not None and after is not None:
                    prev.next_free = after  # free and cached: unlink it from the queue
                    after.prev_free = prev
                    block.prev_free = block.next_free = None
                    block.ref_count = 1
                    self.free_block_queue.num_free_blocks -= 1
                    return
        if blocks.__class__ is not list:
            blocks = list(blocks)
        self._touch_all(blocks, group_id)

    def free(self, blocks: Iterable[Block]) -> None:
        """Drop one hold on each block, in order; blocks no longer held go to the
        tail of the free queue in that order. Cached blocks keep their hash.

        The null block is passed over. Freeing a block that is not held raises
        :class:`BlockStateError` and changes nothing.

        >>> pool = BlockPool(4)
        >>> a, b = pool.allocate(2)
        >>> pool.free([b, a]); [x.block_id for x in pool.free_block_queue]
        [3, 2, 1]
        >>> try:
        ...     pool.free([a])
        ... except BlockStateError as err:
        ...     print(err.message)
        block 1 is freed but not held (freed twice?)
        """
        self._release(blocks if blocks.__class__ is list else list(blocks))

    def free_blocks(self, ordered: Iterable[Block]) -> None:
        """Drop one hold on each block, as vLLM 0.33's ``BlockPool.free_blocks``:
        released blocks without a cached hash (all of them with caching off) go to
        the *head* of the free queue, to be reused first; cached ones to its tail, to
        be evicted last; each kind keeps the given order. Null blocks are passed over.

        >>> pool = BlockPool(5)
        >>> a, b, c = pool.allocate(3)
        >>> pool.cache_block(b, b"h", 0, 16)
        >>> pool.free_blocks([c, b, a]); [x.block_id for x in pool.free_block_queue]
        [3, 1, 4, 2]
        """
        first: list[Block] = []
        last: list[Block] = []
        caching = self.enable_caching
        blocks = ordered if ordered.__class__ is list else list(ordered)
        for i, block in enumerate(blocks):
            ref = block.ref_count
            if ref <= 0 or block.pool is not self:
                if block.is_null:
                    continue
                for held in blocks[:i]:  # a refusal changes nothing
                    if not held.is_null:
                        held.ref_count += 1
                self._refuse_free([block], 0, self.null_block, self.null_block)
            block.ref_count = ref - 1
            if ref == 1:
                (last if caching and block._hash is not None else first).append(block)
        queue = self.free_block_queue
        if first:
            queue._link(queue._head, first, queue._head.next_free)  # type: ignore[arg-type]
        if last:
            queue._link(queue._tail.prev_free, last, queue._tail)  # type: ignore[arg-type]

    def free_request(self, blocks: Sequence[Block]) -> None:
        """Free a request's blocks, last first, so its chain's tail is evicted first.

        >>> pool = BlockPool(5)
        >>> blocks = pool.allocate(3)
        >>> pool.free_request(blocks); [b.block_id for b in pool.free_block_queue]
        [4, 3, 2, 1]
        """
        cls = blocks.__class__
        ordered = blocks[::-1] if cls is list or cls is tuple else list(reversed(blocks))
        self._release(ordered)  # type: ignore[arg-type]

    # -- internals --------------------------------------------------------

    def _release(self, ordered: list[Block]) -> None:
        """Drop a hold on each of ``ordered``; link the released ones at the tail."""
        queue = self.free_block_queue
        tail = queue._tail
        start: Any = tail.prev_free  # Any: the tail sentinel always has a predecessor
        last = start
        kept = 0  # blocks still held (or the null block): not queued
        blocks = iter(ordered)
        for block in blocks:
            if block.ref_count == 1 and block.pool is self:  # the common case
                block.ref_count = 0
                block.prev_free = last
                last.next_free = block
                last = block
            else:
                ref = block.ref_count
                if ref > 1 and block.pool is self:
                    block.ref_count = ref - 1
                elif block is not self.null_block:
                    done = len(ordered) - length_hint(blocks) - 1
                    self._refuse_free(ordered, done, start, last)
                kept += 1
        last.next_free = tail
        tail.prev_free = last
        queue.num_free_blocks += len(ordered) - kept

    def _refuse_free(self, ordered: list[Block], done: int, start: Block, last: Block) -> None:
        """Undo the first ``done`` releases of ``ordered`` and raise for the next block."""
        if last is not start:  # unlink what was linked after ``start``
            block = start.next_free
            while block is not None:
                following = block.next_free
                block.prev_free = block.next_free = None
                block = following
            start.next_free = self.free_block_queue._tail
        for block in ordered[:done]:
            if block is not self.null_block:
                block.ref_count += 1
        bad = ordered[done]
        if bad.pool is not self:
            raise BlockStateError(f"block {bad.block_id} is not from this pool", hint=_OURS)
        raise BlockStateError(f"block {bad.block_id} is freed but not held (freed twice?)",
                              hint="free a block once for each time it was taken "
                              "(get_new_blocks, touch)")

    def _touch_all(self, blocks: list[Block], group_id: int | None) -> None:
        """:meth:`touch`, any number of blocks: check them all, then take them."""
        for block in blocks:  # a refusal changes nothing
            if (
                block.pool is not self
                or (group_id is not None and block._group != group_id)
                or (block.ref_count <= 0 and block._hash is None)
            ) and not block.is_null:
                self._refuse_touch(block, group_id)
        removed = 0
        for block in blocks:
            ref = block.ref_count
            if ref > 0:
                block.ref_count = ref + 1
            elif not block.is_null:  # a free cached block: unlink it from the queue
                prev, after = block.prev_free, block.next_free
                if prev is None or after is None:
                    self.free_block_queue.num_free_blocks -= removed
                    raise BlockStateError(f"block {block.block_id} is not in the free queue",
                                          hint=_STATE)
                prev.next_free = after
                after.prev_free = prev
                block.prev_free = block.next_free = None
                block.ref_count = 1
                removed += 1
        self.free_block_queue.num_free_blocks -= removed

    def _refuse_touch(self, block: Block, group_id: int | None) -> None:
        if block.pool is not self:
            raise BlockStateError(f"block {block.block_id} is not from this pool", hint=_OURS)
        if block.group_id is None:
            raise BlockStateError(
                f"block {block.block_id} is neither held nor cached: nothing to touch",
                hint="touch blocks that get_cached_block found, or that a request holds",
            )
        raise BlockStateError(
            f"block {block.block_id} belongs to group {block.group_id}",
            expected=f"a block of group {group_id}",
            found=f"group {block.group_id}",
            hint="touch a block under the group it was allocated or cached for",
        )


def _refuse_allocate(num_blocks: int, num_free: int) -> list[Block]:
    """Nothing to take for 0 blocks; otherwise raise why ``num_blocks`` cannot be taken."""
    if num_blocks == 0:
        return []
    if num_blocks < 0:
        raise BlockPoolError("cannot allocate a negative number of blocks", found=str(num_blocks),
                             hint="ask for 0 or more blocks")
    raise NotEnoughFreeBlocksError(
        f"cannot allocate {num_blocks} blocks: {num_free} free",
        expected=f"at most {num_free} blocks",
        found=str(num_blocks),
        hint="free finished requests' blocks, or preempt one",
    )
