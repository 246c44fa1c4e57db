"""Capacity at a workload: vLLM's plan against the pooling policy ``auto`` (issue 30).

    python benchmarks/bench_capacity.py [--case SUBSTR ...] [--workload short|long ...]
                                        [--requests N] [--against-vllm auto|on|off]
                                        [--out benchmarks/results/capacity.md] [--json PATH]

For every hybrid of the corpus -- the conformance cases with more than one layer
kind, state layers or sliding windows (``kvspec import``), the hybrid layouts in
``layouts/`` that are not one of those, and each hybrid family ``kvspec init``
knows (``tests/data/hf``) that has no layout of its own -- and for each workload,
one seeded trace (``kvspec.sim.generate_trace``: lognormal lengths, every request
arriving at step 0) is written to a file and three sources are compiled on the
same budget with ``pooling: {workload: {trace: FILE}}``:

* **vLLM's plan**: ``policy: unified`` (the plan vLLM 0.33 makes, simulated);
* **auto / kvspec**: ``policy: auto, serve_with: kvspec`` (separate pools allowed);
* **auto / vllm**: ``policy: auto, serve_with: vllm`` (plans vLLM's single pool holds).

Every figure is read from the artifacts' ``body.pooling.candidates[*]`` -- the
simulator's summary, the physical limit and the waste breakdown -- nothing is
simulated here. Ratios: mean running requests auto / vLLM, and steps to finish
vLLM / auto (so >= 1.0x is "auto no worse" for both).

The budget is the case's own unless the plan's physical limit at the short
workload is over :data:`SCALE_ABOVE` requests (then every plan would sit at
``max_num_seqs`` rather than at memory): it is then scaled to a physical limit of
:data:`TARGET_REQUESTS`, the same for every plan and workload of the case.

With ``--against-vllm`` (default ``auto``: when the vLLM venv is found) vLLM's
plan is also replayed through vLLM 0.33.0's own ``Scheduler`` and
``KVCacheManager`` (:mod:`kvspec.integrations.vllm.replay`, in that venv's
python) for the column "vLLM sched": kvspec's simulation of the same plan must
match it. Goals are reported, never asserted. Results go to stdout, to
``--out`` (markdown) and to ``--json`` (default: ``--out`` with ``.json``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CONFORMANCE = Path(os.environ.get("KVSPEC_CONFORMANCE",
                                  REPO.parent / "shared" / "conformance" / "cases"))
if not CONFORMANCE.is_dir():
    CONFORMANCE = REPO / "tests" / "conformance" / "cases"
VLLM_PYTHON = Path(os.environ.get("KVSPEC_VLLM_PYTHON",
                                  REPO / "build" / "vllm" / "venv" / "bin" / "python"))
RESULTS = REPO / "benchmarks" / "results" / "capacity.md"

#: name -> (prompt mean, prompt spread, output mean, output spread); the long one
#: only where max_model_len >= LONG_MIN_MODEL_LEN.
WORKLOADS = {"short": (2048, 0.6, 256, 0.5), "long": (8192, 0.6, 512, 0.5)}
LONG_MIN_MODEL_LEN = 32768
#: The cases the long workload runs on by default, one per kind of hybrid (sliding
#: window, chunked local, Mamba, Gated DeltaNet), to keep the run near 20 minutes on
#: one core; ``--workload long`` runs it on every case.
LONG_CASES = ("gemma-3-27b-it", "llama-4-scout-17b-16e-instruct", "jamba-v0.1", "qwen3.5-9b")
SCALE_ABOVE, TARGET_REQUESTS = 96.0, 64.0
GOAL_RATIO, GOAL_UTILIZATION = 1.0, 0.95
WASTE_KINDS = ("padding_slots", "padded_pages", "block_inflation", "per_request")
PLANS = ("vllm", "auto_kvspec", "auto_vllm")
POLICIES = {"vllm": ("unified", "vllm"), "auto_kvspec": ("auto", "kvspec"),
            "auto_vllm": ("auto", "vllm")}


@dataclass(frozen=True)
class Case:
    name: str
    origin: str      # conformance | layout | init
    source: Path     # a source without a pooling section
    memory: int      # bytes per rank: the same for every plan and workload
    max_model_len: int
    max_num_seqs: int
    scaled: bool


# -- the cases ------------------------------------------------------------------------------

def _kinds(layout: Any) -> set[str]:
    """Layer kinds of every stage: spec class, '+window' for windowed ones."""
    out = set()
    for st in layout.stages:
        for g in st.groups:
            for name in g.layer_names:
                spec = g.layer_spec(name)
                window = getattr(spec, "sliding_window", None) or \
                    getattr(spec, "attention_chunk_size", None)
                out.add(type(spec).__name__ + ("+window" if window else ""))
    return out


def is_hybrid(layout: Any) -> bool:
    """More than one layer kind, state layers, or sliding windows."""
    kinds = _kinds(layout)
    return len(kinds) > 1 or any("Mamba" in k or "+window" in k for k in kinds)


def _signature(layout: Any) -> tuple:
    groups = tuple((type(g.spec).__name__, g.spec.block_size, g.page_bytes(), len(g.layer_names))
                   for st in layout.stages for g in st.groups)
    return groups, layout.engine.max_model_len, layout.budget and layout.budget.num_blocks


def _kvspec(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "kvspec", *args], check=True, capture_output=True,
                   text=True, cwd=REPO)


def candidate_sources(tmp: Path, only: list[str] | None = None) -> list[tuple[str, str, Path]]:
    """(name, origin, source) of every corpus case (whose name holds one of ``only``),
    hybrid or not, as plain sources."""
    def wanted(path: Path) -> bool:
        return not only or any(s in path.stem for s in only)

    out = []
    for case in filter(wanted, sorted(CONFORMANCE.glob("*.json"))):
        dst = tmp / f"conformance-{case.stem}.yaml"
        try:
            _kvspec("import", str(case), "-o", str(dst))
        except subprocess.CalledProcessError:
            continue  # a case the reference rejects (e.g. not enough memory)
        out.append((case.stem, "conformance", dst))
    for src in filter(wanted, sorted((REPO / "layouts").glob("*.yaml"))):
        if "\npooling:" not in src.read_text():  # the pooling examples are these models
            out.append((src.stem, "layout", src))
    for cfg in filter(wanted, sorted((REPO / "tests" / "data" / "hf").glob("*.json"))):
        if (REPO / "layouts" / f"{cfg.stem}.yaml").exists():
            continue  # the layout is this model's init output
        dst = tmp / f"init-{cfg.stem}.yaml"
        _kvspec("init", "--from-hf", str(cfg), "--memory", "40GiB", "--max-model-len", "32768",
                "-o", str(dst))
        out.append((cfg.stem, "init", dst))
    return out


def held_tokens(workload: str) -> float:
    prompt, _, output, _ = WORKLOADS[workload]
    return prompt + output / 2


def budget(source: Path) -> tuple[int, bool, Any] | None:
    """(memory, scaled, layout) for a hybrid source; None otherwise."""
    from kvspec.compiler import compile as compile_file
    from kvspec.compiler import compile_until
    from kvspec.errors import KvspecError
    from kvspec.passes.size import Sized
    from kvspec.pooling.figures import Figures

    sized = compile_until(source, Sized)
    layout = sized.layout
    if not is_hybrid(layout) or layout.budget is None:
        return None
    own = layout.budget.memory
    limit = Figures(compile_file(source).body).physical_limit(round(held_tokens("short"))) or 0.0
    if limit <= SCALE_ABOVE:
        return own, False, layout
    memory = int(own * TARGET_REQUESTS / limit) >> 20 << 20
    while memory < own:
        try:
            return memory, True, compile_until(source, Sized, memory=memory).layout
        except KvspecError:
            memory *= 2  # one request at max_model_len must fit
    return own, False, layout


def discover(tmp: Path, only: list[str] | None = None) -> tuple[list[Case], list[dict]]:
    """The hybrid cases, and what was left out and why."""
    cases: list[Case] = []
    skipped: list[dict] = []
    seen: dict[tuple, str] = {}
    for name, origin, src in candidate_sources(tmp, only):
        found = budget(src)
        if found is None:
            continue
        memory, scaled, layout = found
        sig = _signature(layout)
        if sig in seen:
            skipped.append({"case": name, "origin": origin, "why": f"plans as {seen[sig]}"})
            continue
        seen[sig] = name
        cases.append(Case(name, origin, src, memory, layout.engine.max_model_len,
                          layout.engine.max_num_seqs, scaled))
    return cases, skipped


# -- one case at one workload ----------------------------------------------------------------

def write_workload_trace(case: Case, workload: str, requests: int, path: Path) -> None:
    from kvspec.sim import generate_trace, write_trace

    prompt, p_spread, output, o_spread = WORKLOADS[workload]
    write_trace(generate_trace(requests, seed=0, prompt_mean=prompt, prompt_spread=p_spread,
                               output_mean=output, output_spread=o_spread,
                               max_prompt_tokens=case.max_model_len - 1), path)


def pooled(text: str, policy: str, serve_with: str, trace: str) -> str:
    return (text.rstrip("\n") + f"\npooling:\n  policy: {policy}\n  serve_with: {serve_with}\n"
            f"  workload: {{trace: {trace}}}\n")


def compile_plan(case: Case, plan: str, trace: Path, where: Path) -> dict[str, Any]:
    """The artifact's pooling record for ``plan`` (written beside the trace)."""
    from kvspec.compiler import compile as compile_file

    policy, serve_with = POLICIES[plan]
    src = where / f"{case.name}-{plan}.yaml"
    src.write_text(pooled(case.source.read_text(), policy, serve_with, trace.name))
    art = compile_file(src, memory=case.memory)
    art.write(where / f"{case.name}-{plan}.kvlayout.json")
    return json.loads(art.text())["body"]["pooling"]


def _figures(record: dict[str, Any], index: int) -> dict[str, Any]:
    c = record["candidates"][index]
    sim, waste = c["simulated"], c["waste"]
    shares = {k: waste[k] / waste["pool_bytes"] for k in WASTE_KINDS} if waste else None
    return {"candidate": c["name"], "policy": c["policy"], "block_size": c["block_size"],
            "groups": c["groups"], "simulated": sim, "waste": shares,
            "physical_limit": c["physical_limit"], "static_requests": c["static_requests"]}


def _brief(c: dict[str, Any]) -> dict[str, Any]:
    """A candidate in a line: its name, run and why it was not servable."""
    sim = c["simulated"] or {}
    return {"name": c["name"], "mean_running": sim.get("mean_running"),
            "steps": sim.get("steps"), "peak_running": sim.get("peak_running"),
            "utilization_while_waiting": sim.get("utilization_while_waiting"),
            "note": c["note"]}


def ratios(vllm: dict[str, Any], other: dict[str, Any]) -> dict[str, float | None]:
    """Mean running other / vLLM, and steps vLLM / other (>= 1: other no worse)."""
    a, b = vllm["simulated"], other["simulated"]
    if not a or not b:
        return {"mean_running": None, "steps": None}
    return {"mean_running": b["mean_running"] / a["mean_running"],
            "steps": a["steps"] / b["steps"]}


def measure(case: Case, workload: str, requests: int, where: Path) -> dict[str, Any]:
    """One row: the three plans' figures at one workload, on one trace and budget."""
    trace = where / f"{case.name}-{workload}.jsonl"
    write_workload_trace(case, workload, requests, trace)
    start = time.perf_counter()
    records = {plan: compile_plan(case, plan, trace, where) for plan in PLANS}
    row: dict[str, Any] = {
        "case": case.name, "origin": case.origin, "workload": workload,
        "memory_bytes": case.memory, "memory_scaled": case.scaled, "requests": requests,
        "max_num_seqs": case.max_num_seqs,
        "held_tokens": records["vllm"]["workload"]["held_tokens"],
        "trace": str(trace), "source": str(where / f"{case.name}-vllm.yaml")}
    for plan, record in records.items():
        row[plan] = _figures(record, record["chosen"])
        row[plan]["candidates"] = [_brief(c) for c in record["candidates"]]
    # auto's first candidate is vLLM's plan on the same trace and budget: the same run
    row["same_baseline"] = all(r["candidates"][0]["simulated"] == row["vllm"]["simulated"]
                               for r in records.values())
    row["physical_limit"] = row["vllm"]["physical_limit"]
    row["ratios"] = {plan: ratios(row["vllm"], row[plan]) for plan in PLANS[1:]}
    row["seconds"] = round(time.perf_counter() - start, 2)
    return row


def workloads_for(case: Case, asked: list[str] | None) -> list[str]:
    """The workloads asked (default: short, and long on :data:`LONG_CASES`); long only
    where max_model_len holds its prompts."""
    if asked is None:
        asked = ["short", "long"] if case.name in LONG_CASES else ["short"]
    return [w for w in asked if w != "long" or case.max_model_len >= LONG_MIN_MODEL_LEN]


# -- vLLM's own scheduler ---------------------------------------------------------------------

def replay_worker(jobs_file: str) -> None:
    """In the vLLM venv: replay each (vLLM's plan, trace) through vLLM's scheduler.
    The plan is compiled again from its source on the same budget rather than read
    from the artifact written beside it: artifacts with simulated candidates do not
    read back yet (their ``simulated`` counts decode as floats, so the sha256 check
    fails; see benchmarks/results/capacity.md)."""
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    from kvspec.compiler import compile as compile_file
    from kvspec.integrations.vllm.replay import replay
    from kvspec.sim import read_trace

    out = []
    for job in json.loads(Path(jobs_file).read_text()):
        try:
            art = compile_file(job["source"], memory=job["memory"])
            result, _ = replay(art, read_trace(job["trace"]))
            out.append(result.as_dict())
        except Exception as exc:  # noqa: BLE001 -- reported in the table, not fatal
            out.append({"error": f"{type(exc).__name__}: {exc}"[:300]})
    print(json.dumps(out))


def against_vllm(rows: list[dict[str, Any]], where: Path) -> str | None:
    """Fill each row's ``vllm_scheduler``; a reason when it could not run."""
    jobs = where / "replay-jobs.json"
    jobs.write_text(json.dumps([{"source": r["source"], "memory": r["memory_bytes"],
                                 "trace": r["trace"]} for r in rows]))
    env = {**os.environ, "PYTHONPATH": str(REPO), "VLLM_TARGET_DEVICE": "cpu",
           "HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "ERROR"}
    proc = subprocess.run([str(VLLM_PYTHON), __file__, "--replay-worker", str(jobs)],
                          capture_output=True, text=True, env=env, cwd=REPO, check=False)
    if proc.returncode:
        return f"the vLLM replay failed: {proc.stderr.strip().splitlines()[-1:]}"
    for row, result in zip(rows, json.loads(proc.stdout.strip().splitlines()[-1])):
        row["vllm_scheduler"] = result
        ours = row["vllm"]["simulated"]
        row["vllm_scheduler_matches"] = result == ours
    return None


# -- the report --------------------------------------------------------------------------------

def _num(v: float | None, digits: int = 1) -> str:
    return "—" if v is None else f"{v:,.{digits}f}"


def _times(v: float | None) -> str:
    return "—" if v is None else f"{v:.3f}×"


def _sim(p: dict[str, Any], keys: tuple[str, ...] = ("mean_running", "peak_running", "steps",
                                                       "utilization_while_waiting")) -> str:
    s = p["simulated"] or {}
    fmt = {"mean_running": 1, "peak_running": 0, "steps": 0, "utilization_while_waiting": 3}
    return " / ".join(_num(s.get(k), fmt[k]) for k in keys)


def _waste(p: dict[str, Any]) -> str:
    """The four kinds, their total, and the rest: free blocks (and cached ones nobody
    runs with) while requests wait -- what FCFS admission leaves when the next request
    does not fit."""
    w, uww = p["waste"], (p["simulated"] or {}).get("utilization_while_waiting")
    if not w or uww is None:
        return " — | — | — | — | — | —"
    cells = [f"{100 * w[k]:.1f}%" for k in WASTE_KINDS]
    total = sum(w.values())
    return " " + " | ".join(cells) + f" | {100 * total:.1f}% | {100 * (1 - uww - total):.1f}%"


def capacity_table(rows: list[dict[str, Any]], with_vllm: bool) -> list[str]:
    head = ("| case | workload | GiB | physical limit | vLLM's plan: mean / peak / steps / "
            "util. waiting |" + (" vLLM's scheduler: mean running |" if with_vllm else "") +
            " auto (kvspec): chosen | mean / peak / steps / util. waiting | ×mean | ×steps |"
            " auto (vllm): chosen | mean / peak / steps / util. waiting | ×mean | ×steps |")
    out = [head, "|" + "|".join("---" for _ in range(head.count("|") - 1)) + "|"]
    for r in rows:
        gib = f"{r['memory_bytes'] / 2**30:.2f}" + ("*" if r["memory_scaled"] else "")
        cells = [r["case"], r["workload"], gib, _num(r["physical_limit"]), _sim(r["vllm"])]
        if with_vllm:
            v = r.get("vllm_scheduler") or {}
            if "error" in v:  # e.g. a plan only kvspec makes: vLLM 0.33 cannot hold it
                cells.append("cannot run: " + v["error"].split(":", 1)[-1].strip()[:48])
            else:
                same = "same run" if r.get("vllm_scheduler_matches") else "DIFFERS"
                cells.append(f"{_num(v.get('mean_running'))} ({same})" if v else "—")
        for plan in PLANS[1:]:
            p, x = r[plan], r["ratios"][plan]
            cells += [p["candidate"], _sim(p), _times(x["mean_running"]), _times(x["steps"])]
        out.append("| " + " | ".join(cells) + " |")
    return out


def waste_table(rows: list[dict[str, Any]]) -> list[str]:
    kinds = " | ".join(k.replace("_", " ") for k in WASTE_KINDS)
    head = (f"| case | workload | vLLM's plan: {kinds} | total | rest: free | "
            f"auto (kvspec): {kinds} | total | rest: free |")
    out = [head, "|" + "|".join("---" for _ in range(head.count("|") - 1)) + "|"]
    for r in rows:
        out.append(f"| {r['case']} | {r['workload']} |{_waste(r['vllm'])} |"
                   f"{_waste(r['auto_kvspec'])} |")
    return out


def _dominant(p: dict[str, Any], cap: int | None = None) -> str:
    """What keeps ``p`` from the limit: max_num_seqs when it binds, else the largest
    of the waste kinds and the free rest."""
    sim, w = p["simulated"] or {}, p["waste"]
    if cap is not None and sim.get("peak_running", 0) >= cap:
        return f"max_num_seqs binds: peak {sim['peak_running']} = max_num_seqs"
    if not w:
        return "no waste figures"
    kinds = dict(w, free=1 - (sim.get("utilization_while_waiting") or 0) - sum(w.values()))
    kind = max(kinds, key=lambda k: kinds[k])
    return f"{kind.replace('_', ' ')} {100 * kinds[kind]:.1f}%"


def goals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Each goal: met or not, with the rows that miss it (reported, never asserted)."""
    def low(plan: str, key: str) -> list[str]:
        return [f"{r['case']}/{r['workload']} {r['ratios'][plan][key]:.3f}×" for r in rows
                if r["ratios"][plan][key] is None or r["ratios"][plan][key] < GOAL_RATIO]

    util = [f"{r['case']}/{r['workload']} "
            f"{r['auto_kvspec']['simulated']['utilization_while_waiting']}"
            f" ({_dominant(r['auto_kvspec'], r['max_num_seqs'])}{_separate_missing(r)})"
            for r in rows
            if (r["auto_kvspec"]["simulated"]["utilization_while_waiting"] or 0)
            < GOAL_UTILIZATION]
    replayed = [r for r in rows if "vllm_scheduler" in r]
    out = {
        "auto_kvspec_mean_running": low("auto_kvspec", "mean_running"),
        "auto_kvspec_steps": low("auto_kvspec", "steps"),
        "auto_kvspec_utilization_while_waiting": util,
        "auto_vllm_mean_running": low("auto_vllm", "mean_running"),
        "auto_vllm_steps": low("auto_vllm", "steps"),
        "same_baseline": [f"{r['case']}/{r['workload']}" for r in rows if not r["same_baseline"]],
        "vllm_scheduler_differs": [f"{r['case']}/{r['workload']}" for r in replayed
                                   if "error" not in r["vllm_scheduler"]
                                   and not r.get("vllm_scheduler_matches")],
        "vllm_scheduler_cannot_run": [f"{r['case']}/{r['workload']} "
                                      f"({r['vllm_scheduler']['error']})"
                                      for r in replayed if "error" in r["vllm_scheduler"]],
    }
    out["rows"], out["replayed"] = len(rows), len(replayed)
    return out


def furthest(rows: list[dict[str, Any]], n: int = 5) -> list[str]:
    """The rows where vLLM's plan is furthest from the limit, and what closes the gap."""
    key = lambda r: r["vllm"]["simulated"]["utilization_while_waiting"] or 1.0  # noqa: E731
    out = []
    for r in sorted(rows, key=key)[:n]:
        v, a = r["vllm"], r["auto_kvspec"]
        out.append(
            f"- **{r['case']} / {r['workload']}**: vLLM's plan runs "
            f"{v['simulated']['mean_running']:.1f} requests on average against a physical limit "
            f"of {r['physical_limit']:.1f}, {key(r):.3f} of the pool live while requests wait; "
            f"its largest loss is {_dominant(v, r['max_num_seqs'])}. auto (kvspec) chooses "
            f"**{a['candidate']}**: "
            f"{a['simulated']['mean_running']:.1f} running "
            f"({r['ratios']['auto_kvspec']['mean_running']:.2f}×), "
            f"{a['simulated']['utilization_while_waiting']} live while waiting "
            f"(largest loss left: {_dominant(a, r['max_num_seqs'])}); auto (vllm) chooses "
            f"{r['auto_vllm']['candidate']} ({r['ratios']['auto_vllm']['mean_running']:.2f}×)."
            + _not_run(a))
    return out


def _separate_missing(row: dict[str, Any]) -> str:
    missing = [c["name"] for c in row["auto_kvspec"].get("candidates", [])
               if c["name"].startswith("separate") and c["mean_running"] is None]
    return f"; not weighed: {', '.join(missing)}" if missing else ""


def _not_run(p: dict[str, Any]) -> str:
    """The candidates that could not be weighed, and why (cut to a line each)."""
    notes = [f"{c['name']}: {c['note'][:160]}" for c in p.get("candidates", [])
             if c["note"] and c["mean_running"] is None]
    return (" Not weighed: " + "; ".join(notes) + ".") if notes else ""


def _goal_lines(g: dict[str, Any]) -> list[str]:
    def line(label: str, misses: list[str]) -> str:
        verdict = "met" if not misses else f"NOT met on {len(misses)} of {g['rows']}"
        return f"- {label}: **{verdict}**" + (f": {'; '.join(misses)}" if misses else "")

    out = [line("auto (kvspec) ≥ 1.0× vLLM's plan, mean running", g["auto_kvspec_mean_running"]),
           line("auto (kvspec) ≥ 1.0× vLLM's plan, steps to finish", g["auto_kvspec_steps"]),
           line(f"auto (kvspec) utilization while waiting ≥ {GOAL_UTILIZATION}",
                g["auto_kvspec_utilization_while_waiting"]),
           line("auto (vllm) ≥ 1.0× vLLM's plan, mean running", g["auto_vllm_mean_running"]),
           line("auto (vllm) ≥ 1.0× vLLM's plan, steps to finish", g["auto_vllm_steps"]),
           line("every auto compile's first candidate is vLLM's plan's run (same trace and "
                "budget)", g["same_baseline"])]
    if g["replayed"]:
        ran = g["replayed"] - len(g["vllm_scheduler_cannot_run"])
        out.append(line(f"kvspec's simulation of vLLM's plan = vLLM 0.33's own scheduler, every "
                        f"summary key ({ran} replays)", g["vllm_scheduler_differs"]))
        if g["vllm_scheduler_cannot_run"]:
            out.append("- plans vLLM 0.33 cannot run (kvspec's own layouts): " +
                       "; ".join(g["vllm_scheduler_cannot_run"]))
    return out


def report(rows: list[dict[str, Any]], skipped: list[dict], meta: dict[str, Any]) -> str:
    with_vllm = any("vllm_scheduler" in r for r in rows)
    lines = [f"# Capacity at a workload: vLLM's plan vs `auto` ({meta['date']})", "",
             (f"`python benchmarks/bench_capacity.py` — {len(rows)} rows, {meta['requests']}-"
             f"request traces (seed 0, all arriving at step 0), {meta['seconds']:.0f} s."),
             "Workloads: " + "; ".join(f"{k}: prompts ~{p:,} (spread {ps}), outputs ~{o:,} "
                                       f"(spread {os_})" for k, (p, ps, o, os_) in
                                       WORKLOADS.items()) +
             f" (long: on {', '.join(LONG_CASES)} unless `--workload long` asks for every "
             f"case where max_model_len ≥ {LONG_MIN_MODEL_LEN:,}).",
             ("GiB: the KV-cache budget per rank (*: scaled down from the case's own so the "
             f"physical limit at the short workload is ~{TARGET_REQUESTS:.0f} requests, not "
             "max_num_seqs). Physical limit: requests whose live tokens and one state per state "
             "layer fill the budget. ×mean: mean running auto / vLLM; ×steps: steps vLLM / auto "
             "(≥ 1.0× is auto no worse). Util. waiting: `utilization_while_waiting`."),
             "", "## Capacity", "", *capacity_table(rows, with_vllm), "",
             "## Waste while requests wait (shares of the pool's bytes)", "", *waste_table(rows),
             "", "## Where vLLM's plan is furthest from the physical limit", "",
             *furthest(rows), "", "## Goals (issue 30)", "", *_goal_lines(goals(rows))]
    if meta.get("failed"):
        lines += ["", "## Failed", ""] + [f"- {f['case']} / {f['workload']}: `{f['error']}`"
                                           for f in meta["failed"]]
    if meta.get("vllm_note"):
        lines += ["", f"vLLM's scheduler: {meta['vllm_note']}"]
    if skipped:
        lines += ["", "Left out (the same plan as a case above): " +
                  ", ".join(f"{s['case']} ({s['origin']}, {s['why']})" for s in skipped) + "."]
    return "\n".join(lines) + "\n"


# -- the run ---------------------------------------------------------------------------------

def vllm_available(flag: str) -> bool:
    return flag == "on" or (flag == "auto" and VLLM_PYTHON.exists())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", help="only cases whose name holds this")
    parser.add_argument("--workload", action="append", choices=sorted(WORKLOADS))
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--against-vllm", choices=("auto", "on", "off"), default="auto")
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--json", help="default: --out with .json")
    parser.add_argument("--keep", help="work (sources, traces, artifacts) in this directory "
                        "and keep it (default: a temporary one)")
    parser.add_argument("--render", help="print the report of a previous run's JSON")
    parser.add_argument("--replay-worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.replay_worker:
        return replay_worker(args.replay_worker)
    if args.render:  # the report again from a run's JSON (no simulation)
        data = json.loads(Path(args.render).read_text())
        print(report(data["rows"], data["skipped"], data["meta"]), end="")
        return None
    start = time.perf_counter()
    rows: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    with contextlib.nullcontext(args.keep) if args.keep else \
            tempfile.TemporaryDirectory(prefix="kvspec-capacity-") as tmp:
        Path(tmp).mkdir(parents=True, exist_ok=True)
        cases, skipped = discover(Path(tmp), args.case)
        for case in cases:
            for workload in workloads_for(case, args.workload):
                try:
                    rows.append(measure(case, workload, args.requests, Path(tmp)))
                except Exception as exc:  # noqa: BLE001 -- a failure is a finding: reported
                    failed.append({"case": case.name, "workload": workload,
                                   "error": f"{type(exc).__name__}: {exc}"})
                    print(f"  {case.name} / {workload}: FAILED {failed[-1]['error']}",
                          file=sys.stderr)
                    continue
                print(f"  {case.name} / {workload}: {rows[-1]['seconds']} s", file=sys.stderr)
        note = against_vllm(rows, Path(tmp)) if vllm_available(args.against_vllm) and rows \
            else "not run (no vLLM venv, or --against-vllm off)"
    meta = {"date": time.strftime("%Y-%m-%d"), "requests": args.requests,
            "seconds": time.perf_counter() - start, "vllm_note": note, "failed": failed}
    text = report(rows, skipped, meta)
    print(text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    Path(args.json or out.with_suffix(".json")).write_text(json.dumps(
        {"meta": meta, "goals": goals(rows), "rows": rows, "skipped": skipped}, indent=1))
    return None


if __name__ == "__main__":
    main()
