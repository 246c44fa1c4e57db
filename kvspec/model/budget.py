"""Capacity for a memory budget: the one record the planner's plan and the frozen
artifact share (:class:`kvspec.artifact.format.Budget` is this class).

Declared here, below both, so that the plan can hold it without the model
importing the artifact format: the format imports the model, never the reverse.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

__all__ = ["Budget"]

_NonNeg = Annotated[int, Meta(ge=0)]
_Pos = Annotated[int, Meta(ge=1)]


# the artifact's closed-record settings (kvspec.artifact.format.Record), spelled out:
# that base lives above the model
class Budget(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Capacity for the memory budget the layout was sized for."""

    memory: _NonNeg
    num_blocks: _Pos
    #: Requests at ``max_model_len`` the blocks hold (None: unbounded, no group
    #: takes blocks per request).
    max_concurrency: float | None
    kv_cache_size_tokens: _NonNeg
    max_model_len: _Pos
    estimated_max_model_len: _NonNeg
