"""Prefix-cache block hash keys, and coarser-group views of a block hash list.

A pool keys cached blocks by ``(block hash, group id)`` packed into one
``bytes`` value: the hash followed by the group id as 4 big-endian bytes, so a
key is made by one concatenation and no tuple.

>>> key = make_block_hash_with_group_id(b"\\xab\\xcd", 3)
>>> key.hex(), split_block_hash_with_group_id(key)
('abcd00000003', (b'\\xab\\xcd', 3))

Block hashes are computed once per request at the pool's ``hash_block_size``;
a group whose blocks are a multiple of that size reads them through a view
instead of hashing again (the reference's ``BlockHashListWithBlockSize``).

>>> list(BlockHashListWithBlockSize([b"A", b"B", b"C", b"D"], 16, 32))
[b'B', b'D']

kvspec computes no token hashes itself: the request-level manager keys blocks by
ints derived from the request (:mod:`kvspec.runtime.manager.request`), and a
serving engine hashes with its own functions. This module does not import torch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeAlias, overload

from kvspec.errors import KvspecError

__all__ = [
    "BlockHash",
    "BlockHashKey",
    "BlockHashList",
    "BlockHashListWithBlockSize",
    "CacheKey",
    "HashingError",
    "get_block_hash",
    "get_group_id",
    "make_block_hash_with_group_id",
    "resolve_block_hashes",
    "split_block_hash_with_group_id",
]

#: The digest of one block (32 bytes for sha256, 16 for xxhash).
BlockHash: TypeAlias = bytes
#: A block hash followed by its group id as 4 big-endian bytes.
BlockHashKey: TypeAlias = bytes
#: What a pool caches a block under: a block hash, or the int key a request-level
#: manager derives from the request's tokens (:mod:`kvspec.runtime.manager`).
CacheKey: TypeAlias = BlockHash | int

#: How many bytes of a key hold the group id (big-endian).
GROUP_ID_BYTES = 4


class HashingError(KvspecError):
    """A prefix-hashing input is invalid (group id out of range, bad block sizes)."""


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


class BlockHashListWithBlockSize(Sequence[BlockHash]):
    """A hash list computed at ``hash_block_size``, seen at ``target_block_size``.

    The target size must be a multiple of the hash size. Every fine hash
    already chains over its whole prefix, so the hash of coarse block *i* is the
    fine hash at the last fine boundary inside it: ``hashes[(i + 1) * scale - 1]``.
    Nothing is copied; a trailing partial coarse block is not part of the view.

    >>> view = BlockHashListWithBlockSize([b"A", b"B", b"C", b"D", b"E"], 16, 32)
    >>> len(view), list(view), view[-1], view[0:2]
    (2, [b'B', b'D'], b'D', [b'B', b'D'])
    """

    __slots__ = ("block_hashes", "scale_factor")

    def __init__(
        self, block_hashes: Sequence[BlockHash], hash_block_size: int, target_block_size: int
    ) -> None:
        check_block_size(hash_block_size, "hash_block_size")
        check_block_size(target_block_size, "target_block_size")
        if target_block_size % hash_block_size:
            raise HashingError(
                f"block size {target_block_size} is not a multiple of the hash block "
                f"size {hash_block_size}",
                expected=f"a multiple of {hash_block_size}",
                found=str(target_block_size),
                hint="hash at the smallest block size of the layout's groups",
            )
        self.block_hashes = block_hashes
        self.scale_factor = target_block_size // hash_block_size

    def __len__(self) -> int:
        return len(self.block_hashes) // self.scale_factor

    @overload
    def __getitem__(self, idx: int) -> BlockHash: ...

    @overload
    def __getitem__(self, idx: slice) -> list[BlockHash]: ...

    def __getitem__(self, idx: int | slice) -> BlockHash | list[BlockHash]:
        if isinstance(idx, slice):
            return [self._at(i) for i in range(*idx.indices(len(self)))]
        if not isinstance(idx, int):
            raise TypeError("block hash list indices must be int or slice, "
                            f"not {type(idx).__name__}")
        n = len(self)
        if idx < 0:
            idx += n
        if not 0 <= idx < n:
            raise IndexError("block hash index out of range")
        return self._at(idx)

    def __iter__(self) -> Iterator[BlockHash]:
        hashes, scale = self.block_hashes, self.scale_factor
        for i in range(scale - 1, len(hashes) // scale * scale, scale):
            yield hashes[i]

    def _at(self, idx: int) -> BlockHash:
        return self.block_hashes[(idx + 1) * self.scale_factor - 1]

    def __repr__(self) -> str:
        return f"BlockHashListWithBlockSize(<{len(self)} blocks>, scale_factor={self.scale_factor})"


BlockHashList: TypeAlias = list[BlockHash] | BlockHashListWithBlockSize


def resolve_block_hashes(
    block_hashes: Sequence[BlockHash],
    hash_block_size: int,
    block_size: int,
    *,
    supports_fine_grained_hash_lookup: bool = False,
    alignment_tokens: int | None = None,
) -> Sequence[BlockHash]:
    """The hash list a group of ``block_size`` looks blocks up with.

    Same size: the list itself. An existing view is returned as it is (its scale
    must match). Fine-grained lookup (partial hits at ``alignment_tokens`` below
    ``block_size`` that divides it) keeps the fine hashes. Otherwise a
    :class:`BlockHashListWithBlockSize` view.

    >>> hashes = [b"A", b"B", b"C", b"D"]
    >>> resolve_block_hashes(hashes, 16, 16) is hashes
    True
    >>> list(resolve_block_hashes(hashes, 16, 32))
    [b'B', b'D']
    >>> resolve_block_hashes(hashes, 16, 32, supports_fine_grained_hash_lookup=True,
    ...                      alignment_tokens=16) is hashes
    True
    """
    if block_size == hash_block_size:
        return block_hashes
    if isinstance(block_hashes, BlockHashListWithBlockSize):
        if block_hashes.scale_factor * hash_block_size != block_size:
            raise HashingError(
                "the block hash view was made for another block size",
                expected=str(block_size),
                found=str(block_hashes.scale_factor * hash_block_size),
                hint="pass the request's own block hashes, not a view made for another group",
            )
        return block_hashes
    if (
        supports_fine_grained_hash_lookup
        and alignment_tokens is not None
        and alignment_tokens < block_size
        and block_size % alignment_tokens == 0
    ):
        return block_hashes
    return BlockHashListWithBlockSize(block_hashes, hash_block_size, block_size)
