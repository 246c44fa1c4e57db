"""The frozen layout artifact: canonical JSON, versioned and hashed.

An artifact is compiled once and loaded under any memory budget. It holds the
engine settings it was planned for, every layer's spec, the groups, and per
pipeline stage the tensors (offsets and strides as affine forms of the block
count ``N``), plus the plan for the source's own budget when it has one.

Same source + same compiler -> byte-identical artifact on any machine: keys are
sorted, formatting fixed, and nothing machine-dependent (paths, times) is kept.
``body_sha256`` is the sha256 of the body's compact canonical JSON; the loader
refuses an artifact whose body no longer matches it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvspec import __version__
from kvspec.affine import Affine
from kvspec.errors import ArtifactError, PlanError
from kvspec.files import read_json, write_atomic

__all__ = ["FORMAT", "Artifact", "canonical_json", "freeze", "sha256_text", "write_atomic"]

FORMAT = "kvspec.layout/1"


def canonical_json(obj: Any, *, pretty: bool = False) -> str:
    """Sorted keys, fixed separators, ASCII-safe: the same bytes everywhere."""
    if pretty:
        return json.dumps(obj, sort_keys=True, indent=1, ensure_ascii=False) + "\n"
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_text(text: str | bytes) -> str:
    data = text.encode() if isinstance(text, str) else text
    return hashlib.sha256(data).hexdigest()


def freeze(body: dict[str, Any], *, source_sha256: str) -> dict[str, Any]:
    """Wrap a body with its format, compiler and hashes."""
    return {
        "format": FORMAT,
        "compiler": f"kvspec {__version__}",
        "source_sha256": source_sha256,
        "body_sha256": sha256_text(canonical_json(body)),
        "body": body,
    }


@dataclass(frozen=True)
class Artifact:
    """A verified layout artifact (torch-free; the runtime loader maps it)."""

    data: dict[str, Any]

    # -- reading ------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Any, *, origin: str = "<artifact>") -> Artifact:
        if not isinstance(data, dict) or "body" not in data:
            raise ArtifactError("not a kvspec layout artifact", file=origin,
                                hint="compile a source with `kvspec compile model.yaml`")
        fmt = data.get("format")
        if fmt != FORMAT:
            raise ArtifactError(f"unsupported artifact format {fmt!r}", file=origin,
                                expected=FORMAT, found=str(fmt),
                                hint="recompile the source with this kvspec version")
        want = data.get("body_sha256")
        got = sha256_text(canonical_json(data["body"]))
        if want != got:
            raise ArtifactError("the artifact's body does not match its body_sha256: it "
                                "was edited or corrupted", file=origin,
                                expected=str(want), found=got,
                                hint="recompile it from its source; never edit artifacts")
        return cls(data)

    @classmethod
    def read(cls, path: str | Path) -> Artifact:
        data = read_json(path, what="an artifact", error=ArtifactError,
                         hint="compile a source with `kvspec compile model.yaml`")
        return cls.from_dict(data, origin=str(path))

    # -- writing ------------------------------------------------------------
    def text(self) -> str:
        return canonical_json(self.data, pretty=True)

    def write(self, path: str | Path) -> None:
        write_atomic(path, self.text())

    # -- views into the body ---------------------------------------------------
    @property
    def body(self) -> dict[str, Any]:
        return self.data["body"]

    @property
    def name(self) -> str:
        return self.body["name"]

    @property
    def source_sha256(self) -> str:
        return self.data["source_sha256"]

    @property
    def body_sha256(self) -> str:
        return self.data["body_sha256"]

    @property
    def layout(self) -> str:
        return self.body["engine"]["layout"]

    @property
    def stages(self) -> list[dict[str, Any]]:
        return self.body["stages"]

    def stage(self, index: int = 0) -> dict[str, Any]:
        try:
            return self.stages[index]
        except IndexError:
            raise ArtifactError(f"the artifact has {len(self.stages)} pipeline stage(s), "
                                f"not stage {index}") from None

    def min_num_blocks(self) -> int:
        return max(st["min_num_blocks"] for st in self.stages)

    def num_blocks_for(self, *, memory: int | None = None, num_blocks: int | None = None) -> int:
        """The block count every stage uses for a per-rank ``memory`` budget
        (the smallest stage's count), or ``num_blocks`` checked."""
        override = self.body["engine"].get("num_blocks")
        if num_blocks is None and memory is None:
            num_blocks = override
        if num_blocks is None:
            if memory is None:
                raise PlanError("give num_blocks or a memory budget to size the pool")
            counts = [(memory - st["fixed_bytes"]) // st["bytes_per_block"]
                      for st in self.stages if st["bytes_per_block"]]
            num_blocks = min(counts) if counts else 1
            if override is not None:
                num_blocks = override
        need = self.min_num_blocks()
        if num_blocks < need:
            budget = (f" ({memory} bytes)" if memory is not None else "")
            raise PlanError(
                f"{num_blocks} blocks{budget} cannot serve one request at max_model_len "
                f"{self.body['engine']['max_model_len']}: it needs {need} blocks "
                "(one of them the null block)",
                expected=f"num_blocks >= {need}", found=str(num_blocks),
                hint="give the KV cache more memory or compile with a shorter max_model_len")
        return num_blocks

    @staticmethod
    def affine(value: Any) -> Affine:
        return Affine.from_json(value)
