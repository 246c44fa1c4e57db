"""The facts a family reads from a config, and the helpers every family shares."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvspec.model import kinds
from kvspec.model.dtypes import DTYPE_SIZES, canonical_dtype
from kvspec.model.specs import (
    MLA,
    ChunkedLocal,
    FullAttention,
    MambaState,
    SlidingWindow,
)
from kvspec.source.layers import MAX_LAYERS
from kvspec.source.schema import MAX_TOKENS

#: The layer kinds a family emits, named by the registry (:mod:`kvspec.model.kinds`).
FULL = kinds.of(FullAttention).name
SLIDING = kinds.of(SlidingWindow).name
CHUNKED = kinds.of(ChunkedLocal).name
LATENT = kinds.of(MLA).name
STATE = kinds.of(MambaState).name


class UnsupportedModelError(ValueError):
    """The config's architecture is not one kvspec knows how to import."""


#: What a config that kvspec reads wrong most likely is.
_HINT = ("give the model's config.json as the Hugging Face Hub has it; a field edited "
         "by hand must keep its type")


class ConfigError(ValueError):
    """A ``config.json`` value kvspec cannot read: where it is (``cfg``, the
    mapping it was read from, and ``path`` inside it), what was expected, what
    was found and a hint. :func:`kvspec.integrations.hf.config.config_error`
    places it in the file."""

    def __init__(self, message: str, cfg: Mapping[str, Any], path: tuple[str | int, ...], *,
                 expected: str | None = None, found: Any = None,
                 hint: str | None = _HINT) -> None:
        super().__init__(message)
        self.message, self.cfg, self.path = message, cfg, path
        self.expected, self.hint = expected, hint
        self.found = None if found is None else shown(found)


def shown(value: Any) -> str:
    """A config value as its JSON reads (cut to 80 characters)."""
    try:
        text = json.dumps(value, allow_nan=True)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


@dataclass(frozen=True)
class LayerFacts:
    """One layer that holds cache state.

    ``num_kv_heads`` is the model's global KV-head count (not divided by
    tensor parallelism); ``state_shapes`` are per rank.  Fields that do not
    apply to the layer's kind are ``None``.  ``head_size_v`` is ``None`` when V
    has the same head size as K.
    """

    index: int
    #: A layer kind's name (:mod:`kvspec.model.kinds`): :data:`FULL`, :data:`STATE`, ...
    kind: str
    num_kv_heads: int | None
    head_size: int | None
    head_size_v: int | None = None
    sliding_window: int | None = None
    attention_chunk_size: int | None = None
    mla_kv_lora_rank: int | None = None
    mla_rope_dim: int | None = None
    state_shapes: tuple[tuple[int, ...], ...] | None = None
    state_dtypes: tuple[str, ...] | None = None
    mamba_type: str | None = None


@dataclass(frozen=True)
class ModelFacts:
    """What :func:`describe` found.

    ``num_layers`` is the config's ``num_hidden_layers``; ``layers`` lists only
    the layers that hold cache state (Nemotron-H's MLP/MoE-only layers hold
    none), each with its index in the model.  ``dtype`` is the config's
    ``dtype`` (``torch_dtype`` in older files; the top level's, else the text
    config's), or ``None`` when the config names none -- gpt-oss's does not.
    ``served_dtype`` is the dtype vLLM serves it in
    (:func:`kvspec.integrations.rules.served_dtype`: a float32 or unnamed
    checkpoint is served in bf16), or the caller's; state dtypes follow it.
    """

    family: str
    model_type: str
    num_layers: int
    dtype: str | None
    max_position_embeddings: int | None
    layers: list[LayerFacts]
    served_dtype: str = "bfloat16"
    architecture: str | None = None

    def count_by_kind(self) -> dict[str, int]:
        """Number of layers of each kind present, e.g. ``{"mamba": 54, ...}``."""
        return dict(Counter(layer.kind for layer in self.layers))

    def layers_of_kind(self, kind: str) -> list[LayerFacts]:
        return [layer for layer in self.layers if layer.kind == kind]


# --------------------------------------------------------------------------
# config access helpers
# --------------------------------------------------------------------------


def _missing(cfg: Mapping[str, Any], key: str, what: str) -> ConfigError:
    return ConfigError(f"config.json has no {key!r}, which this model family needs", cfg,
                       (key,), expected=f"{key}: {what}")


def cfg_require(cfg: Mapping[str, Any], key: str) -> Any:
    value = cfg.get(key)
    if value is None:
        raise _missing(cfg, key, "a value")
    return value


def cfg_int(cfg: Mapping[str, Any], key: str, default: int | None = None, *,
            minimum: int = 1, maximum: int = MAX_TOKENS) -> int:
    """``cfg[key]``, an integer in ``[minimum, maximum]`` (by default at most
    what a source's integers may be); ``default`` when it is missing or null
    (required when ``default`` is None)."""
    value = cfg.get(key)
    if value is None:
        if default is None:
            raise _missing(cfg, key, "an integer")
        return default
    if type(value) is int and minimum <= value <= maximum:
        return value
    bounds = f"an integer of at least {minimum} and at most {maximum:,}"
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"config.json field {key!r} must be an integer", cfg, (key,),
                          expected=bounds, found=value)
    if value < minimum or value > maximum:
        raise ConfigError(f"config.json field {key!r} is out of range", cfg, (key,),
                          expected=bounds, found=value)
    return value


def cfg_opt_int(cfg: Mapping[str, Any], key: str, *, minimum: int = 1) -> int | None:
    """``cfg[key]`` as :func:`cfg_int` reads it, or None when missing or null."""
    return None if cfg.get(key) is None else cfg_int(cfg, key, minimum=minimum)


def cfg_list(cfg: Mapping[str, Any], key: str, length: int, item: type,
             what: str) -> list[Any] | None:
    """``cfg[key]``: a list of ``length`` items of type ``item`` (``what`` says
    what they are), or None when missing or null."""
    value = cfg.get(key)
    if value is None:
        return None
    expected = f"a list of {length:,} {what}, one per layer"
    if not isinstance(value, list):
        raise ConfigError(f"config.json field {key!r} must be a list", cfg, (key,),
                          expected=expected, found=value)
    if len(value) != length:
        raise ConfigError(f"config.json field {key!r} lists {len(value):,} entries for "
                          f"{length:,} layers", cfg, (key,), expected=expected,
                          found=f"{len(value):,} entries",
                          hint="num_hidden_layers and this list must agree")
    for i, entry in enumerate(value):
        if isinstance(entry, bool) or not isinstance(entry, item):
            raise ConfigError(f"config.json field {key!r}: entry {i} is not one of the "
                              f"{what}", cfg, (key, i), expected=expected, found=entry)
    return value


def num_layers(cfg: Mapping[str, Any]) -> int:
    """``num_hidden_layers``, at most as many as a source may hold; a config that
    transformers 5 saved for Nemotron-H has none, and one ``layers_block_type``
    entry per layer instead."""
    blocks = cfg.get("layers_block_type")
    if cfg.get("num_hidden_layers") is None and isinstance(blocks, list) and \
            0 < len(blocks) <= MAX_LAYERS:
        return len(blocks)
    return cfg_int(cfg, "num_hidden_layers", maximum=MAX_LAYERS)


def head_dim_of(cfg: Mapping[str, Any], *keys: str) -> int:
    """Explicit head dim (first of ``keys``/``head_dim`` present), else hidden / heads."""
    for key in (*keys, "head_dim"):
        if cfg.get(key) is not None:
            return cfg_int(cfg, key)
    hidden = cfg_int(cfg, "hidden_size")
    heads = cfg_int(cfg, "num_attention_heads")
    if hidden % heads:
        raise ConfigError(f"hidden_size {hidden} is not divisible by num_attention_heads "
                          f"{heads}", cfg, ("hidden_size",),
                          expected="a multiple of num_attention_heads", found=hidden,
                          hint="give head_dim, or check hidden_size and num_attention_heads")
    return hidden // heads


def kv_heads(cfg: Mapping[str, Any]) -> int:
    return cfg_int(cfg, "num_key_value_heads", cfg_int(cfg, "num_attention_heads"))


def model_dtype(config: Mapping[str, Any]) -> str | None:
    """The checkpoint's dtype as vLLM reads it (``ModelArchConfigConvertorBase.get_torch_dtype``):
    the top level's ``dtype`` (``torch_dtype`` in older files), else the text
    config's, else the vision config's; None when none names one."""
    for key in (None, "text_config", "vision_config"):
        cfg = config if key is None else config.get(key)
        if not isinstance(cfg, Mapping):
            continue
        for name in ("dtype", "torch_dtype"):
            value = cfg.get(name)
            if value is None:
                continue
            try:
                return canonical_dtype(value) if isinstance(value, str) else canonical_dtype("")
            except KeyError:
                path = (name,) if key is None else (key, name)
                raise ConfigError(f"config.json field {name!r} names no dtype", config, path,
                                  expected="a torch dtype: " + ", ".join(
                                      d for d in DTYPE_SIZES if d.startswith(("float", "bf"))),
                                  found=value) from None
    return None


def check_config(config: Mapping[str, Any]) -> None:
    """The fields every family reads before its own: ``model_type`` a string,
    ``architectures`` a list of class names, ``text_config`` an object (each
    may be missing or null)."""
    model_type = config.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise ConfigError("config.json field 'model_type' must be a string", config,
                          ("model_type",), expected='a model type, e.g. "llama"',
                          found=model_type)
    archs = config.get("architectures")
    if archs is not None and (not isinstance(archs, list)
                              or not all(isinstance(a, str) for a in archs)):
        raise ConfigError("config.json field 'architectures' must be a list of class names",
                          config, ("architectures",),
                          expected='a list of class names, e.g. ["LlamaForCausalLM"]',
                          found=archs)
    text = config.get("text_config")
    if text is not None and not isinstance(text, Mapping):
        raise ConfigError("config.json field 'text_config' must be an object", config,
                          ("text_config",), expected="the text model's config, an object",
                          found=text)


def architecture(config: Mapping[str, Any]) -> str | None:
    """The config's first ``architectures`` entry (vLLM's ``model_config.architecture``)."""
    check_config(config)
    archs = config.get("architectures") or []
    return archs[0] if archs else None


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    text = config.get("text_config")
    return text if isinstance(text, Mapping) else config


def layer_types(cfg: Mapping[str, Any], num_layers: int) -> list[str] | None:
    return cfg_list(cfg, "layer_types", num_layers, str, "layer types")


def attention_layer(
    index: int,
    cfg: Mapping[str, Any],
    *,
    sliding_window: int | None = None,
    chunk: int | None = None,
    head_size: int | None = None,
) -> LayerFacts:
    kind = FULL
    if sliding_window is not None:
        kind = SLIDING
    elif chunk is not None:
        kind = CHUNKED
    return LayerFacts(
        index=index,
        kind=kind,
        num_kv_heads=kv_heads(cfg),
        head_size=head_size if head_size is not None else head_dim_of(cfg),
        sliding_window=sliding_window,
        attention_chunk_size=chunk,
    )


def from_layer_types(cfg: Mapping[str, Any], types: list[str]) -> list[LayerFacts]:
    layers = []
    for i, layer_type in enumerate(types):
        if layer_type == "sliding_attention":
            layers.append(attention_layer(i, cfg, sliding_window=cfg_int(cfg, "sliding_window")))
        elif layer_type == "full_attention":  # the HF layer type, not the kind
            layers.append(attention_layer(i, cfg))
        else:
            raise ConfigError(f"layer {i}: unsupported layer type {layer_type!r}", cfg,
                              ("layer_types", i),
                              expected='"full_attention" or "sliding_attention"',
                              found=layer_type)
    return layers


@dataclass(frozen=True)
class Ctx:
    config: Mapping[str, Any]
    text: Mapping[str, Any]
    tp: int
    #: The dtype the model is served in (state caches follow it under "auto").
    dtype: str
    mamba_cache_dtype: str
    #: ``--mamba-ssm-cache-dtype`` after the model's own hook (:func:`rules.ssm_cache_dtype`).
    mamba_ssm_cache_dtype: str
