"""Pausing Python's cyclic garbage collector while kvspec builds large data.

Parsing a source or an artifact and planning it create many small objects and
almost no reference cycles. The collector runs every few hundred allocations
and each full pass walks every live object, so on a 100,000-layer input it
spends far longer than the work itself (composing one such YAML document took
6 s with it and 0.8 s without). The pipeline therefore runs with it paused;
reference counting still frees everything as usual, and the collector resumes
(and catches up) when the outermost pause ends.

>>> import gc as _gc
>>> with paused():
...     _gc.isenabled()
False
>>> _gc.isenabled()
True
"""

from __future__ import annotations

import gc as _gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused() -> Iterator[None]:
    """The collector off inside (nested pauses keep it off until the outermost ends)."""
    was = _gc.isenabled()
    _gc.disable()
    try:
        yield
    finally:
        if was:
            _gc.enable()
