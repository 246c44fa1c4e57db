"""kvspec against vLLM 0.33.0's own planner, side by side in one process.

    python benchmarks/bench_vs_vllm.py                 # kvspec's figures only
    VLLM_TARGET_DEVICE=cpu /work/venv-vllm/bin/python benchmarks/bench_vs_vllm.py

For every conformance case (tests/conformance/cases) and for models of 1,000,
10,000 and 100,000 uniform full-attention layers it times, interleaved, the
median of ``--runs``:

* **kvspec**: the whole in-process compile of the case's source (``kvspec
  import`` of the dump, done once beforehand): parse, validate, expand, plan,
  size and freeze into the hashed artifact (``kvspec.compiler.compile_source``);
* **vLLM**: its planning calls alone, ``get_global_kv_cache_groups`` +
  ``get_kv_cache_configs``, on spec objects and a ``VllmConfig`` built
  beforehand (kvspec's vLLM bridge builds them from the plan, as
  ``kvspec verify --against vllm`` does).

Two timings of each, both interleaved between kvspec and vLLM:

* **cold**: one call per run, after ``gc.collect()`` (as ``timeit`` does): with
  torch and vLLM in the process that walk evicts the CPU caches, so each call
  starts cold, as a single compile in a pre-commit hook does;
* **warm**: the median over runs of the mean of a batch of calls (each batch
  about 20 ms), as a sweep or a search over block sizes compiles.

The ratio is kvspec / vLLM (goal: median <= 0.2, none > 0.5; 10k layers <= 0.2
and t(10k) / t(1k) <= 11). Without vLLM the comparison is skipped and said so.

**floor** is timed with them: the library calls every compile of the case's
source makes around kvspec's own work: libyaml's C ``yaml.compose`` of the text,
the pydantic validation of its data (``Source.model_validate``, on data parsed
beforehand), and the artifact's canonical compact text (msgspec) with the sha256
that covers it. ``floor / vLLM`` is the ratio no compile built on this stack can
go under; where it is over a goal, no work of kvspec's can meet that goal.

``--other`` adds the goals measured in fresh processes: ``kvspec validate`` of
100,000 layers (time and peak RSS), and the cold CLI against ``python -c pass``,
with the floor of the latter: a process that only imports the stack's libraries
the command needs (PyYAML, click and pydantic) and defines one pydantic model.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

from kvspec.compiler import compile_source  # noqa: E402 - after the path and vLLM's settings

CASES = REPO / "tests" / "conformance" / "cases"


def uniform_source(layers: int) -> str:
    return f"""kvspec: 1
name: uniform-{layers}
engine: {{block_size: 16, max_model_len: 4096, memory: 64TiB}}
defaults: {{num_kv_heads: 8, head_size: 128, dtype: bfloat16}}
layer_types:
  full: {{kind: full_attention}}
layers:
  - {{type: full, repeat: {layers}}}
"""


def case_sources(only: str | None) -> list[tuple[str, str]]:
    """(name, source text) of every conformance case that compiles, and the sizes."""
    from kvspec.errors import KvspecError
    from kvspec.integrations.dump.importer import import_source
    from kvspec.integrations.dump.read import read_dump_file

    out = []
    for path in sorted(CASES.glob("*.json")):
        if only and only not in path.stem:
            continue
        data, raw = read_dump_file(path)
        model = data.get("model")
        text = import_source(data, str(path), raw).text(model if isinstance(model, str)
                                                         else None)
        try:
            compile_source(text, f"{path.stem}.yaml")
        except KvspecError as err:  # e.g. a case whose budget is too small on purpose
            print(f"  ({path.stem}: not compiled, {err.message[:60]}...)")
            continue
        out.append((path.stem, text))
    return out


# ---------------------------------------------------------------------------
# the vLLM side
# ---------------------------------------------------------------------------


def vllm_available() -> str | None:
    try:
        from importlib.metadata import version
        return version("vllm")
    except Exception:  # noqa: BLE001 - not installed
        return None


def vllm_planner(text: str, name: str) -> Callable[[], None] | None:
    """vLLM's two planning calls on prebuilt specs and config, as a closure."""
    import logging

    logging.disable(logging.WARNING)
    from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
    from vllm.v1.engine import core

    from kvspec.integrations.vllm.specs import engine_settings, to_vllm
    from kvspec.integrations.vllm.v0_33.config import planning_config
    from kvspec.integrations.vllm.v0_33.planning import worker_specs

    art = compile_source(text, f"{name}.yaml")
    plan, budget = art.layout.plan, art.layout.budget
    assert budget is not None
    stages = [{n: to_vllm(plan.specs[n]) for n in st.layer_names} for st in plan.stages]
    try:
        vc, _ = planning_config(engine_settings(plan.engine))
        workers = worker_specs(stages)
    except Exception as exc:  # noqa: BLE001 - a kind vLLM 0.33.0 lacks (by design)
        print(f"  ({name}: vLLM cannot build it: {type(exc).__name__}: {str(exc)[:50]})")
        return None
    register_all_kvcache_specs(vc)
    memory = [budget.memory] * len(workers)
    max_len = vc.model_config.max_model_len

    def run() -> None:
        vc.model_config.max_model_len = max_len  # auto fitting changes it
        groups = core.get_global_kv_cache_groups(vc, workers)
        core.get_kv_cache_configs(vc, workers, memory, groups)

    try:
        run()
    except Exception as exc:  # noqa: BLE001 - a case vLLM refuses (by design)
        print(f"  ({name}: vLLM does not plan it: {type(exc).__name__})")
        return None
    return run


# ---------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------


def floor(text: str) -> Callable[[], None]:
    """The library calls a compile of ``text`` cannot do without: libyaml's compose
    (the least a parse with positions does), the source model's pydantic validation
    of the data, and the artifact's canonical text (msgspec's sorted-key encoder,
    the writer kvspec uses) with the sha256 that covers it. kvspec's own work is
    what a compile adds."""
    import hashlib

    import yaml

    from kvspec.artifact.text import canonical
    from kvspec.source.schema import Source

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    data = yaml.load(text, Loader=loader)
    artifact = compile_source(text).envelope.unsigned()

    def run() -> None:
        yaml.compose(text, Loader=loader)
        Source.model_validate(data)
        hashlib.sha256(canonical(artifact)).hexdigest()

    return run


def median_interleaved(fns: dict[str, Callable[[], Any]], runs: int) -> dict[str, float]:
    """Median seconds of each function, run in turn ``runs`` times (GC collected
    before each run, as timeit does)."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(runs):
        for key, fn in fns.items():
            gc.collect()
            t = time.perf_counter()
            fn()
            times[key].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def median_warm(fns: dict[str, Callable[[], Any]], runs: int) -> dict[str, float]:
    """Median over ``runs`` interleaved rounds of each function's mean seconds per
    call in a batch of about 20 ms (the batch size fixed per function up front)."""
    batch = {}
    for key, fn in fns.items():
        t = time.perf_counter()
        fn()
        batch[key] = max(1, min(2000, int(0.02 / max(time.perf_counter() - t, 1e-6))))
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(runs):
        for key, fn in fns.items():
            n = batch[key]
            t = time.perf_counter()
            for _ in range(n):
                fn()
            times[key].append((time.perf_counter() - t) / n)
    return {k: statistics.median(v) for k, v in times.items()}


def ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1e3:.3f}"


Row = tuple[str, int, dict[str, float], dict[str, float]]


def _ratio(got: dict[str, float], key: str) -> str:
    vl = got.get("vllm")
    return f"{got[key] / vl:.2f}" if vl and key in got else "—"


def planner_table(rows: list[Row]) -> None:
    block = f"{'kvspec ms':>10} {'vLLM ms':>9} {'ratio':>6} {'floor ms':>9} {'ratio':>6}"
    print(f"{'':<28} {'':>7} {'cold (one call)':^44} {'warm (batched)':^44}")
    print(f"{'case':<28} {'layers':>7} {block} {block}")
    for name, layers, cold, warm in rows:
        cells = [f"{ms(got['kvspec']):>10} {ms(got.get('vllm')):>9} "
                 f"{_ratio(got, 'kvspec'):>6} {ms(got.get('floor')):>9} "
                 f"{_ratio(got, 'floor'):>6}" for got in (cold, warm)]
        print(f"{name:<28} {layers:>7,} {cells[0]} {cells[1]}")
    print("(ratio: kvspec / vLLM and floor / vLLM; floor: libyaml compose + pydantic "
          "validation of the source + the artifact's canonical text and sha256, nothing else)")


def _summary(rows: list[Row], which: int, label: str) -> None:
    got = [r[2 + which] for r in rows if not r[0].startswith("uniform-")]
    ratios = [g["kvspec"] / g["vllm"] for g in got if g.get("vllm")]
    if ratios:
        floors = [g["floor"] / g["vllm"] for g in got if g.get("vllm") and "floor" in g]
        print(f"{label}: conformance cases planned by both: {len(ratios)}; ratio median "
              f"{statistics.median(ratios):.2f}, worst {max(ratios):.2f}, "
              f"{sum(r <= 0.5 for r in ratios)} at or under 0.5 "
              "(goal: median <= 0.2, none > 0.5)")
        if floors:
            print(f"{label}: the floor alone (compose, validation, text and hash): median "
                  f"{statistics.median(floors):.2f}, worst {max(floors):.2f}, "
                  f"{sum(r > 0.2 for r in floors)} over 0.2, {sum(r > 0.5 for r in floors)} "
                  "over 0.5")
    by_size = {r[0]: r[2 + which]["kvspec"] for r in rows}
    k1, k10 = by_size.get("uniform-1000"), by_size.get("uniform-10000")
    if k1 and k10:
        print(f"{label}: kvspec t(10k) / t(1k) = {k10 / k1:.1f} (goal <= 11)")


def planner(args: argparse.Namespace, version: str | None) -> None:
    print(f"compile in-process (kvspec) vs vLLM's planning calls, median of {args.runs} "
          "interleaved runs")
    rows: list[Row] = []
    cases = [(n, t, args.runs) for n, t in case_sources(args.case)]
    cases += [(f"uniform-{n}", uniform_source(n), max(3, args.runs // 3 if n >= 100_000
                                                      else args.runs))
              for n in args.sizes]
    for name, text, runs in cases:
        fns: dict[str, Callable[[], Any]] = {"kvspec": lambda t=text, n=name:
                                             compile_source(t, f"{n}.yaml")}
        if version is not None:
            vl = vllm_planner(text, name)
            if vl is not None:
                fns["vllm"] = vl
        fns["floor"] = floor(text)
        cold = median_interleaved(fns, runs)
        warm = cold if name == "uniform-100000" else median_warm(fns, runs)  # 1 call a batch
        layers = len(compile_source(text, f"{name}.yaml").layout.layers)
        rows.append((name, layers, cold, warm))
    planner_table(rows)
    print()
    _summary(rows, 0, "cold")
    _summary(rows, 1, "warm")
    if version is None:
        print("\nvLLM is not importable here: the comparison was skipped (run this with "
              "the vLLM venv's python, see docs/vllm.md)")
    else:
        print(f"\nvLLM {version} on its CPU platform, in this process")


# ---------------------------------------------------------------------------
# goals measured in fresh processes
# ---------------------------------------------------------------------------


#: Runs ``python -m kvspec ARGS`` and prints the process's own peak RSS (VmHWM, KiB)
#: on stderr at exit. ``ru_maxrss`` of a child would not do: Linux carries the peak
#: of the forking process (here: one with torch and vLLM loaded) across ``exec``.
_HWM = ("import atexit, runpy, sys\n"
        "def hwm():\n"
        "    for line in open('/proc/self/status'):\n"
        "        if line.startswith('VmHWM:'):\n"
        "            sys.stderr.write('\\nVmHWM ' + line.split()[1] + '\\n')\n"
        "atexit.register(hwm)\n"
        "sys.argv = ['kvspec', *sys.argv[1:]]\n"
        "runpy.run_module('kvspec', run_name='__main__')\n")


def child(cmd: list[str], runs: int, peak: bool = False) -> tuple[float, int]:
    """Median wall seconds of ``cmd`` in a fresh process and, with ``peak`` (``cmd``
    then being kvspec's arguments), its largest peak RSS in KiB."""
    if peak:
        cmd = [sys.executable, "-c", _HWM, *cmd]
    times, most = [], 0
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, check=False)  # warm .pyc
    for _ in range(runs):
        t = time.perf_counter()
        done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                              check=True)
        times.append(time.perf_counter() - t)
        if peak:
            most = max(most, int(done.stderr.rsplit("VmHWM ", 1)[1].split()[0]))
    return statistics.median(times), most


#: The cold CLI's floor: the libraries ``validate`` needs, imported, and one pydantic
#: model defined (pydantic loads its schema machinery at the first model).
_STACK = "import yaml, click\nfrom pydantic import BaseModel\nclass M(BaseModel):\n    x: int"


def other(args: argparse.Namespace) -> None:
    py = sys.executable
    print("\nfresh processes (median of 5; .pyc caches warm)")
    bare, _ = child([py, "-c", "pass"], 5)
    version, _ = child([py, "-m", "kvspec", "--version"], 5)
    validate, _ = child([py, "-m", "kvspec", "validate", "layouts/llama-3.1-8b.yaml"], 5)
    stack, _ = child([py, "-c", _STACK], 5)
    print(f"  python -c pass                  {bare * 1e3:8.1f} ms")
    print(f"  kvspec --version                {version * 1e3:8.1f} ms  {version / bare:5.1f}x "
          "(goal <= 2x)")
    print(f"  kvspec validate llama-3.1-8b    {validate * 1e3:8.1f} ms  {validate / bare:5.1f}x "
          "(goal <= 4x)")
    print(f"    floor: yaml, click, one pydantic model {stack * 1e3:5.1f} ms  "
          f"{stack / bare:5.1f}x (the libraries validate needs, nothing else)")
    with tempfile.TemporaryDirectory() as tmp:
        for n in (10_000, 100_000):
            src = Path(tmp) / f"u{n}.yaml"
            src.write_text(uniform_source(n))
            t, rss = child(["validate", str(src)], 3, peak=True)
            print(f"  kvspec validate {n:>7,} layers  {t:8.2f} s   peak RSS {rss / 1024:6.0f} MB"
                  + ("  (goal <= 3 s, <= 300 MB)" if n == 100_000 else ""))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")],
                    default=[1_000, 10_000, 100_000], help="uniform model sizes")
    ap.add_argument("--case", help="only conformance cases whose name contains this")
    ap.add_argument("--vllm", choices=["auto", "off"], default="auto")
    ap.add_argument("--other", action="store_true",
                    help="also the fresh-process goals (validate 100k layers, cold CLI)")
    args = ap.parse_args(argv)
    version = vllm_available() if args.vllm == "auto" else None
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs; "
          f"load average {os.getloadavg()[0]:.1f}\n")
    planner(args, version)
    if args.other:
        other(args)


if __name__ == "__main__":
    main()
