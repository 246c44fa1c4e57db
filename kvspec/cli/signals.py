"""Signals that must end a command at once, even while its main thread waits
in a library's native code (Ray connecting to a cluster), where Python's own
handlers run only when that code returns."""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from kvspec.cli.common import EXIT_INTERRUPTED, error
from kvspec.errors import EXIT_USAGE, UsageError

__all__ = ["signals_end_it"]


@contextmanager
def signals_end_it(cleanup: Callable[[], None],
                    deadline: tuple[float, UsageError] | None = None) -> Iterator[None]:
    """While the body runs, SIGINT and SIGTERM end the process within a moment,
    saying so (exit 130 and 143), even when the main thread is blocked outside
    Python: the signal's number is written to a socket (``signal.set_wakeup_fd``)
    that a thread waits on. ``deadline``: seconds, and the error that ends the
    process (exit 2) when the body has not finished by then."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    recv, send = socket.socketpair()
    send.setblocking(False)
    done, once = threading.Event(), threading.Lock()
    end = None if deadline is None else time.monotonic() + deadline[0]

    def stop(err: UsageError, code: int) -> None:
        if not once.acquire(blocking=False):
            return  # the other thread is ending the process
        cleanup()
        error(err)
        sys.stderr.flush()
        os._exit(code)

    def watch() -> None:
        while True:
            recv.settimeout(None if end is None else max(end - time.monotonic(), 0.0))
            try:
                data = recv.recv(16)
            except TimeoutError:
                if not done.is_set() and deadline is not None:
                    stop(deadline[1], EXIT_USAGE)
                return
            except OSError:
                return
            if done.is_set() or not data:
                return
            sig = next((b for b in data if b in (signal.SIGINT, signal.SIGTERM)), None)
            if sig is not None:
                signalled(sig)

    def signalled(sig: int) -> None:
        stop(UsageError("interrupted" if sig == signal.SIGINT else "terminated (SIGTERM)",
                        hint="run the command again; nothing half-written was left behind"),
             EXIT_INTERRUPTED if sig == signal.SIGINT else 128 + sig)

    old_term = signal.signal(signal.SIGTERM, lambda sig, _: signalled(sig))
    old_fd = signal.set_wakeup_fd(send.fileno(), warn_on_full_buffer=False)
    watcher = threading.Thread(target=watch, name="kvspec-signals", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        signal.set_wakeup_fd(old_fd)
        signal.signal(signal.SIGTERM, old_term if old_term is not None else signal.SIG_DFL)
        send.close()  # the watcher wakes (its peer is gone) and returns
        watcher.join(1)
        recv.close()
