"""``kvspec sweep GRID``: every point of a grid of deployments compiled and
simulated, one row each, locally or on Ray (docs/sweep.md)."""

from __future__ import annotations

import os
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
from kvspec.cli.outputs import jsonl_with
from kvspec.errors import EXIT_INVALID, EXIT_OK, EXIT_USAGE, UsageError
from kvspec.files import emit

_rows = jsonl_with("id", "point", "ok")


def _ours(text: str) -> bool:
    """A sweep's results file (appended to, never replaced): its rows have ids and
    points; empty, or its first row cut short, when a sweep was stopped that early."""
    return not text or ("\n" not in text and text.startswith("{")) or _rows(text)


def _our_report(text: str) -> bool:
    return '<meta name="generator" content="kvspec' in \
        text[:2048] and ": sweep report</title>" in text[:2048]


def _default_output(grid: Path) -> Path:
    return grid.with_name(grid.name.rsplit(".", 1)[0] + ".results.jsonl")


@cli_command("sweep", short_help="Compile and simulate every point of a grid of deployments.")
@click.argument("grid", type=click.Path(dir_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="The results (JSON Lines), appended to: a rerun skips the points it "
                   "holds. Default: GRID's name with .results.jsonl.")
@click.option("--ray", "ray_address", is_flag=False, flag_value="local", default=None,
              metavar="[ADDRESS]", help="Run the points as Ray tasks (kvspec[ray]): on the "
              "cluster at ADDRESS, or a local instance.")
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
              "this command's output.")
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
    from kvspec.sweep.report import best_rows, render_report, write_csv

    out = output or _default_output(grid)
    check_output(out, suffixes=(".jsonl",), parents=parents, inputs=(grid,), ours=_ours)
    check_output(report, suffixes=(".html",), force=force, parents=parents,
                 inputs=(grid, out), ours=_our_report)
    check_output(csv_path, suffixes=(".csv",), force=force, parents=parents,
                 inputs=(grid, out), ours=lambda text: text.startswith("id,model,"))
    sweep = plan_sweep(read_grid(str(grid)))
    if point_id is not None:
        return _one(sweep, point_id)
    rows, ran, dropped = _run(sweep, out, ray_address, jobs or os.cpu_count() or 1, quiet)
    if dropped:
        note(f"{out}: dropped a torn last line (a sweep stopped mid-write)", quiet=quiet)
    note(f"{len(rows):,} points: {ran:,} run, {len(rows) - ran:,} from {out}; "
         f"{sum(not r['ok'] for r in rows):,} with errors", quiet=quiet)
    if csv_path is not None:
        write_csv(rows, csv_path)
        note(f"wrote {csv_path}", quiet=quiet)
    if report is not None:
        emit(render_report(sweep, rows, grid=str(grid), output=str(out)), report, quiet=quiet)
    best = best_rows(rows)
    if fmt == "json":
        echo_json({"ok": True, "points": len(rows), "run": ran,
                   "errors": sum(not r["ok"] for r in rows), "output": str(out),
                   "best": best})
        return EXIT_OK
    click.echo(_table(best, rows))
    return EXIT_OK


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
                             sweep.traces[point.workload], point.rate, point.step_ms)
    if not row["ok"]:
        row = {**row, "error": locate(sweep, point, row["error"])}
    echo_json(row)
    return EXIT_OK


def _run(sweep: Any, out: Path, ray_address: str | None, jobs: int, quiet: bool
         ) -> tuple[list[dict[str, Any]], int, int]:
    # deferred: the compiler and the simulator (the sweep), only when the command runs
    from kvspec.sweep.execute import results_file, run_sweep

    with results_file(out) as results:
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

            if ray_address is not None:
                _need_ray()
            ran = run_sweep(sweep, results, jobs=jobs, use_ray=ray_address is not None,
                            ray_address=None if ray_address == "local" else ray_address,
                            on_row=on_row, busy=busy)
        rows = [results.rows[p.id] for p in sweep.points]
        return rows, ran, results.dropped


def _need_ray() -> None:
    try:
        import ray  # noqa: F401  # deferred: Ray, only for --ray
    except ImportError:
        raise UsageError("--ray needs Ray: it is not installed",
                         hint="pip install 'kvspec[ray]' (ray 2.60.0), or run without "
                              "--ray on this machine's cores") from None


def _table(best: list[dict[str, Any]], rows: list[dict[str, Any]]) -> str:
    # deferred: the compiler (the sweep's report), only when the command runs
    from kvspec.reports.format import table
    from kvspec.sweep.report import point_text

    lines = [[r["point"]["workload"], r["point"]["model"], point_text(r), _n(r.get("gpus")),
              _n(r.get("requests_per_gpu"), "{:.2f}"), r["id"]] for r in best]
    served = {r["point"]["workload"] for r in best}
    missing = [w for w in dict.fromkeys(r["point"]["workload"] for r in rows) if w not in served]
    out = []
    if lines:
        out.append("best point per workload (fewest GPUs for the target rate)\n" + table(
            lines, ["workload", "model", "point", "GPUs", "req/s per GPU", "id"]))
    out += [f"workload {w}: no point serves it (each refuses some of its requests, or "
            "failed: see the rows)" for w in missing]
    return "\n".join(out)


def _n(v: Any, spec: str = "{:,}") -> str:
    return "-" if v is None else spec.format(v)


#: ``kvspec sweep``'s exit codes and what each means (docs/cli.md).
EXITS = (
    (EXIT_OK, "every point ran (a point that failed to plan is a row with its error)"),
    (EXIT_INVALID, ("the grid is invalid before anything runs: an unknown axis, a value a "
                    "source refuses, a constraint that does not parse, no point left after "
                    "the constraints (file:line:column)")),
    (EXIT_USAGE, USAGE + "; --ray without Ray installed; --point with an id not in the grid"),
)
#: Pages to read next (docs/cli.md).
SEE_ALSO = ("sweep.md", "simulate.md")
