"""A report as plain JSON data (``kvspec explain --format json``).

The shape is the :class:`~kvspec.reports.explain.report.Report` dataclass's,
field for field (documented in docs/reports.md), with the engine settings as
the artifact writes them and tuples as lists; the block map's segments keep
their byte positions.

>>> from kvspec.reports.explain import explain
>>> data = report_data(explain("layouts/llama-3.1-8b.yaml"))
>>> data["groups"][0]["kind"], data["capacity"]["num_blocks"], data["engine"]["layout"]
('full_attention', 20480, 'LBNHC')
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from kvspec.model.engine import Engine


def _plain(value: Any) -> Any:
    if isinstance(value, Engine):
        out = dataclasses.asdict(value)
        out["layout"] = out.pop("axis_order").name
        if out["pp_layer_partition"] is not None:
            out["pp_layer_partition"] = list(out["pp_layer_partition"])
        return out
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)
                if not f.metadata.get("text_only")}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def report_data(report: Any) -> dict[str, Any]:
    """``report`` as plain data (JSON types only)."""
    return _plain(report)


#: The keys of a report's JSON (the Report's fields): what marks a file as one.
_REPORT_KEYS = frozenset({"name", "path", "kind", "engine", "groups", "pools", "block",
                          "capacity", "waste", "warnings"})


def is_report_text(text: str) -> bool:
    r"""Whether ``text`` is a report ``kvspec explain`` wrote, in any of its formats
    (so ``explain -o`` replaces its own earlier output without ``--force``).

    >>> from kvspec.reports.explain import explain, render
    >>> rep = explain("layouts/llama-3.1-8b.yaml")
    >>> all(is_report_text(render(rep, f)) for f in ("text", "md", "html"))
    True
    >>> is_report_text(report_json(rep)), is_report_text("# my notes\n")
    (True, False)
    """
    head = text[:4096]
    lines = head.splitlines()
    if head.startswith("<!DOCTYPE html>"):
        return '<meta name="generator" content="kvspec ' in head \
            and "KV-cache layout report</title>" in head
    if lines and lines[0].startswith("### KV-cache layout: "):
        return True
    if len(lines) >= 2 and lines[0].endswith(": KV-cache layout report") \
            and lines[1].split(" ", 1)[0] in ("source", "artifact") and ", kvspec " in lines[1]:
        return True
    if head.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):
            return False
        return isinstance(data, dict) and data.keys() >= _REPORT_KEYS
    return False


def report_json(report: Any) -> str:
    return json.dumps(report_data(report), indent=1, sort_keys=True) + "\n"
