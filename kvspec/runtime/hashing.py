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

This module holds the hash functions, the seeding and :class:`BlockHasher`;
``hashing_keys`` the types, errors and (hash, group id) keys, ``hashing_request``
a request's extra keys and :class:`RequestBlockHasher`, ``hashing_views`` the
coarser-group views. Every name is importable from here.

>>> hasher = BlockHasher.create("sha256_cbor", seed="0")
>>> hasher.none_hash.hex()[:16]
'4e1195df020de59e'
>>> [h.hex()[:8] for h in hasher.hash_blocks(range(100, 164), block_size=16)]
['ab58392d', 'cd789950', 'fa7257ce', '8719e6ad']

This module does not import torch.
"""

from __future__ import annotations

import enum
import hashlib
import logging
import os
import pickle
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, TypeAlias

import cbor2

from kvspec.runtime.hashing_keys import (
    BlockHash,
    BlockHashKey,
    HashFunction,
    HashFunctionUnavailableError,
    HashingError,
    get_block_hash,
    get_group_id,
    make_block_hash_with_group_id,
    split_block_hash_with_group_id,
    to_external_block_hash,
)
from kvspec.runtime.hashing_keys import check_block_size as _check_block_size
from kvspec.runtime.hashing_request import (
    MultiModalFeature,
    RequestBlockHasher,
    RequestTokens,
    cache_salt_extra_keys,
    generate_block_hash_extra_keys,
    get_mm_features_in_window,
    lora_extra_keys,
    mm_extra_keys,
    prompt_embeds_extra_keys,
)
from kvspec.runtime.hashing_views import (
    BlockHashList,
    BlockHashListWithBlockSize,
    resolve_block_hashes,
)

_xxhash: ModuleType | None
try:  # optional: only the non-cryptographic hash functions need it
    import xxhash as _xxhash_module

    # too old to have XXH3-128: as if absent
    _xxhash = _xxhash_module if hasattr(_xxhash_module, "xxh3_128_digest") else None
except ImportError:  # pragma: no cover - depends on the environment
    _xxhash = None

__all__ = [
    "DEFAULT_NONE_HASH_SEED", "FROM_ENV", "HASH_FUNCTIONS", "NON_CRYPTO_HASH_FUNCTIONS",
    "BlockHash", "BlockHashKey", "BlockHashList", "BlockHashListWithBlockSize", "BlockHasher",
    "HashFunction", "HashingError", "HashFunctionUnavailableError", "MultiModalFeature",
    "RequestBlockHasher", "RequestTokens", "cache_salt_extra_keys",
    "generate_block_hash_extra_keys", "get_block_hash", "get_group_id", "get_hash_fn",
    "get_mm_features_in_window", "get_none_hash_seed", "get_request_block_hasher",
    "hash_block_tokens", "init_none_hash", "lora_extra_keys", "make_block_hash_with_group_id",
    "mm_extra_keys", "prompt_embeds_extra_keys", "resolve_block_hashes",
    "resolve_none_hash_seed", "sha256", "sha256_cbor", "split_block_hash_with_group_id",
    "to_external_block_hash", "xxhash", "xxhash_cbor",
]

logger = logging.getLogger(__name__)

#: Seed of NONE_HASH for cryptographic hash functions when PYTHONHASHSEED is unset.
DEFAULT_NONE_HASH_SEED = "vllm-none-hash"


class _FromEnv(enum.Enum):
    FROM_ENV = "FROM_ENV"

    def __repr__(self) -> str:
        return "FROM_ENV"


#: Seed argument meaning "read PYTHONHASHSEED from the process environment".
FROM_ENV = _FromEnv.FROM_ENV

Seed: TypeAlias = str | _FromEnv | None


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
            hint="vLLM's --prefix-caching-hash-algo names them; sha256 is its default",
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
        parent_block_hash = (none_hash if none_hash is not None
                             else _process_hasher(hash_fn).none_hash)
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


def get_request_block_hasher(
    hash_block_size: int, hash_fn: HashFunction | str = sha256, *, seed: Seed = FROM_ENV
) -> RequestBlockHasher:
    """A :class:`RequestBlockHasher` for ``hash_fn`` with a freshly resolved NONE_HASH.

    >>> hasher = get_request_block_hasher(16, "sha256_cbor", seed="0")
    >>> hasher(RequestTokens(range(100, 116)))[0].hex()[:8]
    'ab58392d'
    """
    return RequestBlockHasher(hash_block_size, BlockHasher.create(hash_fn, seed))
