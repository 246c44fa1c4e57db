"""Per-layer KV-cache facts from a Hugging Face ``config.json``, per model family.

:func:`describe` turns a parsed ``config.json`` (a plain ``dict``) into the
facts kvspec needs to lay out the cache: for every layer that holds cache
state, what kind of layer it is (full attention, sliding window, chunked
local attention, MLA, or a Mamba-style recurrent layer), its KV heads and head
size, its window, and -- for recurrent layers -- the per-rank state shapes and
dtypes.  It is pure and torch-free; it does not import ``transformers``.

Which layer is which follows vLLM's model code (files under
``vllm/model_executor/models/``), which in turn reads the fields that
``transformers`` derives when it loads the config.  Where ``config.json`` leaves
a field out, the ``transformers`` configuration-class default is used and the
function says so in its docstring.  The vLLM behaviour followed, per family:

* Llama / Mistral -- ``llama.py`` (``MistralForCausalLM`` is served by the Llama
  implementation): every layer full attention, unless ``layer_types`` marks a
  layer ``sliding_attention``; a Mistral config with a non-null
  ``sliding_window`` and no ``layer_types`` slides on every layer (vLLM applies
  the model-level window from ``ModelConfig.get_sliding_window``).
* Qwen2 / Qwen3 -- ``qwen2.py`` / ``qwen3.py``: full attention unless
  ``use_sliding_window`` is true (``ModelConfig.get_hf_config_sliding_window``
  returns ``None`` otherwise); then layers ``i >= max_window_layers`` slide, as
  in ``transformers``' ``Qwen2Config.layer_types``.
* Gemma 2 -- ``gemma2.py``: even layers slide (``layer_types`` when present).
* Gemma 3 -- ``gemma3.py`` / ``gemma3_mm.py``: ``layer_types`` when present, else
  every ``sliding_window_pattern``-th layer (default 6) is global.
* gpt-oss -- ``gpt_oss.py``: ``layer_types`` (even layers slide).
* Llama 4 -- ``llama4.py``: a layer is NoPE when ``no_rope_layers[i] == 0``;
  NoPE layers are global, the others use ``ChunkedLocalAttention`` with
  ``attention_chunk_size``.  An empty ``no_rope_layers`` means every 4th layer
  is NoPE (``Llama4TextConfig``'s ``no_rope_layer_interval``).
* DeepSeek V2 / V3 -- ``deepseek_v2.py`` with MLA: one latent KV "head" of
  ``kv_lora_rank + qk_rope_head_dim`` per token on every layer.
* Jamba -- ``jamba.py``: layer ``i`` is attention iff
  ``i % attn_layer_period == attn_layer_offset``, else a Mamba-1 mixer
  (``JambaForCausalLM.get_mamba_state_shape_from_config``).
* Qwen3-Next -- ``qwen3_next.py``: ``layer_types`` (``linear_attention`` is a
  Gated DeltaNet layer, vLLM ``mamba_type`` ``"gdn_attention"``), else every
  ``full_attention_interval``-th layer is full attention.
* Nemotron-H -- ``nemotron_h.py``: ``hybrid_override_pattern``: ``M`` Mamba-2,
  ``*`` attention, ``-`` MLP and ``E`` MoE (no cache state, so not listed).
  When ``mamba_ssm_cache_dtype`` is ``"auto"``, vLLM's
  ``NemotronHForCausalLMConfig`` (``models/config.py``) replaces it with the
  config's ``mamba_ssm_cache_dtype`` or ``"float32"``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from kvspec.hf import state_shapes as ss

__all__ = [
    "LAYER_KINDS",
    "SUPPORTED_FAMILIES",
    "LayerFacts",
    "ModelFacts",
    "UnsupportedModelError",
    "describe",
    "family_of",
]

LayerKind = Literal["full_attention", "sliding_window", "chunked_local", "mla", "mamba"]
LAYER_KINDS: tuple[str, ...] = (
    "full_attention",
    "sliding_window",
    "chunked_local",
    "mla",
    "mamba",
)


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
    kind: LayerKind
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
    ``torch_dtype`` (or the newer ``dtype`` key; for nested configs the text
    config's, else the top level's), or ``None`` when the config names none --
    gpt-oss's does not, and vLLM then picks the serving dtype itself.
    """

    family: str
    model_type: str
    num_layers: int
    dtype: str | None
    max_position_embeddings: int | None
    layers: list[LayerFacts]

    def count_by_kind(self) -> dict[str, int]:
        """Number of layers of each kind present, e.g. ``{"mamba": 54, ...}``."""
        return dict(Counter(layer.kind for layer in self.layers))

    def layers_of_kind(self, kind: str) -> list[LayerFacts]:
        return [layer for layer in self.layers if layer.kind == kind]


# --------------------------------------------------------------------------
# config access helpers
# --------------------------------------------------------------------------


def _get(cfg: Mapping[str, Any], key: str, default: Any = None) -> Any:
    """``cfg[key]`` treating an explicit JSON ``null`` like a missing key."""
    value = cfg.get(key)
    return default if value is None else value


def _require(cfg: Mapping[str, Any], key: str) -> Any:
    value = cfg.get(key)
    if value is None:
        raise ValueError(f"config.json has no {key!r}, which this model family needs")
    return value


def _int(cfg: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = cfg.get(key)
    if value is None:
        if default is None:
            raise ValueError(f"config.json has no {key!r}, which this model family needs")
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"config.json field {key!r} must be an integer, got {value!r}")
    return value


def _head_dim(cfg: Mapping[str, Any], *keys: str) -> int:
    """Explicit head dim (first of ``keys``/``head_dim`` present), else hidden / heads."""
    for key in (*keys, "head_dim"):
        if cfg.get(key) is not None:
            return _int(cfg, key)
    hidden = _int(cfg, "hidden_size")
    heads = _int(cfg, "num_attention_heads")
    if hidden % heads:
        raise ValueError(f"hidden_size {hidden} is not divisible by num_attention_heads {heads}")
    return hidden // heads


def _kv_heads(cfg: Mapping[str, Any]) -> int:
    return _int(cfg, "num_key_value_heads", _int(cfg, "num_attention_heads"))


def _dtype(text: Mapping[str, Any], top: Mapping[str, Any]) -> str | None:
    for cfg in (text, top):
        for key in ("torch_dtype", "dtype"):
            value = cfg.get(key)
            if isinstance(value, str):
                return value.removeprefix("torch.")
    return None


def _text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    text = config.get("text_config")
    return text if isinstance(text, Mapping) else config


def _layer_types(cfg: Mapping[str, Any], num_layers: int) -> list[str] | None:
    types = cfg.get("layer_types")
    if types is None:
        return None
    if not isinstance(types, list) or len(types) != num_layers:
        raise ValueError(
            f"layer_types must list one entry per layer ({num_layers}), got {types!r}"
        )
    return [str(t) for t in types]


def _attention(
    index: int,
    cfg: Mapping[str, Any],
    *,
    sliding_window: int | None = None,
    chunk: int | None = None,
    head_size: int | None = None,
) -> LayerFacts:
    kind: LayerKind = "full_attention"
    if sliding_window is not None:
        kind = "sliding_window"
    elif chunk is not None:
        kind = "chunked_local"
    return LayerFacts(
        index=index,
        kind=kind,
        num_kv_heads=_kv_heads(cfg),
        head_size=head_size if head_size is not None else _head_dim(cfg),
        sliding_window=sliding_window,
        attention_chunk_size=chunk,
    )


def _from_layer_types(cfg: Mapping[str, Any], types: list[str]) -> list[LayerFacts]:
    layers = []
    for i, layer_type in enumerate(types):
        if layer_type == "sliding_attention":
            layers.append(_attention(i, cfg, sliding_window=_int(cfg, "sliding_window")))
        elif layer_type == "full_attention":
            layers.append(_attention(i, cfg))
        else:
            raise ValueError(f"layer {i}: unsupported layer type {layer_type!r}")
    return layers


@dataclass(frozen=True)
class _Ctx:
    config: Mapping[str, Any]
    text: Mapping[str, Any]
    tp: int
    dtype: str | None
    mamba_cache_dtype: str
    mamba_ssm_cache_dtype: str


# --------------------------------------------------------------------------
# families
# --------------------------------------------------------------------------


def _llama_like(ctx: _Ctx) -> list[LayerFacts]:
    """Llama and Mistral (vLLM ``llama.py``).

    ``layer_types`` wins when present.  Otherwise a non-null ``sliding_window``
    (Mistral 7B v0.1: 4096) slides on every layer -- vLLM passes the model-level
    window to every ``Attention`` layer -- and a null one means full attention.
    """
    cfg = ctx.text
    n = _int(cfg, "num_hidden_layers")
    types = _layer_types(cfg, n)
    if types is not None:
        return _from_layer_types(cfg, types)
    window = _get(cfg, "sliding_window")
    return [_attention(i, cfg, sliding_window=window) for i in range(n)]


def _qwen(ctx: _Ctx) -> list[LayerFacts]:
    """Qwen2 / Qwen3 (vLLM ``qwen2.py``, ``qwen3.py``).

    ``layer_types`` when present.  Otherwise the window applies only when
    ``use_sliding_window`` is true (vLLM's ``get_hf_config_sliding_window``
    drops it otherwise -- Qwen2.5 ships ``sliding_window: 131072`` with
    ``use_sliding_window: false``), and then only to layers
    ``i >= max_window_layers`` (``Qwen2Config.layer_types``; default 28).
    """
    cfg = ctx.text
    n = _int(cfg, "num_hidden_layers")
    types = _layer_types(cfg, n)
    if types is not None:
        return _from_layer_types(cfg, types)
    window = _get(cfg, "sliding_window") if cfg.get("use_sliding_window") else None
    first_sliding = _int(cfg, "max_window_layers", 28)
    return [
        _attention(i, cfg, sliding_window=window if i >= first_sliding else None)
        for i in range(n)
    ]


def _gemma2(ctx: _Ctx) -> list[LayerFacts]:
    """Gemma 2 (vLLM ``gemma2.py``): even layers use the sliding window.

    ``Gemma2Config`` derives ``layer_types`` as sliding for even ``i``;
    ``sliding_window`` defaults to 4096 there.
    """
    cfg = ctx.text
    n = _int(cfg, "num_hidden_layers")
    types = _layer_types(cfg, n)
    if types is not None:
        return _from_layer_types(cfg, types)
    window = _int(cfg, "sliding_window", 4096)
    return [_attention(i, cfg, sliding_window=window if i % 2 == 0 else None) for i in range(n)]


# transformers ``Gemma3TextConfig`` defaults used when ``text_config`` omits a
# field (google/gemma-3-27b-it's config.json only lists non-default values).
_GEMMA3_TEXT_DEFAULTS: dict[str, Any] = {
    "head_dim": 256,
    "num_key_value_heads": 4,
    "num_attention_heads": 8,
    "sliding_window": 4096,
    "sliding_window_pattern": 6,
    "max_position_embeddings": 131072,
}


def _gemma3(ctx: _Ctx) -> list[LayerFacts]:
    """Gemma 3 (vLLM ``gemma3.py``; the multimodal checkpoint nests ``text_config``).

    ``layer_types`` when present; otherwise layer ``i`` is global when
    ``(i + 1) % sliding_window_pattern == 0`` (``Gemma3TextConfig``), i.e. five
    sliding layers then one global layer.  Missing fields take the
    ``Gemma3TextConfig`` defaults in ``_GEMMA3_TEXT_DEFAULTS``.
    """
    cfg = {**_GEMMA3_TEXT_DEFAULTS, **{k: v for k, v in ctx.text.items() if v is not None}}
    n = _int(cfg, "num_hidden_layers")
    types = _layer_types(cfg, n)
    if types is not None:
        return _from_layer_types(cfg, types)
    pattern = _int(cfg, "sliding_window_pattern")
    if "_sliding_window_pattern" in cfg:
        pattern = _int(cfg, "_sliding_window_pattern")
    window = _int(cfg, "sliding_window")
    return [
        _attention(i, cfg, sliding_window=None if (i + 1) % pattern == 0 else window)
        for i in range(n)
    ]


def _gpt_oss(ctx: _Ctx) -> list[LayerFacts]:
    """gpt-oss (vLLM ``gpt_oss.py``): ``layer_types``; without it, even layers slide."""
    cfg = ctx.text
    n = _int(cfg, "num_hidden_layers")
    types = _layer_types(cfg, n)
    if types is not None:
        return _from_layer_types(cfg, types)
    window = _int(cfg, "sliding_window", 128)
    return [_attention(i, cfg, sliding_window=window if i % 2 == 0 else None) for i in range(n)]


def _llama4(ctx: _Ctx) -> list[LayerFacts]:
    """Llama 4 (vLLM ``llama4.py``, ``Llama4Attention``).

    ``nope = no_rope_layers[i] == 0``; NoPE layers are plain (global)
    ``Attention``, the rest ``ChunkedLocalAttention(attention_chunk_size)``
    when ``attention_chunk_size`` is set.  ``Llama4TextConfig`` replaces an
    empty ``no_rope_layers`` with ``int((i + 1) % 4 != 0)`` -- every 4th layer
    is NoPE/global.
    """
    cfg = ctx.text
    n = _int(cfg, "num_hidden_layers")
    no_rope = cfg.get("no_rope_layers") or [int((i + 1) % 4 != 0) for i in range(n)]
    if len(no_rope) != n:
        raise ValueError(f"no_rope_layers must list {n} entries, got {len(no_rope)}")
    chunk = _get(cfg, "attention_chunk_size")
    return [
        _attention(i, cfg, chunk=None if no_rope[i] == 0 else chunk) for i in range(n)
    ]


def _deepseek(ctx: _Ctx) -> list[LayerFacts]:
    """DeepSeek V2 / V3 with MLA (vLLM ``deepseek_v2.py``).

    Every decoder layer caches one latent vector per token: a single KV "head"
    of ``kv_lora_rank + qk_rope_head_dim`` (512 + 64 = 576).  V is not cached
    separately.  The MTP layers (``num_nextn_predict_layers``) belong to the
    speculative drafter, not this model, and are not listed.
    """
    cfg = ctx.text
    n = _int(cfg, "num_hidden_layers")
    rank = _int(cfg, "kv_lora_rank")
    rope = _int(cfg, "qk_rope_head_dim")
    return [
        LayerFacts(
            index=i,
            kind="mla",
            num_kv_heads=1,
            head_size=rank + rope,
            mla_kv_lora_rank=rank,
            mla_rope_dim=rope,
        )
        for i in range(n)
    ]


def _mamba_layer(
    index: int, mamba_type: str, shapes: tuple[tuple[int, ...], ...], ctx: _Ctx, ssm_dtype: str
) -> LayerFacts:
    if ctx.dtype is None and "auto" in (ctx.mamba_cache_dtype, ssm_dtype):
        raise ValueError(
            "config.json names no torch_dtype, so the 'auto' state-cache dtype is unknown; "
            "pass mamba_cache_dtype and mamba_ssm_cache_dtype explicitly"
        )
    return LayerFacts(
        index=index,
        kind="mamba",
        num_kv_heads=None,
        head_size=None,
        state_shapes=shapes,
        state_dtypes=ss.state_dtypes(
            mamba_type, ctx.dtype or "float32", ctx.mamba_cache_dtype, ssm_dtype
        ),
        mamba_type=mamba_type,
    )


def _jamba(ctx: _Ctx) -> list[LayerFacts]:
    """Jamba (vLLM ``jamba.py``).

    ``JambaConfig.layers_block_type``: attention iff
    ``i % attn_layer_period == attn_layer_offset`` (defaults 8 and 4), else a
    Mamba-1 mixer whose state is ``mamba1_state_shape`` with
    ``intermediate_size = mamba_expand * hidden_size``, ``state_size =
    mamba_d_state``, ``conv_kernel = mamba_d_conv`` (defaults 2, 16, 4).
    """
    cfg = ctx.text
    n = _int(cfg, "num_hidden_layers")
    period = _int(cfg, "attn_layer_period", 8)
    offset = _int(cfg, "attn_layer_offset", 4)
    shapes = ss.mamba1_state_shape(
        tp_world_size=ctx.tp,
        intermediate_size=_int(cfg, "mamba_expand", 2) * _int(cfg, "hidden_size"),
        state_size=_int(cfg, "mamba_d_state", 16),
        conv_kernel=_int(cfg, "mamba_d_conv", 4),
    )
    layers = []
    for i in range(n):
        if i % period == offset:
            layers.append(_attention(i, cfg))
        else:
            layers.append(_mamba_layer(i, "mamba1", shapes, ctx, ctx.mamba_ssm_cache_dtype))
    return layers


def _qwen3_next(ctx: _Ctx) -> list[LayerFacts]:
    """Qwen3-Next (vLLM ``qwen3_next.py``).

    ``layer_types`` when present, else ``Qwen3NextConfig``'s derivation: full
    attention when ``(i + 1) % full_attention_interval == 0`` (default 4),
    ``linear_attention`` otherwise.  Linear layers are Gated DeltaNet, state from
    ``gated_delta_net_state_shape(tp, linear_num_key_heads,
    linear_num_value_heads, linear_key_head_dim, linear_value_head_dim,
    linear_conv_kernel_dim)``.
    """
    cfg = ctx.text
    n = _int(cfg, "num_hidden_layers")
    types = _layer_types(cfg, n)
    if types is None:
        interval = _int(cfg, "full_attention_interval", 4)
        types = [
            "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)
        ]
    shapes = ss.gated_delta_net_state_shape(
        tp_world_size=ctx.tp,
        num_k_heads=_int(cfg, "linear_num_key_heads"),
        num_v_heads=_int(cfg, "linear_num_value_heads"),
        head_k_dim=_int(cfg, "linear_key_head_dim"),
        head_v_dim=_int(cfg, "linear_value_head_dim"),
        conv_kernel_size=_int(cfg, "linear_conv_kernel_dim"),
    )
    layers = []
    for i, layer_type in enumerate(types):
        if layer_type == "full_attention":
            layers.append(_attention(i, cfg))
        elif layer_type == "linear_attention":
            layers.append(
                _mamba_layer(i, "gdn_attention", shapes, ctx, ctx.mamba_ssm_cache_dtype)
            )
        else:
            raise ValueError(f"layer {i}: unsupported Qwen3-Next layer type {layer_type!r}")
    return layers


def _nemotron_h(ctx: _Ctx) -> list[LayerFacts]:
    """Nemotron-H (vLLM ``nemotron_h.py``).

    ``hybrid_override_pattern`` has one character per layer: ``M`` Mamba-2,
    ``*`` attention, ``-`` MLP, ``E`` MoE (the last two hold no cache).
    Mamba state: ``mamba2_state_shape`` with ``intermediate_size =
    mamba_num_heads * mamba_head_dim``, ``n_groups``, ``num_heads =
    mamba_num_heads``, ``head_dim = mamba_head_dim``, ``state_size =
    ssm_state_size``, ``conv_kernel``.  The attention head size is ``head_dim``
    (older configs: ``attention_head_dim``).  SSM-state dtype: see the module
    docstring (float32 unless the config or the caller says otherwise).
    """
    cfg = ctx.text
    n = _int(cfg, "num_hidden_layers")
    pattern = str(_require(cfg, "hybrid_override_pattern"))
    if len(pattern) != n:
        raise ValueError(
            f"hybrid_override_pattern has {len(pattern)} entries for {n} layers"
        )
    heads = _int(cfg, "mamba_num_heads")
    head_dim = _int(cfg, "mamba_head_dim")
    shapes = ss.mamba2_state_shape(
        tp_world_size=ctx.tp,
        intermediate_size=heads * head_dim,
        n_groups=_int(cfg, "n_groups"),
        num_heads=heads,
        head_dim=head_dim,
        state_size=_int(cfg, "ssm_state_size"),
        conv_kernel=_int(cfg, "conv_kernel"),
    )
    ssm_dtype = ctx.mamba_ssm_cache_dtype
    if ssm_dtype == "auto":
        ssm_dtype = _get(cfg, "mamba_ssm_cache_dtype", "float32")
    attn_head = _head_dim(cfg, "head_dim", "attention_head_dim")
    layers = []
    for i, char in enumerate(pattern):
        if char == "M":
            layers.append(_mamba_layer(i, "mamba2", shapes, ctx, ssm_dtype))
        elif char == "*":
            layers.append(_attention(i, cfg, head_size=attn_head))
        elif char in "-E":
            continue
        else:
            raise ValueError(f"layer {i}: unknown hybrid_override_pattern symbol {char!r}")
    return layers


# --------------------------------------------------------------------------
# dispatch
# --------------------------------------------------------------------------

_Handler = Callable[[_Ctx], list[LayerFacts]]

# family -> (display name, handler, model_types, architectures)
_FAMILIES: dict[str, tuple[str, _Handler, tuple[str, ...], tuple[str, ...]]] = {
    "llama": ("Llama", _llama_like, ("llama",), ("LlamaForCausalLM",)),
    "mistral": ("Mistral", _llama_like, ("mistral",), ("MistralForCausalLM",)),
    "qwen2": ("Qwen2", _qwen, ("qwen2",), ("Qwen2ForCausalLM",)),
    "qwen3": ("Qwen3", _qwen, ("qwen3",), ("Qwen3ForCausalLM",)),
    "gemma2": ("Gemma 2", _gemma2, ("gemma2",), ("Gemma2ForCausalLM",)),
    "gemma3": (
        "Gemma 3",
        _gemma3,
        ("gemma3", "gemma3_text"),
        ("Gemma3ForConditionalGeneration", "Gemma3ForCausalLM"),
    ),
    "gpt_oss": ("gpt-oss", _gpt_oss, ("gpt_oss",), ("GptOssForCausalLM",)),
    "llama4": (
        "Llama 4",
        _llama4,
        ("llama4", "llama4_text"),
        ("Llama4ForConditionalGeneration", "Llama4ForCausalLM"),
    ),
    "deepseek_v2": ("DeepSeek V2", _deepseek, ("deepseek_v2",), ("DeepseekV2ForCausalLM",)),
    "deepseek_v3": ("DeepSeek V3", _deepseek, ("deepseek_v3",), ("DeepseekV3ForCausalLM",)),
    "jamba": ("Jamba", _jamba, ("jamba",), ("JambaForCausalLM",)),
    "qwen3_next": ("Qwen3-Next", _qwen3_next, ("qwen3_next",), ("Qwen3NextForCausalLM",)),
    "nemotron_h": ("Nemotron-H", _nemotron_h, ("nemotron_h",), ("NemotronHForCausalLM",)),
}

SUPPORTED_FAMILIES: tuple[str, ...] = tuple(_FAMILIES)


def _supported_names() -> str:
    return ", ".join(display for display, *_ in _FAMILIES.values())


def family_of(config: Mapping[str, Any]) -> str:
    """The kvspec family key for ``config`` (by ``model_type``, then ``architectures``).

    Raises :class:`UnsupportedModelError` naming the supported families.
    """
    model_type = config.get("model_type")
    for family, (_, _, model_types, _) in _FAMILIES.items():
        if model_type in model_types:
            return family
    architectures = config.get("architectures") or []
    for family, (_, _, _, archs) in _FAMILIES.items():
        if any(arch in archs for arch in architectures):
            return family
    found = f"model_type {model_type!r}, architectures {list(architectures)!r}"
    raise UnsupportedModelError(
        f"unsupported model ({found}); kvspec init supports these families: {_supported_names()}"
    )


def describe(
    config: Mapping[str, Any],
    *,
    tp: int = 1,
    mamba_cache_dtype: str = "auto",
    mamba_ssm_cache_dtype: str = "auto",
) -> ModelFacts:
    """Per-layer cache facts for a parsed Hugging Face ``config.json``.

    ``tp`` is the tensor-parallel size; it only changes ``state_shapes`` (which
    are per rank).  ``mamba_cache_dtype`` / ``mamba_ssm_cache_dtype`` mirror
    vLLM's ``--mamba-cache-dtype`` / ``--mamba-ssm-cache-dtype``.
    """
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a mapping (a parsed config.json), got {type(config)}")
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tp must be a positive integer, got {tp!r}")
    family = family_of(config)
    _, handler, _, _ = _FAMILIES[family]
    text = _text_config(config)
    ctx = _Ctx(
        config=config,
        text=text,
        tp=tp,
        dtype=_dtype(text, config),
        mamba_cache_dtype=mamba_cache_dtype,
        mamba_ssm_cache_dtype=mamba_ssm_cache_dtype,
    )
    layers = handler(ctx)
    max_pos = text.get("max_position_embeddings")
    if max_pos is None and family == "gemma3":
        max_pos = _GEMMA3_TEXT_DEFAULTS["max_position_embeddings"]
    return ModelFacts(
        family=family,
        model_type=str(config.get("model_type") or text.get("model_type") or family),
        num_layers=_int(text, "num_hidden_layers"),
        dtype=ctx.dtype,
        max_position_embeddings=max_pos,
        layers=layers,
    )
