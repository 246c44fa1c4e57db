"""vLLM v1's continuous batching, as ``Scheduler.schedule()`` does it by default.

One :meth:`Scheduler.schedule` call is one engine step:

1. the running requests, in admission order, each get the tokens they still
   need (a prefill chunk, or one decode token), within the step's token budget;
   when a request's blocks do not fit, the most recently admitted running
   request is preempted (its blocks freed, to be recomputed) until they do or
   the request itself was preempted;
2. if nobody was preempted, waiting requests are admitted first come, first
   served, while the budget and ``max_num_seqs`` allow and the whole prompt fits
   (after its prefix-cache hit): a chunk of the prompt per step;
3. every scheduled request's computed tokens advance; with async scheduling a
   decoding request gets a placeholder for the token it will sample.

:meth:`Scheduler.update` applies a step's output: one sampled token per
request whose prompt is done; a request ends at its output length or at
``max_model_len``, and its blocks are freed. Layouts with Mamba ``align``
groups end prefill chunks on block boundaries, as vLLM's
``_mamba_block_aligned_split`` does.

Not modelled (refused where they would matter): speculative decoding, KV
connectors, encoder inputs, LoRA, priorities, ``long_prefill_token_threshold``.
"""

from __future__ import annotations

from collections import deque
from kvspec.model.specs.state import (
    mamba_prefill_checkpoint_position,
    mamba_prefill_checkpoint_valid,
)
from kvspec.runtime.manager import KVCacheManager, ManagedLayout, RequestState

__all__ = ["FINISHED", "PREEMPTED", "RUNNING", "WAITING", "Batch", "Scheduler", "SimRequest"]

WAITING, RUNNING, PREEMPTED, FINISHED = 0, 1, 2, 3


class SimRequest(RequestState):
    """A trace request in the scheduler: the manager's state plus scheduling state."""

    __slots__ = ("max_tokens", "num_output_tokens", "placeholders", "stale", "status",
                 "is_prefill_chunk", "num_preemptions", "arrival")

    def __init__(self, index: int, prompt: int, output: int, *, prefix: int = 0,
                 prefix_tokens: int = 0, arrival: int = 0) -> None:
        super().__init__(index, prompt, prefix=prefix, prefix_tokens=prefix_tokens)
        self.max_tokens = output
        self.num_output_tokens = 0
        #: Tokens a step in flight will sample (async scheduling).
        self.placeholders = 0
        #: Tokens in flight when the request was preempted (their output still comes).
        self.stale = 0
        self.status = WAITING
        self.is_prefill_chunk = False
        self.num_preemptions = 0
        self.arrival = arrival


class Batch:
    """One step's schedule: (request, tokens, samples a token) in scheduling order."""

    __slots__ = ("items", "total", "preempted", "hits")

    def __init__(self) -> None:
        self.items: list[tuple[SimRequest, int, bool]] = []
        self.total = 0
        self.preempted = 0
        self.hits = 0


class Scheduler:
    """The scheduler model over a :class:`KVCacheManager` (see the module docstring)."""

    def __init__(self, manager: KVCacheManager, layout: ManagedLayout, *, max_num_seqs: int,
                 max_num_batched_tokens: int, async_scheduling: bool) -> None:
        self.manager = manager
        self.max_model_len = layout.max_model_len
        self.max_num_seqs = max_num_seqs
        self.budget = max_num_batched_tokens
        self.async_scheduling = async_scheduling
        self.split = layout.has_align_state
        self.split_block = layout.split_block_size
        self.scheduler_block = layout.scheduler_block_size
        states = [i for i, g in enumerate(layout.groups) if g.kind == "state"]
        #: Every state group exports a prefill checkpoint (vLLM's
        #: ``mamba_has_prefill_checkpoint_blocks``), at this alignment.
        self.checkpoints = bool(states) and all(layout.groups[i].checkpoint_blocks > 0
                                                for i in states)
        self.checkpoint_alignment = layout.groups[states[0]].checkpoint_alignment \
            if states else None
        self.hash_block = layout.pool_of(states[0]).hash_block_size if states else 1
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        #: Requests finished since the last step (the engine reports them in the next).
        self.finished_pending = False
        self.preemptions = 0
        self.hit_tokens = 0
        self.finished_count = 0

    def add(self, r: SimRequest) -> None:
        r.reset_tables(self.manager.num_groups)
        r.status = WAITING
        self.waiting.append(r)

    def has_requests(self) -> bool:
        return bool(self.running or self.waiting or self.finished_pending)

    # -- one step -----------------------------------------------------------
    def schedule(self) -> Batch:
        batch = Batch()
        self.manager.new_step_starts()
        scheduled: list[tuple[SimRequest, int]] = []
        budget = self._schedule_running(self.budget, scheduled, batch)
        if not batch.preempted:
            self._schedule_waiting(budget, scheduled, batch)
        self._after_schedule(scheduled, batch)
        return batch

    def _schedule_running(self, budget: int, out: list[tuple[SimRequest, int]],
                          batch: Batch) -> int:
        running, allocate = self.running, self.manager.allocate_slots
        i = 0
        while i < len(running) and budget > 0:
            r = running[i]
            ph = r.placeholders
            if ph > 0 and r.num_computed_tokens + 2 - ph >= r.num_prompt_tokens + r.max_tokens:
                i += 1  # the step in flight samples its last token
                continue
            n = min(r.num_tokens + ph - r.num_computed_tokens, budget,
                    self.max_model_len - r.num_computed_tokens - 1)
            if self.split:
                n = self._split(r, n, 0)
            if n <= 0:
                i += 1
                continue
            while not allocate(r, n):
                victim = running.pop()
                self._preempt(victim)
                batch.preempted += 1
                if victim is r:  # nothing left to preempt: stop scheduling running ones
                    return budget
            out.append((r, n))
            budget -= n
            i += 1
        return budget

    def _schedule_waiting(self, budget: int, out: list[tuple[SimRequest, int]],
                          batch: Batch) -> None:
        waiting, running, manager = self.waiting, self.running, self.manager
        skipped: list[SimRequest] = []
        while budget > 0 and waiting and len(running) < self.max_num_seqs:
            r = waiting[0]
            if r.stale:  # its output is still in flight: resume it later
                skipped.append(waiting.popleft())
                continue
            hits, hit, r.shared_prefix_boundary = manager.get_computed_blocks(r)
            n = min(r.num_tokens - hit, budget)
            if self.split:
                n = self._split(r, n, hit)
                if n == 0:
                    break
            if not manager.allocate_slots(r, n, hit, hits, full_sequence_must_fit=True):
                break
            waiting.popleft()
            running.append(r)
            r.status = RUNNING
            r.num_computed_tokens = hit
            batch.hits += hit
            self.hit_tokens += hit
            out.append((r, n))
            budget -= n
        if skipped:
            waiting.extendleft(reversed(skipped))

    def _after_schedule(self, scheduled: list[tuple[SimRequest, int]], batch: Batch) -> None:
        items, total, placeholders = batch.items, 0, self.async_scheduling
        for r, n in scheduled:
            r.num_computed_tokens += n
            r.num_in_flight_tokens += n
            chunk = r.num_computed_tokens < r.num_tokens + r.placeholders
            r.is_prefill_chunk = chunk
            if placeholders and not chunk:
                r.placeholders += 1
            items.append((r, n, not chunk))
            total += n
        batch.total = total
        self.finished_pending = False

    def _preempt(self, r: SimRequest) -> None:
        self.manager.free(r)
        r.status = PREEMPTED
        r.num_computed_tokens = 0
        r.stale = r.num_in_flight_tokens
        r.placeholders = 0
        r.num_preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(r)

    def _split(self, r: SimRequest, n: int, hit: int) -> int:
        """End a prefill chunk where a Mamba state must be cached (vLLM's
        ``_mamba_block_aligned_split`` without checkpoint blocks or EAGLE)."""
        start = r.num_computed_tokens + hit
        prefill_end = max(r.num_prompt_tokens, r.num_tokens - 1)
        if start >= prefill_end:
            return n
        bs = self.split_block
        end = start + n
        last_cache = mamba_prefill_checkpoint_position(r.num_tokens, bs, False)
        internal = self.checkpoints and end >= prefill_end and mamba_prefill_checkpoint_valid(
            start, end, mamba_prefill_checkpoint_position(prefill_end, self.scheduler_block,
                                                          False),
            self.hash_block, bs, self.checkpoint_alignment)
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

    # -- a step's output ------------------------------------------------------
    def update(self, batch: Batch) -> None:
        """One sampled token per request whose prompt the step finished."""
        stopped_running = stopped_waiting = False
        for r, n, sampled in batch.items:
            if r.status == FINISHED:
                continue
            r.num_in_flight_tokens -= n
            stale = r.stale > 0
            if stale:
                r.stale -= n
            if sampled:
                before = r.status
                if self._sample(r, stale):
                    r.status = FINISHED
                    self.manager.free(r)
                    self.finished_pending = True
                    self.finished_count += 1
                    if before == RUNNING:
                        stopped_running = True
                    else:
                        stopped_waiting = True
        if stopped_running:
            self.running = [r for r in self.running if r.status != FINISHED]
        if stopped_waiting:
            self.waiting = deque(r for r in self.waiting if r.status != FINISHED)

    def _sample(self, r: SimRequest, stale: bool) -> bool:
        """Append the sampled token; True when the request stops."""
        had_placeholders = r.placeholders > 0
        r.num_tokens += 1
        r.num_output_tokens += 1
        stop = r.num_output_tokens >= r.max_tokens or r.num_tokens >= self.max_model_len
        if not stale:
            if had_placeholders:
                r.placeholders -= 1
                if r.status == RUNNING:
                    self.manager.cache_blocks(r, r.num_computed_tokens - r.num_in_flight_tokens)
        return stop

