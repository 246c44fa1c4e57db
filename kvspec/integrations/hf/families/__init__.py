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
* Qwen3-MoE -- ``qwen3_moe.py``: full attention unless ``use_sliding_window``,
  then the window on every layer (no ``max_window_layers`` rule there).
* Mixtral, Phi-3 / Phi-4, GLM-4.5 / 4.6 / 4.7, MiniMax-M2 -- ``mixtral.py``,
  ``phi3.py``, ``glm4_moe.py``, ``minimax_m2.py``: the model-level
  ``sliding_window`` on every layer, or none.
* Qwen3.5 / Qwen3.5-MoE -- ``qwen3_5.py``: Qwen3-Next's layers under
  ``text_config``; the multimodal checkpoint nests them under ``language_model.``.

The engine's config-stage rules (:mod:`kvspec.integrations.rules`) decide the
rest: the served dtype (a float32 checkpoint is served in bf16), the SSM-state
dtype hooks (Nemotron-H: the config's ``mamba_ssm_cache_dtype`` or float32;
Qwen3.5: its ``mamba_ssm_dtype``), and the configs vLLM refuses (Qwen2/Qwen3
sliding on some layers only).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kvspec.integrations import rules
from kvspec.integrations.hf.families.dense import (
    GEMMA3_TEXT_DEFAULTS,
    _deepseek,
    _gemma2,
    _gemma3,
    _gpt_oss,
    _llama4,
    _llama_like,
    _model_level_window,
    _qwen,
    _qwen3_moe,
)
from kvspec.integrations.hf.families.facts import (
    Ctx,
    LayerFacts,
    ModelFacts,
    UnsupportedModelError,
    architecture,
    cfg_opt_int,
    check_config,
    model_dtype,
    num_layers,
    text_config,
)
from kvspec.integrations.hf.families.hybrid import (
    _jamba,
    _nemotron_h,
    _qwen3_next,
)

__all__ = [
    "SUPPORTED_FAMILIES",
    "LayerFacts",
    "ModelFacts",
    "UnsupportedModelError",
    "describe",
    "family_of",
    "family_title",
]

# --------------------------------------------------------------------------
# dispatch
# --------------------------------------------------------------------------

_Handler = Callable[[Ctx], list[LayerFacts]]

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
    "qwen3_moe": ("Qwen3-MoE", _qwen3_moe, ("qwen3_moe",), ("Qwen3MoeForCausalLM",)),
    "mixtral": ("Mixtral", _model_level_window, ("mixtral",), ("MixtralForCausalLM",)),
    "phi3": ("Phi-3", _model_level_window, ("phi3",), ("Phi3ForCausalLM",)),
    "qwen3_5": (
        "Qwen3.5",
        _qwen3_next,
        ("qwen3_5", "qwen3_5_text"),
        ("Qwen3_5ForConditionalGeneration", "Qwen3_5ForCausalLM"),
    ),
    "qwen3_5_moe": (
        "Qwen3.5-MoE",
        _qwen3_next,
        ("qwen3_5_moe", "qwen3_5_moe_text"),
        ("Qwen3_5MoeForConditionalGeneration", "Qwen3_5MoeForCausalLM"),
    ),
    "glm4_moe": ("GLM-4.5", _model_level_window, ("glm4_moe",), ("Glm4MoeForCausalLM",)),
    "minimax_m2": ("MiniMax-M2", _model_level_window, ("minimax_m2",), ("MiniMaxM2ForCausalLM",)),
}

SUPPORTED_FAMILIES: tuple[str, ...] = tuple(_FAMILIES)


def _supported_names() -> str:
    return ", ".join(display for display, *_ in _FAMILIES.values())


def family_title(family: str) -> str:
    """A family's display name, e.g. ``family_title("qwen3_5") == "Qwen3.5"``."""
    return _FAMILIES[family][0] if family in _FAMILIES else family


def family_of(config: Mapping[str, Any]) -> str:
    """The kvspec family key for ``config`` (by ``model_type``, then ``architectures``).

    Raises :class:`UnsupportedModelError` naming the supported families.
    """
    check_config(config)
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
    dtype: str | None = None,
    target: rules.Target = rules.COMMON,
    mamba_cache_dtype: str = "auto",
    mamba_ssm_cache_dtype: str = "auto",
) -> ModelFacts:
    """Per-layer cache facts for a parsed Hugging Face ``config.json``.

    ``tp`` is the tensor-parallel size; it only changes ``state_shapes`` (which
    are per rank).  ``dtype`` is the dtype the model is served in (vLLM's
    ``--dtype``); None resolves ``auto`` as vLLM does on ``target``
    (:func:`rules.served_dtype`).  ``mamba_cache_dtype`` /
    ``mamba_ssm_cache_dtype`` mirror vLLM's ``--mamba-cache-dtype`` /
    ``--mamba-ssm-cache-dtype``; the model's own hook resolves "auto" first.
    Raises :class:`UnsupportedModelError` for an unknown family,
    :class:`rules.EngineRefusal` for a config vLLM refuses, ``ValueError``
    for a config that cannot be read.

    >>> import json
    >>> facts = describe(json.load(open("tests/data/hf/phi-3-mini-4k-instruct.json")))
    >>> facts.family, facts.count_by_kind(), facts.layers[0].sliding_window
    ('phi3', {'sliding_window': 32}, 2047)
    """
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a mapping (a parsed config.json), got {type(config)}")
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tp must be a positive integer, got {tp!r}")
    family = family_of(config)
    _, handler, _, _ = _FAMILIES[family]
    text = text_config(config)
    model_type = str(config.get("model_type") or text.get("model_type") or family)
    checkpoint = model_dtype(config)
    served = dtype or rules.served_dtype(checkpoint, model_type, target)
    arch = architecture(config)
    ctx = Ctx(config=config, text=text, tp=tp, dtype=served,
              mamba_cache_dtype=mamba_cache_dtype,
              mamba_ssm_cache_dtype=rules.ssm_cache_dtype(arch, text, mamba_ssm_cache_dtype))
    layers = handler(ctx)
    max_pos = cfg_opt_int(text, "max_position_embeddings")
    if max_pos is None and family == "gemma3":
        max_pos = GEMMA3_TEXT_DEFAULTS["max_position_embeddings"]
    return ModelFacts(family=family, model_type=model_type,
                      num_layers=num_layers(text), dtype=checkpoint,
                      max_position_embeddings=max_pos, layers=layers, served_dtype=served,
                      architecture=arch)
