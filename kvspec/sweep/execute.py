"""Running a sweep's points: a local process pool, or Ray; rows appended to a
JSON Lines file as they finish, so a killed sweep resumes.

* **Results file** (:mod:`kvspec.sweep.results`). Each finished row is appended
  whole, synced; a rerun skips every point whose id it holds.
* **Local.** A :class:`~concurrent.futures.ProcessPoolExecutor` of ``jobs``
  workers; each worker gets the traces once, when it starts (its initializer),
  and every task names its trace by sha256. Workers die with the sweep: on
  Linux the kernel kills them when it dies (``PR_SET_PDEATHSIG``), and a thread
  in each watches its parent elsewhere; they ignore Ctrl-C, which the sweep
  handles, stopping them.
* **Ray** (``kvspec[ray]``). One task per point. Each trace is put once into the
  object store, and a task carries its reference (inside a list, so Ray does not
  fetch it before the task runs): a worker fetches a trace the first time one of
  its tasks needs it and keeps it. Rows come back as tasks finish (``ray.wait``).
  :func:`ray_target` checks an address and :func:`connect_ray` reaches it
  (a TCP probe first, so an address nothing answers at fails in seconds).
"""

from __future__ import annotations

import ctypes
import importlib.util
import multiprocessing
import os
import re
import signal
import socket
import sys
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from kvspec.errors import KvspecError, UsageError
from kvspec.sim import TraceRequest
from kvspec.sweep.evaluate import evaluate_point, row_of_error
from kvspec.sweep.points import Point, Sweep, locate
from kvspec.sweep.results import Results, StreamResults, is_results, results_file

__all__ = ["PROBE_S", "PointFailed", "RayTarget", "Results", "StreamResults", "check_ray",
           "connect_ray", "is_results", "ray_target", "results_file", "run_local", "run_ray",
           "run_sweep"]

#: The traces a local worker holds, by sha256 (set by its initializer).
_TRACES: dict[str, tuple[TraceRequest, ...]] = {}
#: Seconds a Ray address has to accept a TCP connection before it is refused.
PROBE_S = 3.0
#: Seconds between a worker's checks that its parent lives (where no
#: ``PR_SET_PDEATHSIG``), and between Ray's checks for Ctrl-C.
_POLL_S = 0.5


class PointFailed(KvspecError):
    """A point that could not be run to a row (a worker killed, a kvspec bug):
    the sweep stops, its rows so far kept."""


def _task(p: Point) -> tuple[Any, ...]:
    return (p.id, p.params, p.source, p.file, p.workload, p.rate, p.step_ms, p.timing)


#: ``prctl``'s option: the signal a process gets when its parent dies (Linux).
PR_SET_PDEATHSIG = 1


def _die_with(parent: int, forked: bool) -> None:
    """Make this worker die when the sweep does: the kernel's parent-death signal
    on Linux, and a thread that watches the parent everywhere (a worker busy in
    a point still exits within :data:`_POLL_S` of its parent's death)."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):  # no libc to ask: the thread alone
            pass
    watched = os.getppid()
    if forked and watched != parent:  # the sweep died before the line above
        os._exit(1)

    def watch() -> None:
        while True:
            threading.Event().wait(_POLL_S)
            if os.getppid() != watched:
                os._exit(1)

    threading.Thread(target=watch, name="kvspec-sweep-parent", daemon=True).start()


def _init(traces: dict[str, tuple[TraceRequest, ...]], parent: int, forked: bool) -> None:
    _die_with(parent, forked)
    # Ctrl-C reaches the whole process group: the sweep stops the workers itself,
    # so a worker does not turn it into a failed point
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _TRACES.clear()
    _TRACES.update(traces)


def _local(task: tuple[Any, ...]) -> dict[str, Any]:
    pid, params, source, file, trace, rate, step_ms, timing = task
    return evaluate_point(pid, params, source, file, _TRACES[trace], rate, step_ms, timing)


Sink = Callable[[Point, dict[str, Any]], None]


def _failed(point: Point, exc: BaseException) -> PointFailed:
    if isinstance(exc, BrokenProcessPool):
        return PointFailed(
            f"a worker process died while running point {point.id} (killed: out of "
            "memory?)", hint="the rows so far are kept: run the command again to resume, "
            "with fewer workers (-j) if memory ran out")
    return PointFailed(
        f"point {point.id} failed: {type(exc).__name__}: {exc}",
        hint="this is a bug in kvspec: please report it with the grid (kvspec sweep GRID "
        f"--point {point.id} reproduces it); the rows so far are kept")


def _stop(pool: ProcessPoolExecutor) -> None:
    """Stop the pool now: cancel what is queued, end its workers (they may be in
    the middle of a point that takes minutes)."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.join(2)
        if proc.is_alive():
            proc.kill()
            proc.join()


def run_local(sweep: Sweep, todo: list[Point], sink: Sink, jobs: int) -> None:
    """Run ``todo`` on ``jobs`` worker processes, each row to ``sink`` as it
    finishes. A point that fails outside kvspec's errors, a worker killed, and
    Ctrl-C stop every worker at once."""
    by_id = {p.id: p for p in todo}
    window = max(4 * jobs, 8)
    forked = multiprocessing.get_start_method() == "fork"
    pool = ProcessPoolExecutor(max_workers=jobs, initializer=_init,
                               initargs=(sweep.traces, os.getpid(), forked))
    try:
        pending: dict[Future[dict[str, Any]], str] = {}
        queue = iter(todo)
        for p in queue:
            pending[pool.submit(_local, _task(p))] = p.id
            if len(pending) >= window:
                break
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                point = by_id[pending.pop(fut)]
                try:
                    row = fut.result()
                except Exception as exc:  # noqa: BLE001 - the sweep stops, saying which
                    raise _failed(point, exc) from None
                sink(point, row)
                nxt = next(queue, None)
                if nxt is not None:
                    pending[pool.submit(_local, _task(nxt))] = nxt.id
    except BaseException:
        _stop(pool)
        raise
    pool.shutdown(wait=True)


def _ray_point(task: tuple[Any, ...], trace_ref: list[Any]) -> dict[str, Any]:
    """A Ray task's body: the trace from this worker's cache, else the object store."""
    # deferred: Ray, only on Ray's workers
    import ray

    pid, params, source, file, trace, rate, step_ms, timing = task
    if trace not in _TRACES:
        _TRACES[trace] = ray.get(trace_ref[0])
    return evaluate_point(pid, params, source, file, _TRACES[trace], rate, step_ms, timing)


@dataclass(frozen=True)
class RayTarget:
    """Where ``--ray`` runs the points: ``local`` (a new local instance), ``auto``
    (the cluster this machine runs, as ``ray start`` recorded it), ``gcs`` (a
    cluster's GCS at ``host:port``) or ``client`` (Ray Client, ``ray://host:port``)."""

    kind: str
    host: str = ""
    port: int = 0

    @property
    def address(self) -> str | None:
        """The address ``ray.init`` takes."""
        if self.kind == "local":
            return None
        if self.kind == "auto":
            return "auto"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return ("ray://" if self.kind == "client" else "") + f"{host}:{self.port}"


#: What ``--ray`` takes, for its errors.
RAY_FORMS = ("nothing (a local Ray instance), auto (the cluster `ray start` runs on this "
             "machine), HOST:PORT (a cluster's GCS, e.g. 10.0.0.5:6379) or "
             "ray://HOST:PORT (Ray Client, e.g. ray://head:10001)")
_HOST = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)"
                   r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?")
#: Ray Client's port when a ray:// address gives none (Ray's own default).
CLIENT_PORT = 10001


def ray_target(text: str) -> RayTarget:
    """``--ray``'s value checked: a :class:`RayTarget`, or a usage error naming
    the option and the forms it takes."""
    if text in ("local", ""):
        return RayTarget("local")
    if text == "auto":
        return RayTarget("auto")
    client = text.startswith("ray://")
    rest = text[len("ray://"):] if client else text

    def bad(why: str) -> UsageError:
        return UsageError(f"--ray {text!r}: {why}", found=text, expected=RAY_FORMS,
                          hint="give the head node's address: `ray status` on it prints "
                          "the GCS address (port 6379 unless changed); Ray Client "
                          "listens on 10001")

    if "://" in text and not client:
        raise bad(f"Ray takes ray:// addresses, not {text.split('://')[0]}://")
    m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\](?::(\d+))?|([^:/\[\]]+)(?::(\d+))?", rest.rstrip("/"))
    if m is None:
        raise bad("not an address")
    host = m.group(1) or m.group(3) or ""
    port_text = m.group(2) if m.group(1) else m.group(4)
    if m.group(1) is None and not _HOST.fullmatch(host):
        raise bad(f"{host!r} is not a host name or an IP address")
    if port_text is None:
        if not client:
            raise bad("no port: a cluster's address is HOST:PORT")
        port = CLIENT_PORT
    else:
        port = int(port_text)
        if not 0 < port < 65536:
            raise bad(f"port {port_text} is not one of 1 to 65535")
    return RayTarget("client" if client else "gcs", host, port)


def connect_ray(target: RayTarget, **init: Any) -> None:
    """Join the cluster at ``target`` (or start a local instance): a usage error,
    naming ``--ray``, when Ray Client is not installed or nothing answers at the
    address within :data:`PROBE_S` seconds."""
    import ray  # deferred: Ray, only for --ray

    if ray.is_initialized():  # this process joined a cluster already
        return
    where = target.address
    check_ray(target)
    try:
        ray.init(address=where, include_dashboard=False, log_to_driver=False,
                 configure_logging=False, **init)
    except (ConnectionError, ValueError, RuntimeError, TimeoutError) as exc:
        raise UsageError(f"--ray {where or ''}".rstrip() + f": Ray could not connect: "
                         f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
                         hint="check the address (`ray status` on the head node), or run "
                         "`ray start --head` for --ray auto") from None


def check_ray(target: RayTarget) -> None:
    """Before any work: a usage error, naming ``--ray``, when a ray:// address
    finds Ray Client not installed, or nothing accepts a TCP connection at the
    address within :data:`PROBE_S` seconds."""
    if target.kind == "client" and not _client_installed():
        raise UsageError(f"--ray {target.address}: a ray:// address needs Ray Client, which "
                         "is not installed (the grpcio package)",
                         hint="pip install 'kvspec[ray]' (it installs ray[client]==2.60.0), "
                         "or give the cluster's GCS address HOST:PORT from a machine inside "
                         "it")
    if target.kind in ("gcs", "client"):
        _probe(target)


def _client_installed() -> bool:
    """Whether Ray Client can run here (``ray[client]``: grpcio)."""
    return importlib.util.find_spec("grpc") is not None


def _probe(target: RayTarget) -> None:
    """A TCP connection to the address, :data:`PROBE_S` seconds at most."""
    what = f"--ray {target.address}"
    try:
        socket.create_connection((target.host, target.port), timeout=PROBE_S).close()
    except socket.gaierror as exc:
        raise UsageError(f"{what}: no such host {target.host!r} ({exc.strerror})",
                         hint="check the head node's name, or give its IP address") from None
    except TimeoutError:
        raise UsageError(f"{what}: nothing answered within {PROBE_S:g} s",
                         hint="check the address and that this machine can reach it "
                         "(a firewall, a VPN)") from None
    except OSError as exc:
        raise UsageError(f"{what}: cannot connect ({exc.strerror or exc})",
                         hint="is the cluster running (`ray start --head` on the head)? "
                         "A cluster's GCS listens on 6379, Ray Client on 10001") from None


def run_ray(sweep: Sweep, todo: list[Point], sink: Sink, address: str | None,
            busy: Callable[[Callable[[], int | None]], None] | None = None) -> None:
    """Run ``todo`` as Ray tasks, one per point, on the cluster at ``address``
    (None: a local instance, or the one this process already joined)."""
    import ray  # deferred: Ray, only for --ray

    if not ray.is_initialized():
        ray.init(address=address or None, include_dashboard=False,
                 log_to_driver=False, configure_logging=False)
    remote = ray.remote(_ray_point)
    refs = {sha: ray.put(trace) for sha, trace in sweep.traces.items()}
    if busy is not None:
        busy(lambda: _cpus_in_use(ray))
    by_ref: dict[Any, Point] = {}
    queue = iter(todo)
    window = max(4 * int(ray.cluster_resources().get("CPU", 1)), 8)
    for p in queue:
        by_ref[remote.remote(_task(p), [refs[p.workload]])] = p
        if len(by_ref) >= window:
            break
    try:
        while by_ref:
            # a timeout, so Ctrl-C is seen between waits
            done, _ = ray.wait(list(by_ref), num_returns=1, timeout=_POLL_S)
            for ref in done:
                p = by_ref.pop(ref)
                try:
                    row = ray.get(ref)
                except Exception as exc:  # noqa: BLE001 - the sweep stops, saying which
                    raise _failed(p, getattr(exc, "cause", None) or exc) from None
                sink(p, row)
                nxt = next(queue, None)
                if nxt is not None:
                    by_ref[remote.remote(_task(nxt), [refs[nxt.workload]])] = nxt
    except BaseException:
        for ref in by_ref:
            with suppress(Exception):  # stopping: a task that has ended is fine
                ray.cancel(ref, force=True)
        raise


def _cpus_in_use(ray: Any) -> int | None:
    try:
        total = ray.cluster_resources().get("CPU", 0)
        free = ray.available_resources().get("CPU", 0)
    except Exception:  # noqa: BLE001 - a progress figure, never a failure
        return None
    return round(total - free)


def run_sweep(sweep: Sweep, results: Results | StreamResults, *, jobs: int = 1,
              ray_address: str | None = None, use_ray: bool = False,
              on_row: Callable[[dict[str, Any]], None] | None = None,
              busy: Callable[[Callable[[], int | None]], None] | None = None) -> int:
    """Run every point of ``sweep`` that ``results`` lacks; append each row as it
    finishes (a point's error located in the grid). Returns the points run."""
    todo = [p for p in sweep.points if p.id not in results.rows]

    def sink(point: Point, row: dict[str, Any]) -> None:
        if not row["ok"]:
            row = {**row, "error": locate(sweep, point, row["error"])}
        results.append(row)
        if on_row is not None:
            on_row(row)

    ready = [p for p in todo if p.error is not None or p.source is None]
    for p in ready:
        sink(p, row_of_error(p.id, p.params, p.error or {"message": "no source"}))
    todo = [p for p in todo if p not in ready]
    if not todo:
        return len(ready)
    if use_ray:
        run_ray(sweep, todo, sink, ray_address, busy)
    else:
        run_local(sweep, todo, sink, jobs)
    return len(ready) + len(todo)
