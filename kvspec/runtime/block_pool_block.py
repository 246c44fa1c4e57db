"""One KV-cache block's metadata, and the block pool's errors.

A :class:`Block` is what the pool hands out: its id, how many requests hold it,
the group it belongs to and, once it is full and cached, the (hash, group id)
key it is cached under. Its ``prev_free`` / ``next_free`` links thread it into
the free queue (:mod:`kvspec.runtime.block_pool_queue`).

>>> block = Block(3)
>>> block.set_block_hash(b"hash" + (0).to_bytes(4, "big"), 16)
>>> block.block_hash, block.block_hash_num_tokens
(b'hash\\x00\\x00\\x00\\x00', 16)
>>> block.reset_hash(); block.block_hash is None
True

This module does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvspec.errors import KvspecError
from kvspec.runtime.hashing import GROUP_ID_BYTES, split_block_hash_with_group_id

if TYPE_CHECKING:  # pragma: no cover
    from kvspec.runtime.hashing import BlockHashKey, CacheKey

__all__ = [
    "Block",
    "BlockPoolError",
    "BlockStateError",
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
    ``group_id`` is the group the block belongs to while it is held or cached,
    and ``None`` while it is free and holds nothing; ``pool`` is the pool it
    came from. ``prev_free`` / ``next_free`` link the free queue and belong to
    :class:`~kvspec.runtime.block_pool_queue.FreeBlockQueue` (and the pool's
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
