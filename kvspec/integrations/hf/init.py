"""A kvspec source from a Hugging Face ``config.json``: what ``kvspec init`` writes.

:func:`kvspec.integrations.hf.families.describe` says which layer holds which kind of cache;
this module turns those facts into a source a person can review: one layer type
per distinct layer, the decoder-layer sequence folded into repeated patterns
(:mod:`kvspec.source.writer`), global KV heads (the source splits them by
``parallel.tensor`` itself) and per-rank state shapes, layer names as vLLM
registers them, and a header saying where it came from and what to check.

>>> import json
>>> config = json.load(open("tests/data/hf/llama-3.1-8b.json"))
>>> text = init_source(config, InitOptions(name="llama", max_model_len=8192))
>>> print(text.splitlines()[0])
# yaml-language-server: $schema=../schemas/source.schema.json
>>> print("\\n".join(line for line in text.splitlines() if not line.startswith("#")))
kvspec: 1
name: llama
layer_name: model.layers.{index}.self_attn.attn
engine:
  block_size: 16
  max_model_len: 8192
  max_num_batched_tokens: 8192
  max_num_seqs: 256
  layout: LBNHC
  prefix_caching: true
parallel: {tensor: 1, pipeline: 1}
defaults: {num_kv_heads: 8, head_size: 128, dtype: bfloat16}
layer_types:
  full: {kind: full_attention}
layers:
- {repeat: 32, pattern: [full]}
"""

from __future__ import annotations

import textwrap
from collections import Counter
from collections.abc import Mapping
from typing import Any

from kvspec.errors import ErrorList, KvspecError
from kvspec.integrations.hf.families import (
    LayerFacts,
    ModelFacts,
    UnsupportedModelError,
    describe,
)
from kvspec.integrations.options import InitOptions
from kvspec.model import kinds
from kvspec.source.layers import SKIP
from kvspec.source.writer import (
    Record,
    exact_size,
    flow,
    layers_section,
    most_common,
    to_yaml,
)

__all__ = ["InitOptions", "attention_block_size", "init_source", "layer_names", "source_text"]

#: vLLM's smallest attention kernel block (FlashAttention: a multiple of 16).
KERNEL_BLOCK_ALIGNMENT = 16

#: Layer-type names of state layers, by mamba_type (attention: the kind's own).
_STATE_TYPE_NAMES = {"mamba1": "mamba", "mamba2": "mamba", "gdn_attention": "gdn",
                     "short_conv": "conv", "linear_attention": "linear"}

_FAMILY_TITLES = {
    "llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3",
    "gemma2": "Gemma 2", "gemma3": "Gemma 3", "gpt_oss": "gpt-oss", "llama4": "Llama 4",
    "deepseek_v2": "DeepSeek V2", "deepseek_v3": "DeepSeek V3", "jamba": "Jamba",
    "qwen3_next": "Qwen3-Next", "nemotron_h": "Nemotron-H",
}


def layer_names(facts: ModelFacts, config: Mapping[str, Any]) -> dict[str, str]:
    """Name templates vLLM registers the cache layers under, by role.

    ``{"attention": ..., "state": ...}``, from the module prefixes in vLLM's
    model code: gpt-oss ``layers.N.attn.attn``; Jamba ``layers.N.attn`` and
    ``layers.N.mixer``; Nemotron-H ``layers.N.mixer.attn`` and ``layers.N.mixer``;
    Qwen3-Next ``layers.N.linear_attn``; multimodal Gemma 3 and Llama 4 nest the
    text model under ``language_model.``.
    """
    prefix = "model.layers.{index}"
    archs = config.get("architectures") or []
    if facts.family in ("gemma3", "llama4") and any(
            a.endswith("ForConditionalGeneration") for a in archs):
        prefix = "language_model." + prefix
    attention = {"gpt_oss": ".attn.attn", "jamba": ".attn",
                 "nemotron_h": ".mixer.attn"}.get(facts.family, ".self_attn.attn")
    state = {"qwen3_next": ".linear_attn"}.get(facts.family, ".mixer")
    return {"attention": prefix + attention, "state": prefix + state}


def _layer_fields(layer: LayerFacts) -> dict[str, Any]:
    if layer.kind == "mamba":
        assert layer.state_shapes is not None and layer.state_dtypes is not None
        return {"kind": "mamba", "mamba_type": layer.mamba_type,
                "shapes": [list(s) for s in layer.state_shapes],
                "dtypes": list(layer.state_dtypes)}
    fields: dict[str, Any] = {"kind": layer.kind, "num_kv_heads": layer.num_kv_heads,
                              "head_size": layer.head_size}
    for name in ("head_size_v", "sliding_window", "attention_chunk_size"):
        if getattr(layer, name) is not None:
            fields[name] = getattr(layer, name)
    return fields


def _records(facts: ModelFacts, config: Mapping[str, Any]) -> list[Record]:
    names = layer_names(facts, config)
    out = []
    for layer in facts.layers:
        state = layer.kind == "mamba"
        type_name = (_STATE_TYPE_NAMES.get(layer.mamba_type or "", "state") if state
                     else kinds.by_name(layer.kind).type_name)
        template = names["state" if state else "attention"]
        out.append(Record(template.format(index=layer.index), layer.index,
                          _layer_fields(layer), type_name))
    return out


def _model_dtype(facts: ModelFacts, options: InitOptions, notes: list[str]) -> str:
    dtype = options.dtype or facts.dtype
    if dtype is None:
        dtype = "bfloat16"
        notes.append("config.json names no torch_dtype: the model dtype is bfloat16 (what "
                     "vLLM serves it in); change defaults.dtype if you serve another.")
    return dtype


def source_data(facts: ModelFacts, config: Mapping[str, Any],
                options: InitOptions) -> tuple[dict[str, Any], list[str]]:
    """The source as plain data (key order as written) and review notes."""
    notes: list[str] = []
    if not facts.layers:
        raise KvspecError("the model has no layer that holds KV cache or state",
                          file=options.config_name)
    records = _records(facts, config)
    attention = [r.fields for r in records if r.fields["kind"] != "mamba"]
    defaults = {k: most_common([f[k] for f in attention])
                for k in ("num_kv_heads", "head_size") if attention}
    defaults["dtype"] = _model_dtype(facts, options, notes)
    section = layers_section(records, defaults=defaults)
    if any(SKIP in e["pattern"] for e in section["layers"] if "pattern" in e):
        notes.append("'-' pattern items are decoder layers without a KV cache (MLP/MoE only).")
    parallel: dict[str, Any] = {"tensor": options.tp, "pipeline": options.pp}
    if max(layer.index for layer in facts.layers) + 1 != facts.num_layers:
        parallel["num_hidden_layers"] = facts.num_layers
    if int(config.get("num_nextn_predict_layers") or 0) > 0:
        notes.append(f"the {config['num_nextn_predict_layers']} multi-token-prediction "
                     "layer(s) (num_nextn_predict_layers) belong to a speculative drafter "
                     "and are not listed.")
    source: dict[str, Any] = {"kvspec": 1, "name": options.name}
    if options.model:
        source["model"] = options.model
    source["layer_name"] = section.pop("layer_name")
    source["engine"] = _engine(facts, options, notes)
    source["parallel"] = flow(parallel)
    source["defaults"] = section.pop("defaults")
    if options.kv_cache_dtype != "auto":
        source["quantization"] = flow({"kv_cache_dtype": options.kv_cache_dtype})
    source.update(section)
    return source, notes


def _engine(facts: ModelFacts, options: InitOptions, notes: list[str]) -> dict[str, Any]:
    engine: dict[str, Any] = {"block_size": options.block_size}
    if options.max_model_len == "auto":
        if facts.max_position_embeddings is None:
            raise KvspecError("max_model_len auto needs the model's max_position_embeddings, "
                              "which config.json does not give", file=options.config_name,
                              hint="pass --max-model-len N")
        if options.memory is None:
            raise KvspecError("--max-model-len auto needs --memory to fit it to",
                              hint="pass --memory 40GiB, or a fixed --max-model-len")
        engine["max_model_len"] = "auto"
        engine["model_max_len"] = facts.max_position_embeddings
    else:
        max_len = options.max_model_len or facts.max_position_embeddings
        if not max_len:
            raise KvspecError("config.json gives no max_position_embeddings",
                              file=options.config_name, hint="pass --max-model-len N")
        engine["max_model_len"] = max_len
        if options.max_model_len is None:
            notes.append(f"max_model_len is the model's max_position_embeddings "
                         f"({max_len}); serving shorter requests needs less memory.")
    engine.update({"max_num_batched_tokens": 8192, "max_num_seqs": 256, "layout": "LBNHC",
                   "prefix_caching": True})
    if options.memory is not None:
        engine["memory"] = exact_size(options.memory)
    return engine


def _dump(source: dict[str, Any]) -> str:
    return to_yaml(source, width=120)


def _command_line(options: InitOptions) -> str:
    parts = [f"kvspec init --from-hf {options.config_name}"]
    if options.tp != 1:
        parts.append(f"--tp {options.tp}")
    if options.pp != 1:
        parts.append(f"--pp {options.pp}")
    if options.max_model_len is not None:
        parts.append(f"--max-model-len {options.max_model_len}")
    if options.memory is not None:
        parts.append(f"--memory {exact_size(options.memory)}")
    if options.kv_cache_dtype != "auto":
        parts.append(f"--kv-cache-dtype {options.kv_cache_dtype}")
    if options.dtype is not None:
        parts.append(f"--dtype {options.dtype}")
    if options.block_size != 16:
        parts.append(f"--block-size {options.block_size}")
    if options.mamba_cache_dtype != "auto":
        parts.append(f"--mamba-cache-dtype {options.mamba_cache_dtype}")
    if options.mamba_ssm_cache_dtype != "auto":
        parts.append(f"--mamba-ssm-cache-dtype {options.mamba_ssm_cache_dtype}")
    if options.model:
        parts.append(f"--model {options.model}")
    return " ".join(parts)


def _header(facts: ModelFacts, options: InitOptions, notes: list[str]) -> str:
    kinds = Counter(layer.mamba_type if layer.kind == "mamba" else layer.kind
                    for layer in facts.layers)
    counts = ", ".join(f"{n} {kind}" for kind, n in kinds.items())
    title = _FAMILY_TITLES.get(facts.family, facts.family)
    lines = [f"# yaml-language-server: $schema={options.schema}"]
    lines += _comment(f"{options.model or options.name}: {title} ({facts.model_type}), "
                      f"{facts.num_layers} decoder layers; cache layers: {counts}.")
    lines += ["# Generated by:", f"#   {_command_line(options)}"]
    lines += _comment("Review it before use: parallel, max_model_len and the memory budget "
                      "are deployment choices, and each layer type should match how your "
                      "engine serves the model.")
    for note in notes:
        lines += _comment("Note: " + note)
    return "\n".join(lines) + "\n"


def _comment(text: str) -> list[str]:
    return ["# " + line for line in textwrap.wrap(text, 88, break_on_hyphens=False,
                                                  break_long_words=False)]


def attention_block_size(facts: ModelFacts, source: dict[str, Any],
                         options: InitOptions) -> tuple[int, int, int] | None:
    """vLLM's attention block size for a model with state (Mamba-style) layers.

    vLLM keeps attention and state layers in one pool of equal pages, so it
    raises the attention block size until one attention page holds one state
    (``HybridAttentionMambaModelConfig`` / ``Platform``'s hybrid alignment)::

        k = max(16, block_size)
        block_size = k * ceil(state_page / (k * attention_bytes_per_token))

    Returns ``(block_size, attention page bytes, state page bytes)`` per rank,
    or None when the model has no state layers or no attention layers.
    """
    if not any(layer.kind == "mamba" for layer in facts.layers):
        return None
    from kvspec.compiler import Unit, expand_pass, load, parse, run
    from kvspec.model.specs import Attention, MambaState

    unit = run(Unit(text=_dump(source), file=options.config_name),
               (load, parse, expand_pass))
    assert unit.expanded is not None
    specs = [s for stage in unit.expanded.stage_specs for s in stage.values()]
    per_token = [s.page_size_bytes // s.block_size for s in specs
                 if isinstance(s, Attention) and s.tokens_per_state == 1]
    states = [s.unpadded_page_size_bytes for s in specs if isinstance(s, MambaState)]
    if not per_token or not states:
        return None
    attn_1, state = max(per_token), max(states)
    k = max(KERNEL_BLOCK_ALIGNMENT, options.block_size)
    block = max(options.block_size, k * -(-state // (k * attn_1)))
    return block, block * attn_1, state


def source_text(facts: ModelFacts, config: Mapping[str, Any], options: InitOptions) -> str:
    """The reviewed-to-be source text for ``facts``; it compiles."""
    from kvspec.compiler import compile_source

    source, notes = source_data(facts, config, options)
    try:
        aligned = attention_block_size(facts, source, options)
        if aligned is not None and aligned[0] != options.block_size:
            block, page, state = aligned
            source["engine"]["block_size"] = block
            notes.append(f"engine.block_size is {block}, as vLLM sets it: one attention page "
                         f"({page} B per rank) must hold one state ({state} B per rank); the "
                         "planner pads state pages to it.")
        text = _header(facts, options, notes) + _dump(source)
        compile_source(text, f"<init {options.config_name}>")
    except ErrorList as err:
        raise _not_compiling(err, [e.message for e in err.errors], options) from None
    except KvspecError as err:
        raise _not_compiling(err, [err.message], options) from None
    return text


def _not_compiling(err: KvspecError, messages: list[str], options: InitOptions) -> KvspecError:
    return KvspecError(
        "the source made from this config does not compile: " + "; ".join(messages),
        file=options.config_name, expected=err.expected, found=err.found,
        hint=err.hint or "check --tp, --max-model-len and --memory")


def init_source(config: Mapping[str, Any], options: InitOptions) -> str:
    """``config.json`` (parsed) -> source text; raise :class:`KvspecError` on bad input."""
    if not isinstance(config, Mapping):
        raise KvspecError("config.json must hold a JSON object", file=options.config_name,
                          found=type(config).__name__)
    try:
        facts = describe(config, tp=options.tp, mamba_cache_dtype=options.mamba_cache_dtype,
                         mamba_ssm_cache_dtype=options.mamba_ssm_cache_dtype)
    except UnsupportedModelError as exc:
        raise KvspecError(str(exc), file=options.config_name,
                          hint="write the source by hand (see layouts/ for examples), or "
                          "import a per-layer spec dump with `kvspec import`") from None
    except ValueError as exc:
        raise KvspecError(f"cannot read the model from config.json: {exc}",
                          file=options.config_name) from None
    return source_text(facts, config, options)
