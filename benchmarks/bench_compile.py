"""Compile-time benchmark: cold CLI wall time and in-process compile time.

    python benchmarks/bench_compile.py

Reports (never asserts):
* cold wall time of ``kvspec compile layouts/llama-3.1-8b.yaml`` in a fresh
  interpreter (import + compile + write), best and median of several runs;
* in-process compile time for 32, 100, 1,000 and 4,000 layer models (pure
  full attention and a sliding/full hybrid), to show the growth is linear.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvspec.compiler import compile_source  # noqa: E402


def cold_cli(runs: int = 7) -> list[float]:
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(runs):
            t = time.perf_counter()
            subprocess.run([sys.executable, "-m", "kvspec.cli", "compile",
                            "layouts/llama-3.1-8b.yaml", "-o", f"{tmp}/out.json"],
                           check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
            times.append(time.perf_counter() - t)
    return times


def source(layers: int, hybrid: bool) -> str:
    pattern = "[local, local, local, local, local, global]" if hybrid else "[global]"
    per = 6 if hybrid else 1
    return f"""kvspec: 1
name: bench-{layers}
engine: {{block_size: 16, max_model_len: 4096, memory: 4TiB}}
defaults: {{num_kv_heads: 8, head_size: 128, dtype: bfloat16}}
layer_types:
  local: {{kind: sliding_window, sliding_window: 1024}}
  global: {{kind: full_attention}}
layers:
  - {{repeat: {layers // per}, pattern: {pattern}}}
"""


def in_process(layers: int, hybrid: bool, runs: int = 5) -> float:
    text = source(layers, hybrid)
    compile_source(text, "warm.yaml")
    best = float("inf")
    for _ in range(runs):
        t = time.perf_counter()
        compile_source(text, "b.yaml")
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    cold = cold_cli()
    print(f"cold `kvspec compile layouts/llama-3.1-8b.yaml` (fresh interpreter, {len(cold)} runs):"
          f" best {min(cold) * 1000:.0f} ms, median {statistics.median(cold) * 1000:.0f} ms")
    print()
    print(f"{'layers':>7} {'full attention':>16} {'per layer':>10} {'hybrid 5:1':>12}"
          f" {'per layer':>10}")
    for n in (32, 102, 1002, 4002):
        full = in_process(n, False)
        hyb = in_process(n, True)
        print(f"{n:>7} {full * 1000:>13.1f} ms {full / n * 1e6:>7.1f} us {hyb * 1000:>9.1f} ms"
              f" {hyb / n * 1e6:>7.1f} us")


if __name__ == "__main__":
    main()
