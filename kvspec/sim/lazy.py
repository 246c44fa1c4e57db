"""Decoding requests between their events, counted instead of stepped.

Most steps of a long trace are decode steps, and a decoding request's step
usually changes nothing but counters: one more token computed, one more
sampled. The manager acts on the pool only at some counts (a block to allocate,
a window's or a chunk's block to free, a state block to free), and the
scheduler must look at the request itself when how its live bytes grow changes
(a window fills, a chunk starts) and when it ends.

A steady decoding request (its last step was one token, scheduled one by one)
joins :class:`LazySet`: it takes one token in every step, counted, not stepped;
its counters are brought up to date (:meth:`LazySet.materialize`) whenever
anything reads them. At a manager event the scheduler calls the manager for it
in its place in the running order (it stays lazy); at a change in its live
bytes' growth, or near its end, it leaves the set and is scheduled one by one;
it also leaves when the token budget runs out before it, or when it is
preempted. :class:`Quiet` finds the counts of each kind. Caching a full block
is no event: nothing reads a decode block's hash before the request is looked
at again, and the scheduler caches what the counted steps would have first.

The steps are the same as if every request were scheduled one by one, block
id for block id (the simulator's tests run both ways and compare). Only
synchronous scheduling and async scheduling with one pipeline stage (where a
steady request takes one token per step) count steps.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from operator import attrgetter
from typing import TYPE_CHECKING

from kvspec.runtime.manager import ManagedLayout
from kvspec.sim.metrics import LiveBytes

if TYPE_CHECKING:  # pragma: no cover
    from kvspec.sim.request import SimRequest

__all__ = ["NEVER", "LazySet", "Quiet"]

_SEQ = attrgetter("seq")

#: ``lazy_end`` of a request that is lazy now.
NEVER = 1 << 62


class Quiet:
    """The computed-token counts ``c`` (at a step's start) that matter to a steady
    decoding request, by the steps' pattern (synchronous: the output comes before
    the next step; async: one step later).

    *Events* (:meth:`next_event`) are counts at which the manager acts on the pool:
    a block to allocate (the slot for token ``c + 1`` opens a block), a block that
    leaves a window or a chunk, a state block to free (Mamba ``align``): residues
    modulo a block size. *Stops* (:meth:`stop`) are counts after which the request's
    live bytes grow differently (a window filled, a chunk started) or it nears its
    end. Caching a full block is neither (see the module docstring).
    """

    def __init__(self, layout: ManagedLayout, max_model_len: int, *,
                 async_scheduling: bool) -> None:
        late = 1 if async_scheduling else 0  # frees read c - 1 under async scheduling
        events: set[tuple[int, int]] = set()
        #: Counts (periodic, and fixed) a lazy request stops at: its live bytes grow
        #: differently after them.
        bounds: set[tuple[int, int]] = set()
        points: set[int] = set()
        self.rswa: list[int] = []
        for g in layout.groups:
            bs = g.block_size
            events.add((bs, 0))
            if g.kind == "sliding":
                window = g.sliding_window or 0
                events.add((bs, (window - 1 + g.extra_retained_tokens + late) % bs))
                points |= {window - 1, window}
            elif g.kind == "local":
                chunk = g.attention_chunk_size or 1
                bounds |= {(chunk, 0), (chunk, late % chunk)}
            elif g.kind == "rswa":
                events.add((bs, ((g.rswa_window or 0) + late) % bs))
                self.rswa.append(g.rswa_window or 0)
            elif g.kind == "state":
                events.add((bs, (1 + late) % bs))
        self.events = sorted(events)
        self.bounds = sorted(bounds)
        self.points = sorted(points)
        self.max_model_len = max_model_len

    def stop(self, r: SimRequest, c: int) -> int:
        """The last count ``q >= c`` up to which ``r`` may stay lazy (before a change in
        how its live bytes grow, or its end), or -1 when ``c`` is past it."""
        last = min(r.num_prompt_tokens + r.max_tokens, self.max_model_len) - 3
        for m, r0 in self.bounds:
            ahead = (r0 - c) % m
            if ahead == 0:
                return -1
            if c + ahead - 1 < last:
                last = c + ahead - 1
        for p in self._points(r):
            if p == c:
                return -1
            if c < p <= last:
                last = p - 1
        return last if c <= last else -1

    def next_event(self, c: int) -> int:
        """The first count ``>= c`` at which the manager acts on the pool."""
        nearest = 1 << 62
        for m, r0 in self.events:
            at = c + (r0 - c) % m
            if at < nearest:
                nearest = at
        return nearest

    def _points(self, r: SimRequest) -> list[int]:
        if not self.rswa:
            return self.points
        return self.points + [r.num_prompt_tokens + w - 1 for w in self.rswa]


class LazySet:
    """Running requests scheduled by count (see the module docstring).

    ``scheduled`` and ``updated`` count the steps scheduled and those whose output
    was applied; a lazy request takes part in steps ``lazy_from`` up to (not
    including) ``lazy_end``. Its live bytes grow by ``rate`` per step, so the sum
    over lazy requests is ``value + rate * step - offset``.
    """

    def __init__(self, live: LiveBytes, *, async_scheduling: bool) -> None:
        self.live = live
        self.async_scheduling = async_scheduling
        self.scheduled = 0
        self.updated = 0
        self.seqs: list[int] = []
        self.by_seq: dict[int, SimRequest] = {}
        self.calendar: dict[int, list[SimRequest]] = {}
        self.value = self.rate = self.offset = 0
        #: The lazy requests' ``lazy_base`` summed: in step ``t`` they read
        #: ``context + len(self) * t`` tokens of context.
        self.context = 0

    def __len__(self) -> int:
        return len(self.seqs)

    def materialize(self, r: SimRequest) -> None:
        """Apply the steps ``r`` took part in lazily and were not applied yet."""
        if r.lazy_from < 0:
            return
        end = r.lazy_end
        steps = min(end, self.scheduled) - r.lazy_from
        outputs = min(end, self.updated) - r.lazy_from
        if outputs < 0:
            outputs = 0
        ds, du = steps - r.lazy_steps, outputs - r.lazy_outputs
        if ds or du:
            r.num_computed_tokens += ds
            r.num_in_flight_tokens += ds - du
            if self.async_scheduling:
                r.placeholders += ds - du
            r.num_tokens += du
            r.num_output_tokens += du
            r.lazy_steps, r.lazy_outputs = steps, outputs
            if outputs:
                r.last_token = r.lazy_from + outputs - 1
        if end != NEVER and outputs == end - r.lazy_from:
            r.lazy_from = -1  # every lazy step applied

    def enter(self, r: SimRequest, step: int, stop: int, event: int) -> None:
        """``r`` (computed ``c`` now) is lazy from ``step`` on, at most until its count
        reaches ``stop``, its manager called at count ``event`` (see :meth:`due`)."""
        c = r.num_computed_tokens
        r.lazy_from, r.lazy_end, r.lazy_steps, r.lazy_outputs = step, NEVER, 0, 0
        r.lazy_stop = step + stop - c
        self.plan(r, step + event - c)
        insort(self.seqs, r.seq)
        self.by_seq[r.seq] = r
        of = self.live.of
        r.lazy_value = of(c, r.num_prompt_tokens)
        r.lazy_rate = of(c + 1, r.num_prompt_tokens) - r.lazy_value
        self.value += r.lazy_value
        self.rate += r.lazy_rate
        self.offset += r.lazy_rate * (step - 1)
        r.lazy_base = c - step + 1
        self.context += r.lazy_base

    def plan(self, r: SimRequest, event: int) -> None:
        """The next step the scheduler looks at lazy ``r``: its manager's next event,
        or the step after its last lazy one."""
        due = event if event <= r.lazy_stop else r.lazy_stop + 1
        r.lazy_due = due
        self.calendar.setdefault(due, []).append(r)

    def leave(self, r: SimRequest, step: int) -> None:
        """``r`` takes no part in step ``step`` or later as a lazy request."""
        self.value -= r.lazy_value
        self.rate -= r.lazy_rate
        self.offset -= r.lazy_rate * (r.lazy_from - 1)
        self.context -= r.lazy_base
        del self.seqs[bisect_left(self.seqs, r.seq)]
        del self.by_seq[r.seq]
        r.lazy_end = step
        self.materialize(r)

    def detach(self, r: SimRequest) -> range:
        """The steps whose output ``r`` (no longer lazy) still awaits as a lazy
        request; from now on the caller applies them one by one."""
        self.materialize(r)
        if r.lazy_from < 0:
            return range(0)
        pending = range(max(r.lazy_from, self.updated), r.lazy_end)
        r.lazy_from = -1
        return pending

    def due(self, step: int) -> tuple[list[SimRequest], list[SimRequest]]:
        """The lazy requests the scheduler looks at in ``step``: those whose manager
        acts (they stay lazy; by admission), and those taken out of the set (their
        lazy steps are over)."""
        events, out = [], []
        for r in self.calendar.pop(step, ()):
            if r.lazy_end == NEVER and r.lazy_due == step:
                if step > r.lazy_stop:
                    self.leave(r, step)
                    out.append(r)
                else:
                    events.append(r)
        if len(events) > 1:
            events.sort(key=_SEQ)
        return events, out

    def before(self, seq: int) -> int:
        """Lazy requests admitted before the request of admission number ``seq``."""
        return bisect_left(self.seqs, seq)

    def cut(self, index: int, step: int) -> list[SimRequest]:
        """The lazy requests from the ``index``-th on take no part in ``step``."""
        out = [self.by_seq[seq] for seq in self.seqs[index:]]
        for r in out:
            self.leave(r, step)
        return out

    def live_bytes(self, step: int) -> int:
        """Live bytes of the lazy requests once step ``step`` is scheduled."""
        return self.value + self.rate * step - self.offset

    def is_lazy(self, r: SimRequest) -> bool:
        return r.lazy_end == NEVER and r.lazy_from >= 0
