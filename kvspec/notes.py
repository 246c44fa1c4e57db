"""How far long library work is, told to whoever runs it: a leaf module.

Work deep inside a pass (``auto`` simulating each candidate on a long trace) calls
:func:`tell` with a line saying how far it is; nothing happens unless the caller
set a listener with :func:`listening` (the command line does: it prints a line
every few seconds off a terminal, ``kvspec.cli.progress``). Passes stay pure: the
listener sees text, and nothing comes back.

>>> heard = []
>>> with listening(heard.append):
...     tell("candidate 1 of 3")
>>> tell("nobody listens"); heard
['candidate 1 of 3']
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = ["listening", "tell"]

_LISTENER: ContextVar[Callable[[str], None] | None] = ContextVar("kvspec_notes", default=None)


def tell(line: str) -> None:
    """Say how far the work is (to the listener, if any)."""
    listener = _LISTENER.get()
    if listener is not None:
        listener(line)


def is_heard() -> bool:
    """Whether anyone listens (so work may skip building its lines)."""
    return _LISTENER.get() is not None


@contextmanager
def listening(listener: Callable[[str], None]) -> Iterator[None]:
    """Hear :func:`tell`'s lines while the block runs."""
    token = _LISTENER.set(listener)
    try:
        yield
    finally:
        _LISTENER.reset(token)
