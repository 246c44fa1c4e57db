"""The block pool's errors.

They live apart from :mod:`kvspec.runtime.block_pool_queue` because that module may
be compiled (mypyc, see ``setup.py``), and a compiled class cannot derive from two
built-in exception types; here they stay ordinary Python classes.
"""

from __future__ import annotations

from kvspec.errors import KvspecError

__all__ = ["BlockPoolError", "BlockStateError", "NotEnoughFreeBlocksError"]


class BlockPoolError(KvspecError):
    """A block pool was asked for something it cannot do."""


class NotEnoughFreeBlocksError(BlockPoolError, ValueError):
    """More blocks were asked for than the pool (or queue) has free."""


class BlockStateError(BlockPoolError, RuntimeError):
    """A block was used against its state: freed twice, not queued, another group's."""
