"""Smoke run of the capacity benchmark (benchmarks/bench_capacity.py, issue 30) on one
small hybrid and a short trace: the report is whole, and every figure in it is a
real simulation's. No goal is asserted (numbers go in benchmarks/, not in tests)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvspec.compiler import compile as compile_file
from kvspec.sim import read_trace, simulate_artifact

REPO = Path(__file__).resolve().parents[1]
CASE = "synthetic-swa-hybrid"
PLANS = ("vllm", "auto_kvspec", "auto_vllm")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str, Path]:
    tmp = tmp_path_factory.mktemp("capacity")
    out = tmp / "capacity.md"
    subprocess.run([sys.executable, "benchmarks/bench_capacity.py", "--case", CASE,
                    "--workload", "short", "--requests", "90", "--against-vllm", "off",
                    "--out", str(out), "--keep", str(tmp / "work")],
                   cwd=REPO, check=True, capture_output=True, text=True, timeout=600)
    return json.loads(out.with_suffix(".json").read_text()), out.read_text(), tmp / "work"


def test_one_row_per_case_and_workload_with_every_plan_simulated(run: tuple) -> None:
    data, _, _ = run
    assert [(r["case"], r["workload"]) for r in data["rows"]] == [(CASE, "short")]
    assert data["meta"]["failed"] == []
    row = data["rows"][0]
    for plan in PLANS:
        sim = row[plan]["simulated"]
        assert sim["steps"] > 0 and 0 < sim["mean_running"] <= sim["peak_running"] <= 90
        assert sim["waiting_steps_by_reason"]["memory"] > 0  # the waste is measured then
        assert set(row[plan]["waste"]) == {"padding_slots", "padded_pages", "block_inflation",
                                           "per_request"}
    assert row["same_baseline"] is True
    assert row["physical_limit"] > 0


def test_every_ratio_is_computed_from_the_simulated_figures(run: tuple) -> None:
    row = run[0]["rows"][0]
    base = row["vllm"]["simulated"]
    for plan in PLANS[1:]:
        sim = row[plan]["simulated"]
        assert row["ratios"][plan] == {"mean_running": sim["mean_running"] / base["mean_running"],
                                       "steps": base["steps"] / sim["steps"]}


def test_the_baseline_is_vllms_plan_simulated_on_the_trace(run: tuple) -> None:
    """kvspec's simulator run here on vLLM's plan (compiled again from the source the
    benchmark wrote, on its budget) and its trace gives the figures reported for it."""
    row, work = run[0]["rows"][0], run[2]
    art = compile_file(work / Path(row["source"]).name, memory=row["memory_bytes"])
    assert art.body.pooling.asked == "unified" and len(art.body.pooling.candidates) == 1
    again = simulate_artifact(art, read_trace(work / Path(row["trace"]).name)).as_dict()
    # the record adds the layout's waste, from what the pooling policy's run sampled
    recorded = {k: v for k, v in row["vllm"]["simulated"].items() if k != "layout_waste"}
    assert again == recorded


def test_the_markdown_table_has_a_full_row_per_measurement(run: tuple) -> None:
    data, text, _ = run
    row = data["rows"][0]
    table = [line for line in text.split("## Capacity")[1].split("##")[0].splitlines()
             if line.startswith("|")]
    header, rule, body = table[0], table[1], table[2:]
    width = header.count("|")
    assert rule.count("|") == width and [line.count("|") for line in body] == [width]
    cells = [c.strip() for c in body[0].strip("|").split("|")]
    assert cells[:2] == [CASE, "short"]
    ratios = [f"{row['ratios'][p][k]:.3f}×" for p in PLANS[1:] for k in ("mean_running", "steps")]
    assert [c for c in cells if c.endswith("×")] == ratios
    assert "## Goals (issue 30)" in text and "not run" in text  # vLLM's scheduler skipped
