# one idea: one engine step of vLLM's scheduler; admission, chunking, preemption and the
# batch's step-time terms read and edit the same queues in one pass
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
groups end prefill chunks on block boundaries (:mod:`.chunks`). Decoding
requests between events are counted, not stepped (:mod:`.lazy`).

Not modelled (refused where they would matter): speculative decoding, KV
connectors, encoder inputs, LoRA, priorities, ``long_prefill_token_threshold``.
"""

from __future__ import annotations

from bisect import insort
from collections import deque
from operator import attrgetter

from kvspec.runtime.manager import KVCacheManager, ManagedLayout
from kvspec.sim.chunks import ChunkSplit
from kvspec.sim.lazy import LazySet, Quiet
from kvspec.sim.metrics import LiveBytes
from kvspec.sim.request import FINISHED, PREEMPTED, RUNNING, WAITING, Batch, SimRequest

__all__ = ["Scheduler"]

_SEQ = attrgetter("seq")


class Scheduler:
    """The scheduler model over a :class:`KVCacheManager` (see the module docstring);
    ``lazy``: count steady decode steps instead of stepping them."""

    def __init__(self, manager: KVCacheManager, layout: ManagedLayout, live: LiveBytes, *,
                 max_num_seqs: int, max_num_batched_tokens: int, async_scheduling: bool,
                 lazy: bool = True, track: bool = False) -> None:
        self.manager = manager
        self.max_model_len = layout.max_model_len
        self.max_num_seqs = max_num_seqs
        self.budget = max_num_batched_tokens
        self.async_scheduling = async_scheduling
        self.split = ChunkSplit(layout, max_num_batched_tokens) if layout.has_align_state \
            else None
        self.live = live
        self.lazy = LazySet(live, async_scheduling=async_scheduling)
        self.quiet = Quiet(layout, layout.max_model_len,
                           async_scheduling=async_scheduling) if lazy else None
        self.waiting: deque[SimRequest] = deque()
        #: Running requests in admission order (a dict: O(1) removal, order kept).
        self.running: dict[SimRequest, None] = {}
        #: The running requests scheduled one by one (not lazy), in admission order.
        self.explicit: list[SimRequest] = []
        self.seq = 0
        #: Scheduled steps whose output is not applied yet, by step.
        self.in_flight: dict[int, Batch] = {}
        #: Requests finished since the last step (the engine reports them in the next).
        self.finished_pending = False
        self.preemptions = 0
        self.hit_tokens = 0
        self.finished_count = 0
        #: Whether :meth:`update` records each request's token steps and the gaps
        #: between its tokens (:mod:`kvspec.sim.latency`).
        self.track = track
        #: Per step (batch number), with ``track``: the tokens sampled whose request's
        #: token before came one step earlier (a gap of one step, most tokens).
        self.next_tokens: list[int] = []
        #: With ``track``: (step of the token before, step) of the other gaps.
        self.gaps: list[tuple[int, int]] = []

    def add(self, r: SimRequest) -> None:
        r.reset_tables(self.manager.num_groups)
        r.status = WAITING
        self.waiting.append(r)

    def has_requests(self) -> bool:
        return bool(self.running or self.waiting or self.finished_pending)

    # -- one step -----------------------------------------------------------
    def schedule(self) -> Batch:
        lazy = self.lazy
        step = lazy.scheduled
        batch = self.in_flight[step] = Batch(step)
        self.manager.new_step_starts()
        events, woken = lazy.due(step)
        for r in woken:
            self._catch_up(r)
            insort(self.explicit, r, key=_SEQ)
        if self.quiet is not None:
            self._promote(step)
        scheduled: list[tuple[SimRequest, int]] = []
        budget = self._schedule_running(self.budget, scheduled, batch, step, events)
        if not batch.preempted:
            self._schedule_waiting(budget, scheduled, batch)
        self._after_schedule(scheduled, batch)
        batch.lazy = len(lazy)
        batch.total += batch.lazy
        lazy.scheduled += 1
        return batch

    def _promote(self, step: int) -> None:
        """Steady decoding requests at a quiet count become lazy from ``step``."""
        lazy, quiet = self.lazy, self.quiet
        keep = []
        for r in self.explicit:
            if r.lazy_from >= 0:
                lazy.materialize(r)
            if r.lazy_from < 0 and self._steady(r, step):
                c = r.num_computed_tokens
                stop = quiet.stop(r, c)  # type: ignore[union-attr]
                event = quiet.next_event(c)  # type: ignore[union-attr]
                if stop >= 0 and event > c:
                    lazy.enter(r, step, stop, event)
                    continue
            keep.append(r)
        self.explicit = keep

    def _steady(self, r: SimRequest, step: int) -> bool:
        """A decoding request whose step is one token and whose output is one token,
        and whose last step was one such, one by one (so the manager has caught up:
        freed what left its windows, cached its full blocks)."""
        return r.decoded == step - 1 and self._steady_counts(r)

    def _steady_counts(self, r: SimRequest) -> bool:
        """One token to schedule and one output in flight per step, nothing stale."""
        if r.status != RUNNING or r.stale:
            return False
        c = r.num_computed_tokens
        if self.async_scheduling:
            return r.placeholders == 1 and r.num_in_flight_tokens == 1 and r.num_tokens == c
        return r.placeholders == 0 and r.num_in_flight_tokens == 0 and r.num_tokens == c + 1

    def _schedule_running(self, budget: int, out: list[tuple[SimRequest, int]], batch: Batch,
                          step: int, events: list[SimRequest]) -> int:
        """The running requests' tokens, in admission order; lazy ones take one
        token each where they stand (``events``: those whose manager acts this step).
        Returns the budget left."""
        lazy = self.lazy
        done = 0  # lazy requests before the current one, counted
        # both in admission order: one sort (a merge of two runs, in C)
        work = sorted(self.explicit + events, key=_SEQ) if events else list(self.explicit)
        for r in work:
            if r.status != RUNNING:
                continue
            ahead = lazy.before(r.seq) - done
            if ahead >= budget:  # the budget runs out among lazy requests
                self._unschedule(done + budget, step)
                return 0
            budget -= ahead
            done += ahead
            if lazy.is_lazy(r) and self._event(r, step):
                budget -= 1
                done += 1
                if budget == 0:
                    self._unschedule(done, step)
                    return 0
                continue
            n = self._tokens(r, budget, step)
            if n <= 0:
                continue
            if not self._allocate(r, n, batch, step):
                return budget  # r preempted itself: nobody runs after it
            out.append((r, n))
            budget -= n
            if budget == 0:
                self._unschedule(done, step)
                return 0
        rest = len(lazy) - done
        if rest > budget:
            self._unschedule(done + budget, step)
            return 0
        return budget - rest

    def _event(self, r: SimRequest, step: int) -> bool:
        """The manager's step for lazy ``r`` (a block to allocate, one to free); False
        when its blocks do not fit: it leaves the lazy set, to preempt one by one."""
        lazy, manager = self.lazy, self.manager
        lazy.materialize(r)
        caught_up = not manager.caches_while_growing
        if caught_up:
            self._catch_up(r)
        if manager.grow_one(r):
            c = r.num_computed_tokens
            lazy.plan(r, step + self.quiet.next_event(c + 1) - c)  # type: ignore[union-attr]
            return True
        if not caught_up:
            self._catch_up(r)
        lazy.leave(r, step)
        insort(self.explicit, r, key=_SEQ)
        return False

    def _unschedule(self, index: int, step: int) -> None:
        """Lazy requests from the ``index``-th on get no token this step."""
        for r in self.lazy.cut(index, step):
            self._catch_up(r)
            insort(self.explicit, r, key=_SEQ)

    def _catch_up(self, r: SimRequest) -> None:
        """Cache what ``r``'s lazy steps would have cached (they leave it to here): up
        to its computed tokens, or one fewer under async scheduling, where a step
        caches what the step before it computed."""
        self.manager.cache_blocks(r, r.num_computed_tokens - self.async_scheduling)

    def _tokens(self, r: SimRequest, budget: int, step: int) -> int:
        if r.lazy_from >= 0:
            self.lazy.materialize(r)
        r.decoded = step if self._steady_counts(r) else -1
        ph = r.placeholders
        c = r.num_computed_tokens
        if ph > 0 and c + 2 - ph >= r.num_prompt_tokens + r.max_tokens:
            return 0  # the step in flight samples its last token
        n = min(r.num_tokens + ph - c, budget, self.max_model_len - c - 1)
        if self.split is not None:
            n = self.split(r, n, 0)
        return n

    def _allocate(self, r: SimRequest, n: int, batch: Batch, step: int) -> bool:
        """Slots for ``n`` tokens, preempting from the last admitted; False if ``r``
        was preempted itself."""
        allocate, running, lazy = self.manager.allocate_slots, self.running, self.lazy
        while not allocate(r, n):
            victim = next(reversed(running))
            if lazy.is_lazy(victim):
                lazy.leave(victim, step)
                self._catch_up(victim)
            else:
                self.explicit.remove(victim)
            del running[victim]
            self._preempt(victim)
            batch.preempted += 1
            if victim is r:
                return False
        return True

    def _schedule_waiting(self, budget: int, out: list[tuple[SimRequest, int]],
                          batch: Batch) -> None:
        waiting, running, manager = self.waiting, self.running, self.manager
        skipped: list[SimRequest] = []
        while budget > 0 and waiting and len(running) < self.max_num_seqs:
            r = waiting[0]
            if r.stale:  # its output is still in flight: resume it later
                skipped.append(waiting.popleft())
                continue
            if manager.cannot_admit(r):
                break
            # a request never scheduled has had none of its own keys cached
            hits, hit, r.shared_prefix_boundary = manager.get_computed_blocks(
                r, unseen=r.seq == 0)
            n = min(r.num_tokens - hit, budget)
            if self.split is not None:
                n = self.split(r, n, hit)
                if n == 0:
                    break
            if not manager.allocate_slots(r, n, hit, hits, full_sequence_must_fit=True):
                break
            waiting.popleft()
            if r.first_step < 0:
                r.first_step = batch.step
            self.seq += 1
            r.seq = self.seq
            running[r] = None
            self.explicit.append(r)
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
            if not chunk and placeholders:
                r.placeholders += 1
            if chunk or n != 1:
                r.decoded = -1
            items.append((r, n, not chunk))
            total += n
        batch.total = total
        self.finished_pending = False

    def _preempt(self, r: SimRequest) -> None:
        for step in self.lazy.detach(r):  # its outputs in flight come one by one now
            pending = self.in_flight[step]
            pending.items.append((r, 1, True))
            pending.lazy -= 1
        self.manager.free(r, resumes=True)
        r.status = PREEMPTED
        r.num_computed_tokens = 0
        r.stale = r.num_in_flight_tokens
        r.placeholders = 0
        r.num_preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(r)

    # -- a step's output ------------------------------------------------------
    def update(self, batch: Batch) -> None:
        """One sampled token per request whose prompt the step finished."""
        if self.track:
            self._update_tracked(batch)
            return
        stopped_waiting = False
        materialize = self.lazy.materialize
        for r, n, sampled in batch.items:
            if r.status == FINISHED:
                continue
            if r.lazy_from >= 0:
                materialize(r)
            r.num_in_flight_tokens -= n
            stale = r.stale > 0
            if stale:
                r.stale -= n
            if sampled and self._sample(r, stale):
                stopped_waiting |= self._finish(r)
        if stopped_waiting:
            self.waiting = deque(r for r in self.waiting if r.status != FINISHED)
        self.lazy.updated += 1
        del self.in_flight[batch.step]

    def _update_tracked(self, batch: Batch) -> None:
        """:meth:`update`, recording each request's token steps and the gaps between
        its tokens (lazy requests' tokens each come one step after their last)."""
        stopped_waiting = False
        materialize = self.lazy.materialize
        step = batch.step
        following = batch.lazy
        for r, n, sampled in batch.items:
            if r.status == FINISHED:
                continue
            if r.lazy_from >= 0:
                materialize(r)
            r.num_in_flight_tokens -= n
            stale = r.stale > 0
            if stale:
                r.stale -= n
            if not sampled:
                continue
            last = r.last_token
            if last < 0:
                r.first_token = step
            elif last == step - 1:
                following += 1
            else:
                self.gaps.append((last, step))
            r.last_token = step
            if self._sample(r, stale):
                r.done_step = step
                stopped_waiting |= self._finish(r)
        self.next_tokens.append(following)
        if stopped_waiting:
            self.waiting = deque(r for r in self.waiting if r.status != FINISHED)
        self.lazy.updated += 1
        del self.in_flight[batch.step]

    def _finish(self, r: SimRequest) -> bool:
        """``r`` stopped: free it; True when it was waiting (preempted)."""
        waiting = r.status != RUNNING
        if not waiting:
            del self.running[r]
            self.explicit.remove(r)
        r.status = FINISHED
        self.manager.free(r)
        self.finished_pending = True
        self.finished_count += 1
        return waiting

    def _sample(self, r: SimRequest, stale: bool) -> bool:
        """Append the sampled token; True when the request stops."""
        had_placeholders = r.placeholders > 0
        r.num_tokens += 1
        r.num_output_tokens += 1
        stop = r.num_output_tokens >= r.max_tokens or r.num_tokens >= self.max_model_len
        if not stale and had_placeholders:
            r.placeholders -= 1
            if r.status == RUNNING:
                self.manager.cache_blocks(r, r.num_computed_tokens - r.num_in_flight_tokens)
        return stop

    # -- what a step record reads ---------------------------------------------------
    def live_bytes(self) -> int:
        """Live bytes of the running requests after the last step was scheduled."""
        of = self.live.of
        total = self.lazy.live_bytes(self.lazy.scheduled - 1)
        for r in self.explicit:
            total += of(r.num_computed_tokens, r.num_prompt_tokens)
        return total

    def first_running(self) -> SimRequest | None:
        for r in self.running:
            self.lazy.materialize(r)
            return r
        return None
