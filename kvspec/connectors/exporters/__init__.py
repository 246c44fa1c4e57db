"""Exporters: a :class:`~kvspec.connectors.descriptor.Descriptor` in the formats the
field's connectors read (``kvspec descriptor --as NAME``).

- ``vllm-nixl`` (:mod:`.vllm_nixl`): vLLM 0.33.0's ``NixlAgentMetadata`` fields;
- ``lmcache`` (:mod:`.lmcache`): what LMCache 0.5.6 derives from a vLLM cache (each
  layer's ``EngineKVFormat``, ``LayoutHints``, ``EngineGroupInfo``, kernel groups);
- ``dynamo`` (:mod:`.dynamo`): Dynamo KVBM's ``LayoutDescriptor`` JSON.

Each returns plain JSON data, or raises
:class:`~kvspec.connectors.descriptor.ExportError` naming the field the target
format cannot express and why. A cache its engine cannot serve is refused the same
way: ``vllm-nixl`` and ``lmcache`` describe a cache vLLM 0.33 holds, one shared
pool (a drafter's own pool aside), so a plan of several pools (the ``separate``
policy) is refused by both, in the words ``kvspec engine-args`` uses
(:func:`one_pool`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvspec.connectors.descriptor import Descriptor
from kvspec.connectors.exporters import dynamo, lmcache, vllm_nixl
from kvspec.connectors.exporters.pools import one_pool

__all__ = ["EXPORTERS", "export", "one_pool"]

#: ``--as`` name -> exporter.
EXPORTERS: dict[str, Callable[[Descriptor], dict[str, Any]]] = {
    "vllm-nixl": vllm_nixl.export, "lmcache": lmcache.export, "dynamo": dynamo.export}


def export(desc: Descriptor, target: str) -> dict[str, Any]:
    """``desc`` as ``target`` reads it (JSON data)."""
    return EXPORTERS[target](desc)
