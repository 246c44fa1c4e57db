"""Compile time of ``pooling: {policy: auto}`` with a 1,500-request trace (issue 39).

    python benchmarks/bench_auto.py [--family SUBSTR ...] [--requests N]
                                    [--baseline DIR] [--out benchmarks/results/auto.md]

For every family ``kvspec init`` knows (``tests/data/hf/*.json``: ``kvspec init
--from-hf CONFIG --memory 40GiB --max-model-len 32768``), the init'ed source gets
``pooling: {policy: auto, serve_with: kvspec, workload: {trace: FILE}}`` with one
seeded trace of ``--requests`` requests (1,500 by default; lognormal prompts ~2,048
tokens, spread 0.6, outputs ~256, spread 0.5, every request arriving at step 0),
and ``kvspec compile`` runs on it in a fresh process, timed from start to exit (the
time a pre-commit hook or a CI step waits on an idle machine: the process's CPU
seconds, user and system, since on a shared machine the wall clock counts other
people's work too). Goal: <= 5 s for every family.

With ``--baseline DIR`` (a checkout of another revision, e.g. main's at
``/work/main``; or ``source``: this checkout with its simulator imported from the Python
source rather than its compiled build, ``KVSPEC_PURE_PYTHON=1``) each compile also runs
with that kvspec, in the same run, alternating with this one: its time, the ratio,
whether both kept the same candidate and whether they wrote the same artifact, byte for
byte. Goals are reported, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

GOAL_SECONDS = 5.0
RESULTS = REPO / "benchmarks" / "results" / "auto.md"
POOLING = """
pooling:
  policy: auto
  serve_with: kvspec
  workload: {{trace: {trace}}}
"""


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run(args: list[str], code: Path, cwd: Path) -> tuple[float, subprocess.CompletedProcess]:
    """``kvspec ARGS`` with the kvspec at ``code`` (``source``: this checkout's, its
    simulator from the Python source), and its CPU seconds (user and system: on a
    shared machine the wall clock counts other people's work too)."""
    env = {**os.environ, "PYTHONPATH": str(code)}
    env.pop("KVSPEC_PURE_PYTHON", None)
    if str(code) == "source":
        env.update(PYTHONPATH=str(REPO), KVSPEC_PURE_PYTHON="1")
    start = _cpu()
    out = subprocess.run([sys.executable, "-m", "kvspec", *args], check=False,
                         capture_output=True, text=True, env=env, cwd=cwd)
    return _cpu() - start, out


def families(only: list[str] | None) -> list[Path]:
    configs = sorted((REPO / "tests" / "data" / "hf").glob("*.json"))
    return [c for c in configs if not only or any(s in c.stem for s in only)]


def write_trace(path: Path, requests: int) -> None:
    from kvspec.sim import generate_trace
    from kvspec.sim import write_trace as write

    write(generate_trace(requests, seed=0, prompt_mean=2048, prompt_spread=0.6,
                         output_mean=256, output_spread=0.5, max_prompt_tokens=32767), path)


def kept(artifact: Path) -> str | None:
    record = json.loads(artifact.read_text())["body"]["pooling"]
    return record["candidates"][record["chosen"]]["name"] if record else None


def measure(config: Path, where: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One family: init, then compile with auto (this revision, and the baseline)."""
    src = where / f"{config.stem}.yaml"
    seconds, out = _run(["init", "--from-hf", str(config), "--memory", "40GiB",
                         "--max-model-len", "32768", "-o", str(src)], REPO, where)
    if out.returncode != 0:
        return {"family": config.stem, "error": out.stderr.strip().splitlines()[-1]}
    src.write_text(src.read_text().rstrip("\n") + "\n" + POOLING.format(trace="trace.jsonl"))
    row: dict[str, Any] = {"family": config.stem}
    sides = [("after", REPO)] + ([("before", Path(args.baseline))] if args.baseline else [])
    for side, code in sides:
        artifact = where / f"{config.stem}-{side}.kvlayout.json"
        seconds, out = _run(["compile", str(src), "-o", str(artifact), "--force"], code, where)
        if out.returncode != 0:
            row[side] = {"error": (out.stderr.strip().splitlines() or ["?"])[-1]}
            continue
        row[side] = {"seconds": round(seconds, 2), "kept": kept(artifact)}
    if "seconds" in row.get("after", {}) and "seconds" in row.get("before", {}):
        row["speedup"] = round(row["before"]["seconds"] / row["after"]["seconds"], 2)
        row["same_choice"] = row["before"]["kept"] == row["after"]["kept"]
        row["same_artifact"] = (where / f"{config.stem}-before.kvlayout.json").read_bytes() == \
            (where / f"{config.stem}-after.kvlayout.json").read_bytes()
    return row


def report(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    with_base = bool(meta["baseline"])
    head = ["family", "compile (s)", "kept"]
    if with_base:
        head += [f"before: {meta['baseline']} (s)", "speed-up", "same choice",
                 "same artifact"]
    lines = [f"# `compile` with `policy: auto` ({meta['date']})", "",
             (f"`python benchmarks/bench_auto.py` -- {meta['requests']:,}-request trace per "
              f"family, every init'ed family (`tests/data/hf`), 40 GiB, max_model_len 32,768; "
              f"each compile a fresh process, CPU seconds to exit; {meta['seconds']:.0f} s in all; "
              f"simulator: {meta['simulator']}. "
              f"Goal: <= {GOAL_SECONDS:g} s per family."), "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        a = r.get("after", {})
        cells = [r["family"], r.get("error") or a.get("error") or f"{a['seconds']:.2f}",
                 a.get("kept") or "-"]
        if with_base:
            b = r.get("before", {})
            cells += [b.get("error") or (f"{b['seconds']:.2f}" if "seconds" in b else "-"),
                      f"{r['speedup']:.2f}x" if "speedup" in r else "-",
                      str(r.get("same_choice", "-")), str(r.get("same_artifact", "-"))]
        lines.append("| " + " | ".join(cells) + " |")
    timed = [r["after"]["seconds"] for r in rows if "seconds" in r.get("after", {})]
    met = sum(1 for t in timed if t <= GOAL_SECONDS)
    lines += ["", (f"Goal met for {met} of {len(timed)} families; slowest "
                   f"{max(timed, default=0):.2f} s.")]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", action="append", help="only families whose name holds it")
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--baseline", help="a checkout of another revision (e.g. /work/main), "
                        "or 'source' (this checkout, KVSPEC_PURE_PYTHON=1)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        write_trace(where / "trace.jsonl", args.requests)
        for config in families(args.family):
            row = measure(config, where, args)
            print(json.dumps(row), flush=True)
            rows.append(row)
    from kvspec import _native

    meta = {"date": time.strftime("%Y-%m-%d"), "requests": args.requests,
            "simulator": _native.install(),
            "baseline": args.baseline, "seconds": time.perf_counter() - start}
    text = report(rows, meta)
    print(text)
    args.out.write_text(text)
    args.out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows},
                                                        indent=1) + "\n")


if __name__ == "__main__":
    main()
