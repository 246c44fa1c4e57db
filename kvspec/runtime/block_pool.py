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

This module does not import torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from kvspec.errors import KvspecError
from kvspec.runtime.hashing import (
    BlockHash,
    BlockHashKey,
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


class BlockPoolError(KvspecError):
    """A block pool was asked for something it cannot do."""


class NotEnoughFreeBlocksError(BlockPoolError, ValueError):
    """More blocks were asked for than the pool (or queue) has free."""


class BlockStateError(BlockPoolError, RuntimeError):
    """A block was used against its state: freed twice, not queued, another group's."""


class Block:
    """Metadata of one KV-cache block.

    ``ref_count`` counts the requests holding the block. ``block_hash`` is the
    (hash, group id) key it is cached under, set once the block is full;
    ``block_hash_num_tokens`` is the prefix length that hash covers.
    ``group_id`` is the group the block belongs to while it is held or cached
    (``None`` when it is free and holds nothing); ``pool`` is the pool it came
    from. ``prev_free`` / ``next_free``
    link the free queue and belong to :class:`FreeBlockQueue` alone.

    >>> Block(7)
    Block(block_id=7, ref_count=0, group_id=None, block_hash=None, prev_free=None, next_free=None)
    """

    __slots__ = (
        "block_id",
        "ref_count",
        "group_id",
        "is_null",
        "pool",
        "_block_hash",
        "_block_hash_num_tokens",
        "prev_free",
        "next_free",
    )

    def __init__(self, block_id: int, *, is_null: bool = False) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.group_id: int | None = None
        self.is_null = is_null
        self.pool: BlockPool | None = None  # the pool that owns it, if any
        self._block_hash: BlockHashKey | None = None
        self._block_hash_num_tokens: int | None = None
        self.prev_free: Block | None = None
        self.next_free: Block | None = None

    @property
    def block_hash(self) -> BlockHashKey | None:
        """The (hash, group id) key of a cached block, else ``None``."""
        return self._block_hash

    @property
    def block_hash_num_tokens(self) -> int | None:
        """How many prefix tokens :attr:`block_hash` covers."""
        return self._block_hash_num_tokens

    def set_block_hash(self, key: BlockHashKey, num_tokens: int | None = None) -> None:
        """Record the key the block is cached under; a block is cached once."""
        if self._block_hash is not None or self._block_hash_num_tokens is not None:
            raise BlockStateError(f"block {self.block_id} already has a hash")
        self._block_hash = key
        self._block_hash_num_tokens = num_tokens

    def reset_hash(self) -> None:
        """Forget the hash (the block is evicted from the prefix cache)."""
        self._block_hash = None
        self._block_hash_num_tokens = None

    def __repr__(self) -> str:
        prev_id = None if self.prev_free is None else self.prev_free.block_id
        next_id = None if self.next_free is None else self.next_free.block_id
        key = None if self._block_hash is None else self._block_hash.hex()
        return (
            f"Block(block_id={self.block_id}, ref_count={self.ref_count}, "
            f"group_id={self.group_id}, block_hash={key}, "
            f"prev_free={prev_id}, next_free={next_id})"
        )


class FreeBlockQueue:
    """The free blocks as a doubly linked list through the blocks themselves.

    Removing a block from the middle (a prefix-cache hit on a free block) is
    O(1), which ``collections.deque`` cannot do; no Python object is made per
    operation. Two sentinel blocks (id -1) bracket the list, so every queued
    block has both neighbours, and a block is queued exactly when its
    ``prev_free`` is set.

    Eviction order, head first: blocks start in id order; freed blocks go to
    the tail, so the least recently used is at the head, and among blocks
    freed together the one freed first (a request frees its chain tail first).

    >>> queue = FreeBlockQueue([Block(i) for i in range(4)])
    >>> queue.popleft().block_id, [b.block_id for b in queue.popleft_n(2)]
    (0, [1, 2])
    >>> queue.append(Block(9)); [b.block_id for b in queue.get_all_free_blocks()]
    [3, 9]
    """

    __slots__ = ("num_free_blocks", "_head", "_tail")

    def __init__(self, blocks: Sequence[Block]) -> None:
        _check_linkable(blocks)
        self._head = Block(-1)
        self._tail = Block(-1)
        self.num_free_blocks = 0
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        if blocks:
            self._link_tail(blocks)

    def __len__(self) -> int:
        return self.num_free_blocks

    def __iter__(self) -> Iterator[Block]:
        return self.iter_blocks_after(None)

    def popleft(self) -> Block:
        """Take the head block (the next to evict) off the queue.

        >>> FreeBlockQueue([Block(3), Block(5)]).popleft().block_id
        3
        """
        first = self._head.next_free
        if first is self._tail or first is None:
            raise NotEnoughFreeBlocksError("no free blocks available", found="0 free blocks")
        after = first.next_free
        assert after is not None, "a queued block always has a successor"
        self._head.next_free = after
        after.prev_free = self._head
        first.prev_free = first.next_free = None
        self.num_free_blocks -= 1
        return first

    def popleft_n(self, n: int) -> list[Block]:
        """Take the ``n`` head blocks off the queue, in queue order.

        >>> [b.block_id for b in FreeBlockQueue([Block(i) for i in range(5)]).popleft_n(3)]
        [0, 1, 2]
        """
        if n < 0 or n > self.num_free_blocks:
            raise NotEnoughFreeBlocksError(
                f"cannot take {n} blocks off a queue of {self.num_free_blocks}",
                expected=f"0 <= n <= {self.num_free_blocks}",
                found=str(n),
            )
        if n == 0:
            return []
        taken: list[Block] = []
        block = self._head.next_free
        for _ in range(n):
            assert block is not None
            taken.append(block)
            following = block.next_free
            block.prev_free = block.next_free = None
            block = following
        assert block is not None
        self._head.next_free = block
        block.prev_free = self._head
        self.num_free_blocks -= n
        return taken

    def remove(self, block: Block) -> None:
        """Unlink ``block`` from wherever it is in the queue, in O(1).

        >>> blocks = [Block(i) for i in range(3)]
        >>> queue = FreeBlockQueue(blocks); queue.remove(blocks[1])
        >>> [b.block_id for b in queue]
        [0, 2]
        """
        prev, after = block.prev_free, block.next_free
        if prev is None or after is None:
            raise BlockStateError(f"block {block.block_id} is not in the free queue")
        prev.next_free = after
        after.prev_free = prev
        block.prev_free = block.next_free = None
        self.num_free_blocks -= 1

    def append(self, block: Block) -> None:
        """Put ``block`` at the tail (evicted last).

        >>> queue = FreeBlockQueue([Block(0)]); queue.append(Block(4))
        >>> [b.block_id for b in queue]
        [0, 4]
        """
        if block.prev_free is not None or block.next_free is not None or block.block_id < 0:
            raise BlockStateError(f"block {block.block_id} is already in a free queue")
        last = self._tail.prev_free
        assert last is not None
        last.next_free = block
        block.prev_free = last
        block.next_free = self._tail
        self._tail.prev_free = block
        self.num_free_blocks += 1

    def append_n(self, blocks: Sequence[Block]) -> None:
        """Put ``blocks`` at the tail, keeping their order.

        >>> queue = FreeBlockQueue([Block(0)]); queue.append_n([Block(3), Block(2)])
        >>> [b.block_id for b in queue]
        [0, 3, 2]
        """
        if not blocks:
            return
        _check_linkable(blocks)
        self._link_tail(blocks)

    def _link_tail(self, blocks: Sequence[Block]) -> None:
        # Caller guarantees: blocks distinct, none queued, at least one.
        last = self._tail.prev_free
        assert last is not None
        for block in blocks:
            block.prev_free = last
            last.next_free = block
            last = block
        last.next_free = self._tail
        self._tail.prev_free = last
        self.num_free_blocks += len(blocks)

    def prepend_n(self, blocks: Sequence[Block]) -> None:
        """Put ``blocks`` at the head, keeping their order (they are evicted first).

        >>> queue = FreeBlockQueue([Block(0)]); queue.prepend_n([Block(6), Block(5)])
        >>> [b.block_id for b in queue]
        [6, 5, 0]
        """
        if not blocks:
            return
        _check_linkable(blocks)
        first = self._head.next_free
        assert first is not None
        prev = self._head
        for block in blocks:
            block.prev_free = prev
            prev.next_free = block
            prev = block
        prev.next_free = first
        first.prev_free = prev
        self.num_free_blocks += len(blocks)

    def get_all_free_blocks(self) -> list[Block]:
        """Every queued block, head first.

        >>> [b.block_id for b in FreeBlockQueue([Block(2), Block(1)]).get_all_free_blocks()]
        [2, 1]
        """
        return list(self.iter_blocks_after(None))

    def iter_blocks_after(self, cursor: Block | None) -> Iterator[Block]:
        """Queued blocks in eviction order after ``cursor`` (``None``: from the head).

        A cursor that is not queued yields nothing.

        >>> blocks = [Block(i) for i in range(4)]
        >>> [b.block_id for b in FreeBlockQueue(blocks).iter_blocks_after(blocks[1])]
        [2, 3]
        """
        block = self._head.next_free if cursor is None else cursor.next_free
        tail = self._tail
        while block is not None and block is not tail:
            yield block
            block = block.next_free


def _check_linkable(blocks: Sequence[Block]) -> None:
    for block in blocks:
        if block.prev_free is not None or block.next_free is not None or block.block_id < 0:
            raise BlockStateError(f"block {block.block_id} is already in a free queue")
    if len(blocks) > 1 and len(set(map(id, blocks))) != len(blocks):
        raise BlockStateError("the same block is listed twice")


#: The reference's names.
KVCacheBlock = Block
FreeKVCacheBlockQueue = FreeBlockQueue


class BlockPool:
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

    __slots__ = (
        "num_blocks",
        "enable_caching",
        "hash_block_size",
        "num_groups",
        "blocks",
        "free_block_queue",
        "null_block",
        "_cached",
        "_group_suffixes",
    )

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
            )
        if num_groups is not None and num_groups < 1:
            raise BlockPoolError("num_groups must be at least 1", found=repr(num_groups))
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.hash_block_size = hash_block_size
        self.num_groups = num_groups
        self.blocks: tuple[Block, ...] = tuple(Block(i) for i in range(num_blocks))
        for block in self.blocks:
            block.pool = self
        self.free_block_queue = FreeBlockQueue(self.blocks)
        # key -> the one block cached under it, or {block_id: block} when the
        # same content was cached in several blocks (concurrent requests).
        self._cached: dict[BlockHashKey, Block | dict[int, Block]] = {}
        self._group_suffixes: dict[int, bytes] = {}  # group id -> its 4 key bytes
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

    @property
    def num_cached_blocks(self) -> int:
        """Blocks that hold a cached hash (held or free)."""
        return sum(1 if isinstance(v, Block) else len(v) for v in self._cached.values())

    def lookup(self, block_hash: BlockHash, group_ids: Sequence[int]) -> list[Block] | None:
        """The cached block of ``block_hash`` in each of ``group_ids``, or ``None``
        when any of them misses. The blocks are not touched.

        >>> pool = BlockPool(4)
        >>> blocks = pool.allocate(1, group_id=2)
        >>> pool.cache_full_blocks(blocks, [b"h"], 0, 1, group_id=2)
        >>> [b.block_id for b in pool.lookup(b"h", [2])], pool.lookup(b"h", [0])
        ([1], None)
        """
        found: list[Block] = []
        cached = self._cached
        suffixes = self._group_suffixes
        for group_id in group_ids:
            suffix = suffixes.get(group_id)
            if suffix is None:
                suffix = self._group_suffix(group_id)
            entry = cached.get(block_hash + suffix)
            if entry is None:
                return None
            found.append(entry if entry.__class__ is Block else next(iter(entry.values())))
        return found

    def find_cached_prefix(
        self,
        block_hashes: Iterable[BlockHash],
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
        cached = self._cached
        suffix = self._group_suffixes.get(group_id) or self._group_suffix(group_id)
        for block_hash in block_hashes:
            if max_blocks is not None and len(hits) >= max_blocks:
                break
            entry = cached.get(block_hash + suffix)
            if entry is None:
                break
            hits.append(entry if isinstance(entry, Block) else next(iter(entry.values())))
        return hits

    # -- allocation -------------------------------------------------------

    def allocate(self, num_blocks: int, group_id: int = 0) -> list[Block]:
        """Take ``num_blocks`` blocks from the head of the free queue for ``group_id``.

        A taken block that was still cached loses its hash (it is evicted).
        Each comes back with ``ref_count == 1``.

        >>> pool = BlockPool(4)
        >>> [(b.block_id, b.ref_count, b.group_id) for b in pool.allocate(2, group_id=1)]
        [(1, 1, 1), (2, 1, 1)]
        """
        self._check_group(group_id)
        num_free = self.free_block_queue.num_free_blocks
        if num_blocks < 0:
            raise BlockPoolError("cannot allocate a negative number of blocks", found=str(num_blocks))
        if num_blocks > num_free:
            raise NotEnoughFreeBlocksError(
                f"cannot allocate {num_blocks} blocks: {num_free} free",
                expected=f"at most {num_free} blocks",
                found=str(num_blocks),
                hint="free finished requests' blocks, or preempt one",
            )
        blocks = self.free_block_queue.popleft_n(num_blocks)
        cached = self._cached
        for block in blocks:
            key = block._block_hash
            if key is not None:  # a cached block is reused: evict its hash
                if cached.get(key) is block:
                    del cached[key]
                else:
                    self._uncache(block)
                block._block_hash = block._block_hash_num_tokens = None
            block.ref_count = 1
            block.group_id = group_id
        return blocks

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
        blocks = list(blocks)
        for block in blocks:
            if block.is_null:
                continue
            if block.pool is not self:
                raise BlockStateError(f"block {block.block_id} is not from this pool")
            if block.group_id is None:
                raise BlockStateError(
                    f"block {block.block_id} is neither held nor cached: nothing to touch"
                )
            if group_id is not None and block.group_id != group_id:
                raise BlockStateError(
                    f"block {block.block_id} belongs to group {block.group_id}",
                    expected=f"a block of group {group_id}",
                    found=f"group {block.group_id}",
                )
        queue = self.free_block_queue
        for block in blocks:
            if block.is_null:
                continue
            if block.ref_count == 0:
                queue.remove(block)
            block.ref_count += 1

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
        if blocks.__class__ is not list:
            blocks = list(blocks)
        released: list[Block] = []
        null = self.null_block
        for i, block in enumerate(blocks):
            if block is null:
                continue
            ref = block.ref_count
            if ref <= 0 or block.pool is not self:
                self._undo_free(blocks[:i])
                if block.pool is not self:
                    raise BlockStateError(f"block {block.block_id} is not from this pool")
                raise BlockStateError(f"block {block.block_id} is freed but not held (freed twice?)")
            block.ref_count = ref = ref - 1
            if ref == 0:
                released.append(block)
        if released:
            for block in released:
                if block._block_hash is None:
                    block.group_id = None  # free and uncached: nobody's
            self.free_block_queue._link_tail(released)

    def _undo_free(self, blocks: list[Block]) -> None:
        for block in blocks:
            if block is not self.null_block:
                block.ref_count += 1

    def free_request(self, blocks: Sequence[Block]) -> None:
        """Free a request's blocks, last first, so its chain's tail is evicted first.

        >>> pool = BlockPool(5)
        >>> blocks = pool.allocate(3)
        >>> pool.free_request(blocks); [b.block_id for b in pool.free_block_queue]
        [4, 3, 2, 1]
        """
        self.free(blocks[::-1] if isinstance(blocks, list | tuple) else list(reversed(blocks)))

    # -- prefix cache -----------------------------------------------------

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
        hashes: Sequence[BlockHash] = block_hashes
        if self.hash_block_size is not None and block_size is not None:
            hashes = resolve_block_hashes(block_hashes, self.hash_block_size, block_size)
        if len(hashes) < num_full_blocks or len(blocks) < num_full_blocks:
            raise BlockPoolError(
                f"cannot cache {num_full_blocks} full blocks",
                expected=f"at least {num_full_blocks} blocks and block hashes",
                found=f"{len(blocks)} blocks, {len(hashes)} block hashes",
            )
        new_blocks = blocks[num_cached_blocks:num_full_blocks]
        for block in new_blocks:
            if block.is_null:
                continue
            if block.ref_count <= 0 or block.group_id != group_id:
                raise BlockStateError(
                    f"block {block.block_id} is not held by group {group_id}",
                    found=f"ref count {block.ref_count}, group {block.group_id}",
                )
            if block._block_hash is not None:
                raise BlockStateError(f"block {block.block_id} is already cached")
        cached = self._cached
        for i, block in enumerate(new_blocks, start=num_cached_blocks):
            if block.is_null:
                continue
            key = make_block_hash_with_group_id(hashes[i], group_id)
            block.set_block_hash(key, None if block_size is None else (i + 1) * block_size)
            entry = cached.get(key)
            if entry is None:
                cached[key] = block
            elif isinstance(entry, Block):
                cached[key] = {entry.block_id: entry, block.block_id: block}
            else:
                entry[block.block_id] = block

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
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block._block_hash is not None and self._uncache(block):
                evicted.append(block_id)
                if block.ref_count == 0:
                    block.group_id = None
        return evicted

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash; only allowed when no block is held.

        Returns whether the cache was reset.
        """
        if self.num_free_blocks != self.num_blocks - 1:
            return False
        self._cached.clear()
        for block in self.blocks:
            block.reset_hash()
            if not block.is_null:
                block.group_id = None
        return True

    # -- internals --------------------------------------------------------

    def _uncache(self, block: Block) -> bool:
        key = block._block_hash
        assert key is not None
        entry = self._cached.get(key)
        if entry is None:
            return False
        if isinstance(entry, Block):
            if entry is not block:
                return False
            del self._cached[key]
        else:
            if entry.pop(block.block_id, None) is None:
                return False
            if len(entry) == 1:
                self._cached[key] = next(iter(entry.values()))
        block.reset_hash()
        return True

    def _group_suffix(self, group_id: int) -> bytes:
        suffix = make_block_hash_with_group_id(b"", group_id)
        self._group_suffixes[group_id] = suffix
        return suffix

    def _check_group(self, group_id: int) -> None:
        limit = self.num_groups if self.num_groups is not None else 1 << 32
        if not isinstance(group_id, int) or not 0 <= group_id < limit:
            raise BlockPoolError(
                f"group id {group_id!r} is out of range",
                expected=f"0 <= group id < {limit}",
                found=repr(group_id),
            )
