"""The GPU rules, where vLLM 0.33.0's CPU platform decides an engine choice its own way.

``init --from-vllm`` builds the model on the CPU platform (the meta device
needs no GPU), but the source must describe a GPU deployment. Layer facts
(names, kinds, heads, head sizes, windows, state shapes, the model's dtypes)
come from the model code and are the same on both; these choices are not:

* state dtypes: the CPU platform forces ``mamba_ssm_cache_dtype = float32`` on
  hosts with AVX512-BF16 (``CpuPlatform.check_and_update_config``) -- hidden
  while the config is made, so the model's own hooks decide as on a GPU;
* attention block sizes: the CPU backend asks for multiples of 32 and
  sliding-window layers pick their block from their backend's kernel blocks;
  a GPU stand-in with FlashAttention's ``MultipleOf(16)`` replaces it, and the
  base ``Platform.update_block_size_for_backend`` (hybrid alignment: one
  attention page holds one state) runs instead of the CPU one;
* MLA models: the CPU platform forces block size 16 (its MLA kernel's) and turns
  prefix caching off; a GPU keeps both as asked;
* kernels the CPU lacks: fp8 MLA caches and some per-rank MoE shapes are
  refused at backend selection; weights are on meta, so a CPU backend is
  taken anyway (the KV specs do not depend on it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

#: FlashAttention's kernel block constraint (v1/attention/backends/flash_attn.py).
KERNEL_BLOCK = 16


@contextlib.contextmanager
def config_stage() -> Iterator[None]:
    """Make the engine config as on a GPU: hide AVX512-BF16 from the CPU platform."""
    import torch  # deferred: torch

    saved = torch.cpu._is_avx512_bf16_supported
    torch.cpu._is_avx512_bf16_supported = lambda: False
    try:
        yield
    finally:
        torch.cpu._is_avx512_bf16_supported = saved


def undo_cpu_config(vc: Any, s: dict[str, Any]) -> None:
    """Choices ``CpuPlatform.check_and_update_config`` made that a GPU does not:
    MLA models get block size 16 (the CPU MLA kernel's) and lose prefix caching;
    the scheduler runs synchronously. (DeepSeek-V4's 256 is its GPU backends' too.)"""
    mc = vc.model_config
    if mc.use_mla and getattr(mc.hf_config, "model_type", None) != "deepseek_v4":
        vc.cache_config.block_size = s.get("block_size") or vc.cache_config.block_size
    if mc.use_mla and s.get("enable_prefix_caching", True):
        vc.cache_config.enable_prefix_caching = True
    vc.scheduler_config.async_scheduling = vc.parallel_config.pipeline_parallel_size == 1


class StandInBackend:
    """What the GPU attention backend answers about block sizes (FlashAttention)."""

    @classmethod
    def get_supported_kernel_block_sizes(cls, kv_cache_spec: Any = None) -> list[Any]:
        # deferred: vLLM (and torch)
        from vllm.v1.attention.backend import MultipleOf
        return [MultipleOf(KERNEL_BLOCK)]

    @classmethod
    def supports_block_size(cls, block_size: int | None) -> bool:
        return block_size is None or block_size % KERNEL_BLOCK == 0

    @classmethod
    def get_preferred_block_size(cls, default_block_size: int) -> int:
        return default_block_size if cls.supports_block_size(default_block_size) \
            else KERNEL_BLOCK

    @classmethod
    def customize_spec(cls, spec: Any) -> Any:
        return spec

    @classmethod
    def is_ssm(cls) -> bool:
        return False

    @classmethod
    def get_name(cls) -> str:
        return "GPU_STAND_IN"


def update_block_size(vc: Any, layers: dict[str, Any], log: list[str]) -> None:
    """``Platform.update_block_size_for_backend`` by the base (GPU) rules with the
    stand-in backend, where the executor would run the CPU one after loading."""
    # deferred: vLLM (and torch)
    from vllm.platforms.interface import Platform

    has_attention = any(not layer.get_attn_backend().is_ssm() for layer in layers.values())

    class GpuRules(Platform):
        @classmethod
        def _find_non_ssm_backends(cls, vllm_config: Any) -> list[Any]:
            return [StandInBackend] if has_attention else []

    cc = vc.cache_config
    before = (cc.block_size, cc.mamba_block_size, cc.mamba_page_size_padded)
    GpuRules.update_block_size_for_backend(vc)
    after = (cc.block_size, cc.mamba_block_size, cc.mamba_page_size_padded)
    if before != after:
        log.append(f"vLLM's hybrid alignment set the attention block size to {after[0]} "
                   f"(state pages padded to {after[2]} bytes)")


@contextlib.contextmanager
def kernel_blocks(layer: Any) -> Iterator[None]:
    """While a layer makes its spec, its backend reports the GPU kernel blocks
    (sliding-window layers choose their block size from them)."""
    backend = getattr(layer, "attn_backend", None)
    if backend is None or backend.is_ssm():
        yield
        return
    sizes = StandInBackend.get_supported_kernel_block_sizes()
    layer.attn_backend = type("GpuKernelSized" + backend.__name__, (backend,), {
        "get_supported_kernel_block_sizes": staticmethod(lambda kv_cache_spec=None: sizes)})
    try:
        yield
    finally:
        layer.attn_backend = backend


_PATCHED: dict[str, bool] = {}


@contextlib.contextmanager
def meta_build(gdn_backend: str | None = None) -> Iterator[None]:
    """Backend selections the CPU refuses fall back to a CPU backend (once per
    process); Gated-DeltaNet layers take the target's prefill backend, which
    decides their prefill checkpoints (FlashInfer: every 64 tokens)."""
    if not _PATCHED:
        _moe_fallback()
        _mla_fallback()
        _PATCHED["done"] = True
    # deferred: vLLM (and torch)
    from vllm.model_executor.layers.mamba.gdn import qwen_gdn_linear_attn as gdn

    original = gdn._resolve_gdn_prefill_backend
    if gdn_backend is not None:
        gdn._resolve_gdn_prefill_backend = lambda vllm_config: ("auto", gdn_backend)
    try:
        yield
    finally:
        gdn._resolve_gdn_prefill_backend = original


def _moe_fallback() -> None:
    # deferred: vLLM (and torch)
    from vllm.model_executor.layers.fused_moe import unquantized_fused_moe_method as method
    from vllm.model_executor.layers.fused_moe.oracle import unquantized as oracle

    original = oracle.select_unquantized_moe_backend

    def select(*args: Any, **kwargs: Any) -> Any:
        try:
            return original(*args, **kwargs)
        except NotImplementedError:
            moe_config = args[0] if args else kwargs.get("moe_config")
            backend = oracle._get_priority_backends(moe_config)[0]
            return backend, oracle.backend_to_kernel_cls(backend)[0]

    method.select_unquantized_moe_backend = select


def _mla_fallback() -> None:
    # deferred: vLLM (and torch)
    from vllm.platforms import current_platform
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    cls = type(current_platform)
    original = cls.get_attn_backend_cls.__func__

    def get_attn_backend_cls(klass: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return original(klass, *args, **kwargs)
        except ValueError:
            selector = kwargs.get("attn_selector_config", args[1] if len(args) > 1 else None)
            if getattr(selector, "use_mla", False):
                return AttentionBackendEnum.CPU_MLA.get_path()
            raise

    cls.get_attn_backend_cls = classmethod(get_attn_backend_cls)
