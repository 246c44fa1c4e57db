"""Per-layer recurrent-state shapes and dtypes, re-derived without torch.

These are independent, torch-free re-derivations of vLLM's
``vllm/model_executor/layers/mamba/mamba_utils.py``:

* ``MambaStateShapeCalculator`` -- ``mamba1_state_shape``,
  ``mamba2_state_shape`` (with ``extra_groups_for_head_shards``),
  ``gated_delta_net_state_shape``, ``short_conv_state_shape`` and
  ``linear_attention_state_shape``;
* ``MambaStateDtypeCalculator`` -- the ``*_state_dtype`` class methods and
  ``_mamba_state_dtype``, which resolve the ``mamba_cache_dtype`` /
  ``mamba_ssm_cache_dtype`` settings through
  ``vllm.utils.torch_utils.get_kv_cache_torch_dtype``.

Read at vllm-project/vllm commit 02d710837549a368073552333f66d714477415d2.

All shapes are *per tensor-parallel rank* and exclude the leading block
dimension that vLLM adds when it allocates the cache.  As in vLLM, the
convolution state comes first and the temporal (SSM / recurrent) state second.

Conv-state orientation: vLLM's default layout is ``"SD"`` -- the conv state is
``(state_len, dim)`` with ``dim`` innermost (``_orient_conv_shape``).  The
``"DS"`` layout (``VLLM_SSM_CONV_STATE_LAYOUT=DS``) stores ``(dim, state_len)``;
pass ``conv_layout="DS"`` to get it.  Older vLLM releases used only the SD
orientation.
"""

from __future__ import annotations

from typing import Literal

__all__ = [
    "MAMBA_TYPES",
    "ConvLayout",
    "divide",
    "extra_groups_for_head_shards",
    "gated_delta_net_state_shape",
    "linear_attention_state_shape",
    "mamba1_state_shape",
    "mamba2_state_shape",
    "resolve_cache_dtype",
    "short_conv_state_shape",
    "state_dtypes",
]

ConvLayout = Literal["SD", "DS"]

Shape = tuple[int, ...]


def divide(numerator: int, denominator: int) -> int:
    """Exact integer division, as ``vllm.distributed.divide`` (which asserts).

    Raises ``ValueError`` when ``numerator`` is not a multiple of
    ``denominator``: vLLM cannot shard such a dimension over that many ranks.
    """
    if denominator <= 0:
        raise ValueError(f"tensor-parallel size must be positive, got {denominator}")
    if numerator % denominator != 0:
        raise ValueError(f"{numerator} is not divisible by {denominator}")
    return numerator // denominator


def _orient_conv_shape(dim: int, state_len: int, layout: ConvLayout) -> tuple[int, int]:
    """``MambaStateShapeCalculator._orient_conv_shape``: SD -> (state_len, dim)."""
    if layout == "DS":
        return (dim, state_len)
    if layout == "SD":
        return (state_len, dim)
    raise ValueError(f"conv_layout must be 'SD' or 'DS', got {layout!r}")


def extra_groups_for_head_shards(n_groups: int, tp_size: int) -> int:
    """``MambaStateShapeCalculator.extra_groups_for_head_shards``.

    When the B/C groups do not divide evenly over the ranks, vLLM replicates
    groups so every head shard carries the groups it needs: it adds
    ``tp_size - n_groups`` groups (exact for ``n_groups == 1``, the case the
    vLLM comment describes).
    """
    if n_groups % tp_size == 0:
        return 0
    return tp_size - n_groups


def mamba1_state_shape(
    *,
    tp_world_size: int,
    intermediate_size: int,
    state_size: int,
    conv_kernel: int,
    conv_layout: ConvLayout = "SD",
) -> tuple[Shape, ...]:
    """``MambaStateShapeCalculator.mamba1_state_shape``.

    conv  = (conv_kernel - 1, intermediate_size / tp)      [SD layout]
    ssm   = (intermediate_size / tp, state_size)
    """
    conv_dim = divide(intermediate_size, tp_world_size)
    conv = _orient_conv_shape(conv_dim, conv_kernel - 1, conv_layout)
    temporal = (divide(intermediate_size, tp_world_size), state_size)
    return (conv, temporal)


def mamba2_state_shape(
    *,
    tp_world_size: int,
    intermediate_size: int,
    n_groups: int,
    num_heads: int,
    head_dim: int,
    state_size: int,
    conv_kernel: int,
    num_spec: int = 0,
    conv_layout: ConvLayout = "SD",
) -> tuple[Shape, ...]:
    """``MambaStateShapeCalculator.mamba2_state_shape``.

    n_groups' = n_groups + extra_groups_for_head_shards(n_groups, tp)
    conv_dim  = intermediate_size + 2 * n_groups' * state_size
    conv      = (conv_kernel - 1 + num_spec, conv_dim / tp)   [SD layout]
    ssm       = (num_heads / tp, head_dim, state_size)
    """
    groups = n_groups + extra_groups_for_head_shards(n_groups, tp_world_size)
    conv_dim = intermediate_size + 2 * groups * state_size
    conv = _orient_conv_shape(
        divide(conv_dim, tp_world_size), conv_kernel - 1 + num_spec, conv_layout
    )
    temporal = (divide(num_heads, tp_world_size), head_dim, state_size)
    return (conv, temporal)


def gated_delta_net_state_shape(
    *,
    tp_world_size: int,
    num_k_heads: int,
    num_v_heads: int,
    head_k_dim: int,
    head_v_dim: int,
    conv_kernel_size: int,
    num_spec: int = 0,
    conv_layout: ConvLayout = "SD",
) -> tuple[Shape, ...]:
    """``MambaStateShapeCalculator.gated_delta_net_state_shape``.

    conv_dim  = 2 * num_k_heads * head_k_dim + num_v_heads * head_v_dim
    conv      = (conv_kernel_size - 1 + num_spec, conv_dim / tp)   [SD layout]
    recurrent = (num_v_heads / tp, head_v_dim, head_k_dim)

    Older vLLM releases ordered the recurrent state as
    ``(num_v_heads / tp, head_k_dim, head_v_dim)``; the element count is the
    same, and for Qwen3-Next both head dims are 128.
    """
    conv_dim = head_k_dim * num_k_heads * 2 + head_v_dim * num_v_heads
    conv = _orient_conv_shape(
        divide(conv_dim, tp_world_size), conv_kernel_size - 1 + num_spec, conv_layout
    )
    temporal = (divide(num_v_heads, tp_world_size), head_v_dim, head_k_dim)
    return (conv, temporal)


def short_conv_state_shape(
    *,
    tp_world_size: int,
    intermediate_size: int,
    conv_kernel: int,
    conv_layout: ConvLayout = "SD",
) -> tuple[Shape, ...]:
    """``MambaStateShapeCalculator.short_conv_state_shape``: one conv state only."""
    conv_dim = divide(intermediate_size, tp_world_size)
    return (_orient_conv_shape(conv_dim, conv_kernel - 1, conv_layout),)


def linear_attention_state_shape(
    *,
    num_heads: int,
    tp_world_size: int,
    head_dim: int,
) -> tuple[Shape, ...]:
    """``MambaStateShapeCalculator.linear_attention_state_shape``.

    One state of ``(num_heads // tp, head_dim, head_dim)``.  Note that vLLM uses
    floor division here, not the asserting ``divide``.
    """
    if tp_world_size <= 0:
        raise ValueError(f"tensor-parallel size must be positive, got {tp_world_size}")
    return ((num_heads // tp_world_size, head_dim, head_dim),)


# --------------------------------------------------------------------------
# dtypes
# --------------------------------------------------------------------------

# vLLM's ``STR_DTYPE_TO_TORCH_DTYPE`` spellings (vllm/utils/torch_utils.py)
# mapped to canonical torch dtype names.
_DTYPE_ALIASES: dict[str, str] = {
    "float32": "float32",
    "float": "float32",
    "fp32": "float32",
    "float16": "float16",
    "half": "float16",
    "fp16": "float16",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
}

# The ``mamba_type`` strings vLLM's layers report (MambaBase.mamba_type).
MAMBA_TYPES: tuple[str, ...] = (
    "mamba1",
    "mamba2",
    "gdn_attention",
    "short_conv",
    "linear_attention",
)


def _canonical(name: str, what: str) -> str:
    key = name.removeprefix("torch.").lower()
    try:
        return _DTYPE_ALIASES[key]
    except KeyError:
        raise ValueError(
            f"unsupported {what} {name!r}; expected one of {sorted(_DTYPE_ALIASES)}"
        ) from None


def resolve_cache_dtype(cache_dtype: str, model_dtype: str) -> str:
    """``get_kv_cache_torch_dtype(cache_dtype, model_dtype)`` for state caches.

    ``"auto"`` means "the model's dtype"; anything else names the dtype.
    """
    if cache_dtype == "auto":
        return _canonical(model_dtype, "model dtype")
    return _canonical(cache_dtype, "cache dtype")


def state_dtypes(
    mamba_type: str,
    model_dtype: str,
    mamba_cache_dtype: str = "auto",
    mamba_ssm_cache_dtype: str = "auto",
) -> tuple[str, ...]:
    """``MambaStateDtypeCalculator``: dtype names, in the same order as the shapes.

    * ``mamba1`` / ``mamba2`` / ``gdn_attention`` (``_mamba_state_dtype``):
      conv = resolve(mamba_cache_dtype, model_dtype); temporal = conv when
      ``mamba_ssm_cache_dtype == "auto"``, else ``mamba_ssm_cache_dtype``.
    * ``short_conv`` and ``linear_attention``: one state of
      resolve(mamba_cache_dtype, model_dtype).

    ``"gated_delta_net"`` is accepted as an alias of ``"gdn_attention"``.
    Model-specific overrides that vLLM applies before calling the calculator
    (e.g. Nemotron-H's float32 SSM default) are the caller's business; see
    :mod:`kvspec.integrations.hf.families`.
    """
    kind = "gdn_attention" if mamba_type == "gated_delta_net" else mamba_type
    if kind not in MAMBA_TYPES:
        raise ValueError(f"unknown mamba_type {mamba_type!r}; expected one of {MAMBA_TYPES}")
    conv = resolve_cache_dtype(mamba_cache_dtype, model_dtype)
    if kind in ("short_conv", "linear_attention"):
        return (conv,)
    if mamba_ssm_cache_dtype == "auto":
        temporal = conv
    else:
        temporal = _canonical(mamba_ssm_cache_dtype, "mamba_ssm_cache_dtype")
    return (conv, temporal)
