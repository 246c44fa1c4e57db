"""Prompts made of content blocks: Mooncake's ``hash_ids``, shared block for block.

A trace request with ``prefix_blocks`` (:mod:`kvspec.sim.trace`) declares its
prompt as blocks of ``prefix_block_tokens`` tokens, block ``k`` holding content
``prefix_blocks[k]``. Two requests hold the same tokens up to the end of the
longest run of equal blocks they open with, as a hash chain sees it: block ``k``
is shared only when blocks ``0 .. k`` all are. Each block is given a *chain
code*: the same code for the same (code of the block before, id) pair, numbered
by first use after the trace's named prefixes; the manager's hash key of a hash
block is then its covering block's code (:class:`ChainRequest`), and the vLLM
replay's token ids are too (:func:`chain_token_id`). Tokens past the blocks, or
past the prompt inside its last block, are the request's own.

>>> chains = Chains(first_code=1)
>>> chains.codes((7, 8)), chains.codes((7, 9)), chains.codes((8,))
((1, 2), (1, 3), (4,))
>>> a = ChainRequest(0, 1024, 8, chain=(1, 2), block_tokens=512)
>>> b = ChainRequest(1, 1024, 8, chain=(1, 3), block_tokens=512)
>>> [a.key(j, 256) == b.key(j, 256) for j in range(4)]
[True, True, False, False]
"""

from __future__ import annotations

from kvspec.sim.request import SimRequest

__all__ = ["ChainRequest", "Chains", "chain_token_id"]

#: Keys are ``code * _SPAN + hash block index`` (as :mod:`kvspec.runtime.manager.request`).
_SPAN = 1 << 40


class Chains:
    """Chain codes by (code of the block before, block id), numbered from ``first_code``."""

    __slots__ = ("_table", "_next")

    def __init__(self, first_code: int) -> None:
        self._table: dict[tuple[int, int], int] = {}
        self._next = first_code

    def codes(self, blocks: tuple[int, ...]) -> tuple[int, ...]:
        """The chain code of each of ``blocks`` (a prompt's content blocks, in order)."""
        out = []
        parent = 0
        table = self._table
        for block in blocks:
            code = table.get((parent, block))
            if code is None:
                code = table[(parent, block)] = self._next
                self._next += 1
            out.append(code)
            parent = code
        return tuple(out)


class ChainRequest(SimRequest):
    """A :class:`~kvspec.sim.request.SimRequest` whose prompt is content blocks: the
    key of hash block ``j`` is its covering block's chain code while the block lies
    inside both the blocks and the prompt, the request's own after."""

    __slots__ = ("_chain", "_block_tokens", "_chain_limit")

    def __init__(self, index: int, prompt: int, output: int, *, chain: tuple[int, ...],
                 block_tokens: int, arrival: int = 0) -> None:
        super().__init__(index, prompt, output, arrival=arrival)
        self._chain = chain
        self._block_tokens = block_tokens
        self._chain_limit = min(prompt, len(chain) * block_tokens)

    @property
    def shares_keys(self) -> bool:
        """Whether other requests may cache its keys: its content blocks are keyed by
        chain codes that any request opening with the same blocks holds too (so the
        manager never skips its prefix-cache lookup)."""
        return self._chain_limit > 0

    def key(self, j: int, hash_block_size: int) -> int:
        end = (j + 1) * hash_block_size
        if end <= self._chain_limit:
            return self._chain[(end - 1) // self._block_tokens] * _SPAN + j
        return self._own_base + j

    def block_keys(self, first: int, last: int, block_size: int, hash_block_size: int
                   ) -> list[int]:
        scale = block_size // hash_block_size
        key = self.key
        return [key((i + 1) * scale - 1, hash_block_size) for i in range(first, last)]


def chain_token_id(index: int, position: int, chain: tuple[int, ...], block_tokens: int,
                   limit: int, first_free: int) -> int:
    """The synthetic token id at ``position`` of request ``index`` whose prompt is the
    blocks of ``chain`` (codes), ``limit`` tokens of them: a block's code inside it, the
    request's own id (from ``first_free``, past every code and request) after it."""
    if position < limit:
        return (chain[position // block_tokens] << 40) | position
    return ((first_free + index) << 40) | position
