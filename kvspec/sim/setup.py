"""The simulator's view of a compiled layout (for callers outside the runtime)."""

from __future__ import annotations

from typing import Any

from kvspec.runtime.manager import ManagedLayout, from_artifact

__all__ = ["layout_of"]


def layout_of(artifact: Any, num_blocks: int | None = None) -> ManagedLayout:
    """``artifact``'s groups and pools as the manager manages them, with ``num_blocks``
    blocks in its main pool (default: its own for its budget)."""
    return from_artifact(artifact, num_blocks)
