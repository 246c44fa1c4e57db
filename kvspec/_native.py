"""Which of kvspec's modules are compiled, and whether the compiled build is used.

The simulator's hot path (the block pool, the request-level manager and the
scheduler model) is compiled with mypyc when kvspec is installed (``setup.py``):
the same source, about twice as fast (``benchmarks/bench_simulate.py``). The
compiled modules are one unit (they call each other natively), so they are used
all together or not at all. They are not used, and the Python source is imported
instead, when

* ``KVSPEC_PURE_PYTHON`` is set (to anything but ``0`` or an empty string);
* any of them is missing for this interpreter (a build without a C compiler, or
  another Python version), or
* any module's source differs from the one it was compiled from (the file's
  SHA-256, recorded at build time in ``_native.json``): an edit after
  ``pip install -e .`` is never shadowed by a stale build.

:data:`STATE` says which, and why; ``kvspec --version`` prints it.

This module imports nothing of kvspec (``setup.py`` reads :data:`MODULES` from it).
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
from pathlib import Path

__all__ = ["MODULES", "STATE", "install", "source_digest"]

#: The compiled modules, dotted; a module here imports only modules here, the
#: standard library and kvspec's uncompiled modules.
MODULES: tuple[str, ...] = (
    "kvspec.runtime.block_pool_queue",
    "kvspec.runtime.block_pool",
    "kvspec.runtime.manager.request",
    "kvspec.runtime.manager.lookup",
    "kvspec.runtime.manager.state",
    "kvspec.runtime.manager.single",
    "kvspec.runtime.manager.manager",
    "kvspec.sim.request",
    "kvspec.sim.chains",
    "kvspec.sim.chunks",
    "kvspec.sim.metrics",
    "kvspec.sim.lazy",
    "kvspec.sim.schedule",
    "kvspec.sim.engine",
)

#: The file ``setup.py`` writes beside this one: {module: SHA-256 of its source}.
MANIFEST = "_native.json"

ROOT = Path(__file__).resolve().parent.parent
MANIFEST_PATH = ROOT / "kvspec" / MANIFEST


def source_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _source(module: str) -> Path:
    return ROOT.joinpath(*module.split(".")).with_suffix(".py")


def _decide() -> str:
    """``compiled``, or ``source: <why>``."""
    flag = os.environ.get("KVSPEC_PURE_PYTHON", "")
    if flag not in ("", "0"):
        return "source: KVSPEC_PURE_PYTHON is set"
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    try:
        recorded = json.loads(MANIFEST_PATH.read_text())
    except (OSError, ValueError):
        return "source: not compiled (no build manifest)"
    for module in MODULES:
        source = _source(module)
        if not source.with_name(source.stem + suffix).exists():
            return f"source: {module} is not compiled for this Python"
        try:
            if recorded.get(module) != source_digest(source):
                return (f"source: {source.name} changed since it was compiled "
                        "(pip install -e . again to rebuild)")
        except OSError:
            return f"source: {module}'s source is missing"
    return "compiled"


class _SourceFirst(importlib.abc.MetaPathFinder):
    """Imports the compiled modules from their Python source."""

    def find_spec(self, fullname: str, path: object, target: object = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _NAMES:
            return None
        source = _source(fullname)
        loader = importlib.machinery.SourceFileLoader(fullname, str(source))
        return importlib.util.spec_from_file_location(fullname, source, loader=loader)


_NAMES = frozenset(MODULES)

#: ``compiled`` or ``source: <why>``; set by :func:`install`.
STATE = "source: not decided"


def install() -> str:
    """Decide once per process (before any compiled module is imported)."""
    global STATE  # noqa: PLW0603 - decided once per process, read by --version
    if STATE == "source: not decided":
        STATE = _decide()
        if STATE != "compiled":
            sys.meta_path.insert(0, _SourceFirst())
    return STATE
