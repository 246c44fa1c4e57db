"""KV-cache blocks and the free-block queue that links them, and the block pool's errors.

A :class:`Block` is what the pool hands out: its id, how many requests hold it,
the group it belongs to and, once it is full and cached, the (hash, group id)
key it is cached under. Its ``prev_free`` / ``next_free`` links thread it into
the :class:`FreeBlockQueue`: free blocks in eviction order, linked through the
blocks themselves. Behaviour follows the reference's ``KVCacheBlock`` and
``FreeKVCacheBlockQueue`` step for step (the recorded trace
``blockpool-trace.json`` replays against it).

>>> block = Block(3)
>>> block.set_block_hash(b"hash" + (0).to_bytes(4, "big"), 16)
>>> block.block_hash, block.block_hash_num_tokens
(b'hash\\x00\\x00\\x00\\x00', 16)
>>> block.reset_hash(); block.block_hash is None
True
>>> queue = FreeBlockQueue([Block(i) for i in range(4)])
>>> queue.popleft().block_id, [b.block_id for b in queue.popleft_n(2)]
(0, [1, 2])
>>> queue.append(Block(9)); [b.block_id for b in queue.get_all_free_blocks()]
[3, 9]

This module does not import torch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from kvspec.runtime.hashing import GROUP_ID_BYTES, split_block_hash_with_group_id
from kvspec.runtime.pool_errors import BlockPoolError, BlockStateError, NotEnoughFreeBlocksError

if TYPE_CHECKING:  # pragma: no cover
    from kvspec.runtime.hashing import BlockHashKey, CacheKey

__all__ = [
    "Block",
    "BlockPoolError",
    "BlockStateError",
    "FreeBlockQueue",
    "FreeKVCacheBlockQueue",
    "KVCacheBlock",
    "NotEnoughFreeBlocksError",
]


class Block:
    """Metadata of one KV-cache block.

    ``ref_count`` counts the requests holding the block. ``block_hash`` is the
    (hash, group id) key it is cached under, set once the block is full;
    ``block_hash_num_tokens`` is the prefix length that hash covers.
    ``group_id`` is the group the block belongs to while it is held or cached,
    and ``None`` while it is free and holds nothing; ``pool`` is the pool it
    came from. ``prev_free`` / ``next_free`` link the free queue and belong to
    :class:`FreeBlockQueue` (and the pool's
    batch operations) alone.

    What is stored is what the pool's hot paths need: ``_group``, the last group
    to take the block, is never cleared (``group_id`` reads it only while the
    block is held or cached, so freeing touches a block's count and links
    alone), and ``_hash`` is the bare block hash, the block's key in its
    group's map; ``block_hash`` packs the two into the key when asked.

    >>> Block(7)
    Block(block_id=7, ref_count=0, group_id=None, block_hash=None, prev_free=None, next_free=None)
    >>> block = Block(7)
    >>> block.set_block_hash(bytes.fromhex("abcd00000002"), 16)
    >>> block.block_hash.hex(), block.group_id, block.block_hash_num_tokens
    ('abcd00000002', 2, 16)
    >>> block.reset_hash(); block.block_hash, block.group_id
    (None, None)
    """

    __slots__ = (
        "block_id",
        "ref_count",
        "_group",
        "is_null",
        "pool",
        "_hash",
        "_block_hash_num_tokens",
        "prev_free",
        "next_free",
    )

    def __init__(self, block_id: int, *, is_null: bool = False) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self._group: int | None = None  # last group to hold it; see group_id
        self.is_null = is_null
        # the pool that owns it, if any (only ever compared by identity)
        self.pool: object | None = None
        self._hash: CacheKey | None = None  # the block hash (or key) it is cached under
        self._block_hash_num_tokens: int | None = None
        self.prev_free: Block | None = None
        self.next_free: Block | None = None

    @property
    def group_id(self) -> int | None:
        """The group holding or caching the block; ``None`` when it is neither."""
        if self.ref_count > 0 or self._hash is not None:
            return self._group
        return None

    @group_id.setter
    def group_id(self, group_id: int | None) -> None:
        self._group = group_id

    @property
    def block_hash(self) -> BlockHashKey | None:
        """The (hash, group id) key of a cached block, else ``None``."""
        key = self._hash
        if key is None:
            return None
        # cached, so its group is known; an int key (a request-level manager's) has no
        # bytes form, and the manager never asks for one
        assert isinstance(key, bytes) and self._group is not None
        return key + self._group.to_bytes(GROUP_ID_BYTES, "big")

    @property
    def block_hash_num_tokens(self) -> int | None:
        """How many prefix tokens :attr:`block_hash` covers."""
        return self._block_hash_num_tokens

    def set_block_hash(self, key: BlockHashKey, num_tokens: int | None = None) -> None:
        """Record the key the block is cached under (its group id becomes the
        key's); a block is cached once."""
        if self._hash is not None or self._block_hash_num_tokens is not None:
            raise BlockStateError(f"block {self.block_id} already has a hash",
                                  hint="a block is cached once; free it before it is reused")
        if len(key) <= GROUP_ID_BYTES:
            raise BlockStateError(
                f"block {self.block_id}: a block hash key is a hash and {GROUP_ID_BYTES} "
                "group id bytes",
                found=f"{len(key)} bytes",
                hint="make keys with make_block_hash_with_group_id(hash, group_id)",
            )
        self._hash, self._group = split_block_hash_with_group_id(key)
        self._block_hash_num_tokens = num_tokens

    def reset_hash(self) -> None:
        """Forget the hash (the block is evicted from the prefix cache)."""
        self._hash = self._block_hash_num_tokens = None

    def __repr__(self) -> str:
        prev_id = None if self.prev_free is None else self.prev_free.block_id
        next_id = None if self.next_free is None else self.next_free.block_id
        key = self.block_hash
        return (
            f"Block(block_id={self.block_id}, ref_count={self.ref_count}, "
            f"group_id={self.group_id}, block_hash={None if key is None else key.hex()}, "
            f"prev_free={prev_id}, next_free={next_id})"
        )


#: The reference's name.
KVCacheBlock = Block


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

    :class:`~kvspec.runtime.block_pool.BlockPool` edits the links itself in its
    batch operations (allocate, free, touch), in the same way as the methods
    here, so that a request costs one pass over its blocks.

    >>> queue = FreeBlockQueue([Block(i) for i in range(3)])
    >>> len(queue), [b.block_id for b in queue]
    (3, [0, 1, 2])
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
        head = self._head
        first = head.next_free
        if first is self._tail or first is None:
            raise NotEnoughFreeBlocksError("no free blocks available", found="0 free blocks",
                                           hint="free finished requests' blocks first")
        after = first.next_free
        assert after is not None, "a queued block always has a successor"
        head.next_free = after
        after.prev_free = head
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
                hint="take at most num_free_blocks",
            )
        if n == 0:
            return []
        head = self._head
        block: Block = head.next_free  # type: ignore[assignment]  # never None when queued
        taken: list[Block] = []
        append = taken.append
        for _ in range(n):
            append(block)
            following: Block = block.next_free  # type: ignore[assignment]
            block.prev_free = block.next_free = None
            block = following
        head.next_free = block
        block.prev_free = head
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
            raise BlockStateError(f"block {block.block_id} is not in the free queue",
                                  hint="remove only a block the queue holds")
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
            raise BlockStateError(f"block {block.block_id} is already in a free queue",
                                  hint="free a block once")
        tail = self._tail
        last = tail.prev_free
        assert last is not None
        last.next_free = block
        block.prev_free = last
        block.next_free = tail
        tail.prev_free = block
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
        prev = self._tail.prev_free
        assert prev is not None
        self._link(prev, blocks, self._tail)

    def _link(self, prev: Block, blocks: Sequence[Block], after: Block) -> None:
        """Link ``blocks`` in order between the neighbours ``prev`` and ``after``.
        Caller guarantees: blocks distinct, none queued, at least one."""
        for block in blocks:
            block.prev_free = prev
            prev.next_free = block
            prev = block
        prev.next_free = after
        after.prev_free = prev
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
        self._link(self._head, blocks, first)

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
            raise BlockStateError(f"block {block.block_id} is already in a free queue",
                                  hint="free a block once")
    if len(blocks) > 1 and len(set(map(id, blocks))) != len(blocks):
        raise BlockStateError("the same block is listed twice", hint="list each block once")


#: The reference's name.
FreeKVCacheBlockQueue = FreeBlockQueue
