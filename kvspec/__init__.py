"""kvspec: declare, compile and load KV-cache memory layouts.

>>> import kvspec
>>> artifact = kvspec.compile("layouts/llama-3.1-8b.yaml")
>>> artifact.body.groups[0].kind
'full_attention'

``kvspec.load`` (the runtime loader) imports torch on first use; compiling never does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvspec import _native
from kvspec._version import __version__
from kvspec.errors import KvspecError

_native.install()  # the compiled simulator, or its source (kvspec/_native.py says when)

__all__ = ["Artifact", "KvspecError", "compile", "load", "__version__"]

if TYPE_CHECKING:  # pragma: no cover
    from kvspec.artifact import Artifact


def compile(path: Any, *, memory: int | str | None = None) -> Artifact:  # noqa: A001
    """Compile the layout source at ``path`` into a verified :class:`Artifact`."""
    from kvspec.compiler import compile as _compile  # deferred: the compiler (pydantic, PyYAML)
    return _compile(path, memory=memory)


#: What ``kvspec.load`` needs beyond the compiler: the ``runtime`` extra.
RUNTIME_EXTRA = "pip install 'kvspec[runtime]'"


def load(artifact: Any, **kwargs: Any) -> Any:
    """Map an artifact onto memory: see :func:`kvspec.runtime.loader.load`. Without
    the runtime extra (torch), a :class:`KvspecError` says what to install."""
    try:
        from kvspec.runtime.loader import load as _load  # deferred: torch
    except ImportError as exc:
        if exc.name is None or exc.name.split(".")[0] not in ("torch", "numpy", "cbor2",
                                                               "xxhash"):
            raise
        raise KvspecError(f"kvspec.load needs the runtime extra, and {exc.name} is not "
                          "installed", found=str(exc), hint=f"{RUNTIME_EXTRA} (with the "
                          "torch build for your CUDA); compiling needs none of it") from None
    return _load(artifact, **kwargs)


def __getattr__(name: str) -> Any:
    if name == "Artifact":
        # deferred: msgspec and the plan IR, which `import kvspec` (and --version) skip
        from kvspec.artifact import Artifact
        return Artifact
    raise AttributeError(name)
