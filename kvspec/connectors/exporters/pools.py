"""What an engine with one shared pool can hold: the refusal of the exporters of caches
vLLM 0.33 holds (``vllm-nixl``, ``lmcache``).

vLLM 0.33 gives every KV-cache group block ids from one pool (a drafter's own pool
aside, which it keeps beside it). A cache whose groups draw from several pools (the
``separate`` policy: a pool, a region and block ids per class of layers) is not one
it can hold, and its regions would be exported as if they were one pool's: they
would overlap in address and merge layers of different pools.

>>> from kvspec.artifact import Artifact
>>> from kvspec.connectors.describe import describe
>>> one_pool(describe(Artifact.read("layouts/llama-3.1-8b.kvlayout.json")), "vllm-nixl")
>>> separate = describe(Artifact.read("layouts/pooling-separate.kvlayout.json"))
>>> one_pool(separate, "lmcache")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
kvspec.connectors.descriptor.ExportError: kvspec: error: lmcache: the cache holds 2 separate ...
"""

from __future__ import annotations

from kvspec.connectors.descriptor import Descriptor, ExportError
from kvspec.model.pooling import ONE_SHARED_POOL, SERVE_SEPARATE

__all__ = ["one_pool"]


def one_pool(desc: Descriptor, target: str) -> None:
    """Refuse ``desc`` for ``target`` (an exporter of a cache vLLM holds) where its
    groups draw block ids from several pools, naming them and why."""
    pools = list(dict.fromkeys(g.pool for g in desc.groups if not g.own_pool))
    if len(pools) <= 1:
        return
    raise ExportError(f"{target}: the cache holds {len(pools)} separate pools "
                      f"({', '.join(pools)}); {ONE_SHARED_POOL}", path="pools",
                      expected="one pool for every group (a drafter's own pool aside)",
                      found=", ".join(pools), hint=SERVE_SEPARATE)
