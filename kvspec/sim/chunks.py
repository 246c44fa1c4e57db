"""Prefill chunks that end where a Mamba ``align`` state must be cached.

In vLLM's ``align`` mode a state is kept per block boundary, so a prefill chunk
must end on one; the prompt's last chunk may stop at the last boundary before
the prompt's last token (the state a later request resumes at), or run on when
the state groups export that boundary's state themselves (prefill checkpoint
blocks); a shared prefix's end (a junction) is a stop too. :class:`ChunkSplit`
is vLLM's ``Scheduler._mamba_block_aligned_split`` without EAGLE and without hits
inside a block.
"""

from __future__ import annotations

from kvspec.model.specs.state import (
    mamba_prefill_checkpoint_position,
    mamba_prefill_checkpoint_valid,
)
from kvspec.runtime.manager import ManagedLayout
from kvspec.sim.request import SimRequest

__all__ = ["ChunkSplit"]


class ChunkSplit:
    """``split(r, n, hit)``: how many of ``n`` tokens the chunk starting after
    ``hit`` prefix-cache tokens may take."""

    def __init__(self, layout: ManagedLayout, max_num_batched_tokens: int) -> None:
        self.block = layout.split_block_size
        self.scheduler_block = layout.scheduler_block_size
        self.budget = max_num_batched_tokens
        states = [i for i, g in enumerate(layout.groups) if g.kind == "state"]
        #: Every state group exports a prefill checkpoint (vLLM's
        #: ``mamba_has_prefill_checkpoint_blocks``), at this alignment.
        self.checkpoints = bool(states) and all(layout.groups[i].checkpoint_blocks > 0
                                                for i in states)
        self.alignment = layout.groups[states[0]].checkpoint_alignment if states else None
        self.hash_block = layout.pool_of(states[0]).hash_block_size if states else 1

    def __call__(self, r: SimRequest, n: int, hit: int) -> int:
        start = r.num_computed_tokens + hit
        prefill_end = max(r.num_prompt_tokens, r.num_tokens - 1)
        if start >= prefill_end:
            return n
        bs = self.block
        end = start + n
        last_cache = mamba_prefill_checkpoint_position(r.num_tokens, bs, False)
        internal = self.checkpoints and end >= prefill_end and mamba_prefill_checkpoint_valid(
            start, end, mamba_prefill_checkpoint_position(prefill_end, self.scheduler_block,
                                                          False),
            self.hash_block, bs, self.alignment)
        if internal:  # the chunk exports the checkpoint itself: no stop for it
            last_cache = 0
        if end < prefill_end:
            aligned = end // bs * bs
            if aligned > start or bs <= self.budget:
                end = aligned
        junction = r.shared_prefix_boundary
        stops = ((start // bs + 1) * bs if start % bs and not internal else 0, last_cache,
                 start + (junction - start) // bs * bs if start < junction < end else 0)
        inside = [s for s in stops if start < s < end]
        if inside:
            end = min(inside)
        return max(end - start, 0)
