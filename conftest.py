"""Collection for ``pytest --doctest-modules``: every docstring example in kvspec/
runs, except in the modules whose optional dependency is not installed. The modules
compiled with mypyc (``kvspec/_native.py``), when the compiled build is in use, run
theirs from source in ``tests/test_native.py``: a compiled module has no Python
functions for doctest to find."""

from __future__ import annotations

import importlib.util
from pathlib import Path

#: Package folders and the import each needs.
_OPTIONAL = {"kvspec/runtime": "torch", "kvspec/integrations/vllm/v0_33": "vllm",
             "kvspec/integrations/vllm/v0_32": "vllm"}


def pytest_ignore_collect(collection_path: Path, config) -> bool | None:
    rel = collection_path.resolve().relative_to(Path(__file__).parent).as_posix() \
        if collection_path.resolve().is_relative_to(Path(__file__).parent) else ""
    for folder, module in _OPTIONAL.items():
        if rel.startswith(folder) and importlib.util.find_spec(module) is None:
            return True
    if rel in ("kvspec/__main__.py", "kvspec/cli/__main__.py"):
        return True
    if rel in _compiled():
        return True
    return None


def _compiled() -> frozenset[str]:
    """The compiled modules' source files, when the compiled build is in use."""
    from kvspec import _native

    if _native.install() != "compiled":
        return frozenset()
    return frozenset(m.replace(".", "/") + ".py" for m in _native.MODULES)
