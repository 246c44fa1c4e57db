"""The free-block queue: free blocks in eviction order, linked through the blocks.

Behaviour follows the reference's ``FreeKVCacheBlockQueue`` step for step (the
recorded trace ``blockpool-trace.json`` replays against it).

>>> queue = FreeBlockQueue([Block(i) for i in range(4)])
>>> queue.popleft().block_id, [b.block_id for b in queue.popleft_n(2)]
(0, [1, 2])
>>> queue.append(Block(9)); [b.block_id for b in queue.get_all_free_blocks()]
[3, 9]

This module does not import torch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from kvspec.runtime.block_pool_block import (
    Block,
    BlockStateError,
    NotEnoughFreeBlocksError,
)

__all__ = ["FreeBlockQueue", "FreeKVCacheBlockQueue"]


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
        block: Any = head.next_free  # Any: a queued block's links are never None
        taken: list[Block] = []
        append = taken.append
        for _ in range(n):
            append(block)
            following = block.next_free
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
