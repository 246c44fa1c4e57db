"""Compare kvspec's plan of a conformance case with the reference's expected file.

``compare(case, expected)`` returns a list of human-readable mismatches (empty
when the plan matches). Used by the conformance tests and by
``python -m tests.conformance.harness`` for a quick report.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from kvspec.errors import KvspecError
from kvspec.integrations.dump.read import read_dump
from kvspec.planner import plan_layers, size_plan
from kvspec.reports.refview import reference_view, views_of

CONFORMANCE = Path(__file__).resolve().parent

GROUP_FIELDS = ("layer_names", "spec_class", "block_size", "page_size_bytes",
                "page_size_padded", "sliding_window", "attention_chunk_size",
                "max_memory_usage_bytes", "max_num_blocks_per_req", "is_eagle_group")


def case_names() -> list[str]:
    return sorted(p.stem for p in (CONFORMANCE / "cases").glob("*.json"))


def load(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    case = json.loads((CONFORMANCE / "cases" / f"{name}.json").read_text())
    expected = json.loads((CONFORMANCE / "expected" / f"{name}.json").read_text())
    return case, expected


def _first(value: Any) -> Any:
    return value[0] if isinstance(value, list) else value


def plan_case(case: dict[str, Any]):
    """Plan a case straight from its dump: (plan, sizing) or a KvspecError."""
    engine, stages = read_dump(case)
    plan = plan_layers(engine, stages)
    return plan, size_plan(plan, memory=case["config"]["available_memory_bytes"])


def compare(case: dict[str, Any], expected: dict[str, Any], *, planner=None) -> list[str]:
    """Mismatches between kvspec's plan of ``case`` and ``expected``.

    ``planner(case) -> (plan, resolved)`` plans the case; the default plans
    the dump directly, the tests also plan it through an imported YAML source.
    """
    problems: list[str] = []

    def check(what: str, got: Any, want: Any) -> None:
        if got != want:
            problems.append(f"{what}: got {json.dumps(got)[:300]}, want {json.dumps(want)[:300]}")

    _, stages = read_dump(case)
    for name, spec in {n: s for st in stages for n, s in st.items()}.items():
        want = expected["input_specs"][name]
        check(f"input {name} page_size_bytes", spec.page_size_bytes, want["page_size_bytes"])
        check(f"input {name} block_size", spec.block_size, want["block_size"])
    try:
        plan, resolved = (planner or plan_case)(case)
    except KvspecError as err:
        if expected["ok"]:
            problems.append(f"rejected: {err.render()}")
        else:
            want_est = expected.get("memory", {}).get("estimated_max_model_len")
            got_est = getattr(err, "estimated_max_model_len", None)
            if want_est is not None:
                check("error estimated_max_model_len", got_est, _first(want_est))
        return problems
    if not expected["ok"]:
        return [f"planned, but the reference rejects: {expected['error']['message'][:200]}"]

    view = reference_view(plan, resolved)
    check("num_groups", len(view["groups"]), len(expected["groups"]))
    for i, (g, w) in enumerate(zip(view["groups"], expected["groups"])):
        for f in GROUP_FIELDS:
            check(f"group {i} {f}", g[f], w[f])
    check("num_blocks", view["num_blocks"], expected["num_blocks"])
    check("draft_num_blocks", view["draft_num_blocks"], expected["draft_num_blocks"])
    check("pool_bytes_per_block", view["pool_bytes_per_block"],
          _first(expected["pool_bytes_per_block"]))
    check("kv_cache_tensors", view["kv_cache_tensors"], expected["kv_cache_tensors"])
    for i, (wk, ew) in enumerate(zip(view["workers"], expected["worker_kv_cache_configs"])):
        check(f"worker {i} num_blocks", wk["num_blocks"], ew["num_blocks"])
        check(f"worker {i} tensors", wk["kv_cache_tensors"], ew["kv_cache_tensors"])
    check("workers", len(view["workers"]), len(expected["worker_kv_cache_configs"]))
    for f in ("scheduler_block_size", "hash_block_size", "max_concurrency",
              "kv_cache_size_tokens"):
        check(f, view[f], expected[f])
    check("max_model_len", view["max_model_len"], expected["max_model_len_after_planning"])
    check("estimated_max_model_len", view["estimated_max_model_len"],
          min(expected["memory"]["estimated_max_model_len"])
          if isinstance(expected["memory"]["estimated_max_model_len"], list)
          else expected["memory"]["estimated_max_model_len"])
    want_views = expected["views"]
    per_worker = want_views if want_views and isinstance(want_views[0], list) else [want_views]
    for stage, want in enumerate(per_worker):
        try:
            check(f"views of stage {stage}", views_of(resolved, stage), want)
        except KvspecError as err:
            problems.append(f"views: {err.render()}")
    return problems


def main() -> int:
    bad = 0
    for name in (sys.argv[1:] or case_names()):
        case, expected = load(name)
        problems = compare(case, expected)
        print(f"{'match   ' if not problems else 'MISMATCH'} {name}")
        for p in problems[:8]:
            print("    " + p)
        bad += bool(problems)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
