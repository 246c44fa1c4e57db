"""A trace through vLLM's own scheduler: ``kvspec simulate ... --against vllm``.

:func:`replay` runs the same steps as :func:`kvspec.sim.simulate` (the same loop,
:func:`kvspec.sim.engine.drive`, and the same records) over vLLM 0.33.0's own
``Scheduler`` and ``KVCacheManager``, planned by vLLM for the layout and given
the same block count, with a stub model that samples one token per request
whose prompt is done. Only the vLLM environment imports this module.

With unified plans that vLLM plans as kvspec does, every step's running and
waiting counts and free blocks are the same on both sides
(``tests/vllm/test_simulate_fidelity.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvspec.artifact import Artifact
from kvspec.artifact import format as fmt
from kvspec.integrations.vllm import adapter as vllm_adapter
from kvspec.integrations.vllm.frozen import read_facts
from kvspec.integrations.vllm.specs import engine_settings, to_vllm
from kvspec.model.steptime import ConstantStepTime, StepTime
from kvspec.model.workloads import DEFAULT_STEP_MS
from kvspec.runtime.manager import from_artifact
from kvspec.sim import SimResult, TraceRequest, admit, arrivals_s
from kvspec.sim.engine import Progress, Timeline, drive
from kvspec.sim.metrics import Limits, LiveBytes

__all__ = ["replay", "run_engine", "vllm_engine"]


def replay(artifact: Artifact, trace: Sequence[TraceRequest], num_blocks: int | None = None, *,
           hash_fn: str = "sha256", progress: Progress | None = None,
           log_blocks: bool = False, async_scheduling: bool | None = None,
           step_time: StepTime | None = None, step_ms: float | None = None,
           concurrency: int = 0) -> tuple[SimResult, Any]:
    """(the result, vLLM's engine wrapper) of ``trace`` through vLLM's scheduler for
    ``artifact``'s plan with ``num_blocks`` blocks (default: its own) and the layout's
    async scheduling (unless ``async_scheduling`` says otherwise); with a ``step_time``
    model that is not constant, on the same clock in seconds as kvspec's side
    (:func:`kvspec.sim.engine.drive_timed`, arrivals by :func:`kvspec.sim.arrivals_s`
    at ``step_ms``), its timeline on the engine (``engine.timeline``); ``concurrency``
    N > 0: closed-loop clients, at most N requests in flight, on that clock (the
    constant model at ``step_ms`` without a ``step_time``), as kvspec's side runs them."""
    engine, layout, admitted = vllm_engine(artifact, trace, num_blocks, hash_fn=hash_fn,
                                           log_blocks=log_blocks,
                                           async_scheduling=async_scheduling)
    timeline = None
    if concurrency > 0 and step_time is None:
        step_time = ConstantStepTime(step_ms or DEFAULT_STEP_MS)
    if step_time is not None and (not step_time.constant or concurrency > 0):
        timeline = Timeline(step_time, arrivals_s(admitted, step_ms or DEFAULT_STEP_MS),
                            concurrency)
    engine.timeline = timeline
    return run_engine(engine, layout, admitted, len(trace), progress, timeline), engine


def _memory(body: fmt.Layout) -> int:
    """The budget vLLM plans at: the artifact's own, else what its block count costs,
    else twice what one request at max_model_len needs (``verify``'s choice,
    :func:`.verify.budget`)."""
    if body.budget is not None:
        return body.budget.memory
    need = max((st.min_num_blocks for st in body.stages), default=1)
    override = body.engine.num_blocks
    blocks = max(override, need) if override is not None else 2 * need
    return max(blocks * st.bytes_per_block + st.fixed_bytes for st in body.stages)


def vllm_engine(artifact: Artifact, trace: Sequence[TraceRequest], num_blocks: int | None = None,
                *, hash_fn: str = "sha256", log_blocks: bool = False,
                async_scheduling: bool | None = None) -> tuple[Any, Any, list[TraceRequest]]:
    """vLLM's scheduler for ``artifact``'s plan, as a step engine, ready to run the
    requests of ``trace`` it accepts: (engine, the manager's layout, those requests)."""
    module = vllm_adapter()
    layout = from_artifact(artifact, num_blocks)
    body = artifact.body
    facts = read_facts(body)
    stages = [{n: to_vllm(facts.specs[n]) for n in st.layers} for st in body.stages]
    admitted, _ = admit(trace, layout.max_model_len)
    settings = engine_settings(facts.engine)
    if async_scheduling is not None:
        settings["async_scheduling"] = async_scheduling
    engine = module.replay_engine(settings, stages, _memory(body),
                                  layout.pools[0].num_blocks, LiveBytes(layout), admitted,
                                  hash_fn=hash_fn, log_blocks=log_blocks)
    return engine, layout, admitted


def run_engine(engine: Any, layout: Any, admitted: list[TraceRequest], num_trace: int,
               progress: Progress | None = None, timeline: Timeline | None = None
               ) -> SimResult:
    """Drive a :func:`vllm_engine` through its requests (on ``timeline``'s clock)."""
    config = engine.s.vllm_config
    depth = config.max_concurrent_batches
    records, steps = drive(engine, admitted, depth, progress, timeline)
    # the limits vLLM's scheduler admits under, to tell why requests wait (as kvspec's)
    sc = config.scheduler_config
    limits = Limits(sc.max_num_seqs, sc.max_num_batched_tokens,
                    layout.split_block_size if layout.has_align_state else 0)
    return SimResult(layout.name, steps, tuple(records), engine.preemptions,
                     engine.hit_tokens, len(admitted), num_trace - len(admitted),
                     limits=limits)
