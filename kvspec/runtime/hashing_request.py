"""A request's block hashes: the fields they depend on, their extra keys, the hasher.

Each block's hash covers its parent's hash, its own token ids and its *extra
keys*: the LoRA name, the multimodal items it touches (with their offset
inside the block), the cache salt (first block only) and the digest of its
prompt-embedding rows, in that order; no extra keys gives ``None``.

>>> from kvspec.runtime.hashing import BlockHasher
>>> hasher = RequestBlockHasher(16, BlockHasher.create("sha256_cbor", seed="0"))
>>> [h.hex()[:8] for h in hasher(RequestTokens(range(100, 132)))]
['ab58392d', 'cd789950']

This module does not import torch.
"""

from __future__ import annotations

import bisect
import hashlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvspec.runtime.hashing_keys import BlockHash, HashingError
from kvspec.runtime.hashing_keys import check_block_size as _check_block_size


class HashesBlocks(Protocol):
    """What a request's hasher needs of :class:`kvspec.runtime.hashing.BlockHasher`."""

    def hash_block(self, parent_block_hash: BlockHash | None, token_ids: Sequence[int],
                   extra_keys: tuple[Any, ...] | None = None) -> BlockHash: ...

__all__ = [
    "MultiModalFeature",
    "RequestBlockHasher",
    "RequestTokens",
    "cache_salt_extra_keys",
    "generate_block_hash_extra_keys",
    "get_mm_features_in_window",
    "lora_extra_keys",
    "mm_extra_keys",
    "prompt_embeds_extra_keys",
]


@dataclass(frozen=True, slots=True)
class MultiModalFeature:
    """A multimodal item placed in the prompt: its identifier (content hash) and
    the token range ``[offset, offset + length)`` its placeholders occupy."""

    identifier: str
    offset: int
    length: int

    @property
    def end(self) -> int:
        return self.offset + self.length


@dataclass(frozen=True, slots=True)
class RequestTokens:
    """The fields of a request that its block hashes depend on.

    ``mm_features`` must be sorted by offset and must not overlap.
    ``prompt_embeds`` holds one ``bytes`` row per prompt token (the raw bytes of
    that token's embedding), or a torch tensor ``[num_tokens, hidden]`` (read
    without this module importing torch); a block's extra key is the SHA-256 of
    its rows' bytes, row after row.

    >>> RequestTokens(range(3), lora_name="sql").token_ids
    (0, 1, 2)
    """

    token_ids: Sequence[int]
    lora_name: str | None = None
    cache_salt: str | None = None
    mm_features: Sequence[MultiModalFeature] = ()
    prompt_embeds: Any = None
    _embeds_hashes: dict[tuple[int, int], bytes] = field(
        default_factory=dict, init=False, repr=False, compare=False, hash=False
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "token_ids", tuple(self.token_ids))
        object.__setattr__(self, "mm_features", tuple(self.mm_features))

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


def get_mm_features_in_window(
    mm_features: Sequence[MultiModalFeature], start: int, end: int
) -> tuple[int, int]:
    """Index range ``[lo, hi)`` of the (sorted) features overlapping tokens ``[start, end)``.

    >>> feats = [MultiModalFeature("a", 2, 4), MultiModalFeature("b", 10, 4)]
    >>> get_mm_features_in_window(feats, 4, 12)
    (0, 2)
    >>> get_mm_features_in_window(feats, 6, 10)
    (1, 1)
    """
    lo = bisect.bisect_right(mm_features, start, key=lambda f: f.offset + f.length)
    hi = bisect.bisect_left(mm_features, end, key=lambda f: f.offset)
    return lo, hi


def mm_extra_keys(
    request: RequestTokens, start_token_idx: int, end_token_idx: int, start_mm_idx: int
) -> tuple[list[Any], int]:
    """Extra keys of the multimodal items in block ``[start, end)``, and the next item index.

    Each item the block touches adds ``(identifier, offset - start)``: its start
    relative to the block, so the same item at another position hashes apart.
    ``start_mm_idx`` may be negative (counted from the end).

    >>> req = RequestTokens(range(32), mm_features=[MultiModalFeature("img", 4, 20)])
    >>> mm_extra_keys(req, 0, 16, 0)
    ([('img', 4)], 0)
    >>> mm_extra_keys(req, 16, 32, 0)
    ([('img', -12)], 1)
    """
    keys: list[Any] = []
    features = request.mm_features
    if not features or features[-1].end <= start_token_idx:
        return keys, start_mm_idx
    if start_mm_idx < 0:
        if -start_mm_idx > len(features):
            raise HashingError(
                f"multimodal index {start_mm_idx} is out of range",
                expected=f">= {-len(features)}",
                found=str(start_mm_idx),
                hint="count from the request's first multimodal feature (0), or from "
                "its last (-1)",
            )
        start_mm_idx += len(features)
    idx = start_mm_idx
    while idx < len(features):
        feature = features[idx]
        if end_token_idx <= feature.offset:
            break  # the block ends before this item starts
        if start_token_idx >= feature.end:
            idx += 1  # the block starts after this item
            continue
        keys.append((feature.identifier, feature.offset - start_token_idx))
        if end_token_idx >= feature.end:
            idx += 1  # the item ends here; the block may hold the next one too
        else:
            break  # the item goes on past this block
    return keys, idx


def lora_extra_keys(request: RequestTokens) -> list[str]:
    """``[lora_name]`` for a LoRA request, else ``[]``.

    >>> lora_extra_keys(RequestTokens([], lora_name="sql")), lora_extra_keys(RequestTokens([]))
    (['sql'], [])
    """
    return [] if request.lora_name is None else [request.lora_name]


def cache_salt_extra_keys(request: RequestTokens, start_token_idx: int) -> list[str]:
    """``[cache_salt]`` for the first block of a salted request, else ``[]``.

    >>> req = RequestTokens([], cache_salt="s")
    >>> cache_salt_extra_keys(req, 0), cache_salt_extra_keys(req, 16)
    (['s'], [])
    """
    if start_token_idx == 0 and request.cache_salt:
        return [request.cache_salt]
    return []


def _embed_rows_bytes(prompt_embeds: Any, start: int, end: int) -> bytes:
    rows = prompt_embeds[start:end]
    module = type(rows).__module__ or ""
    if module.startswith("torch"):
        torch = sys.modules["torch"]  # a tensor exists, so torch is imported
        flat = rows.flatten().cpu().contiguous().view(torch.uint8)  # (rows * hidden * itemsize,)
        try:
            return bytes(flat.numpy().data)
        except (RuntimeError, ImportError):  # torch built without numpy
            return bytes(flat.tolist())
    return b"".join(bytes(row) for row in rows)


def prompt_embeds_extra_keys(
    request: RequestTokens, start_token_idx: int, end_token_idx: int
) -> list[bytes]:
    """``[sha256(bytes of the block's prompt-embedding rows)]``, or ``[]`` without embeds.

    >>> req = RequestTokens(range(2), prompt_embeds=[b"\\x00\\x01", b"\\x02\\x03"])
    >>> prompt_embeds_extra_keys(req, 0, 2) == [hashlib.sha256(bytes(range(4))).digest()]
    True
    """
    if request.prompt_embeds is None:
        return []
    span = (start_token_idx, end_token_idx)
    digest = request._embeds_hashes.get(span)
    if digest is None:
        data = _embed_rows_bytes(request.prompt_embeds, start_token_idx, end_token_idx)
        digest = hashlib.sha256(data).digest()
        request._embeds_hashes[span] = digest
    return [digest]


def generate_block_hash_extra_keys(
    request: RequestTokens, start_token_idx: int, end_token_idx: int, start_mm_idx: int
) -> tuple[tuple[Any, ...] | None, int]:
    """All extra keys of block ``[start, end)`` and the next multimodal index.

    The order is LoRA name, multimodal items, cache salt, prompt-embedding
    digest; no keys at all gives ``None`` (not an empty tuple).

    >>> req = RequestTokens(range(32), lora_name="sql", cache_salt="s")
    >>> generate_block_hash_extra_keys(req, 0, 16, 0)
    (('sql', 's'), 0)
    >>> generate_block_hash_extra_keys(RequestTokens(range(32)), 0, 16, 0)
    (None, 0)
    """
    mm_keys, next_mm_idx = mm_extra_keys(request, start_token_idx, end_token_idx, start_mm_idx)
    keys = (
        lora_extra_keys(request)
        + mm_keys
        + cache_salt_extra_keys(request, start_token_idx)
        + prompt_embeds_extra_keys(request, start_token_idx, end_token_idx)
    )
    return (tuple(keys) if keys else None), next_mm_idx


@dataclass(frozen=True, slots=True)
class RequestBlockHasher:
    """Hashes the new full blocks of a request at ``hash_block_size``.

    Call it with the request and the hashes already computed for it; it returns
    the hashes of the full blocks after those (a partial tail is not hashed).

    >>> from kvspec.runtime.hashing import BlockHasher
    >>> hasher = RequestBlockHasher(16, BlockHasher.create("sha256_cbor", seed="0"))
    >>> req = RequestTokens(range(100, 140))
    >>> first = hasher(req)
    >>> [h.hex()[:8] for h in first]
    ['ab58392d', 'cd789950']
    >>> hasher(RequestTokens(range(100, 148)), first)[0].hex()[:8]
    'fa7257ce'
    """

    hash_block_size: int
    hasher: HashesBlocks

    def __post_init__(self) -> None:
        _check_block_size(self.hash_block_size, "hash_block_size")

    def __call__(
        self, request: RequestTokens, block_hashes: Sequence[BlockHash] = ()
    ) -> list[BlockHash]:
        size = self.hash_block_size
        start = len(block_hashes) * size
        num_tokens = request.num_tokens
        if start + size > num_tokens:
            return []

        mm_idx = 0
        features = request.mm_features
        if start > 0 and features and features[-1].end > start:
            mm_idx, _ = get_mm_features_in_window(features, start, start + size)

        parent = block_hashes[-1] if block_hashes else None
        tokens = request.token_ids
        hash_block = self.hasher.hash_block
        new_hashes: list[BlockHash] = []
        for begin in range(start, num_tokens - size + 1, size):
            end = begin + size
            extra_keys, mm_idx = generate_block_hash_extra_keys(request, begin, end, mm_idx)
            parent = hash_block(parent, tokens[begin:end], extra_keys)
            new_hashes.append(parent)
        return new_hashes
