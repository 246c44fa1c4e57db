"""Whether blocks can move from one deployment's KV cache to another's: the refusals.

Two artifacts (each with its descriptor per rank) can exchange blocks when they hold
the same model's geometry, whatever they are named: the same layer set, kind,
``kv_cache_dtype`` and storage dtype, cell parts (head size, K/V split, scales),
window or chunk, tokens per state, and the same heads overall (a different
tensor-parallel size regroups them), with state layers whole on each rank. The
artifacts' ``model`` and ``name`` are not compared: two sources made from one
config (``kvspec init`` at two tensor-parallel sizes) hold one model, and two
models of one geometry hold blocks alike. Anything else is refused here with a
:class:`TransferRefused` that names the field and sits at its line and column in
the artifact that differs. What a plan then re-maps (tensor
parallel size, axis order, block size, block count) is :mod:`kvspec.connectors.transfer`'s.

>>> from kvspec.artifact import Artifact
>>> a = Artifact.read("layouts/llama-3.1-8b.kvlayout.json")
>>> b = Artifact.read("layouts/qwen3-8b.kvlayout.json")
>>> sides = Deployment.of(a, "a.json"), Deployment.of(b, "b.json")
>>> check(*sides)  # doctest: +NORMALIZE_WHITESPACE +ELLIPSIS
Traceback (most recent call last):
...
kvspec.connectors.compat.TransferRefused: b.json:...: error: layer model.layers.32.self_attn.attn
  of b.json is missing from a.json (4 layers)
...
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvspec.artifact import Artifact
from kvspec.artifact.read import position
from kvspec.connectors.describe import describe
from kvspec.connectors.descriptor import Descriptor, Layer
from kvspec.errors import KvspecError, format_path
from kvspec.model import kinds

__all__ = ["Deployment", "TransferRefused", "check", "heads_total"]

_HINT = "blocks move only between deployments of one model and one cache format"


class TransferRefused(KvspecError):
    """Blocks cannot move between two deployments: the field that differs is named."""


@dataclass
class Deployment:
    """One side: its artifact, the file it came from, a descriptor per rank."""

    art: Artifact
    file: str
    descs: list[Descriptor]
    #: layer -> (stage, tensor index) in the artifact, for error positions.
    where: dict[str, tuple[int, int]] = field(default_factory=dict)
    _by_rank: list[dict[str, Layer]] = field(default_factory=list)

    @classmethod
    def of(cls, art: Artifact, file: str, num_blocks: int | Mapping[str, int] | None = None
           ) -> Deployment:
        e = art.body.engine
        descs = [describe(art, rank=r, num_blocks=num_blocks)
                 for r in range(e.tensor_parallel_size * len(art.body.stages))]
        where = {name: (si, ti) for si, st in enumerate(art.body.stages)
                 for ti, t in enumerate(st.tensors) for name in t.layers}
        return cls(art, file, descs, where, [{x.name: x for x in d.layers} for d in descs])

    @property
    def tp(self) -> int:
        return self.art.body.engine.tensor_parallel_size

    def layer(self, name: str, tensor_rank: int = 0) -> Layer:
        """``name`` on tensor rank ``tensor_rank`` of its stage."""
        return self._by_rank[self.where[name][0] * self.tp + tensor_rank][name]

    def layer_names(self) -> list[str]:
        return [name for st in self.art.body.stages for name in st.layers if name in self.where]

    def refuse(self, message: str, path: tuple[str | int, ...], **kw: Any) -> TransferRefused:
        """A refusal placed at ``path`` of this side's artifact."""
        line, column = position(self.art.source, path) if self.art.source is not None \
            else (None, None)
        return TransferRefused(message, file=self.file, line=line, column=column,
                               path=format_path(path), **{"hint": _HINT, **kw})

    def tensor_path(self, name: str, *rest: str) -> tuple[str | int, ...]:
        si, ti = self.where[name]
        return ("body", "stages", si, "tensors", ti, *rest)


def check(src: Deployment, dst: Deployment) -> None:
    """Raise a :class:`TransferRefused` unless blocks can move from ``src`` to ``dst``."""
    a, b = src.art.body, dst.art.body
    for name in ("kv_cache_dtype", "decode_context_parallel_size"):
        va, vb = getattr(a.engine, name), getattr(b.engine, name)
        if va != vb:
            raise dst.refuse(f"{name} differs: {va} in {src.file}, {vb} in {dst.file}",
                             ("body", "engine", name), expected=str(va), found=str(vb))
    _same_layers(src, dst)
    for name in dst.layer_names():
        _same_layer(src, dst, name)


def _same_layers(src: Deployment, dst: Deployment) -> None:
    for side, other in ((dst, src), (src, dst)):
        missing = [n for n in side.layer_names() if n not in other.where]
        if missing:
            raise side.refuse(f"layer {missing[0]} of {side.file} is missing from "
                              f"{other.file}" + (f" ({len(missing)} layers)"
                                                  if len(missing) > 1 else ""),
                              ("body", "layers", missing[0]), found=missing[0],
                              expected=f"the layers of {other.file}")


#: Layer fields that must be equal, and where each lives in the artifact.
_FIELDS = (("kind", ("kind",)), ("dtype", ("view", "dtype")),
           ("kv_cache_dtype", None), ("cell_bytes", ("view", "cell_bytes")))


def _same_layer(src: Deployment, dst: Deployment, name: str) -> None:
    s, d = src.layer(name), dst.layer(name)
    for attr, sub in _FIELDS:
        if getattr(s, attr) != getattr(d, attr):
            path = dst.tensor_path(name, *sub) if sub else ("body", "layers", name, attr)
            what = "head size" if attr == "cell_bytes" else attr
            raise dst.refuse(f"layer {name}: {what} differs ({getattr(s, attr)} in {src.file}, "
                             f"{getattr(d, attr)} in {dst.file})", path,
                             expected=str(getattr(s, attr)), found=str(getattr(d, attr)))
    parts = [(p.name, p.dtype, p.offset, p.count) for p in s.parts]
    if parts != [(p.name, p.dtype, p.offset, p.count) for p in d.parts]:
        raise dst.refuse(f"layer {name}: its cells' parts differ (head size, K/V split or "
                         "scales)", dst.tensor_path(name, "view"),
                         expected=_parts(s), found=_parts(d))
    for attr, label in (("sliding_window", "window"), ("attention_chunk_size", "chunk"),
                        ("tokens_per_state", "tokens per state")):
        va, vb = _tensor_field(src, name, attr), _tensor_field(dst, name, attr)
        if va != vb:
            raise dst.refuse(f"layer {name}: {label} differs ({va} in {src.file}, {vb} in "
                             f"{dst.file})", dst.tensor_path(name, *_TENSOR_PATH[attr]),
                             expected=str(va), found=str(vb))
    if kinds.by_name(d.kind).state:
        _state_whole(src, dst, name, s, d)


_TENSOR_PATH = {"sliding_window": ("sliding_window",),
                "attention_chunk_size": ("attention_chunk_size",),
                "tokens_per_state": ("view", "tokens_per_state")}


def _tensor_field(side: Deployment, name: str, attr: str) -> Any:
    si, ti = side.where[name]
    t = side.art.body.stages[si].tensors[ti]
    return t.view.tokens_per_state if attr == "tokens_per_state" else getattr(t, attr)


def _parts(layer: Layer) -> str:
    return ", ".join(f"{p.name}: {p.count} x {p.dtype} at {p.offset}" for p in layer.parts)


def _state_whole(src: Deployment, dst: Deployment, name: str, s: Layer, d: Layer) -> None:
    """A state layer moves whole: the same tensor-parallel split, or replicated."""
    if src.tp != dst.tp and not (s.replicated and d.replicated):
        raise dst.refuse(f"layer {name} is a state layer split across tensor-parallel ranks: "
                         f"its states cannot be re-split from {src.tp} to {dst.tp} ranks",
                         ("body", "engine", "tensor_parallel_size"), expected=str(src.tp),
                         found=str(dst.tp), hint="move state layers between deployments "
                         "of one tensor-parallel size")
    shapes = [(p.shape, p.dtype) for p in s.parts], [(p.shape, p.dtype) for p in d.parts]
    if shapes[0] != shapes[1]:
        spec = dst.art.body.layers[name].spec
        raise dst.refuse(f"layer {name}: its state tensors differ", ("body", "specs", spec,
                                                                     "shapes"),
                         expected=str(shapes[0]), found=str(shapes[1]))


def heads_total(src: Deployment, dst: Deployment, name: str) -> int | None:
    """The model's KV heads of attention layer ``name``, from what each side holds per
    rank; None when both sides hold one head per rank on as many ranks (the artifact
    cannot tell a split from a replication, and rank ``t`` maps to rank ``t``). A
    :class:`TransferRefused` when the sides disagree or cannot be told apart."""
    s, d = src.layer(name), dst.layer(name)
    known = {h * t for h, t in ((s.heads, src.tp), (d.heads, dst.tp)) if h > 1 or t == 1}
    path = dst.tensor_path(name, "view", "heads")
    if len(known) > 1:
        raise dst.refuse(f"layer {name}: num_kv_heads differs ({s.heads} x {src.tp} ranks in "
                         f"{src.file}, {d.heads} x {dst.tp} ranks in {dst.file})", path,
                         expected=str(s.heads * src.tp), found=str(d.heads * dst.tp))
    if not known:
        if src.tp == dst.tp:
            return None
        raise dst.refuse(f"layer {name}: one KV head per rank on {src.tp} and on {dst.tp} "
                         "ranks: the artifacts do not say whether heads are split or "
                         "replicated, so they cannot be regrouped", path,
                         hint="give one side a tensor-parallel size that holds more than "
                              "one head per rank, or equal sizes")
    total = known.pop()
    for side, layer in ((src, s), (dst, d)):
        split = layer.heads * side.tp == total
        replicated = layer.heads == 1 and total < side.tp and side.tp % total == 0
        if not (split or replicated):
            raise side.refuse(f"layer {name}: {layer.heads} head(s) per rank on {side.tp} "
                              f"ranks is neither a split nor a replication of {total} heads",
                              side.tensor_path(name, "view", "heads"), found=str(layer.heads))
    return total
