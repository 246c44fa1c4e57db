"""kvspec and SGLang: the ``sglang serve`` flags that give an artifact's pools.

SGLang keeps separate pools per layer kind (a full-attention token pool, a
sliding-window token pool, a pool of per-request Mamba state slots), split by
flags users usually hand-tune. ``kvspec engine-args ARTIFACT --engine sglang``
prints the flags that make SGLang size its pools as a kvspec plan does
(:mod:`.server_args`; docs/sglang.md). Nothing here imports SGLang, and the
compiler never imports this package.
"""

from __future__ import annotations

__all__ = ["TARGET"]

#: The SGLang version the flags and their arithmetic are written for.
TARGET = "0.5.23"
