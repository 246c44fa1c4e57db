"""``KVSPEC_MODE=allocate`` on vLLM 0.33 (the CUDA engine): kvspec's loader makes the
engine's KV cache, as on 0.32 (:mod:`kvspec.integrations.vllm.v0_32.allocate`).

The hook point is the same: ``GPUModelRunner.initialize_kv_cache_tensors`` calls
``allocate_kv_cache(kv_cache_config, device, layout, kernel_block_sizes)`` by the name
``vllm.v1.worker.gpu_model_runner`` imported, inside the allocation context the worker
gives it (the CuMem pool under sleep mode), and binds the per-layer views it returns.
What differs on a GPU:

* ``device`` is the worker's ``cuda:N``: :func:`kvspec.load` allocates there (inside
  the same allocation context, so a sleeping engine releases kvspec's pool too);
* with tensor or pipeline parallelism, ``torch.distributed`` is initialised in every
  worker: ``load`` agrees on the artifact and the block count with one all-gather and
  one all-reduce over the default group, which every rank reaches at the same point
  of ``initialize_kv_cache``; a rank whose artifact differs stops all of them;
* vLLM's own allocation is ``torch.zeros`` on the device, so kvspec zeroes the whole
  pool too (:data:`~kvspec.integrations.vllm.v0_32.allocate.ZERO`).

Each allocation is proved to be the one vLLM would make before the model runner sees
it: vLLM's views are built on the meta device from the same ``KVCacheConfig``, and every
layer's byte offset, shape, strides and dtype must equal kvspec's. The check runs
without a GPU (the meta device); the CUDA allocation itself runs only where one is.
"""

from __future__ import annotations

from kvspec.integrations.vllm.guard import Expectation
from kvspec.integrations.vllm.v0_32.allocate import (
    HOOK_PARAMETERS,
    LOADED,
    RUNNER_MODULE,
    ZERO,
    allocate,
    check_hook,
    drifts,
    hook,
    kernel_sizes,
    reference,
    unhook,
)

__all__ = ["HOOK_PARAMETERS", "LOADED", "RUNNER_MODULE", "ZERO", "allocate", "check_hook",
           "drifts", "install", "kernel_sizes", "reference", "uninstall"]


def install(expectation: Expectation) -> None:
    """Hold vLLM 0.33's planning to the artifact as ``verify`` does, and make the model
    runner's KV-cache allocation kvspec's."""
    # deferred: vLLM (and torch)
    from kvspec.integrations.vllm.v0_33.builder import install as hold_planning

    hold_planning(expectation)
    hook(expectation, RUNNER_MODULE)


def uninstall() -> None:
    # deferred: vLLM (and torch)
    from kvspec.integrations.vllm.v0_33.builder import uninstall as release_planning

    release_planning()
    unhook()
