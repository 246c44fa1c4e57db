"""kvspec's layer specs and engine settings in vLLM's terms, as plain data.

The bridge never hands torch or vLLM objects to the rest of kvspec: a spec
crosses it as a *vLLM description*, a dict of the vLLM class name and its
dataclass fields in plain values (the adapter turns it into the real object
and back)::

    {"class": "FullAttentionSpec", "block_size": 16, "num_kv_heads": 8,
     "head_size": 128, "dtype": "bfloat16", "kv_quant_mode": 0, ...}

dtypes are torch's names without ``torch.``, ``kv_quant_mode`` the
``KVQuantMode`` value, ``mamba_type`` the ``MambaAttentionBackendEnum`` name,
``cache_role`` its value and a ``MultipleOf(n)`` alignment ``{"MultipleOf": n}``.
The class names are those the kinds registry records (``Kind.ref_class``), so
a kind needs no entry here.

>>> from kvspec.model.specs import FullAttention
>>> d = to_vllm(FullAttention(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16"))
>>> d["class"], d["head_size_v"], d["kv_quant_mode"], d["sliding_window"]
('FullAttentionSpec', 128, 0, None)
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from kvspec.model import kinds
from kvspec.model.engine import Engine, vllm_values
from kvspec.model.specs import LayerSpec, UniformType
from kvspec.model.specs.base import init_field_names
from kvspec.model.specs.state import MAMBA_TYPES

#: kvspec field names that vLLM spells differently.
_RENAMED = {"num_heads_": "num_heads"}
#: Storage dtypes the two sides spell differently for the same bytes: vLLM keeps
#: every fp8 cache as ``uint8`` (``STR_DTYPE_TO_TORCH_DTYPE["fp8"]``).
SAME_BYTES = frozenset({frozenset({"float8_e4m3fn", "uint8"}),
                        frozenset({"float8_e5m2", "uint8"})})


def _plain(name: str, value: Any) -> Any:
    if isinstance(value, Fraction):
        return value.numerator if value.denominator == 1 else str(value)
    if name == "shapes":
        return [list(s) for s in value]
    if name == "dtypes":
        return list(value)
    if name == "mamba_type":
        return MAMBA_TYPES.get(value, value)
    return value


def to_vllm(spec: LayerSpec) -> dict[str, Any]:
    """The vLLM description of one kvspec spec (a group spec included)."""
    if isinstance(spec, UniformType):
        return {"class": spec.ref_class, "block_size": spec.block_size,
                "kv_cache_specs": {n: to_vllm(s) for n, s in spec.members}}
    out: dict[str, Any] = {"class": spec.ref_class}
    for name in init_field_names(type(spec)):
        out[_RENAMED.get(name, name)] = _plain(name, getattr(spec, name))
    if kinds.of(spec).state:
        out["tokens_per_state"] = -1
    return out


def kind_of_class(class_name: str) -> kinds.Kind | None:
    """The kvspec kind whose reference class is vLLM's ``class_name`` (None: none)."""
    for kind in kinds.KINDS:
        if kind.ref_class == class_name and kind.declarable:
            return kind
    return None


def same_value(field: str, a: Any, b: Any) -> bool:
    """Whether two plain values mean the same (fp8 storage spelled ``uint8``)."""
    if a == b:
        return True
    if field == "dtype" and isinstance(a, str) and isinstance(b, str):
        return frozenset({a, b}) in SAME_BYTES
    if field == "dtypes" and isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return all(same_value("dtype", x, y) for x, y in zip(a, b))
    return False


#: What a field only one side has reads as on the other.
ABSENT = "<absent>"
#: Values of a field one side lacks that mean "not used" (as ``materialize`` accepts).
UNSET = (None, False, 0)

#: vLLM-only fields that do not change a plan, by field: what they mean.
IGNORED_VLLM_FIELDS = {
    "is_draft": "draft-model layers (excluded from equality in vLLM itself)",
}


def spec_differences(want: dict[str, Any], got: dict[str, Any],
                     defaults: dict[str, dict[str, Any]] | None = None
                     ) -> list[tuple[str, Any, Any]]:
    """``(field, want, got)`` for every field two vLLM descriptions disagree on.

    A field only one side has is compared with the other class's default when
    ``defaults`` (``{class: {field: default}}``) knows it, and reported as missing
    otherwise; ``page_size_bytes`` (derived) is compared when both give it.

    >>> a = {"class": "FullAttentionSpec", "block_size": 16, "dtype": "float8_e4m3fn"}
    >>> spec_differences(a, {**a, "dtype": "uint8"})
    []
    >>> spec_differences(a, {**a, "block_size": 32, "is_draft": False})
    [('block_size', 16, 32)]
    """
    out: list[tuple[str, Any, Any]] = []
    want, got = effective(want), effective(got)
    if want.get("class") != got.get("class"):
        return [("class", want.get("class"), got.get("class"))]
    cls_defaults = (defaults or {}).get(str(want.get("class")), {})
    for field in dict.fromkeys([*want, *got]):
        if field in IGNORED_VLLM_FIELDS or field == "class":
            continue
        if field == "kv_cache_specs":
            out += _member_differences(want.get(field) or {}, got.get(field) or {}, defaults)
            continue
        a = want.get(field, cls_defaults.get(field, ABSENT))
        b = got.get(field, cls_defaults.get(field, ABSENT))
        if ABSENT in (a, b) and (a if b == ABSENT else b) in UNSET:
            continue  # a field only one side has, left unset
        if not same_value(field, a, b):
            out.append((field, a, b))
    return out


def effective(desc: dict[str, Any]) -> dict[str, Any]:
    """A description with ``MultipleOf(n)`` alignments that change nothing left out:
    a backend with fixed kernel blocks of ``n`` tokens publishes one
    (``customize_attention_spec``), and when ``n`` divides the block size the
    block stride needs no alignment (``get_block_stride_alignment`` is 1).

    >>> effective({"block_size": 64, "block_stride_alignment": {"MultipleOf": 64}})
    {'block_size': 64, 'block_stride_alignment': None}
    """
    align = desc.get("block_stride_alignment")
    if isinstance(align, dict) and "MultipleOf" in align and isinstance(
            desc.get("block_size"), int) and desc["block_size"] % align["MultipleOf"] == 0:
        return {**desc, "block_stride_alignment": None}
    return desc


def _member_differences(want: dict[str, Any], got: dict[str, Any],
                        defaults: dict[str, dict[str, Any]] | None
                        ) -> list[tuple[str, Any, Any]]:
    if list(want) != list(got):
        return [("kv_cache_specs", list(want), list(got))]
    out = []
    for name in want:
        out += [(f"kv_cache_specs[{name}].{f}", a, b)
                for f, a, b in spec_differences(want[name], got[name], defaults)]
    return out


def engine_settings(engine: Engine) -> dict[str, Any]:
    """The engine settings a plan depends on, in vLLM's config field names (the
    keys of a spec dump's ``config``), from the one declaration of engine settings
    (:func:`kvspec.model.engine.vllm_values`)."""
    return vllm_values(engine)
