"""``init --from-vllm`` next to ``init --from-hf``: the same layers, specs and engine?"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvspec.compiler import compile_source
from kvspec.errors import KvspecError
from kvspec.integrations.options import InitOptions
from kvspec.integrations.vllm.specs import spec_differences, to_vllm

HF = Path(__file__).resolve().parents[1] / "data" / "hf"
#: The engine settings both inits must agree on.
ENGINE_FIELDS = ("block_size", "max_model_len", "mamba_cache_mode", "mamba_block_size",
                 "enable_prefix_caching", "kv_cache_dtype", "tensor_parallel_size")


@dataclass
class Outcome:
    config: str
    tp: int
    vllm: str = ""            # "ok" or the error
    hf: str = ""              # "ok", "refused: ..." or the error
    layers: int = 0
    families: str = ""
    differences: list[str] = field(default_factory=list)
    seconds: float = 0.0


def options(name: str, tp: int, **kw: Any) -> InitOptions:
    return InitOptions(name=name, tp=tp, **kw)


def planned(text: str, file: str):
    return compile_source(text, file).layout


def compare_config(path: Path, tp: int, adapter: Any) -> Outcome:
    from kvspec.integrations.hf.init import init_source as from_hf
    from kvspec.integrations.vllm.init import init_source as from_vllm

    out = Outcome(path.stem, tp)
    start = time.monotonic()
    try:
        vl_text = from_vllm(path, options(path.stem, tp), progress=lambda s: None)
        out.vllm = "ok"
    except KvspecError as err:
        out.vllm = err.message.splitlines()[0][:160]
        out.seconds = time.monotonic() - start
        return out
    out.seconds = time.monotonic() - start
    vl = planned(vl_text, f"{path.stem}-vllm.yaml")
    out.layers = len(vl.layers)
    config = json.loads(path.read_text())
    try:
        hf_text = from_hf(config, options(path.stem, tp))
    except KvspecError as err:
        out.hf = "refused: " + err.message.splitlines()[0][:120]
        return out
    out.hf = "ok"
    hf = planned(hf_text, f"{path.stem}-hf.yaml")
    out.differences = differences(hf, vl, adapter)
    return out


def differences(hf, vl, adapter: Any) -> list[str]:
    """Where the HF table's layout and vLLM's differ: layer names, per-rank specs
    (as planned: a state page padded by the planner counts as padded), engine."""
    out = []
    if list(hf.layers) != list(vl.layers):
        missing, extra = set(vl.layers) - set(hf.layers), set(hf.layers) - set(vl.layers)
        out.append(f"layer names: hf lacks {sorted(missing)[:3]}, has {sorted(extra)[:3]}")
    defaults = adapter.class_defaults()
    for name in vl.layers:
        if name not in hf.layers:
            continue
        a, b = _planned_spec(hf, name), _planned_spec(vl, name)
        for f, x, y in spec_differences(a, b, defaults):
            out.append(f"{name}: {f}: hf {x!r}, vllm {y!r}")
    from kvspec.integrations.vllm.specs import engine_settings

    ea, eb = engine_settings(hf.plan.engine), engine_settings(vl.plan.engine)
    out += [f"engine {k}: hf {ea[k]!r}, vllm {eb[k]!r}" for k in ENGINE_FIELDS if ea[k] != eb[k]]
    return out


def _planned_spec(layout, name: str) -> dict[str, Any]:
    entry = layout.layers[name]
    group = layout.groups[entry.group]
    desc = to_vllm(entry.spec)
    desc["page_size_bytes"] = group.layer_spec(name).page_size_bytes
    desc.pop("page_size_padded", None)
    return desc
