"""What ``kvspec init`` was asked for, whatever it starts from (a config.json, vLLM)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class InitOptions:
    """What ``kvspec init`` was asked for (its command-line options)."""

    name: str
    model: str | None = None
    tp: int = 1
    pp: int = 1
    #: None: the model's ``max_position_embeddings``; "auto": fit to ``memory``.
    max_model_len: int | Literal["auto"] | None = None
    memory: int | None = None
    kv_cache_dtype: str = "auto"
    #: The model dtype; None: the config's ``torch_dtype`` (bfloat16 if it names none).
    dtype: str | None = None
    block_size: int = 16
    mamba_cache_dtype: str = "auto"
    mamba_ssm_cache_dtype: str = "auto"
    #: The config file as the user named it (for the header).
    config_name: str = "config.json"
    #: The schema comment's path, relative to where the source will live.
    schema: str = "../schemas/source.schema.json"
    #: The GPU class the deployment runs on (``hopper``, ``ampere``, ...), or its
    #: Gated-DeltaNet prefill backend (``flashinfer``, ``triton``), where an engine
    #: choice depends on it (:func:`kvspec.integrations.rules.target`); None: the
    #: common rule (Ampere or newer, no FlashInfer GDN prefill).
    target: str | None = None
    #: vLLM's ``--enable-prefix-caching`` (on by default); hybrids then run in
    #: ``mamba_cache_mode: align`` (:func:`kvspec.integrations.rules.mamba_cache_mode`).
    prefix_caching: bool = True
