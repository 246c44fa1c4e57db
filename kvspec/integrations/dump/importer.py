"""``kvspec import``: a per-layer spec dump -> a readable kvspec source.

The dump (``tests/conformance/FORMAT.md``) lists every layer of one rank. The
importer checks it against the dump format (:mod:`.schema`; every problem
placed at its line and column in the JSON) and recovers what a person would
write (:mod:`kvspec.source.writer`): a layer-name template, named layer types,
defaults for the fields most layers share, global KV heads (per-rank heads x
tensor parallelism) and the decoder-layer sequence folded into patterns.

Each layer keeps its own cache mode: a dump entry's ``cache_dtype_str``, and
``auto`` when it names none (its ``dtype`` is then the storage dtype as given).

>>> dump = {"name": "tiny", "config": {"block_size": 16, "max_model_len": 256},
...         "layers": [{"name": f"model.layers.{i}.self_attn.attn", "kind": "full_attention",
...                     "num_kv_heads": 2, "head_size": 64, "dtype": "bfloat16"}
...                    for i in range(4)]}
>>> import_dump(dump)["layers"]
[{'repeat': 4, 'pattern': ['full']}]
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from kvspec.integrations.dump.schema import DumpConfig, DumpLayer, validated
from kvspec.model import kinds
from kvspec.model.engine import setting
from kvspec.source.writer import (
    Record,
    assign_types,
    exact_size,
    flow,
    layers_section,
    template_of,
    to_yaml,
)

#: Activation dtypes: what an ``auto`` layer's dtype says of the model's.
MODEL_DTYPES = ("bfloat16", "float16", "float32")

#: Decoder layers without a cache written as ``-`` items rather than a new entry.
MAX_SKIP = 8

#: Engine settings a dump's config gives as they are, in the order the source's
#: ``engine:`` writes them.
_COPIED = ("max_num_batched_tokens", "max_num_seqs", "axis_order", "async_scheduling",
           "prefix_match_unit", "mamba_block_size", "num_gpu_blocks_override",
           "max_num_encoder_input_tokens", "speculative_method", "num_prefill_lookahead_tokens")
#: ``(config key, key under engine:)`` of each: vLLM's name and the source's
#: (:data:`kvspec.model.engine.SETTINGS`).
def _names(name: str) -> tuple[str, str]:
    s = setting(name)
    assert s.vllm is not None and s.source_key is not None, name  # each of _COPIED has both
    return s.vllm, s.source_key.removeprefix("engine.")


_ENGINE_FIELDS = tuple(_names(n) for n in _COPIED)


def cache_mode(layer: DumpLayer) -> str:
    """A dump layer's own cache mode: its ``cache_dtype_str``, else ``auto``."""
    return layer.cache_dtype_str or "auto"


def _type_name(fields: dict[str, Any]) -> str:
    kind = kinds.by_name(fields["kind"])
    if kind.name == "mla" and str(fields.get("tokens_per_state", 1)) != "1":
        return "indexer"
    return kind.type_name


def records(cfg: DumpConfig, layers: list[DumpLayer],
            order: list[list[str]] | None = None) -> list[Record]:
    """The source's view of each dump layer: global heads, the layer's own mode
    (``order``: each layer's keys as the dump wrote them, kept in the source)."""
    global_cache = cfg.kv_cache_dtype
    model_dtypes = Counter(layer.dtype for layer in layers if cache_mode(layer) == "auto"
                           and layer.dtype in MODEL_DTYPES)
    model_dtype = model_dtypes.most_common(1)[0][0] if model_dtypes else "bfloat16"
    out = []
    for i, layer in enumerate(layers):
        fields = layer.fields()
        if order is not None:
            fields = {k: fields[k] for k in order[i] if k in fields}
        kind = kinds.by_name(layer.kind)
        cache = cache_mode(layer)
        if not kind.state:
            if not kind.latent and "num_kv_heads" in fields:  # else: the source says it lacks it
                fields["num_kv_heads"] = fields["num_kv_heads"] * cfg.tensor_parallel_size
            if cache != "auto" and "state_content_bytes" not in fields:
                fields["dtype"] = model_dtype  # the storage dtype follows from the mode
            if cache != global_cache:
                fields["kv_cache_dtype"] = cache
        out.append(Record(layer.name, template_of(layer.name)[1], fields, _type_name(fields)))
    return out


def engine_section(cfg: DumpConfig) -> dict[str, Any]:
    engine: dict[str, Any] = {"block_size": cfg.block_size}
    if cfg.original_max_model_len == -1:
        engine["max_model_len"] = "auto"
        engine["model_max_len"] = cfg.max_model_len
    else:
        engine["max_model_len"] = cfg.max_model_len
    for src, dst in _ENGINE_FIELDS:
        value = getattr(cfg, src)
        if value is not None and not (src == "num_prefill_lookahead_tokens" and value == 0):
            engine[dst] = value
    if cfg.disable_hybrid_kv_cache_manager:
        engine["hybrid"] = False
    if cfg.enable_prefix_caching is False:
        engine["prefix_caching"] = False
    if cfg.mamba_cache_mode not in (None, "none"):
        engine["mamba_cache_mode"] = cfg.mamba_cache_mode
    if cfg.available_memory_bytes is not None:
        engine["memory"] = exact_size(cfg.available_memory_bytes)
    return engine


@dataclass(frozen=True)
class Imported:
    """A dump's source, and where each of its layer types came from in the dump."""

    source: dict[str, Any]
    #: Layer type -> index of the first dump layer of that type (for error positions).
    first_layer_of_type: dict[str, int]

    def text(self, model: str | None = None,
             schema: str = "../schemas/source.schema.json") -> str:
        """The YAML text, with the schema comment on top (``schema`` is relative to
        where the file will live; layouts/ by default)."""
        return (f"# yaml-language-server: $schema={schema}\n"
                f"# Imported by `kvspec import` from a per-layer spec dump"
                f"{' of ' + model if model else ''}.\n" + to_yaml(self.source))


def import_source(data: Any, file: str = "<dump>", text: str | None = None) -> Imported:
    """A dump's source; ``text`` is the dump's JSON text, for error positions."""
    dump = validated(data, file, text)
    cfg = dump.config
    parallel: dict[str, Any] = {"tensor": cfg.tensor_parallel_size,
                                "pipeline": cfg.pipeline_parallel_size,
                                "decode_context": cfg.decode_context_parallel_size}
    if cfg.num_hidden_layers is not None:
        parallel["num_hidden_layers"] = cfg.num_hidden_layers
    source: dict[str, Any] = {"kvspec": 1, "name": dump.name or "imported"}
    if dump.model:
        source["model"] = dump.model
    if dump.facts:
        source["description"] = dump.facts
    recs = records(cfg, dump.layers, [list(layer) for layer in data["layers"]])
    section = layers_section(recs, max_skip=MAX_SKIP)
    source["layer_name"] = section.pop("layer_name")
    source["engine"] = engine_section(cfg)
    source["parallel"] = flow(parallel)
    if "defaults" in section:
        source["defaults"] = section.pop("defaults")
    if cfg.kv_cache_dtype != "auto":
        source["quantization"] = {"kv_cache_dtype": cfg.kv_cache_dtype}
    source.update(section)
    first: dict[str, int] = {}
    for i, name in enumerate(assign_types(recs)[3]):
        first.setdefault(name, i)
    return Imported(source, first)


def import_dump(data: Any, file: str = "<dump>", text: str | None = None) -> dict[str, Any]:
    """The source (as plain data) for a dump; see :func:`dump_to_yaml`."""
    return import_source(data, file, text).source


def dump_to_yaml(data: Any, *, schema: str = "../schemas/source.schema.json",
                 file: str = "<dump>", text: str | None = None) -> str:
    """The YAML text of the imported source, with the schema comment on top."""
    model = data.get("model") if isinstance(data, dict) else None
    return import_source(data, file, text).text(model if isinstance(model, str) else None,
                                                schema)
