"""vLLM 0.33.0's MLA attention backend on a CUDA GPU class, and the block size it sets.

An MLA model (DeepSeek-V2/V3/R1, Kimi-K2) runs on whichever MLA backend vLLM
picks for the GPU, and vLLM sets the KV-cache block size to what that
backend's kernels take when the user gives no ``--block-size``:

* ``platforms/cuda.py`` ``_get_backend_priorities(use_mla=True, ...)`` lists the
  backends per compute-capability major, best first;
* ``CudaPlatform.get_valid_backends`` keeps the first whose
  ``validate_configuration`` passes: its compute capability, the KV-cache
  dtype (``supported_kv_cache_dtypes``) and ``supports_combination``
  (FlashInfer MLA needs ``qk_nope_head_dim`` in 64, 128, 192);
* ``platforms/interface.py`` ``update_block_size_for_backend`` then sets
  ``block_size`` to ``get_preferred_block_size(16)`` (``v1/attention/backend.py``):
  16 when the kernels take it, else the smallest size they take.

The backends and their kernel block sizes are those of
``v1/attention/backends/mla/*.py``. TokenSpeed MLA (Blackwell, fp8) needs a
package vLLM does not install, and is left out, as it is out of a plain install.
Dense MLA only: sparse MLA (DeepSeek-V3.2) has backends of its own.

>>> from kvspec.integrations.rules import target
>>> mla_backend(target("hopper"), "auto", 128)
('FLASH_ATTN_MLA', 16)
>>> mla_backend(target("hopper"), "fp8", 128)
('FLASHMLA', 64)
>>> mla_backend(target("blackwell"), "auto", 128)
('FLASHINFER_MLA', 32)
>>> mla_backend(target("ampere"), "auto", 128)
('TRITON_MLA', 16)
"""

from __future__ import annotations

from dataclasses import dataclass

from kvspec.integrations.rules import GPU_TARGETS, Target

__all__ = ["DEFAULT_BLOCK_SIZE", "MlaBackend", "mla_backend", "mla_block_note"]

#: ``CacheConfig.DEFAULT_BLOCK_SIZE``.
DEFAULT_BLOCK_SIZE = 16
_DENSE = ("auto", "float16", "bfloat16")
_FP8 = ("fp8", "fp8_e4m3")


@dataclass(frozen=True)
class MlaBackend:
    """One of vLLM's dense MLA backends, as far as choosing it and its block goes."""

    name: str
    #: Compute-capability majors it runs on (``supports_compute_capability``).
    majors: tuple[int, ...]
    kv_cache_dtypes: tuple[str, ...]
    #: ``get_supported_kernel_block_sizes``: a block must be a multiple of one.
    kernel_blocks: tuple[int, ...]
    #: ``supports_combination``: the ``qk_nope_head_dim`` values it takes (None: any).
    qk_nope_head_dims: tuple[int, ...] | None = None

    def takes(self, major: int, kv_cache_dtype: str, qk_nope_head_dim: int | None) -> bool:
        return major in self.majors and kv_cache_dtype in self.kv_cache_dtypes and (
            self.qk_nope_head_dims is None or qk_nope_head_dim in self.qk_nope_head_dims)

    def preferred_block_size(self, default: int = DEFAULT_BLOCK_SIZE) -> int:
        """``AttentionBackend.get_preferred_block_size``."""
        if any(default % k == 0 for k in self.kernel_blocks):
            return default
        return min(self.kernel_blocks)


FLASH_ATTN_MLA = MlaBackend("FLASH_ATTN_MLA", (9,), _DENSE, (16,))
FLASHMLA = MlaBackend("FLASHMLA", (9, 10), _DENSE + _FP8, (64,))
FLASHINFER_MLA = MlaBackend("FLASHINFER_MLA", (10,), _DENSE + _FP8, (32, 64), (64, 128, 192))
CUTLASS_MLA = MlaBackend("CUTLASS_MLA", (10,), _DENSE + _FP8, (128,))
TRITON_MLA = MlaBackend("TRITON_MLA", tuple(range(20)), _DENSE + _FP8, (16,))

#: ``_get_backend_priorities(use_mla=True)``, dense backends, by capability major.
PRIORITIES: dict[int, tuple[MlaBackend, ...]] = {
    10: (FLASHINFER_MLA, CUTLASS_MLA, FLASH_ATTN_MLA, FLASHMLA, TRITON_MLA),
    12: (TRITON_MLA,),
}
_OTHERS = (FLASH_ATTN_MLA, FLASHMLA, FLASHINFER_MLA, TRITON_MLA)


def mla_backend(t: Target, kv_cache_dtype: str,
                qk_nope_head_dim: int | None) -> tuple[str, int] | None:
    """``(backend, block_size)`` vLLM 0.33.0 picks for dense MLA on ``t``'s GPU class;
    None when ``t`` names no GPU, or no backend takes the KV-cache dtype."""
    if t.capability is None:
        return None
    major = t.capability[0]
    for backend in PRIORITIES.get(major, _OTHERS):
        if backend.takes(major, kv_cache_dtype, qk_nope_head_dim):
            return backend.name, backend.preferred_block_size()
    return None


def mla_block_note(t: Target, kv_cache_dtype: str, qk_nope_head_dim: int | None,
                   block_size: int) -> str:
    """The header note of an MLA source: which backend its ``block_size`` assumes.

    >>> from kvspec.integrations.rules import target
    >>> print(mla_block_note(target(None), "auto", 128, 16))  # doctest: +NORMALIZE_WHITESPACE
    block_size 16 is what vLLM 0.33.0 sets for MLA on volta, turing, ampere, ada (TRITON_MLA)
    and hopper (FLASH_ATTN_MLA); on blackwell it is 32 (FLASHINFER_MLA): say where it runs
    with --target.
    """
    chosen = mla_backend(t, kv_cache_dtype, qk_nope_head_dim)
    if chosen is not None:
        name, size = chosen
        backend = next(b for b in (*_OTHERS, CUTLASS_MLA) if b.name == name)
        takes = " or ".join(map(str, backend.kernel_blocks))
        return (f"block_size {size}: on {t.name} vLLM 0.33.0 serves MLA with its {name} "
                f"backend (kv_cache_dtype {kv_cache_dtype}), whose kernels take blocks of a "
                f"multiple of {takes}; pass --block-size to choose another.")
    if t.capability is not None:
        return (f"no dense MLA backend of vLLM 0.33.0 takes kv_cache_dtype {kv_cache_dtype} "
                f"on {t.name}; block_size {block_size} is vLLM's default.")
    same: dict[str, list[str]] = {}
    other: dict[tuple[str, int], list[str]] = {}
    for name, cap in GPU_TARGETS.items():
        got = mla_backend(Target(name, cap), kv_cache_dtype, qk_nope_head_dim)
        if got is None:
            continue
        if got[1] == block_size:
            same.setdefault(got[0], []).append(name)
        else:
            other.setdefault(got, []).append(name)
    here = " and ".join(f"{', '.join(gpus)} ({b})" for b, gpus in same.items())
    there = "; ".join(f"on {', '.join(gpus)} it is {size} ({b})"
                      for (b, size), gpus in other.items())
    return (f"block_size {block_size} is what vLLM 0.33.0 sets for MLA on {here}"
            + (f"; {there}: say where it runs with --target." if there else "."))
