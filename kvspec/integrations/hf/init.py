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
architecture: LlamaForCausalLM
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

import dataclasses
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from kvspec.compiler import Expanded, SourceText, compile_source, run_until
from kvspec.errors import ErrorList, KvspecError
from kvspec.integrations import rules
from kvspec.integrations.hf.config import config_error, not_an_object
from kvspec.integrations.hf.engine import Hybrid, engine_section, hybrid
from kvspec.integrations.hf.families import (
    LayerFacts,
    ModelFacts,
    UnsupportedModelError,
    describe,
    family_title,
)
from kvspec.integrations.hf.families.facts import (
    LATENT,
    STATE,
    ConfigError,
    cfg_opt_int,
    text_config,
)
from kvspec.integrations.mla_backend import DEFAULT_BLOCK_SIZE, mla_backend, mla_block_note
from kvspec.integrations.options import InitOptions, header
from kvspec.model import kinds
from kvspec.model.specs import Attention, MambaState
from kvspec.source.layers import SKIP
from kvspec.source.writer import (
    Record,
    flow,
    layers_section,
    most_common,
    to_yaml,
)

T = TypeVar("T")

__all__ = ["InitOptions", "init_source", "layer_names", "source_text", "state_pages"]

#: Layer-type names of state layers, by mamba_type (attention: the kind's own).
_STATE_TYPE_NAMES = {"mamba1": "mamba", "mamba2": "mamba", "gdn_attention": "gdn",
                     "short_conv": "conv", "linear_attention": "linear"}
#: Families whose multimodal checkpoint nests the text model under ``language_model.``.
_NESTED = ("gemma3", "llama4", "qwen3_5", "qwen3_5_moe")
#: Config keys that count a speculative drafter's multi-token-prediction layers.
_MTP_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers")


def layer_names(facts: ModelFacts, config: Mapping[str, Any]) -> dict[str, str]:
    """Name templates vLLM registers the cache layers under, by role.

    ``{"attention": ..., "state": ...}``, from the module prefixes in vLLM's
    model code: gpt-oss ``layers.N.attn.attn``; Jamba ``layers.N.attn`` and
    ``layers.N.mixer``; Nemotron-H ``layers.N.mixer.attn`` and ``layers.N.mixer``;
    Qwen3-Next and Qwen3.5 ``layers.N.linear_attn``; multimodal Gemma 3, Llama 4
    and Qwen3.5 nest the text model under ``language_model.``.
    """
    prefix = "model.layers.{index}"
    archs = config.get("architectures") or []
    if facts.family in _NESTED and any(a.endswith("ForConditionalGeneration") for a in archs):
        prefix = "language_model." + prefix
    attention = {"gpt_oss": ".attn.attn", "jamba": ".attn",
                 "nemotron_h": ".mixer.attn"}.get(facts.family, ".self_attn.attn")
    state = ".linear_attn" if facts.family in ("qwen3_next", "qwen3_5", "qwen3_5_moe") \
        else ".mixer"
    return {"attention": prefix + attention, "state": prefix + state}


def _layer_fields(layer: LayerFacts, hyb: Hybrid | None) -> dict[str, Any]:
    if layer.kind == STATE:
        assert layer.state_shapes is not None and layer.state_dtypes is not None
        fields: dict[str, Any] = {"kind": STATE, "mamba_type": layer.mamba_type,
                                  "shapes": [list(s) for s in layer.state_shapes],
                                  "dtypes": list(layer.state_dtypes)}
        if hyb is not None:  # as vLLM's spec has them; only align mode reads them
            fields.update(hyb.state_fields(layer.mamba_type or ""))
        return fields
    fields = {"kind": layer.kind, "num_kv_heads": layer.num_kv_heads,
              "head_size": layer.head_size}
    for name in ("head_size_v", "sliding_window", "attention_chunk_size"):
        if getattr(layer, name) is not None:
            fields[name] = getattr(layer, name)
    return fields


def _records(facts: ModelFacts, config: Mapping[str, Any], hyb: Hybrid | None) -> list[Record]:
    names = layer_names(facts, config)
    out = []
    for layer in facts.layers:
        state = layer.kind == STATE
        type_name = (_STATE_TYPE_NAMES.get(layer.mamba_type or "", "state") if state
                     else kinds.by_name(layer.kind).type_name)
        template = names["state" if state else "attention"]
        out.append(Record(template.format(index=layer.index), layer.index,
                          _layer_fields(layer, hyb), type_name))
    return out


def _dtype_note(facts: ModelFacts, options: InitOptions) -> str | None:
    if options.dtype is not None or facts.dtype == facts.served_dtype:
        return None
    if facts.dtype is None:
        return (f"config.json names no torch_dtype: the model dtype is {facts.served_dtype} "
                "(what vLLM serves it in); change defaults.dtype if you serve another.")
    return (f"the checkpoint is {facts.dtype}; vLLM serves it in {facts.served_dtype} "
            "(--dtype auto), and so does this source; pass --dtype to serve another.")


def source_data(facts: ModelFacts, config: Mapping[str, Any], options: InitOptions,
                hyb: Hybrid | None = None) -> tuple[dict[str, Any], list[str]]:
    """The source as plain data (key order as written) and review notes."""
    notes: list[str] = []
    if not facts.layers:
        raise KvspecError("the model has no layer that holds KV cache or state",
                          file=options.config_name,
                          hint="check the config's layer pattern (e.g. hybrid_override_pattern: "
                          "M for Mamba, * for attention)")
    records = _records(facts, config, hyb)
    attention = [r.fields for r in records if r.fields["kind"] != STATE]
    defaults = {k: most_common([f[k] for f in attention])
                for k in ("num_kv_heads", "head_size") if attention}
    defaults["dtype"] = facts.served_dtype
    if (note := _dtype_note(facts, options)) is not None:
        notes.append(note)
    section = layers_section(records, defaults=defaults)
    if any(SKIP in e["pattern"] for e in section["layers"] if "pattern" in e):
        notes.append("'-' pattern items are decoder layers without a KV cache (MLP/MoE only).")
    parallel: dict[str, Any] = {"tensor": options.tp, "pipeline": options.pp}
    if options.dcp > 1:
        parallel["decode_context"] = options.dcp
    if max(layer.index for layer in facts.layers) + 1 != facts.num_layers:
        parallel["num_hidden_layers"] = facts.num_layers
    text = text_config(config)
    for key in _MTP_KEYS:
        count = cfg_opt_int(text, key, minimum=0) or cfg_opt_int(config, key, minimum=0)
        if count:
            notes.append(f"the {count} multi-token-prediction layer(s) ({key}) belong to a "
                         "speculative drafter and are not listed.")
    source: dict[str, Any] = {"kvspec": 1, "name": options.name}
    if options.model_id:
        source["model"] = options.model_id
    architectures = config.get("architectures")
    if isinstance(architectures, list) and architectures and \
            isinstance(architectures[0], str) and architectures[0].strip():
        source["architecture"] = architectures[0].strip()
    source["layer_name"] = section.pop("layer_name")
    source["engine"] = engine_section(facts, options, hyb, notes)
    source["parallel"] = flow(parallel)
    source["defaults"] = section.pop("defaults")
    if options.kv_cache_dtype != "auto":
        source["quantization"] = flow({"kv_cache_dtype": options.kv_cache_dtype})
    source.update(section)
    return source, notes


def _dump(source: dict[str, Any]) -> str:
    return to_yaml(source, width=120)


def _header(facts: ModelFacts, options: InitOptions, notes: list[str]) -> str:
    counts = Counter(layer.mamba_type if layer.kind == STATE else layer.kind
                     for layer in facts.layers)
    listed = ", ".join(f"{n} {kind}" for kind, n in counts.items())
    return header(
        options, "--from-hf",
        f"{options.model or options.name}: {family_title(facts.family)} "
        f"({facts.model_type}), {facts.num_layers} decoder layers; cache layers: {listed}.",
        "Review it before use: parallel, max_model_len and the memory budget are deployment "
        "choices, and each layer type should match how your engine serves the model.", notes)


def state_pages(source: dict[str, Any], options: InitOptions) -> tuple[int, int] | None:
    """``(attention bytes per token, state page bytes)`` per rank of a source
    with state layers, as the compiler sizes them (quantization included);
    None without attention or state layers. The largest of each, as vLLM's
    ``Platform._align_hybrid_block_size`` takes the model's one of each."""
    expanded = run_until(SourceText(text=_dump(source), file=options.config_name), Expanded)
    specs = [s for stage in expanded.expansion.stage_specs for s in stage.values()]
    per_token = [s.page_size_bytes // s.block_size for s in specs
                 if isinstance(s, Attention) and s.tokens_per_state == 1]
    states = [s.unpadded_page_size_bytes for s in specs if isinstance(s, MambaState)]
    if not per_token or not states:
        return None
    return max(per_token), max(states)


def source_text(facts: ModelFacts, config: Mapping[str, Any], options: InitOptions) -> str:
    """The reviewed-to-be source text for ``facts``, after the engine's
    config-stage rules (:mod:`kvspec.integrations.rules`); it compiles."""
    target = _target(options)
    asked, block_notes = options, list[str]()
    if options.block_size is None:  # the engine's choice: vLLM's default, or the MLA backend's
        block, block_notes = _engine_block_size(facts, config, options, target)
        options = dataclasses.replace(options, block_size=block)
    hyb = None
    if any(layer.kind == STATE for layer in facts.layers):
        draft, _ = source_data(facts, config, options)
        head_k = text_config(config).get("linear_key_head_dim")
        pages = _compiling(lambda: state_pages(draft, options), options)
        hyb = hybrid(facts, pages, options, target, head_k)
    source, notes = source_data(facts, config, options, hyb)
    text = _header(facts, asked, block_notes + notes) + _dump(source)
    _compiling(lambda: compile_source(text, f"<init {options.config_name}>"), options)
    return text


def _engine_block_size(facts: ModelFacts, config: Mapping[str, Any], options: InitOptions,
                       target: rules.Target) -> tuple[int, list[str]]:
    """The block size vLLM sets when none is given, and the note that says why: 16, or
    for an MLA model what its attention backend on ``target`` takes
    (:mod:`kvspec.integrations.mla_backend`)."""
    if not any(layer.kind == LATENT for layer in facts.layers):
        return DEFAULT_BLOCK_SIZE, []
    nope = text_config(config).get("qk_nope_head_dim")
    nope = nope if isinstance(nope, int) and not isinstance(nope, bool) else None
    chosen = mla_backend(target, options.kv_cache_dtype, nope)
    block = chosen[1] if chosen is not None else DEFAULT_BLOCK_SIZE
    return block, [mla_block_note(target, options.kv_cache_dtype, nope, block)]


def _compiling(step: Callable[[], T], options: InitOptions) -> T:
    """``step()``, which compiles (some of) the source made: its errors say so."""
    try:
        return step()
    except ErrorList as err:
        raise _not_compiling(err, [e.message for e in err.errors], options) from None
    except KvspecError as err:
        raise _not_compiling(err, [err.message], options) from None


def _target(options: InitOptions) -> rules.Target:
    try:
        return rules.target(options.target)
    except ValueError as exc:
        raise KvspecError(str(exc), path="--target", found=options.target,
                          hint="the GPU the deployment runs on decides some engine "
                          "settings; see docs/engine-rules.md") from None


def _not_compiling(err: KvspecError, messages: list[str], options: InitOptions) -> KvspecError:
    return KvspecError(
        "the source made from this config does not compile: " + "; ".join(messages),
        file=options.config_name, expected=err.expected, found=err.found,
        hint=err.hint or "check --tp, --max-model-len and --memory")


def init_source(config: Mapping[str, Any], options: InitOptions, *,
                text: str | None = None) -> str:
    """``config.json`` (parsed) -> source text; raise :class:`KvspecError` on bad
    input, at its line and column in ``text`` (the file's text) when given."""
    if not isinstance(config, Mapping):
        raise not_an_object(config, options.config_name)
    target = _target(options)
    try:
        heads = text_config(config).get("num_attention_heads")
        if isinstance(heads, int) and not isinstance(heads, bool) and heads > 0:
            rules.tensor_parallel(heads, options.tp)
        facts = describe(config, tp=options.tp, dtype=options.dtype, target=target,
                         mamba_cache_dtype=options.mamba_cache_dtype,
                         mamba_ssm_cache_dtype=options.mamba_ssm_cache_dtype)
        if options.dtype is not None:
            rules.check_dtype(options.dtype, facts.model_type)
    except UnsupportedModelError as exc:
        raise KvspecError(str(exc), file=options.config_name,
                          hint="write the source by hand (see layouts/ for examples), or "
                          "import a per-layer spec dump with `kvspec import`") from None
    except rules.EngineRefusal as exc:
        raise KvspecError(f"vLLM 0.33.0 refuses this config: {exc}", file=options.config_name,
                          hint=exc.hint) from None
    except ConfigError as exc:
        raise config_error(exc, config, options.config_name, text) from None
    except ValueError as exc:
        raise KvspecError(f"cannot read the model from config.json: {exc}",
                          file=options.config_name,
                          hint="check --tp: heads and state dimensions must split evenly "
                          "over the tensor-parallel ranks") from None
    try:
        return source_text(facts, config, options)
    except ConfigError as exc:
        raise config_error(exc, config, options.config_name, text) from None
