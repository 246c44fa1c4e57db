"""Processes that each hold one rank's cache and a NIXL endpoint, driven over a pipe.

:class:`Peer` starts one (``spawn``) and sends it commands; the process answers with
a value, or with the :class:`~kvspec.errors.KvspecError` it raised, which
:meth:`Peer.call` raises again here. The only thing crossing between the processes
besides NIXL's own traffic is this pipe: endpoint metadata, plans as JSON, block ids,
and the region bytes the test checks. Each process compiles nothing: it loads the
artifact text it is sent with ``kvspec.load`` on the CPU.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import traceback
from typing import Any

from kvspec.errors import KvspecError


def _serve(conn: Any) -> None:
    from kvspec.connectors import nixl  # in the child: loads NIXL here, not in pytest
    from kvspec.connectors.plan import TransferPlan

    try:
        nixl._nixl()
    except nixl.NixlUnavailableError as err:
        conn.send(("unavailable", err.message))
        return
    conn.send(("ok", os.getpid()))
    state: dict[str, Any] = {}
    while True:
        cmd, args = conn.recv()
        try:
            if cmd == "exit":
                conn.send(("ok", None))
                return
            conn.send(("ok", _handle(nixl, TransferPlan, state, cmd, *args)))
        except KvspecError as err:
            conn.send(("error", err))
        except Exception:  # noqa: BLE001 - any crash goes back to the test, with its traceback
            conn.send(("crash", traceback.format_exc()))


def _handle(nixl: Any, plan_type: Any, state: dict, cmd: str, *args: Any) -> Any:
    from tests.connectors.caches import load, regions

    if cmd == "setup":  # artifact text, num_blocks, rank, seed (caches.load) -> metadata
        text, num_blocks, rank, seed = args
        if "endpoint" in state:
            state.pop("endpoint").close()
        state.pop("bufs", None)
        cache = load(text, num_blocks, rank, seed)
        state["bufs"] = regions(cache)
        state["count"] = state.get("count", 0) + 1
        name = f"{cache.artifact.name}-r{rank}-{os.getpid()}-{state['count']}"
        state["endpoint"] = nixl.NixlEndpoint.for_cache(cache, rank=rank, name=name)
        return state["endpoint"].metadata()
    endpoint = state["endpoint"]
    if cmd == "add_peer":
        return endpoint.add_peer(args[0]).agent
    if cmd in ("read", "write"):  # plan JSON, blocks, timeout, notify -> stats
        plan_json, blocks, timeout, notify = args
        plan = plan_type.from_json(plan_json)
        return getattr(endpoint, cmd)(plan, blocks, timeout=timeout, notify=notify)
    if cmd == "wait":
        return endpoint.wait_notification(args[0], args[1], timeout=args[2])
    if cmd == "name":
        return endpoint.name
    if cmd == "dump":
        return {k: v.clone() for k, v in state["bufs"].items()}
    if cmd == "prepare":          # plan JSON, op -> seconds
        return endpoint.prepare(plan_type.from_json(args[0]), args[1])
    if cmd == "nonzero":          # bytes that are not 0, over all regions
        return sum(int(v.count_nonzero()) for v in state["bufs"].values())
    if cmd == "memcpy":           # seconds of the best of ``args[0]`` copies of the regions
        return _memcpy(state["bufs"], args[0])
    raise ValueError(cmd)


def _memcpy(bufs: dict, repeat: int) -> float:
    """Best of ``repeat`` copies of the regions into buffers already touched (as a
    transfer's destination is)."""
    import time

    import torch

    copies = {k: torch.zeros_like(v) for k, v in bufs.items()}
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for k, v in bufs.items():
            copies[k].copy_(v)
        best = min(best, time.perf_counter() - start)
    return best


class Peer:
    """One process serving :func:`_serve`."""

    def __init__(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child,), daemon=True)
        self.process.start()
        child.close()
        self.unavailable: str | None = None

    def ready(self) -> Peer:
        """Wait until the process has loaded NIXL (``unavailable`` says why not)."""
        status, value = self._answer(120)
        self.unavailable = value if status == "unavailable" else None
        return self

    def _answer(self, timeout: float) -> tuple[str, Any]:
        if not self.conn.poll(timeout):
            raise TimeoutError(f"peer process {self.process.pid} gave no answer "
                               f"in {timeout} s")
        try:
            return self.conn.recv()
        except EOFError:
            self.process.join(5)
            raise RuntimeError(f"peer process {self.process.pid} exited "
                               f"({self.process.exitcode})") from None

    def send(self, cmd: str, *args: Any) -> None:
        self.conn.send((cmd, args))

    def result(self, timeout: float = 60) -> Any:
        status, value = self._answer(timeout)
        if status == "error":
            raise value
        if status == "crash":
            raise RuntimeError(value)
        return value

    def call(self, cmd: str, *args: Any, timeout: float = 60) -> Any:
        self.send(cmd, *args)
        return self.result(timeout)

    def pause(self) -> None:
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.process.pid, signal.SIGCONT)

    def close(self) -> None:
        if self.process.is_alive():
            with contextlib.suppress(TimeoutError, OSError, EOFError):
                self.call("exit", timeout=10)
        self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)
