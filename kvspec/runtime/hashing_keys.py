"""Prefix-hashing vocabulary: block hash types, hashing errors, (hash, group id) keys.

A pool keys cached blocks by ``(block hash, group id)`` packed into one
``bytes`` value: the hash followed by the group id as 4 big-endian bytes, so a
key is made by one concatenation and no tuple.

>>> key = make_block_hash_with_group_id(b"\\xab\\xcd", 3)
>>> key.hex(), split_block_hash_with_group_id(key)
('abcd00000003', (b'\\xab\\xcd', 3))

This module does not import torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeAlias

from kvspec.errors import KvspecError

__all__ = [
    "BlockHash",
    "BlockHashKey",
    "HashFunction",
    "HashFunctionUnavailableError",
    "HashingError",
    "get_block_hash",
    "get_group_id",
    "make_block_hash_with_group_id",
    "split_block_hash_with_group_id",
    "to_external_block_hash",
]

#: The digest of one block (32 bytes for sha256, 16 for xxhash).
BlockHash: TypeAlias = bytes
#: A block hash followed by its group id as 4 big-endian bytes.
BlockHashKey: TypeAlias = bytes
#: What a pool caches a block under: a block hash, or the int key a request-level
#: manager derives from the request's tokens (:mod:`kvspec.runtime.manager`).
CacheKey: TypeAlias = BlockHash | int
#: Any callable that turns a Python object into a digest.
HashFunction: TypeAlias = Callable[[Any], bytes]

#: How many bytes of a key hold the group id (big-endian).
GROUP_ID_BYTES = 4


class HashingError(KvspecError):
    """A prefix-hashing input is invalid (group id out of range, bad block sizes)."""


# ImportError's writable ``path`` (the module file) is shadowed by KvspecError's read-only
# ``path`` (where in the input): this error is never about a module file.
class HashFunctionUnavailableError(HashingError, ImportError):  # type: ignore[override]
    """A hash function needs an optional package that is not installed."""


def check_block_size(value: int, name: str) -> None:
    """Raise :class:`HashingError` unless ``value`` is a positive integer.

    >>> check_block_size(16, "block_size")
    """
    if not isinstance(value, int) or value <= 0:
        raise HashingError(f"{name} must be a positive integer", found=repr(value),
                           hint="a block size in tokens, e.g. 16")


def make_block_hash_with_group_id(block_hash: BlockHash, group_id: int) -> BlockHashKey:
    """Pack a block hash and a group id: the hash, then the id as 4 big-endian bytes.

    >>> make_block_hash_with_group_id(b"\\xab\\xcd", 3).hex()
    'abcd00000003'
    """
    if not 0 <= group_id < 1 << (8 * GROUP_ID_BYTES):
        raise HashingError(
            f"group id {group_id} does not fit the block hash key",
            expected=f"0 <= group id < 2**{8 * GROUP_ID_BYTES}",
            found=str(group_id),
            hint="group ids are the layout's, 0 to len(artifact.layout.groups) - 1",
        )
    return block_hash + group_id.to_bytes(GROUP_ID_BYTES, "big")


def get_block_hash(key: BlockHashKey) -> BlockHash:
    """The block hash part of a (hash, group id) key.

    >>> get_block_hash(bytes.fromhex("abcd00000003")).hex()
    'abcd'
    """
    return key[:-GROUP_ID_BYTES]


def get_group_id(key: BlockHashKey) -> int:
    """The group id part of a (hash, group id) key.

    >>> get_group_id(bytes.fromhex("abcd00000003"))
    3
    """
    return int.from_bytes(key[-GROUP_ID_BYTES:], "big")


def split_block_hash_with_group_id(key: BlockHashKey) -> tuple[BlockHash, int]:
    """Both parts of a (hash, group id) key.

    >>> split_block_hash_with_group_id(bytes.fromhex("abcd00000003"))
    (b'\\xab\\xcd', 3)
    """
    return get_block_hash(key), get_group_id(key)


def to_external_block_hash(block_hash: BlockHash, *, as_int: bool = False) -> bytes | int:
    """The hash as published in KV events: the bytes, or their low 64 bits as an int.

    >>> to_external_block_hash(bytes.fromhex("ff" + "00" * 7 + "01"), as_int=True)
    1
    """
    if not as_int:
        return block_hash
    return int.from_bytes(block_hash, "big") & ((1 << 64) - 1)
