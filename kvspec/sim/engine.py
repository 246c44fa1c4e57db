"""The engine loop: arrivals, steps, outputs, as vLLM's engine core runs a scheduler.

:func:`drive` runs any scheduler that has ``add``, ``has_requests``, ``schedule``,
``update`` and ``record`` (kvspec's model here, vLLM's own in
:mod:`kvspec.integrations.vllm.replay`), so both see the same steps:

* at step ``t`` the trace's requests with ``arrival <= t`` join the waiting queue;
* ``depth`` 1 (synchronous): schedule, record, apply the output, next step;
* ``depth`` > 1 (async scheduling, or pipeline stages): vLLM's
  ``step_with_batch_queue`` -- a scheduled batch waits in a queue; the oldest
  one's output is applied only when the queue is full or nothing else can be
  scheduled, so a step is scheduled before the previous step's tokens are known;
* with nothing to run, the clock jumps to the next arrival.

The result is every step's :class:`~kvspec.sim.metrics.StepRecord` and the
step the trace finished at.

The loop runs with signals deferred (:mod:`kvspec.interrupts`) and polls them every
step: in the compiled build a ``KeyboardInterrupt`` raised inside an integer product
would abort the process; raised at the poll, it unwinds as in pure Python.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

from kvspec.interrupts import deferred, poll
from kvspec.model.steptime import StepTime
from kvspec.sim.chains import ChainRequest, Chains
from kvspec.sim.errors import SimulationError
from kvspec.sim.metrics import Limits, LiveBytes, StepRecord, waiting_reason
from kvspec.sim.request import Batch, SimRequest
from kvspec.sim.schedule import Scheduler
from kvspec.sim.trace import TraceRequest, prefix_codes

__all__ = ["KvspecEngine", "Progress", "SimulationError", "StepEngine", "Timeline", "drive",
           "drive_timed"]

#: ``progress(finished_requests, total_requests)``, called every few hundred steps.
Progress = Callable[[int, int], None]


class StepEngine(Protocol):
    def add(self, index: int, request: TraceRequest) -> None: ...
    def has_requests(self) -> bool: ...
    def schedule(self) -> Any: ...
    def update(self, batch: Any) -> None: ...
    def record(self, step: int, batch: Any) -> StepRecord: ...
    def shape(self, batch: Any) -> tuple[int, int, int, int]: ...
    def stuck(self) -> str | None: ...
    @property
    def finished(self) -> int: ...


def drive(engine: StepEngine, trace: Sequence[TraceRequest], depth: int = 1,
          progress: Progress | None = None, timeline: Timeline | None = None
          ) -> tuple[list[StepRecord], int]:
    """Run ``trace`` through ``engine`` (see the module docstring); with ``timeline``,
    on its clock in seconds (:func:`drive_timed`)."""
    with deferred():
        if timeline is not None:
            return drive_timed(engine, trace, timeline, depth, progress)
        return _loop(engine, trace, depth, progress)


def _loop(engine: StepEngine, trace: Sequence[TraceRequest], depth: int,
          progress: Progress | None) -> tuple[list[StepRecord], int]:
    records: list[StepRecord] = []
    queue: deque[Any] = deque()
    clock = i = 0
    n = len(trace)
    while True:
        poll()   # Ctrl-C: KeyboardInterrupt here
        while i < n and trace[i].arrival <= clock:
            engine.add(i, trace[i])
            i += 1
        if engine.has_requests():
            batch = engine.schedule()
            records.append(engine.record(clock, batch))
            if progress is not None and clock % 256 == 0:
                progress(engine.finished, n)
            if batch.total == 0 and not any(b.total for b in queue):
                _check_progress(engine, clock)
            queue.appendleft(batch)
            if len(queue) < depth and (batch.total > 0 or engine.has_requests()):
                clock += 1
                continue
        elif not queue:
            if i >= n:
                break
            clock = trace[i].arrival
            continue
        engine.update(queue.pop())
        clock += 1
    if progress is not None:
        progress(engine.finished, n)
    return records, clock


class Timeline:
    """A timed run's clock: the step-time model, each request's arrival (s), and per
    step (batch number) when it starts and ends on the device (s).

    ``concurrency`` N > 0: closed-loop clients (``vllm bench serve --max-concurrency
    N``): at most N requests are in flight (sent, not finished); the trace's requests
    are sent in order, each when it has arrived and a slot is free, a slot freeing at
    the end of the step that samples its request's last token. :attr:`arrivals` then
    become the times each request was sent (what its latency is measured from)."""

    def __init__(self, model: StepTime, arrivals: list[float], concurrency: int = 0) -> None:
        self.model = model
        self.arrivals = arrivals
        self.concurrency = concurrency
        self.starts: list[float] = []
        self.ends: list[float] = []


def drive_timed(engine: StepEngine, trace: Sequence[TraceRequest], timeline: Timeline,
                depth: int = 1, progress: Progress | None = None
                ) -> tuple[list[StepRecord], int]:
    """:func:`drive` on a clock in seconds. At ``now`` the engine loop schedules the
    requests that arrived by then; the device runs steps one after the other, each as
    long as the model gives for its batch (:meth:`StepEngine.shape`); waiting for the
    oldest step in flight moves ``now`` to its end. ``depth`` 1: a step starts when
    the one before ends; more: it is scheduled while that one runs (the arrivals until
    it started). Steps are numbered one by one. Closed loop (``timeline.concurrency``
    N > 0): the first N plus the finished requests may join, one released by a finish
    sent at that step's end unless it arrives later."""
    records: list[StepRecord] = []
    queue: deque[Any] = deque()
    arrivals, seconds = timeline.arrivals, timeline.model.seconds
    starts, ends = timeline.starts, timeline.ends
    now = free = 0.0  # the engine loop's time; when the device finishes its last step
    clock = i = done = 0
    n = len(trace)
    slots = timeline.concurrency
    released = min(n, slots) if slots > 0 else n  # requests the clients may have sent
    while True:
        poll()   # Ctrl-C: KeyboardInterrupt here (kvspec.interrupts)
        while i < released and arrivals[i] <= now:
            engine.add(i, trace[i])
            i += 1
        if engine.has_requests():
            batch = engine.schedule()
            records.append(engine.record(clock, batch))
            prefill, decode, context, pairs = engine.shape(batch)
            start = max(free, now)
            free = start + seconds(prefill, decode, context, pairs)
            starts.append(start)
            ends.append(free)
            if progress is not None and clock % 256 == 0:
                progress(engine.finished, n)
            if batch.total == 0 and not any(b.total for b in queue):
                _check_progress(engine, clock)
            queue.appendleft(batch)
            if len(queue) < depth and (batch.total > 0 or engine.has_requests()):
                clock += 1
                continue
        elif not queue:
            if i >= n:
                break
            now = arrivals[i]
            continue
        engine.update(queue.pop())
        end = ends[done]
        if end > now:
            now = end
        while released < n and released < slots + engine.finished:
            if arrivals[released] < end:
                arrivals[released] = end  # sent when the slot freed
            released += 1
        done += 1
        clock += 1
    if progress is not None:
        progress(engine.finished, n)
    return records, clock


def _check_progress(engine: StepEngine, step: int) -> None:
    """A step that schedules nothing with nothing in flight repeats for ever: refuse it."""
    problem = engine.stuck()
    if problem is not None:
        raise SimulationError(f"step {step}: nothing can be scheduled: {problem}",
                              hint="give the pool more blocks (the layout's own count fits "
                              "max_model_len), or shorten the trace's requests")


#: Memory-bound steps sampled at the most for the waste breakdown.
MAX_SAMPLES = 200


class HeldSample(NamedTuple):
    """One sampled step while memory keeps requests waiting: running requests, their
    live bytes (in :class:`~kvspec.sim.metrics.LiveBytes` units) and the blocks they
    hold per group (a block shared by a prefix counts once per request holding it,
    as live bytes do)."""

    running: int
    live: int
    held: tuple[int, ...]
    #: Tokens the running requests hold (computed).
    tokens: int
    #: Free blocks per pool (cached blocks nobody holds count as free).
    free: tuple[int, ...] = ()


class KvspecEngine:
    """kvspec's scheduler model as a :class:`StepEngine`."""

    def __init__(self, scheduler: Scheduler, live: LiveBytes, trace: Sequence[TraceRequest],
                 *, log_blocks: bool = False, numbers: Sequence[int] | None = None,
                 sample_held: bool = False, limits: Limits | None = None) -> None:
        self.scheduler = scheduler
        #: Each request's 1-based position in the whole trace (for messages).
        self.numbers = numbers if numbers is not None else range(1, len(trace) + 1)
        self.live = live
        self.codes = prefix_codes(trace)
        #: Content-block prompts' chain codes, after the named prefixes' codes.
        self.chains = Chains(max(self.codes, default=0) + 1)
        self.finished = 0
        self.pools = scheduler.manager.pools
        #: Per step, with ``log_blocks``: ({request index: block ids per group}, the
        #: first pool's free queue).
        self.block_log: list[tuple[dict[int, tuple], list[int]]] | None = (
            [] if log_blocks else None)
        #: Samples of the steps where memory keeps requests waiting
        #: (:func:`~kvspec.sim.metrics.waiting_reason`), every ``_stride``-th.
        self.samples: list[HeldSample] = []
        self._stride, self._seen = 1, 0
        #: Whether to sample what running requests hold (the pooling policy's waste).
        self.sample_held = sample_held
        #: The scheduler's limits, to tell memory-bound steps.
        self.limits = limits or Limits(scheduler.max_num_seqs, scheduler.budget,
                                       scheduler.split.block if scheduler.split else 0)
        #: Every request added, in trace order, when the scheduler tracks their steps.
        self.requests: list[SimRequest] = []

    def add(self, index: int, request: TraceRequest) -> None:
        r: SimRequest
        if request.prefix_blocks:
            r = ChainRequest(index, request.prompt_tokens, request.output_tokens,
                             chain=self.chains.codes(request.prefix_blocks),
                             block_tokens=request.prefix_block_tokens, arrival=request.arrival)
        else:
            r = SimRequest(index, request.prompt_tokens, request.output_tokens,
                           prefix=self.codes[index], prefix_tokens=request.prefix_tokens,
                           arrival=request.arrival)
        if self.scheduler.track:
            self.requests.append(r)
        self.scheduler.add(r)

    def has_requests(self) -> bool:
        return self.scheduler.has_requests()

    def schedule(self) -> Batch:
        return self.scheduler.schedule()

    def update(self, batch: Batch) -> None:
        before = self.scheduler.finished_count
        self.scheduler.update(batch)
        self.finished += self.scheduler.finished_count - before

    def record(self, step: int, batch: Batch) -> StepRecord:
        s = self.scheduler
        live = s.live_bytes()
        if self.block_log is not None:
            self.block_log.append(({r.index: tuple(tuple(b.block_id for b in t)
                                                   for t in r.tables) for r in s.running},
                                   [b.block_id for b in self.pools[0].free_block_queue]))
        record = StepRecord(step, len(s.running), len(s.waiting),
                            tuple(p.free_block_queue.num_free_blocks for p in self.pools),
                            batch.total, batch.preempted, self.live.utilization(live))
        if self.sample_held and s.waiting and s.running and \
                waiting_reason(record, self.limits) == "memory":
            self._sample(live, record.free)
        return record

    def shape(self, batch: Batch) -> tuple[int, int, int, int]:
        """The step-time terms of ``batch`` (:data:`kvspec.model.steptime.TERMS`), just
        scheduled: its requests one by one, and the lazy ones (one decode token each,
        their context summed by :class:`~kvspec.sim.lazy.LazySet`)."""
        lazy = self.scheduler.lazy
        decode = batch.lazy
        context = lazy.context + decode * batch.step
        prefill = pairs = 0
        for r, n, _ in batch.items:
            after = r.num_computed_tokens  # (the step's tokens counted)
            context += after
            if n == 1:
                decode += 1
            else:
                prefill += n
                pairs += n * (after - n) + n * (n + 1) // 2
        return prefill, decode, context, pairs

    def _sample(self, live: int, free: tuple[int, ...]) -> None:
        """What the running requests hold while memory keeps others waiting, for the
        waste breakdown:
        every ``_stride``-th such step, the stride doubling (and every other sample
        dropped) past :data:`MAX_SAMPLES`, so long traces cost a bounded walk."""
        self._seen += 1
        if self._seen % self._stride:
            return
        running = list(self.scheduler.running)  # (an insertion-ordered dict of requests)
        groups = len(running[0].tables) if running else 0
        held = [0] * groups
        tokens = 0
        materialize = self.scheduler.lazy.materialize  # lazy requests' counts brought up
        manager = self.scheduler.manager
        nulls = [self.pools[manager.group_pool[g]].null_block for g in range(groups)]
        for r in running:
            materialize(r)
            tokens += r.num_computed_tokens
            for g, table in enumerate(r.tables):
                # identity tests in a loop the compiled build runs natively (list.count
                # would call each block's rich comparison)
                null = nulls[g]
                n = 0
                for block in table:
                    if block is not null:
                        n += 1
                held[g] += n
        self.samples.append(HeldSample(len(running), live, tuple(held), tokens, free))
        if len(self.samples) > MAX_SAMPLES:
            self.samples = self.samples[1::2]
            self._stride *= 2

    def stuck(self) -> str | None:
        """Why nothing can run, or None when nothing waits (the engine only flushes)."""
        s = self.scheduler
        r = s.first_running()
        if r is not None:
            return (f"running request #{self.numbers[r.index]} ({r.num_computed_tokens} of "
                    f"{r.num_tokens} tokens computed) gets no tokens")
        if s.waiting:
            r = s.waiting[0]
            free = ", ".join(str(p.free_block_queue.num_free_blocks) for p in self.pools)
            return (f"request #{self.numbers[r.index]} ({r.num_tokens} tokens) does not fit the "
                    f"free blocks ({free}) of an idle engine")
        return None
