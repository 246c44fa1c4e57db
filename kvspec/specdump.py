"""Per-layer spec dumps: what a running engine's KV cache specs look like.

A dump (``../shared/conformance/FORMAT.md``) is one rank's per-layer specs plus
the engine settings that shape planning. kvspec reads dumps to plan them
directly (conformance) and to import a deployment into a source file.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Any

from kvspec.engine import Engine
from kvspec.errors import SourceError
from kvspec.layouts import Layout
from kvspec.planner.stages import split_stages
from kvspec.quantization import quant_mode
from kvspec.spec import (
    MLA,
    ChunkedLocal,
    CircularBuffer,
    CrossAttention,
    EncoderOnly,
    FullAttention,
    HiddenState,
    KpoolTail,
    LayerSpec,
    MambaState,
    RSWA,
    SinkFullAttention,
    SlidingWindow,
    SlidingWindowMLA,
)

#: Dump kind -> spec class.
KINDS: dict[str, type[LayerSpec]] = {
    "full_attention": FullAttention,
    "sliding_window": SlidingWindow,
    "chunked_local": ChunkedLocal,
    "mla": MLA,
    "sliding_window_mla": SlidingWindowMLA,
    "mamba": MambaState,
    "cross_attention": CrossAttention,
    "encoder_only": EncoderOnly,
    "sink_full_attention": SinkFullAttention,
    "hidden_state": HiddenState,
    "kpool_tail": KpoolTail,
    "circular_buffer": CircularBuffer,
    "rswa": RSWA,
}

_ATTN_OPTIONAL = ("head_size_v", "num_head_slots", "state_content_bytes",
                  "block_stride_alignment", "page_size_padded", "max_tp_shards")


def parse_tokens_per_state(value: Any) -> int | Fraction:
    if isinstance(value, str):
        frac = Fraction(value)
        return int(frac) if frac.denominator == 1 else frac
    return int(value)


def engine_from_config(cfg: dict[str, Any], num_layers: int | None = None) -> Engine:
    """The engine settings of a dump's ``config`` object."""
    original = cfg.get("original_max_model_len", cfg["max_model_len"])
    return Engine(
        block_size=cfg["block_size"],
        max_model_len=cfg["max_model_len"],
        original_max_model_len=original,
        max_num_batched_tokens=cfg.get("max_num_batched_tokens", 8192),
        max_num_seqs=cfg.get("max_num_seqs", 256),
        max_num_encoder_input_tokens=cfg.get("max_num_encoder_input_tokens"),
        async_scheduling=cfg.get("async_scheduling"),
        enable_prefix_caching=cfg.get("enable_prefix_caching", True),
        hybrid=not cfg.get("disable_hybrid_kv_cache_manager", False),
        layout=Layout.parse(cfg.get("kv_cache_layout") or "LBNHC"),
        kv_cache_dtype=cfg.get("kv_cache_dtype", "auto"),
        tensor_parallel_size=cfg.get("tensor_parallel_size", 1),
        pipeline_parallel_size=cfg.get("pipeline_parallel_size", 1),
        decode_context_parallel_size=cfg.get("decode_context_parallel_size", 1),
        num_gpu_blocks_override=cfg.get("num_gpu_blocks_override"),
        mamba_cache_mode=cfg.get("mamba_cache_mode") or "none",
        mamba_block_size=cfg.get("mamba_block_size"),
        prefix_match_unit=cfg.get("prefix_match_unit"),
        num_prefill_lookahead_tokens=cfg.get("num_prefill_lookahead_tokens", 0),
        speculative_method=cfg.get("speculative_method"),
        total_num_hidden_layers=cfg.get("num_hidden_layers", num_layers),
    )


def layer_spec(layer: dict[str, Any], engine: Engine,
               mamba_page_size_padded: int | None = None) -> LayerSpec:
    """One dump layer as a kvspec layer spec."""
    kind = layer.get("kind")
    cls = KINDS.get(kind)  # type: ignore[arg-type]
    if cls is None:
        raise SourceError(f"layer {layer.get('name')!r}: unknown kind {kind!r}",
                          expected=", ".join(KINDS), found=str(kind))
    if cls is MambaState:
        if "block_size" in layer:
            block = layer["block_size"]
        elif engine.mamba_cache_mode == "none":
            block = engine.max_model_len
        else:
            block = engine.mamba_block_size or engine.block_size
        return MambaState(
            block_size=block,
            shapes=tuple(tuple(int(d) for d in s) for s in layer["shapes"]),
            dtypes=tuple(layer["dtypes"]),
            mamba_type=layer.get("mamba_type", "mamba2"),
            mamba_cache_mode=engine.mamba_cache_mode,
            num_speculative_blocks=layer.get("num_speculative_blocks", 0),
            num_prefill_checkpoint_blocks=layer.get("num_prefill_checkpoint_blocks", 0),
            prefill_checkpoint_alignment=layer.get("prefill_checkpoint_alignment"),
            tp_replicated=layer.get("tp_replicated", False),
            page_size_padded=layer.get("page_size_padded", mamba_page_size_padded),
        )
    cache_dtype = layer.get("cache_dtype_str") or engine.kv_cache_dtype
    kw: dict[str, Any] = {
        "block_size": layer.get("block_size", engine.block_size),
        "num_kv_heads": layer["num_kv_heads"],
        "head_size": layer["head_size"],
        "dtype": layer["dtype"],
        "kv_quant_mode": int(quant_mode(cache_dtype)),
        "tokens_per_state": parse_tokens_per_state(layer.get("tokens_per_state", 1)),
    }
    for key in _ATTN_OPTIONAL:
        if layer.get(key) is not None:
            kw[key] = layer[key]
    if issubclass(cls, (MLA, SlidingWindowMLA)):
        kw["cache_dtype_str"] = cache_dtype
        if layer.get("alignment") is not None:
            kw["alignment"] = layer["alignment"]
    for key in ("sliding_window", "attention_chunk_size", "sink_len", "rswa_window",
                "bounded_replay", "model_version"):
        if layer.get(key) is not None and key in cls.__dataclass_fields__:
            kw[key] = layer[key]
    try:
        return cls(**kw)
    except TypeError as exc:
        raise SourceError(f"layer {layer.get('name')!r} ({kind}): {exc}") from exc


def read_dump(data: dict[str, Any]) -> tuple[Engine, list[dict[str, LayerSpec]]]:
    """A dump as the engine settings and the layer specs of every pipeline stage."""
    cfg = data["config"]
    names = [layer["name"] for layer in data["layers"]]
    engine = engine_from_config(cfg)
    specs = {layer["name"]: layer_spec(layer, engine, cfg.get("mamba_page_size_padded"))
             for layer in data["layers"]}
    stages = split_stages(names, engine.pipeline_parallel_size,
                          engine.total_num_hidden_layers)
    return engine, [{n: specs[n] for n in stage} for stage in stages]


def load_dump(path: str | Path) -> dict[str, Any]:
    from kvspec.files import read_json
    return read_json(path, what="the dump",
                     hint="give the path of a per-layer spec dump (JSON)")
