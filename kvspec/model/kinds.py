"""The one registry of layer kinds.

Every kind is declared once, here: its name (as sources, dumps and artifacts
spell it), its spec class, the reference planner's ``KVCacheSpecKind`` value,
the short type name ``kvspec import`` gives it, the fields a source must set,
and the quantization class its layers belong to. The source schema's ``kind``
literal, the dump reader, the importer, the Hugging Face tables and the
artifact reader all derive from :data:`KINDS`.

>>> by_name("mla").spec.__name__, by_name("mla").latent, by_name("mla").ref_kind
('MLA', True, 'mla_attention')
>>> [k.name for k in KINDS if k.state]
['mamba']
>>> "uniform_type" in SOURCE_KIND_NAMES
False
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from fractions import Fraction
from functools import cache
from typing import Any

from kvspec.model.specs import attention as a
from kvspec.model.specs import mla as m
from kvspec.model.specs.base import LayerSpec, init_field_names
from kvspec.model.specs.state import MAMBA_TYPES, MambaState
from kvspec.model.specs.uniform import UniformType


@dataclass(frozen=True, slots=True)
class Kind:
    """One layer kind and everything the rest of kvspec needs to know of it."""

    name: str
    spec: type[LayerSpec]
    #: The reference's ``KVCacheSpecKind`` value (``get_kv_cache_spec_kind``).
    ref_kind: str
    #: The layer-type name ``kvspec import`` writes for layers of this kind.
    type_name: str
    #: Fields a source must give layers of this kind (besides heads/size/dtype).
    required: tuple[str, ...] = ()
    #: One latent per token: heads are not split across tensor-parallel ranks,
    #: ``head_size_v`` is 0 and the MLA quantization formats apply.
    latent: bool = False
    #: A state layer (whole states, no heads): its page comes from ``shapes``.
    state: bool = False
    #: The quantization class of its layers (which formats apply), None: none.
    quant_class: str | None = None
    #: Whether a source or a dump may declare it (some kinds only the planner makes).
    declarable: bool = True
    #: Whether the ``separate`` pooling policy gives its layers a pool of their own
    #: (the others need the unified planner's layouts).
    separable: bool = False
    #: How the request-level manager holds its layers' blocks (a manager kind of
    #: :mod:`kvspec.runtime.manager.spec`); None: it holds none (encoder-only).
    manager: str | None = None

    @property
    def ref_class(self) -> str:
        return self.spec.ref_class


KINDS: tuple[Kind, ...] = (
    Kind("full_attention", a.FullAttention, "full_attention", "full", quant_class="full",
         separable=True, manager="full"),
    Kind("sliding_window", a.SlidingWindow, "sliding_window", "sliding",
         required=("sliding_window",), quant_class="sliding", separable=True,
         manager="sliding"),
    Kind("chunked_local", a.ChunkedLocal, "chunked_local_attention", "local",
         required=("attention_chunk_size",), quant_class="chunked", separable=True,
         manager="local"),
    Kind("mla", m.MLA, "mla_attention", "mla", latent=True, quant_class="mla", separable=True,
         manager="full"),
    Kind("sliding_window_mla", m.SlidingWindowMLA, "sliding_window_mla", "swa_mla",
         required=("sliding_window",), latent=True, quant_class="sliding_mla", separable=True,
         manager="sliding"),
    Kind("cross_attention", a.CrossAttention, "cross_attention", "cross", quant_class="cross",
         manager="cross"),
    Kind("encoder_only", a.EncoderOnly, "encoder_only_attention", "encoder",
         quant_class="encoder"),
    Kind("sink_full_attention", a.SinkFullAttention, "sink_full_attention", "sink",
         quant_class="sink", separable=True, manager="full"),
    Kind("mamba", MambaState, "mamba", "mamba", required=("shapes", "dtypes"), state=True,
         separable=True, manager="state"),
    Kind("hidden_state", m.HiddenState, "mla_attention", "hidden", latent=True,
         manager="full"),
    Kind("kpool_tail", a.KpoolTail, "sliding_window", "tail", required=("sliding_window",),
         manager="ring"),
    Kind("circular_buffer", a.CircularBuffer, "unknown", "ring", manager="ring"),
    Kind("rswa", a.RSWA, "full_attention", "rswa", required=("rswa_window",), manager="rswa"),
    Kind("draft_sliding_window", a.DraftSlidingWindow, "sliding_window", "draft",
         required=("sliding_window",), declarable=False, manager="sliding"),
    Kind("uniform_type", UniformType, "unknown", "uniform", declarable=False),
)

#: Kind names a source or a dump may use, in documentation order.
SOURCE_KIND_NAMES: tuple[str, ...] = tuple(k.name for k in KINDS if k.declarable)

_BY_NAME = {k.name: k for k in KINDS}
_BY_CLASS = {k.spec: k for k in KINDS}


def by_name(name: str) -> Kind:
    """The kind named ``name``; ``KeyError`` if there is none."""
    return _BY_NAME[name]


def of(spec: LayerSpec | type[LayerSpec]) -> Kind:
    """The kind of a spec (or spec class)."""
    return _BY_CLASS[spec if isinstance(spec, type) else type(spec)]


def ref_kind_name(spec: LayerSpec) -> str:
    """The reference's ``KVCacheSpecKind`` value of a (group) spec."""
    if isinstance(spec, UniformType):
        kinds = {ref_kind_name(s) for _, s in spec.members}
        if len(kinds) == 1:
            return kinds.pop()
        if all(isinstance(s, a.FullAttention) for _, s in spec.members):
            return "full_attention"
        return "unknown"
    return of(spec).ref_kind


# ---------------------------------------------------------------------------
# specs as plain data (artifacts, reports) and back
# ---------------------------------------------------------------------------

_MAMBA_TYPE_OF_REF = {v: k for k, v in MAMBA_TYPES.items()}
_PLAIN = frozenset({int, str, bool, float, type(None)})


def describe(spec: LayerSpec) -> dict[str, Any]:
    """Every field and the derived page size of ``spec``, as plain data.

    >>> f = a.FullAttention(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16")
    >>> describe(f)["page_size_bytes"], describe(f)["class"]
    (65536, 'FullAttentionSpec')
    """
    if isinstance(spec, UniformType):
        return {"kind": spec.kind, "class": spec.ref_class, "block_size": spec.block_size,
                "page_size_bytes": spec.page_size_bytes,
                "prefix_cacheable": spec.prefix_cacheable,
                "kv_cache_specs": {n: describe(s) for n, s in spec.members}}
    out: dict[str, Any] = {"kind": spec.kind, "class": spec.ref_class}
    for name in init_field_names(type(spec)):
        value = getattr(spec, name)
        if type(value) in _PLAIN:  # most fields (Fraction's isinstance is an ABC's)
            out[name] = value
            continue
        if isinstance(value, Fraction):
            value = str(value)
        elif isinstance(value, tuple):
            value = [list(v) if isinstance(v, tuple) else v for v in value]
        out[name] = value
    out["page_size_bytes"] = spec.page_size_bytes
    out["prefix_cacheable"] = spec.prefix_cacheable
    if isinstance(spec, MambaState):
        out["num_heads"] = out.pop("num_heads_")
        out["mamba_type"] = MAMBA_TYPES.get(spec.mamba_type, spec.mamba_type)
        out["tokens_per_state"] = -1
    return out


def _value(name: str, value: Any) -> Any:
    if name == "shapes":
        return tuple(tuple(s) for s in value)
    if name == "dtypes":
        return tuple(value)
    if name == "tokens_per_state" and isinstance(value, str):
        frac = Fraction(value)
        return int(frac) if frac.denominator == 1 else frac
    if name == "mamba_type":
        return _MAMBA_TYPE_OF_REF.get(value, value)
    return value


def spec_from_dict(data: dict[str, Any]) -> LayerSpec:
    """Rebuild a spec from :func:`describe` output (``KeyError``/``TypeError``/
    ``ValueError`` when it is not one).

    >>> f = a.FullAttention(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16")
    >>> spec_from_dict(describe(f)) == f
    True
    """
    cls = by_name(data["kind"]).spec
    if cls is UniformType:
        members = tuple((n, spec_from_dict(s)) for n, s in data["kv_cache_specs"].items())
        return UniformType(block_size=data["block_size"], members=members)
    kwargs: dict[str, Any] = {}
    for name in init_field_names(cls):
        key = "num_heads" if name == "num_heads_" else name
        if key in data:
            kwargs[name] = _value(name, data[key])
    spec = cls(**kwargs)
    # Alignment padding is recomputed by __post_init__; an explicit pad wins.
    padded = data.get("page_size_padded")
    if padded is not None and getattr(spec, "page_size_padded", None) != padded:
        object.__setattr__(spec, "page_size_padded", padded)
    return spec


@cache
def spec_fields(name: str) -> tuple[str, ...]:
    """Init fields of a kind's spec class (what a dump or source may set)."""
    return tuple(f.name for f in dataclasses.fields(by_name(name).spec) if f.init)
