"""The plugin's hooks in vLLM 0.32.0: its planning functions, wrapped.

vLLM 0.32 has no ``KVCacheConfigBuilder`` (0.33's hook): the engine core calls
``get_kv_cache_configs`` (imported by name into ``vllm.v1.engine.core``), which
calls ``get_kv_cache_groups``, ``_pool_bytes_per_block`` and
``get_kv_cache_config_from_groups``, module functions of
``vllm.v1.core.kv_cache_utils`` looked up at call time. :func:`install` (called
by the plugin in every vLLM process) replaces them there, and the engine
core's ``get_kv_cache_configs`` and ``resolve_kv_cache_block_sizes``:

* ``get_kv_cache_groups`` checks the engine's settings and per-layer specs
  before anything is planned, then lets vLLM group them and requires the
  artifact's groups (``verify``), or returns the artifact's groups
  (``enforce``);
* ``_pool_bytes_per_block`` is the artifact's bytes per block (``enforce``),
  so the memory checks and auto-fit plan against the artifact's pool;
* ``get_kv_cache_config_from_groups`` requires the artifact's tensors for the
  block count vLLM chose (``verify``), or places the artifact's tensors at
  ``available_memory // bytes_per_block`` blocks (``enforce``; the
  ``num_gpu_blocks_override`` applies as in vLLM);
* ``get_kv_cache_configs`` and ``resolve_kv_cache_block_sizes`` check the
  final configs and block sizes (both modes).

Every check is :class:`..guard.Expectation`'s; this module only turns vLLM
objects into plain data and back.
"""

from __future__ import annotations

import logging
from typing import Any

from vllm.v1.kv_cache_interface import (
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
)

from kvspec.integrations.vllm.guard import Expectation
from kvspec.integrations.vllm.v0_33 import specs as vspecs
from kvspec.integrations.vllm.v0_33.config import settings_of
from kvspec.integrations.vllm.v0_33.groups import artifact_groups

#: Under vLLM's logger, so its handlers show the lines with the engine's own.
logger = logging.getLogger("vllm.kvspec")

#: The functions of ``vllm.v1.core.kv_cache_utils`` replaced, and of the engine core.
UTILS = ("get_kv_cache_groups", "_pool_bytes_per_block", "get_kv_cache_config_from_groups")
CORE = ("get_kv_cache_configs", "resolve_kv_cache_block_sizes")

_state: dict[str, Any] = {}


def expectation() -> Expectation:
    exp = _state.get("expectation")
    if exp is None:
        raise RuntimeError("kvspec: the hooks were called but the plugin is not installed")
    return exp


def _names(groups: list[KVCacheGroupSpec]) -> list[str]:
    return [n for g in groups for n in g.layer_names]


def _original(name: str) -> Any:
    return _state["utils"].get(name) or _state["core"][name]


# ---------------------------------------------------------------------------
# the hooks
# ---------------------------------------------------------------------------

def get_kv_cache_groups(vllm_config: Any, kv_cache_spec: dict[str, Any]) -> list:
    exp = expectation()
    exp.check_engine(settings_of(vllm_config))
    exp.check_layers({n: vspecs.describe(s) for n, s in kv_cache_spec.items()},
                     vspecs.class_defaults())
    if exp.mode == "enforce":
        return artifact_groups(exp, kv_cache_spec)
    groups = _original("get_kv_cache_groups")(vllm_config, kv_cache_spec)
    exp.check_groups([vspecs.group_view(g, vllm_config) for g in groups], kv_cache_spec)
    return groups


def _pool_bytes_per_block(vllm_config: Any, kv_cache_groups: list) -> int:
    exp = expectation()
    names = _names(kv_cache_groups)
    if exp.mode == "enforce" and names:
        per_block = exp.bytes_per_block(names)
        if per_block is not None:
            return per_block
    return _original("_pool_bytes_per_block")(vllm_config, kv_cache_groups)


def get_kv_cache_config_from_groups(vllm_config: Any, kv_cache_groups: list,
                                    available_memory: int) -> KVCacheConfig:
    exp = expectation()
    names = _names(kv_cache_groups)
    if exp.mode == "enforce" and names:
        from vllm.v1.core.kv_cache_utils import may_override_num_blocks  # deferred: vLLM

        per_block = exp.bytes_per_block(names)
        if per_block is None:
            exp.tensors(names, 0)  # raises: these layers are no stage of the artifact
            raise AssertionError("unreachable")
        num_blocks = may_override_num_blocks(vllm_config, available_memory // per_block)
        tensors = [KVCacheTensor(**t) for t in exp.tensors(names, num_blocks)]
        return KVCacheConfig(
            num_blocks=num_blocks, kv_cache_tensors=tensors, kv_cache_groups=kv_cache_groups,
            prefix_cache_retention_interval=(
                vllm_config.cache_config.prefix_cache_retention_interval))
    config = _original("get_kv_cache_config_from_groups")(vllm_config, kv_cache_groups,
                                                          available_memory)
    if names:
        exp.check_tensors(names, config.num_blocks,
                          [vspecs.tensor_view(t) for t in config.kv_cache_tensors])
    return config


def _checked_configs(vllm_config: Any, kv_cache_specs: list, available_memory: list) -> list:
    configs = _state["core"]["get_kv_cache_configs"](vllm_config, kv_cache_specs,
                                                     available_memory)
    workers = [vspecs.config_view(c) for c in configs]
    expectation().check_final(min(available_memory), workers,
                              vllm_config.model_config.max_model_len)
    return configs


def _checked_block_sizes(scheduler_config: Any, vllm_config: Any) -> tuple[int, int]:
    sizes = _state["core"]["resolve_kv_cache_block_sizes"](scheduler_config, vllm_config)
    expectation().check_block_sizes(*sizes)
    return sizes


# ---------------------------------------------------------------------------
# installing the hooks
# ---------------------------------------------------------------------------

_HOOKS = {"get_kv_cache_groups": get_kv_cache_groups,
          "_pool_bytes_per_block": _pool_bytes_per_block,
          "get_kv_cache_config_from_groups": get_kv_cache_config_from_groups,
          "get_kv_cache_configs": _checked_configs,
          "resolve_kv_cache_block_sizes": _checked_block_sizes}


def install(exp: Expectation) -> None:
    """Route this process's KV-cache planning through the hooks above."""
    # deferred: vLLM (and torch)
    import vllm.v1.core.kv_cache_utils as utils
    import vllm.v1.engine.core as core

    if exp.mode == "enforce":
        exp.check_servable()
    if "utils" not in _state:
        _state["utils"] = {name: getattr(utils, name) for name in UTILS}
        _state["core"] = {name: getattr(core, name) for name in CORE}
        for name in UTILS:
            setattr(utils, name, _HOOKS[name])
        for name in CORE:
            setattr(core, name, _HOOKS[name])
    _state["expectation"] = exp
    logger.info("kvspec: KV-cache planning held to %s (%s, mode %s, vLLM %s)", exp.path,
                exp.fingerprint, exp.mode, _version())


def _version() -> str:
    import vllm  # deferred: vLLM
    return str(vllm.__version__)


def uninstall() -> None:
    """Undo :func:`install` (tests; an engine keeps the plugin for its lifetime)."""
    # deferred: vLLM (and torch)
    import vllm.v1.core.kv_cache_utils as utils
    import vllm.v1.engine.core as core

    if "utils" in _state:
        for name, fn in _state.pop("utils").items():
            setattr(utils, name, fn)
        for name, fn in _state.pop("core").items():
            setattr(core, name, fn)
    _state.pop("expectation", None)
