"""``kvspec profile``'s engine-side driver: vLLM, in its own process, held to the artifact
by kvspec's plugin, runs the grid and times every step (docs/latency.md).

``python -m kvspec.integrations.vllm.profile_engine SPEC_JSON``, started by
``kvspec profile`` (:mod:`kvspec.cli.profile`) with the plugin's environment
(``KVSPEC_LAYOUT``, ``KVSPEC_MODE=verify``) and ``VLLM_ENABLE_V1_MULTIPROCESSING=0``,
so the engine core runs in this process and its steps can be timed here. SPEC:
``artifact``, ``model``, ``grid``. It prints one line per event, ``KVSPEC-PROFILE``
and a JSON object (vLLM's own logs go to stderr):

* ``started``: what the engine runs (:func:`describe`), its start-up seconds and the
  grid's scenarios;
* ``scenario``: one scenario measured: its steps, each ``[prefill_tokens,
  decode_requests, context_tokens, prefill_pairs, seconds, core_seconds]``;
* ``error``: the engine refused to start or failed (its message, with causes).

A step's ``seconds`` is one iteration of the engine loop, ``LLMEngine.step()``:
schedule, forward pass, sampling, the scheduler's update and the outputs' processing,
timed with ``time.perf_counter`` around it; ``core_seconds`` is the engine core's
part of it (``EngineCore.step``), without the outputs' processing. The step's terms
are what vLLM's scheduler scheduled for it (:func:`.profiling.step_terms`).

vLLM is imported only in :func:`main`, :func:`start` and what they call: this module
is importable without it.
"""

from __future__ import annotations

import json
import os
import platform
import random
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvspec._version import __version__
from kvspec.artifact import Artifact
from kvspec.integrations.vllm.engine_args import engine_args
from kvspec.integrations.vllm.profiling import GRIDS, Limits, Request, Scenario, grid, step_terms

#: The prefix of every line this driver prints for kvspec.
TAG = "KVSPEC-PROFILE "
#: Environment the engine runs in besides the plugin's: its core in this process, its
#: logs on stderr.
ENGINE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0",
              "VLLM_LOGGING_STREAM": "ext://sys.stderr"}


def emit(event: str, **fields: Any) -> None:
    """One event line on stdout, whole (one write)."""
    sys.stdout.write(TAG + json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


def causes(exc: BaseException) -> str:
    """``exc`` and its causes, one per line, innermost last."""
    parts, seen = [], set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        parts.append(f"{type(cur).__name__}: {cur}")
        cur = cur.__cause__ or cur.__context__
    return "\n".join(parts)


def device_name() -> str:
    """The device the engine runs on: the GPU's name, or the CPU's model name."""
    from vllm.platforms import current_platform  # deferred: vLLM, in the engine's process

    if not current_platform.is_cpu():
        return str(current_platform.get_device_name(0))
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip() + " (CPU)"
    except OSError:
        pass
    return (platform.processor() or platform.machine()) + " (CPU)"


def flags(artifact: str, model: str) -> list[str]:
    """The engine's arguments for ``artifact``: ``kvspec engine-args``' flags, the
    ones ``vllm serve`` takes."""
    args = engine_args(Artifact.read(artifact), artifact, model=model, mode="verify")
    return [w for f in args.flags for w in f.words()]


def start(artifact: str, model: str, **extra: Any) -> tuple[Any, list[str]]:
    """An in-process ``LLMEngine`` on ``model`` with the artifact's settings, held to it
    by kvspec's plugin (its environment set by the caller), and the flags this vLLM
    does not know (left out: ``--enable-hybrid-kv-cache-manager`` on 0.32, whose
    behaviour is its default)."""
    # deferred: vLLM, in the engine's process
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.v1.engine.llm_engine import LLMEngine

    words = flags(artifact, model)
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    namespace, unknown = parser.parse_known_args(["--model", model, *words])
    args = EngineArgs.from_cli_args(namespace)
    for key, value in {"skip_tokenizer_init": True, "seed": 0, **extra}.items():
        setattr(args, key, value)
    return LLMEngine.from_engine_args(args), [w for w in unknown if w.startswith("--")]


def held(engine: Any) -> str | None:
    """The fingerprint of the artifact kvspec's plugin holds this engine to (None:
    the plugin did not load)."""
    builder = sys.modules.get("kvspec.integrations.vllm.v0_32.builder") or sys.modules.get(
        "kvspec.integrations.vllm.v0_33.builder")
    exp = getattr(builder, "_state", {}).get("expectation") if builder else None
    return None if exp is None else str(exp.fingerprint)


def describe(engine: Any, artifact: str) -> dict[str, Any]:
    """What the engine runs, as a profile's ``describes`` says it (the checked fields
    from the artifact the plugin held it to), and its limits for the grid."""
    import vllm  # deferred: vLLM, in the engine's process

    config = engine.vllm_config
    body = Artifact.read(artifact).body
    cache, sched = config.cache_config, config.scheduler_config
    dtype = str(config.model_config.dtype).removeprefix("torch.")
    return {
        "describes": {
            "engine": "vllm", "engine_version": str(vllm.__version__),
            "device": device_name(), "model": body.model,
            "tensor_parallel_size": config.parallel_config.tensor_parallel_size,
            "pipeline_parallel_size": config.parallel_config.pipeline_parallel_size,
            "dtype": dtype, "kv_cache_dtype": body.engine.kv_cache_dtype,
            "kvspec_version": __version__},
        "engine_kv_cache_dtype": str(cache.cache_dtype),
        "limits": {"max_model_len": config.model_config.max_model_len,
                   "max_num_batched_tokens": sched.max_num_batched_tokens,
                   "max_num_seqs": sched.max_num_seqs, "block_size": cache.block_size,
                   "capacity_tokens": (cache.num_gpu_blocks or 0) * cache.block_size},
        "vocab": config.model_config.get_vocab_size()}


class Timer:
    """Hooks on one in-process engine: the terms of each step its scheduler schedules
    and the seconds its engine core's step takes."""

    def __init__(self, engine: Any) -> None:
        core = engine.engine_core.engine_core  # (in-process: InprocClient's EngineCore)
        self.engine, self.core = engine, core
        self.scheduler = core.scheduler
        self.terms: tuple[int, int, int, int] | None = None
        self.core_s = 0.0
        schedule, step_fn = self.scheduler.schedule, core.step_fn

        def scheduled(*args: Any, **kwargs: Any) -> Any:
            out = schedule(*args, **kwargs)
            self.terms = step_terms(out) if out.total_num_scheduled_tokens else None
            return out

        def stepped() -> Any:
            t0 = time.perf_counter()
            try:
                return step_fn()
            finally:
                self.core_s = time.perf_counter() - t0

        self.scheduler.schedule = scheduled
        core.step_fn = stepped

    def busy(self) -> bool:
        return bool(self.engine.has_unfinished_requests() or self.scheduler.has_requests())

    def step(self) -> tuple[list[Any], list[float] | None]:
        """One engine-loop iteration: its outputs and its sample (None: it scheduled
        nothing)."""
        self.terms = None
        t0 = time.perf_counter()
        outs = self.engine.step()
        seconds = time.perf_counter() - t0
        if self.terms is None:
            return outs, None
        return outs, [*self.terms, seconds, self.core_s]


def tokens_for(name: str, n: int, vocab: int) -> list[int]:
    """``n`` token ids of segment ``name``: the same name, the same ids (a prefix-cache
    hit), another name, other ids."""
    rng = random.Random(name)
    return [rng.randrange(3, vocab) for _ in range(n)]


def run(timer: Timer, scenario: Scenario, vocab: int, tag: str,
        params: Callable[[int], Any]) -> list[list[float]]:
    """Every step of ``scenario``'s phases, measured."""
    from vllm.inputs import TokensPrompt  # deferred: vLLM, in the engine's process

    samples: list[list[float]] = []
    counter = 0
    for phase in scenario.phases:
        pending: list[Request] = sorted(phase.requests, key=lambda r: r.at)
        k = 0
        while pending or timer.busy():
            if not timer.busy() and pending:
                k = max(k, pending[0].at)   # nothing to run: add the next now
            while pending and pending[0].at <= k:
                r = pending.pop(0)
                ids = [t for seg, n in r.segments for t in tokens_for(f"{tag}{seg}", n, vocab)]
                timer.engine.add_request(f"{tag}{counter}", TokensPrompt(prompt_token_ids=ids),
                                         params(r.max_tokens))
                counter += 1
            _, sample = timer.step()
            if sample is not None:
                samples.append(sample)
            k += 1
    return samples


def main(spec: dict[str, Any]) -> int:
    for key, value in ENGINE_ENV.items():
        os.environ.setdefault(key, value)
    t0 = time.monotonic()
    try:
        # deferred: vLLM, in the engine's environment
        from vllm import SamplingParams

        engine, unknown = start(spec["artifact"], spec["model"])
    except BaseException as exc:  # noqa: BLE001 - the engine's refusal is the answer
        emit("error", stage="start", message=causes(exc), traceback=traceback.format_exc())
        return 3
    info = describe(engine, spec["artifact"])
    if held(engine) is None:
        emit("error", stage="plugin", message="kvspec's plugin did not load in the engine")
        return 3
    limits = Limits(**info["limits"])
    scenarios = grid(spec["grid"], limits)
    repeats = int(spec.get("repeats") or GRIDS[spec["grid"]]["repeats"])
    emit("started", seconds=time.monotonic() - t0, unknown_flags=unknown,
         scenarios=[[s.kind, s.name] for s in scenarios], repeats=repeats, **info)

    def params(n: int) -> Any:
        return SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.0,
                              detokenize=False)

    timer = Timer(engine)
    try:
        # warm-up, not measured: the first steps of each kind pay one-time costs
        warm = [s for s in scenarios if s.kind == "mixed"][:1] + scenarios[:1]
        for s in warm:
            run(timer, s, info["vocab"], "warm:", params)
        for rep in range(repeats):
            for i, s in enumerate(scenarios):
                steps = run(timer, s, info["vocab"], f"r{rep}:", params)
                emit("scenario", index=i, repeat=rep, kind=s.kind, name=s.name, steps=steps)
    except BaseException as exc:  # noqa: BLE001 - reported, then the process ends
        emit("error", stage="run", message=causes(exc), traceback=traceback.format_exc())
        return 4
    emit("done", seconds=time.monotonic() - t0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(json.loads(sys.argv[1])))
