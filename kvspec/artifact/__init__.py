"""The frozen layout artifact: its format, its text, and reading it safely.

An artifact is compiled once and loaded under any memory budget. This package
is what a serving container needs to read one, and nothing of the compiler:

* :mod:`.format` -- the format, declared once (``msgspec`` records): the typed
  body, its canonical JSON, its validation and its JSON Schema all come from it;
* :mod:`.text` -- canonical text, the hash, the file form;
* :mod:`.read` -- untrusted bytes to a checked :class:`Artifact`;
* :mod:`.structure`, :mod:`.blocks` -- the structural invariants ``load`` proves;
* :mod:`.sizing` -- the capacity rules read from the body: each pool's block count
  for a budget (a separate plan's pool: its share of it), and the requests it holds.

The compiler makes artifacts with the plan they came from
(:class:`kvspec.compiled.CompiledArtifact`, a subclass); ``kvspec check`` and
``verify`` re-plan an artifact to prove it is exactly what this compiler makes
of its inputs (docs/artifact.md, "The trust model").

>>> art = Artifact.read("layouts/llama-3.1-8b.kvlayout.json")
>>> art.body.groups[0].kind, art.body.stages[0].bytes_per_block
('full_attention', 2097152)
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any

import msgspec

from kvspec._version import __version__
from kvspec.artifact.format import FORMAT, Envelope, Layout, Stage
from kvspec.artifact.read import decode
from kvspec.artifact.sizing import blocks_for, counts_for
from kvspec.artifact.text import file_text
from kvspec.errors import ArtifactError
from kvspec.files import parse_size, read_text, shown, write_atomic

__all__ = ["COMPILER", "FORMAT", "Artifact", "is_artifact_text"]

COMPILER = f"kvspec {__version__}"


def is_artifact_text(text: str) -> bool:
    """Whether ``text`` is (any version of) a kvspec artifact: a JSON object whose
    ``format`` is ``kvspec.layout/N``. Used to let ``compile`` replace its own
    earlier output, and nothing else, without ``--force``."""
    try:
        head = msgspec.json.decode(text, type=dict[str, Any])
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return False
    return str(head.get("format", "")).startswith("kvspec.layout/")


class Artifact:
    """A checked layout artifact (torch-free, planner-free).

    Made by reading (:meth:`read`, :meth:`from_text`, :meth:`from_dict`), which
    checks it, or by the compiler; never edited afterwards. ``body`` is the
    typed layout (:class:`~kvspec.artifact.format.Layout`) every reader uses.
    """

    def __init__(self, envelope: Envelope, text: str | None = None,
                 source: str | bytes | None = None) -> None:
        self._envelope = envelope
        self._text = text
        #: The text it was read from, if it was (to place errors found later).
        self.source = source

    # -- reading ------------------------------------------------------------
    @classmethod
    def from_text(cls, text: str | bytes, *, origin: str = "<artifact>") -> Artifact:
        return cls(decode(text, origin), source=text)

    @classmethod
    def from_dict(cls, data: Any, *, origin: str = "<artifact>") -> Artifact:
        try:
            raw = msgspec.json.encode(data)
        except (TypeError, ValueError, OverflowError, RecursionError) as exc:
            raise ArtifactError(f"not an artifact: {exc}", file=origin,
                                hint="pass the dict json.load gives for a .kvlayout.json"
                                ) from None
        return cls.from_text(raw, origin=origin)

    @classmethod
    def read(cls, path: str | Path) -> Artifact:
        text = read_text(path, what="an artifact", error=ArtifactError,
                         hint="compile a source with `kvspec compile model.yaml`")
        return cls.from_text(text, origin=shown(path))

    # -- writing ------------------------------------------------------------
    def text(self) -> str:
        """The artifact file's text (canonical JSON, indented)."""
        if self._text is None:
            self._text = file_text(self._envelope)
        return self._text

    def write(self, path: str | Path) -> None:
        write_atomic(path, self.text())

    # -- what it says ---------------------------------------------------------
    @property
    def envelope(self) -> Envelope:
        return self._envelope

    @property
    def body(self) -> Layout:
        return self._envelope.body

    @cached_property
    def data(self) -> dict[str, Any]:
        """The artifact as plain JSON data (what ``json.load`` of its file gives)."""
        out: dict[str, Any] = msgspec.to_builtins(self._envelope, order="sorted")
        return out

    @property
    def name(self) -> str:
        return self.body.name

    @property
    def source_sha256(self) -> str:
        return self._envelope.source_sha256

    @property
    def sha256(self) -> str:
        return self._envelope.sha256

    @property
    def compiler(self) -> str:
        return self._envelope.compiler

    @property
    def fingerprint(self) -> str:
        """A short id of the plan: the first 12 hex digits of ``sha256``."""
        return self.sha256[:12]

    def stage(self, index: int = 0) -> Stage:
        return self.body.stages[index]

    def min_num_blocks(self) -> int:
        return max((st.min_num_blocks for st in self.body.stages), default=1)

    def num_blocks_for(self, *, memory: int | str | None = None,
                       num_blocks: int | None = None) -> int:
        """The block count every stage uses for a per-rank ``memory`` budget
        (bytes or a size like ``"40GiB"``), or ``num_blocks`` checked."""
        mem = parse_size(memory, what="memory") if memory is not None else None
        body = self.body
        return blocks_for([(st.bytes_per_block, st.fixed_bytes) for st in body.stages],
                          need=self.min_num_blocks(), override=body.engine.num_blocks,
                          max_model_len=body.engine.max_model_len, memory=mem,
                          num_blocks=num_blocks)

    @property
    def pooled(self) -> bool:
        """Whether its stages split the budget between pools (the separate policy)."""
        return any(p.share is not None for st in self.body.stages for p in st.pools)

    def counts_for(self, stage: int = 0, *, memory: int | str | None = None,
                   num_blocks: int | None = None, fewest: bool = False) -> dict[str, int]:
        """Each pool's block count on ``stage``, for every policy
        (:func:`~kvspec.artifact.sizing.counts_for`: what ``load``, ``descriptor``
        and ``transfer`` all use): for ``num_blocks``, else a per-rank ``memory``
        budget (bytes or ``"40GiB"``), else the source's override, else the budget
        it was compiled for (``fewest``: else the fewest that serve one request)."""
        mem = parse_size(memory, what="memory") if memory is not None else None
        return counts_for(self.body, stage, memory=mem, num_blocks=num_blocks, fewest=fewest)

    def __repr__(self) -> str:
        return f"Artifact({self.name!r}, {self.fingerprint})"
