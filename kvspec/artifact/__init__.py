"""The frozen layout artifact: canonical JSON, versioned, hashed, verified on reading.

An artifact is compiled once and loaded under any memory budget. Its body is
the Layout IR (:mod:`kvspec.model.plan`) serialised by :mod:`.codec`; the
envelope adds the format, the compiler and the source's sha256, and
``sha256`` covers all of them (the canonical compact JSON of everything but
itself). Same source + same compiler -> byte-identical artifact on any
machine: keys are sorted, formatting fixed, nothing machine-dependent kept.

Reading verifies three things, cheapest first (:mod:`.verify`): the hash; that
the body is what this compiler plans from the body's own inputs (so an edited
body whose hash was recomputed is refused, naming the first field that
differs); and, when either fails, the artifact schema, for a precise message.

>>> from kvspec.compiler import compile
>>> art = compile("layouts/llama-3.1-8b.yaml")
>>> Artifact.from_text(art.text()).layout.stage(0).bytes_per_block
2097152
"""

from __future__ import annotations

import hashlib
import json
from functools import cached_property
from pathlib import Path
from typing import Any

from kvspec._version import __version__
from kvspec.errors import ArtifactError
from kvspec.model.plan import Layout

__all__ = ["FORMAT", "Artifact", "canonical_json", "envelope", "is_artifact_text",
           "sha256_text"]

FORMAT = "kvspec.layout/2"
COMPILER = f"kvspec {__version__}"


def is_artifact_text(text: str) -> bool:
    """Whether ``text`` is (any version of) a kvspec artifact: a JSON object whose
    ``format`` is ``kvspec.layout/N``. Used to let ``compile`` replace its own
    earlier output, and nothing else, without ``--force``."""
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, nested too deep, a number too long
        return False
    return isinstance(obj, dict) and str(obj.get("format", "")).startswith("kvspec.layout/")


def canonical_json(obj: Any, *, pretty: bool = False) -> str:
    """Sorted keys, fixed separators: the same text everywhere."""
    from kvspec.artifact import jsontext  # json.dumps' exact text, faster on bodies

    return jsontext.pretty(obj) + "\n" if pretty else jsontext.compact(obj)


def sha256_text(text: str | bytes) -> str:
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    return hashlib.sha256(data).hexdigest()


def encoded_text(data: dict[str, Any]) -> str:
    """The canonical compact JSON of the envelope without ``sha256`` (what the hash
    covers), of an envelope whose body the codec built (:func:`.codec.encode`): the
    artifact schema's one number, ``budget.max_concurrency``, is its only float."""
    from kvspec.artifact import jsontext

    rest = {k: v for k, v in data.items() if k != "sha256"}
    budget = data["body"].get("budget")
    return jsontext.compact_of_known(rest, (budget["max_concurrency"],) if budget else ())


def envelope_texts(data: dict[str, Any]) -> tuple[str, str | None]:
    """The canonical compact JSON of the envelope without ``sha256`` (what the hash
    covers), and the body's own canonical text within it (None if not a dict): of
    any data (an artifact as it was read), exactly as ``json`` writes it."""
    rest = {k: v for k, v in data.items() if k not in ("sha256", "body")}
    if not isinstance(data.get("body"), dict) or any(k < "body" for k in rest):
        return canonical_json({k: v for k, v in data.items() if k != "sha256"}), None
    body = canonical_json(data["body"])
    tail = canonical_json(rest)
    return '{"body":' + body + ("," + tail[1:] if rest else "}"), body


def envelope_hash(data: dict[str, Any]) -> str:
    """sha256 of the canonical compact JSON of the envelope without ``sha256``."""
    return sha256_text(envelope_texts(data)[0])


def envelope(body: dict[str, Any], *, source_sha256: str) -> dict[str, Any]:
    """Wrap a body with its format, compiler, source hash and the hash of all."""
    data = {"format": FORMAT, "compiler": COMPILER, "source_sha256": source_sha256,
            "body": body}
    data["sha256"] = sha256_text(encoded_text(data))
    return data


class Artifact:
    """A verified layout artifact (torch-free; the runtime loader maps it).

    Made by the compiler or by reading (:meth:`read`, :meth:`from_text`,
    :meth:`from_dict`), which verify it; never edited afterwards. ``layout``
    is the typed IR every reader uses; ``data`` the JSON it was read from.
    """

    def __init__(self, data: dict[str, Any], layout: Layout, text: str | None = None) -> None:
        self._data = data
        self._layout = layout
        self._text = text

    # -- reading ------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Any, *, origin: str = "<artifact>") -> Artifact:
        from kvspec.artifact.verify import verified
        return verified(data, origin=origin)

    @classmethod
    def from_text(cls, text: str, *, origin: str = "<artifact>") -> Artifact:
        from kvspec.artifact.verify import read_text
        from kvspec.collector import paused
        with paused():
            return read_text(text, origin)

    @classmethod
    def read(cls, path: str | Path) -> Artifact:
        from kvspec.files import read_text, shown
        text = read_text(path, what="an artifact", error=ArtifactError,
                         hint="compile a source with `kvspec compile model.yaml`")
        return cls.from_text(text, origin=shown(path))

    # -- writing ------------------------------------------------------------
    def text(self) -> str:
        if self._text is None:
            self._text = canonical_json(self._data, pretty=True)
        return self._text

    def write(self, path: str | Path) -> None:
        from kvspec.files import write_atomic
        write_atomic(path, self.text())

    # -- what it says ---------------------------------------------------------
    @property
    def layout(self) -> Layout:
        return self._layout

    @property
    def data(self) -> dict[str, Any]:
        return self._data

    @property
    def body(self) -> dict[str, Any]:
        return self._data["body"]

    @property
    def name(self) -> str:
        return self._layout.name

    @property
    def source_sha256(self) -> str:
        return self._data["source_sha256"]

    @property
    def sha256(self) -> str:
        return self._data["sha256"]

    @property
    def compiler(self) -> str:
        return self._data["compiler"]

    @cached_property
    def fingerprint(self) -> str:
        """A short id of the plan: the first 12 hex digits of ``sha256``."""
        return self.sha256[:12]

    def min_num_blocks(self) -> int:
        return self._layout.min_num_blocks()

    def num_blocks_for(self, *, memory: int | str | None = None,
                       num_blocks: int | None = None) -> int:
        """The block count every stage uses for a per-rank ``memory`` budget
        (bytes or a size like ``"40GiB"``), or ``num_blocks`` checked."""
        from kvspec.files import parse_size
        from kvspec.planner import blocks_for
        mem = parse_size(memory, what="memory") if memory is not None else None
        return blocks_for(self._layout, memory=mem, num_blocks=num_blocks)

    def __repr__(self) -> str:
        return f"Artifact({self.name!r}, {self.fingerprint})"
