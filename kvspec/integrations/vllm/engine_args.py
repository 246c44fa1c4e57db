"""``kvspec engine-args ARTIFACT --engine vllm``: the ``vllm serve`` flags of a plan.

Every engine setting the plan depends on becomes the vLLM 0.33.0 flag (or
environment variable) that sets it, as the one declaration of engine settings
names it (:data:`kvspec.model.engine.SETTINGS`), so the engine is started with
what the artifact was planned for; settings with no flag are listed as such. The
plugin's environment line comes first: with it, the engine also checks itself
against the artifact (docs/vllm.md). Needs no vLLM.

>>> from kvspec.artifact import Artifact
>>> args = engine_args(Artifact.read("layouts/llama-3.1-8b.kvlayout.json"),
...                    "layouts/llama-3.1-8b.kvlayout.json")
>>> [f.flag for f in args.flags][:4]
['--tensor-parallel-size', '--pipeline-parallel-size', '--decode-context-parallel-size', '--dtype']
"""

from __future__ import annotations

import dataclasses
import shlex
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from kvspec.artifact import Artifact
from kvspec.artifact import format as fmt
from kvspec.errors import ArtifactError, KvspecError
from kvspec.integrations.vllm import TARGET
from kvspec.integrations.vllm.by_design import Plan, applicable
from kvspec.integrations.vllm.frozen import PlanFacts, read_facts
from kvspec.integrations.vllm.guard import UNSERVABLE
from kvspec.integrations.vllm.plugin import LAYOUT_ENV, MODE_ENV
from kvspec.integrations.vllm.pooling import SERVE_SEPARATE, decision_notes, refusal
from kvspec.model.engine import Engine, setting
from kvspec.model.specs import Attention, MambaState, layer_specs
from kvspec.model.stages import layer_index

#: dtypes ``--dtype`` takes.
_MODEL_DTYPES = ("bfloat16", "float16", "float32")
#: ``--mode`` values: the plugin's modes, or ``auto`` (enforce where the plan needs it).
MODES = ("auto", "verify", "enforce")


@dataclass(frozen=True)
class Flag:
    """One ``vllm serve`` flag: the flag, its value (None: a switch), what it sets."""

    flag: str
    value: str | None
    why: str
    #: The value is several arguments (separated by spaces).
    many: bool = False

    def words(self) -> list[str]:
        if self.value is None:
            return [self.flag]
        return [self.flag, *self.value.split()] if self.many else [self.flag, self.value]


@dataclass(frozen=True)
class EngineArgs:
    """Everything ``vllm serve`` needs to reproduce an artifact's plan."""

    model: str
    artifact: str
    fingerprint: str
    env: dict[str, str]
    flags: tuple[Flag, ...]
    #: ``(setting, why it has no flag)``.
    no_flag: tuple[tuple[str, str], ...] = field(default=())
    #: Settings vLLM would not run as planned whatever the flags.
    conflicts: tuple[str, ...] = field(default=())
    #: The pooling decision: what was chosen and what it changed (comment lines).
    notes: tuple[str, ...] = field(default=())
    #: Why the plugin's mode is what it is (``--mode auto``).
    mode_why: str | None = None


class _Read(NamedTuple):
    """An artifact as engine-args reads it: its body, the plan's facts (the engine
    it was planned for) and the final engine (``max_model_len`` fitted)."""

    body: fmt.Layout
    facts: PlanFacts
    engine: Engine


def _read(artifact: Artifact, path: str) -> _Read:
    body = artifact.body
    try:
        facts = read_facts(body)
    except ValueError as exc:
        raise ArtifactError(f"the artifact is refused: {exc}", file=path,
                            hint="recompile it with `kvspec compile`") from None
    engine = dataclasses.replace(facts.engine, max_model_len=body.engine.max_model_len)
    return _Read(body, facts, engine)


def _model_dtype(art: _Read) -> str | None:
    layers = [(art.facts.specs[n], e) for n, e in art.body.layers.items()]
    dtypes = [s.dtype for s, e in layers
              if isinstance(s, Attention) and e.kv_cache_dtype in (None, "auto")
              and s.dtype in _MODEL_DTYPES]
    return Counter(dtypes).most_common(1)[0][0] if dtypes else None


def _state_dtypes(art: _Read) -> tuple[str, ...] | None:
    states = [s for s in art.facts.specs.values() if isinstance(s, MambaState)]
    return states[0].dtypes if states else None


def _skip_layers(art: _Read) -> list[int]:
    """Decoder layers whose cache stays unquantized under a quantized engine dtype."""
    if art.engine.kv_cache_dtype == "auto":
        return []
    return sorted({i for n, e in art.body.layers.items()
                   if e.kv_cache_dtype == "auto" and (i := layer_index(n)) is not None})


def _flag(name: str, engine: Engine, why: str, *, value: str | None = None,
          many: bool = False) -> Flag:
    """The flag that sets engine setting ``name`` (:data:`kvspec.model.engine.SETTINGS`)."""
    flag, own = setting(name).vllm_flag(engine)
    return Flag(flag, own if value is None else value, why, many)


def _parallel(engine: Engine) -> list[Flag]:
    return [_flag("tensor_parallel_size", engine, "KV heads per rank"),
            _flag("pipeline_parallel_size", engine, "the layers of each stage"),
            _flag("decode_context_parallel_size", engine,
                  "tokens per rank of DCP-sharded caches")]


def _cache(art: _Read) -> list[Flag]:
    engine, planned = art.engine, art.facts.engine
    out = []
    dtype = _model_dtype(art)
    if dtype is not None:
        out.append(Flag("--dtype", dtype, "the page size of unquantized layers"))
    out.append(_flag("kv_cache_dtype", engine, "quantization of the KV cache"))
    skipped = _skip_layers(art)
    if skipped:
        out.append(Flag("--kv-cache-dtype-skip-layers", " ".join(map(str, skipped)),
                        "decoder layers kept in the model dtype", many=True))
    out.append(_flag("block_size", engine, "tokens per attention block"))
    out.append(_flag("max_model_len", engine, "blocks per request and the fit check",
                     value="auto" if planned.auto_max_model_len else None))
    out.append(_flag("enable_prefix_caching", engine,
                     "prefix caching (hybrids: mamba_cache_mode follows it)"))
    out.append(_flag("hybrid", engine,
                     "one group per attention type, or local attention as full"))
    states = _state_dtypes(art)
    if states is not None:
        out.append(Flag("--mamba-ssm-cache-dtype", states[-1], "the SSM state's dtype"))
        if engine.mamba_block_size is not None:
            out.append(_flag("mamba_block_size", engine, "tokens per state block"))
    if engine.prefix_match_unit is not None:
        out.append(_flag("prefix_match_unit", engine, "tokens per prefix-cache key"))
    return out


def _scheduler(engine: Engine) -> list[Flag]:
    return [_flag("max_num_batched_tokens", engine,
                  "in-flight tokens of sliding-window and chunked layers"),
            _flag("max_num_seqs", engine, "requests per step"),
            _flag("async_scheduling", engine, "batches in flight")]


def _budget(art: _Read, pin_blocks: bool) -> list[Flag]:
    budget = art.body.budget
    pinned = art.engine.num_gpu_blocks_override  # positive when given
    if pinned is None and pin_blocks and budget is not None:
        pinned = budget.num_blocks
    if pinned is not None:
        return [_flag("num_gpu_blocks_override", art.engine, "the block count",
                      value=str(pinned))]
    if budget is not None:
        return [Flag("--kv-cache-memory-bytes", str(budget.memory),
                     f"the KV cache budget per rank ({budget.num_blocks} blocks)")]
    return []


def _env(art: _Read, path: str, mode: str) -> dict[str, str]:
    engine = art.facts.engine
    env = {LAYOUT_ENV: path, MODE_ENV: mode}
    for name in ("axis_order", "pp_layer_partition"):
        s = setting(name)
        value = s.to_data(getattr(engine, name))
        if value is not None and value != s.to_data(s.default):
            assert s.env is not None
            env[s.env] = ",".join(map(str, value)) if isinstance(value, list) else str(value)
    return env


def _no_flag(art: _Read) -> list[tuple[str, str]]:
    facts = art.facts
    engine = facts.engine
    out = []
    if any(isinstance(s, MambaState) for g in facts.groups for s in layer_specs(g.spec)):
        out.append((f"mamba_cache_mode {engine.mamba_cache_mode}",
                    (f"follows {setting('enable_prefix_caching').flag} "
                     f"({setting('mamba_cache_mode').flag} has no effect in vLLM {TARGET})")))
    if engine.speculative_method is not None:
        out.append((f"speculative_method {engine.speculative_method}",
                    "set the drafter with --speculative-config '{\"method\": ...}'"))
    if engine.max_num_encoder_input_tokens is not None:
        out.append(("max_num_encoder_input_tokens", "vLLM derives it from the model's encoder"))
    out += [(f"by design: {r.id}", f"{r.title}: vLLM {TARGET} {r.upstream}")
            for r in applicable(facts) if r.everything or r.refusals]
    return out


def conflicts(plan: Plan) -> list[str]:
    """Settings vLLM's config stage would change whatever the flags say."""
    engine = plan.engine
    if not any(isinstance(s, MambaState) for s in plan.specs.values()):
        return []
    want = "align" if engine.enable_prefix_caching else "none"
    if engine.mamba_cache_mode in (want, "all"):
        return []
    return [(f"mamba_cache_mode is {engine.mamba_cache_mode}, but vLLM {TARGET} runs a hybrid "
             f"{'with' if engine.enable_prefix_caching else 'without'} prefix caching in mode "
             f"{want}: set engine.mamba_cache_mode: {want} (kvspec init does) and recompile")]


def plugin_mode(facts: Plan, mode: str = "auto") -> tuple[str, str | None]:
    """The plugin's ``KVSPEC_MODE`` for a plan and why: ``mode`` as asked, or for
    ``auto``, ``enforce`` where the plan differs from what vLLM plans by design (a
    by-design rule with compared fields: only the plugin gives vLLM the artifact's
    placement), else ``verify`` (vLLM plans it, the plugin checks)."""
    if mode != "auto":
        return mode, None
    rules = [r.id for r in applicable(facts) if r.fields and r.id not in UNSERVABLE]
    if rules:
        return "enforce", ("enforce: vLLM plans this differently by design (" +
                           ", ".join(rules) + "); the plugin serves the artifact's placement")
    return "verify", None


def servable(artifact: Artifact, path: str) -> None:
    """A :class:`KvspecError` when vLLM 0.33 cannot hold ``artifact``'s pools."""
    why = refusal(artifact)
    record = artifact.body.pooling
    if why is not None and record is not None:
        raise KvspecError(f"vLLM {TARGET} cannot serve this artifact: {why[0]}", file=path,
                          path=why[1], found=f"pooling: {record.policy}",
                          expected="a unified plan (one pool)", hint=SERVE_SEPARATE)


def engine_args(artifact: Artifact, path: str, *, model: str | None = None,
                mode: str = "auto", pin_blocks: bool = False) -> EngineArgs:
    """The ``vllm serve`` flags and environment that reproduce ``artifact``'s plan
    (the plan ``pooling: auto`` chose, when it chose one); a :class:`KvspecError`
    for a plan of separate pools, which vLLM 0.33 cannot hold."""
    servable(artifact, path)
    art = _read(artifact, path)
    mode, why = plugin_mode(art.facts, mode)
    flags = [*_parallel(art.engine), *_cache(art), *_scheduler(art.engine),
             *_budget(art, pin_blocks)]
    return EngineArgs(model or art.body.model or "MODEL", path, artifact.fingerprint,
                      _env(art, path, mode), tuple(flags), tuple(_no_flag(art)),
                      tuple(conflicts(art.facts)), tuple(decision_notes(artifact)), why)


def render_shell(args: EngineArgs) -> str:
    """A shell command (one flag a line) with the no-flag settings as comments."""
    lines = [(f"# vllm serve flags reproducing {args.artifact} ({args.fingerprint}), "
             f"vLLM {TARGET}")]
    lines += [f"# {note}" for note in args.notes]
    if args.mode_why:
        lines.append(f"# KVSPEC_MODE={args.mode_why}")
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in args.env.items())
    lines.append(f"{env} \\")
    words = [f"vllm serve {shlex.quote(args.model)}"]
    words += ["  " + " ".join(shlex.quote(w) for w in f.words()) for f in args.flags]
    lines.append(" \\\n".join(words))
    for name, why in args.no_flag:
        lines.append(f"# no flag: {name}: {why}")
    for text in args.conflicts:
        lines.append(f"# warning: {text}")
    return "\n".join(lines) + "\n"


def as_json(args: EngineArgs) -> dict[str, Any]:
    return {"engine": "vllm", "vllm": TARGET, "model": args.model, "artifact": args.artifact,
            "fingerprint": args.fingerprint, "env": args.env,
            "flags": [{"flag": f.flag, "value": f.value, "sets": f.why} for f in args.flags],
            "argv": ["vllm", "serve", args.model] + [w for f in args.flags for w in f.words()],
            "no_flag": [{"setting": s, "why": w} for s, w in args.no_flag],
            "conflicts": list(args.conflicts), "pooling": list(args.notes),
            "mode_why": args.mode_why}
