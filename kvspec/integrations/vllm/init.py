"""``kvspec init --from-vllm MODEL``: a source whose layers are exactly vLLM's."""

from __future__ import annotations

from pathlib import Path

from kvspec.errors import UsageError
from kvspec.integrations.options import InitOptions

EXTRA = "pip install 'kvspec[vllm]'"


def require_vllm() -> None:
    """A usage error naming the extra to install when vLLM cannot be imported."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise UsageError("this needs vLLM, which is not installed",
                         hint=f"install the integration: {EXTRA} (vLLM 0.33.0)")


def init_source(model: Path, options: InitOptions) -> str:
    """The source text for the model at ``model`` (a directory holding config.json,
    or the file), built by vLLM's own model code on the meta device."""
    require_vllm()
    raise UsageError("kvspec init --from-vllm is not available in this build")
