"""Smoke runs of the benchmarks that report the performance goals (issue 14): each
runs at a tiny size, so a change that breaks one fails here and not in the next
person's measurement. No timing is compared; only that the report is whole."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _run(*args: str) -> str:
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True,
                          check=True, timeout=300).stdout


def test_the_side_by_side_benchmark_runs_without_vllm() -> None:
    out = _run("benchmarks/bench_vs_vllm.py", "--runs", "1", "--sizes", "10",
               "--case", "synthetic-uniform", "--vllm", "off")
    rows = [line.split() for line in out.splitlines()
            if line.startswith(("synthetic-uniform ", "uniform-10 "))]
    assert [r[0] for r in rows] == ["synthetic-uniform", "uniform-10"]
    for row in rows:  # kvspec and the floor timed, cold and warm; vLLM's cells empty
        assert row[1] in ("4", "10")
        kv_cold, vl_cold, floor_cold, kv_warm, vl_warm, floor_warm = (
            row[2], row[3], row[5], row[7], row[8], row[10])
        assert vl_cold == vl_warm == "—"
        assert all(float(x) > 0 for x in (kv_cold, floor_cold, kv_warm, floor_warm))
    assert "the comparison was skipped" in out


def test_the_load_benchmark_runs() -> None:
    out = _run("benchmarks/bench_load.py", "--layers", "4", "--repeat", "1")
    rows = [line.split() for line in out.splitlines() if line.startswith(("uniform", "hybrid"))]
    assert [(r[0], r[1]) for r in rows] == [("uniform", "4"), ("hybrid", "4")]
    assert all(len(r) == 16 for r in rows)


@pytest.mark.skipif(importlib.util.find_spec("nixl") is None,
                    reason="nixl is not installed: pip install 'kvspec[nixl]'")
def test_the_nixl_benchmark_runs() -> None:
    out = _run("benchmarks/bench_nixl.py", "--blocks", "8", "--layers", "2", "--heads", "2",
               "--head-size", "8", "--repeat", "1")
    if out.startswith("skipped:"):
        pytest.skip(out.strip())
    rows = {line.split()[0]: line.split() for line in out.splitlines()
            if line.startswith(("merged ", "per-layer ", "memcpy ")) and "/" not in line}
    assert set(rows) == {"merged", "per-layer", "memcpy"}
    assert (rows["merged"][1], rows["merged"][2]) == ("1", "8")          # one run per block
    assert (rows["per-layer"][1], rows["per-layer"][2]) == ("4", "32")   # layers x K/V
    assert "merged / per-layer:" in out and "merged / memcpy:" in out


def test_the_descriptor_benchmark_runs() -> None:
    out = _run("benchmarks/bench_descriptor.py", "--layers", "20", "--repeat", "1")
    rows = [line.split() for line in out.splitlines() if line.startswith("llama-3.1-8b BLHNC")]
    assert rows and rows[0][-5:-2] == ["1", "64", "32"]  # one run per block; 64; vLLM's 32
    assert "kvspec transfer on two 20-layer artifacts" in out
    assert sum(line.startswith(("same, LBNHC", "TP2 -> TP1")) for line in out.splitlines()) == 2


def test_the_simulation_benchmark_runs_without_vllm() -> None:
    out = _run("benchmarks/bench_simulate.py", "--requests", "60", "--vs-vllm", "20",
               "--prompt-mean", "300", "--output-mean", "20", "--vllm", "off",
               "--growth", "600")
    assert "the comparison was skipped" in out
    assert "60 requests through kvspec's simulator" in out
    assert out.count("summary {") == 2


def test_the_trace_import_benchmark_runs() -> None:
    out = _run("benchmarks/bench_trace_import.py", "--rows", "300", "--baseline", "100",
               "--formats", "mooncake", "lengths")
    rows = [line.split("|") for line in out.splitlines()
            if line.startswith(("| mooncake", "| lengths"))]
    assert [r[1].strip() for r in rows] == ["mooncake", "lengths"]
    assert all(float(r[4]) > 0 and float(r[6]) > 0 for r in rows)
