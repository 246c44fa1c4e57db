"""The plugin's hooks in vLLM 0.33.0: a ``KVCacheConfigBuilder`` and two checks.

:func:`install` (called by the plugin in every vLLM process) makes the current
platform's ``get_kv_cache_config_builder_cls`` return :class:`KvspecBuilder`,
and wraps the engine core's ``get_kv_cache_configs`` and
``resolve_kv_cache_block_sizes`` (looked up by name in
``vllm.v1.engine.core`` at call time) to check the final configs and block
sizes. The builder checks the engine's settings and per-layer specs before
anything is planned, then either lets vLLM plan and requires the artifact's
result (``verify``) or returns the artifact's groups and placement
(``enforce``). Every check is :class:`..guard.Expectation`'s; this module only
turns vLLM objects into plain data and back.
"""

from __future__ import annotations

import logging
from typing import Any

from vllm.v1.core.kv_cache_planning import DefaultKVCacheConfigBuilder
from vllm.v1.kv_cache_interface import (
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
)

from kvspec.integrations.vllm.guard import Expectation
from kvspec.integrations.vllm.v0_33 import specs as vspecs
from kvspec.integrations.vllm.v0_33.config import settings_of
from kvspec.integrations.vllm.v0_33.groups import artifact_groups

QUALNAME = f"{__name__}.KvspecBuilder"
#: Under vLLM's logger, so its handlers show the lines with the engine's own.
logger = logging.getLogger("vllm.kvspec")

_state: dict[str, Any] = {}


def expectation() -> Expectation:
    exp = _state.get("expectation")
    if exp is None:
        raise RuntimeError("kvspec: the builder was resolved but the plugin is not installed")
    return exp


def _names(groups: list[KVCacheGroupSpec]) -> list[str]:
    return [n for g in groups for n in g.layer_names]


class KvspecBuilder(DefaultKVCacheConfigBuilder):
    """vLLM's default builder, held to a kvspec artifact (see the module docstring)."""

    def get_kv_cache_groups(self, vllm_config: Any, kv_cache_spec: dict[str, Any]) -> list:
        exp = expectation()
        exp.check_engine(settings_of(vllm_config))
        exp.check_layers({n: vspecs.describe(s) for n, s in kv_cache_spec.items()},
                         vspecs.class_defaults())
        if exp.mode == "enforce":
            return artifact_groups(exp, kv_cache_spec)
        groups = super().get_kv_cache_groups(vllm_config, kv_cache_spec)
        exp.check_groups([vspecs.group_view(g, vllm_config) for g in groups], kv_cache_spec)
        return groups

    def get_kv_cache_config_from_groups(self, vllm_config: Any, kv_cache_groups: list,
                                        num_blocks: int) -> KVCacheConfig:
        exp = expectation()
        names = _names(kv_cache_groups)
        if exp.mode == "enforce" and names:
            tensors = [KVCacheTensor(**t) for t in exp.tensors(names, num_blocks)]
            return KVCacheConfig(
                num_blocks=num_blocks, kv_cache_tensors=tensors, kv_cache_groups=kv_cache_groups,
                prefix_cache_retention_interval=(
                    vllm_config.cache_config.prefix_cache_retention_interval))
        config = super().get_kv_cache_config_from_groups(vllm_config, kv_cache_groups,
                                                         num_blocks)
        if names:
            exp.check_tensors(names, num_blocks,
                              [vspecs.tensor_view(t) for t in config.kv_cache_tensors])
        return config

    def _get_pool_bytes_per_block(self, vllm_config: Any, kv_cache_groups: list) -> int | None:
        exp = expectation()
        if exp.mode != "enforce" or not kv_cache_groups:
            return None
        return exp.bytes_per_block(_names(kv_cache_groups))


# ---------------------------------------------------------------------------
# installing the hooks
# ---------------------------------------------------------------------------

def install(exp: Expectation) -> None:
    """Route this process's KV-cache planning through :class:`KvspecBuilder`."""
    # deferred: vLLM (and torch)
    import vllm.v1.engine.core as core
    from vllm.platforms import current_platform

    if exp.mode == "enforce":
        exp.check_servable()
    platform = type(current_platform)
    if "platform" not in _state:
        _state["platform"] = (platform, platform.__dict__.get("get_kv_cache_config_builder_cls"))
        platform.get_kv_cache_config_builder_cls = classmethod(lambda cls, vc: QUALNAME)
        _state["core"] = {name: getattr(core, name) for name in
                          ("get_kv_cache_configs", "resolve_kv_cache_block_sizes")}
        core.get_kv_cache_configs = _checked_configs
        core.resolve_kv_cache_block_sizes = _checked_block_sizes
    _state["expectation"] = exp
    logger.info("kvspec: KV-cache planning held to %s (%s, mode %s)", exp.path,
                exp.fingerprint, exp.mode)


def uninstall() -> None:
    """Undo :func:`install` (tests; an engine keeps the plugin for its lifetime)."""
    # deferred: vLLM (and torch)
    import vllm.v1.engine.core as core

    if "platform" in _state:
        platform, original = _state.pop("platform")
        if original is None:
            del platform.get_kv_cache_config_builder_cls
        else:
            platform.get_kv_cache_config_builder_cls = original
        for name, fn in _state.pop("core").items():
            setattr(core, name, fn)
    _state.pop("expectation", None)


def _checked_configs(vllm_config: Any, kv_cache_specs: list, available_memory: list,
                     global_kv_cache_groups: list) -> list:
    configs = _state["core"]["get_kv_cache_configs"](
        vllm_config, kv_cache_specs, available_memory, global_kv_cache_groups)
    workers = [vspecs.config_view(c) for c in configs]
    expectation().check_final(min(available_memory), workers,
                              vllm_config.model_config.max_model_len)
    return configs


def _checked_block_sizes(scheduler_config: Any, vllm_config: Any) -> tuple[int, int]:
    sizes = _state["core"]["resolve_kv_cache_block_sizes"](scheduler_config, vllm_config)
    expectation().check_block_sizes(*sizes)
    return sizes
