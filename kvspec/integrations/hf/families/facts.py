"""The facts a family reads from a config, and the helpers every family shares."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvspec.model import kinds
from kvspec.model.specs import (
    MLA,
    ChunkedLocal,
    FullAttention,
    MambaState,
    SlidingWindow,
)

#: The layer kinds a family emits, named by the registry (:mod:`kvspec.model.kinds`).
FULL = kinds.of(FullAttention).name
SLIDING = kinds.of(SlidingWindow).name
CHUNKED = kinds.of(ChunkedLocal).name
LATENT = kinds.of(MLA).name
STATE = kinds.of(MambaState).name


class UnsupportedModelError(ValueError):
    """The config's architecture is not one kvspec knows how to import."""


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


def cfg_get(cfg: Mapping[str, Any], key: str, default: Any = None) -> Any:
    """``cfg[key]`` treating an explicit JSON ``null`` like a missing key."""
    value = cfg.get(key)
    return default if value is None else value


def cfg_require(cfg: Mapping[str, Any], key: str) -> Any:
    value = cfg.get(key)
    if value is None:
        raise ValueError(f"config.json has no {key!r}, which this model family needs")
    return value


def cfg_int(cfg: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = cfg.get(key)
    if value is None:
        if default is None:
            raise ValueError(f"config.json has no {key!r}, which this model family needs")
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"config.json field {key!r} must be an integer, got {value!r}")
    return value


def head_dim_of(cfg: Mapping[str, Any], *keys: str) -> int:
    """Explicit head dim (first of ``keys``/``head_dim`` present), else hidden / heads."""
    for key in (*keys, "head_dim"):
        if cfg.get(key) is not None:
            return cfg_int(cfg, key)
    hidden = cfg_int(cfg, "hidden_size")
    heads = cfg_int(cfg, "num_attention_heads")
    if hidden % heads:
        raise ValueError(f"hidden_size {hidden} is not divisible by num_attention_heads {heads}")
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
            if isinstance(value, str):
                return value.removeprefix("torch.")
    return None


def architecture(config: Mapping[str, Any]) -> str | None:
    """The config's first ``architectures`` entry (vLLM's ``model_config.architecture``)."""
    archs = config.get("architectures") or []
    return str(archs[0]) if archs else None


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    text = config.get("text_config")
    return text if isinstance(text, Mapping) else config


def layer_types(cfg: Mapping[str, Any], num_layers: int) -> list[str] | None:
    types = cfg.get("layer_types")
    if types is None:
        return None
    if not isinstance(types, list) or len(types) != num_layers:
        raise ValueError(
            f"layer_types must list one entry per layer ({num_layers}), got {types!r}"
        )
    return [str(t) for t in types]


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
            raise ValueError(f"layer {i}: unsupported layer type {layer_type!r}")
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
