"""The JSON Schemas in ``schemas/``: the source format and the artifact format.

Both are generated from pydantic models, so the schema an editor checks a file
against and the validation kvspec itself runs cannot drift apart:

* ``source.schema.json`` from :class:`kvspec.source.model.Source` (what a
  ``layouts/*.yaml`` file may say; the ``yaml-language-server`` comment on the
  first line of every source points at it);
* ``artifact.schema.json`` from :class:`LayoutArtifact` below (what
  ``kvspec compile`` writes: :func:`kvspec.compiler.artifact_body` wrapped by
  :func:`kvspec.artifact.freeze`).

``kvspec schema`` writes them; ``kvspec schema --check`` (and a test) fails when
the committed files are not what these models generate.

>>> text = render(source_schema())
>>> text.startswith('{') and text.endswith('}\\n')
True
>>> json.loads(text)["title"]
'kvspec layout source (format 1)'
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvspec.artifact import FORMAT
from kvspec.files import write_atomic
from kvspec.errors import ArtifactError, KvspecError
from kvspec.source.model import LayoutName, Source

__all__ = [
    "SCHEMA_DIALECT",
    "SCHEMA_FILES",
    "LayoutArtifact",
    "SchemaFile",
    "StaleSchemaError",
    "artifact_schema",
    "check_schemas",
    "render",
    "source_schema",
    "validate_artifact",
    "write_schemas",
]

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


# ---------------------------------------------------------------------------
# the artifact format, as a pydantic model
# ---------------------------------------------------------------------------


class _Closed(BaseModel):
    """An object with exactly these fields (the compiler writes every one)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True,
                              populate_by_name=True)


class AffineBytes(_Closed):
    """A byte quantity that scales with the pool: ``per_block * num_blocks + fixed``.

    Written as a plain integer when ``per_block`` is 0.
    """

    per_block: int = Field(description="Bytes per block of the pool (the coefficient of "
                           "num_blocks).")
    fixed: int = Field(description="Bytes independent of num_blocks.")


Bytes = Annotated[int | AffineBytes, Field(
    description="Bytes: an integer, or {per_block, fixed} when it depends on num_blocks.")]
Sha256 = Annotated[str, Field(pattern="^[0-9a-f]{64}$")]


class SpecDescription(BaseModel):
    """A layer spec as the planner sees it (``LayerSpec.describe()``).

    The fields common to every kind are listed; each kind adds its own
    (``num_kv_heads``, ``head_size``, ``sliding_window``, ``shapes``, ...).
    """

    model_config = ConfigDict(extra="allow", frozen=True, strict=True,
                              populate_by_name=True)

    kind: str = Field(description="The layer kind, e.g. full_attention, sliding_window, mamba.")
    class_: str = Field(alias="class", description="The reference planner's spec class.")
    block_size: int = Field(description="Tokens per block.")
    page_size_bytes: int = Field(description="Bytes of one page (padded where padding applies).")
    prefix_cacheable: bool
    kv_cache_specs: dict[str, SpecDescription] = Field(
        default_factory=dict, description="A group of several kinds: the spec of each member "
        "layer (UniformTypeKVCacheSpecs).")


class EngineSettings(_Closed):
    """The engine policy the plan was made for, with derived values resolved."""

    async_scheduling: bool
    block_size: int
    decode_context_parallel_size: int
    draft_block_size: int | None
    draft_pool: bool
    draft_pool_blocks: int | None
    enable_prefix_caching: bool
    hybrid: bool
    kv_cache_dtype: str
    layout: LayoutName
    mamba_block_size: int | None
    mamba_cache_mode: Literal["none", "align", "all"]
    max_in_flight_tokens: int
    max_model_len: int = Field(description="After fitting to the budget when the source "
                               "says max_model_len: auto.")
    max_num_batched_tokens: int
    max_num_encoder_input_tokens: int | None
    max_num_seqs: int
    model_max_len: int
    num_blocks: int | None = Field(description="A fixed block count from the source, if any.")
    num_prefill_lookahead_tokens: int
    original_max_model_len: int | None = Field(description="-1 when the source says auto.")
    pipeline_parallel_size: int
    pp_layer_partition: list[int] | None
    prefix_match_unit: int | None
    speculative_method: str | None
    tensor_parallel_size: int
    total_num_hidden_layers: int | None


class CellPartEntry(_Closed):
    """One addressable run inside a layer's cell (a view the loader exposes)."""

    name: str
    dtype: str
    byte_offset: int
    count: int


class LayerPlacement(_Closed):
    """Where one layer lives: its group (None: not grouped) and pipeline stage."""

    group: int | None
    stage: int
    spec: SpecDescription
    kv_cache_dtype: str | None = Field(
        None, description="The layer's quantization mode (None for state layers).")
    cell_parts: list[CellPartEntry] | None = Field(
        None, description="Addressable parts of a cell (K, V, scales, ...); None: opaque.")
    per_tensor_scales: bool = Field(
        False, description="The layer has per-tensor k/v scale constants outside the cache.")


class GroupEntry(_Closed):
    """One group: layers sharing one block table."""

    id: int
    kind: str
    class_: str = Field(alias="class")
    layers: list[str]
    block_size: int
    page_size_bytes: int
    page_size_padded: int | None
    padding_slots: int = Field(description="Slots of this group no layer uses (aliasing "
                               "layouts pad smaller groups to the largest).")
    useful_bytes_per_block: int
    padding_bytes_per_block: int
    own_pool: bool
    is_eagle: bool
    prefix_cacheable: bool
    max_memory_usage_bytes: int
    blocks_per_request: int
    max_num_blocks_per_req: int | None
    spec: SpecDescription


class TensorEntry(_Closed):
    """Placement of same-shaped layers in a pool:
    ``offset + l * layer_stride + b * block_stride`` (bytes)."""

    layers: list[str]
    size: Bytes
    layer_stride: Bytes
    block_stride: Bytes
    offset: Bytes
    host_resident: bool
    pool: str = Field(description="'device' (the main pool) or 'draft' (a drafter's own pool).")
    role: str
    group: int
    spec: SpecDescription


class StageEntry(_Closed):
    """One pipeline stage: its layers, bytes per block and tensors."""

    index: int
    layers: list[str]
    bytes_per_block: int
    fixed_bytes: int
    draft_num_blocks: int | None
    draft_layers: list[str]
    memory_per_request: int
    min_num_blocks: int
    groups: list[list[str]]
    tensors: list[TensorEntry]


class BudgetEntry(_Closed):
    """Capacity for the memory budget the artifact was compiled with."""

    memory: int
    num_blocks: int
    max_concurrency: float
    kv_cache_size_tokens: int
    max_model_len: int
    estimated_max_model_len: int


class LogEntry(_Closed):
    level: Literal["INFO", "WARNING"]
    message: str


class LayoutBody(_Closed):
    """The plan; ``body_sha256`` is the sha256 of its canonical JSON."""

    name: str
    model: str | None
    engine: EngineSettings
    layers: dict[str, LayerPlacement]
    groups: list[GroupEntry]
    stages: list[StageEntry]
    scheduler_block_size: int
    hash_block_size: int
    needs_zeroing: bool
    budget: BudgetEntry | None = Field(description="Present when compiled with a memory "
                                       "budget (engine.memory or --memory).")
    log: list[LogEntry]
    warnings: list[str] = Field(description="Early checks: what would go wrong or waste "
                                "memory in the engine (kvspec.planner.checks).")


class LayoutArtifact(_Closed):
    """A frozen kvspec layout artifact (``*.kvlayout.json``)."""

    format: Literal["kvspec.layout/1"] = Field(description="Artifact format version.")
    compiler: str = Field(pattern=r"^kvspec \S+$", description="The compiler that wrote it.")
    source_sha256: Sha256 = Field(description="sha256 of the source text.")
    body_sha256: Sha256 = Field(description="sha256 of the body's canonical JSON.")
    body: LayoutBody


assert FORMAT == "kvspec.layout/1", "update LayoutArtifact.format with the artifact format"


def validate_artifact(data: Any, *, origin: str = "<artifact>") -> LayoutArtifact:
    """Check ``data`` (a parsed artifact) against the artifact schema; all problems at once."""
    try:
        return LayoutArtifact.model_validate(data)
    except ValidationError as exc:
        problems = [f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg']}"
                    for e in exc.errors(include_url=False)]
        raise ArtifactError(
            f"does not match the artifact schema ({len(problems)} problem(s))", file=origin,
            found="; ".join(problems[:5]) + ("; ..." if len(problems) > 5 else ""),
            hint="recompile it with this kvspec version") from None


# ---------------------------------------------------------------------------
# JSON Schema generation
# ---------------------------------------------------------------------------


def _schema(model: type[BaseModel], *, id_: str, title: str, comment: str) -> dict[str, Any]:
    schema = model.model_json_schema(mode="validation", by_alias=True)
    schema.update({"$schema": SCHEMA_DIALECT, "$id": id_, "title": title, "$comment": comment})
    return schema


def source_schema() -> dict[str, Any]:
    """The JSON Schema of a layout source (``layouts/*.yaml``)."""
    return _schema(Source, id_="urn:kvspec:schema:source:1",
                   title="kvspec layout source (format 1)",
                   comment="Generated by `kvspec schema` from kvspec.source.model.Source; "
                   "do not edit.")


def artifact_schema() -> dict[str, Any]:
    """The JSON Schema of a compiled layout artifact (``*.kvlayout.json``)."""
    return _schema(LayoutArtifact, id_=f"urn:kvspec:schema:{FORMAT}",
                   title=f"kvspec layout artifact ({FORMAT})",
                   comment="Generated by `kvspec schema` from kvspec.schemas.LayoutArtifact; "
                   "do not edit.")


def render(schema: dict[str, Any]) -> str:
    """Deterministic text: sorted keys, two-space indent, a final newline."""
    return json.dumps(schema, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


#: File name in ``schemas/`` -> the function that builds it.
SCHEMA_FILES: dict[str, Callable[[], dict[str, Any]]] = {
    "source.schema.json": source_schema,
    "artifact.schema.json": artifact_schema,
}


@dataclass(frozen=True)
class SchemaFile:
    """One schema file: where it goes, what it should hold, what it holds now."""

    path: Path
    expected: str
    current: str | None  # None: the file does not exist

    @property
    def is_current(self) -> bool:
        return self.current == self.expected

    def diff(self, max_lines: int = 40) -> list[str]:
        lines = list(difflib.unified_diff(
            (self.current or "").splitlines(keepends=True), self.expected.splitlines(keepends=True),
            fromfile=f"{self.path} (committed)", tofile=f"{self.path} (generated)"))
        if len(lines) > max_lines:
            lines = lines[:max_lines] + [f"... {len(lines) - max_lines} more diff lines\n"]
        return [line.rstrip("\n") for line in lines]


class StaleSchemaError(KvspecError):
    """The committed schemas are not what the models generate."""


def schema_files(directory: str | Path) -> list[SchemaFile]:
    directory = Path(directory)
    out = []
    for name, build in SCHEMA_FILES.items():
        path = directory / name
        try:
            current = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            current = None
        out.append(SchemaFile(path, render(build()), current))
    return out


def write_schemas(directory: str | Path) -> list[SchemaFile]:
    """(Re)write the schemas into ``directory``; return what changed."""
    changed = [f for f in schema_files(directory) if not f.is_current]
    for f in changed:
        write_atomic(f.path, f.expected)
    return changed


def check_schemas(directory: str | Path) -> list[SchemaFile]:
    """The schema files in ``directory`` that are stale or missing."""
    return [f for f in schema_files(directory) if not f.is_current]
