"""Engine settings that shape a plan: the pooling policy of one deployment.

These are the few serving-engine settings the planner reads. Everything the
reference planner reads from the environment is an explicit field here
(``draft_pool``, ``draft_block_size``, ``draft_pool_blocks``); compiling never
reads the environment.

Each setting is declared once, as a field of :class:`Engine` whose metadata
says how every other place names it: its key in a source (``engine.*``,
``parallel.*``, ``quantization.*``), its key in an artifact's ``engine`` record,
vLLM's name for it (the engine argument, which is also a spec dump's config
key), the ``vllm serve`` flag or environment variable that sets it, and a doc
line. :data:`SETTINGS` lists them; the source's engine (``build_engine``), the
artifact's engine record (:func:`artifact_values`, :func:`engine_from_artifact`),
the ``vllm serve`` flags (``kvspec engine-args``) and vLLM's config keys
(:func:`vllm_values`) are derived from it.

>>> setting("axis_order").source_key, setting("axis_order").artifact_key
('engine.layout', 'axis_order')
>>> setting("hybrid").vllm, setting("tensor_parallel_size").flag
('disable_hybrid_kv_cache_manager', '--tensor-parallel-size')
>>> SettingRef("decode_context_parallel_size").shown()
'parallel.decode_context'
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from kvspec.model.axes import DEFAULT_AXIS_ORDER, AxisOrder

#: The modes of state layers' caching (vLLM's ``mamba_cache_mode``).
MAMBA_CACHE_MODES = ("none", "align", "all")
MambaCacheMode = Literal[MAMBA_CACHE_MODES]  # type: ignore[valid-type]


def _same(value: Any) -> Any:
    return value


def _setting(default: Any, doc: str, *, source: str | None, artifact: str | None = None,
             vllm: str | None = None, flag: str | None = None, off: str | None = None,
             env: str | None = None, to_data: Callable[[Any], Any] = _same,
             from_data: Callable[[Any], Any] = _same,
             to_vllm: Callable[[Engine], Any] | None = None) -> Any:
    """A field of :class:`Engine` carrying its :class:`Setting` declaration."""
    meta = {"doc": doc, "source": source, "artifact": artifact, "vllm": vllm, "flag": flag,
            "off": off, "env": env, "to_data": to_data, "from_data": from_data,
            "to_vllm": to_vllm}
    return field(default=default, metadata={"setting": meta})


def _axis_name(order: AxisOrder) -> str:
    return order.name


def _as_list(value: tuple[int, ...] | None) -> list[int] | None:
    return list(value) if value is not None else None


def _as_tuple(value: list[int] | None) -> tuple[int, ...] | None:
    return tuple(value) if value is not None else None


@dataclass(frozen=True, slots=True, kw_only=True)
class Engine:
    """Pooling policy and parallelism of one deployment.

    >>> e = Engine(block_size=16, max_model_len=8192)
    >>> e.max_in_flight_tokens   # 8192 batched tokens x 2 batches (async scheduling)
    16384
    """

    block_size: int = _setting(
        16, "Tokens per attention block.", source="engine.block_size", vllm="block_size",
        flag="--block-size")
    max_model_len: int = _setting(
        8192, "Longest request the plan serves (the model's own maximum when the source "
        "says auto: fitted to the budget later).", source="engine.max_model_len",
        artifact="model_max_len", vllm="max_model_len", flag="--max-model-len")
    original_max_model_len: int | None = _setting(
        None, "-1 when the source asks for max_model_len: auto (fit it to memory).",
        source=None, vllm="original_max_model_len")
    max_num_batched_tokens: int = _setting(
        8192, "Tokens one scheduler step may batch.",
        source="engine.max_num_batched_tokens", vllm="max_num_batched_tokens",
        flag="--max-num-batched-tokens")
    max_num_seqs: int = _setting(
        256, "Requests one scheduler step may run.", source="engine.max_num_seqs",
        vllm="max_num_seqs", flag="--max-num-seqs")
    max_num_encoder_input_tokens: int | None = _setting(
        None, "Encoder tokens a cross-attention layer caches per request.",
        source="engine.max_num_encoder_input_tokens", vllm="max_num_encoder_input_tokens")
    async_scheduling: bool | None = _setting(
        None, "None: on for a single pipeline stage, off otherwise (vLLM's GPU default).",
        source="engine.async_scheduling", vllm="async_scheduling", flag="--async-scheduling",
        off="--no-async-scheduling", to_vllm=lambda e: e.async_scheduling_resolved)
    enable_prefix_caching: bool = _setting(
        True, "Prefix caching (hybrids: mamba_cache_mode follows it).",
        source="engine.prefix_caching", vllm="enable_prefix_caching",
        flag="--enable-prefix-caching", off="--no-enable-prefix-caching")
    hybrid: bool = _setting(
        True, "False: local attention allocated as full attention "
        "(disable_hybrid_kv_cache_manager).", source="engine.hybrid",
        vllm="disable_hybrid_kv_cache_manager", flag="--disable-hybrid-kv-cache-manager",
        off="--enable-hybrid-kv-cache-manager", to_vllm=lambda e: not e.hybrid)
    axis_order: AxisOrder = _setting(  # noqa: RUF009 - _setting returns a dataclasses.field
        DEFAULT_AXIS_ORDER, "Physical order of the axes [L, B, H, N, C].",
        source="engine.layout", vllm="kv_cache_layout",
        env="VLLM_KV_CACHE_LAYOUT", to_data=_axis_name, from_data=AxisOrder.parse,
        to_vllm=lambda e: e.axis_order.name)
    kv_cache_dtype: str = _setting(
        "auto", "Quantization of the KV cache ('auto': the model dtype).",
        source="quantization.kv_cache_dtype", vllm="kv_cache_dtype", flag="--kv-cache-dtype")
    tensor_parallel_size: int = _setting(
        1, "Tensor-parallel ranks (KV heads split across them).", source="parallel.tensor",
        vllm="tensor_parallel_size", flag="--tensor-parallel-size")
    pipeline_parallel_size: int = _setting(
        1, "Pipeline stages (each owns a share of the layers).", source="parallel.pipeline",
        vllm="pipeline_parallel_size", flag="--pipeline-parallel-size")
    decode_context_parallel_size: int = _setting(
        1, "Decode-context-parallel ranks (tokens of full attention sharded across them).",
        source="parallel.decode_context", vllm="decode_context_parallel_size",
        flag="--decode-context-parallel-size")
    num_gpu_blocks_override: int | None = _setting(
        None, "A fixed block count (the budget is then what those blocks cost).",
        source="engine.num_blocks", artifact="num_blocks", vllm="num_gpu_blocks_override",
        flag="--num-gpu-blocks-override")
    mamba_cache_mode: MambaCacheMode = _setting(  # noqa: RUF009 - as axis_order
        "none", "How state layers cache: none (one state per request), align, all.",
        source="engine.mamba_cache_mode", vllm="mamba_cache_mode", flag="--mamba-cache-mode")
    mamba_block_size: int | None = _setting(
        None, "Tokens per state block (None: the attention block size).",
        source="engine.mamba_block_size", vllm="mamba_block_size", flag="--mamba-block-size")
    prefix_match_unit: int | None = _setting(
        None, "Tokens per prefix-cache key (None: the groups' common divisor).",
        source="engine.prefix_match_unit", vllm="prefix_match_unit",
        flag="--prefix-match-unit")
    num_prefill_lookahead_tokens: int = _setting(
        0, "Tokens a multi-module speculative step may re-prefill.",
        source="engine.prefill_lookahead_tokens", vllm="num_prefill_lookahead_tokens")
    speculative_method: str | None = _setting(
        None, "Speculative decoding method (eagle, eagle3, mtp, ...), or None.",
        source="engine.speculative_method", vllm="speculative_method")
    draft_pool: bool = _setting(
        True, "GLM-5-Next drafter: a pool of its own.", source="engine.draft.pool",
        env="VLLM_GLM5NEXT_DRAFT_POOL")
    draft_block_size: int | None = _setting(
        None, "GLM-5-Next drafter block size (None: derived).",
        source="engine.draft.block_size", env="VLLM_GLM5NEXT_DRAFT_BLOCK_SIZE")
    draft_pool_blocks: int | None = _setting(
        None, "GLM-5-Next drafter pool blocks (None: derived).",
        source="engine.draft.pool_blocks", env="VLLM_GLM5NEXT_DRAFT_POOL_BLOCKS")
    total_num_hidden_layers: int | None = _setting(
        None, "Decoder layers of the whole model (pipeline stage boundaries; default: the "
        "highest layer index + 1).", source="parallel.num_hidden_layers")
    pp_layer_partition: tuple[int, ...] | None = _setting(
        None, "Explicit pipeline partition: decoder layers per stage.",
        source="parallel.pipeline_partition", env="VLLM_PP_LAYER_PARTITION",
        to_data=_as_list, from_data=_as_tuple)

    @property
    def async_scheduling_resolved(self) -> bool:
        if self.async_scheduling is None:
            return self.pipeline_parallel_size == 1
        return self.async_scheduling

    @staticmethod
    def batches_in_flight(async_scheduling: bool, pipeline_parallel_size: int = 1) -> int:
        """Batches scheduled but not yet settled, as vLLM 0.33 counts them
        (``VllmConfig.max_concurrent_batches`` with Model Runner V2, its default on
        GPUs): one per pipeline stage, and async scheduling keeps one more.

        >>> [Engine.batches_in_flight(a, pp) for a in (False, True) for pp in (1, 2)]
        [1, 2, 2, 3]
        """
        stages = max(pipeline_parallel_size, 1)
        return stages + 1 if async_scheduling else stages

    @property
    def concurrent_batches(self) -> int:
        """The batches in flight the plan reserves for: vLLM's count
        (:meth:`batches_in_flight`)."""
        return self.batches_in_flight(self.async_scheduling_resolved, self.pipeline_parallel_size)

    @property
    def max_in_flight_tokens(self) -> int:
        return self.max_num_batched_tokens * self.concurrent_batches

    @property
    def encoder_tokens(self) -> int:
        if self.max_num_encoder_input_tokens is not None:
            return self.max_num_encoder_input_tokens
        return self.max_num_batched_tokens

    @property
    def auto_max_model_len(self) -> bool:
        return self.original_max_model_len == -1

    def layer_block_size(self, own: int | None = None, *, state: bool = False) -> int:
        """The block size of a layer (the one place that decides it): its own when
        it sets one; a state layer holds one state per request under
        ``mamba_cache_mode: none``, else ``mamba_block_size`` (or the attention
        block size); any other layer, ``block_size``.

        >>> e = Engine(block_size=16, max_model_len=4096)
        >>> e.layer_block_size(), e.layer_block_size(64), e.layer_block_size(state=True)
        (16, 64, 4096)
        """
        if own is not None:
            return own
        if not state:
            return self.block_size
        if self.mamba_cache_mode == "none":
            return self.max_model_len
        return self.mamba_block_size or self.block_size


@dataclass(frozen=True, slots=True)
class Setting:
    """One engine setting as every place that speaks of it names it."""

    #: The :class:`Engine` field.
    name: str
    #: Its type, as the field is annotated.
    type: str
    default: Any
    doc: str
    #: Its key in a source (``engine.block_size``); None: derived, not written.
    source_key: str | None
    #: Its key in an artifact's ``engine`` record.
    artifact_key: str
    #: vLLM's name for it: the engine argument (a spec dump's config key); None: none.
    vllm: str | None
    #: The ``vllm serve`` flag that sets it (for a switch, the one that makes vLLM's
    #: value true).
    flag: str | None
    #: A switch's flag that makes vLLM's value false.
    off: str | None
    #: The environment variable vLLM reads it from, where there is no flag.
    env: str | None
    #: The value as plain data (a source's or an artifact's), and back.
    to_data: Callable[[Any], Any]
    from_data: Callable[[Any], Any]
    #: The value vLLM holds, where it differs from the field's.
    to_vllm: Callable[[Engine], Any] | None

    @property
    def source_path(self) -> tuple[str, ...] | None:
        """The source key as a path into the YAML (``("engine", "block_size")``)."""
        return tuple(self.source_key.split(".")) if self.source_key is not None else None

    def vllm_value(self, engine: Engine) -> Any:
        """The value vLLM holds for this setting of ``engine``."""
        if self.to_vllm is not None:
            return self.to_vllm(engine)
        return getattr(engine, self.name)

    def vllm_flag(self, engine: Engine) -> tuple[str, str | None]:
        """The ``vllm serve`` flag that sets this setting of ``engine``, and its value
        (None for a switch).

        >>> setting("hybrid").vllm_flag(Engine(hybrid=False))
        ('--disable-hybrid-kv-cache-manager', None)
        >>> setting("block_size").vllm_flag(Engine())
        ('--block-size', '16')
        """
        assert self.flag is not None, f"{self.name} has no vllm serve flag"
        value = self.vllm_value(engine)
        if self.off is not None:
            return (self.flag if value else self.off), None
        return self.flag, str(value)


def _settings() -> tuple[Setting, ...]:
    out = []
    for f in dataclasses.fields(Engine):
        meta = dict(f.metadata["setting"])
        out.append(Setting(f.name, str(f.type), f.default, meta.pop("doc"), meta.pop("source"),
                           meta.pop("artifact") or f.name, **meta))
    return tuple(out)


#: Every engine setting, in the order :class:`Engine` declares them.
SETTINGS: tuple[Setting, ...] = _settings()
_BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}

#: Keys of a source's ``engine``, ``parallel`` and ``quantization`` sections that
#: hold no engine setting: the budget, the model's own maximum length (what
#: ``max_model_len: auto`` fits from) and the layers kept unquantized (a per-layer
#: choice, made by the expand pass).
SOURCE_ONLY_KEYS = ("engine.memory", "engine.model_max_len", "quantization.skip_layers")

#: The artifact's engine record, beyond one entry per setting: what the final
#: engine (``max_model_len`` fitted when auto) settles.
ARTIFACT_SETTLED_KEYS = ("max_model_len", "max_in_flight_tokens")


def setting(name: str) -> Setting:
    """The declaration of the :class:`Engine` field ``name``."""
    return _BY_NAME[name]


def artifact_values(planned: Engine, final: Engine | None = None) -> dict[str, Any]:
    """The artifact's ``engine`` record: each setting of the engine the plan was made
    for, under its artifact key, with what the final engine settles
    (``max_model_len`` fitted, ``max_in_flight_tokens``, ``async_scheduling``).

    >>> sorted(artifact_values(Engine(max_model_len=4096)).items())[:3]
    [('async_scheduling', True), ('axis_order', 'LBNHC'), ('block_size', 16)]
    """
    final = planned if final is None else final
    out = {s.artifact_key: s.to_data(getattr(planned, s.name)) for s in SETTINGS}
    out["async_scheduling"] = final.async_scheduling_resolved
    out["max_model_len"] = final.max_model_len
    out["max_in_flight_tokens"] = final.max_in_flight_tokens
    return out


def engine_from_artifact(record: Mapping[str, Any]) -> Engine:
    """The engine an artifact's ``engine`` record was planned for (the inverse of
    :func:`artifact_values` on the planned engine); ``KeyError`` for a missing key.

    >>> e = Engine(max_model_len=4096, pp_layer_partition=(2, 2))
    >>> engine_from_artifact(artifact_values(e)) == dataclasses.replace(e, async_scheduling=True)
    True
    """
    return Engine(**{s.name: s.from_data(record[s.artifact_key]) for s in SETTINGS})


def vllm_values(engine: Engine) -> dict[str, Any]:
    """The settings vLLM has names for, under those names (a spec dump's
    ``config`` keys), as vLLM holds them (``disable_hybrid_kv_cache_manager``,
    ``async_scheduling`` resolved, the axis order's name)."""
    return {s.vllm: s.vllm_value(engine) for s in SETTINGS if s.vllm is not None}


@dataclass(frozen=True, slots=True)
class SettingRef:
    """What an error is about: an engine setting, by its :class:`Engine` field.
    The source layer locates it at the setting's key in the source."""

    name: str

    @property
    def path(self) -> tuple[str, ...]:
        path = setting(self.name).source_path
        assert path is not None, f"{self.name} has no source key"
        return path

    def shown(self) -> str:
        """The source key, where the error cannot be located in a file."""
        return ".".join(self.path)


@dataclass(frozen=True, slots=True)
class BudgetRef:
    """What an error is about: the memory budget, the caller's (``memory=``,
    ``--memory``) or else the source's ``engine.memory``."""

    path: tuple[str, ...] = ("engine", "memory")

    def shown(self) -> str:
        return ".".join(self.path)


def settings_markdown() -> str:
    """The engine settings as a Markdown table: how the source, the artifact and
    vLLM name each (docs/vllm.md holds it; a test keeps it current)."""
    def code(text: str | None) -> str:
        return f"`{text}`" if text else "—"

    rows = ["| setting | source key | artifact key | vLLM name | `vllm serve` | meaning |",
            "| --- | --- | --- | --- | --- | --- |"]
    for s in SETTINGS:
        serve = " / ".join(code(f) for f in (s.flag, s.off) if f) or code(s.env)
        if s.flag and s.env:
            serve += f", {code(s.env)}"
        rows.append(f"| {code(s.name)} | {code(s.source_key)} | {code(s.artifact_key)} | "
                    f"{code(s.vllm)} | {serve} | {s.doc} |")
    return "\n".join(rows) + "\n"
