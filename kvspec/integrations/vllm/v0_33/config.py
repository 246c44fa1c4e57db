"""A ``VllmConfig`` carrying a plan's engine settings, and the settings of one.

The settings are a spec dump's ``config`` keys (:func:`..specs.engine_settings`).
For planning without a model (``verify``), the config is made for a tiny
synthetic Llama (64 heads, so any tensor-parallel size divides them, and a
long maximum length), then the settings are put on it: the planning code reads
them from the config, never from the model.
"""

from __future__ import annotations

import json
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

#: The stand-in model: planning reads its settings, never its weights.
_TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512,
         "intermediate_size": 1024, "num_attention_heads": 64, "num_key_value_heads": 64,
         "head_dim": 8, "num_hidden_layers": 2, "max_position_embeddings": 1 << 22,
         "vocab_size": 1024, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16",
         "tie_word_embeddings": False}


@cache
def tiny_model_dir() -> str:
    path = Path(tempfile.mkdtemp(prefix="kvspec-vllm-tiny-"))
    (path / "config.json").write_text(json.dumps(_TINY))
    return str(path)


def engine_args(model: str, s: dict[str, Any], **extra: Any) -> Any:
    """``EngineArgs`` for ``model`` with the settings vLLM takes as arguments."""
    # deferred: vLLM (and torch)
    from vllm.engine.arg_utils import EngineArgs

    kw = dict(model=model, skip_tokenizer_init=True, load_format="dummy", enforce_eager=True,
              tensor_parallel_size=s.get("tensor_parallel_size", 1),
              pipeline_parallel_size=s.get("pipeline_parallel_size", 1),
              enable_prefix_caching=s.get("enable_prefix_caching", True),
              kv_cache_dtype=s.get("kv_cache_dtype") or "auto", trust_remote_code=False)
    for key in ("max_model_len", "block_size", "num_gpu_blocks_override",
                "max_num_batched_tokens", "max_num_seqs"):
        if s.get(key) is not None:
            kw[key] = s[key]
    if s.get("disable_hybrid_kv_cache_manager"):
        kw["disable_hybrid_kv_cache_manager"] = True
    kw.update(extra)
    return EngineArgs(**kw)


def planning_config(s: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """A config with settings ``s`` for the planning calls, and what had to be set
    after creation (values the CPU platform or validation changed)."""
    dcp = s.get("decode_context_parallel_size", 1)
    adjusted: dict[str, Any] = {}
    try:
        vc = engine_args(tiny_model_dir(), s, decode_context_parallel_size=dcp
                         ).create_engine_config()
    except Exception as exc:  # noqa: BLE001 - e.g. a DCP the stand-in model refuses
        vc = engine_args(tiny_model_dir(), s).create_engine_config()
        vc.parallel_config.decode_context_parallel_size = dcp
        adjusted["decode_context_parallel_size"] = f"set after creation ({type(exc).__name__})"
    apply_settings(vc, s, adjusted)
    return vc, adjusted


def apply_settings(vc: Any, s: dict[str, Any], adjusted: dict[str, Any]) -> None:
    """Put the settings vLLM derives or the CPU platform overrides on ``vc``."""
    cc, sc, mc = vc.cache_config, vc.scheduler_config, vc.model_config
    wanted = [(sc, "async_scheduling", s.get("async_scheduling",
                                             s.get("pipeline_parallel_size", 1) == 1)),
              (cc, "block_size", s["block_size"]),
              (cc, "mamba_cache_mode", s.get("mamba_cache_mode") or "none"),
              (cc, "mamba_block_size", s.get("mamba_block_size")),
              (cc, "mamba_page_size_padded", None),
              (cc, "kv_cache_layout", s.get("kv_cache_layout") or "LBNHC"),
              (sc, "max_num_batched_tokens", s.get("max_num_batched_tokens")),
              (sc, "max_num_seqs", s.get("max_num_seqs")),
              (sc, "max_num_encoder_input_tokens", s.get("max_num_encoder_input_tokens"))]
    if s.get("prefix_match_unit") is not None:
        wanted.append((cc, "prefix_match_unit", s["prefix_match_unit"]))
    for obj, name, value in wanted:
        if value is None and name.startswith("max_num"):
            continue
        if getattr(obj, name) != value:
            if name not in ("mamba_page_size_padded", "kv_cache_layout"):
                adjusted[name] = [getattr(obj, name), value]
            setattr(obj, name, value)
    if s.get("original_max_model_len") == -1:
        mc.original_max_model_len = -1


def settings_of(vc: Any) -> dict[str, Any]:
    """The engine settings of a running engine's config (same keys as ``s``)."""
    cc, sc, mc, pc = (vc.cache_config, vc.scheduler_config, vc.model_config,
                      vc.parallel_config)
    return {
        "block_size": cc.block_size, "max_model_len": mc.max_model_len,
        "original_max_model_len": mc.original_max_model_len,
        "kv_cache_dtype": cc.cache_dtype,
        "enable_prefix_caching": bool(cc.enable_prefix_caching),
        "disable_hybrid_kv_cache_manager": bool(sc.disable_hybrid_kv_cache_manager),
        "tensor_parallel_size": pc.tensor_parallel_size,
        "pipeline_parallel_size": pc.pipeline_parallel_size,
        "decode_context_parallel_size": pc.decode_context_parallel_size,
        "num_gpu_blocks_override": cc.num_gpu_blocks_override,
        "max_num_batched_tokens": sc.max_num_batched_tokens,
        "max_num_seqs": sc.max_num_seqs,
        "max_num_encoder_input_tokens": sc.max_num_encoder_input_tokens,
        "async_scheduling": bool(sc.async_scheduling),
        "kv_cache_layout": cc.kv_cache_layout,
        "mamba_cache_mode": cc.mamba_cache_mode, "mamba_block_size": cc.mamba_block_size,
        "prefix_match_unit": cc.prefix_match_unit,
        "max_in_flight_tokens": vc.max_in_flight_tokens,
        "num_prefill_lookahead_tokens": vc.num_prefill_lookahead_tokens,
    }
