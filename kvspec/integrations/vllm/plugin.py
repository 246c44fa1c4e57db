"""The ``vllm.general_plugins`` entry point: does nothing unless ``KVSPEC_LAYOUT`` is set."""

from __future__ import annotations

import os


def register() -> None:
    """Called by vLLM in every process (``vllm.plugins.load_general_plugins``)."""
    if not os.environ.get("KVSPEC_LAYOUT"):
        return
    from kvspec.errors import UsageError
    raise UsageError("KVSPEC_LAYOUT is set, but this kvspec build has no vLLM plugin yet")
