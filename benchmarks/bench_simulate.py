"""Simulation speed: kvspec's simulator against vLLM's own scheduler, and a big trace.

    python benchmarks/bench_simulate.py [--layout PATH] [--requests N] [--vs-vllm N]
                                        [--prompt-mean T] [--output-mean T] [--rate R]
                                        [--vllm auto|off] [--json]

    # with vLLM's scheduler in the same process (no GPU needed):
    VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1 PYTHONPATH=. \\
        /path/to/vllm-venv/bin/python benchmarks/bench_simulate.py

Two measurements, one run:

1. *Against vLLM*: one trace of ``--vs-vllm`` requests through kvspec's simulator
   (:func:`kvspec.sim.run_artifact`) and through vLLM 0.33.0's ``Scheduler`` and
   ``KVCacheManager`` (:mod:`kvspec.integrations.vllm.replay`, vLLM's default
   ``sha256`` prefix hashes), the same engine loop and the same block count. vLLM's
   planning and start-up are timed apart from the run. The two must agree on every
   step; the ratio is vLLM's run time over kvspec's. Goal: >= 5.
2. *A big trace*: ``--requests`` requests (100,000 by default) through kvspec's
   simulator alone, and the same loop stepping every decode (``lazy=False``) on the
   first tenth of it, for the gain of counting quiet decode steps. Goal: < 60 s.

The trace is seeded and lognormal (``kvspec.sim.generate_trace``): ``--prompt-mean``
(2048) and ``--output-mean`` (256) tokens, spread 0.5, ``--rate`` (2.0) requests
arriving per step, on ``--layout`` (Llama-3.1-8B at 40 GiB: 20,480 blocks). The
garbage collector is off during each timed run (as ``timeit`` does).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

GOAL_RATIO = 5.0
GOAL_SECONDS = 60.0


def timed(fn: Any) -> tuple[Any, float]:
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        out = fn()
        return out, time.perf_counter() - start
    finally:
        gc.enable()


def trace(n: int, args: argparse.Namespace, max_model_len: int) -> list:
    from kvspec.sim import generate_trace

    return list(generate_trace(n, seed=args.seed, prompt_mean=args.prompt_mean,
                               output_mean=args.output_mean, rate=args.rate,
                               max_prompt_tokens=max_model_len - 1))


def against_vllm(art: Any, requests: list, args: argparse.Namespace) -> dict[str, Any]:
    from kvspec.sim import run_artifact

    ours, t_ours = timed(lambda: run_artifact(art, requests)[0])
    row: dict[str, Any] = {"requests": len(requests), "kvspec_s": round(t_ours, 3),
                           "kvspec": ours.as_dict()}
    if args.vllm == "off" or importlib.util.find_spec("vllm") is None:
        row["vllm_s"] = None
        return row
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    from kvspec.integrations.vllm.replay import run_engine, vllm_engine

    (engine, layout, admitted), t_setup = timed(lambda: vllm_engine(art, requests))
    theirs, t_theirs = timed(lambda: run_engine(engine, layout, admitted, len(requests)))
    row.update(vllm_setup_s=round(t_setup, 3), vllm_s=round(t_theirs, 3),
               vllm=theirs.as_dict(), same=theirs.steps == ours.steps,
               ratio=round(t_theirs / t_ours, 2))
    return row


def big(art: Any, requests: list) -> dict[str, Any]:
    from kvspec.sim import run_artifact

    result, seconds = timed(lambda: run_artifact(art, requests)[0])
    tenth = requests[: max(1, len(requests) // 10)]
    counted, t_counted = timed(lambda: run_artifact(art, tenth)[0])
    stepped, t_stepped = timed(lambda: run_artifact(art, tenth, lazy=False)[0])
    assert counted.steps == stepped.steps, "lazy decoding changed the result"
    return {"requests": len(requests), "seconds": round(seconds, 2),
            "steps": result.num_steps, "summary": result.as_dict(),
            "tenth_counted_s": round(t_counted, 2), "tenth_stepped_s": round(t_stepped, 2),
            "lazy_gain": round(t_stepped / t_counted, 2)}


def report(vs: dict[str, Any], whole: dict[str, Any], layout: str) -> None:
    print(f"layout: {layout}")
    print(f"\n1. the same {vs['requests']:,}-request trace")
    print(f"   kvspec simulator           {vs['kvspec_s']:9.2f} s")
    if vs.get("vllm_s") is None:
        print("   vLLM scheduler             —  (vLLM not importable or --vllm off: the "
              "comparison was skipped)")
    else:
        print(f"   vLLM scheduler             {vs['vllm_s']:9.2f} s  (+ {vs['vllm_setup_s']:.2f}"
              f" s planning and start-up)")
        print(f"   ratio vLLM / kvspec        {vs['ratio']:9.2f}   goal >= {GOAL_RATIO:g}; "
              f"every step the same: {vs['same']}")
    print(f"   summary {json.dumps(vs['kvspec'])}")
    print(f"\n2. {whole['requests']:,} requests through kvspec's simulator")
    print(f"   {whole['seconds']:.2f} s for {whole['steps']:,} steps   goal < {GOAL_SECONDS:g} s")
    print(f"   summary {json.dumps(whole['summary'])}")
    print(f"   first tenth: {whole['tenth_counted_s']:.2f} s counting quiet decode steps, "
          f"{whole['tenth_stepped_s']:.2f} s stepping each ({whole['lazy_gain']:.1f}x)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layout", default=str(REPO / "layouts" / "llama-3.1-8b.kvlayout.json"))
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--vs-vllm", type=int, default=1000)
    parser.add_argument("--prompt-mean", type=float, default=2048)
    parser.add_argument("--output-mean", type=float, default=256)
    parser.add_argument("--rate", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--vllm", choices=("auto", "off"), default="auto")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    from kvspec.compiled import read as read_artifact

    art = read_artifact(args.layout)
    mml = art.layout.engine.max_model_len
    vs = against_vllm(art, trace(args.vs_vllm, args, mml), args)
    whole = big(art, trace(args.requests, args, mml))
    if args.json:
        print(json.dumps({"layout": args.layout, "against_vllm": vs, "big": whole}, indent=1))
    else:
        report(vs, whole, args.layout)


if __name__ == "__main__":
    main()
