"""Placing an imported source's errors in the dump the user gave.

The source ``kvspec import`` writes is one the user has not seen yet, so a
problem found while compiling it is reported at the dump's own file, line and
column: engine and parallelism settings at their ``config`` key, a layer's
problem at the first dump layer of that layer type.

>>> dump = {"config": {"block_size": 16, "max_model_len": 64}, "layers": []}
>>> dump_path("engine.block_size", dump, {})
('config', 'block_size')
"""

from __future__ import annotations

import re
from typing import Any

from kvspec.errors import KvspecError, LayerRef, Location
from kvspec.integrations.dump.jsontext import positions
from kvspec.model.engine import SETTINGS, BudgetRef, SettingRef

#: Source keys -> the dump config key they come from: each engine setting's key in
#: the source and vLLM's name for it (a dump's config keys are vLLM's names), from
#: the one declaration of engine settings, and the two source keys that are no
#: setting.
_CONFIG = {**{s.source_key: s.vllm for s in SETTINGS
              if s.source_key is not None and s.vllm is not None},
           "engine.model_max_len": "max_model_len", "engine.memory": "available_memory_bytes"}
_TYPE = re.compile(r"^layer_types\.([^.\[]+)")


def dump_path(path: str, dump: dict[str, Any], first_layer_of_type: dict[str, int]
              ) -> tuple[str | int, ...] | None:
    """The dump path a source path came from, or None."""
    for prefix, key in _CONFIG.items():
        if path.startswith(prefix) and key in (dump.get("config") or {}):
            return ("config", key)
    m = _TYPE.match(path)
    if m and m.group(1) in first_layer_of_type:
        return ("layers", first_layer_of_type[m.group(1)])
    if path.startswith(("engine", "parallel", "quantization")):
        return ("config",)
    return None


def _ref_target(err: KvspecError, dump: dict[str, Any]) -> tuple[str | int, ...] | None:
    """The dump path of what ``err`` refers to (a layer, an engine setting, the
    budget), or None when it refers to nothing the dump holds by name."""
    ref, config = err.ref, dump.get("config") or {}
    if isinstance(ref, LayerRef):
        names = [layer.get("name") for layer in dump.get("layers", [])]
        return ("layers", names.index(ref.name)) if ref.name in names else None
    if isinstance(ref, (SettingRef, BudgetRef)):
        key = _CONFIG.get(ref.shown())
        return ("config", key) if key is not None and key in config else ("config",)
    return None


def in_dump(err: KvspecError, *, file: str, text: str | None, dump: dict[str, Any],
            source: dict[str, Any], first_layer_of_type: dict[str, int]) -> KvspecError:
    """``err`` (about the imported source) located in the dump at ``file``: by what
    it refers to, else by its path in the source."""
    path = err.path or ""
    target = _ref_target(err, dump) or dump_path(path, dump, first_layer_of_type)
    if target is None and path.startswith("layers"):
        target = ("layers", _entry_layer(path, source, first_layer_of_type))
    line = column = None
    if target is not None and text is not None:
        try:
            pos = positions(text, file).position(target)
        except KvspecError:
            pos = None
        if pos:
            line, column = pos
    shown = ".".join(str(p) for p in target) if target else None
    hint = err.hint or "fix the dump, or import it and fix the source it writes"
    return err.replace(location=Location(file, line, column, shown), hint=hint)


def _entry_layer(path: str, source: dict[str, Any], first: dict[str, int]) -> int:
    """The first dump layer of the type a ``layers[e].pattern[p]`` path names."""
    m = re.match(r"layers\[(\d+)\](?:\.pattern\[(\d+)\])?", path)
    if not m:
        return 0
    entry = source["layers"][int(m.group(1))]
    item = entry.get("pattern", [entry.get("type")])[int(m.group(2) or 0)]
    return min((first[t] for t in str(item).split("+") if t in first), default=0)
