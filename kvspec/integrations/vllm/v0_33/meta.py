"""A model built by vLLM 0.33.0's own code on the meta device, and its layers' specs.

No weights, no GPU: ``EngineArgs(load_format="dummy")`` makes the config from
a config.json alone, a one-process gloo group stands in for the parallel
groups (their world sizes set to the deployment's, so the per-rank heads and
state shapes are those of one of its ranks), and every attention and state
layer answers ``get_kv_cache_spec`` with its real spec and name, as
``GPUModelRunner.get_kv_cache_spec`` asks it.

For a GPU deployment the CPU platform is not the deployment: where it decides an
engine choice its own way, the GPU rules (:mod:`.gpu`) are applied instead. For the
CPU engine (``settings["cpu_engine"]``: ``--target cpu``, or vLLM's CPU build) it
is: its choices stand, as ``LLM(...)`` makes them on this host (block size, MLA
backend, SSM state dtype, batched tokens, no async scheduling), and the KV-cache
layout is the one its engine core resolves from the layers' attention backends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kvspec.integrations.vllm.v0_33 import gpu
from kvspec.integrations.vllm.v0_33 import specs as vspecs
from kvspec.integrations.vllm.v0_33.config import engine_args, settings_of

_DIST: dict[str, bool] = {}


@contextlib.contextmanager
def model_dir(path: Path, notes: list[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """A directory holding the model's config.json (a temporary copy when the
    path is the file, or when weight quantization had to be dropped)."""
    config_path = path / "config.json" if path.is_dir() else path
    config = json.loads(config_path.read_text(encoding="utf-8"))
    quant = config.get("quantization_config")
    if path.is_dir() and quant is None:
        yield str(path), config
        return
    if quant is not None:
        method = quant.get("quant_method", "?") if isinstance(quant, dict) else "?"
        notes.append(f"the weights' quantization_config ({method}) was left out of the build: "
                     "it needs GPU kernels and does not change the KV cache")
        config = {k: v for k, v in config.items() if k != "quantization_config"}
    tmp = Path(tempfile.mkdtemp(prefix="kvspec-vllm-model-"))
    try:
        (tmp / "config.json").write_text(json.dumps(config))
        if path.is_dir():
            for extra in path.glob("*.json"):
                if extra.name != "config.json":
                    shutil.copy(extra, tmp / extra.name)
        yield str(tmp), config
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _init_distributed() -> None:
    """One gloo process group, once per process; its groups' sizes are faked per build.

    Made under a config without a model, so the expert-parallel group exists
    for MoE models too (vLLM makes it only then, or for an MoE model)."""
    if _DIST:
        return
    # deferred: vLLM (and torch)
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state as ps

    fd, store = tempfile.mkstemp(prefix="kvspec-gloo-")
    os.close(fd)
    os.unlink(store)
    with set_current_vllm_config(VllmConfig()):
        if not ps.model_parallel_is_initialized():
            ps.init_distributed_environment(world_size=1, rank=0, local_rank=0,
                                            distributed_init_method=f"file://{store}",
                                            backend="gloo")
            ps.initialize_model_parallel(1, 1)
    _DIST["ready"] = True


@contextlib.contextmanager
def faked_parallel(tp: int, pp: int, pp_rank: int, dcp: int) -> Iterator[None]:
    """The parallel groups report the deployment's world sizes (rank 0 of TP,
    stage ``pp_rank`` of PP): a ``GroupCoordinator`` keeps them as attributes."""
    # deferred: vLLM (and torch)
    from vllm.distributed import parallel_state as ps

    _init_distributed()
    saved = []
    for group, size, rank in ((ps._TP, tp, 0), (ps._PP, pp, pp_rank), (ps._DCP, dcp, 0)):
        if group is None or size == 1:
            continue
        saved.append((group, group.world_size, group.rank_in_group, list(group.ranks)))
        ranks = [10_000 + i for i in range(size)]
        ranks[rank] = group.rank
        group.world_size, group.rank_in_group, group.ranks = size, rank, ranks
    try:
        yield
    finally:
        for group, size, rank, ranks in saved:
            group.world_size, group.rank_in_group, group.ranks = size, rank, ranks


def vllm_config(model: str, s: dict[str, Any], dtype: str | None) -> Any:
    """The engine config vLLM makes for this model and these settings: by the GPU
    rules (:func:`.gpu.config_stage`), or as the CPU engine's ``LLM(...)`` makes it."""
    extra: dict[str, Any] = {"decode_context_parallel_size": s["decode_context_parallel_size"]}
    if dtype:
        extra["dtype"] = dtype
    for key in ("mamba_ssm_cache_dtype", "mamba_cache_dtype"):
        if s.get(key) not in (None, "auto"):
            extra[key] = s[key]
    args = engine_args(model, s, **extra)
    if s.get("cpu_engine"):
        # deferred: vLLM (and torch)
        from vllm.usage.usage_lib import UsageContext
        return args.create_engine_config(usage_context=UsageContext.LLM_CLASS)
    with gpu.config_stage():
        vc = args.create_engine_config()
    gpu.undo_cpu_config(vc, s)
    return vc


def cpu_layout(vc: Any, specs: dict[str, Any]) -> None:
    """The KV-cache layout the CPU engine core resolves (``EngineCore``: the layouts
    every worker's attention backends support, ``resolve_kv_cache_layout``), recorded
    on ``vc``: LBHNC for its attention backend, LBNHC for its MLA backends."""
    # deferred: vLLM (and torch)
    from vllm.distributed.kv_transfer.kv_connector.utils import get_current_attn_backends
    from vllm.v1.attention.backends.utils import (
        get_supported_kv_cache_layouts,
        resolve_kv_cache_layout,
    )

    names = [m.name for m in get_supported_kv_cache_layouts(get_current_attn_backends(vc))]
    resolve_kv_cache_layout(vc, [names], list(specs.values()))


def build_stage(vc: Any, pp_rank: int, log: list[str], gdn_backend: str | None = None,
                *, cpu_engine: bool = False) -> dict[str, Any]:
    """Build one pipeline stage on meta: ``{layer name: vLLM spec}``, in model order
    (``cpu_engine``: as vLLM's CPU engine builds it, else by the GPU rules)."""
    # deferred: vLLM (and torch)
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.config.vllm import get_layers_from_vllm_config
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.model_executor.model_loader.utils import initialize_model

    pc = vc.parallel_config
    vc.compilation_config.static_forward_context = {}
    with set_current_vllm_config(vc), gpu.meta_build(gdn_backend), faked_parallel(
            pc.tensor_parallel_size, pc.pipeline_parallel_size, pp_rank,
            pc.decode_context_parallel_size):
        with torch.device("meta"):
            model = initialize_model(vllm_config=vc)
        layers = get_layers_from_vllm_config(vc, AttentionLayerBase)
        if cpu_engine:
            _cpu_block_size(vc, log)
        else:
            gpu.update_block_size(vc, layers, log)
        specs = {}
        for name, layer in layers.items():
            if getattr(layer, "kv_sharing_target_layer_name", None):
                log.append(f"{name} shares the KV cache of "
                           f"{layer.kv_sharing_target_layer_name} (not listed)")
                continue
            with contextlib.nullcontext() if cpu_engine else gpu.kernel_blocks(layer):
                spec = layer.get_kv_cache_spec(vc)
            if spec is None:
                continue
            if getattr(layer, "is_draft_layer", False):
                spec = dataclasses.replace(spec, is_draft=True)
            specs[name] = spec
        if cpu_engine:
            cpu_layout(vc, specs)
    del model
    return specs


def _cpu_block_size(vc: Any, log: list[str]) -> None:
    """``CpuPlatform.update_block_size_for_backend``, as the CPU worker runs it after
    loading the model (a hybrid's attention block raised so one page holds one state)."""
    # deferred: vLLM (and torch)
    from vllm.platforms import current_platform

    cc = vc.cache_config
    before = (cc.block_size, cc.mamba_block_size, cc.mamba_page_size_padded)
    current_platform.update_block_size_for_backend(vc)
    after = (cc.block_size, cc.mamba_block_size, cc.mamba_page_size_padded)
    if before != after:
        log.append(f"vLLM's hybrid alignment set the attention block size to {after[0]} "
                   f"(state pages padded to {after[2]} bytes)")


def build(path: Path, settings: dict[str, Any], dtype: str | None = None,
          progress: Any = None) -> dict[str, Any]:
    """Every pipeline stage's layers of the model at ``path``, as plain data:
    ``{"stages": [{name: vLLM description}], "engine": settings after vLLM's
    config stage and GPU rules, "model": facts, "notes": [...]}``."""
    notes: list[str] = []
    say = progress or (lambda text: None)
    with model_dir(path, notes) as (directory, config):
        say("making vLLM's engine config")
        vc = vllm_config(directory, settings, dtype)
        stages = []
        for rank in range(vc.parallel_config.pipeline_parallel_size):
            say(f"building the model on the meta device (stage {rank + 1} of "
                f"{vc.parallel_config.pipeline_parallel_size})")
            specs = build_stage(vc, rank, notes, settings.get("gdn_prefill_backend"),
                                cpu_engine=bool(settings.get("cpu_engine")))
            stages.append({n: vspecs.describe(s) for n, s in specs.items()})
    mc = vc.model_config
    facts = {"architecture": mc.architecture, "model_type": getattr(mc.hf_config, "model_type",
                                                                    None),
             "num_hidden_layers": mc.get_total_num_hidden_layers(),
             "total_num_kv_heads": mc.get_total_num_kv_heads(),
             "dtype": vspecs.plain(mc.dtype), "max_model_len": mc.max_model_len,
             "is_hybrid": bool(mc.is_hybrid), "config": config}
    engine = settings_of(vc)
    engine["mamba_ssm_cache_dtype"] = vc.cache_config.mamba_ssm_cache_dtype
    engine["cpu_engine"] = bool(settings.get("cpu_engine"))
    return {"stages": stages, "engine": engine, "model": facts, "notes": notes}
