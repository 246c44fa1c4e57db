"""``verify``'s output: a table of the fields that differ, text, Markdown or JSON."""

from __future__ import annotations

import json
from typing import Any

from kvspec.integrations.vllm.verify import Verdict
from kvspec.reports.format import human_bytes, md_table, table

#: Longest value shown in a table cell.
CELL = 48


def _cell(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (list, dict, bool)) or value is None \
        else str(value)
    return text if len(text) <= CELL else text[:CELL - 3] + "..."


def summary(v: Verdict) -> str:
    """One line: agree, differ by design only (naming the rules), or differ."""
    if v.agrees:
        return f"agrees with vLLM {v.vllm_version}"
    differ = sum(r.rule is None for r in v.rows)
    rules = ", ".join(r.id for r in v.rules_used)
    if v.by_design_only:
        return (f"differs from vLLM {v.vllm_version} by design only "
                f"({len(v.rows)} field(s); rule(s): {rules})")
    extra = f"; {len(v.rows) - differ} more by design ({rules})" if rules else ""
    return f"differs from vLLM {v.vllm_version}: {differ} field(s){extra}"


def _rows(v: Verdict) -> list[list[str]]:
    return [[r.field, _cell(r.kvspec), _cell(r.vllm),
             f"differs by design: {r.rule.id}" if r.rule else "differs"] for r in v.rows]


def _agreed(v: Verdict) -> str:
    kv = v.kvspec
    if kv.get("ok") is False:
        return ("both refuse the budget (estimated max_model_len "
                f"{kv.get('estimated_max_model_len')})")
    groups = len(kv.get("groups") or [])
    tensors = sum(len(w["kv_cache_tensors"]) for w in kv.get("workers") or [])
    return (f"same {groups} group(s), {tensors} tensor(s), num_blocks {kv.get('num_blocks')}, "
            f"block sizes {kv.get('scheduler_block_size')}/{kv.get('hash_block_size')}, "
            f"max concurrency {kv.get('max_concurrency', 0):.4g}, "
            f"{kv.get('kv_cache_size_tokens')} tokens")


def render_text(v: Verdict) -> str:
    lines = [f"kvspec verify --against vllm: {v.path}",
             (f"  vLLM {v.vllm_version}, budget {human_bytes(v.memory)} per rank "
              f"({v.memory_origin})")]
    if v.agrees:
        lines.append("  " + _agreed(v))
    else:
        lines += ["", table(_rows(v), ["field", "kvspec", f"vLLM {v.vllm_version}", "verdict"],
                            right="llll"), ""]
        for rule in v.rules_used:
            lines.append(f"by design, {rule.id}: {rule.title}. The reference (kvspec) "
                         f"{rule.reference}; vLLM {v.vllm_version} {rule.upstream}.")
    lines += [f"note: {text}" for text in v.notes]
    lines.append(summary(v))
    return "\n".join(lines) + "\n"


def render_md(v: Verdict) -> str:
    out = [f"**kvspec verify --against vllm** `{v.path}`: {summary(v)}", ""]
    if not v.agrees:
        out += [md_table(_rows(v), ["field", "kvspec", f"vLLM {v.vllm_version}", "verdict"]),
                ""]
    return "\n".join(out) + "\n"


def as_json(v: Verdict) -> dict[str, Any]:
    return {"path": v.path, "vllm": v.vllm_version, "memory": v.memory,
            "memory_origin": v.memory_origin, "agrees": v.agrees,
            "by_design_only": v.by_design_only, "summary": summary(v),
            "rules_applicable": [r.id for r in v.rules], "notes": list(v.notes),
            "differences": [{"field": r.field, "kvspec": r.kvspec, "vllm": r.vllm,
                             "status": r.status, "rule": r.rule.id if r.rule else None}
                            for r in v.rows]}


def render(v: Verdict, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(as_json(v), indent=1, sort_keys=True, default=str) + "\n"
    return render_md(v) if fmt == "md" else render_text(v)
