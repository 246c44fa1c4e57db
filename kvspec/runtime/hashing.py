"""Prefix-cache block hashing, as the reference planner computes it.

A request's tokens are cut into full blocks of ``hash_block_size`` tokens. Each
block's hash covers its parent's hash, its own token ids and its *extra keys*
(LoRA name, cache salt, multimodal items, prompt-embedding digests), so the hash
of block *i* fingerprints the whole prefix ``[0, (i + 1) * hash_block_size)``::

    h0 = hash_fn((NONE_HASH, tokens[0:16],  extra_keys_0))
    h1 = hash_fn((h0,        tokens[16:32], extra_keys_1))
    ...

``NONE_HASH`` stands in for the parent of the first block. It is
``hash_fn(seed)``; the seed is ``PYTHONHASHSEED`` when set, else a fixed default
for cryptographic hash functions (so processes share a prefix cache) and fresh
random bytes for non-cryptographic ones (so nobody can precompute collisions).
Here the seed is injectable: :meth:`BlockHasher.create` takes it as an argument
and reads the environment only when told to (the default).

A pool keys cached blocks by ``(block hash, group id)`` packed into one
``bytes`` value: the hash followed by the group id as 4 big-endian bytes.

>>> hasher = BlockHasher.create("sha256_cbor", seed="0")
>>> hasher.none_hash.hex()[:16]
'4e1195df020de59e'
>>> [h.hex()[:8] for h in hasher.hash_blocks(range(100, 164), block_size=16)]
['ab58392d', 'cd789950', 'fa7257ce', '8719e6ad']

This module does not import torch.
"""

from __future__ import annotations

import bisect
import enum
import hashlib
import logging
import os
import pickle
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias, overload

import cbor2

from kvspec.errors import KvspecError

try:  # optional: only the non-cryptographic hash functions need it
    import xxhash as _xxhash

    if not hasattr(_xxhash, "xxh3_128_digest"):  # too old to have XXH3-128
        _xxhash = None
except ImportError:  # pragma: no cover - depends on the environment
    _xxhash = None

__all__ = [
    "DEFAULT_NONE_HASH_SEED",
    "FROM_ENV",
    "HASH_FUNCTIONS",
    "NON_CRYPTO_HASH_FUNCTIONS",
    "BlockHash",
    "BlockHashKey",
    "BlockHashList",
    "BlockHashListWithBlockSize",
    "BlockHasher",
    "HashFunction",
    "HashingError",
    "HashFunctionUnavailableError",
    "MultiModalFeature",
    "RequestBlockHasher",
    "RequestTokens",
    "cache_salt_extra_keys",
    "generate_block_hash_extra_keys",
    "get_block_hash",
    "get_group_id",
    "get_hash_fn",
    "get_mm_features_in_window",
    "get_none_hash_seed",
    "get_request_block_hasher",
    "hash_block_tokens",
    "init_none_hash",
    "lora_extra_keys",
    "make_block_hash_with_group_id",
    "mm_extra_keys",
    "prompt_embeds_extra_keys",
    "resolve_block_hashes",
    "resolve_none_hash_seed",
    "sha256",
    "sha256_cbor",
    "split_block_hash_with_group_id",
    "to_external_block_hash",
    "xxhash",
    "xxhash_cbor",
]

logger = logging.getLogger(__name__)

#: The digest of one block (32 bytes for sha256, 16 for xxhash).
BlockHash: TypeAlias = bytes
#: A block hash followed by its group id as 4 big-endian bytes.
BlockHashKey: TypeAlias = bytes
#: Any callable that turns a Python object into a digest.
HashFunction: TypeAlias = Callable[[Any], bytes]

#: Seed of NONE_HASH for cryptographic hash functions when PYTHONHASHSEED is unset.
DEFAULT_NONE_HASH_SEED = "vllm-none-hash"

_GROUP_ID_BYTES = 4


class HashingError(KvspecError):
    """A prefix-hashing input is invalid (group id out of range, bad block sizes)."""


class HashFunctionUnavailableError(HashingError, ImportError):
    """A hash function needs an optional package that is not installed."""


class _FromEnv(enum.Enum):
    FROM_ENV = "FROM_ENV"

    def __repr__(self) -> str:
        return "FROM_ENV"


#: Seed argument meaning "read PYTHONHASHSEED from the process environment".
FROM_ENV = _FromEnv.FROM_ENV

Seed: TypeAlias = str | None | _FromEnv


# --------------------------------------------------------------------------
# Hash functions
# --------------------------------------------------------------------------


def sha256(obj: Any) -> bytes:
    """SHA-256 of ``pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)``.

    The pickle bytes depend on the Python version's highest protocol (5 on 3.11).

    >>> sha256("0").hex()[:16]
    '1973e23848344dc4'
    """
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def sha256_cbor(obj: Any) -> bytes:
    """SHA-256 of ``cbor2.dumps(obj, canonical=True)``: language-neutral bytes.

    Tuples and lists encode alike (CBOR arrays).

    >>> sha256_cbor("0").hex()[:16]
    '4e1195df020de59e'
    >>> sha256_cbor((1, 2)) == sha256_cbor([1, 2])
    True
    """
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


def _xxh3_128(data: bytes) -> bytes:
    if _xxhash is None:
        raise HashFunctionUnavailableError(
            "the xxhash prefix-cache hash functions need the 'xxhash' package",
            hint="install it with `pip install xxhash`, or use sha256 / sha256_cbor",
        )
    return _xxhash.xxh3_128_digest(data)


def xxhash(obj: Any) -> bytes:
    """XXH3-128 of the pickled object (non-cryptographic; needs ``xxhash``).

    >>> len(xxhash("0")) if _xxhash is not None else 16
    16
    """
    return _xxh3_128(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def xxhash_cbor(obj: Any) -> bytes:
    """XXH3-128 of the canonical CBOR encoding (non-cryptographic; needs ``xxhash``).

    >>> len(xxhash_cbor("0")) if _xxhash is not None else 16
    16
    """
    return _xxh3_128(cbor2.dumps(obj, canonical=True))


#: Hash functions by the names the engine's ``prefix_caching_hash_algo`` uses.
HASH_FUNCTIONS: Mapping[str, HashFunction] = {
    "sha256": sha256,
    "sha256_cbor": sha256_cbor,
    "xxhash": xxhash,
    "xxhash_cbor": xxhash_cbor,
}

#: Hash functions that are not collision resistant: their NONE_HASH seed is random.
NON_CRYPTO_HASH_FUNCTIONS: frozenset[HashFunction] = frozenset({xxhash, xxhash_cbor})


def get_hash_fn(name: str) -> HashFunction:
    """The hash function called ``name``.

    >>> get_hash_fn("sha256_cbor") is sha256_cbor
    True
    """
    try:
        return HASH_FUNCTIONS[name]
    except KeyError:
        raise HashingError(
            f"unknown prefix-cache hash function {name!r}",
            expected=", ".join(HASH_FUNCTIONS),
            found=repr(name),
        ) from None


def _as_hash_fn(hash_fn: HashFunction | str) -> HashFunction:
    return get_hash_fn(hash_fn) if isinstance(hash_fn, str) else hash_fn


# --------------------------------------------------------------------------
# NONE_HASH seeding
# --------------------------------------------------------------------------


def resolve_none_hash_seed(
    hash_fn: HashFunction | str,
    python_hash_seed: Seed = FROM_ENV,
    *,
    urandom: Callable[[int], bytes] = os.urandom,
) -> str:
    """The seed NONE_HASH is derived from.

    ``python_hash_seed`` is the value of PYTHONHASHSEED to decide with: a string
    wins as is; ``None`` means unset, which gives the fixed
    :data:`DEFAULT_NONE_HASH_SEED` for cryptographic hash functions and 32 fresh
    random bytes (as 64 hex digits) for non-cryptographic ones; :data:`FROM_ENV`
    (the default) reads the process environment.

    >>> resolve_none_hash_seed(sha256, "0")
    '0'
    >>> resolve_none_hash_seed(sha256, None)
    'vllm-none-hash'
    >>> resolve_none_hash_seed(xxhash, None, urandom=lambda n: bytes(n))[:8]
    '00000000'
    """
    fn = _as_hash_fn(hash_fn)
    if python_hash_seed is FROM_ENV:
        python_hash_seed = os.environ.get("PYTHONHASHSEED")
    if python_hash_seed is not None:
        return python_hash_seed
    if fn in NON_CRYPTO_HASH_FUNCTIONS:
        return urandom(32).hex()
    return DEFAULT_NONE_HASH_SEED


# --------------------------------------------------------------------------
# Hashing blocks
# --------------------------------------------------------------------------


def hash_block_tokens(
    hash_fn: HashFunction,
    parent_block_hash: BlockHash | None,
    token_ids: Sequence[int],
    extra_keys: tuple[Any, ...] | None = None,
    *,
    none_hash: BlockHash | None = None,
) -> BlockHash:
    """Hash one full block: ``hash_fn((parent or NONE_HASH, tuple(token_ids), extra_keys))``.

    A missing (or empty) parent means the first block; its parent is
    ``none_hash``, or, when that is not given, this process's NONE_HASH for
    ``hash_fn`` (see :func:`init_none_hash`).

    >>> nh = sha256_cbor("0")
    >>> hash_block_tokens(sha256_cbor, None, range(100, 116), none_hash=nh).hex()[:8]
    'ab58392d'
    >>> hash_block_tokens(sha256_cbor, None, range(100, 116), ("salt-a",),
    ...                   none_hash=nh).hex()[:8]
    '0508356e'
    """
    if not parent_block_hash:
        parent_block_hash = none_hash if none_hash is not None else _process_hasher(hash_fn).none_hash
    return hash_fn((parent_block_hash, tuple(token_ids), extra_keys))


@dataclass(frozen=True, slots=True)
class BlockHasher:
    """A hash function with its NONE_HASH: everything a block hash chain needs.

    Build it with :meth:`create`, which resolves the seed.

    >>> hasher = BlockHasher.create("sha256", seed="0")
    >>> hasher.seed, hasher.none_hash.hex()[:8]
    ('0', '1973e238')
    >>> [h.hex()[:8] for h in hasher.hash_blocks(range(100, 132), block_size=16)]
    ['3e333711', '387cb577']
    """

    hash_fn: HashFunction
    seed: str
    none_hash: BlockHash

    @classmethod
    def create(
        cls,
        hash_fn: HashFunction | str = sha256,
        seed: Seed = FROM_ENV,
        *,
        urandom: Callable[[int], bytes] = os.urandom,
    ) -> BlockHasher:
        """Resolve the seed as :func:`resolve_none_hash_seed` does and hash it."""
        fn = _as_hash_fn(hash_fn)
        if seed is FROM_ENV:
            seed = os.environ.get("PYTHONHASHSEED")
        resolved = resolve_none_hash_seed(fn, seed, urandom=urandom)
        if seed is None and fn in NON_CRYPTO_HASH_FUNCTIONS:
            logger.warning(
                "NONE_HASH uses a random per-process seed because %s is not collision "
                "resistant: block hashes are not reproducible across processes. Set "
                "PYTHONHASHSEED to a shared value to share a prefix cache, or use sha256.",
                getattr(fn, "__name__", fn),
            )
        return cls(fn, resolved, fn(resolved))

    def hash_block(
        self,
        parent_block_hash: BlockHash | None,
        token_ids: Sequence[int],
        extra_keys: tuple[Any, ...] | None = None,
    ) -> BlockHash:
        """Hash one full block after ``parent_block_hash`` (None: the first block)."""
        return self.hash_fn(
            (parent_block_hash or self.none_hash, tuple(token_ids), extra_keys)
        )

    def hash_blocks(
        self,
        token_ids: Sequence[int],
        block_size: int,
        parent_block_hash: BlockHash | None = None,
    ) -> list[BlockHash]:
        """The hash chain of every full block of ``token_ids`` (no extra keys).

        A trailing partial block is not hashed.
        """
        _check_block_size(block_size, "block_size")
        tokens = tuple(token_ids)
        hashes: list[BlockHash] = []
        parent = parent_block_hash
        for start in range(0, len(tokens) - block_size + 1, block_size):
            parent = self.hash_block(parent, tokens[start : start + block_size])
            hashes.append(parent)
        return hashes


# NONE_HASH of this process, per hash function: the reference keeps one global.
_PROCESS_HASHERS: dict[HashFunction, BlockHasher] = {}


def init_none_hash(hash_fn: HashFunction | str, seed: Seed = FROM_ENV) -> BlockHasher:
    """Set this process's NONE_HASH for ``hash_fn`` and return its hasher.

    :func:`hash_block_tokens` falls back to it when given no ``none_hash``;
    without a call here it is made from the environment on first use.

    >>> init_none_hash(sha256_cbor, seed="0").none_hash == sha256_cbor("0")
    True
    >>> get_none_hash_seed(sha256_cbor)
    '0'
    """
    hasher = BlockHasher.create(hash_fn, seed)
    _PROCESS_HASHERS[hasher.hash_fn] = hasher
    return hasher


def _process_hasher(hash_fn: HashFunction) -> BlockHasher:
    hasher = _PROCESS_HASHERS.get(hash_fn)
    if hasher is None:
        hasher = _PROCESS_HASHERS.setdefault(hash_fn, BlockHasher.create(hash_fn))
    return hasher


def get_none_hash_seed(hash_fn: HashFunction | str) -> str:
    """The seed this process's NONE_HASH for ``hash_fn`` came from.

    Before :func:`init_none_hash` (or a first hash) it is the fixed default.
    """
    hasher = _PROCESS_HASHERS.get(_as_hash_fn(hash_fn))
    return DEFAULT_NONE_HASH_SEED if hasher is None else hasher.seed


# --------------------------------------------------------------------------
# (hash, group id) keys
# --------------------------------------------------------------------------


def make_block_hash_with_group_id(block_hash: BlockHash, group_id: int) -> BlockHashKey:
    """Pack a block hash and a group id: the hash, then the id as 4 big-endian bytes.

    >>> make_block_hash_with_group_id(b"\\xab\\xcd", 3).hex()
    'abcd00000003'
    """
    if not 0 <= group_id < 1 << (8 * _GROUP_ID_BYTES):
        raise HashingError(
            f"group id {group_id} does not fit the block hash key",
            expected=f"0 <= group id < 2**{8 * _GROUP_ID_BYTES}",
            found=str(group_id),
        )
    return block_hash + group_id.to_bytes(_GROUP_ID_BYTES, "big")


def get_block_hash(key: BlockHashKey) -> BlockHash:
    """The block hash part of a (hash, group id) key.

    >>> get_block_hash(bytes.fromhex("abcd00000003")).hex()
    'abcd'
    """
    return key[:-_GROUP_ID_BYTES]


def get_group_id(key: BlockHashKey) -> int:
    """The group id part of a (hash, group id) key.

    >>> get_group_id(bytes.fromhex("abcd00000003"))
    3
    """
    return int.from_bytes(key[-_GROUP_ID_BYTES:], "big")


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


# --------------------------------------------------------------------------
# Request data and extra keys
# --------------------------------------------------------------------------


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

    >>> hasher = RequestBlockHasher(16, BlockHasher.create("sha256_cbor", seed="0"))
    >>> req = RequestTokens(range(100, 140))
    >>> first = hasher(req)
    >>> [h.hex()[:8] for h in first]
    ['ab58392d', 'cd789950']
    >>> hasher(RequestTokens(range(100, 148)), first)[0].hex()[:8]
    'fa7257ce'
    """

    hash_block_size: int
    hasher: BlockHasher

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
        for start in range(start, num_tokens - size + 1, size):
            end = start + size
            extra_keys, mm_idx = generate_block_hash_extra_keys(request, start, end, mm_idx)
            parent = hash_block(parent, tokens[start:end], extra_keys)
            new_hashes.append(parent)
        return new_hashes


def get_request_block_hasher(
    hash_block_size: int, hash_fn: HashFunction | str = sha256, *, seed: Seed = FROM_ENV
) -> RequestBlockHasher:
    """A :class:`RequestBlockHasher` for ``hash_fn`` with a freshly resolved NONE_HASH.

    >>> hasher = get_request_block_hasher(16, "sha256_cbor", seed="0")
    >>> hasher(RequestTokens(range(100, 116)))[0].hex()[:8]
    'ab58392d'
    """
    return RequestBlockHasher(hash_block_size, BlockHasher.create(hash_fn, seed))


# --------------------------------------------------------------------------
# Coarser-group views of a hash list
# --------------------------------------------------------------------------


def _check_block_size(value: int, name: str) -> None:
    if not isinstance(value, int) or value <= 0:
        raise HashingError(f"{name} must be a positive integer", found=repr(value))


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
        _check_block_size(hash_block_size, "hash_block_size")
        _check_block_size(target_block_size, "target_block_size")
        if target_block_size % hash_block_size:
            raise HashingError(
                f"block size {target_block_size} is not a multiple of the hash block "
                f"size {hash_block_size}",
                expected=f"a multiple of {hash_block_size}",
                found=str(target_block_size),
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
            raise TypeError(f"block hash list indices must be int or slice, not {type(idx).__name__}")
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
