"""kvspec's plan and vLLM's, field by field (plain data on both sides).

Both sides are in the reference view's field names (:mod:`kvspec.reports.refview`
for kvspec, the adapter's ``plan`` for vLLM). :func:`compare` lists every
field that differs, as a :class:`Row` with the field's name (``group[1].
page_size_bytes``, ``stage[0].tensor[2].block_stride``, ``input[model.layers.0.
self_attn.attn].dtype``), both values and, when a by-design rule
(:mod:`.by_design`) explains it, that rule.

>>> rows = compare({"ok": True, "num_blocks": 10}, {"ok": True, "num_blocks": 12})
>>> [(r.field, r.kvspec, r.vllm, r.status) for r in rows]
[('num_blocks', 10, 12, 'differs')]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kvspec.integrations.vllm.by_design import Rule, explaining
from kvspec.integrations.vllm.specs import spec_differences

#: Group fields compared (the reference view's names).
GROUP_FIELDS = ("layer_names", "spec_class", "block_size", "page_size_bytes",
                "page_size_padded", "sliding_window", "attention_chunk_size",
                "max_memory_usage_bytes", "max_num_blocks_per_req", "is_eagle_group")
#: Plan-wide figures compared, in the order the table shows them.
FIGURES = ("num_blocks", "pool_bytes_per_block", "scheduler_block_size", "hash_block_size",
           "max_concurrency", "kv_cache_size_tokens", "max_model_len",
           "estimated_max_model_len")
TENSOR_FIELDS = ("size", "layers", "layer_stride", "block_stride", "offset", "host_resident")


@dataclass(frozen=True)
class Row:
    """One field that differs."""

    field: str
    kvspec: Any
    vllm: Any
    #: The by-design rule that explains it, if any.
    rule: Rule | None = None

    @property
    def status(self) -> str:
        return "by design" if self.rule is not None else "differs"


def _same(field: str, a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        try:
            return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)
        except (TypeError, ValueError):
            return False
    return a == b


class _Rows:
    def __init__(self, rules: tuple[Rule, ...]) -> None:
        self.rules = rules
        self.rows: list[Row] = []

    def check(self, field: str, a: Any, b: Any, refusal: str | None = None) -> None:
        if not _same(field, a, b):
            self.rows.append(Row(field, a, b, explaining(field, self.rules, refusal)))


def compare(kv: dict[str, Any], vl: dict[str, Any], rules: tuple[Rule, ...] = (),
            kv_inputs: dict[str, dict[str, Any]] | None = None,
            defaults: dict[str, dict[str, Any]] | None = None) -> list[Row]:
    """Every difference between kvspec's view ``kv`` and vLLM's ``vl``.

    ``kv_inputs`` are kvspec's per-layer vLLM descriptions (with their
    ``page_size_bytes``), compared with ``vl["input_specs"]``; ``defaults`` the
    vLLM classes' field defaults (for fields only one side has).
    """
    out = _Rows(rules)
    if kv.get("ok") is False or vl.get("ok") is False:
        _outcomes(out, kv, vl)
        return out.rows
    for name, want in (kv_inputs or {}).items():
        got = (vl.get("input_specs") or {}).get(name)
        if got is None:
            out.check(f"input[{name}]", "present", "absent")
            continue
        for field, a, b in spec_differences(want, got, defaults):
            out.check(f"input[{name}].{field}", a, b)
    _groups(out, kv.get("groups") or [], vl.get("groups") or [])
    for field in FIGURES:
        if field in kv or field in vl:
            out.check(field, kv.get(field), vl.get(field))
    _workers(out, kv.get("workers") or [], vl.get("workers") or [])
    return out.rows


def _outcomes(out: _Rows, kv: dict[str, Any], vl: dict[str, Any]) -> None:
    a, b = kv.get("ok") is not False, vl.get("ok") is not False
    if a != b:
        out.check("outcome", "planned" if a else _error(kv), "planned" if b else _error(vl),
                  None if b else "{}: {}".format(*_refusal(vl)))
    elif not a:
        out.check("estimated_max_model_len", kv.get("estimated_max_model_len"),
                  vl.get("estimated_max_model_len"))


def _refusal(view: dict[str, Any]) -> tuple[str, str]:
    """The type and message of a side's refusal."""
    err = view.get("error") or {}
    return str(err.get("type", "error")), str(err.get("message", ""))


def _error(view: dict[str, Any]) -> str:
    kind, message = _refusal(view)
    return f"refused ({kind}: {message[:160]})"


def _groups(out: _Rows, kv: list[dict[str, Any]], vl: list[dict[str, Any]]) -> None:
    out.check("num_groups", len(kv), len(vl))
    for i, (a, b) in enumerate(zip(kv, vl)):
        for field in GROUP_FIELDS:
            out.check(f"group[{i}].{field}", a.get(field), b.get(field))


def _workers(out: _Rows, kv: list[dict[str, Any]], vl: list[dict[str, Any]]) -> None:
    out.check("num_stages", len(kv), len(vl))
    for s, (a, b) in enumerate(zip(kv, vl)):
        out.check(f"stage[{s}].num_blocks", a.get("num_blocks"), b.get("num_blocks"))
        if "pool_bytes_per_block" in a:
            out.check(f"stage[{s}].pool_bytes_per_block", a["pool_bytes_per_block"],
                      b.get("pool_bytes_per_block"))
        if "groups" in a:
            out.check(f"stage[{s}].groups", a["groups"], b.get("groups"))
        ta, tb = a.get("kv_cache_tensors") or [], b.get("kv_cache_tensors") or []
        out.check(f"stage[{s}].tensors", len(ta), len(tb))
        for j, (x, y) in enumerate(zip(ta, tb)):
            for field in TENSOR_FIELDS:
                out.check(f"stage[{s}].tensor[{j}].{field}", x.get(field), y.get(field))
