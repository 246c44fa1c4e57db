"""``kvspec sweep GRID``: every point of a grid of deployments compiled and
simulated, one row each, locally or on Ray (docs/sweep.md)."""

from __future__ import annotations

import importlib.util
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from kvspec.cli.common import (
    USAGE,
    check_output,
    echo_json,
    format_option,
    note,
    parents_option,
    progress,
    quiet_option,
)
from kvspec.cli.common import command as cli_command
from kvspec.cli.signals import signals_end_it
from kvspec.errors import EXIT_INVALID, EXIT_OK, EXIT_USAGE, UsageError
from kvspec.files import _kind, emit, is_stdout


def _our_report(text: str) -> bool:
    return '<meta name="generator" content="kvspec' in \
        text[:2048] and ": sweep report</title>" in text[:2048]


def _default_output(grid: Path) -> Path:
    return grid.with_name(grid.name.rsplit(".", 1)[0] + ".results.jsonl")


@cli_command("sweep", short_help="Compile and simulate every point of a grid of deployments.")
@click.argument("grid", type=click.Path(dir_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="The results (JSON Lines), appended to: a rerun skips the points it "
                   "holds. Default: GRID's name with .results.jsonl. -: the rows on stdout "
                   "(nothing to resume from; the table goes to stderr).")
@click.option("--ray", "ray_address", is_flag=False, flag_value="local", default=None,
              metavar="[ADDRESS]", help="Run the points as Ray tasks (kvspec[ray]): on a "
              "local instance, or at ADDRESS: auto (the cluster `ray start` runs here), "
              "HOST:PORT (a cluster's GCS) or ray://HOST:PORT (Ray Client).")
@click.option("-j", "--jobs", type=click.IntRange(min=1), help="Worker processes of the "
              "local pool (default: the machine's cores).")
@click.option("--report", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the HTML report here: the Pareto front and the best point per "
                   "workload.")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the rows as CSV here too.")
@click.option("--point", "point_id", metavar="ID", help="Run only the point with this id and "
              "print its row (the command each row of the report links to).")
@format_option("text", "json", help="text: the best point per workload; json: those and "
               "the counts, as one object.")
@click.option("--force", is_flag=True, help="Replace a --report or --csv file that is not "
              "this command's output, and start an -o file afresh (its lines lost) that "
              "is not this grid's rows.")
@parents_option
@quiet_option
def command(grid: Path, output: Path | None, ray_address: str | None, jobs: int | None,
            report: Path | None, csv_path: Path | None, point_id: str | None, fmt: str,
            force: bool, parents: bool, quiet: bool) -> int:
    """Run every point of GRID (a sweep grid, docs/sweep.md): each model with each
    combination of the axes' values that meets the constraints, compiled and its
    workload simulated, one JSON row per point (static capacity, mean and peak
    running, the physical limit, the GPUs the target rate needs, the artifact's
    sha256, or the point's error). Bad grids fail before anything runs; a point
    that fails to plan is a row with its error. Rows are appended as points
    finish: rerun the command to resume a sweep that was stopped."""
    # deferred: the compiler and the simulator (the sweep), only when the command runs
    from kvspec.sweep import plan_sweep, read_grid
    from kvspec.sweep.execute import ray_target

    out = output or _default_output(grid)
    stream = is_stdout(out) or _kind(out) == "stream"
    _check_outputs(grid, out, report, csv_path, fmt=fmt, force=force, parents=parents)
    target = ray_target(ray_address) if ray_address is not None else None
    if target is not None:
        _need_ray()
        _reachable(target)
    if point_id is not None:
        return _one(plan_sweep(read_grid(str(grid))), point_id)
    _writable(report, "--report", parents)
    _writable(csv_path, "--csv", parents)
    results = _open_results(out, stream, force)
    try:
        sweep = plan_sweep(read_grid(str(grid)))
        results.adopt(sweep)
        if target is not None:
            _connect(target, results)
        rows, ran = _run(sweep, results, target, jobs or os.cpu_count() or 1, quiet)
    except BaseException:
        results.close(discard=True)  # a sweep stopped before its first row leaves no file
        raise
    results.close()
    return _summary(sweep, rows, ran, results, grid=grid, out=out, report=report,
                    csv_path=csv_path, fmt=fmt, quiet=quiet)


def _check_outputs(grid: Path, out: Path, report: Path | None, csv_path: Path | None, *,
                   fmt: str, force: bool, parents: bool) -> None:
    """Each output's path against the policy every command keeps (its error
    naming the option), before any work."""
    # deferred: the compiler and the simulator (the sweep), only when the command runs
    from kvspec.sweep.results import is_results

    if is_stdout(out) and fmt == "json":
        raise UsageError("-o - writes the rows to stdout: --format json has nowhere to go",
                         hint="give -o a file for the rows, or leave out --format json")
    _check("-o/--output", out, suffixes=(".jsonl",), force=True, parents=parents,
           inputs=(grid,))
    if not force and _kind(out) == "file":
        _refuse_foreign(out, is_results)
    _check("--report", report, suffixes=(".html",), force=force, parents=parents,
           inputs=(grid, out), ours=_our_report)
    _check("--csv", csv_path, suffixes=(".csv",), force=force, parents=parents,
           inputs=(grid, out), ours=lambda text: text.startswith("id,model,"))


def _summary(sweep: Any, rows: list[dict[str, Any]], ran: int, results: Any, *, grid: Path,
             out: Path, report: Path | None, csv_path: Path | None, fmt: str, quiet: bool
             ) -> int:
    """The notes, the CSV and the report, and the best point per workload."""
    where = "-" if is_stdout(out) else str(out)
    if results.replaced:
        note(f"{where}: started afresh (--force): it held no rows of this grid", quiet=quiet)
    if results.dropped:
        note(f"{where}: dropped a torn last line (a sweep stopped mid-write)", quiet=quiet)
    note(f"{len(rows):,} points: {ran:,} run, {len(rows) - ran:,} from {where}; "
         f"{sum(not r['ok'] for r in rows):,} with errors", quiet=quiet)
    # deferred: the compiler (the sweep's report), only when the command runs
    from kvspec.sweep.report import best_rows, render_report, write_csv

    if csv_path is not None:
        write_csv(rows, csv_path)
        note(f"wrote {csv_path}", quiet=quiet)
    if report is not None:
        emit(render_report(sweep, rows, grid=str(grid), output=where), report, quiet=quiet)
    best = best_rows(rows)
    if fmt == "json":
        echo_json({"ok": True, "points": len(rows), "run": ran,
                   "errors": sum(not r["ok"] for r in rows), "output": where,
                   "best": best})
        return EXIT_OK
    if is_stdout(out):  # stdout carries the rows alone
        if not quiet:
            click.echo(_table(best, rows), err=True)
        return EXIT_OK
    click.echo(_table(best, rows))
    return EXIT_OK


def _check(option: str, path: Path | None, **policy: Any) -> None:
    """:func:`check_output`, its error naming the option."""
    try:
        check_output(path, **policy)
    except UsageError as err:
        text = err.message
        raise err.replace(message=f"{option} {text}" if text.startswith(str(path))
                          else f"{option}: {text}") from None


def _refuse_foreign(out: Path, ours: Callable[[str], bool]) -> None:
    """A usage error when the -o file is not a sweep's results (its first line
    tells; :class:`~kvspec.sweep.execute.Results` reads every line)."""
    try:
        with out.open(encoding="utf-8", errors="replace") as f:
            head = f.read(1 << 16)
    except OSError as exc:
        raise _cannot_write("-o/--output", out, exc) from None
    if ours(head if "\n" in head or len(head) < 1 << 16 else head + "\n"):
        return
    first = head.split("\n", 1)[0]
    raise UsageError(f"-o/--output {out}: not a sweep's results file",
                     found=first[:60] + ("..." if len(first) > 60 else ""),
                     expected="rows a sweep wrote (JSON objects with id, point, ok), or an "
                     "empty file",
                     hint="a sweep appends its rows to this file: give -o another path, or "
                     "pass --force to start it afresh (its lines are lost)")


def _writable(path: Path | None, option: str, parents: bool) -> None:
    """A usage error, before any work, when ``path``'s directory takes no new file
    (read-only, not ours): a file is created there and removed at once."""
    if path is None or is_stdout(path) or _kind(path) == "stream":
        return
    try:
        if parents:
            path.parent.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.kvspec-tmp-", dir=path.parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise _cannot_write(option, path, exc) from None


def _cannot_write(option: str, path: Path, exc: OSError) -> UsageError:
    return UsageError(f"{option} {path}: cannot write it ({exc.strerror or exc})",
                      found=str(path), hint=f"give {option.split('/')[0]} a path in a "
                      "directory you can write to" +
                      (" (or - for stdout)" if option.startswith("-o") else ""))


def _open_results(out: Path, stream: bool, force: bool) -> Any:
    """The results: the -o file, opened, locked and read (a usage error naming
    the option when it cannot be written), or a stream to write rows to."""
    # deferred: the compiler and the simulator (the sweep), only when the command runs
    from kvspec.sweep.results import Results, StreamResults

    if stream:
        if is_stdout(out):
            return StreamResults(lambda line: click.echo(line, nl=False))
        try:
            handle = out.open("a", encoding="utf-8")
        except OSError as exc:
            raise _cannot_write("-o/--output", out, exc) from None

        def write(line: str) -> None:
            handle.write(line)
            handle.flush()
        return StreamResults(write)
    try:
        return Results(out, force=force).open()
    except OSError as exc:
        raise _cannot_write("-o/--output", out, exc) from None


def _one(sweep: Any, point_id: str) -> int:
    # deferred: the compiler and the simulator (the sweep), only when the command runs
    from kvspec.sweep.evaluate import evaluate_point, row_of_error
    from kvspec.sweep.points import locate

    point = next((p for p in sweep.points if p.id == point_id), None)
    if point is None:
        raise UsageError(f"no point of this grid has the id {point_id!r}",
                         hint="take the id from a row of the results, or from the report")
    if point.source is None:
        row = row_of_error(point.id, point.params, point.error or {})
    else:
        row = evaluate_point(point.id, point.params, point.source, point.file,
                             sweep.traces[point.workload], point.rate, point.step_ms,
                             point.timing)
    if not row["ok"]:
        row = {**row, "error": locate(sweep, point, row["error"])}
    echo_json(row)
    return EXIT_OK


def _reachable(target: Any) -> None:
    """``--ray``'s address answers (a TCP probe, seconds at most; Ctrl-C ends it)."""
    # deferred: the compiler and the simulator (the sweep), only when the command runs
    from kvspec.sweep.execute import check_ray

    with signals_end_it(lambda: None):
        check_ray(target)


#: Seconds Ray has to connect to a cluster's address before the command gives up.
CONNECT_S = 10.0


def _connect(target: Any, results: Any) -> None:
    """Reach Ray at ``target``. An address is given :data:`CONNECT_S` seconds
    (Ray itself retries for half a minute or more), and Ctrl-C or SIGTERM while
    Ray connects (it waits in its own code, where Python's handlers cannot run)
    ends the command at once."""
    if target.kind == "gcs":  # Ray's tries at a GCS, a second each (20 by default)
        os.environ.setdefault("RAY_NUM_REDIS_GET_RETRIES", "3")
    # deferred: the compiler and the simulator (the sweep), only when the command runs
    from kvspec.sweep.execute import connect_ray

    if target.kind == "local":  # Ray starts it in Python: Ctrl-C stops it, cleaning up
        connect_ray(target)
        return
    late = UsageError(f"--ray {target.address}: no Ray cluster answered within "
                      f"{CONNECT_S:g} s", hint="check the address: a cluster's GCS "
                      "(HOST:PORT, port 6379 unless changed), or its Ray Client server "
                      "(ray://HOST:PORT, port 10001)")
    with signals_end_it(lambda: results.close(discard=True), deadline=(CONNECT_S, late)):
        connect_ray(target)


def _run(sweep: Any, results: Any, target: Any, jobs: int, quiet: bool
         ) -> tuple[list[dict[str, Any]], int]:
    # deferred: the compiler and the simulator (the sweep), only when the command runs
    from kvspec.sweep.execute import run_sweep

    todo = sum(p.id not in results.rows for p in sweep.points)
    with progress(todo or None, label="sweeping", quiet=quiet or not todo) as bar:
        start = [time.monotonic()]
        cpus: list[int | None] = [None]
        asked = [0.0]
        in_use: list[Callable[[], int | None]] = []

        def on_row(row: dict[str, Any]) -> None:
            done = bar.done + 1
            rate = done / max(time.monotonic() - start[0], 1e-9)
            text = f"{rate:.1f} points/s"
            if in_use and time.monotonic() - asked[0] >= 1.0:  # a cluster query a second
                asked[0] = time.monotonic()
                cpus[0] = in_use[0]()
            if in_use:
                text += f", {cpus[0]} CPUs in use" if cpus[0] is not None else ""
            bar.advance(text)

        def busy(cpus_in_use: Callable[[], int | None]) -> None:
            in_use.append(cpus_in_use)  # Ray is up: points/s count from here
            start[0] = time.monotonic()

        ran = run_sweep(sweep, results, jobs=jobs, use_ray=target is not None,
                        ray_address=None if target is None else target.address,
                        on_row=on_row, busy=busy)
    rows = [results.rows[p.id] for p in sweep.points]
    return rows, ran


def _need_ray() -> None:
    if importlib.util.find_spec("ray") is None:  # not imported: Ray reads settings then
        raise UsageError("--ray needs Ray: it is not installed",
                         hint="pip install 'kvspec[ray]' (ray[client] 2.60.0), or run "
                              "without --ray on this machine's cores")


def _table(best: list[dict[str, Any]], rows: list[dict[str, Any]]) -> str:
    # deferred: the compiler (the sweep's report), only when the command runs
    from kvspec.reports.format import table
    from kvspec.sweep.report import UNSATURATED, point_text

    def rate(r: dict[str, Any]) -> str:
        return _n(r.get("requests_per_gpu"), "{:.2f}") + ("" if r.get("saturated") else "*")

    lines = [[r["point"]["workload"], r["point"]["model"], point_text(r), _n(r.get("gpus")),
              rate(r), r["id"]] for r in best]
    served = {r["point"]["workload"] for r in best}
    missing = [w for w in dict.fromkeys(r["point"]["workload"] for r in rows) if w not in served]
    slo = next((r["slo"]["limits"] for r in rows if r.get("slo")), None)
    out = []
    if lines:
        out.append("best point per workload (fewest GPUs for the target rate" +
                   (f" within the SLO {', '.join(slo)}" if slo else "") + ")\n" + table(
            lines, ["workload", "model", "point", "GPUs", "req/s per GPU", "id"]))
    if any(not r.get("saturated") for r in best):
        out.append("* " + UNSATURATED)
    for w in missing:
        unmet = [r for r in rows if r["point"]["workload"] == w and r.get("slo")
                 and not r["slo"]["met"]]
        out.append(f"workload {w}: no point meets the SLO {', '.join(slo or ())} at the target "
                   f"rate ({len(unmet):,} tried; each row's slo.at says how close it came)"
                   if unmet else f"workload {w}: no point serves it (each refuses some of its "
                   "requests, or failed: see the rows)")
    return "\n".join(out)


def _n(v: Any, spec: str = "{:,}") -> str:
    return "-" if v is None else spec.format(v)


#: ``kvspec sweep``'s exit codes and what each means (docs/cli.md).
EXITS = (
    (EXIT_OK, "every point ran (a point that failed to plan is a row with its error)"),
    (EXIT_INVALID, ("the grid is invalid before anything runs: an unknown axis, a value a "
                    "source refuses, a constraint that does not parse, no point left after "
                    "the constraints (file:line:column); the -o file holds a line that is "
                    "not a row, or a row of another grid (file:line); a point failed "
                    "outside kvspec's errors, or a worker died (the rows so far kept)")),
    (EXIT_USAGE, USAGE + "; -o, --report or --csv cannot be written; --ray with an address "
                 "that is not one, that nothing answers at, or without Ray (or Ray Client) "
                 "installed; --point with an id not in the grid"),
)
#: Pages to read next (docs/cli.md).
SEE_ALSO = ("sweep.md", "simulate.md")
