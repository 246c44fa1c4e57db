"""What a report is about: a source (planned for the report's budget) or an
artifact, as the report reads it: its frozen body (:mod:`.frozen`).

An artifact is read as ``load`` reads it (its hash and structure checked) and is
not re-planned; ``replanned=True`` proves it by re-planning and keeps the
planner's layout, which ``diff`` and ``verify`` compare.

>>> sub = read_subject("layouts/llama-3.1-8b.kvlayout.json", 80 * 2**30, replanned=False)
>>> sub.kind, sub.view.engine.axis_order.name, sub.memory == 80 * 2**30, sub.misfit
('artifact', 'LBNHC', True, None)
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvspec.artifact import Artifact
from kvspec.artifact import format as fmt
from kvspec.artifact.format import PoolingRecord
from kvspec.artifact.sizing import capacity_for
from kvspec.errors import KvspecError, NotEnoughMemoryError, PlanError
from kvspec.files import read_text, shown
from kvspec.model.engine import Engine
from kvspec.reports.explain.frozen import FrozenLayout, frozen, pool_of

__all__ = ["Resized", "Subject", "declares_pooling", "is_artifact_path", "read_subject"]

#: A budget's blocks, KV tokens, concurrent full-length requests and ``max_model_len``.
Resized = tuple[int, int, float, int]


@dataclass(frozen=True)
class Subject:
    """A layout loaded for a report: its frozen body, as the report reads it.

    ``memory`` is the budget the report is for (``--memory``, else the
    source's or artifact's own); ``misfit`` the error when one request at
    ``max_model_len`` does not fit it.
    """

    path: str
    kind: str  # "source" | "artifact"
    view: FrozenLayout
    memory: int | None
    misfit: KvspecError | None = None
    #: A separate plan's pools (name, share of the budget, view), each reported.
    pools: tuple[tuple[str, float, FrozenLayout], ...] = ()
    #: The pooling policy's decision, when the layout had one to make.
    pooling: PoolingRecord | None = None
    #: A source's capacity for another budget (re-planned: ``max_model_len: auto``
    #: refits); None: read from the frozen body, its ``max_model_len`` as compiled.
    resize: Callable[[int], Resized] | None = None
    #: The pool of a separate plan the subject is (None: the whole layout).
    pool: str | None = None
    #: The planner's layout and plan (what ``diff`` and ``verify`` compare), when
    #: read with ``replanned=True``: a :class:`kvspec.model.plan.Layout` and ``Plan``.
    layout: Any = None
    plan: Any = None

    @property
    def body(self) -> fmt.Layout:
        return self.view.body


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


def _pooled(path: str, kind: str, body: fmt.Layout, layout: Any = None,
            engines: tuple[Engine, ...] | None = None) -> Subject:
    """A separate plan: each pool reported on its own, for its share of the budget
    (``engines``: each pool's, as the source gave them)."""
    record = body.pooling
    assert record is not None, "a separate plan's body holds its pooling record"
    pools = tuple((p.name, p.share[0] / p.share[1],
                   pool_of(body, p.name, engines[i] if engines else None))
                  for i, p in enumerate(record.pools))
    mem = body.budget.memory if body.budget is not None else None
    return Subject(path, kind, pools[0][2], mem, pools=pools, pooling=record, layout=layout)


def _pooled_subject(path: str | Path, memory: int | None) -> Subject:
    """A source with a pooling section: compiled through the policy's decision."""
    # deferred: the compiler (pydantic, PyYAML), which an artifact's report never needs
    from kvspec.compiler import Pooled, compile_until
    from kvspec.passes.freeze import freeze

    pooled = compile_until(path, Pooled, memory=memory, memory_name="--memory")
    body = freeze(pooled).body
    layout = pooled.pools[0].layout if pooled.pools else pooled.layout
    if pooled.pools:
        engines = tuple(p.layout.engine for p in pooled.pools)
        return dataclasses.replace(_pooled(shown(path), "source", body, layout, engines),
                                   memory=pooled.budget_bytes)
    return Subject(shown(path), "source", frozen(body, layout.engine), pooled.budget_bytes,
                   pooling=pooled.decision, layout=layout)


def _artifact_subject(path: str | Path, memory: int | None, replanned: bool) -> Subject:
    layout = None
    if replanned:
        # deferred: the compiler (its planner proves the artifact), for diff and verify alone
        from kvspec.compiled import read

        proved = read(path)
        body, layout = proved.body, (proved.pools[0].layout if proved.pools
                                     else proved.layout)
    else:
        body = Artifact.read(path).body
    if any(p.share is not None for st in body.stages for p in st.pools):
        return _pooled(shown(path), "artifact", body, layout)
    mem = memory if memory is not None else (
        body.budget.memory if body.budget is not None else None)
    misfit = None
    if mem is not None:
        try:
            capacity_for(body, mem)
        except PlanError as err:
            misfit = err
    return Subject(shown(path), "artifact", frozen(body), mem, misfit,
                   pooling=body.pooling, layout=layout)


def _source_subject(path: str | Path, memory: int | None) -> Subject:
    # deferred: the compiler (pydantic, PyYAML), which an artifact's report never needs
    from kvspec.compiler import Planned, compile_until, pass_named, run, unsized
    from kvspec.passes.freeze import body_of
    from kvspec.passes.size import budget_of
    from kvspec.planner import size_plan
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

    def resize(budget: int) -> Resized:
        r = size_plan(planned.plan, memory=budget)
        return (r.num_blocks, r.kv_cache_size_tokens, r.max_concurrency,
                r.engine.max_model_len)

    return Subject(shown(path), "source", frozen(body_of(layout), layout.engine), mem, misfit,
                   resize=resize, layout=layout, plan=planned.plan)


def read_subject(path: str | Path, memory: int | None = None, *,
                 replanned: bool = True) -> Subject:
    """Compile a source (planned for ``memory``) or read an artifact (and, when
    ``replanned``, prove it by planning it again)."""
    if is_artifact_path(path):
        return _artifact_subject(path, memory, replanned)
    if declares_pooling(path):
        return _pooled_subject(path, memory)
    return _source_subject(path, memory)
