"""The freeze pass: the final Layout IR and the source text -> the frozen, hashed
artifact (pure serialisation: every figure is already in the IR)."""

from __future__ import annotations

from kvspec.artifact import Artifact, envelope, sha256_text
from kvspec.artifact.codec import encode
from kvspec.passes.size import Sized


def freeze(sized: Sized) -> Artifact:
    """The Layout IR -> the artifact; the source's sha256 goes in its envelope."""
    data = envelope(encode(sized.layout), source_sha256=sha256_text(sized.text))
    return Artifact(data, sized.layout)
