"""Running a sweep's points: a local process pool, or Ray; rows appended to a
JSON Lines file as they finish, so a killed sweep resumes.

* **Results file.** Each finished row is one line, written whole with one
  ``write``, flushed and ``fsync``'d before the next. A rerun reads the file,
  drops a torn last line (a line without its newline, or not JSON: the kill came
  mid-write), and skips every point whose id it holds: no row is lost or written
  twice. An exclusive lock (``flock``) keeps two sweeps off one file.
* **Local.** A :class:`~concurrent.futures.ProcessPoolExecutor` of ``jobs``
  workers; each worker gets the traces once, when it starts (its initializer),
  and every task names its trace by sha256.
* **Ray** (``kvspec[ray]``). One task per point. Each trace is put once into the
  object store, and a task carries its reference (inside a list, so Ray does not
  fetch it before the task runs): a worker fetches a trace the first time one of
  its tasks needs it and keeps it. Rows come back as tasks finish (``ray.wait``).
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from kvspec.errors import KvspecError
from kvspec.sim import TraceRequest
from kvspec.sweep.evaluate import evaluate_point, row_of_error
from kvspec.sweep.points import Point, Sweep, locate

__all__ = ["Results", "run_local", "run_ray", "run_sweep"]

#: The traces a local worker holds, by sha256 (set by its initializer).
_TRACES: dict[str, tuple[TraceRequest, ...]] = {}


class Results:
    """The results file: the rows it holds, and appending one."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rows: dict[str, dict[str, Any]] = {}
        self.dropped = 0
        self._file: IO[bytes] | None = None

    def open(self) -> Results:
        """Lock the file, read its rows, cut a torn last line."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        f = self.path.open("a+b")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            raise KvspecError(f"{self.path}: another sweep is writing it", hint="wait for it "
                              "to finish, or give another file with -o") from None
        f.seek(0)
        lines = f.read().splitlines(keepends=True)
        good = 0
        for number, line in enumerate(lines, 1):
            row = _row(line)
            if row is None and number < len(lines):
                f.close()
                raise KvspecError(f"{self.path}:{number}: not a row of a sweep's results",
                                  hint="a sweep only appends whole rows: this line was "
                                  "written by something else; give another file with -o")
            if row is None:  # the last line, cut short by a kill mid-write
                self.dropped = 1
                f.truncate(good)
                os.fsync(f.fileno())
                break
            self.rows.setdefault(row["id"], row)
            good += len(line)
        self._file = f
        return self

    def append(self, row: dict[str, Any]) -> None:
        """Write ``row`` as one line, durably."""
        assert self._file is not None
        if row["id"] in self.rows:
            return
        self._file.write(json.dumps(row, sort_keys=True).encode() + b"\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        self.rows[row["id"]] = row

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _row(line: bytes) -> dict[str, Any] | None:
    if not line.endswith(b"\n"):
        return None
    try:
        row = json.loads(line)
    except ValueError:
        return None
    return row if isinstance(row, dict) and isinstance(row.get("id"), str) else None


def _task(p: Point) -> tuple[Any, ...]:
    return (p.id, p.params, p.source, p.file, p.workload, p.rate, p.step_ms)


def _init(traces: dict[str, tuple[TraceRequest, ...]]) -> None:
    _TRACES.clear()
    _TRACES.update(traces)


def _local(task: tuple[Any, ...]) -> dict[str, Any]:
    pid, params, source, file, trace, rate, step_ms = task
    return evaluate_point(pid, params, source, file, _TRACES[trace], rate, step_ms)


Sink = Callable[[Point, dict[str, Any]], None]


def run_local(sweep: Sweep, todo: list[Point], sink: Sink, jobs: int) -> None:
    """Run ``todo`` on ``jobs`` worker processes, each row to ``sink`` as it finishes."""
    by_id = {p.id: p for p in todo}
    window = max(4 * jobs, 8)
    with ProcessPoolExecutor(max_workers=jobs, initializer=_init,
                             initargs=(sweep.traces,)) as pool:
        pending: dict[Future[dict[str, Any]], str] = {}
        queue = iter(todo)
        for p in queue:
            pending[pool.submit(_local, _task(p))] = p.id
            if len(pending) >= window:
                break
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                pid = pending.pop(fut)
                sink(by_id[pid], fut.result())
                nxt = next(queue, None)
                if nxt is not None:
                    pending[pool.submit(_local, _task(nxt))] = nxt.id


def _ray_point(task: tuple[Any, ...], trace_ref: list[Any]) -> dict[str, Any]:
    """A Ray task's body: the trace from this worker's cache, else the object store."""
    # deferred: Ray, only on Ray's workers
    import ray

    pid, params, source, file, trace, rate, step_ms = task
    if trace not in _TRACES:
        _TRACES[trace] = ray.get(trace_ref[0])
    return evaluate_point(pid, params, source, file, _TRACES[trace], rate, step_ms)


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
    while by_ref:
        done, _ = ray.wait(list(by_ref), num_returns=1)
        for ref in done:
            p = by_ref.pop(ref)
            sink(p, ray.get(ref))
            nxt = next(queue, None)
            if nxt is not None:
                by_ref[remote.remote(_task(nxt), [refs[nxt.workload]])] = nxt


def _cpus_in_use(ray: Any) -> int | None:
    try:
        total = ray.cluster_resources().get("CPU", 0)
        free = ray.available_resources().get("CPU", 0)
    except Exception:  # noqa: BLE001 - a progress figure, never a failure
        return None
    return round(total - free)


@contextmanager
def results_file(path: Path) -> Iterator[Results]:
    res = Results(path).open()
    try:
        yield res
    finally:
        res.close()


def run_sweep(sweep: Sweep, results: Results, *, jobs: int = 1, ray_address: str | None = None,
              use_ray: bool = False, on_row: Callable[[dict[str, Any]], None] | None = None,
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
