"""``KVSPEC_MODE=allocate`` on vLLM 0.32: kvspec's loader makes the engine's KV cache.

vLLM 0.32 allocates its KV cache in one function,
``vllm.v1.worker.utils.allocate_kv_cache(kv_cache_config, device, layout,
kernel_block_sizes)``: one zeroed int8 buffer of the size its ``KVCacheTensor``\\ s
name, and one ``(B, H, N, C)`` view per layer (``create_kv_cache_views``: block ``b``
of layer ``l`` at ``offset + l * layer_stride + b * block_stride``, kernel blocks
where a backend takes smaller ones), or the raw buffer for a layer that addresses its
pages itself (Mamba states). ``GPUModelRunner.initialize_kv_cache_tensors`` (the CPU
runner inherits it) calls it by the name it imported, then binds the views to the
attention layers (``bind_kv_cache``): those are the tensors the attention backend
reads and writes.

:func:`install` holds vLLM's KV-cache planning to the artifact as ``verify`` does
(vLLM plans; its plan must equal the artifact's), and replaces that name in the model
runner's module. For each call:

1. vLLM's own allocation is built on the meta device, with no memory behind it: the
   reference for every layer's bytes;
2. :func:`kvspec.load` loads the artifact for the engine's block count (and its
   kernel block sizes): it verifies the artifact, proves that every view lies inside
   its pool and no two block ids share a byte for that count, allocates (zeroed, as
   vLLM's own allocation is: see :data:`ZERO`) and views;
3. every layer's view must address exactly the bytes vLLM's would (byte offset into
   the allocation, shape, strides, dtype), and the allocation must be the size the
   engine's ``KVCacheTensor``\\ s name; any difference stops the engine
   (:class:`~kvspec.integrations.vllm.guard.EngineDrift`) before a forward pass;
4. kvspec's views are returned, and the model runner binds them.

The loaded caches stay in :data:`LOADED` (one per allocation this process made).
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from kvspec.integrations.vllm.guard import Drift, Expectation, PluginError

#: The caches kvspec allocated for the engine in this process, in order.
LOADED: list[Any] = []
#: ``kvspec.load``'s ``zero``: True zeroes the whole allocation, as vLLM's own
#: ``torch.zeros`` does. The artifact's rule alone (``needs_zeroing``: state layers,
#: mixed precision) is not enough for vLLM's attention kernels: they read the
#: unwritten slots of a partial block with weight 0, and 0 x NaN is NaN. With the
#: pool filled with 0xFF bytes and only the rule applied, the CPU engine's greedy
#: tokens all become 0 (tests/serve/test_allocate.py).
ZERO: bool | None = True
#: The module whose ``allocate_kv_cache`` name the model runner calls.
RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"

#: vLLM's own ``allocate_kv_cache``, while the hook is installed.
_saved: dict[str, Any] = {}


#: The parameters kvspec's hook takes the place of, in order.
HOOK_PARAMETERS = ("kv_cache_config", "device", "layout", "kernel_block_sizes")


def install(expectation: Expectation) -> None:
    """Hold vLLM's planning to the artifact as ``verify`` does, and make the model
    runner's KV-cache allocation kvspec's (idempotent)."""
    # deferred: vLLM (and torch)
    from kvspec.integrations.vllm.v0_32.builder import install as hold_planning

    hold_planning(expectation)   # mode allocate plans as verify: vLLM's plan, checked
    hook(expectation, RUNNER_MODULE)


def hook(expectation: Expectation, module: str) -> None:
    """Put kvspec's allocation in place of ``module.allocate_kv_cache`` (vLLM's, with
    the parameters :data:`HOOK_PARAMETERS`); a vLLM without it is refused."""

    runner: Any = importlib.import_module(module)
    check_hook(runner, module)
    _saved.setdefault("module", module)
    _saved.setdefault("allocate_kv_cache", runner.allocate_kv_cache)

    def allocate_kv_cache(kv_cache_config: Any, device: Any, layout: Any,
                          kernel_block_sizes: list[int] | None = None) -> dict[str, Any]:
        return allocate(expectation, kv_cache_config, device, layout, kernel_block_sizes)

    allocate_kv_cache.__kvspec__ = True  # type: ignore[attr-defined]
    runner.allocate_kv_cache = allocate_kv_cache


def check_hook(runner: Any, module: str) -> None:
    """The model runner allocates through ``allocate_kv_cache(kv_cache_config, device,
    layout, kernel_block_sizes)``, or a :class:`PluginError` saying it does not."""

    found = getattr(runner, "allocate_kv_cache", None)
    if getattr(found, "__kvspec__", False):
        return
    try:
        names = tuple(inspect.signature(found).parameters) if callable(found) else None
    except (TypeError, ValueError):
        names = None
    if names != HOOK_PARAMETERS:
        raise PluginError(
            f"KVSPEC_MODE=allocate: this vLLM's model runner ({module}) does not allocate "
            "its KV cache through allocate_kv_cache(" + ", ".join(HOOK_PARAMETERS) + ")",
            expected="vLLM 0.32.0 or 0.33.0", found=f"allocate_kv_cache: {names!r}",
            hint="serve with KVSPEC_MODE=enforce (vLLM allocates the artifact's placement)")


def uninstall() -> None:

    # deferred: vllm (the builder imports it)
    from kvspec.integrations.vllm.v0_32.builder import uninstall as release_planning

    release_planning()
    unhook()


def unhook() -> None:

    if "allocate_kv_cache" in _saved:
        runner: Any = importlib.import_module(_saved.pop("module"))
        runner.allocate_kv_cache = _saved.pop("allocate_kv_cache")


def reference(kv_cache_config: Any, layout: Any,
              kernel_block_sizes: list[int] | None) -> dict[str, Any]:
    """vLLM's own per-layer allocation, on the meta device (no memory)."""
    # deferred: torch
    import torch
    from vllm.v1.worker import utils

    vllms = _saved.get("allocate_kv_cache", utils.allocate_kv_cache)
    return vllms(kv_cache_config, torch.device("meta"), layout, kernel_block_sizes)


def allocate(expectation: Expectation, kv_cache_config: Any, device: Any, layout: Any,
             kernel_block_sizes: list[int] | None) -> dict[str, Any]:
    """kvspec's allocation for the engine, proved to be the one vLLM would make."""
    # deferred: the runtime loader (torch)
    from kvspec.artifact import Artifact

    # deferred: torch (the runtime loader imports it)
    from kvspec.runtime.loader import load

    if not kv_cache_config.kv_cache_tensors:
        return {}
    want = reference(kv_cache_config, layout, kernel_block_sizes)
    art = Artifact.read(expectation.path)
    planned = art.body.engine.axis_order
    name = getattr(layout, "name", str(layout))
    if name != planned:
        expectation.fail("the engine's KV-cache layout",
                         [Drift("engine", "kv_cache_layout", name, planned)])
    kernel = kernel_sizes(art, kv_cache_config, kernel_block_sizes)
    cache = load(art, device=device, num_blocks=kv_cache_config.num_blocks,
                 kernel_block_size=kernel or None, zero=ZERO)
    expectation.fail("kvspec's allocation for the engine",
                     drifts(cache, kv_cache_config, want),
                     hint="the artifact does not place this engine's KV cache; re-run "
                     "`kvspec init --from-vllm` with the engine's flags and recompile")
    LOADED.append(cache)
    out: dict[str, Any] = {}
    for layer, ref in want.items():
        if ref.dim() == 1:   # a layer that addresses its own pages: the raw allocation
            out[layer] = cache.buffers[_allocation_of(cache, layer)]
        else:
            out[layer] = as_engine_dtype(cache.views[layer], ref)
    return out


def as_engine_dtype(view: Any, ref: Any) -> Any:
    """``view`` in the engine's storage dtype where the two name the same bytes: vLLM
    stores an fp8 cache as uint8 (its kernels refuse float8 tensors: "key_cache must be
    uint8 for FP8 path"), kvspec views it as the float8 type it holds. Same data
    pointer, shape and strides."""
    if view.dtype != ref.dtype and view.element_size() == ref.element_size() and \
            ref.dtype in _storage_dtypes():
        return view.view(ref.dtype)
    return view


def _storage_dtypes() -> tuple[Any, ...]:
    # deferred: torch
    import torch

    return (torch.uint8,)


def kernel_sizes(art: Any, kv_cache_config: Any,
                 kernel_block_sizes: list[int] | None) -> dict[int, int]:
    """kvspec group id -> the kernel block size vLLM splits that group's blocks into
    (only the groups that split; vLLM's list is indexed by its own group ids)."""
    if not kernel_block_sizes:
        return {}
    group_of = {n: g.id for g in art.body.groups for n in g.layers}
    out: dict[int, int] = {}
    for gid, group in enumerate(kv_cache_config.kv_cache_groups):
        if gid >= len(kernel_block_sizes) or not group.layer_names:
            continue
        size = kernel_block_sizes[gid]
        first = group.layer_names[0]
        if size != group.kv_cache_spec.block_size and first in group_of:
            out[group_of[first]] = size
    return out


def _allocation_of(cache: Any, name: str) -> str:
    pool = cache.metadata[name].pool
    stage = cache.artifact.body.stages[cache.stage]
    return next(p.allocation for p in stage.pools if p.name == pool)


def drifts(cache: Any, kv_cache_config: Any, want: dict[str, Any]) -> list[Drift]:
    """Where kvspec's allocation differs from the one vLLM would make: the allocation's
    size, and per layer the byte offset, shape, strides and dtype of its view."""
    out: list[Drift] = []
    sizes = {t.size for t in kv_cache_config.kv_cache_tensors}
    allocations = {_allocation_of(cache, n) for n in want if n in cache.metadata}
    for alloc in sorted(allocations):
        got = cache.buffers[alloc].numel()
        if got not in sizes:
            out.append(Drift(f"allocation {alloc}", "bytes", min(sizes)
                             if len(sizes) == 1 else sorted(sizes), got))
    for name, ref in want.items():
        if name not in cache.views:
            out.append(Drift(f"layer {name}", "view", "present", "absent"))
            continue
        if ref.dim() == 1:
            continue
        view = as_engine_dtype(cache.views[name], ref)
        base = cache.buffers[_allocation_of(cache, name)]
        mine = (view.storage_offset() * view.element_size()
                - base.storage_offset() * base.element_size())
        theirs = ref.storage_offset() * ref.element_size()
        where = f"layer {name}"
        for field, a, b in (("byte offset", theirs, mine),
                            ("shape", tuple(ref.shape), tuple(view.shape)),
                            ("strides", tuple(ref.stride()), tuple(view.stride())),
                            ("dtype", str(ref.dtype), str(view.dtype))):
            if a != b:
                out.append(Drift(where, field, a, b))
    for t in kv_cache_config.kv_cache_tensors:
        count = kv_cache_config.num_blocks_of(t)
        for n in t.layers:
            meta = cache.metadata.get(n)
            if meta is not None and meta.num_blocks != count:
                out.append(Drift(f"layer {n}", "num_blocks", count, meta.num_blocks))
    return out
