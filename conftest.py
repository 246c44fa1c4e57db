"""Collection for ``pytest --doctest-modules``: every docstring example in kvspec/
runs, except in the modules whose optional dependency is not installed."""

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
    return None
