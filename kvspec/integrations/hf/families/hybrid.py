"""Families of hybrid models with state (Mamba-style) layers: Jamba, Qwen3-Next, Qwen3.5,
Nemotron-H."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvspec.integrations.hf import state_shapes as ss
from kvspec.integrations.hf.families.facts import (
    STATE,
    ConfigError,
    Ctx,
    LayerFacts,
    attention_layer,
    cfg_int,
    cfg_require,
    head_dim_of,
    layer_types,
    num_layers,
)


def mamba_layer(index: int, mamba_type: str, shapes: tuple[tuple[int, ...], ...],
                ctx: Ctx) -> LayerFacts:
    """A state layer: its shapes, and dtypes from the served dtype and the
    (hook-resolved) ``--mamba-cache-dtype`` / ``--mamba-ssm-cache-dtype``."""
    return LayerFacts(
        index=index,
        kind=STATE,
        num_kv_heads=None,
        head_size=None,
        state_shapes=shapes,
        state_dtypes=ss.state_dtypes(
            mamba_type, ctx.dtype, ctx.mamba_cache_dtype, ctx.mamba_ssm_cache_dtype
        ),
        mamba_type=mamba_type,
    )


def _jamba(ctx: Ctx) -> list[LayerFacts]:
    """Jamba (vLLM ``jamba.py``).

    ``JambaConfig.layers_block_type``: attention iff
    ``i % attn_layer_period == attn_layer_offset`` (defaults 8 and 4), else a
    Mamba-1 mixer whose state is ``mamba1_state_shape`` with
    ``intermediate_size = mamba_expand * hidden_size``, ``state_size =
    mamba_d_state``, ``conv_kernel = mamba_d_conv`` (defaults 2, 16, 4).
    """
    cfg = ctx.text
    n = num_layers(cfg)
    period = cfg_int(cfg, "attn_layer_period", 8)
    offset = cfg_int(cfg, "attn_layer_offset", 4, minimum=0)
    shapes = ss.mamba1_state_shape(
        tp_world_size=ctx.tp,
        intermediate_size=cfg_int(cfg, "mamba_expand", 2) * cfg_int(cfg, "hidden_size"),
        state_size=cfg_int(cfg, "mamba_d_state", 16),
        conv_kernel=cfg_int(cfg, "mamba_d_conv", 4),
    )
    layers = []
    for i in range(n):
        if i % period == offset:
            layers.append(attention_layer(i, cfg))
        else:
            layers.append(mamba_layer(i, "mamba1", shapes, ctx))
    return layers


def _qwen3_next(ctx: Ctx) -> list[LayerFacts]:
    """Qwen3-Next (vLLM ``qwen3_next.py``) and Qwen3.5 / Qwen3.5-MoE (``qwen3_5.py``,
    whose decoder layers are Qwen3-Next's, nested under ``text_config``).

    ``layer_types`` when present, else ``Qwen3NextConfig``'s derivation: full
    attention when ``(i + 1) % full_attention_interval == 0`` (default 4),
    ``linear_attention`` otherwise.  Linear layers are Gated DeltaNet, state from
    ``gated_delta_net_state_shape(tp, linear_num_key_heads,
    linear_num_value_heads, linear_key_head_dim, linear_value_head_dim,
    linear_conv_kernel_dim)``.
    """
    cfg = ctx.text
    n = num_layers(cfg)
    types = layer_types(cfg, n)
    if types is None:
        interval = cfg_int(cfg, "full_attention_interval", 4)
        types = [
            "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)
        ]
    shapes = ss.gated_delta_net_state_shape(
        tp_world_size=ctx.tp,
        num_k_heads=cfg_int(cfg, "linear_num_key_heads"),
        num_v_heads=cfg_int(cfg, "linear_num_value_heads"),
        head_k_dim=cfg_int(cfg, "linear_key_head_dim"),
        head_v_dim=cfg_int(cfg, "linear_value_head_dim"),
        conv_kernel_size=cfg_int(cfg, "linear_conv_kernel_dim"),
    )
    layers = []
    for i, layer_type in enumerate(types):
        if layer_type == "full_attention":
            layers.append(attention_layer(i, cfg))
        elif layer_type == "linear_attention":
            layers.append(mamba_layer(i, "gdn_attention", shapes, ctx))
        else:
            raise ConfigError(f"layer {i}: unsupported Qwen3-Next layer type {layer_type!r}",
                              cfg, ("layer_types", i),
                              expected='"full_attention" or "linear_attention"',
                              found=layer_type)
    return layers


def _nemotron_h(ctx: Ctx) -> list[LayerFacts]:
    """Nemotron-H (vLLM ``nemotron_h.py``).

    ``hybrid_override_pattern`` has one character per layer: ``M`` Mamba-2,
    ``*`` attention, ``-`` MLP, ``E`` MoE (the last two hold no cache).
    Mamba state: ``mamba2_state_shape`` with ``intermediate_size =
    mamba_num_heads * mamba_head_dim``, ``n_groups``, ``num_heads =
    mamba_num_heads``, ``head_dim = mamba_head_dim``, ``state_size =
    ssm_state_size``, ``conv_kernel``.  The attention head size is ``head_dim``
    (older configs: ``attention_head_dim``).  SSM-state dtype: float32 unless
    the config or the caller says otherwise (:func:`rules.ssm_cache_dtype`).
    """
    cfg = ctx.text
    if cfg.get("hybrid_override_pattern") is None and isinstance(
            cfg.get("layers_block_type"), list):
        return _nemotron_h_layers(ctx, _block_type_pattern(cfg))
    n = num_layers(cfg)
    pattern = cfg_require(cfg, "hybrid_override_pattern")
    expected = f"one of M * - E per layer, {n:,} in all"
    if not isinstance(pattern, str):
        raise ConfigError("config.json field 'hybrid_override_pattern' must be a string", cfg,
                          ("hybrid_override_pattern",), expected=expected, found=pattern)
    if len(pattern) != n:
        raise ConfigError(f"hybrid_override_pattern has {len(pattern):,} entries for {n:,} "
                          "layers", cfg, ("hybrid_override_pattern",), expected=expected,
                          found=f"{len(pattern):,} entries",
                          hint="num_hidden_layers and the pattern must agree")
    return _nemotron_h_layers(ctx, pattern)


#: transformers 5 saves Nemotron-H's pattern as ``layers_block_type``, one name per
#: layer (``NemotronHConfig._list_to_pattern``), and no ``num_hidden_layers``.
_BLOCK_TYPES = {"linear_attention": "M", "mamba": "M", "full_attention": "*",
                "attention": "*", "mlp": "-", "moe": "E"}


def _block_type_pattern(cfg: Mapping[str, Any]) -> str:
    names = cfg["layers_block_type"]
    expected = "one of " + ", ".join(map(repr, _BLOCK_TYPES)) + " per layer"
    for i, name in enumerate(names):
        if not isinstance(name, str) or name not in _BLOCK_TYPES:
            raise ConfigError(f"layer {i}: unknown layers_block_type entry {name!r}", cfg,
                              ("layers_block_type", i), expected=expected, found=name)
    n = num_layers(cfg)
    if n != len(names):
        raise ConfigError(f"layers_block_type has {len(names):,} entries for {n:,} layers",
                          cfg, ("layers_block_type",), expected=f"{n} entries",
                          found=f"{len(names):,} entries",
                          hint="num_hidden_layers and the list must agree")
    return "".join(_BLOCK_TYPES[name] for name in names)


def _nemotron_h_layers(ctx: Ctx, pattern: str) -> list[LayerFacts]:
    cfg = ctx.text
    expected = f"one of M * - E per layer, {len(pattern):,} in all"
    heads = cfg_int(cfg, "mamba_num_heads")
    head_dim = cfg_int(cfg, "mamba_head_dim")
    shapes = ss.mamba2_state_shape(
        tp_world_size=ctx.tp,
        intermediate_size=heads * head_dim,
        n_groups=cfg_int(cfg, "n_groups"),
        num_heads=heads,
        head_dim=head_dim,
        state_size=cfg_int(cfg, "ssm_state_size"),
        conv_kernel=cfg_int(cfg, "conv_kernel"),
    )
    attn_head = head_dim_of(cfg, "head_dim", "attention_head_dim")
    layers = []
    for i, char in enumerate(pattern):
        if char == "M":
            layers.append(mamba_layer(i, "mamba2", shapes, ctx))
        elif char == "*":
            layers.append(attention_layer(i, cfg, head_size=attn_head))
        elif char in "-E":
            continue
        else:
            raise ConfigError(f"layer {i}: unknown hybrid_override_pattern symbol {char!r}",
                              cfg, ("hybrid_override_pattern",), expected=expected,
                              found=char)
    return layers


