"""The grid file of ``kvspec sweep`` (docs/sweep.md): its schema and reading it.

A grid names the models (a layout source, or a Hugging Face ``config.json`` that
``kvspec init --from-hf`` turns into one for each tensor and pipeline size), the
axes and their values, constraints over the axes, and the traffic every point
must serve (``target``). Reading checks the file against :class:`Grid` and
reports every problem at once, each at its line and column, with a hint, and
"did you mean" for an unknown axis.

>>> grid = parse_grid('''
... kvspec_sweep: 1
... base: layouts/llama-3.1-8b.yaml
... axes: {tensor: [1, 2], workload: [{name: chat, context_tokens: 512, output_tokens: 64}]}
... target: {rate: 20, step_ms: 30}
... ''', "grid.yaml")
>>> grid.model.axes.tensor, grid.model.target.rate
([1, 2], 20.0)
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from kvspec.errors import ErrorList, KvspecError, SourceError
from kvspec.files import read_text
from kvspec.model.pooling import Policy, Workload, declared
from kvspec.source.document import Document, parse_yaml
from kvspec.source.parse import clean_loc, schema_error, yaml_repr
from kvspec.source.schema import MaxLen, PositiveInt, Ranks, Size, Tokens

__all__ = ["AXES", "Grid", "GridFile", "HfBase", "SourceBase", "WorkloadEntry", "grid_schema",
           "parse_grid", "read_grid"]

#: The axes a grid may sweep, in the order a point lists them.
AXES = ("memory", "gpu_memory", "tensor", "pipeline", "kv_cache_dtype", "block_size",
        "pooling.policy", "max_num_seqs", "workload")
#: Names users write for an axis, and the axis they mean.
AXIS_SYNONYMS = {"tp": "tensor", "pp": "pipeline", "tensor_parallel_size": "tensor",
                 "pipeline_parallel_size": "pipeline", "cache_dtype": "kv_cache_dtype",
                 "policy": "pooling.policy", "pooling": "pooling.policy",
                 "kv_cache_memory_bytes": "memory", "gpu": "gpu_memory",
                 "trace": "workload", "workloads": "workload", "seqs": "max_num_seqs"}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, populate_by_name=True)


class SourceBase(_Strict):
    """A layout source (its path relative to the grid file)."""

    source: str = Field(min_length=1)
    name: str | None = Field(None, min_length=1, description="Default: the source's name.")
    weights: Size | None = Field(None, description="Bytes of the model's weights (for "
                                 "gpu_memory: what they leave each rank).")


class HfBase(_Strict):
    """A Hugging Face config.json: ``kvspec init --from-hf`` makes the source of each
    point, for its tensor and pipeline size."""

    hf: str = Field(min_length=1)
    name: str | None = Field(None, min_length=1, description="Default: the file's stem.")
    model: str | None = None
    target: str | None = Field(None, description="kvspec init's --target (hopper, ...).")
    max_model_len: MaxLen | None = None
    weights: Size | None = None


Base = Annotated[str, Field(min_length=1)] | SourceBase | HfBase


def _default(name: str) -> Any:
    """A workload field's default, declared once in :class:`kvspec.model.pooling.Workload`."""
    return declared(Workload, name).default


class WorkloadEntry(_Strict):
    """One workload: a JSONL trace, a preset, or a summary a seeded trace is drawn
    from (every request arriving at step 0 unless ``rate`` is given)."""

    name: str | None = Field(None, min_length=1)
    trace: str | None = Field(None, min_length=1)
    preset: str | None = Field(None, min_length=1)
    context_tokens: Tokens | None = None
    output_tokens: Tokens | None = None
    requests: Annotated[int, Field(gt=0, le=1_000_000)] = _default("requests")
    seed: int = Field(0, ge=0)
    rate: float | None = Field(None, gt=0, description="Arrivals per engine step "
                               "(Poisson); default: all at step 0.")
    prefix_sharing: Annotated[float, Field(ge=0, le=1)] = 0.0
    prefix_tokens: PositiveInt = _default("prefix_tokens")


class Axes(_Strict):
    """The values of each axis swept (an axis left out keeps the source's value)."""

    memory: list[Size] | None = Field(None, min_length=1, description="KV cache memory "
                                      "per rank (the source's engine.memory).")
    gpu_memory: list[Size] | None = Field(None, min_length=1, description="GPU memory per "
                                          "rank: the KV cache gets gpu_memory x "
                                          "gpu_memory_utilization - reserve - weights/ranks.")
    tensor: list[Ranks] | None = Field(None, min_length=1)
    pipeline: list[Ranks] | None = Field(None, min_length=1)
    kv_cache_dtype: list[str] | None = Field(None, min_length=1)
    block_size: list[PositiveInt] | None = Field(None, min_length=1)
    pooling_policy: list[Policy] | None = Field(
        None, min_length=1, alias="pooling.policy")
    max_num_seqs: list[PositiveInt] | None = Field(None, min_length=1)
    workload: list[WorkloadEntry] = Field(min_length=1)


class Target(_Strict):
    """The traffic to serve: ``rate`` requests per second, an engine step taking
    ``step_ms`` milliseconds."""

    rate: float = Field(gt=0, description="Requests per second (or '20 requests/s').")
    step_ms: Annotated[float, Field(gt=0, le=1e6)] | dict[
        Annotated[int, Field(gt=0)], Annotated[float, Field(gt=0, le=1e6)]] = Field(
        description="Milliseconds one engine step takes (kvspec simulates steps, not "
        "seconds): one figure, or one per tensor size ({2: 30, 4: 18, 8: 11}).")

    def step_ms_at(self, tensor: int) -> float | None:
        """The step time at ``tensor`` ranks (None: the grid gives none for it)."""
        if isinstance(self.step_ms, dict):
            return self.step_ms.get(tensor)
        return self.step_ms

    @field_validator("rate", mode="before")
    @classmethod
    def _rate(cls, value: Any) -> Any:
        if isinstance(value, str):
            m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*(?:requests?\s*/\s*s)?\s*", value)
            if m:
                return float(m.group(1))
        if isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        return value

    @field_validator("step_ms", mode="before")
    @classmethod
    def _ms(cls, value: Any) -> Any:
        def num(v: Any) -> Any:
            return float(v) if isinstance(v, int) and not isinstance(v, bool) else v
        return {k: num(v) for k, v in value.items()} if isinstance(value, dict) else num(value)


class Grid(_Strict):
    """A sweep's grid file, format version 1."""

    kvspec_sweep: Literal[1] = Field(description="Grid format version.")
    base: Base | list[Base] = Field(description="The model(s): a source path, "
                                    "{source: PATH}, or {hf: config.json}.")
    axes: Axes
    constraints: list[str] = Field(default_factory=list, description="Expressions over "
                                   "the axes that every point must meet: tensor * "
                                   "pipeline <= 8.")
    target: Target
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = 0.9
    reserve: Size = Field(0, description="Bytes per rank beside weights and KV cache "
                          "(activations, CUDA graphs), for gpu_memory.")

    @field_validator("gpu_memory_utilization", mode="before")
    @classmethod
    def _float(cls, value: Any) -> Any:
        return float(value) if isinstance(value, int) and not isinstance(value, bool) \
            else value


#: The models whose fields an unknown key is looked up in.
_FIELDS: dict[tuple[str, ...], type[BaseModel]] = {
    (): Grid, ("axes",): Axes, ("target",): Target, ("base",): SourceBase}


@dataclass(frozen=True)
class GridFile:
    """A grid, read: its model and its document (every value's position)."""

    model: Grid
    doc: Document

    @property
    def file(self) -> str:
        return self.doc.file

    @property
    def bases(self) -> list[str | SourceBase | HfBase]:
        b = self.model.base
        return list(b) if isinstance(b, list) else [b]


def _allowed(parent: tuple) -> list[str]:
    if parent == ("axes",):
        return list(AXES)
    if parent[:1] == ("axes",) and "workload" in parent:
        return list(WorkloadEntry.model_fields)
    if parent[:1] == ("base",):
        return sorted(set(SourceBase.model_fields) | set(HfBase.model_fields))
    model = _FIELDS.get(parent)
    return list(model.model_fields) if model else []


def _error(doc: Document, err: Any, at: tuple = ()) -> SourceError:
    loc = at + clean_loc(err["loc"])
    if err["type"] != "extra_forbidden":
        found = schema_error(doc, {**err, "loc": loc})
        hint = (found.hint or "").replace("docs/format.md", "docs/sweep.md")
        return found.replace(hint=hint)  # type: ignore[return-value]
    key, parent = loc[-1], tuple(p for p in loc[:-1] if not isinstance(p, int))
    allowed = _allowed(parent)
    what = "axis" if parent == ("axes",) else "field"
    close = [AXIS_SYNONYMS[key]] if what == "axis" and key in AXIS_SYNONYMS else \
        difflib.get_close_matches(str(key), allowed, n=1)
    return doc.error(f"unknown {what} {key!r}", loc, key=True,
                     expected="one of " + ", ".join(allowed),
                     hint=f"did you mean {close[0]!r}?" if close else
                     "remove it, or check the indentation (docs/sweep.md)")


def _unique(errors: list[KvspecError]) -> list[KvspecError]:
    seen, out = set(), []
    for e in errors:
        key = (e.line, e.column, e.message)
        if key not in seen:
            seen.add(key)
            out.append(e)
    return out


def _base(value: Any, at: tuple, doc: Document, errors: list[KvspecError]) -> Any:
    """A base entry as the model its keys say it is (so an error speaks of that one)."""
    if isinstance(value, str) and value.strip():
        return value
    if isinstance(value, dict):
        model = HfBase if "hf" in value else SourceBase
        try:
            return model.model_validate(value)
        except ValidationError as exc:
            errors += [_error(doc, e, at) for e in exc.errors(include_url=False)]
            return "-"
    errors.append(doc.error("a base is a layout source or a Hugging Face config.json", at,
                            expected="layouts/m.yaml, {source: layouts/m.yaml}, or "
                            "{hf: config.json}", found=yaml_repr(value),
                            hint="give the model's source path, or its config.json"))
    return "-"


def parse_grid(text: str, file: str = "<grid>") -> GridFile:
    """The grid in ``text``; raise every problem at once, each at its position."""
    doc = parse_yaml(text, file)
    if not isinstance(doc.data, dict):
        raise SourceError("a grid file is a mapping", file=file, line=1, column=1,
                          expected="kvspec_sweep: 1, base: ..., axes: ..., target: ...",
                          hint="see docs/sweep.md for a complete grid")
    data = dict(doc.data)
    errors: list[KvspecError] = []
    if "base" in data:
        raw = data["base"]
        data["base"] = [_base(b, ("base", i), doc, errors) for i, b in enumerate(raw)] \
            if isinstance(raw, list) and raw else _base(raw, ("base",), doc, errors)
    try:
        model = Grid.model_validate(data)
    except ValidationError as exc:
        errors += [_error(doc, e) for e in exc.errors(include_url=False)]
    if errors:
        errors = _unique(errors)
        raise (errors[0] if len(errors) == 1 else ErrorList(errors))
    return GridFile(model, doc)


def read_grid(path: str) -> GridFile:
    """The grid file at ``path``."""
    text = read_text(path, what="the grid file",
                     hint="give the path of a sweep grid, e.g. sweep.yaml (docs/sweep.md)")
    return parse_grid(text, str(path))


def grid_schema() -> dict[str, Any]:
    """The JSON Schema of a grid file (``schemas/sweep.schema.json``)."""
    schema = Grid.model_json_schema(mode="validation", by_alias=True)
    schema.update({"$schema": "https://json-schema.org/draft/2020-12/schema",
                   "$id": "urn:kvspec:schema:sweep:1", "title": "kvspec sweep grid (format 1)",
                   "$comment": "Generated by kvspec.sweep.grid.grid_schema; do not edit."})
    return schema
