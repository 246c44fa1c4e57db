"""The workloads of a grid: each one's trace, read from a file, drawn from a
summary, or made by a preset; its sha256 names it to the workers.

A summary draws a seeded trace (:func:`kvspec.sim.generate_trace`): lognormal
prompt and output lengths of the given means and spreads (0.5 unless given),
every request at step 0 unless ``rate`` (arrivals per step) is given.
"""

from __future__ import annotations

import difflib
import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvspec.errors import ErrorList, KvspecError, SourceError
from kvspec.files import read_text
from kvspec.model.workloads import DEFAULT_STEP_MS
from kvspec.model.workloads import PRESETS as PRESET_TABLE
from kvspec.sim import TraceRequest, generate_trace
from kvspec.sim.formats import Columns, detect, read_requests
from kvspec.sim.presets import preset_trace
from kvspec.sim.trace import TraceError, trace_text
from kvspec.source.schema import Distribution
from kvspec.sweep.grid import GridFile, WorkloadEntry

__all__ = ["PRESETS", "Workload", "file_text", "grid_workloads", "relative"]



def _preset(name: str) -> Callable[[int, int], tuple[TraceRequest, ...]]:
    return lambda requests, seed: preset_trace(name, requests, seed=seed)


#: Workload presets by name (kvspec's published presets, docs/pooling.md): each makes a
#: trace of ``requests`` requests from a ``seed``, arrivals at the presets' step time.
PRESETS: dict[str, Callable[[int, int], tuple[TraceRequest, ...]]] = {
    name: _preset(name) for name in PRESET_TABLE}


@dataclass(frozen=True)
class Workload:
    """A workload of the grid and its trace."""

    name: str
    sha256: str
    requests: tuple[TraceRequest, ...]
    index: int
    #: The workload as a source's ``pooling.workload`` says it (None: a preset).
    spec: dict[str, Any] | None = None
    #: Milliseconds an arrival's step stands for on a clock in seconds (the trace's
    #: ``step_ms``, else simulate's default).
    step_ms: float = DEFAULT_STEP_MS

    @property
    def held_tokens(self) -> int:
        """Tokens a running request holds on average: its prompt, half its output."""
        mean = math.fsum(r.prompt_tokens + r.output_tokens / 2 for r in self.requests)
        return max(round(mean / len(self.requests)), 1)


def relative(grid: GridFile, path: str) -> Path:
    base = Path(grid.file).parent if not grid.file.startswith("<") else Path(".")
    return base / path


def file_text(grid: GridFile, written: str, at: tuple, what: str, hint: str) -> str:
    """The text of a file the grid names at ``at`` (``written``, relative to the grid
    file); a missing or unreadable one is an error there, naming the path."""
    path = relative(grid, written)
    if not path.exists():
        raise grid.doc.error(f"no such file: {written}", at, found=str(path), expected=what,
                             hint=hint)
    if path.is_dir():
        raise grid.doc.error(f"{written} is a directory, not {what}", at, found=str(path),
                             hint=hint)
    try:
        return read_text(path, what=what, error=SourceError, hint=hint)
    except KvspecError as err:
        if err.line is not None:
            raise  # inside the file: its own line and column
        raise grid.doc.error(f"{err.message}: {written}", at, found=repr(written),
                             hint=err.hint) from None


def grid_workloads(grid: GridFile) -> list[Workload]:
    out: list[Workload] = []
    errors: list[KvspecError] = []
    names: set[str] = set()
    for i, w in enumerate(grid.model.axes.workload):
        at = ("axes", "workload", i)
        try:
            name, requests, sha = _trace(grid, w, at)
        except KvspecError as err:
            errors.append(err)
            continue
        if name in names:
            errors.append(grid.doc.error(f"two workloads are named {name!r}", at,
                                         hint="give each workload its own name:"))
        same = next((o for o in out if o.sha256 == sha), None)
        if same is not None and name not in names:
            line, col = grid.doc.position(("axes", "workload", same.index)) or (None, None)
            errors.append(grid.doc.error(
                f"workload {name!r} is workload {same.name!r} again: the same requests", at,
                hint=f"the first is axes.workload[{same.index}]" +
                (f" (line {line}, column {col})" if line is not None else "") +
                ": give each workload once (one given twice would be swept as two)"))
        names.add(name)
        out.append(Workload(name, sha, requests, i, _spec(grid, w),
                            w.step_ms or DEFAULT_STEP_MS))
    if errors:
        raise errors[0] if len(errors) == 1 else ErrorList(errors)
    return out


def _trace(grid: GridFile, w: WorkloadEntry, at: tuple) -> tuple[str, tuple[TraceRequest, ...],
                                                                  str]:
    kinds = [k for k in ("trace", "preset") if getattr(w, k) is not None]
    summary = [k for k in ("context_tokens", "output_tokens") if getattr(w, k) is not None]
    if len(kinds) + bool(summary) != 1:
        raise grid.doc.error("a workload is a trace, a preset or a summary: one of them", at,
                             expected="{trace: FILE}, {preset: NAME}, or {context_tokens: "
                             "2048, output_tokens: 256}",
                             found=", ".join(kinds + summary) or "none of them",
                             hint="give each workload one of the three")
    for field in ("format", "columns", "step_ms"):
        if w.trace is None and getattr(w, field) is not None:
            raise grid.doc.error(f"{field} is a trace file's: this workload has none",
                                 (*at, field), key=True,
                                 hint=f"remove {field}, or give the workload as {{trace: FILE}}")
    if w.trace is not None:
        requests, sha = _read(grid, w, at)
        return w.name or Path(w.trace).stem, requests, sha
    if w.preset is not None:
        if w.preset not in PRESETS:
            raise grid.doc.error(
                f"unknown workload preset {w.preset!r}", (*at, "preset"),
                expected="one of " + ", ".join(sorted(PRESETS)),
                hint=(f"did you mean {close[0]!r}?" if (close := difflib.get_close_matches(
                    w.preset, sorted(PRESETS), n=1, cutoff=0.5)) else
                    "name a preset (docs/pooling.md), or give the workload as a trace "
                    "({trace: FILE}) or a summary ({context_tokens: 2048, "
                    "output_tokens: 256})"))
        requests = PRESETS[w.preset](w.requests, w.seed)
    else:
        requests = _summary(grid, w, at)
    name = w.name or w.preset or f"workload-{at[-1]}"
    return name, requests, hashlib.sha256(trace_text(requests).encode()).hexdigest()


def _read(grid: GridFile, w: WorkloadEntry, at: tuple
          ) -> tuple[tuple[TraceRequest, ...], str]:
    """A trace file's requests, read as ``kvspec simulate --workload`` reads it (every
    format of docs/traces.md), and its sha256: the file's, for kvspec's own format;
    else the requests', as kvspec writes them (the step time and columns count)."""
    assert w.trace is not None
    hint = "give the trace's path relative to the grid file"
    text = file_text(grid, w.trace, (*at, "trace"), "a request trace", hint)
    path = relative(grid, w.trace)
    try:
        fmt = w.format or detect(path)
    except TraceError as err:
        raise grid.doc.error(err.message, (*at, "trace"), found=err.found,
                             hint="name its format in the grid: {trace: FILE, format: "
                                  "azure-2024} (or burstgpt, mooncake, ...), or format: "
                                  "lengths with columns: {prompt: NAME, output: NAME} "
                                  "(docs/traces.md)") from None
    columns = Columns(w.columns.prompt, w.columns.output, w.columns.time,
                      w.columns.time_unit) if w.columns is not None else None
    if fmt == "lengths" and columns is None:
        raise grid.doc.error("a lengths trace needs its columns", at,
                             expected="columns: {prompt: NAME, output: NAME}",
                             hint="name the columns of the prompt and output lengths (and "
                                  "time, optionally): docs/traces.md")
    requests = read_requests(path, fmt, step_ms=w.step_ms or DEFAULT_STEP_MS,
                             columns=columns)
    data = text if fmt == "kvspec" else trace_text(requests)
    return requests, hashlib.sha256(data.encode()).hexdigest()


def _summary(grid: GridFile, w: WorkloadEntry, at: tuple) -> tuple[TraceRequest, ...]:
    missing = [k for k in ("context_tokens", "output_tokens") if getattr(w, k) is None]
    if missing:
        raise grid.doc.error(f"a workload summary needs {' and '.join(missing)}", at,
                             expected="context_tokens: 2048, output_tokens: 256",
                             hint="give the mean prompt and output lengths")

    def mean(key: str) -> tuple[float, float]:
        v = getattr(w, key)
        if isinstance(v, Distribution):
            if v.mean is None:
                raise grid.doc.error("a sweep's workload summary takes a mean", (*at, key),
                                     expected="{mean: 2048, spread: 0.5}",
                                     hint="for a histogram, write the trace with `kvspec "
                                          "trace` and give {trace: FILE}")
            return float(v.mean), v.spread
        return float(v), 0.5

    (pm, ps), (om, os_) = mean("context_tokens"), mean("output_tokens")
    return generate_trace(w.requests, seed=w.seed, prompt_mean=pm, prompt_spread=ps,
                          output_mean=om, output_spread=os_, rate=w.rate,
                          prefix_groups=1 if w.prefix_sharing else 0,
                          prefix_share=w.prefix_sharing, prefix_tokens=w.prefix_tokens)


def _spec(grid: GridFile, w: WorkloadEntry) -> dict[str, Any] | None:
    """``w`` as a source's ``pooling.workload`` (for ``auto`` and ``separate``)."""
    if w.preset is not None:
        return None
    if w.trace is not None:
        spec: dict[str, Any] = {"trace": str(relative(grid, w.trace).resolve())}
        if w.format is not None:
            spec["format"] = w.format
        if w.columns is not None:
            spec["columns"] = w.columns.model_dump(exclude_none=True)
        if w.step_ms is not None:
            spec["step_ms"] = w.step_ms
        return spec
    return w.model_dump(exclude={"name", "trace", "preset", "rate", "format", "columns",
                                 "step_ms"}, exclude_none=True)
