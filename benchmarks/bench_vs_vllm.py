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

The ratio is kvspec / vLLM (goal: median <= 0.2, none > 0.5; 10k layers <= 0.2
and t(10k) / t(1k) <= 11). Without vLLM the comparison is skipped and said so.
``--other`` adds the goals measured in fresh processes: ``kvspec validate`` of
100,000 layers (time and peak RSS), and the cold CLI against ``python -c pass``.
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
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

from kvspec.compiler import compile_source  # noqa: E402

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
    from kvspec.integrations.dump.read import load_dump

    out = []
    for path in sorted(CASES.glob("*.json")):
        if only and only not in path.stem:
            continue
        data, raw = load_dump(path)
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


def ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1e3:.3f}"


def planner_table(rows: list[tuple[str, int, float, float | None]]) -> None:
    print(f"{'case':<34} {'layers':>7} {'kvspec ms':>11} {'vLLM ms':>11} {'ratio':>7}")
    for name, layers, kv, vl in rows:
        ratio = f"{kv / vl:.2f}" if vl else "—"
        print(f"{name:<34} {layers:>7,} {ms(kv):>11} {ms(vl):>11} {ratio:>7}")


def planner(args: argparse.Namespace, version: str | None) -> None:
    print("compile in-process (kvspec) vs vLLM's planning calls, median of "
          f"{args.runs} interleaved runs")
    rows: list[tuple[str, int, float, float | None]] = []
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
        got = median_interleaved(fns, runs)
        layers = len(compile_source(text, f"{name}.yaml").layout.layers)
        rows.append((name, layers, got["kvspec"], got.get("vllm")))
    planner_table(rows)
    cases_only = [(kv, vl) for n, _, kv, vl in rows if not n.startswith("uniform-")]
    ratios = [kv / vl for kv, vl in cases_only if vl]
    if ratios:
        print(f"\nconformance cases planned by both: {len(ratios)}; ratio median "
              f"{statistics.median(ratios):.2f}, worst {max(ratios):.2f} "
              "(goal: median <= 0.2, none > 0.5)")
    by_size = {n: kv for n, _, kv, _ in rows}
    k1, k10 = by_size.get("uniform-1000"), by_size.get("uniform-10000")
    if k1 and k10:
        print(f"kvspec t(10k) / t(1k) = {k10 / k1:.1f} (goal <= 11)")
    if version is None:
        print("\nvLLM is not importable here: the comparison was skipped (run this with "
              "the vLLM venv's python, see docs/vllm.md)")
    else:
        print(f"\nvLLM {version} on its CPU platform, in this process")


# ---------------------------------------------------------------------------
# goals measured in fresh processes
# ---------------------------------------------------------------------------


def child(cmd: list[str], runs: int) -> tuple[float, int]:
    """Median wall seconds and the largest peak RSS (KiB) of ``cmd`` in a fresh process."""
    times, peak = [], 0
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run(cmd, cwd=REPO, env=env, capture_output=True)  # warm: .pyc written
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        t = time.perf_counter()
        subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, check=True)
        times.append(time.perf_counter() - t)
        peak = max(peak, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, before)
    return statistics.median(times), peak


def other(args: argparse.Namespace) -> None:
    py = sys.executable
    print("\nfresh processes (median of 5; .pyc caches warm)")
    bare, _ = child([py, "-c", "pass"], 5)
    version, _ = child([py, "-m", "kvspec", "--version"], 5)
    validate, _ = child([py, "-m", "kvspec", "validate", "layouts/llama-3.1-8b.yaml"], 5)
    print(f"  python -c pass                  {bare * 1e3:8.1f} ms")
    print(f"  kvspec --version                {version * 1e3:8.1f} ms  {version / bare:5.1f}x "
          "(goal <= 2x)")
    print(f"  kvspec validate llama-3.1-8b    {validate * 1e3:8.1f} ms  {validate / bare:5.1f}x "
          "(goal <= 4x)")
    with tempfile.TemporaryDirectory() as tmp:
        for n in (10_000, 100_000):
            src = Path(tmp) / f"u{n}.yaml"
            src.write_text(uniform_source(n))
            t, rss = child([py, "-m", "kvspec", "validate", str(src)], 3)
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
