"""What ``kvspec simulate`` prints: the summary's keys as a table, one column per
side (kvspec's, and vLLM's with ``--against vllm``), and a note when the request
cap, not memory, keeps requests waiting.

>>> side = {"steps": 12, "peak_running": 2, "waiting_steps_by_reason": {
...     "memory": 0, "max_num_seqs": 5, "max_num_batched_tokens": 0}}
>>> cap_note(side).split(":")[0]
'max_num_seqs (2 running) keeps requests waiting in 5 steps, memory in 0'
"""

from __future__ import annotations

from typing import Any

from kvspec.reports.format import count, table

__all__ = ["ROWS", "cap_note", "latency_table", "simulate_table"]

#: The summary's keys (kvspec.sim.SUMMARY_KEYS, a dot into a nested one) and the
#: layout's waste, in the order the table prints them.
ROWS = (("steps", "steps to finish", "{:,}"), ("mean_running", "mean running", "{:.2f}"),
        ("peak_running", "peak running", "{:,}"), ("preemptions", "preemptions", "{:,}"),
        ("hit_tokens", "prefix-cache hit tokens", "{:,}"),
        ("mean_utilization", "mean utilisation", "{:.3f}"),
        ("peak_utilization", "peak utilisation", "{:.3f}"),
        ("utilization_while_waiting", "utilisation while waiting", "{:.3f}"),
        ("waiting_steps_by_reason.memory", "waiting on memory (steps)", "{:,}"),
        ("waiting_steps_by_reason.max_num_seqs", "waiting on max_num_seqs", "{:,}"),
        ("waiting_steps_by_reason.max_num_batched_tokens", "waiting on the token budget",
         "{:,}"),
        ("utilization_while_memory_bound", "utilisation, memory-bound", "{:.3f}"),
        ("layout_waste", "layout waste, memory-bound", "{:.1%}"))

def cap_note(summary: dict[str, Any]) -> str | None:
    """A note when the request cap, not memory, keeps requests waiting most."""
    by = summary["waiting_steps_by_reason"]
    if not by or by["max_num_seqs"] <= by["memory"]:
        return None
    return (f"max_num_seqs ({summary['peak_running']:,} running) keeps requests waiting in "
            f"{by['max_num_seqs']:,} steps, memory in {by['memory']:,}: the figures are the "
            "cap's, not the layout's; give --max-num-seqs more to see where memory binds")


def simulate_table(data: dict[str, Any], sides: list[str]) -> str:
    def cell(side: str, key: str, spec: str) -> str:
        value: Any = data[side]
        for part in key.split("."):
            value = None if value is None else value[part]
        return "-" if value is None else spec.format(value)

    rows = [[label, *(cell(s, key, spec) for s in sides)] for key, label, spec in ROWS]
    if len(sides) == 2:
        rows = [r + ["same" if r[1] == r[2] else ""] for r in rows]
    heads = ["", *({"kvspec": "kvspec", "vllm": "vLLM 0.33"}[s] for s in sides)]
    if len(sides) == 2:
        heads.append("")
    pools = ", ".join(f"{n} {count(b, 'block')}" for n, b in (
        (p["name"], p["blocks"]) for p in data["pools"]))
    head = f"{data['layout']}: {count(data['requests'], 'request')}"
    if data["refused"]:
        head += f" ({data['refused']:,} refused: prompt of max_model_len or more)"
    return "\n".join([head + f"; {pools}", table(rows, heads)])


#: The latency metrics (kvspec.sim.latency.METRICS) and how the table names them.
METRIC_LABELS = (("queue", "queueing"), ("ttft", "TTFT"), ("tpot", "TPOT"),
                 ("itl", "ITL"), ("e2e", "end-to-end"))


def latency_table(data: dict[str, Any], sides: list[str]) -> str:
    """A timed run's throughput, latencies (ms) and, with an SLO, goodput, one column
    per side (a side the run did not time shows -)."""
    lat = {s: data[s].get("latency") for s in sides}

    def cells(get: Any, spec: str) -> list[str]:
        out = []
        for s in sides:
            v = None if lat[s] is None else get(lat[s])
            out.append("-" if v is None else spec.format(v))
        return out

    clock = data["step_time"]
    head = (f"timed on {clock['profile']}" if clock["model"] == "linear" else
            f"timed on the step clock, {clock['step_ms']:g} ms a step")
    if data.get("concurrency"):
        head += f"; {data['concurrency']:,} closed-loop clients"
    rows = [["duration (s)", *cells(lambda d: d["duration_s"], "{:,.3f}")],
            ["requests/s", *cells(lambda d: d["requests_per_s"], "{:,.3f}")],
            ["output tokens/s", *cells(lambda d: d["output_tokens_per_s"], "{:,.1f}")]]
    for key, label in METRIC_LABELS:
        for stat in ("mean", "p50", "p90", "p99"):
            rows.append([f"{label} {stat} (ms)", *cells(
                lambda d, k=key, st=stat: None if d[f"{k}_s"][st] is None
                else d[f"{k}_s"][st] * 1000, "{:,.2f}")])
    slo = next((d["slo"] for d in lat.values() if d is not None and "slo" in d), None)
    if slo is not None:
        for i, limit in enumerate(slo["limits"]):
            rows.append([f"{limit['limit']} <= {limit['seconds'] * 1000:g} ms", *cells(
                lambda d, i=i: None if "slo" not in d else
                f"{d['slo']['limits'][i]['value'] * 1000:,.2f} ms "
                f"{'met' if d['slo']['limits'][i]['attained'] else 'MISSED'}", "{}")])
        rows.append(["requests meeting the SLO", *cells(
            lambda d: d.get("slo", {}).get("requests_meeting"), "{:,}")])
        rows.append(["goodput (requests/s)", *cells(
            lambda d: d.get("slo", {}).get("goodput_requests_per_s"), "{:,.3f}")])
    heads = ["", *({"kvspec": "kvspec", "vllm": "vLLM 0.33"}[s] for s in sides)]
    return "\n".join([head, table(rows, heads)])
