"""State groups (Mamba, linear attention, short convolutions): one state per request.

A state does not grow with the tokens: the request needs the state after its
last computed token. What the group keeps depends on the cache mode:

* ``none`` -- the state in one block (the block size is the maximum length),
  no prefix caching (vLLM runs such models with caching off);
* ``align`` -- vLLM 0.33's prefix-caching mode: a block per ``block_size``
  tokens, null blocks before the last states. When the computed tokens cross
  a block boundary, a new block takes the state and the one before it is
  freed a step later (it is the source of the copy). Only states a later
  request can resume at are cached: the prompt's replay boundary (one token
  short of the prompt) and a shared prefix's end (``prefix_cache_retention_interval``
  0, vLLM's default). A hit is the rightmost cached boundary;
* ``all`` -- kvspec's model of the reference planner's mode (vLLM 0.33 has none):
  every boundary's state is kept and cached, like full attention's blocks,
  and a hit is the rightmost cached boundary.

Chunks of an ``align`` request's prefill end on block boundaries (the
scheduler's split, :mod:`kvspec.sim.schedule`); a state cached by another
request in the same step is not hit until the next step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvspec.model.specs.state import (
    mamba_prefill_checkpoint_position,
    mamba_prefill_checkpoint_valid,
)
from kvspec.runtime.manager import lookup
from kvspec.runtime.manager.single import GroupManager, cdiv
from kvspec.runtime.manager.spec import ManagedGroup, ManagedLayout, ManagerError

if TYPE_CHECKING:  # pragma: no cover
    from kvspec.runtime.block_pool import Block, BlockPool
    from kvspec.runtime.manager.request import RequestState

__all__ = ["StateManager"]


class StateManager(GroupManager):
    """vLLM's ``MambaManager`` in modes ``none`` and ``align``, and mode ``all``."""

    def __init__(self, gid: int, group: ManagedGroup, pool: BlockPool,
                 layout: ManagedLayout, caching: bool) -> None:
        super().__init__(gid, group, pool, layout, caching)
        self.mode = group.state_mode
        self.spec_blocks = group.speculative_blocks
        if self.mode == "none" and self.cacheable:
            raise ManagerError(f"group {group.name!r}: state cache mode 'none' with prefix "
                               "caching", hint="vLLM caches states only in mode 'align'; "
                               "turn prefix caching off or use mode 'align'")
        if self.mode == "align" and self.spec_blocks:
            raise ManagerError(f"group {group.name!r}: speculative state blocks in mode "
                               "'align' are not modelled", found=f"{self.spec_blocks}",
                               hint="simulate without speculative decoding")
        #: Prefill checkpoints: the final chunk of a prompt exports the state at the
        #: prompt's last boundary into a block of its own (mode align).
        self.has_checkpoints = self.mode == "align" and group.checkpoint_blocks > 0
        self.checkpoint_alignment = group.checkpoint_alignment
        #: Per request index: (checkpoint position, its block's index in the table).
        self.checkpoints: dict[int, tuple[int, int]] = {}
        #: Keys this group cached in the current step (not hit before the next one).
        self.cached_this_step: set[int] = set()
        #: Mode align, per request index: the state block of the step before, the
        #: blocks up to which the table is retired, whether blocks were allocated.
        self.last_state: dict[int, int] = {}
        self.retired: dict[int, int] = {}
        self.allocated: set[int] = set()

    def skipped_tokens(self, num_computed: int) -> int:
        return 0 if self.mode == "all" else num_computed - 1

    # -- allocation -------------------------------------------------------
    def blocks_needed(self, r: RequestState, num_tokens: int, hits: list[Block],
                      total: int, main: int, admission: bool = False) -> int:
        if hits and hits[-1]._hash in self.cached_this_step:
            return self.pool.num_blocks + 1  # computed this step: next step
        if self.mode != "align":
            return super().blocks_needed(r, num_tokens + self.bs * self.spec_blocks, hits,
                                         total, main, admission)
        new = cdiv(main, self.bs) - len(hits) - len(r.tables[self.gid])
        position = self._checkpoint(r, total, main)
        if not admission:
            if position:
                self.checkpoints[r.index] = (position, cdiv(main, self.bs) - 2)
            else:
                self.checkpoints.pop(r.index, None)
        cap = 2 if position else 1  # the state block, and the checkpoint's
        if new > cap:
            new = cap
        return new + sum(1 for b in hits if b.ref_count == 0 and not b.is_null)

    def _checkpoint(self, r: RequestState, start: int, end: int) -> int:
        """Where the prefill chunk ``[start, end)`` exports a checkpoint, or 0."""
        if not self.has_checkpoints:
            return 0
        if self.retention == 0 and end < max(r.num_prompt_tokens, r.num_tokens - 1):
            return 0  # under sparse retention only the prompt's last chunk exports one
        position = mamba_prefill_checkpoint_position(end, self.align, False)
        if not mamba_prefill_checkpoint_valid(start, end, position, self.hbs, self.bs,
                                              self.checkpoint_alignment):
            return 0
        i = cdiv(end, self.bs) - 2
        table = r.tables[self.gid]
        if i < 0 or (i < len(table) and not table[i].is_null):
            return 0
        return position

    def grow(self, r: RequestState, num_tokens: int, main: int) -> None:
        if self.mode != "align":
            super().grow(r, num_tokens + self.bs * self.spec_blocks, main)
            return
        table = r.tables[self.gid]
        required = cdiv(main, self.bs)
        held = len(table)
        checkpoint = int(r.index in self.checkpoints)
        if required <= held and not checkpoint:
            self.allocated.add(r.index)
            return
        if held > 0 or r.index in self.allocated:
            self.last_state[r.index] = held - 1
        if held < required - 1 - checkpoint:  # null up to the checkpoint's block
            table.extend([self.null] * (required - 1 - checkpoint - held))
        if required > len(table):
            table.extend(self.pool.allocate(required - len(table), self.gid))
        self.allocated.add(r.index)

    # -- freeing ----------------------------------------------------------
    def drop_skipped(self, r: RequestState, processed: int) -> None:
        if self.mode != "align":
            super().drop_skipped(r, processed)
            return
        table = r.tables[self.gid]
        skipped = processed - 1
        if skipped > 0:
            self._retire(r, table, min(skipped // self.bs, len(table)))
        last = self.last_state.get(r.index)
        if last is not None and last < cdiv(processed, self.bs) - 1:
            block = table[last]
            if block is not self.null:
                self.pool.free_blocks([block])
                table[last] = self.null

    def _retire(self, r: RequestState, table: list[Block], last: int) -> None:
        """Free every state block before ``last`` not freed yet, last first."""
        first = self.retired.get(r.index, 0)
        last = min(last, len(table))
        if first >= last:
            return
        null = self.null
        freed = []
        for i in range(last - 1, first - 1, -1):
            if table[i] is not null:
                freed.append(table[i])
                table[i] = null
        if freed:
            self.pool.free_blocks(freed)
        self.retired[r.index] = last

    def release(self, r: RequestState) -> None:
        self.checkpoints.pop(r.index, None)
        self.allocated.discard(r.index)
        self.last_state.pop(r.index, None)
        self.retired.pop(r.index, None)
        super().release(r)

    # -- prefix caching -----------------------------------------------------
    def cache(self, r: RequestState, num_tokens: int) -> None:
        if not self.cacheable:
            return
        gid = self.gid
        before = max(r.num_cached[gid], 0)
        self._cache_full(r, num_tokens)
        if self.mode == "align":
            self._cache_prompt_state(r, num_tokens)
        after = r.num_cached[gid]
        table = r.tables[gid]
        for i in range(before, after):
            block = table[i]
            if not block.is_null and block._hash is not None:
                self.cached_this_step.add(block._hash)  # type: ignore[arg-type]  # int keys

    def _cache_prompt_state(self, r: RequestState, num_tokens: int) -> None:
        """The state at the prompt's last hash boundary: in the checkpoint's block
        when the chunk exported one, else (a no-op when the hash block is the block,
        as everywhere kvspec simulates: the full block has it) in the state block."""
        checkpoint = self.checkpoints.get(r.index)
        if checkpoint is not None:
            self._cache_checkpoint(r, *checkpoint)
            return
        hbs = self.hbs
        boundary = (r.num_prompt_tokens - 1) // hbs * hbs
        if num_tokens <= 0 or num_tokens % hbs or num_tokens != boundary:
            return
        table = r.tables[self.gid]
        i = cdiv(num_tokens, self.bs) - 1
        if i >= len(table) or table[i].is_null:
            return
        block = table[i]
        if block._block_hash_num_tokens == num_tokens:
            return
        key = r.key(num_tokens // hbs - 1, hbs)
        if block._hash is None or (block._block_hash_num_tokens or 0) < num_tokens:
            self.pool.cache_block(block, key, self.gid, num_tokens)
        self.cached_this_step.add(key)

    def _cache_checkpoint(self, r: RequestState, position: int, i: int) -> None:
        """Cache the checkpoint's block at ``position`` if a later request can resume
        there; otherwise the step overwrites it: drop what it was cached under."""
        block = r.tables[self.gid][i]
        prompt = mamba_prefill_checkpoint_position(r.num_prompt_tokens, self.align, False)
        retained = False
        if position % self.bs == 0:
            kept = self._retained(position // self.bs - 1)
            retained = kept is None or kept[0]
        if position != prompt and not retained and position != r.shared_prefix_boundary:
            if block._hash is not None:
                self.pool.evict([block.block_id])
            return
        if block.is_null or block._block_hash_num_tokens == position:
            return
        key = r.key(position // self.hbs - 1, self.hbs)
        if block._hash is not None:
            self.pool.evict([block.block_id])
        self.pool.cache_block(block, key, self.gid, position)
        self.cached_this_step.add(key)

    def _retained(self, i: int) -> list[bool] | None:
        """Whether a boundary state at block ``i`` is kept, by the retention interval
        alone (no replay boundaries)."""
        retention = self.retention
        if retention is None:
            return None
        if not retention:
            return [False]
        per = retention // self.bs
        if per <= 1:
            return None
        return [i == (i + per) // per * per - 1]

    def mask(self, r: RequestState, start: int, end: int) -> list[bool] | None:
        retention = self.retention
        if self.mode != "align" or retention is None:
            return None
        bs = self.bs
        mask = [False] * (end - start)
        if retention:
            per = retention // bs
            if per <= 1:
                return None
            for i in range((start + per) // per * per - 1 - start, len(mask), per):
                mask[i] = True
        for boundary in lookup.boundaries(r):
            i = boundary // self.align * self.align // bs - 1
            if start <= i < end:
                mask[i - start] = True
        return mask

    def find_hit(self, r: RequestState, max_length: int, gids: list[int]
                 ) -> tuple[list[list[Block]], int]:
        return lookup.last_state(self, r, max_length, gids)

    def new_step(self) -> None:
        self.cached_this_step.clear()
