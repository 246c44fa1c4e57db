"""What a report is about: a source (planned for the report's budget) or a
verified artifact, as the Layout IR.

>>> sub = read_subject("layouts/llama-3.1-8b.kvlayout.json", 80 * 2**30)
>>> sub.kind, sub.layout.engine.axis_order.name, sub.memory == 80 * 2**30, sub.misfit
('artifact', 'LBNHC', True, None)
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from kvspec.artifact import Artifact
from kvspec.artifact.format import PoolingRecord
from kvspec.artifact.sizing import capacity_for
from kvspec.compiled import read
from kvspec.errors import KvspecError, NotEnoughMemoryError, PlanError
from kvspec.files import read_text, shown
from kvspec.model.plan import Layout, Plan

__all__ = ["Subject", "declares_pooling", "is_artifact_path", "read_subject"]


@dataclass(frozen=True)
class Subject:
    """A layout loaded for a report: its Layout IR, and its plan when it is a source.

    ``memory`` is the budget the report is for (``--memory``, else the
    source's or artifact's own); ``misfit`` the error when one request at
    ``max_model_len`` does not fit it.
    """

    path: str
    kind: str  # "source" | "artifact"
    layout: Layout
    #: The memory-independent plan of a source (re-planned for other budgets);
    #: None for an artifact, which keeps its compiled ``max_model_len``.
    plan: Plan | None
    memory: int | None
    misfit: KvspecError | None = None
    #: A separate plan's pools (name, share of the budget, layout), each reported.
    pools: tuple[tuple[str, float, Layout], ...] = ()
    #: The pooling policy's decision, when the layout had one to make.
    pooling: PoolingRecord | None = None
    #: An artifact's frozen form (None: a source), which its capacity is read from,
    #: and the pool of a separate plan the subject is (None: the whole layout).
    artifact: Artifact | None = None
    pool: str | None = None


def is_artifact_path(path: str | Path) -> bool:
    """``*.json`` files are artifacts; so is any other file (or stdin, ``-``)
    holding a JSON object with a ``body`` (a YAML source may be a flow mapping,
    which JSON parsing rejects or which has no ``body``)."""
    path = Path(path)
    if path.suffix == ".json":
        return True
    try:
        text = read_text(path, what="a layout")
    except KvspecError:  # the reader of the source says why
        return False
    if not text.lstrip().startswith("{"):
        return False
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):  # not JSON (a number too long, nested too deep)
        return False
    return isinstance(data, dict) and "body" in data


def declares_pooling(path: str | Path) -> bool:
    """Whether a source declares a pooling policy other than unified, or a workload
    (read cheaply, as YAML: the compiler reports a broken source properly)."""
    # deferred: PyYAML, which an artifact's report never needs
    import yaml

    try:
        doc = yaml.safe_load(read_text(path, what="a layout"))
    except Exception:  # noqa: BLE001 - any unreadable source: the compiler says why
        return False
    section = doc.get("pooling") if isinstance(doc, dict) else None
    return isinstance(section, dict) and (section.get("policy", "unified") != "unified"
                                          or section.get("workload") is not None)


def _pool_rows(pools: tuple[object, ...]) -> tuple[tuple[str, float, Layout], ...]:
    return tuple((p.name, float(p.share), p.layout) for p in pools)  # type: ignore[attr-defined]


def _pooled_subject(path: str | Path, memory: int | None) -> Subject:
    """A source with a pooling section: compiled through the policy's decision."""
    # deferred: the compiler (pydantic, PyYAML), which an artifact's report never needs
    from kvspec.compiler import Pooled, compile_until
    from kvspec.passes.freeze import freeze

    pooled = compile_until(path, Pooled, memory=memory, memory_name="--memory")
    layout = pooled.pools[0].layout if pooled.pools else pooled.layout
    return Subject(shown(path), "source", layout, None, pooled.budget_bytes, None,
                   _pool_rows(pooled.pools), pooled.decision, freeze(pooled))


def _artifact_subject(path: str | Path, memory: int | None) -> Subject:
    art = read(path)
    if art.pools:
        return Subject(shown(path), "artifact", art.pools[0].layout, None,
                       art.body.budget.memory if art.body.budget is not None else None,
                       None, _pool_rows(art.pools), art.body.pooling, art)
    layout = art.layout
    mem = memory if memory is not None else (
        layout.budget.memory if layout.budget is not None else None)
    misfit = None
    if mem is not None:
        try:
            capacity_for(art.body, mem)
        except PlanError as err:
            misfit = err
    return Subject(shown(path), "artifact", layout, None, mem, misfit,
                   pooling=art.body.pooling, artifact=art)


def _source_subject(path: str | Path, memory: int | None) -> Subject:
    # deferred: the compiler (pydantic, PyYAML), which an artifact's report never needs
    from kvspec.compiler import Planned, compile_until, pass_named, run, unsized
    from kvspec.passes.size import budget_of
    from kvspec.source.where import GivenMemory

    planned = compile_until(path, Planned)
    if memory is not None:
        planned = dataclasses.replace(planned, memory=GivenMemory(memory))
    misfit = None
    try:
        sized = run(planned, (pass_named("size"),))
    except NotEnoughMemoryError as err:
        # A budget that cannot serve one request still gets a report: plan it without one.
        misfit, sized = err, unsized(planned)
    mem = budget_of(planned)
    layout = sized.layout
    if mem is None and layout.budget is not None:  # a fixed block count
        mem = layout.budget.memory
    return Subject(shown(path), "source", layout, planned.plan, mem, misfit)


def read_subject(path: str | Path, memory: int | None = None) -> Subject:
    """Compile a source (planned for ``memory``) or read and verify an artifact."""
    if is_artifact_path(path):
        return _artifact_subject(path, memory)
    if declares_pooling(path):
        return _pooled_subject(path, memory)
    return _source_subject(path, memory)
