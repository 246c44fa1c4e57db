"""kvspec: declare, compile and load KV-cache memory layouts.

>>> import kvspec
>>> artifact = kvspec.compile("layouts/llama-3.1-8b.yaml")
>>> artifact.body.groups[0].kind
'full_attention'

``kvspec.load`` (the runtime loader) imports torch on first use; compiling never does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvspec._version import __version__

__all__ = ["Artifact", "KvspecError", "compile", "load", "__version__"]

if TYPE_CHECKING:  # pragma: no cover
    from kvspec.artifact import Artifact
    from kvspec.errors import KvspecError


def compile(path: Any, *, memory: int | str | None = None) -> Artifact:  # noqa: A001
    """Compile the layout source at ``path`` into a verified :class:`Artifact`."""
    from kvspec.compiler import compile as _compile
    return _compile(path, memory=memory)


def load(artifact: Any, **kwargs: Any) -> Any:
    """Map an artifact onto memory: see :func:`kvspec.runtime.loader.load`."""
    from kvspec.runtime.loader import load as _load
    return _load(artifact, **kwargs)


def __getattr__(name: str) -> Any:
    if name == "Artifact":
        from kvspec.artifact import Artifact
        return Artifact
    if name == "KvspecError":
        from kvspec.errors import KvspecError
        return KvspecError
    raise AttributeError(name)
