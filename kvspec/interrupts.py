"""Ctrl-C (and other signals with a Python handler) while compiled code runs: a leaf
module.

Python runs a signal's handler (``KeyboardInterrupt`` for SIGINT) wherever the
interpreter next checks for signals: between two bytecodes, or inside a C function
that checks itself. CPython's multiplication of integers of two or more 30-bit
digits checks (``x_mul`` in ``Objects/longobject.c``), and so does the simulator's
compiled build at every ``a * b`` with an operand of 2^30 or more (a pool's bytes,
a prefix's chain key): mypyc sends such products through ``PyNumber_Multiply`` and
takes its failure for an allocation failure, so a ``KeyboardInterrupt`` raised there
ends the process with mypyc's ``fatal: out of memory`` and ``abort()`` (exit -6)
instead of unwinding. Pure Python unwinds, as every other error does.

So compiled work runs inside :func:`deferred`: there a signal's Python handler only
records the signal, and :func:`poll`, which the work calls from its loop (the
simulator: every step, :func:`kvspec.sim.engine.drive`), runs the handler from
Python, where its exception unwinds like any other; leaving the block runs it for a
signal that came after the last poll. Outside the block nothing changes.

>>> import os, signal
>>> with deferred():
...     os.kill(os.getpid(), signal.SIGINT)     # recorded, not raised
...     seen = pending()
...     try:
...         poll()
...     except KeyboardInterrupt:
...         print("interrupted at the poll")
interrupted at the poll
>>> seen, pending()
(True, False)
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

__all__ = ["SIGNALS", "deferred", "pending", "poll"]

#: The signals whose Python handlers are deferred (SIGINT: Ctrl-C; SIGTERM: where a
#: caller installed a handler for it, as vLLM's engine and sweep drivers do).
SIGNALS: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)

Handler = Callable[[int, FrameType | None], Any]

#: The handlers :func:`deferred` replaced, by signal (empty outside it).
_saved: dict[int, Handler] = {}
#: Signals that arrived inside, in order, not yet handled.
_arrived: list[int] = []
#: How deep :func:`deferred` blocks nest (only the outermost installs).
_depth = 0


def _record(signum: int, frame: FrameType | None) -> None:
    _arrived.append(signum)


def pending() -> bool:
    """Whether a deferred signal waits for :func:`poll`."""
    return bool(_arrived)


def poll() -> None:
    """Run the handlers of the signals that arrived (a ``KeyboardInterrupt`` for
    Ctrl-C raises here), in the main thread; nothing when none did, at the cost of a
    list's truth test."""
    while _arrived and threading.current_thread() is threading.main_thread():
        signum = _arrived[0]
        _arrived[:] = [s for s in _arrived if s != signum]   # twice: one interrupt
        handler = _saved.get(signum)
        if handler is not None:
            handler(signum, None)


@contextmanager
def deferred(signums: tuple[int, ...] = SIGNALS) -> Iterator[None]:
    """Within the block, the Python handlers of ``signums`` run at :func:`poll`, or when
    the block ends, not where the signal lands. A signal whose handler is not Python's
    (the default action, or ignored) is left alone; outside the main thread (which
    alone runs handlers) nothing changes."""
    global _depth  # noqa: PLW0603 - one process's signal handlers
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if _depth:   # inside another: that one handles
        _depth += 1
        try:
            yield
        finally:
            _depth -= 1
        return
    for signum in signums:
        handler = signal.getsignal(signum)
        if callable(handler) and handler is not _record:
            _saved[signum] = handler
            signal.signal(signum, _record)
    _depth = 1
    try:
        yield
    finally:
        _depth = 0
        for signum, handler in _saved.items():
            signal.signal(signum, handler)   # a signal from now on: its own handler
        try:
            poll()
        finally:
            _saved.clear()
            _arrived.clear()
