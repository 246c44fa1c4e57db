"""The adapter for vLLM 0.33.0: everything in kvspec that calls vLLM's API.

* :mod:`.specs` -- spec objects <-> plain descriptions, configs as views;
* :mod:`.config` -- a ``VllmConfig`` for a plan's engine settings, and back;
* :mod:`.planning` -- vLLM's planning calls, as the engine core makes them;
* :mod:`.meta` -- a model built on the meta device, its layers' real specs;
* :mod:`.gpu` -- the GPU rules where the CPU platform decides its own way;
* :mod:`.builder` -- the plugin's ``KVCacheConfigBuilder`` and its hooks.

A later vLLM gets a sibling package with the same functions.
"""

import sys

VERSION = "0.33.0"


def platform_problem():
    """Why this process cannot run vLLM's planning offline, or None: vLLM chose
    its platform (on first use) before ``VLLM_TARGET_DEVICE=cpu`` was set, found
    no accelerator, and left the unspecified platform, whose empty device string
    fails deep inside its config code."""
    platforms = sys.modules.get("vllm.platforms")
    current = getattr(platforms, "_current_platform", None)
    if current is None or getattr(current, "device_type", "x"):
        return None
    return ("vLLM chose no platform in this process: it was imported and asked for "
            "one before VLLM_TARGET_DEVICE=cpu was set, and found no GPU")


def plan(settings, stages, memory):
    """vLLM's plan of per-stage vLLM descriptions (see :func:`.planning.plan`)."""
    # deferred: vLLM (and torch)
    from kvspec.integrations.vllm.v0_33.planning import plan as _plan
    return _plan(settings, stages, memory)


def class_defaults():
    # deferred: vLLM (and torch)
    from kvspec.integrations.vllm.v0_33.specs import class_defaults as _defaults
    return _defaults()


def install(expectation):
    """Route this process's KV-cache planning through kvspec's builder (``verify``,
    ``enforce``); ``allocate``: also let kvspec allocate the engine's KV cache."""
    if expectation.mode == "allocate":
        # deferred: vLLM (and torch)
        from kvspec.integrations.vllm.v0_33.allocate import install as _allocate
        _allocate(expectation)
        return
    # deferred: vLLM (and torch)
    from kvspec.integrations.vllm.v0_33.builder import install as _install
    _install(expectation)


def uninstall():
    # deferred: vLLM (and torch)
    from kvspec.integrations.vllm.v0_33.builder import uninstall as _uninstall
    _uninstall()


def build(path, settings, dtype=None, progress=None):
    """Every pipeline stage's layers of the model at ``path`` (see :func:`.meta.build`)."""
    # deferred: vLLM (and torch)
    from kvspec.integrations.vllm.v0_33.meta import build as _build
    return _build(path, settings, dtype, progress)


def replay_engine(settings, stages, memory, num_blocks, live, trace, *, hash_fn="sha256",
                  log_blocks=False):
    """vLLM's own scheduler for a plan, as a step engine (see :mod:`.scheduler`)."""
    # deferred: vllm (the scheduler module imports it)
    from kvspec.integrations.vllm.v0_33.scheduler import VllmEngine, build
    scheduler, hasher = build(settings, stages, memory, num_blocks, hash_fn=hash_fn)
    return VllmEngine(scheduler, hasher, live, trace, log_blocks=log_blocks)
