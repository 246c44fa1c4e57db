"""Hybrid manager off: local-attention layers are allocated as full attention.

With ``engine.hybrid: false`` (vLLM's ``--disable-hybrid-kv-cache-manager``)
sliding-window and chunked-local layers keep their window for compute but
get blocks for every token, so the model groups as one type.

>>> from kvspec.model.specs import FullAttention, SlidingWindow
>>> f = FullAttention(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16")
>>> w = SlidingWindow(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16",
...                   sliding_window=4096)
>>> p = promote_local_specs({"a": w, "b": f})
>>> type(p["a"]).__name__, p["a"].sliding_window
('FullAttention', 4096)
"""

from __future__ import annotations

from collections.abc import Mapping

from kvspec.errors import PlanError
from kvspec.model.specs import (
    MLA,
    Attention,
    ChunkedLocal,
    FullAttention,
    LayerSpec,
    SlidingWindow,
    SlidingWindowMLA,
    recast,
)
from kvspec.model.specs.base import once_per_object
from kvspec.planner.merge import is_uniform, is_uniform_type

#: What each local kind is allocated as, most specific first.
_PROMOTIONS: tuple[tuple[type[LayerSpec], type[LayerSpec]], ...] = (
    (SlidingWindowMLA, MLA),
    (SlidingWindow, FullAttention),
    (ChunkedLocal, FullAttention),
)


def _target(spec: LayerSpec) -> type[LayerSpec] | None:
    return next((to for frm, to in _PROMOTIONS if isinstance(spec, frm)), None)


def _promoted(spec: Attention, target: type[LayerSpec], block: int) -> LayerSpec:
    padded = None
    if spec.page_size_padded is not None:
        scaled = spec.unpadded_page_size_bytes * block // spec.block_size
        padded = max(spec.page_size_padded, scaled)
    return recast(spec, target, block_size=block, page_size_padded=padded)


def promote_local_specs(specs: Mapping[str, LayerSpec]) -> dict[str, LayerSpec]:
    """Allocate local-attention layers as full attention (compute is unchanged)."""
    promoted = dict(specs)
    if is_uniform(promoted) or is_uniform_type(promoted):
        return promoted
    values = list(specs.values())
    has_full = any(isinstance(s, FullAttention) for s in values)
    has_local = any(isinstance(s, (SlidingWindow, ChunkedLocal)) for s in values)
    full_sizes = {s.block_size for s in values if isinstance(s, FullAttention)}
    full_block = next(iter(full_sizes)) if len(full_sizes) == 1 else None
    if has_full and has_local:
        def promote_one(spec: Attention) -> LayerSpec:
            target = _target(spec)
            assert target is not None  # only local kinds are promoted
            return _promoted(spec, target, full_block or spec.block_size)

        promote = once_per_object(promote_one)  # layers sharing a spec share its promotion
        for name, spec in specs.items():
            if _target(spec) is not None:
                assert isinstance(spec, Attention)
                promoted[name] = promote(spec)
    if not (is_uniform(promoted) or is_uniform_type(promoted)):
        raise PlanError(
            "failed to promote local-attention layers to one unified type",
            hint="with the hybrid manager off every layer must be full attention "
                 "once windows are ignored; check heads, head sizes and dtypes")
    return promoted
