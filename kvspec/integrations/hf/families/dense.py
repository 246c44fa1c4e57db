"""Families of attention-only models: Llama, Mistral, Qwen, Gemma, gpt-oss, Llama 4, DeepSeek,
Mixtral, Phi-3, GLM-4.5, MiniMax-M2."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kvspec.integrations import rules
from kvspec.integrations.hf.families.facts import (
    LATENT,
    Ctx,
    LayerFacts,
    attention_layer,
    cfg_int,
    cfg_list,
    cfg_opt_int,
    from_layer_types,
    layer_types,
    num_layers,
)


def _typed_or(cfg: Mapping[str, Any], window: Callable[[int], int | None]
              ) -> list[LayerFacts]:
    """The layers ``layer_types`` gives, when the config has it; else layer ``i``
    slides over ``window(i)`` (None: full attention)."""
    n = num_layers(cfg)
    types = layer_types(cfg, n)
    if types is not None:
        return from_layer_types(cfg, types)
    return [attention_layer(i, cfg, sliding_window=window(i)) for i in range(n)]


def _llama_like(ctx: Ctx) -> list[LayerFacts]:
    """Llama and Mistral (vLLM ``llama.py``).

    ``layer_types`` wins when present.  Otherwise a non-null ``sliding_window``
    (Mistral 7B v0.1: 4096) slides on every layer -- vLLM passes the model-level
    window to every ``Attention`` layer -- and a null one means full attention.
    """
    return _typed_or(ctx.text, lambda i: cfg_opt_int(ctx.text, "sliding_window"))


def _qwen(ctx: Ctx) -> list[LayerFacts]:
    """Qwen2 / Qwen3 (vLLM ``qwen2.py``; ``Qwen3Model`` is a ``Qwen2Model``).

    ``transformers``' ``Qwen2Config`` keeps ``sliding_window`` only when
    ``use_sliding_window`` is true (Qwen2.5 ships ``sliding_window: 131072``
    with it false) and derives ``layer_types``: sliding for
    ``i >= max_window_layers`` (default 28). ``Qwen2Model`` refuses a mix of
    sliding and full layers (:func:`kvspec.integrations.rules.qwen2_sliding_window`),
    and its layers take the model-level window, which vLLM sets only when every
    layer slides (``EngineArgs.create_engine_config``): so either every layer
    slides or none does.
    """
    cfg = ctx.text
    n = num_layers(cfg)
    window = cfg_opt_int(cfg, "sliding_window") if cfg.get("use_sliding_window") else None
    first_sliding = cfg_int(cfg, "max_window_layers", 28, minimum=0)
    types = layer_types(cfg, n) or [
        "sliding_attention" if window is not None and i >= first_sliding else "full_attention"
        for i in range(n)]
    rules.qwen2_sliding_window(types, first_sliding, n)
    return uniform_window(cfg, n, window, types)


def uniform_window(cfg: Mapping[str, Any], n: int, window: int | None,
                   types: list[str] | None) -> list[LayerFacts]:
    """Every layer with the model-level window, or none: vLLM's
    ``cache_config.sliding_window`` is the config's ``sliding_window`` when
    ``layer_types`` is absent or all sliding, else None
    (``EngineArgs.create_engine_config``), and ``Attention`` takes it when its
    model passes no per-layer window."""
    if types is not None and any(t != "sliding_attention" for t in types):
        window = None
    return [attention_layer(i, cfg, sliding_window=window) for i in range(n)]


def _model_level_window(ctx: Ctx) -> list[LayerFacts]:
    """Mixtral (``mixtral.py``), Phi-3 / Phi-4 (``phi3.py``: a ``LlamaForCausalLM``
    whose config has no ``layer_types``), GLM-4.5 (``glm4_moe.py``), MiniMax-M2
    (``minimax_m2.py``, which ignores ``attn_type_list``): no per-layer window,
    so :func:`uniform_window`. Phi-3-mini's ``sliding_window: 2047`` slides on
    every layer; Phi-4, Mixtral, GLM-4.5 and MiniMax-M2 give none.
    """
    cfg = ctx.text
    n = num_layers(cfg)
    return uniform_window(cfg, n, cfg_opt_int(cfg, "sliding_window"), layer_types(cfg, n))


def _qwen3_moe(ctx: Ctx) -> list[LayerFacts]:
    """Qwen3-MoE (vLLM ``qwen3_moe.py``): ``Qwen3MoeConfig`` keeps the window
    only with ``use_sliding_window``; ``Qwen3MoeModel`` passes no per-layer
    window and has no ``max_window_layers`` check, so :func:`uniform_window`."""
    cfg = ctx.text
    n = num_layers(cfg)
    window = cfg_opt_int(cfg, "sliding_window") if cfg.get("use_sliding_window") else None
    return uniform_window(cfg, n, window, layer_types(cfg, n))


def _even_layers_slide(default_window: int) -> Callable[[Ctx], list[LayerFacts]]:
    """A family whose ``layer_types`` say which layers slide, and without them its
    even layers do, over ``sliding_window`` (``default_window`` when absent)."""
    def layers(ctx: Ctx) -> list[LayerFacts]:
        return _typed_or(ctx.text, lambda i: cfg_int(ctx.text, "sliding_window", default_window)
                         if i % 2 == 0 else None)
    return layers


#: Gemma 2 (vLLM ``gemma2.py``): ``Gemma2Config`` derives ``layer_types`` as sliding
#: for even ``i``; ``sliding_window`` defaults to 4096 there.
_gemma2 = _even_layers_slide(4096)
#: gpt-oss (vLLM ``gpt_oss.py``): ``layer_types``; without it, even layers slide.
_gpt_oss = _even_layers_slide(128)


# transformers ``Gemma3TextConfig`` defaults used when ``text_config`` omits a
# field (google/gemma-3-27b-it's config.json only lists non-default values).
GEMMA3_TEXT_DEFAULTS: dict[str, Any] = {
    "head_dim": 256,
    "num_key_value_heads": 4,
    "num_attention_heads": 8,
    "sliding_window": 4096,
    "sliding_window_pattern": 6,
    "max_position_embeddings": 131072,
}


def _gemma3(ctx: Ctx) -> list[LayerFacts]:
    """Gemma 3 (vLLM ``gemma3.py``; the multimodal checkpoint nests ``text_config``).

    ``layer_types`` when present; otherwise layer ``i`` is global when
    ``(i + 1) % sliding_window_pattern == 0`` (``Gemma3TextConfig``), i.e. five
    sliding layers then one global layer.  Missing fields take the
    ``Gemma3TextConfig`` defaults in ``GEMMA3_TEXT_DEFAULTS``.
    """
    cfg = {**GEMMA3_TEXT_DEFAULTS, **{k: v for k, v in ctx.text.items() if v is not None}}

    def window(i: int) -> int | None:
        pattern = cfg_int(cfg, "sliding_window_pattern")
        if "_sliding_window_pattern" in cfg:
            pattern = cfg_int(cfg, "_sliding_window_pattern")
        sliding = cfg_int(cfg, "sliding_window")
        return None if (i + 1) % pattern == 0 else sliding
    return _typed_or(cfg, window)


def _llama4(ctx: Ctx) -> list[LayerFacts]:
    """Llama 4 (vLLM ``llama4.py``, ``Llama4Attention``).

    ``nope = no_rope_layers[i] == 0``; NoPE layers are plain (global)
    ``Attention``, the rest ``ChunkedLocalAttention(attention_chunk_size)``
    when ``attention_chunk_size`` is set.  ``Llama4TextConfig`` replaces an
    empty ``no_rope_layers`` with ``int((i + 1) % 4 != 0)`` -- every 4th layer
    is NoPE/global.
    """
    cfg = ctx.text
    n = num_layers(cfg)
    no_rope = None if cfg.get("no_rope_layers") == [] else cfg_list(
        cfg, "no_rope_layers", n, int, "flags, 0 for a NoPE layer")
    if no_rope is None:
        no_rope = [int((i + 1) % 4 != 0) for i in range(n)]
    chunk = cfg_opt_int(cfg, "attention_chunk_size")
    return [
        attention_layer(i, cfg, chunk=None if no_rope[i] == 0 else chunk) for i in range(n)
    ]


def _deepseek(ctx: Ctx) -> list[LayerFacts]:
    """DeepSeek V2 / V3 with MLA (vLLM ``deepseek_v2.py``).

    Every decoder layer caches one latent vector per token: a single KV "head"
    of ``kv_lora_rank + qk_rope_head_dim`` (512 + 64 = 576).  V is not cached
    separately.  The MTP layers (``num_nextn_predict_layers``) belong to the
    speculative drafter, not this model, and are not listed.
    """
    cfg = ctx.text
    n = num_layers(cfg)
    rank = cfg_int(cfg, "kv_lora_rank")
    rope = cfg_int(cfg, "qk_rope_head_dim", minimum=0)
    return [
        LayerFacts(
            index=i,
            kind=LATENT,
            num_kv_heads=1,
            head_size=rank + rope,
            mla_kv_lora_rank=rank,
            mla_rope_dim=rope,
        )
        for i in range(n)
    ]


