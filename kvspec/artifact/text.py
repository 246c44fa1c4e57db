"""The artifact's text: canonical JSON, its hash, the file form and the schema.

The hash covers the *canonical* text of everything but ``sha256`` itself:
``msgspec.json.encode`` of the records with sorted keys, compact, UTF-8 (no
``\\u`` escapes for non-ASCII). A file holds the same JSON indented one space
a level, so a reviewer can diff it; whitespace is never part of what is hashed.
Decoding a file and encoding it again gives the canonical text back exactly
when nothing was edited: every field is written (no defaults omitted), unknown
fields are refused, and numbers keep their JSON type.

>>> from kvspec.artifact.format import Affine
>>> canonical(Affine(per_block=2, fixed=0))
b'{"fixed":0,"per_block":2}'
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from kvspec.artifact.format import Envelope, Unsigned

_encoder = msgspec.json.Encoder(order="sorted")


def canonical(record: Any) -> bytes:
    """The canonical compact JSON of ``record``: sorted keys, no whitespace."""
    return _encoder.encode(record)


def sha256_of(data: bytes | str) -> str:
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    return hashlib.sha256(raw).hexdigest()


def signature(unsigned: Unsigned) -> str:
    """The ``sha256`` an envelope must carry: over the canonical text of the rest."""
    return sha256_of(canonical(unsigned))


def sign(unsigned: Unsigned) -> Envelope:
    """``unsigned`` with its ``sha256``, over its text as a reader decodes it (a
    field typed ``float`` that was given an int is signed as the float it reads
    back as, so every artifact verifies)."""
    unsigned = msgspec.json.decode(canonical(unsigned), type=Unsigned)
    return Envelope(body=unsigned.body, compiler=unsigned.compiler, format=unsigned.format,
                    source_sha256=unsigned.source_sha256, sha256=signature(unsigned))


def file_text(envelope: Envelope) -> str:
    """The text of an artifact file: the canonical JSON indented one space a level."""
    return msgspec.json.format(canonical(envelope), indent=1).decode("utf-8") + "\n"


def json_schema() -> dict[str, Any]:
    """The artifact format's JSON Schema (``schemas/artifact.schema.json``)."""
    schema: dict[str, Any] = msgspec.json.schema(Envelope)
    return schema
