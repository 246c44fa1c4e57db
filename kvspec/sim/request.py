"""A trace request inside the scheduler, and one step's schedule."""

from __future__ import annotations

from kvspec.runtime.manager import RequestState

__all__ = ["FINISHED", "PREEMPTED", "RUNNING", "WAITING", "Batch", "SimRequest"]

WAITING, RUNNING, PREEMPTED, FINISHED = 0, 1, 2, 3


class SimRequest(RequestState):
    """The manager's view of a request, plus what the scheduler keeps of it."""

    __slots__ = ("max_tokens", "num_output_tokens", "placeholders", "stale", "status",
                 "is_prefill_chunk", "num_preemptions", "arrival", "seq", "lazy_from",
                 "lazy_end", "lazy_steps", "lazy_outputs", "lazy_due", "lazy_stop",
                 "lazy_value", "lazy_rate", "lazy_base", "decoded", "first_step",
                 "first_token", "last_token", "done_step")

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
        #: Admission number: the order of the running queue.
        self.seq = 0
        #: Lazy decoding (:mod:`kvspec.sim.lazy`): the steps it is lazy in, those applied.
        self.lazy_from = -1
        self.lazy_end = 0
        self.lazy_steps = self.lazy_outputs = self.lazy_due = self.lazy_stop = 0
        self.lazy_value = self.lazy_rate = 0
        #: Its computed tokens at its first lazy step, less that step, plus one: the
        #: context it reads in lazy step ``t`` is ``lazy_base + t``.
        self.lazy_base = 0
        #: The last step it was scheduled one token in, one by one.
        self.decoded = -1
        #: Steps (batch numbers) of its first schedule, first token, last token so far,
        #: and its end; -1 until then (:mod:`kvspec.sim.latency` times them).
        self.first_step = self.first_token = self.last_token = self.done_step = -1


class Batch:
    """One step's schedule: the requests scheduled one by one (request, tokens,
    samples a token), in scheduling order, and the lazy ones (one token each)."""

    __slots__ = ("step", "items", "total", "preempted", "hits", "lazy")

    def __init__(self, step: int = 0) -> None:
        self.step = step
        self.items: list[tuple[SimRequest, int, bool]] = []
        self.total = 0
        self.preempted = 0
        self.hits = 0
        self.lazy = 0
