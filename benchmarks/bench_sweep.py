"""What ``kvspec sweep`` costs beyond the work of its points.

    python benchmarks/bench_sweep.py [--points N] [--requests N] [--ray auto|off] [--json]

One grid (a small 8-layer model, ``--points`` points over memory, block size and
``kv_cache_dtype``, one workload of ``--requests`` requests), run five ways in one
process, each timed from the first point to the last row (planning the grid and
starting a pool or Ray are timed apart):

1. *direct* -- the baseline: each point compiled and simulated by the library
   (:func:`kvspec.sweep.evaluate.evaluate_point`) one after another, no pool, no
   results file;
2. *local, 1 worker* -- ``run_sweep`` on a process pool of one worker, every row
   appended and fsync'd; its overhead per point over the baseline (goal <= 5%);
3. *local, 2 workers* -- the same on two; points per second over one worker's
   (goal >= 1.8x: needs two idle cores);
4. *Ray* -- a local instance of one CPU (``ray.init(num_cpus=1)``), one task per
   point; its overhead per point over the baseline (goal <= 15%);
5. the bytes each Ray task carries (its pickled arguments) against the trace's,
   which goes once into the object store (goal: 0 bytes of trace per task).

Rows must be identical every way (checked). Ratios, never absolute goals, are
compared: all runs share the machine's load, whatever it is. Each is given in wall
time and in CPU time (this process, the pool's workers, and on Ray every process
under this one: its daemons and worker): on a loaded machine the wall times say
more about the neighbours than about the sweep, the CPU times do not.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pickle
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kvspec.sweep import evaluate as ev  # noqa: E402
from kvspec.sweep import parse_grid, plan_sweep  # noqa: E402
from kvspec.sweep.execute import _task, results_file, run_sweep  # noqa: E402

GOALS = {"local": 0.05, "ray": 0.15, "speedup": 1.8}

TINY = """\
kvspec: 1
name: tiny
layer_name: "model.layers.{index}.self_attn.attn"
engine: {block_size: 16, max_model_len: 8192, memory: 1GiB}
defaults: {num_kv_heads: 8, head_size: 128, dtype: bfloat16}
layer_types:
  attn: {kind: full_attention}
layers:
  - {repeat: 8, pattern: [attn]}
"""


def _grid(points: int, requests: int, where: Path) -> Any:
    (where / "tiny.yaml").write_text(TINY)
    mem = [f"{m}MiB" for m in range(512, 512 + 64 * max(points // 4, 1), 64)][:max(points // 4, 1)]
    text = f"""\
kvspec_sweep: 1
base: tiny.yaml
axes:
  memory: [{", ".join(mem)}]
  block_size: [16, 32]
  kv_cache_dtype: [auto, fp8]
  workload: [{{name: w, context_tokens: 1024, output_tokens: 128, requests: {requests}}}]
target: {{rate: 100, step_ms: 30}}
"""
    (where / "grid.yaml").write_text(text)
    return plan_sweep(parse_grid(text, str(where / "grid.yaml")))


def _cpu() -> float:
    """CPU seconds of this process and of its children that have ended."""
    me, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF,
                                                 resource.RUSAGE_CHILDREN))
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _descendants_cpu() -> float:
    """CPU seconds of the processes running under this one now (Ray's daemons and
    workers), from /proc."""
    parent: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        parent[int(entry)] = int(fields[1])
        ticks[int(entry)] = int(fields[11]) + int(fields[12])
    me, total = os.getpid(), 0
    for pid in ticks:
        p = parent.get(pid)
        while p is not None and p > 1 and p != me:
            p = parent.get(p)
        if p == me and pid != me:
            total += ticks[pid]
    return total / os.sysconf("SC_CLK_TCK")


def _direct(sweep: Any) -> tuple[list[dict[str, Any]], float, float]:
    ev._compiled.cache_clear()
    gc.collect()
    start, cpu = time.perf_counter(), _cpu()
    rows = [ev.evaluate_point(p.id, p.params, p.source, p.file, sweep.traces[p.workload],
                              p.rate, p.step_ms) for p in sweep.points]
    return rows, time.perf_counter() - start, _cpu() - cpu


def _swept(sweep: Any, where: Path, name: str, **kw: Any
           ) -> tuple[list[dict[str, Any]], float, float]:
    """Rows, wall seconds and CPU seconds (this process and the pool's workers,
    which end with the run; Ray's workers are not counted)."""
    out = where / f"{name}.jsonl"
    out.unlink(missing_ok=True)
    with results_file(out) as res:
        start, cpu = time.perf_counter(), _cpu()
        run_sweep(sweep, res, **kw)
        took = time.perf_counter() - start
        return [res.rows[p.id] for p in sweep.points], took, _cpu() - cpu


def _driver_cpu(sweep: Any, where: Path) -> float:
    """CPU seconds the driver alone spends on a 1-worker run (the part two workers
    cannot share): the run's CPU less its worker's, read at the worker's end."""
    before = resource.getrusage(resource.RUSAGE_SELF)
    _swept(sweep, where, "driver", jobs=1)
    after = resource.getrusage(resource.RUSAGE_SELF)
    return (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def _warm() -> bool:
    """A Ray worker's first task: import what a point needs, compile nothing."""
    import kvspec.sweep.execute  # noqa: F401

    return True


def _ray(sweep: Any, where: Path) -> dict[str, Any] | None:
    try:
        import ray
    except ImportError:
        return None
    start = time.perf_counter()
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    try:
        started = time.perf_counter() - start
        ray.get(ray.remote(_warm).remote())  # a worker started, kvspec imported
        before = _descendants_cpu()
        rows, took, own = _swept(sweep, where, "ray", use_ray=True)
        cpu = own + _descendants_cpu() - before
        p = sweep.points[0]
        ref = ray.put(sweep.traces[p.workload])
        task_bytes = len(pickle.dumps((_task(p), [ref])))
        return {"rows": rows, "seconds": took, "start_seconds": started, "ray_cpu": cpu,
                "task_bytes": task_bytes,
                "ref_bytes": task_bytes - len(pickle.dumps((_task(p), []))),
                "task_bytes_with_trace_inline": len(pickle.dumps(
                    (_task(p), [sweep.traces[p.workload]]))),
                "trace_bytes": len(pickle.dumps(sweep.traces[p.workload])),
                "source_bytes": len((p.source or "").encode())}
    finally:
        ray.shutdown()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", type=int, default=40)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--ray", choices=["auto", "off"], default="auto")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        start = time.perf_counter()
        sweep = _grid(args.points, args.requests, where)
        plan = time.perf_counter() - start
        base_rows, base, base_cpu = _direct(sweep)
        one_rows, one, one_cpu = _swept(sweep, where, "one", jobs=1)
        two_rows, two, two_cpu = _swept(sweep, where, "two", jobs=2)
        driver = _driver_cpu(sweep, where)
        ray = _ray(sweep, where) if args.ray == "auto" else None
    n = len(sweep.points)
    same = base_rows == one_rows == two_rows and (ray is None or ray["rows"] == base_rows)
    report = {"points": n, "requests": args.requests, "plan_seconds": plan,
              "direct_seconds": base, "local1_seconds": one, "local2_seconds": two,
              "local_overhead": one / base - 1, "speedup_2_vs_1": one / two,
              "direct_cpu": base_cpu, "local1_cpu": one_cpu, "local2_cpu": two_cpu,
              "local_cpu_overhead": one_cpu / base_cpu - 1,
              "driver_cpu": driver, "serial_share": driver / one_cpu,
              "speedup_bound": 1 / (driver / one_cpu + (1 - driver / one_cpu) / 2),
              "cpus": len(os.sched_getaffinity(0)), "load": os.getloadavg()[0],
              "same_rows": same}
    if ray is not None:
        report.update({k: v for k, v in ray.items() if k != "rows"},
                      ray_overhead=ray["seconds"] / base - 1,
                      ray_cpu_overhead=ray["ray_cpu"] / base_cpu - 1)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(_text(report))
    return 0 if same else 1


def _text(r: dict[str, Any]) -> str:
    n = r["points"]
    lines = [
        (f"{n} points of {r['requests']} requests each; grid planned and checked in "
         f"{r['plan_seconds']:.2f} s; {r['cpus']} CPUs, load {r['load']:.1f}"),
        (f"direct (compile + simulate)  {r['direct_seconds']:7.2f} s  "
         f"{r['direct_seconds'] / n * 1000:6.1f} ms/point"),
        (f"local pool, 1 worker         {r['local1_seconds']:7.2f} s  overhead "
         f"{r['local_overhead']:+.1%} per point   goal <= {GOALS['local']:.0%}"),
        (f"  in CPU time                {r['local1_cpu']:7.2f} s  overhead "
         f"{r['local_cpu_overhead']:+.1%} (direct {r['direct_cpu']:.2f} s)"),
        (f"local pool, 2 workers        {r['local2_seconds']:7.2f} s  "
         f"{r['speedup_2_vs_1']:.2f}x the points/s of 1   goal >= {GOALS['speedup']}x"),
        (f"  the driver's own CPU       {r['driver_cpu']:7.2f} s  "
         f"{r['serial_share']:.1%} of a 1-worker run: 2 idle cores give at most "
         f"{r['speedup_bound']:.2f}x")]
    if "ray_overhead" in r:
        lines.append(f"Ray, 1 CPU                   {r['seconds']:7.2f} s  overhead "
                     f"{r['ray_overhead']:+.1%} per point   goal <= {GOALS['ray']:.0%} "
                     f"(ray.init {r['start_seconds']:.1f} s apart)")
        lines.append(f"  in CPU time                {r['ray_cpu']:7.2f} s  overhead "
                     f"{r['ray_cpu_overhead']:+.1%} (the driver, Ray's daemons and worker)")
        lines.append(f"Ray task arguments {r['task_bytes']:,} B (the point's source "
                     f"{r['source_bytes']:,} B); with the trace inline "
                     f"{r['task_bytes_with_trace_inline']:,} B; the trace "
                     f"{r['trace_bytes']:,} B goes once to the object store, and a task "
                     f"carries its reference ({r['ref_bytes']} B): 0 B of trace per task")
    else:
        lines.append("Ray: not measured (not installed, or --ray off)")
    lines.append(f"rows identical every way: {r['same_rows']}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
