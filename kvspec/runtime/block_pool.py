# one idea: the block pool; allocation, freeing and the prefix cache edit the same
# blocks and queue links in the same hot loops, so they stay in one class.
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

A full block of a request is *cached* under the key ``hash + group id`` (see
:func:`~kvspec.runtime.hashing.make_block_hash_with_group_id`), which the
block keeps as its ``block_hash``; a later request of the same group whose
prefix hashes alike finds it and shares it. A cached block stays findable after
it is freed, until the pool hands it out again (it is evicted then) or
:meth:`BlockPool.evict` drops it.

The map is split by group, ``group id -> {hash: block}``, so neither a lookup
nor caching builds the key (a block makes it when asked, from its bare hash and
its group); a hash maps to one block, or to ``{block_id: block}`` when the
same content was cached in several blocks (concurrent requests), as in the
reference's ``BlockHashToBlockMap``.

A pool made with ``private_keys`` keeps *private keys*, ints below zero (a
request-level manager's keys of a request's own tokens, which only that request
ever looks up, through the blocks it held), on their blocks alone: caching and
evicting one costs no map operation, and no lookup of the map finds it.

The blocks and the free queue live in ``block_pool_queue``; every name is
importable from here.

Allocation, freeing and cache hits run once per request block, so they are
written as one pass over the request's blocks, editing the queue's links in
place, with the checks that fail folded into one branch (see
``benchmarks/bench_block_pool.py``). This module does not import torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from operator import length_hint
from typing import Any

from kvspec.runtime.block_pool_queue import (
    Block,
    BlockPoolError,
    BlockStateError,
    FreeBlockQueue,
    FreeKVCacheBlockQueue,
    KVCacheBlock,
    NotEnoughFreeBlocksError,
)
from kvspec.runtime.hashing import (
    BlockHash,
    CacheKey,
    make_block_hash_with_group_id,
    resolve_block_hashes,
)

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

#: Group ids must fit the 4 bytes of a block hash key.
GROUP_ID_LIMIT = 1 << 32

#: One group's map: block hash -> the block cached under it, or {block_id: block}
#: (typed ``Any``: the hot paths tell the two apart by ``entry.__class__ is Block``).
GroupMap = dict[CacheKey, Any]


class BlockPool:
    """Blocks ``0 .. num_blocks - 1`` of one pool, shared by the groups aliasing it.

    ``hash_block_size`` is the token count the request block hashes were
    computed at (hashes of coarser groups are read through
    :class:`~kvspec.runtime.hashing.BlockHashListWithBlockSize`); ``num_groups``,
    when given, bounds the group ids. With ``enable_caching=False`` nothing is
    ever cached and lookups always miss. ``private_keys``: int keys below zero
    stay on their blocks, out of the map (see the module docstring).

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

    __slots__ = ("num_blocks", "blocks", "free_block_queue", "null_block", "enable_caching",
                 "hash_block_size", "num_groups", "private_keys", "_cached")

    def __init__(
        self,
        num_blocks: int,
        *,
        enable_caching: bool = True,
        hash_block_size: int | None = None,
        num_groups: int | None = None,
        private_keys: bool = False,
    ) -> None:
        if not isinstance(num_blocks, int) or num_blocks < 1:
            raise BlockPoolError(
                "a block pool needs at least one block (the null block)",
                expected=">= 1",
                found=repr(num_blocks),
                hint="give the loaded cache's num_blocks (LoadedCache.block_pool has it)",
            )
        if num_groups is not None and num_groups < 1:
            raise BlockPoolError("num_groups must be at least 1", found=repr(num_groups),
                                 hint="one per KV cache group of the layout "
                                 "(len(artifact.layout.groups))")
        self.enable_caching = enable_caching
        self.hash_block_size = hash_block_size
        self.num_groups = num_groups
        self.private_keys = private_keys
        self._cached: dict[int, GroupMap] = {}
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

    # -- prefix cache -----------------------------------------------------

    @property
    def num_cached_blocks(self) -> int:
        """Blocks that hold a cached hash (held or free)."""
        private = sum(1 for b in self.blocks if self._is_private(b._hash))
        return private + sum(
            1 if v.__class__ is Block else len(v)
            for group_map in self._cached.values()
            for v in group_map.values()
        )

    def lookup(self, block_hash: CacheKey, group_ids: Sequence[int]) -> list[Block] | None:
        """The cached block of ``block_hash`` in each of ``group_ids``, or ``None``
        when any of them misses. The blocks are not touched.

        >>> pool = BlockPool(4)
        >>> blocks = pool.allocate(1, group_id=2)
        >>> pool.cache_full_blocks(blocks, [b"h"], 0, 1, group_id=2)
        >>> [b.block_id for b in pool.lookup(b"h", [2])], pool.lookup(b"h", [0])
        ([1], None)
        """
        if group_ids.__class__ is list and len(group_ids) == 1:  # the common case
            try:
                entry = self._cached[group_ids[0]].get(block_hash)
            except KeyError:  # nothing cached in this group yet
                self._no_group_map(group_ids[0])
                return None
            if entry is None:
                return None
            return [entry if entry.__class__ is Block else next(iter(entry.values()))]
        found: list[Block] = []
        for group_id in group_ids:
            group_map = self._cached.get(group_id)
            if not group_map:
                self._no_group_map(group_id)
                return None
            entry = group_map.get(block_hash)
            if entry is None:
                return None
            found.append(entry if entry.__class__ is Block else next(iter(entry.values())))
        return found

    def cached_map(self, group_id: int) -> GroupMap | None:
        """``group_id``'s map, block hash -> block (or ``{block_id: block}`` for one
        content cached in several blocks), for callers that look up many hashes in
        a row; None while nothing is cached in the group. Read it, never change it.

        >>> pool = BlockPool(3)
        >>> pool.cached_map(0) is None
        True
        """
        return self._cached.get(group_id)

    def find_cached_prefix(
        self,
        block_hashes: Iterable[CacheKey],
        group_id: int,
        max_blocks: int | None = None,
    ) -> list[Block]:
        """The cached blocks of the longest prefix of ``block_hashes`` in ``group_id``.

        Stops at the first miss (or after ``max_blocks``). Hashes must already
        be at this group's block size (see ``resolve_block_hashes``).
        """
        hits: list[Block] = []
        if not self.enable_caching:
            return hits
        group_map = self._cached.get(group_id)
        if not group_map:
            self._no_group_map(group_id)
            return hits
        if max_blocks is not None and max_blocks <= 0:
            return hits
        get, append = group_map.get, hits.append
        for block_hash in block_hashes:
            entry = get(block_hash)
            if entry is None:
                break
            append(entry if entry.__class__ is Block else next(iter(entry.values())))
            if max_blocks is not None and len(hits) >= max_blocks:
                break
        return hits

    def cache_full_blocks(
        self,
        blocks: Sequence[Block],
        block_hashes: Sequence[BlockHash],
        num_cached_blocks: int,
        num_full_blocks: int,
        group_id: int,
        block_size: int | None = None,
    ) -> None:
        """Cache ``blocks[num_cached_blocks:num_full_blocks]`` of one request.

        ``block_hashes`` are the request's hashes at the pool's
        ``hash_block_size``; ``block_size`` is the group's (default: the hash
        block size), and the hash of block *i* is read at that granularity.
        Blocks must be held by ``group_id`` and not cached yet; null blocks are
        passed over. A no-op when caching is off.
        """
        if not self.enable_caching or num_cached_blocks >= num_full_blocks:
            return
        self._check_group(group_id)
        if block_size is None:
            block_size = self.hash_block_size
        hashes: Sequence[CacheKey] = block_hashes
        if self.hash_block_size is not None and block_size is not None:
            hashes = resolve_block_hashes(block_hashes, self.hash_block_size, block_size)
        if len(hashes) < num_full_blocks or len(blocks) < num_full_blocks:
            raise BlockPoolError(
                f"cannot cache {num_full_blocks} full blocks",
                expected=f"at least {num_full_blocks} blocks and block hashes",
                found=f"{len(blocks)} blocks, {len(hashes)} block hashes",
                hint="pass the request's blocks and its block hashes, one per full block",
            )
        new_blocks = blocks[num_cached_blocks:num_full_blocks]
        _check_cacheable(new_blocks, group_id)
        group_map = self._cached.setdefault(group_id, {})
        for i, block in enumerate(new_blocks, start=num_cached_blocks):
            if block.is_null:
                continue
            if block._hash is not None:  # listed twice: cached a moment ago
                raise BlockStateError(f"block {block.block_id} already has a hash",
                                      hint="a block is cached once; cache only new full "
                                      "blocks (num_cached_blocks onwards)")
            block._hash = block_hash = hashes[i]
            block._block_hash_num_tokens = None if block_size is None else (i + 1) * block_size
            entry = group_map.setdefault(block_hash, block)
            if entry is not block:
                _add_copy(group_map, block_hash, entry, block)

    def cache_block(self, block: Block, block_hash: CacheKey, group_id: int,
                    num_tokens: int | None = None) -> None:
        """Cache one held block under ``block_hash`` for ``group_id``, the prefix of
        ``num_tokens`` tokens (a request-level manager's step, unchecked: the caller
        holds the block). A block cached under another hash loses it first; one
        cached under this hash already is left alone.

        >>> pool = BlockPool(3)
        >>> (block,) = pool.allocate(1)
        >>> pool.cache_block(block, b"h", 0, 16)
        >>> pool.lookup(b"h", [0]) == [block], block.block_hash_num_tokens
        (True, 16)
        """
        if not self.enable_caching or block.is_null:
            return
        if block._hash is not None:
            if block._hash == block_hash and block._group == group_id:
                return
            self._uncache(block)
            block._hash = block._block_hash_num_tokens = None
        block._hash = block_hash
        block._group = group_id
        block._block_hash_num_tokens = num_tokens
        if self.private_keys and block_hash.__class__ is int and block_hash < 0:
            return  # a private key stays on its block alone
        group_map = self._cached.get(group_id)
        if group_map is None:
            group_map = self._cached[group_id] = {}
        entry = group_map.setdefault(block_hash, block)
        if entry is not block:
            _add_copy(group_map, block_hash, entry, block)

    def cache_run(self, blocks: Sequence[Block], block_hashes: Sequence[CacheKey],
                  group_id: int, num_tokens: int, block_size: int) -> None:
        """:meth:`cache_block` for a request's run of full blocks: ``blocks[k]`` under
        ``block_hashes[k]``, the prefix of ``num_tokens + k * block_size`` tokens
        (null blocks are passed over).

        >>> pool = BlockPool(4)
        >>> blocks = pool.allocate(2)
        >>> pool.cache_run(blocks, [b"a", b"b"], 0, 16, 16)
        >>> [b.block_hash_num_tokens for b in blocks]
        [16, 32]
        """
        if not self.enable_caching:
            return
        group_map = self._cached.get(group_id)
        if group_map is None:
            group_map = self._cached[group_id] = {}
        setdefault = group_map.setdefault
        private = self.private_keys
        for block, block_hash in zip(blocks, block_hashes):
            if block._hash is not None or block.is_null:
                self.cache_block(block, block_hash, group_id, num_tokens)
            else:
                block._hash = block_hash
                block._group = group_id
                block._block_hash_num_tokens = num_tokens
                if not (private and block_hash.__class__ is int and block_hash < 0):
                    entry = setdefault(block_hash, block)
                    if entry is not block:
                        _add_copy(group_map, block_hash, entry, block)
            num_tokens += block_size

    def evict(self, block_ids: Iterable[int]) -> list[int]:
        """Drop the cached hash of the given blocks (held or free); returns the ids
        that were cached. A held block stays held.

        >>> pool = BlockPool(4)
        >>> blocks = pool.allocate(2)
        >>> pool.cache_full_blocks(blocks, [b"a", b"b"], 0, 2, group_id=0)
        >>> pool.evict([2, 3]), pool.lookup(b"b", [0])
        ([2], None)
        """
        evicted: list[int] = []
        blocks = self.blocks
        for block_id in block_ids:
            block = blocks[block_id]
            if block._hash is not None and self._uncache(block):
                evicted.append(block_id)
        return evicted

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash; only allowed when no block is held.

        Returns whether the cache was reset.

        >>> pool = BlockPool(3)
        >>> blocks = pool.allocate(1)
        >>> pool.reset_prefix_cache(), (pool.free(blocks), pool.reset_prefix_cache())[1]
        (False, True)
        """
        if self.free_block_queue.num_free_blocks != len(self.blocks) - 1:
            return False
        self._cached.clear()
        for block in self.blocks:
            block._hash = block._block_hash_num_tokens = None
        return True

    # -- allocation -------------------------------------------------------

    def allocate(self, num_blocks: int, group_id: int = 0, num_own: int = 0, key: int = -1,
                 num_tokens: int = 0, block_size: int = 0) -> list[Block]:
        """Take ``num_blocks`` blocks from the head of the free queue for ``group_id``.

        A taken block that was still cached loses its hash (it is evicted).
        Each comes back with ``ref_count == 1``. The first ``num_own`` come back
        cached under the private keys ``key, key + 1, ...`` (a pool with
        ``private_keys``; ``key + num_own <= 0``), the prefixes of ``num_tokens``,
        ``num_tokens + block_size``, ... tokens: :meth:`cache_run` at once.

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
        private = self.private_keys
        head = queue._head
        # a queued block's links are never None (typed Block: compiled code reads its
        # fields natively)
        block: Block = head.next_free  # type: ignore[assignment]
        taken: list[Block] = []
        for i in range(num_blocks):  # popleft_n, evicting and handing out as it goes
            taken.append(block)
            following: Block = block.next_free  # type: ignore[assignment]
            block.prev_free = block.next_free = None
            old = block._hash
            if old is not None and not (private and old.__class__ is int and old < 0):
                group_map = cached.get(block._group)  # type: ignore[arg-type]  # cached: a group
                if group_map is not None:
                    entry = group_map.pop(old, None)
                    if entry is not block and entry is not None:
                        group_map[old] = entry  # one of several blocks of the same content
                        self._uncache(block)
            if i < num_own:
                block._hash = key + i
                block._block_hash_num_tokens = num_tokens + i * block_size
            elif old is not None:
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
            block: Block = blocks[0]  # (typed: read natively when compiled)
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
        first: list[Block] = []  # released and not cached: for the head
        caching = self.enable_caching
        # typed (``__class__ is list`` would make it list[Any]): read natively when compiled
        blocks: list[Block] = ordered if ordered.__class__ is list else list(ordered)
        queue = self.free_block_queue
        tail = queue._tail
        start: Block = tail.prev_free  # type: ignore[assignment]  # the tail has one
        last = start  # released cached blocks are linked after it as they come
        linked = 0
        it: Iterator[Block] = iter(blocks)
        for block in it:
            ref = block.ref_count
            if ref == 1 and block.pool is self:
                block.ref_count = 0
                if caching and block._hash is not None:
                    block.prev_free = last
                    last.next_free = block
                    last = block
                    linked += 1
                else:
                    first.append(block)
            elif ref > 1 and block.pool is self:
                block.ref_count = ref - 1
            elif not block.is_null:  # a refusal changes nothing
                self._refuse_free(blocks, len(blocks) - length_hint(it) - 1, start, last)
        last.next_free = tail
        tail.prev_free = last
        queue.num_free_blocks += linked
        if first:
            queue._link(queue._head, first, queue._head.next_free)  # type: ignore[arg-type]

    def free_request(self, blocks: Sequence[Block]) -> None:
        """Free a request's blocks, last first, so its chain's tail is evicted first.

        >>> pool = BlockPool(5)
        >>> blocks = pool.allocate(3)
        >>> pool.free_request(blocks); [b.block_id for b in pool.free_block_queue]
        [4, 3, 2, 1]
        """
        cls = blocks.__class__
        ordered = blocks[::-1] if cls is list else list(reversed(blocks))
        self._release(ordered)  # type: ignore[arg-type]

    # -- internals --------------------------------------------------------

    def _release(self, ordered: list[Block]) -> None:
        """Drop a hold on each of ``ordered``; link the released ones at the tail."""
        queue = self.free_block_queue
        tail = queue._tail
        start: Block = tail.prev_free  # type: ignore[assignment]  # the tail has one
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

    def _uncache(self, block: Block) -> bool:
        """Drop ``block``'s hash from the map and the block; False if the map
        does not hold it under that hash (a private key is the block's alone)."""
        group_map = self._cached.get(block._group)  # type: ignore[arg-type]
        block_hash = block._hash
        if self._is_private(block_hash):
            block._hash = block._block_hash_num_tokens = None
            return True
        if group_map is None or block_hash is None:
            return False
        entry = group_map.get(block_hash)
        if entry is None:
            return False
        if entry.__class__ is Block:
            if entry is not block:
                return False
            del group_map[block_hash]
        else:
            if entry.pop(block.block_id, None) is None:
                return False
            if len(entry) == 1:
                group_map[block_hash] = next(iter(entry.values()))
        block._hash = block._block_hash_num_tokens = None
        return True

    def _is_private(self, key: CacheKey | None) -> bool:
        """Whether ``key`` stays on its block, out of the map."""
        return self.private_keys and key.__class__ is int and key < 0

    def _no_group_map(self, group_id: int) -> None:
        """No map for ``group_id`` (nothing cached in it yet): check that the id
        fits a key, as a lookup by key would, and miss."""
        make_block_hash_with_group_id(b"", group_id)  # raises HashingError if not

    def _check_group(self, group_id: int) -> None:
        limit = self.num_groups if self.num_groups is not None else GROUP_ID_LIMIT
        if not isinstance(group_id, int) or not 0 <= group_id < limit:
            raise BlockPoolError(
                f"group id {group_id!r} is out of range",
                expected=f"0 <= group id < {limit}",
                found=repr(group_id),
                hint="group ids are the layout's, 0 to num_groups - 1",
            )

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


def _check_cacheable(blocks: Sequence[Block], group_id: int) -> None:
    """Every non-null block is held by ``group_id`` and not cached yet."""
    for block in blocks:
        if block.is_null:
            continue
        if block.ref_count <= 0 or block._group != group_id:
            raise BlockStateError(
                f"block {block.block_id} is not held by group {group_id}",
                found=f"ref count {block.ref_count}, group {block.group_id}",
                hint="cache the blocks a request holds, under the group it took them for",
            )
        if block._hash is not None:
            raise BlockStateError(f"block {block.block_id} is already cached",
                                  hint="cache only new full blocks (num_cached_blocks onwards)")


def _add_copy(group_map: GroupMap, block_hash: CacheKey, entry: Any, block: Block) -> None:
    """Cache ``block`` under ``block_hash``, which ``entry`` (a block, or
    ``{block_id: block}``) holds already: one content in several blocks."""
    if entry.__class__ is Block:
        group_map[block_hash] = {entry.block_id: entry, block.block_id: block}
    else:
        entry[block.block_id] = block
