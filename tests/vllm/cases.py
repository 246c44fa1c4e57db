"""Conformance cases as vLLM's engine would report them, and what to expect of each."""

from __future__ import annotations

import re
from fractions import Fraction
from pathlib import Path
from typing import Any

from kvspec.artifact import Artifact
from kvspec.compiler import compile_source
from kvspec.integrations.dump.importer import dump_to_yaml
from tests.conformance.harness import case_names, load

#: The by-design rules a case's differences come from (the others agree).
BY_DESIGN = {
    "syn-glm5-next": {"state-slot-layout", "kpool-tail", "drafter-pool"},
    "syn-mamba-all": {"mamba-cache-all"},
    "syn-stride-alignment": {"block-stride-alignment"},
}
#: Cases whose budget cannot serve one request (kvspec and vLLM both refuse it).
TOO_SMALL = {"syn-not-enough-memory"}
CASES = case_names()

_MAMBA = {"mamba1": "MAMBA1", "mamba2": "MAMBA2", "gdn_attention": "GDN_ATTN",
          "short_conv": "SHORT_CONV", "linear_attention": "LINEAR"}
_CLASSES = {"full_attention": "FullAttentionSpec", "sliding_window": "SlidingWindowSpec",
            "chunked_local": "ChunkedLocalAttentionSpec", "mla": "MLAAttentionSpec",
            "hidden_state": "HiddenStateCacheSpec",
            # the nearest upstream relative of the reference's KpoolTailSpec
            "kpool_tail": "CircularBufferSpec"}


def source(name: str, *, budget: bool = True) -> str:
    """The case as a source (what ``kvspec import`` writes), with or without its budget."""
    case, _ = load(name)
    text = dump_to_yaml(case)
    return text if budget else re.sub(r"(?m)^  memory: .*\n", "", text)


def artifact(name: str, tmp: Path, *, budget: bool = True) -> tuple[Path, Artifact]:
    art = compile_source(source(name, budget=budget), f"{name}.yaml")
    path = tmp / f"{name}.kvlayout.json"
    art.write(path)
    return path, art


def engine_spec(layer: dict[str, Any], cfg: dict[str, Any]) -> Any:
    """One case layer as vLLM's model runner would report it (FORMAT.md), built
    here independently of kvspec's own conversion."""
    import torch
    from vllm.v1 import kv_cache_interface as kvi
    from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum

    kind = layer["kind"]
    if kind == "mamba":
        mode = cfg.get("mamba_cache_mode") or "none"
        return kvi.MambaSpec(
            block_size=layer.get("block_size") or (
                cfg["max_model_len"] if mode == "none" else cfg["mamba_block_size"]),
            shapes=tuple(tuple(s) for s in layer["shapes"]),
            dtypes=tuple(getattr(torch, d) for d in layer["dtypes"]),
            mamba_type=MambaAttentionBackendEnum[_MAMBA[layer["mamba_type"]]],
            mamba_cache_mode=mode)
    cache = layer.get("cache_dtype_str", cfg.get("kv_cache_dtype", "auto"))
    kw: dict[str, Any] = dict(block_size=layer.get("block_size", cfg["block_size"]),
                              num_kv_heads=layer["num_kv_heads"], head_size=layer["head_size"],
                              dtype=getattr(torch, layer["dtype"]),
                              kv_quant_mode=kvi.get_kv_quant_mode(cache))
    for key in ("state_content_bytes", "block_stride_alignment", "sliding_window",
                "attention_chunk_size", "alignment"):
        if layer.get(key) is not None:
            kw[key] = layer[key]
    if layer.get("tokens_per_state") is not None:
        kw["tokens_per_state"] = Fraction(layer["tokens_per_state"])
    if kind in ("mla", "hidden_state"):
        kw["cache_dtype_str"] = cache
    if kind == "kpool_tail":
        kw.pop("sliding_window")  # a ring of block_size tokens
    return getattr(kvi, _CLASSES[kind])(**kw)


def engine_stages(name: str, art: Artifact) -> list[dict[str, Any]]:
    """Each pipeline stage's layers, as the engine reports them (real vLLM specs)."""
    case, _ = load(name)
    by_name = {layer["name"]: layer for layer in case["layers"]}
    return [{n: engine_spec(by_name[n], case["config"]) for n in st.layer_names}
            for st in art.layout.stages]
