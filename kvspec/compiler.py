"""``compile()``: a fold over the compiler passes, source text -> artifact.

The pipeline is data: :data:`PASSES` is an ordered tuple of pure functions
``Unit -> Unit``, so a test can run any prefix of it and look at the result::

    load -> parse -> expand -> validate -> plan -> size -> freeze

>>> from pathlib import Path
>>> art = compile_source(Path("layouts/llama-3.1-8b.yaml").read_text(), "llama.yaml")
>>> art.layout.groups[0].spec.kind, art.layout.stage(0).bytes_per_block
('full_attention', 2097152)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kvspec.collector import paused
from kvspec.freeze import freeze
from kvspec.errors import KvspecError, Location, PlanError
from kvspec.model.plan import Layout, Plan
from kvspec.planner import layout_of, plan_layers, resolve
from kvspec.planner.resolve import Resolved
from kvspec.source.document import Document, format_path, parse_yaml
from kvspec.source.expand import Expanded, expand
from kvspec.source.parse import parse_source
from kvspec.source.schema import Source
from kvspec.source.validate import validate_source

if TYPE_CHECKING:
    from kvspec.freeze import CompiledArtifact as Artifact


@dataclass(frozen=True)
class Unit:
    """Everything the compiler knows about one source, pass by pass."""

    text: str
    file: str
    memory: int | None = None
    doc: Document | None = None
    source: Source | None = None
    expanded: Expanded | None = None
    plan: Plan | None = None
    resolved: Resolved | None = None
    layout: Layout | None = None
    artifact: Artifact | None = None


Pass = Callable[[Unit], Unit]


def load(unit: Unit) -> Unit:
    """Text -> YAML document with positions."""
    return dataclasses.replace(unit, doc=parse_yaml(unit.text, unit.file))


def parse(unit: Unit) -> Unit:
    """YAML document -> the source model (schema version 1); all problems at once."""
    assert unit.doc is not None
    return dataclasses.replace(unit, source=parse_source(unit.doc))


def expand_pass(unit: Unit) -> Unit:
    """Source -> one spec per layer per rank (patterns, defaults, TP, quantization)."""
    assert unit.source is not None and unit.doc is not None
    return dataclasses.replace(unit, expanded=expand(unit.source, unit.doc))


def validate(unit: Unit) -> Unit:
    """Checks across fields and layers the schema cannot make; all problems at once."""
    assert unit.source is not None and unit.doc is not None and unit.expanded is not None
    validate_source(unit.source, unit.doc, unit.expanded)
    return unit


def plan_pass(unit: Unit) -> Unit:
    """Layer specs -> groups, per-stage projection and placement (no budget needed)."""
    ex = unit.expanded
    assert ex is not None
    try:
        plan = plan_layers(ex.engine, list(ex.stage_specs))
    except KvspecError as err:
        raise locate(err, unit) from None
    return dataclasses.replace(unit, plan=plan)


def size_pass(unit: Unit) -> Unit:
    """Check one request fits and size the pool for the budget, when there is one;
    then the Layout IR."""
    plan, source, ex = unit.plan, unit.source, unit.expanded
    assert plan is not None and source is not None and ex is not None
    memory = unit.memory
    if memory is None and source.engine.memory is not None:
        memory = int(source.engine.memory)
    resolved = None
    if memory is not None or plan.engine.num_gpu_blocks_override is not None:
        try:
            resolved = resolve(plan, memory=memory)
        except KvspecError as err:
            if unit.memory is not None and err.path == "engine.memory":
                raise given_budget_error(err, unit.file, unit.memory) from None
            raise locate(err, unit) from None
    elif plan.engine.auto_max_model_len:
        raise locate(PlanError("max_model_len: auto needs a memory budget to fit it to",
                               path="engine.memory",
                               hint="set engine.memory, or a fixed max_model_len"), unit)
    try:
        layout = layout_of(source.name, source.model, plan, resolved, ex.kv_cache_dtypes)
    except KvspecError as err:
        raise locate(err, unit) from None
    return dataclasses.replace(unit, resolved=resolved, memory=memory, layout=layout)


def unsized_pass(unit: Unit) -> Unit:
    """The Layout IR without a budget (for reports of a budget that does not fit)."""
    plan, source, ex = unit.plan, unit.source, unit.expanded
    assert plan is not None and source is not None and ex is not None
    layout = layout_of(source.name, source.model, plan, None, ex.kv_cache_dtypes)
    return dataclasses.replace(unit, resolved=None, layout=layout)


def freeze_pass(unit: Unit) -> Unit:
    """The Layout IR -> the frozen, hashed artifact (pure serialisation)."""
    assert unit.layout is not None
    return dataclasses.replace(unit, artifact=freeze(unit.layout, unit.text))


def _path_tuple(path: str) -> tuple:
    out: list = []
    for part in path.replace("]", "").replace("[", ".").split("."):
        if part:
            out.append(int(part) if part.isdigit() else part)
    return tuple(out)


def given_budget_error(err: KvspecError, file: str, memory: int,
                       name: str = "memory") -> KvspecError:
    """A budget error about memory the caller gave (``name``: ``memory=`` or
    ``--memory``), placed there and not at the source's ``engine.memory``."""
    if err.path != "engine.memory":
        return err
    return err.replace(location=Location(file, None, None, name), found=f"{memory:,} bytes",
                       hint=f"give the KV cache more memory ({name})")


def locate(err: KvspecError, unit: Unit) -> KvspecError:
    """Place a planner error at the YAML position its layer or path names."""
    doc = unit.doc
    if err.file or doc is None:
        return err
    layer = err.layer
    if layer and not err.path and unit.expanded is not None and layer in unit.expanded.layer_paths:
        path = unit.expanded.layer_paths[layer]
        shown = format_path(path)
    else:
        path = _path_tuple(err.path) if err.path else ("layers",)
        shown = err.path or "layers"
    pos = doc.position(path)
    return err.at(Location(doc.file, pos[0] if pos else None, pos[1] if pos else None, shown))


PASSES: tuple[Pass, ...] = (load, parse, expand_pass, validate, plan_pass, size_pass,
                            freeze_pass)
#: The passes that need no memory budget (``kvspec plan`` sizes the plan itself).
PLAN_PASSES: tuple[Pass, ...] = PASSES[:5]
#: Every pass that can fail (``kvspec validate``): freezing is pure serialisation.
CHECK_PASSES: tuple[Pass, ...] = PASSES[:-1]


def run(unit: Unit, passes: tuple[Pass, ...] = PASSES) -> Unit:
    with paused():  # large inputs: see kvspec.collector
        for p in passes:
            unit = p(unit)
    return unit


def compile_source(text: str, file: str = "<input>", *, memory: int | str | None = None
                   ) -> Artifact:
    """Compile source text; raise :class:`KvspecError` on bad input."""
    unit = run(Unit(text=text, file=file, memory=_memory(memory)))
    assert unit.artifact is not None
    return unit.artifact


def _memory(memory: int | str | None) -> int | None:
    from kvspec.files import parse_size
    return parse_size(memory, what="memory") if memory is not None else None


def read_source(path: str | Path) -> str:
    from kvspec.files import read_text
    return read_text(path, what="the source",
                     hint="give the path of a layout source, e.g. layouts/llama-3.1-8b.yaml")


def compile(path: str | Path, *, memory: int | str | None = None) -> Artifact:  # noqa: A001
    """Compile the source file at ``path`` into a verified artifact.

    ``memory`` is the budget per rank, in bytes or as a size (``"40GiB"``).
    """
    from kvspec.files import shown
    return compile_source(read_source(path), shown(path), memory=memory)


def compile_unit(path: str | Path, *, memory: int | str | None = None,
                 passes: tuple[Pass, ...] = PASSES) -> Unit:
    from kvspec.files import shown
    return run(Unit(text=read_source(path), file=shown(path), memory=_memory(memory)), passes)
