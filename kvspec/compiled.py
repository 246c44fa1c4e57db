"""Artifacts with the plan they came from: re-planning one, and reading one so.

* :func:`kvspec.passes.freeze.freeze` makes a :class:`CompiledArtifact` from a plan;
* :func:`replan` plans an artifact's inputs again (engine, each layer's spec,
  stage and quantization mode, the budget) and requires the very same body:
  the proof that an artifact is exactly what this compiler makes of its
  inputs, which ``kvspec check`` and ``verify`` give and ``load`` does not need
  (docs/artifact.md, "The trust model").

>>> art = read("layouts/llama-3.1-8b.kvlayout.json")
>>> art.layout.stage(0).bytes_per_block == art.body.stages[0].bytes_per_block
True
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path
from typing import Any

import msgspec

from kvspec.artifact import COMPILER, Artifact
from kvspec.artifact import format as fmt
from kvspec.artifact.read import RECOMPILE, decode
from kvspec.artifact.text import canonical
from kvspec.errors import ArtifactError, KvspecError, format_path
from kvspec.files import read_text, shown
from kvspec.jsonpos import Located, scan
from kvspec.model import kinds
from kvspec.model.engine import engine_from_artifact
from kvspec.model.plan import Layout
from kvspec.model.pooling import Pooling
from kvspec.model.quant.cells import Quantized, quantized
from kvspec.model.specs import LayerSpec
from kvspec.passes.freeze import CompiledArtifact, body_of, engine_record, frozen, pooled_body
from kvspec.passes.pool import PoolLayout, pool_layouts
from kvspec.planner import build_layout, plan_layers, size_plan

__all__ = ["CompiledArtifact", "body_of", "engine_record", "frozen", "read", "replan",
           "verified"]


# ---------------------------------------------------------------------------
# replan: records -> Layout, and the exactness check
# ---------------------------------------------------------------------------


def _specs(body: fmt.Layout, origin: str) -> list[LayerSpec]:
    """The body's spec table as specs (its descriptions are the one untyped part
    of the format: each kind's fields, checked by building the spec)."""
    out = []
    for i, data in enumerate(body.specs):
        try:
            out.append(kinds.spec_from_dict(msgspec.to_builtins(data)))
        except Exception as exc:  # noqa: BLE001 - whatever a malformed description raises
            raise ArtifactError(f"spec {i} cannot be read back: {type(exc).__name__}: {exc}",
                                file=origin, path=f"body.specs[{i}]",
                                hint=RECOMPILE) from None
    return out


def _replanned(body: fmt.Layout, specs: list[LayerSpec]
               ) -> tuple[Layout, tuple[PoolLayout, ...], fmt.Layout]:
    """The plan of the body's inputs (a separate plan's pools too), and its body."""
    layers = body.layers
    stages = tuple({n: specs[layers[n].spec] for n in st.layers} for st in body.stages)
    engine = engine_from_artifact(msgspec.to_builtins(body.engine))
    memory = body.budget.memory if body.budget is not None else None
    memo: dict[tuple[int, str | None], Quantized | None] = {}  # layers alike share it
    quantization = {}
    for st in stages:
        for name, spec in st.items():
            key = (id(spec), layers[name].kv_cache_dtype)
            if key not in memo:
                memo[key] = quantized(spec, key[1])
            quantization[name] = memo[key]
    record = body.pooling
    if record is not None and record.policy == "separate":
        pooling = Pooling(policy="separate", serve_with=record.serve_with,
                          block_size=record.block_size, state_block_size=record.state_block_size,
                          split=tuple((p.name, Fraction(*p.share)) for p in record.pools))
        pools = pool_layouts(body.name, body.model, engine, stages, quantization, pooling,
                             body.engine.max_model_len, memory, body.engine.max_model_len)
        planned = pooled_body(body.name, body.model, body.engine,
                              [list(st.layers) for st in body.stages], list(layers), pools,
                              record, memory)
        return pools[0].layout, pools, planned
    plan = plan_layers(engine, stages)
    sizing = size_plan(plan, memory=memory) if memory is not None else None
    layout = build_layout(body.name, body.model, plan, sizing, quantization)
    return layout, (), body_of(layout, (), record)


def replan(artifact: Artifact, origin: str = "<artifact>") -> CompiledArtifact:
    """``artifact`` proved exactly what this compiler plans from its inputs, with
    that plan; an :class:`ArtifactError` naming the first field that differs."""
    env = artifact.envelope
    specs = _specs(env.body, origin)
    try:
        layout, pools, planned = _replanned(env.body, specs)
    except KvspecError as err:
        raise ArtifactError(f"its layers do not plan: {err.message}", file=origin,
                            hint=RECOMPILE) from None
    except Exception as exc:  # noqa: BLE001 - whatever malformed inputs make the planner raise
        raise ArtifactError(f"its layers cannot be planned again: {type(exc).__name__}: {exc}",
                            file=origin, hint=RECOMPILE) from None
    # the architecture names the model and plans nothing: carried, not re-planned
    planned = msgspec.structs.replace(planned, architecture=env.body.architecture)
    if canonical(planned) != canonical(env.body):
        raise _difference(artifact, planned, origin)
    return CompiledArtifact(env, layout, source=artifact.source, pools=pools)


def _difference(artifact: Artifact, planned: fmt.Layout, origin: str) -> ArtifactError:
    ours = msgspec.to_builtins(planned)
    theirs = msgspec.to_builtins(artifact.body)
    path, what, stored, want = first_difference(theirs, ours) or (("body",), "", None, None)
    line = column = None
    if artifact.source is not None:
        source = artifact.source
        line, column = _where(source.decode("utf-8", "replace") if isinstance(source, bytes)
                              else source, path)
    newer = artifact.compiler != COMPILER
    return ArtifactError(
        "the artifact is not what kvspec plans from its own layers and engine: it was "
        "edited, or written by another compiler", file=origin, line=line, column=column,
        path=format_path(path) + what, expected=f"{_short(want)} (as {COMPILER} plans it)",
        found=_short(stored),
        hint=f"it says it was compiled by {artifact.compiler}; " + RECOMPILE
        if newer else RECOMPILE)


Path_ = tuple[str | int, ...]


def first_difference(a: Any, b: Any, path: Path_ = ("body",)
                     ) -> tuple[Path_, str, Any, Any] | None:
    """The first path where ``a`` and ``b`` differ, what differs there (``""``: the
    values, ``" (length)"``: a list's length) and both."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            if key not in a or key not in b:
                return (*path, key), "", a.get(key, "<absent>"), b.get(key, "<absent>")
            found = first_difference(a[key], b[key], (*path, key))
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b)):
            found = first_difference(x, y, (*path, i))
            if found:
                return found
        if len(a) != len(b):
            return path, " (length)", len(a), len(b)
        return None
    if a != b or type(a) is not type(b):
        return path, "", a, b
    return None


def _where(text: str, path: Path_) -> tuple[int | None, int | None]:
    try:
        positions = scan(text, lenient=True)[1]
    except Located:
        return None, None
    while path and path not in positions:
        path = path[:-1]
    return positions.get(path, (None, None))


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 120 else text[:117] + "..."


def verified(text: str | bytes, origin: str = "<artifact>") -> CompiledArtifact:
    """The artifact ``text`` holds, checked as ``load`` checks it and proved by
    re-planning (what ``check``, ``verify``, ``explain`` and ``diff`` read)."""
    return replan(Artifact(decode(text, origin), source=text), origin)


def read(path: str | Path) -> CompiledArtifact:
    """:func:`verified` of the file at ``path`` (``-``: stdin)."""
    text = read_text(path, what="an artifact", error=ArtifactError,
                     hint="compile a source with `kvspec compile model.yaml`")
    return verified(text, shown(path))
