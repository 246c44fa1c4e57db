"""From a grid to its points: the workloads' traces, each point's source, and the
checks that run before anything is simulated.

Every point is one model with one value of each axis: its source is the model's
source with those values written in (for a ``config.json`` model, the source
``kvspec init --from-hf`` writes for its tensor and pipeline size), as YAML
text that compiles on its own. Before a sweep runs, every point's source goes
through the compiler's checks (compose, parse, expand, validate): a value a
source refuses is an error at that value in the grid file, and the sweep does
not start. Planning and sizing run with the point: a point whose plan fails
(not enough memory, ...) becomes a row with its error.

A point's id is the sha256 (16 hex digits) of its parameters, its source text,
its trace and the target: the same grid over the same files gives the same ids,
and a changed input gives new ones.
"""

# one idea: a grid's points and the checks before they run, which place every
# error by the positions the points keep

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml

from kvspec.compiler import PASSES, SourceText, run
from kvspec.errors import ErrorList, KvspecError, Location, SourceError, format_path
from kvspec.model.specs import MambaState
from kvspec.sim import TraceRequest
from kvspec.source.document import Document, parse_yaml
from kvspec.source.profile import ProfileFile, parse_profile
from kvspec.sweep.constraints import (
    NUMERIC_AXES,
    Constraint,
    ConstraintError,
    parse_constraint,
)
from kvspec.sweep.evaluate import Timing
from kvspec.sweep.grid import AXES, GridFile, HfBase, SourceBase
from kvspec.sweep.workloads import PRESETS, Workload, file_text, grid_workloads, relative

__all__ = ["PRESETS", "Point", "Sweep", "Workload", "as_error", "locate", "plan_sweep"]

#: Where each axis is written in a source.
SOURCE_PATHS = {"memory": ("engine", "memory"), "gpu_memory": ("engine", "memory"),
                "tensor": ("parallel", "tensor"), "pipeline": ("parallel", "pipeline"),
                "kv_cache_dtype": ("quantization", "kv_cache_dtype"),
                "block_size": ("engine", "block_size"),
                "pooling.policy": ("pooling", "policy"),
                "max_num_seqs": ("engine", "max_num_seqs")}


@dataclass(frozen=True)
class Model:
    """A model of the grid: its name, where it is declared, and its sources."""

    name: str
    index: int
    base: str | SourceBase | HfBase
    file: str
    weights: int | None
    source_for: Callable[[int | None, int | None], tuple[str, Document]]


@dataclass(frozen=True)
class Point:
    """One point: its id, parameters, source text (None when it failed before
    compiling, with ``error``), its workload's trace hash and the target."""

    id: str
    params: dict[str, Any]
    source: str | None
    file: str
    workload: str
    rate: float
    step_ms: float
    error: dict[str, Any] | None = None
    #: The clock in seconds and the SLO (None: the step clock, no SLO).
    timing: Timing | None = None


@dataclass(frozen=True)
class Sweep:
    """A grid's points, and the traces they share (by sha256)."""

    grid: GridFile
    points: tuple[Point, ...]
    traces: dict[str, tuple[TraceRequest, ...]] = field(repr=False)
    #: Per point id: where its values are written in the grid (for errors).
    where: dict[str, dict[str, tuple[int | None, int | None, str]]] = field(repr=False)
    #: Per point id: the base document its source was made from (None: init's).
    base_docs: dict[str, Document | None] = field(repr=False)


def _dump(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100)


def _models(grid: GridFile) -> list[Model]:
    out = []
    for i, base in enumerate(grid.bases):
        at = ("base", i) if isinstance(grid.model.base, list) else ("base",)
        try:
            out.append(_model(grid, base, i, at))
        except KvspecError as err:
            raise err if err.line is not None else err.at(_loc(grid.doc, at)) from None
    names = [m.name for m in out]
    for m in out:
        if names.count(m.name) > 1:
            at = ("base", m.index)
            raise grid.doc.error(f"two models are named {m.name!r}", at,
                                 hint="give each base its own name: {source: ..., name: ...}")
    return out


def _loc(doc: Document, at: tuple) -> Location:
    line, col = doc.position(at) or (None, None)
    return Location(doc.file, line, col, format_path(at))


def _base_at(base: str | SourceBase | HfBase, at: tuple) -> tuple:
    """Where a base's path is written: the entry, or its ``source:`` / ``hf:``."""
    if isinstance(base, SourceBase):
        return (*at, "source")
    return (*at, "hf") if isinstance(base, HfBase) else at


def _json_object(text: str) -> dict[str, Any] | None:
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _not_a_base(grid: GridFile, written: str, text: str, at: tuple, hf: bool) -> None:
    """Refuse, by what it is, a file given as the other kind of base: a compiled
    artifact, a config.json as a source, a source as a config.json."""
    path = relative(grid, written)
    data = _json_object(text) if path.suffix.lower() == ".json" or text.lstrip()[:1] == "{" \
        else None
    if path.name.endswith(".kvlayout.json") or (data is not None and str(
            data.get("format", "")).startswith("kvspec.layout")):
        source = path.with_name(path.name.removesuffix(".kvlayout.json") + ".yaml")
        raise grid.doc.error(
            f"{path.name} is a compiled artifact, not a {'config.json' if hf else 'source'}",
            at, found=repr(path.name), expected="a layout source (.yaml) or {hf: config.json}",
            hint="a sweep compiles every point itself: give the source the artifact was "
                 "compiled from" + (f", {source.name}" if source.exists() else " (its .yaml)"))
    if not hf and data is not None and ("architectures" in data or "model_type" in data):
        raise grid.doc.error(f"{path.name} is a Hugging Face config.json, not a layout source",
                             at, found=repr(path.name),
                             hint=f"write the base as {{hf: {written}}}: kvspec init makes "
                                  "each tensor and pipeline size's source from it")
    if hf and data is None:
        try:
            doc = parse_yaml(text, str(path))
        except KvspecError:
            return
        if isinstance(doc.data, dict) and "kvspec" in doc.data:
            raise grid.doc.error(f"{path.name} is a layout source, not a config.json", at,
                                 found=repr(path.name),
                                 hint=f"write the base as {written} or {{source: "
                                      f"{written}}}")


def _model(grid: GridFile, base: str | SourceBase | HfBase, index: int, at: tuple) -> Model:
    if isinstance(base, HfBase):
        return _hf_model(grid, base, index, at)
    written = base if isinstance(base, str) else base.source
    path = relative(grid, written)
    where = _base_at(base, at)
    text = file_text(grid, written, where, "a layout source",
                      "give the source's path relative to the grid file")
    _not_a_base(grid, written, text, where, hf=False)
    doc = parse_yaml(text, str(path))
    name = base.name if isinstance(base, SourceBase) and base.name else \
        str(doc.data.get("name", path.stem)) if isinstance(doc.data, dict) else path.stem
    weights = base.weights if isinstance(base, SourceBase) else None
    return Model(name, index, base, str(path), weights, lambda tp, pp: (text, doc))


def _hf_model(grid: GridFile, base: HfBase, index: int, at: tuple) -> Model:
    # deferred: PyYAML and the compiler (the Hugging Face importer), for config.json models
    from kvspec.integrations.hf.config import read_config
    from kvspec.integrations.hf.init import init_source
    from kvspec.integrations.options import InitOptions

    path = relative(grid, base.hf)
    where = _base_at(base, at)
    text = file_text(grid, base.hf, where, "a Hugging Face config.json",
                      "give the model's config.json, its path relative to the grid file")
    _not_a_base(grid, base.hf, text, where, hf=True)
    config, config_text = read_config(path)
    name = base.name or path.stem
    made: dict[tuple[int, int], tuple[str, Document]] = {}

    def source_for(tp: int | None, pp: int | None) -> tuple[str, Document]:
        key = (tp or 1, pp or 1)
        if key not in made:
            max_len: Any = base.max_model_len
            options = InitOptions(name=name, model=base.model, tp=key[0], pp=key[1],
                                  max_model_len=max_len, target=base.target,
                                  config_name=str(path))
            text = init_source(config, options, text=config_text)
            made[key] = (text, parse_yaml(text, f"{path} (init --tp {key[0]} --pp {key[1]})"))
        return made[key]
    return Model(name, index, base, str(path), base.weights, source_for)


def _axis_values(grid: GridFile) -> list[tuple[str, list[Any]]]:
    axes = grid.model.axes
    out = []
    for name in AXES[:-1]:
        values = getattr(axes, name.replace(".", "_"))
        if values is not None:
            out.append((name, list(values)))
    return out


def _constraints(grid: GridFile, swept: set[str]) -> list[Constraint]:
    numeric = swept & set(NUMERIC_AXES)
    out, errors = [], []
    for i, text in enumerate(grid.model.constraints):
        try:
            out.append(parse_constraint(text, numeric))
        except ConstraintError as exc:
            line, col = grid.doc.position(("constraints", i)) or (None, None)
            if col is not None and grid.doc.text is not None and line is not None:
                src = grid.doc.text.splitlines()[line - 1]
                col += 1 if src[col - 1:col] in ("'", '"') else 0
            errors.append(SourceError(exc.message, file=grid.file, line=line,
                                      column=None if col is None else col + exc.offset,
                                      path=f"constraints[{i}]", found=repr(text),
                                      hint=exc.hint))
    if errors:
        raise errors[0] if len(errors) == 1 else ErrorList(errors)
    return out


#: The most points a sweep plans: models x combinations of axis values that meet
#: the constraints x workloads. Planning takes about 1 ms and 1 KB a point (a
#: 100,000-point grid: under two minutes and about 110 MB before any point runs).
MAX_POINTS = 100_000
#: The most combinations of axis values the constraints are checked over.
MAX_COMBINATIONS = 1_000_000
#: The most operations checking the constraints may take (each constraint is
#: evaluated once per combination of the axes it names): a few seconds.
MAX_CONSTRAINT_WORK = 20_000_000


def _factors(grid: GridFile, axes: list[tuple[str, list[Any]]]) -> list[tuple[str, int]]:
    """What multiplies into the grid's points, and how many of each."""
    return [("base", len(grid.bases)), *((name, len(v)) for name, v in axes),
            ("workload", len(grid.model.axes.workload))]


def _product(factors: list[tuple[str, int]]) -> str:
    return " x ".join(f"{name} {n:,}" for name, n in factors)


def _check_size(grid: GridFile, axes: list[tuple[str, list[Any]]],
                constraints: list[Constraint]) -> None:
    """Refuse, before a point is made, a grid of more than :data:`MAX_POINTS` points
    (or, with constraints, of more combinations than they are checked over)."""
    factors = _factors(grid, axes)
    total = math.prod(n for _, n in factors)
    combos = math.prod(len(v) for _, v in axes)
    largest = ", ".join(f"{name} {n:,}" for name, n in sorted(
        factors, key=lambda f: -f[1])[:3] if n > 1)
    if not constraints and total > MAX_POINTS:
        raise grid.doc.error(
            f"the grid has {total:,} points, more than a sweep runs ({MAX_POINTS:,})",
            ("axes",), key=True, found=_product(factors),
            hint=f"sweep fewer values (the most: {largest}), split the grid into several, "
                 "or add constraints that rule points out (docs/sweep.md)")
    if constraints and combos > MAX_COMBINATIONS:
        raise grid.doc.error(
            f"the axes make {combos:,} combinations, more than the constraints are checked "
            f"over ({MAX_COMBINATIONS:,})", ("axes",), key=True, found=_product(factors),
            hint=f"sweep fewer values (the most: {largest}), or split the grid into several")
    names = [name for name, _ in axes]
    sizes = {name: len(v) for name, v in axes}
    work = [math.prod(sizes[a] for a in c.names) * c.size for c in constraints]
    if sum(work) > MAX_CONSTRAINT_WORK:
        i = max(range(len(work)), key=work.__getitem__)
        c = constraints[i]
        raise grid.doc.error(
            f"checking the constraints takes {sum(work):,} operations, more than "
            f"{MAX_CONSTRAINT_WORK:,}", ("constraints", i), found=f"{c.size:,} operations "
            "over " + (" x ".join(f"{a} {sizes[a]:,}" for a in names if a in c.names)
                       or "no axis"),
            hint="shorten this constraint, or sweep fewer values of the axes it names")


def _combinations(grid: GridFile, axes: list[tuple[str, list[Any]]],
                  constraints: list[Constraint]) -> list[tuple[int, ...]]:
    """The index in each axis's list of every combination of axis values that
    meets the constraints; refuse more than :data:`MAX_POINTS` points' worth. Each
    constraint is evaluated once per combination of the axes it names."""
    names = [name for name, _ in axes]
    checks: list[tuple[Constraint, list[int], dict[tuple[int, ...], bool]]] = [
        (c, [names.index(a) for a in sorted(c.names)], {}) for c in constraints]
    per_combo = len(grid.bases) * len(grid.model.axes.workload)
    kept: list[tuple[int, ...]] = []
    count = 0
    for picked in itertools.product(*(range(len(v)) for _, v in axes)):
        for c, where, memo in checks:
            key = tuple(picked[i] for i in where)
            holds = memo.get(key)
            if holds is None:
                holds = memo[key] = c.holds({names[i]: axes[i][1][picked[i]] for i in where})
            if not holds:
                break
        else:
            count += 1
            if count * per_combo <= MAX_POINTS:
                kept.append(picked)
    if count * per_combo > MAX_POINTS:
        factors = _factors(grid, axes)
        raise grid.doc.error(
            f"the constraints leave {count * per_combo:,} points, more than a sweep runs "
            f"({MAX_POINTS:,})", ("constraints",), key=True,
            found=f"{count:,} of the {math.prod(len(v) for _, v in axes):,} combinations of "
                  f"{_product(factors)}",
            hint="tighten the constraints, sweep fewer values, or split the grid into several")
    return kept


def _set(data: dict[str, Any], path: tuple[str, str], value: Any) -> None:
    section = data.get(path[0])
    section = dict(section) if isinstance(section, dict) else {}
    section[path[1]] = value
    data[path[0]] = section


def _kv_memory(grid: GridFile, model: Model, gpu: int, ranks: int) -> int:
    """The KV cache memory of one rank on a GPU of ``gpu`` bytes: what the
    utilisation leaves after the reserve and this rank's share of the weights."""
    assert model.weights is not None
    return math.floor(gpu * grid.model.gpu_memory_utilization) - grid.model.reserve - \
        math.ceil(model.weights / ranks)


def _ranks(values: dict[str, Any], doc: Document) -> tuple[int, int]:
    par = doc.data.get("parallel") if isinstance(doc.data, dict) else None
    par = par if isinstance(par, dict) else {}
    tp: Any = values.get("tensor", par.get("tensor", 1))
    pp: Any = values.get("pipeline", par.get("pipeline", 1))
    return int(tp), int(pp)


def _source(grid: GridFile, model: Model, values: dict[str, Any]
            ) -> tuple[dict[str, Any] | None, dict[str, Any] | None, int | None]:
    """A point's source data, or its error; and the KV cache memory it was given."""
    tp, pp = values.get("tensor"), values.get("pipeline")
    _, doc = model.source_for(tp, pp)
    data = copy.deepcopy(doc.data)
    memory = values.get("memory")
    if "gpu_memory" in values:
        tp_, pp_ = _ranks(values, doc)
        memory = _kv_memory(grid, model, values["gpu_memory"], tp_ * pp_)
        if memory <= 0:
            return None, {"type": "PlanError", "path": "engine.memory",
                          "message": "the weights leave no memory for "
                          "the KV cache on this GPU", "hint": "more ranks, or a GPU with "
                          "more memory", "found": f"{memory:,} bytes"}, memory
    for axis, path in SOURCE_PATHS.items():
        if axis in values and axis not in ("memory", "gpu_memory"):
            _set(data, path, values[axis])
    if memory is not None:
        _set(data, ("engine", "memory"), memory)
    return data, None, memory


def _text(data: dict[str, Any] | None, w: Workload, cache: dict[str, str]) -> str | None:
    """The source text of a point at workload ``w``: a pooling policy that chooses
    by a workload (``auto``, ``separate``) and has none in the source gets ``w``'s."""
    if data is None:
        return None
    pooling = data.get("pooling") if isinstance(data.get("pooling"), dict) else {}
    assert isinstance(pooling, dict)
    if pooling.get("policy") in ("auto", "separate") and "workload" not in pooling \
            and w.spec is not None:
        return _dump({**data, "pooling": {**pooling, "workload": w.spec}})
    if "" not in cache:
        cache[""] = _dump(data)
    return cache[""]


def _point_id(params: dict[str, Any], source: str | None, trace: str, grid: GridFile,
              timing: Timing | None) -> str:
    data = {"params": params, "source": source, "trace": trace,
            "rate": grid.model.target.rate, "step_ms": _jsonable(grid.model.target.step_ms),
            "gpu": [grid.model.gpu_memory_utilization, grid.model.reserve]}
    if timing is not None:  # (only then: a step-clock point keeps its id)
        data["timing"] = {"profile": None if timing.profile_text is None else hashlib.sha256(
            timing.profile_text.encode()).hexdigest(), "arrival_ms": timing.arrival_ms,
            "slo": [x.text for x in timing.slo]}
    key = json.dumps(data, sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _jsonable(step_ms: float | dict[int, float] | None) -> Any:
    return {str(k): v for k, v in sorted(step_ms.items())} if isinstance(step_ms, dict) \
        else step_ms


def _tensor(model: Model, values: dict[str, Any]) -> int:
    tp = values.get("tensor")
    return _ranks({}, model.source_for(None, None)[1])[0] if tp is None else int(tp)


#: A profile read for the sweep: its path as shown, its text, and the file read.
_Read = tuple[str, str, ProfileFile]


def _profile(grid: GridFile, tp: int, cache: dict[str, _Read]) -> _Read:
    """The profile the grid gives for ``tp`` ranks, read once per file: a missing
    file is an error at its entry in the grid, a bad profile at its own line; a
    profile given for one tensor size that describes another is refused at its
    ``describes.tensor_parallel_size``."""
    found = grid.model.target.profile_at(tp)
    if found is None:
        raise grid.doc.error(f"target.step_time gives no profile for tensor {tp}",
                             ("target", "step_time"), expected=f"{tp}: PROFILE",
                             hint="give the profile of every tensor size the grid sweeps, or "
                                  "one for all: step_time: {profile: FILE}")
    written, at = found
    if written not in cache:
        text = file_text(grid, written, at, "a step-time profile",
                         "give the profile's path relative to the grid file (kvspec profile "
                         "writes one; docs/latency.md)")
        path = str(relative(grid, written))
        cache[written] = (path, text, parse_profile(text, path))
    path, text, profile = cache[written]
    if at[-1] != "profile":  # one profile per tensor size: this size's
        profile.check({"tensor_parallel_size": tp}, f"target.step_time's entry {tp}")
    return cache[written]


def _timing(grid: GridFile, model: Model, values: dict[str, Any], w: Workload,
            cache: dict[str, _Read]) -> Timing | None:
    """A point's clock: its tensor size's profile, or the constant model when only an
    SLO asks for time; None on the step clock."""
    target = grid.model.target
    if target.step_time is None and not grid.slo:
        return None
    if target.step_time is None:
        return Timing(None, None, _step_ms(grid, model, values), grid.slo, w.step_ms)
    path, text, _ = _profile(grid, _tensor(model, values), cache)
    return Timing(path, text, None, grid.slo, w.step_ms)


def _step_ms(grid: GridFile, model: Model, values: dict[str, Any]
             ) -> float:
    tp = _tensor(model, values)
    if grid.model.target.step_ms is None:
        return math.nan  # (timed by a profile: no step time)
    ms = grid.model.target.step_ms_at(tp)
    if ms is None:
        raise grid.doc.error(f"target.step_ms gives no step time for tensor {tp}",
                             ("target", "step_ms"), expected=f"{tp}: MILLISECONDS",
                             hint="give the step time of every tensor size the grid sweeps")
    return ms


def plan_sweep(grid: GridFile) -> Sweep:
    """Every point of ``grid`` that meets its constraints; raise, before anything
    runs, every problem of the grid: unknown axes (when read), workloads that
    cannot be read, values a source refuses, a grid the constraints leave empty."""
    axes = _axis_values(grid)
    swept = {name for name, _ in axes}
    constraints = _constraints(grid, swept)
    if "gpu_memory" in swept and "memory" in swept:
        raise grid.doc.error("memory and gpu_memory exclude each other", ("axes", "gpu_memory"),
                             key=True, hint="memory is the KV cache's; gpu_memory the "
                             "GPU's, the KV cache getting what the weights leave")
    _check_size(grid, axes, constraints)
    picked = _combinations(grid, axes, constraints)
    if not picked:
        raise grid.doc.error("no point meets the constraints: the grid is empty",
                             ("constraints",), key=True,
                             hint="loosen a constraint, or add values to the axes")
    combos = [({name: vals[i] for (name, vals), i in zip(axes, p)},
               {name: i for (name, _), i in zip(axes, p)}) for p in picked]
    workloads = grid_workloads(grid)
    models = _models(grid)
    _check_weights(grid, models, swept)
    points, where, docs = [], {}, {}
    profiles: dict[str, _Read] = {}
    for model in models:
        for values, index in combos:
            data, error, _ = _source(grid, model, values)
            step_ms = _step_ms(grid, model, values)
            cache: dict[str, str] = {}
            for w in workloads:
                text = _text(data, w, cache)
                params = {"model": model.name, **values, "workload": w.name}
                timing = _timing(grid, model, values, w, profiles)
                pid = _point_id(params, text, w.sha256, grid, timing)
                points.append(Point(pid, params, text, model.file, w.sha256,
                                    grid.model.target.rate, step_ms, error, timing))
                where[pid] = _positions(grid, model, index, w)
                docs[pid] = None if isinstance(model.base, HfBase) else \
                    model.source_for(None, None)[1]
    sweep = Sweep(grid, tuple(points), {w.sha256: w.requests for w in workloads}, where, docs)
    check_sources(sweep, models)
    return sweep


def _check_weights(grid: GridFile, models: list[Model], swept: set[str]) -> None:
    if "gpu_memory" not in swept:
        return
    for m in models:
        if m.weights is None:
            at = ("base", m.index) if isinstance(grid.model.base, list) else ("base",)
            raise grid.doc.error(f"gpu_memory needs the weights of {m.name}", at,
                                 expected="{source: ..., weights: 141GB} or {hf: ..., "
                                 "weights: 141GB}",
                                 hint="give the bytes of the model's weights as served, "
                                      "or sweep memory (the KV cache's own) instead")


def _positions(grid: GridFile, model: Model, index: dict[str, int], w: Workload
               ) -> dict[str, tuple[int | None, int | None, str]]:
    at = ("base", model.index) if isinstance(grid.model.base, list) else ("base",)
    out = {"model": _where(grid.doc, at),
           "workload": _where(grid.doc, ("axes", "workload", w.index))}
    for axis, i in index.items():
        out[axis] = _where(grid.doc, ("axes", axis, i))
    return out


def _where(doc: Document, at: tuple[str | int, ...]) -> tuple[int | None, int | None, str]:
    line, col = doc.position(at) or (None, None)
    return line, col, format_path(at)


#: Which axis a source path belongs to (an error there is the axis value's).
_AXIS_OF = {".".join(p): axis for axis, p in SOURCE_PATHS.items() if axis != "gpu_memory"}
_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def _path_tuple(path: str) -> tuple[str | int, ...]:
    return tuple(int(i) if i else n for n, i in _PART.findall(path))


def locate(sweep: Sweep, point: Point, err: dict[str, Any]) -> dict[str, Any]:
    """``err`` (a point's error, as :meth:`KvspecError.as_dict` gives it) placed
    where the user can put it right: at the axis value in the grid file when it is
    about a swept setting, else in the base source at the same path (a model made
    by ``init`` at its base entry in the grid)."""
    path = err.get("path") or ""
    axis = next((a for p, a in _AXIS_OF.items() if path == p or path.startswith(p + ".")),
                None)
    if err.get("type") == "NotEnoughMemoryError":
        axis = "memory"  # the budget is short, whichever setting asks for it
    if axis == "memory" and "gpu_memory" in point.params:
        axis = "gpu_memory"
    where = sweep.where.get(point.id, {})
    shown = ", ".join(f"{k}={v}" for k, v in point.params.items())
    out = {**err, "point": shown}
    if point.timing is not None and err.get("file") == point.timing.profile_file \
            and err.get("line") is not None:
        return out  # the point's profile refused it: at the profile's own field
    if axis is not None and axis in point.params:
        line, col, at = where[axis]
        return {**out, "file": sweep.grid.file, "line": line, "column": col, "path": at}
    doc = sweep.base_docs.get(point.id)
    if doc is not None and path:
        line, col = doc.position(_path_tuple(path)) or (None, None)
        return {**out, "file": doc.file, "line": line, "column": col}
    line, col, _ = where.get("model") or (None, None, "")
    return {**out, "file": sweep.grid.file, "line": line, "column": col}


def as_error(d: dict[str, Any]) -> KvspecError:
    """A located error dict as an error to raise."""
    hint = d.get("hint")
    if d.get("point"):
        hint = (hint + "; " if hint else "") + f"at the point {d['point']}"
    return SourceError(d["message"], file=d.get("file"), line=d.get("line"),
                       column=d.get("column"), path=d.get("path"),
                       expected=d.get("expected"), found=d.get("found"), hint=hint)


def check_sources(sweep: Sweep, models: list[Model]) -> None:
    """Run the compiler's checks (compose to validate) over every point's source,
    each distinct one once; raise every refusal, at the grid value it came from."""
    seen: dict[str, dict[str, Any] | None] = {}
    errors: list[KvspecError] = []
    reported: set[tuple[Any, ...]] = set()
    for point in sweep.points:
        if point.source is None:
            continue
        if point.source not in seen:
            seen[point.source] = _check(point, _state_layers_moved(point, models, sweep))
        found = seen[point.source]
        if found is None:
            continue
        d = locate(sweep, point, found)
        key = (d.get("file"), d.get("line"), d.get("column"), d["message"])
        if key not in reported:
            reported.add(key)
            errors.append(as_error(d))
    if errors:
        raise errors[0] if len(errors) == 1 else ErrorList(errors)


def _check(point: Point, moved: bool) -> dict[str, Any] | None:
    assert point.source is not None
    try:
        validated = run(SourceText(text=point.source, file=point.file), PASSES[:4])
    except KvspecError as err:
        first = err.errors[0] if isinstance(err, ErrorList) else err
        return first.as_dict()
    if moved and any(isinstance(s, MambaState)
                     for specs in validated.expansion.stage_specs for s in specs.values()):
        return {"type": "SourceError", "path": "parallel.tensor",
                "message": "tensor swept over a source with state layers: their shapes "
                "in the source are one tensor size's",
                "hint": "make the base the model's config.json ({hf: config.json}): "
                        "kvspec init writes each tensor size's shapes"}
    return None


def _state_layers_moved(point: Point, models: list[Model], sweep: Sweep) -> bool:
    model = next(m for m in models if m.name == point.params["model"])
    if isinstance(model.base, HfBase) or "tensor" not in point.params:
        return False
    doc = model.source_for(None, None)[1]
    return _ranks({}, doc)[0] != point.params["tensor"]
