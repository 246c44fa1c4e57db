"""The request-level KV cache manager (no torch): blocks for requests, across groups.

* :mod:`.spec` -- the plain data it manages: :class:`ManagedPool`,
  :class:`ManagedGroup`, :class:`ManagedLayout`;
* :mod:`.manager` -- :class:`KVCacheManager`: prefix-cache hits, allocation with
  lookahead, freeing skipped blocks, caching, freeing a request;
* :mod:`.single`, :mod:`.state`, :mod:`.lookup` -- each group kind's decisions;
* :mod:`.request` -- :class:`RequestState`, a request's counts, tables and keys;
* :mod:`.adapter` -- :func:`from_artifact`, today's artifact as that plain data.

With one pool shared by every group it makes vLLM 0.33's decisions (block ids
and free-queue order); :mod:`kvspec.sim` schedules requests over it.
"""

from kvspec.runtime.manager.adapter import from_artifact
from kvspec.runtime.manager.manager import KVCacheManager
from kvspec.runtime.manager.request import RequestState
from kvspec.runtime.manager.spec import (
    KINDS,
    STATE_MODES,
    ManagedGroup,
    ManagedLayout,
    ManagedPool,
    ManagerError,
)

__all__ = ["KINDS", "STATE_MODES", "KVCacheManager", "ManagedGroup", "ManagedLayout",
           "ManagedPool", "ManagerError", "RequestState", "from_artifact"]
