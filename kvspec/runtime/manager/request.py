"""A request as the manager sees it: its token counts, its blocks, its block hashes.

The manager reads a request's counts (prompt, tokens known, tokens computed,
tokens in flight) and keeps, per group, the request's block table and how
many of its blocks are cached. Prefix-cache hits compare *block hash keys*:
the key of hash block ``j`` (tokens ``[j * h, (j + 1) * h)`` at hash block
size ``h``) stands for the hash of every token up to its end. A request that
shares ``prefix_tokens`` tokens with the other requests of its prefix group
(``prefix``, a positive int) has the group's keys for the hash blocks inside
that prefix and keys of its own after it, so two requests' keys agree exactly
where their token ids (and so their chained hashes) would.

>>> a = RequestState(0, 40, prefix=7, prefix_tokens=32)
>>> b = RequestState(1, 40, prefix=7, prefix_tokens=20)
>>> [a.key(j, 16) == b.key(j, 16) for j in range(2)]
[True, False]
>>> a.key(1, 16) == RequestState(0, 40, prefix=7, prefix_tokens=32).key(1, 16)
True
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from kvspec.runtime.block_pool import Block

__all__ = ["RequestState"]

#: Keys are ``base + hash block index``; a base leaves room for 2**40 indexes. A
#: request's own keys are below zero (a pool's *private* keys), shared ones above.
_SPAN = 1 << 40


class RequestState:
    """One request's counts, block tables and hash keys (see the module docstring).

    ``tables[g]`` is the request's block table in group ``g``; ``num_cached[g]``
    how many of its blocks the manager has cached (-1: not tracked yet, as for
    a request that has not been admitted).
    """

    __slots__ = ("index", "num_prompt_tokens", "num_tokens", "num_computed_tokens",
                 "num_in_flight_tokens", "shared_prefix_boundary", "tables", "num_cached",
                 "released", "_shared_base", "_own_base", "_shared_limit")

    def __init__(self, index: int, num_prompt_tokens: int, *, prefix: int = 0,
                 prefix_tokens: int = 0) -> None:
        self.index = index
        self.num_prompt_tokens = num_prompt_tokens
        self.num_tokens = num_prompt_tokens
        self.num_computed_tokens = 0
        self.num_in_flight_tokens = 0
        #: Where a shared prefix ends that a sparse group has not cached (vLLM's
        #: Marconi junction), set at admission; 0: none.
        self.shared_prefix_boundary = 0
        self.tables: list[list[Block]] = []
        self.num_cached: list[int] = []
        #: The block table it was preempted with, where a pool with private keys
        #: finds its own keys' blocks (:meth:`KVCacheManager.free`); None: none kept.
        self.released: list[Block] | None = None
        self._shared_base = prefix * _SPAN
        self._own_base = -(index + 1) * _SPAN
        self._shared_limit = prefix_tokens if prefix > 0 else 0

    def key(self, j: int, hash_block_size: int) -> int:
        """The key of hash block ``j`` at ``hash_block_size``."""
        if (j + 1) * hash_block_size <= self._shared_limit:
            return self._shared_base + j
        return self._own_base + j

    def block_keys(self, first: int, last: int, block_size: int, hash_block_size: int
                   ) -> list[int]:
        """The keys of blocks ``first`` to ``last - 1`` at ``block_size`` (each block's
        key is its last hash block's).

        >>> r = RequestState(0, 64, prefix=1, prefix_tokens=32)
        >>> r.block_keys(0, 4, 16, 8) == [r.key(j, 8) for j in (1, 3, 5, 7)]
        True
        """
        scale = block_size // hash_block_size
        split = min(max(self._shared_limit // block_size, first), last)
        keys = list(range(self._shared_base + (first + 1) * scale - 1,
                          self._shared_base + (split + 1) * scale - 1, scale))
        keys += range(self._own_base + (split + 1) * scale - 1,
                      self._own_base + (last + 1) * scale - 1, scale)
        return keys

    @property
    def shares_keys(self) -> bool:
        """Whether some of its keys are its prefix group's (so other requests cache
        them too)."""
        return self._shared_limit > 0

    def num_hashed_tokens(self, hash_block_size: int) -> int:
        """Tokens covered by block hashes: the full hash blocks of the known tokens."""
        return self.num_tokens // hash_block_size * hash_block_size

    def reset_tables(self, num_groups: int) -> None:
        """No blocks in any group (a new or a freed request)."""
        self.tables = [[] for _ in range(num_groups)]
        self.num_cached = [-1] * num_groups
