"""Progress bars for work that can take more than about a second.

A command wraps its long work in :func:`progress` and advances the bar as steps
finish. The bar is click's, drawn on stderr, and only

* when stderr is a terminal (never into a pipe, a file or a CI log), not a dumb
  one (``TERM=dumb``), and the command was not given ``--quiet``;
* once the work has run for :data:`DELAY` seconds, so a quick command draws
  nothing at all (``KVSPEC_PROGRESS_DELAY`` sets it; 0 draws at once).

Nothing else changes: stdout, the exit status and every message are the same
with or without a bar. Work that may run for minutes (``simulate`` on a long
trace, ``auto`` simulating its candidates) asks for ``notes``: where no bar can
be drawn, a plain line on stderr says how far it is every :data:`NOTE_EVERY`
seconds, after the first ``NOTE_EVERY`` (``--quiet`` silences them too, and so does
``KVSPEC_PROGRESS_NOTES=off``, which the test suite sets: its outputs are compared
whole, however loaded the machine).

>>> import io
>>> with progress(3, label="work", stream=io.StringIO()) as bar:   # not a terminal
...     for step in ("read", "plan", "write"):
...         bar.advance(step)
>>> bar.shown
False
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import IO, Any, TextIO, TypeVar

import click

from kvspec import notes

__all__ = ["DELAY", "NOTE_EVERY", "Progress", "library_notes", "progress"]

#: Seconds of work before a bar appears.
DELAY = 1.0
#: Seconds between the plain progress lines of ``notes`` work off a terminal.
NOTE_EVERY = 5.0
T = TypeVar("T")


def _delay() -> float:
    try:
        return max(0.0, float(os.environ.get("KVSPEC_PROGRESS_DELAY", DELAY)))
    except ValueError:
        return DELAY


def notes_wanted() -> bool:
    """Whether plain progress lines may be printed (``KVSPEC_PROGRESS_NOTES=off``: no)."""
    return os.environ.get("KVSPEC_PROGRESS_NOTES", "").lower() not in ("off", "0", "no")


def on_terminal(stream: IO[str]) -> bool:
    """Whether a bar may be drawn on ``stream``: a terminal that is not dumb."""
    isatty = getattr(stream, "isatty", None)
    try:
        tty = bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False
    return tty and os.environ.get("TERM") != "dumb"


class Progress:
    """A bar over ``length`` steps that appears only after ``delay`` seconds (and
    only on a terminal); :meth:`advance` marks a step done."""

    def __init__(self, length: int | None, label: str, stream: TextIO, enabled: bool,
                 delay: float, clock: Callable[[], float] = time.monotonic,
                 notes: bool = False) -> None:
        self.length, self.label, self.stream = length, label, stream
        self.enabled, self.delay, self.clock = enabled, delay, clock
        self.start, self.done, self.step = clock(), 0, ""
        self._bar: Any = None
        #: When the next plain line is due (None: no lines).
        self._note_at = self.start + NOTE_EVERY if notes and not enabled else None

    @property
    def shown(self) -> bool:
        """Whether the bar has been drawn."""
        return self._bar is not None

    def advance(self, step: str = "", n: int = 1) -> None:
        """``n`` more steps done; ``step`` names the one now running."""
        self.done += n
        self.step = step or self.step
        if self._note_at is not None and self.clock() >= self._note_at:
            self.note()
        if not self.enabled:
            return
        if self._bar is None:
            if self.clock() - self.start < self.delay:
                return
            self._bar = click.progressbar(
                length=self.length, label=self.label, file=self.stream, show_pos=True,
                item_show_func=lambda _: self.step or None, width=24)
            self._bar.__enter__()
            self._bar.update(self.done)
            return
        self._bar.update(n, self.step)

    def note(self, text: str | None = None) -> None:
        """A plain progress line on the stream (off a terminal, for ``notes`` work)."""
        if self._note_at is None:
            return
        self._note_at = self.clock() + NOTE_EVERY
        of = f" of {self.length:,}" if self.length else ""
        line = text or (self.step if not self.label else
                        f"{self.label}: {self.done:,}{of} {self.step}".rstrip())
        click.echo(line, file=self.stream)

    def track(self, fn: Callable[..., T], step: str = "") -> Callable[..., T]:
        """``fn``, named as the running step while it runs, advancing the bar by one
        each time it returns."""
        def tracked(*args: Any, **kwargs: Any) -> T:
            self.step = step or getattr(fn, "__name__", "")
            out = fn(*args, **kwargs)
            self.advance()
            return out
        return tracked

    def iter(self, items: Iterable[T], step: str = "") -> Iterator[T]:
        """``items``, advancing the bar by one after each."""
        for item in items:
            yield item
            self.advance(step)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
            self._bar = None


@contextmanager
def library_notes(quiet: bool = False, stream: TextIO | None = None) -> Iterator[Progress]:
    """The lines long library work tells (:mod:`kvspec.notes`, e.g. ``auto`` simulating
    its candidates) on ``stream`` (stderr), one every :data:`NOTE_EVERY` seconds at
    most, after the first ``NOTE_EVERY``; none with ``quiet``."""
    out = stream if stream is not None else sys.stderr
    bar = Progress(None, "", out, enabled=False, delay=math.inf,
                   notes=not quiet and notes_wanted())

    def hear(line: str) -> None:
        bar.step = line
        bar.advance(line, 0)
    with notes.listening(hear):
        yield bar


@contextmanager
def progress(length: int | None, *, label: str, quiet: bool = False,
             stream: TextIO | None = None, delay: float | None = None,
             notes: bool = False) -> Iterator[Progress]:
    """A :class:`Progress` for ``length`` steps (None: unknown) labelled ``label``,
    drawn on ``stream`` (stderr) when it is a terminal, after ``delay`` seconds;
    ``notes``: elsewhere, a plain line every :data:`NOTE_EVERY` seconds."""
    out = stream if stream is not None else sys.stderr
    bar = Progress(length, label, out, enabled=not quiet and on_terminal(out),
                   delay=_delay() if delay is None else delay,
                   notes=notes and not quiet and notes_wanted())
    try:
        yield bar
    finally:
        bar.close()
