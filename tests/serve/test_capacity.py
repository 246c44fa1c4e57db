"""Live capacity (issue 38, section 3 items 5 and 6): a running vLLM engine's own
counts equal kvspec's for the same plan.

vLLM 0.32 CPU engines serve a tiny Llama (``scripts/make_tiny_checkpoint.py``) with
kvspec's plugin in enforce mode, under a KV-cache budget too small for the trace
(4 MiB; forty requests of 96-112 prompt tokens and 40 output tokens, all arriving
at once), so that requests wait and are preempted. ``tests/serve/live_capacity.py``
steps each engine and records vLLM's figures; here they are compared with
``kvspec plan`` and :func:`kvspec.sim.simulate_artifact` for the artifact the
engine was held to. Two engines:

* **the source's own plan** (vLLM's: 128-token blocks, 16 of them):

  - the start-up line ``KV cache size: N tokens, Maximum concurrency for L tokens
    per request: X x`` and the engine's block count equal ``kvspec plan``'s;
  - every step's running and waiting requests right after ``schedule()``, the
    requests that call preempted and the tokens it schedules equal the
    simulator's step records (the moment a ``StepRecord`` describes);
  - vLLM's own stat-logger figures (``SchedulerStats``, made after each step's
    output, and ``IterationStats.num_preempted_reqs``) agree with those records
    once the requests that finished in the step are counted, and in total;

* **the plan ``pooling: {policy: auto, serve_with: vllm}`` chose** for the same
  trace (32-token blocks, a plan vLLM would not make: it runs the source's block
  size), served with the flags ``kvspec engine-args`` prints: the same per-step
  agreement, the same tokens as the first engine, and the capacity gain the live
  engine shows (mean running requests over the steps) is the one the artifact's
  candidates record from the simulator. ``block_sizes: [32, 64, 128]``: vLLM's
  CPU attention backend takes kernel blocks of multiples of 32 only, and refuses
  a 16-token block (docs/pooling.md).

Runs in the engine venv (``tests/serve/run.sh``); about three minutes on 2 cores.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.serve.conftest import ROOT, checkpoint, kvspec

pytestmark = pytest.mark.serve

#: The engine's settings but the block size (the plan's); the source says the same in
#: kvspec's terms. The CPU platform turns async scheduling off (vllm/platforms/cpu.py).
ENGINE = {"max_model_len": 512, "max_num_seqs": 32, "max_num_batched_tokens": 2048,
          "kv_cache_memory_bytes": 4 << 20, "enable_prefix_caching": True}
SOURCE = """\
kvspec: 1
name: llama-live
layer_name: model.layers.{{index}}.self_attn.attn
engine:
  block_size: 128
  max_model_len: 512
  max_num_batched_tokens: 2048
  max_num_seqs: 32
  layout: LBHNC
  prefix_caching: true
  async_scheduling: false
  memory: 4MiB
defaults: {{num_kv_heads: 2, head_size: 64, dtype: bfloat16}}
layer_types:
  full: {{kind: full_attention}}
layers:
- {{repeat: 4, pattern: [full]}}
{pooling}"""
AUTO = """\
pooling:
  policy: auto
  serve_with: vllm
  block_sizes: [32, 64, 128]
  workload: {trace: trace.jsonl}
"""
TRACE = [{"arrival": 0, "prompt_tokens": 96 + 4 * (i % 5), "output_tokens": 40}
         for i in range(40)]
CAPACITY_LINE = re.compile(r"KV cache size: ([\d,]+) tokens, Maximum concurrency for "
                           r"([\d,]+) tokens per request: ([\d.]+)x")


def _kvspec(*args: str) -> str:
    return kvspec(*args).stdout


def _serve(work: Path, name: str, pooling: str) -> dict[str, Any]:
    """Compile the source (with ``pooling``), serve the trace with the plugin in
    enforce mode, simulate it: the engine's records, ``plan``'s figures, the result."""
    model = checkpoint("llama")
    source, artifact, trace = (work / f"{name}.yaml", work / f"{name}.kvlayout.json",
                               work / "trace.jsonl")
    source.write_text(SOURCE.format(pooling=pooling))
    trace.write_text("".join(json.dumps(r) + "\n" for r in TRACE))
    _kvspec("compile", str(source), "-o", str(artifact), "-q")
    # deferred: the simulator, in this venv only for the comparison
    from kvspec.compiled import read
    from kvspec.sim import read_trace, simulate_artifact

    art = read(artifact)
    flags = _kvspec("engine-args", str(artifact))
    engine = {**ENGINE, "block_size": art.body.engine.block_size}
    assert f"--block-size {engine['block_size']}" in flags
    env = {**os.environ, "KVSPEC_LAYOUT": str(artifact), "KVSPEC_MODE": "enforce",
           "VLLM_TARGET_DEVICE": "cpu"}
    run = subprocess.run([sys.executable, str(ROOT / "tests" / "serve" / "live_capacity.py"),
                          str(model), str(trace), json.dumps(engine)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=900, check=False)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    result: dict[str, Any] = next(json.loads(line.split(" ", 1)[1])
                                  for line in run.stdout.splitlines()
                                  if line.startswith("KVSPEC-LIVE "))
    result["line"] = CAPACITY_LINE.search(output)
    result["plan"] = json.loads(_kvspec("plan", str(artifact), "--format", "json"))
    result["artifact"] = art
    result["sim"] = simulate_artifact(art, read_trace(trace))
    return result


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _serve(tmp_path_factory.mktemp("capacity"), "llama", "")


@pytest.fixture(scope="module")
def auto(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _serve(tmp_path_factory.mktemp("capacity-auto"), "llama-auto", AUTO)


def _steps(result: dict[str, Any]) -> list[tuple[int, int, int, int]]:
    return [(s["running"], s["waiting"], s["preempted"], s["tokens"])
            for s in result["scheduled"]]


def _simulated(result: dict[str, Any]) -> list[tuple[int, int, int, int]]:
    return [(r.running, r.waiting, r.preempted, r.scheduled_tokens)
            for r in result["sim"].steps]


def test_the_engine_served_the_trace_held_to_the_artifact(live: dict[str, Any]) -> None:
    assert live["capacity"]["plugin"] == f"{live['artifact'].fingerprint} enforce"
    assert [len(t) for t in live["tokens"]] == [r["output_tokens"] for r in TRACE]
    assert live["capacity"]["async_scheduling"] is False


def test_the_start_up_capacity_line_is_kvspec_plan(live: dict[str, Any]) -> None:
    line, plan, capacity = live["line"], live["plan"], live["capacity"]
    assert line is not None, "the engine logged no 'KV cache size' line"
    tokens, length, concurrency = line.groups()
    assert int(tokens.replace(",", "")) == plan["kv_cache_size_tokens"] == 2048
    assert int(length.replace(",", "")) == plan["max_model_len"]
    assert concurrency == f"{plan['max_concurrency']:.2f}"
    assert capacity["kv_cache_size_tokens"] == plan["kv_cache_size_tokens"]
    assert capacity["max_concurrency"] == plan["max_concurrency"]
    assert capacity["num_blocks"] == plan["num_blocks"]


def test_every_step_runs_waits_and_preempts_as_simulate_says(live: dict[str, Any]) -> None:
    engine = _steps(live)
    # the budget is too small for the trace: requests wait, and are preempted
    assert max(s[1] for s in engine) > 0 and sum(s[2] for s in engine) > 0
    assert engine == _simulated(live)
    assert live["sim"].preemptions == sum(s[2] for s in engine)


def test_vllms_own_scheduler_stats_agree_with_simulate(live: dict[str, Any]) -> None:
    """``SchedulerStats`` is made after the step's output (``update_from_output``):
    the requests that finished in the step have left ``running``; a preemption
    reaches ``IterationStats`` when the preempted request next returns output."""
    sim = live["sim"].steps
    stats, finished = live["stats"], live["finished"]
    assert len(stats) == len(finished) == len(sim)
    assert [s["waiting"] for s in stats] == [r.waiting for r in sim]
    assert [s["running"] + f for s, f in zip(stats, finished)] == [r.running for r in sim]
    assert sum(s["preempted"] for s in stats) == live["sim"].preemptions


def test_auto_chose_a_plan_vllm_would_not_make(auto: dict[str, Any]) -> None:
    record = auto["artifact"].body.pooling
    assert record is not None and record.chosen not in (None, 0)
    chosen, own = record.candidates[record.chosen], record.candidates[0]
    assert (own.name, own.block_size) == ("unified", 128)
    assert chosen.block_size == auto["capacity"]["block_size"] != own.block_size
    assert auto["capacity"]["plugin"] == f"{auto['artifact'].fingerprint} enforce"


def test_the_chosen_plan_steps_as_simulate_says_with_the_same_tokens(
        live: dict[str, Any], auto: dict[str, Any]) -> None:
    assert _steps(auto) == _simulated(auto)
    assert auto["tokens"] == live["tokens"]


def test_the_live_capacity_gain_is_the_one_simulate_predicted(
        live: dict[str, Any], auto: dict[str, Any]) -> None:
    record = auto["artifact"].body.pooling
    predicted = [c.simulated.mean_running for c in (record.candidates[0],
                                                    record.candidates[record.chosen])]
    served = [sum(s[0] for s in _steps(r)) / len(_steps(r)) for r in (live, auto)]
    # the artifact records a simulation's summary to 6 decimals (kvspec.sim.metrics)
    assert [round(x, 6) for x in served] == predicted
    assert served[1] / served[0] == pytest.approx(predicted[1] / predicted[0], rel=1e-5)
    assert served[1] > 1.2 * served[0]
