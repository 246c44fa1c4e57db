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
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def report_data(report: Any) -> dict[str, Any]:
    """``report`` as plain data (JSON types only)."""
    return _plain(report)


def report_json(report: Any) -> str:
    return json.dumps(report_data(report), indent=1, sort_keys=True) + "\n"
