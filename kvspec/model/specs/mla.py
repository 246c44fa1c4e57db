"""Latent-attention kinds: one latent vector per token, no separate V.

>>> MLA(block_size=64, num_kv_heads=1, head_size=576, dtype="bfloat16").page_size_bytes
73728
>>> MLA(block_size=64, num_kv_heads=1, head_size=576, dtype="bfloat16",
...     alignment=4096).page_size_bytes           # 73728 rounded up to 4096
73728
>>> MLA(block_size=1, num_kv_heads=1, head_size=584, dtype="uint8", alignment=576).page_size_bytes
1152
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from kvspec.model.specs.attention import FullAttention, SlidingWindow
from kvspec.model.specs.base import MergeInvalid, merged, round_up


def _apply_alignment(spec: MLA | SlidingWindowMLA) -> None:
    """Pad an MLA page up to its row alignment (DeepSeek-V4 sparse layouts)."""
    if spec.alignment is None:
        return
    real = spec.unpadded_page_size_bytes
    padded = round_up(real, spec.alignment)
    if padded != real:
        object.__setattr__(spec, "page_size_padded", padded)


@dataclass(frozen=True, slots=True, kw_only=True)
class MLA(FullAttention):
    """Multi-head latent attention: one latent vector per token, no separate V."""

    kind: ClassVar[str] = "mla"
    ref_class: ClassVar[str] = "MLAAttentionSpec"
    family: ClassVar[bool] = True
    merges_apart: ClassVar[bool] = True

    head_size_v: int | None = 0
    cache_dtype_str: str | None = None
    alignment: int | None = None
    model_version: str | None = None
    cache_role: str = "sparse"
    is_index_group_leader: bool = False
    storage_block_size: int | None = None
    non_causal_multi_token_decode: bool = merged("any", False)

    def __post_init__(self) -> None:
        FullAttention.__post_init__(self)
        _apply_alignment(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class HiddenState(MLA):
    """A hidden-state cache (extract_hidden_states): an MLA-shaped page per token."""

    kind: ClassVar[str] = "hidden_state"
    ref_class: ClassVar[str] = "HiddenStateCacheSpec"


@dataclass(frozen=True, slots=True, kw_only=True)
class SlidingWindowMLA(SlidingWindow):
    """Sliding-window attention over MLA latents (DeepSeek-V4 style)."""

    kind: ClassVar[str] = "sliding_window_mla"
    ref_class: ClassVar[str] = "SlidingWindowMLASpec"
    family: ClassVar[bool] = True
    bucket_by: ClassVar[tuple[str, ...]] = ("sliding_window", "bounded_replay")

    head_size_v: int | None = 0
    cache_dtype_str: str | None = None
    alignment: int | None = None
    model_version: str | None = None
    bounded_replay: bool = False

    def __post_init__(self) -> None:
        if self.model_version not in (None, "deepseek_v4"):
            raise MergeInvalid(f"unsupported MLA model version {self.model_version!r}")
        SlidingWindow.__post_init__(self)
        _apply_alignment(self)

    @property
    def prefix_cacheable(self) -> bool:
        return not self.bounded_replay

    @property
    def prefix_replay_tokens(self) -> int:
        return self.sliding_window if self.bounded_replay else 0
