"""Capacity that says what binds (issue 39): the steps where requests wait, split by
the limit that keeps them waiting, and the pool's bytes while memory binds split
into live bytes, the layout's waste and idle blocks -- which add up to the pool, on
every case of the capacity benchmark (benchmarks/results/capacity.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import kvspec.sim as sim_package
from kvspec.compiler import compile_until
from kvspec.model.engine import Engine
from kvspec.model.pooling import Pooling
from kvspec.passes.size import Sized
from kvspec.pooling.candidates import candidates
from kvspec.pooling.evaluate import layout_waste, waste_of
from kvspec.runtime.manager import ManagedGroup, ManagedLayout, ManagedPool, from_artifact
from kvspec.sim import TraceRequest, generate_trace, simulate
from kvspec.sim.metrics import REASONS, Limits, StepRecord, waiting_reason
from tests.conftest import invoke

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
import bench_capacity  # noqa: E402  (the benchmark's own case list and sources)

#: The cases of the committed capacity report, at its short workload (every case has it).
ROWS = {r["case"]: r for r in json.loads(
    (REPO / "benchmarks" / "results" / "capacity.json").read_text())["rows"]
    if r["workload"] == "short"}
#: Requests per trace at the least; more where the budget holds more (all arrive at
#: step 0, and the request cap is lifted above them, so memory binds).
REQUESTS = 120


def tiny(blocks: int) -> ManagedLayout:
    group = ManagedGroup("g", kind="full", block_size=4, pool="p", full_like=True,
                         useful_bytes_per_block=40)
    return ManagedLayout("tiny", (group,), (ManagedPool("p", blocks, hash_block_size=4,
                                                        bytes_per_block=40),),
                         scheduler_block_size=4, max_model_len=64)


def reasons(result) -> list[str | None]:
    return [waiting_reason(r, result.limits) for r in result.steps]


def test_the_request_cap_binds_when_memory_is_plenty() -> None:
    trace = [TraceRequest(0, 8, 6) for _ in range(4)]
    result = simulate(tiny(40), trace, max_num_seqs=2, async_scheduling=False)
    summary = result.as_dict()
    assert set(reasons(result)) == {"max_num_seqs", None}
    assert summary["waiting_steps_by_reason"]["max_num_seqs"] == sum(
        1 for r in result.steps if r.waiting) > 0
    assert summary["utilization_while_memory_bound"] is None


def test_memory_binds_when_blocks_run_out() -> None:
    trace = [TraceRequest(0, 20, 6) for _ in range(3)]
    result = simulate(tiny(13), trace, async_scheduling=False)
    by = result.as_dict()["waiting_steps_by_reason"]
    assert by["memory"] > 0 and by["max_num_seqs"] == 0
    assert result.as_dict()["utilization_while_memory_bound"] is not None


def test_the_token_budget_binds_when_prefills_fill_it() -> None:
    trace = [TraceRequest(0, 30, 2) for _ in range(3)]
    result = simulate(tiny(60), trace, max_num_batched_tokens=32, async_scheduling=False)
    assert result.steps[0].scheduled_tokens == 32  # the first prompt and part of the next
    assert reasons(result)[0] == "max_num_batched_tokens"


def test_every_waiting_step_has_one_reason() -> None:
    trace = generate_trace(60, seed=2, prompt_mean=20, output_mean=8, rate=3)
    result = simulate(tiny(30), trace, max_num_seqs=5, max_num_batched_tokens=40)
    by = result.as_dict()["waiting_steps_by_reason"]
    assert tuple(by) == REASONS
    assert sum(by.values()) == sum(1 for r in result.steps if r.waiting)
    assert all(by[k] > 0 for k in REASONS), by


def test_an_align_chunk_larger_than_the_budget_left_is_the_token_budget() -> None:
    limits = Limits(max_num_seqs=8, max_num_batched_tokens=100, align=32)
    assert waiting_reason(StepRecord(0, 2, 1, (5,), 80, 0, 0.5), limits) == \
        "max_num_batched_tokens"
    assert waiting_reason(StepRecord(0, 2, 1, (5,), 60, 0, 0.5), limits) == "memory"
    assert waiting_reason(StepRecord(0, 2, 1, (5,), 0, 1, 0.5), limits) == "memory"


# -- live + the layout's waste + idle = the pool, on every capacity case --------------

def _source(row: dict, tmp: Path) -> Path:
    found = bench_capacity.candidate_sources(tmp, [row["case"]])
    return next(src for name, origin, src in found
                if name == row["case"] and origin == row["origin"])


@pytest.mark.parametrize("case", sorted(ROWS))
def test_live_waste_and_idle_add_up_to_the_pool(case: str, tmp_path: Path) -> None:
    row = ROWS[case]
    sized = compile_until(_source(row, tmp_path), Sized, memory=row["memory_bytes"])
    engine = sized.layout.engine
    prompt, p_spread, output, o_spread = bench_capacity.WORKLOADS["short"]
    n = max(REQUESTS, round(row["physical_limit"] * 1.3))
    trace = generate_trace(n, seed=0, prompt_mean=prompt, prompt_spread=p_spread,
                           output_mean=output, output_spread=o_spread,
                           max_prompt_tokens=engine.max_model_len - 1)
    tokens = round(bench_capacity.held_tokens("short"))
    checked = 0
    for c in candidates(sized, Pooling(policy="auto", serve_with="kvspec"), tokens):
        if c.note:
            continue
        managed = from_artifact(c.artifact)
        result = simulate(managed, trace, max_num_seqs=max(engine.max_num_seqs, n),
                          max_num_batched_tokens=engine.max_num_batched_tokens,
                          max_model_len=engine.max_model_len,
                          async_scheduling=engine.async_scheduling_resolved,
                          pipeline_parallel_size=engine.pipeline_parallel_size,
                          sample_held=True)
        _, waste = waste_of(result, c.artifact.body)
        if waste is None:
            assert result.as_dict()["waiting_steps_by_reason"]["memory"] == 0
            continue
        samples = result.samples
        pool = waste.pool_bytes
        live = sum(s.live for s in samples) / len(samples) / result.scale
        # idle measured apart: the free blocks (and each pool's null block) per sample
        idle = sum(sum((f + 1) * p.bytes_per_block for f, p in zip(s.free, managed.pools))
                   for s in samples) / len(samples)
        assert waste.idle == pytest.approx(idle, abs=1), c.name
        parts = (waste.padding_slots + waste.padded_pages + waste.block_inflation
                 + waste.per_request)
        assert parts + waste.idle + live == pytest.approx(pool, abs=4), c.name
        share = layout_waste(waste)
        assert share is not None
        assert share + waste.idle / pool + live / pool == pytest.approx(1, abs=2e-6), c.name
        checked += 1
    assert checked, f"{case}: memory never bound"


# -- plan says when the request cap binds -------------------------------------------------

CAPPED = """\
kvspec: 1
name: capped
engine: {block_size: 16, max_model_len: 2048, max_num_seqs: 2, memory: 96MiB}
defaults: {num_kv_heads: 2, head_size: 64, dtype: bfloat16}
layer_types:
  full: {kind: full_attention}
  window: {kind: sliding_window, sliding_window: 256}
layers:
  - {repeat: 2, pattern: [full, window]}
pooling:
  policy: auto
  serve_with: kvspec
  workload: {context_tokens: {mean: 600, spread: 0.4}, output_tokens: 64, requests: 40}
"""


def test_plan_names_the_request_cap_when_it_binds(tmp_path: Path) -> None:
    src = tmp_path / "capped.yaml"
    src.write_text(CAPPED)
    code, out, err = invoke(["plan", str(src)])
    assert code == 0, err
    kept = next(line for line in out.splitlines() if line.startswith("*"))
    memory, seqs, _tokens = (int(x.replace(",", "")) for x in
                             kept.split("/ 2 ")[1].split()[:5:2])  # after "mean / peak"
    assert seqs > memory
    line = next(x for x in out.splitlines() if x.startswith("the request cap binds"))
    assert f"max_num_seqs (2 running) keeps requests waiting in {seqs:,} steps" in line
    assert "memory would bind at about" in line
    assert "raise max_num_seqs (engine.max_num_seqs, vLLM's --max-num-seqs) above" in out


def test_plan_says_nothing_of_the_cap_when_memory_binds(tmp_path: Path) -> None:
    src = tmp_path / "roomy.yaml"
    src.write_text(CAPPED.replace("max_num_seqs: 2", "max_num_seqs: 256")
                   .replace("96MiB", "24MiB"))
    code, out, err = invoke(["plan", str(src)])
    assert code == 0, err
    assert "the request cap binds" not in out
    assert "while memory keeps requests waiting, live tokens and states fill" in out


#: vLLM 0.33.0's ``VllmConfig.max_concurrent_batches`` (vllm/config/vllm.py), with Model
#: Runner V2 (its default on GPUs): ``pp_size + 1`` under async scheduling, else
#: ``pp_size``. (V1's runner keeps 2 at one stage and ``pp_size`` under pipeline
#: parallelism: rule ``async-pipeline``.) (async, pp, vLLM's)
BATCHES_IN_FLIGHT = [(False, 1, 1), (True, 1, 2), (False, 2, 2), (True, 2, 3), (True, 4, 5),
                     (False, 4, 4)]


@pytest.mark.parametrize("overlap,stages,vllm", BATCHES_IN_FLIGHT)
def test_batches_in_flight_as_vllm_counts_them(overlap: bool, stages: int, vllm: int) -> None:
    """The plan and the simulator keep vLLM's count, one rule (issue 37: the plan
    counted two per stage with async scheduling over several stages, the simulator
    two in all)."""
    assert Engine.batches_in_flight(overlap, stages) == vllm
    engine = Engine(max_num_batched_tokens=100, async_scheduling=overlap,
                    pipeline_parallel_size=stages)
    assert engine.concurrent_batches == vllm
    assert engine.max_in_flight_tokens == 100 * vllm


def test_the_simulator_reserves_vllms_tokens_in_flight() -> None:
    """A window group's admission cap reads the simulator's tokens in flight:
    ``max_num_batched_tokens`` x vLLM's batches, 3 at two async stages."""
    seen = []

    class Spy(Exception):
        pass

    def stop(layout: ManagedLayout, *args: object, **kwargs: object) -> None:
        seen.append(layout.max_in_flight_tokens)
        raise Spy

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sim_package, "KVCacheManager", stop)
        with pytest.raises(Spy):
            simulate(tiny(8), [], max_num_batched_tokens=64, async_scheduling=True,
                     pipeline_parallel_size=2)
    assert seen == [64 * 3]
