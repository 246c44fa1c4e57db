"""Simulation speed: kvspec's simulator against vLLM's own scheduler, and a big trace.

    python benchmarks/bench_simulate.py [--layout PATH] [--requests N] [--vs-vllm N]
                                        [--prompt-mean T] [--output-mean T] [--rate R]
                                        [--vllm auto|off] [--baseline DIR] [--growth N]
                                        [--json]

    # with vLLM's scheduler in the same process (no GPU needed):
    VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1 PYTHONPATH=. \\
        /path/to/vllm-venv/bin/python benchmarks/bench_simulate.py

Two measurements, one run:

1. *Against vLLM*: one trace of ``--vs-vllm`` requests through kvspec's simulator
   (:func:`kvspec.sim.run_artifact`) and through vLLM 0.33.0's ``Scheduler`` and
   ``KVCacheManager`` (:mod:`kvspec.integrations.vllm.replay`, vLLM's default
   ``sha256`` prefix hashes), the same engine loop and the same block count. vLLM's
   planning and start-up are timed apart from the run. The two must agree on every
   step; the ratio is vLLM's run time over kvspec's. Goal: >= 60 (issue 39:
   what its 10 s for 100,000 requests implies).
2. *A big trace*: ``--requests`` requests (100,000 by default) through kvspec's
   simulator alone, and the same loop stepping every decode (``lazy=False``) on the
   first tenth of it, for the gain of counting quiet decode steps. Goal (issue 39):
   <= 10 s. With ``--baseline DIR`` (a checkout of another revision, e.g. main's at
   ``/work/main``) the same trace also runs through *that* revision's simulator, in a
   subprocess importing kvspec from DIR, in the same run: its time, the ratio, and
   whether every step record is the same (a digest of them). ``--baseline source``
   runs this checkout's simulator from its Python source instead of its compiled
   build (``KVSPEC_PURE_PYTHON=1``, :mod:`kvspec._native`).
3. *Growth with the queue*: ``--growth`` requests (1,000,000 by default; 0 skips it)
   of the same kind; goal: t(growth) / t(requests) <= 11 for ten times the requests
   (time linear in the trace, not in the queue). Section 2 reports the same ratio one
   decade down: t(requests) / t(its first tenth).

The trace is seeded and lognormal (``kvspec.sim.generate_trace``): ``--prompt-mean``
(2048) and ``--output-mean`` (256) tokens, spread 0.5, ``--rate`` (2.0) requests
arriving per step, on ``--layout`` (Llama-3.1-8B at 40 GiB: 20,480 blocks). The
garbage collector is off during each timed run (as ``timeit`` does). Times are CPU
seconds of the process (``time.process_time``): on a shared machine the wall clock
counts other people's work too.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

GOAL_RATIO = 60.0
GOAL_SECONDS = 10.0
GOAL_GROWTH = 11.0

#: Runs a trace file through the kvspec importable from sys.argv[1] (a checkout): its
#: seconds (the run alone, gc off) and a digest of every step record, as JSON.
BASELINE = """
import gc, hashlib, json, sys, time
sys.path.insert(0, sys.argv[1])
from kvspec.compiled import read
from kvspec.sim import read_trace, run_artifact
art, trace = read(sys.argv[2]), list(read_trace(sys.argv[3]))
gc.collect(); gc.disable()
start = time.process_time()
result = run_artifact(art, trace)[0]
seconds = time.process_time() - start
gc.enable()
digest = hashlib.sha256("\\n".join(map(repr, map(tuple, result.steps))).encode()).hexdigest()
print(json.dumps({"seconds": seconds, "steps": result.num_steps, "digest": digest}))
"""


def timed(fn: Any) -> tuple[Any, float]:
    """``fn()`` and the CPU seconds it took (this process's: on a shared machine the
    wall clock counts other people's work too)."""
    gc.collect()
    gc.disable()
    try:
        start = time.process_time()
        out = fn()
        return out, time.process_time() - start
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


def digest(result: Any) -> str:
    """A digest of every step record (what BASELINE prints for another revision)."""
    return hashlib.sha256("\n".join(map(repr, map(tuple, result.steps))).encode()).hexdigest()


def baseline(directory: str, layout: str, requests: list) -> dict[str, Any]:
    """The same trace through the simulator of the checkout at ``directory`` (``source``:
    this checkout's Python source, not its compiled build)."""
    from kvspec.sim import write_trace

    pure = directory == "source"
    directory = str(REPO) if pure else directory
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.jsonl"
        write_trace(requests, path)
        env = {**os.environ, "PYTHONPATH": directory}
        if pure:
            env["KVSPEC_PURE_PYTHON"] = "1"
        out = subprocess.run([sys.executable, "-c", BASELINE, directory, layout, str(path)],
                             check=True, capture_output=True, text=True, env=env, cwd=directory)
    return json.loads(out.stdout.splitlines()[-1])


def big(art: Any, requests: list, args: argparse.Namespace) -> dict[str, Any]:
    from kvspec.sim import run_artifact

    result, seconds = timed(lambda: run_artifact(art, requests)[0])
    row: dict[str, Any] = {"requests": len(requests), "seconds": round(seconds, 2),
                           "steps": result.num_steps, "summary": result.as_dict()}
    if args.baseline:
        before = baseline(args.baseline, args.layout, requests)
        row["baseline"] = {"dir": args.baseline, "seconds": round(before["seconds"], 2),
                           "same": before["digest"] == digest(result)
                           and before["steps"] == result.num_steps,
                           "speedup": round(before["seconds"] / seconds, 2)}
    tenth = requests[: max(1, len(requests) // 10)]
    counted, t_counted = timed(lambda: run_artifact(art, tenth)[0])
    stepped, t_stepped = timed(lambda: run_artifact(art, tenth, lazy=False)[0])
    assert counted.steps == stepped.steps, "lazy decoding changed the result"
    row.update(tenth_counted_s=round(t_counted, 2), tenth_stepped_s=round(t_stepped, 2),
               lazy_gain=round(t_stepped / t_counted, 2),
               # growth with the queue, from the same run: t(requests) / t(requests / 10)
               tenfold=round(seconds / t_counted, 2))
    return row


def growth(art: Any, args: argparse.Namespace, small: dict[str, Any]) -> dict[str, Any] | None:
    """t(--growth requests) / t(--requests requests), the same kind of trace."""
    from kvspec.sim import run_artifact

    if not args.growth:
        return None
    requests = trace(args.growth, args, art.layout.engine.max_model_len)
    result, seconds = timed(lambda: run_artifact(art, requests)[0])
    return {"requests": args.growth, "seconds": round(seconds, 2), "steps": result.num_steps,
            # None: the small run was too quick to time (it rounds to 0.00 s)
            "ratio": round(seconds / small["seconds"], 2) if small["seconds"] else None,
            "requests_ratio": round(args.growth / small["requests"], 2)}


def report(vs: dict[str, Any], whole: dict[str, Any], grown: dict[str, Any] | None,
           layout: str) -> None:
    from kvspec import _native

    print(f"layout: {layout}")
    print(f"simulator: {_native.install()}")
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
    print(f"   {whole['seconds']:.2f} s for {whole['steps']:,} steps   goal <= {GOAL_SECONDS:g} s")
    before = whole.get("baseline")
    if before:
        print(f"   before ({before['dir']}): {before['seconds']:.2f} s; speed-up "
              f"{before['speedup']:.2f}x; every step the same: {before['same']}")
    print(f"   summary {json.dumps(whole['summary'])}")
    print(f"   first tenth: {whole['tenth_counted_s']:.2f} s counting quiet decode steps, "
          f"{whole['tenth_stepped_s']:.2f} s stepping each ({whole['lazy_gain']:.1f}x); "
          f"t(all) / t(first tenth) = {whole['tenfold']:.2f}   goal <= {GOAL_GROWTH:g}")
    if grown:
        ratio = "—" if grown["ratio"] is None else f"{grown['ratio']:.2f}"
        print(f"\n3. {grown['requests']:,} requests: {grown['seconds']:.2f} s for "
              f"{grown['steps']:,} steps; t / t({whole['requests']:,}) = {ratio} "
              f"for {grown['requests_ratio']:g}x the requests   goal <= {GOAL_GROWTH:g}")


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
    parser.add_argument("--baseline", help="a checkout of another revision to time on the "
                        "same big trace (e.g. /work/main), or 'source': this checkout's "
                        "simulator from its Python source (KVSPEC_PURE_PYTHON=1)")
    parser.add_argument("--growth", type=int, default=1_000_000,
                        help="requests of the growth run (0: skip it)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    from kvspec.compiled import read as read_artifact

    art = read_artifact(args.layout)
    mml = art.layout.engine.max_model_len
    vs = against_vllm(art, trace(args.vs_vllm, args, mml), args)
    print(json.dumps({"against_vllm": vs}), file=sys.stderr, flush=True)
    whole = big(art, trace(args.requests, args, mml), args)
    print(json.dumps({"big": whole}), file=sys.stderr, flush=True)
    grown = growth(art, args, whole)
    if args.json:
        print(json.dumps({"layout": args.layout, "against_vllm": vs, "big": whole,
                          "growth": grown}, indent=1))
    else:
        report(vs, whole, grown, args.layout)


if __name__ == "__main__":
    main()
