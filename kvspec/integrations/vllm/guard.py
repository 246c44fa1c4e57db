"""What the plugin checks a running vLLM engine against: an artifact's promises.

:class:`Expectation` is read from an artifact once per process, as
``kvspec.load`` reads one (:class:`kvspec.artifact.Artifact`: the format
checked, the hash proved; no re-planning, so no planner, pydantic, PyYAML or
simulator in the engine's processes: ``kvspec check`` is what re-plans an
artifact, docs/artifact.md "The trust model"). It holds, as plain data, what the
engine must report (engine settings, every layer's spec) and what its KV-cache
planning must come to (groups, tensors per stage for any block count, the block
sizes), all read from the frozen body; block counts for a budget come from
:mod:`kvspec.artifact.sizing`. The adapter's builder hands it the engine's own
values, also as plain data; any difference is *drift* and stops the engine with
:class:`EngineDrift`, naming the layer, the field and both values. Nothing here
imports vLLM, so the checks are tested without it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvspec.artifact import Artifact
from kvspec.artifact import format as fmt
from kvspec.artifact.sizing import blocks_for
from kvspec.errors import KvspecError
from kvspec.integrations.vllm.by_design import Rule, applicable
from kvspec.integrations.vllm.frozen import (
    GroupFacts,
    PlanFacts,
    fitted,
    read_facts,
    stage_tensors,
)
from kvspec.integrations.vllm.pooling import SERVE_SEPARATE, refusal
from kvspec.integrations.vllm.specs import engine_settings, same_value, spec_differences, to_vllm
from kvspec.model.engine import Engine
from kvspec.model.specs import LayerSpec, MambaState

#: Modes of ``KVSPEC_MODE``.
MODES = ("verify", "enforce", "allocate")
#: Engine settings a plan depends on, compared with the running engine's.
#: ``async_scheduling``: batches in flight, so the blocks a sliding window keeps per
#: request, and every step the simulator predicts (vLLM's CPU platform turns it off).
CHECKED_SETTINGS = ("block_size", "kv_cache_dtype", "enable_prefix_caching", "async_scheduling",
                    "disable_hybrid_kv_cache_manager", "tensor_parallel_size",
                    "pipeline_parallel_size", "decode_context_parallel_size",
                    "num_gpu_blocks_override", "max_num_batched_tokens",
                    "max_in_flight_tokens", "kv_cache_layout", "mamba_cache_mode",
                    "mamba_block_size", "prefix_match_unit", "num_prefill_lookahead_tokens")
#: Settings a hybrid's workers raise after loading the model (checked through the layers).
RAISED_BY_WORKERS = ("block_size", "mamba_block_size")
#: Spec fields that never change a plan: the engine may report them, kvspec may not.
PLAN_NEUTRAL_FIELDS = frozenset({"is_draft", "max_tp_shards"})
#: Group fields the builder's groups must match.
GROUP_FIELDS = ("spec_class", "block_size", "page_size_bytes", "page_size_padded",
                "sliding_window", "attention_chunk_size")
#: Rules under which upstream vLLM cannot hold the artifact's placement at all.
UNSERVABLE = frozenset({"state-slot-layout", "kpool-tail", "drafter-pool",
                        "encoder-only-layers"})


class EngineDrift(RuntimeError):
    """The running engine does not match the artifact; the message says where."""


class PluginError(KvspecError):
    """The plugin cannot start: a bad KVSPEC_* setting or an artifact it refuses."""


@dataclass(frozen=True)
class Drift:
    """One value the engine and the artifact disagree on."""

    where: str
    field: str
    engine: Any
    artifact: Any

    def line(self) -> str:
        return f"{self.where}: {self.field}: engine {self.engine!r}, artifact {self.artifact!r}"


class Expectation:
    """An artifact's promises to a vLLM engine (see the module docstring)."""

    def __init__(self, artifact: Artifact, path: str, mode: str) -> None:
        if mode not in MODES:
            raise PluginError(f"KVSPEC_MODE={mode!r} is not a mode",
                              expected=" or ".join(MODES), found=mode,
                              hint="verify: vLLM plans and must match the artifact; "
                              "enforce: vLLM serves the artifact's placement; allocate: as "
                              "verify, and kvspec.load allocates the KV cache (docs/vllm.md)")
        pools = refusal(artifact)
        if pools is not None:
            raise PluginError(f"KVSPEC_LAYOUT={path}: vLLM cannot serve this artifact in "
                              f"any KVSPEC_MODE: {pools[0]}", path=pools[1],
                              hint=SERVE_SEPARATE)
        self.path, self.mode = path, mode
        self.fingerprint = artifact.fingerprint
        self.body: fmt.Layout = artifact.body
        body = self.body
        try:
            facts = read_facts(body)
        except ValueError as exc:
            raise PluginError(f"KVSPEC_LAYOUT={path}: the artifact is refused: {exc}",
                              hint="recompile it with `kvspec compile`") from None
        self._facts = facts
        #: The engine the plan was made for (``max_model_len`` before any fitting).
        self.engine: Engine = facts.engine
        self.groups: tuple[GroupFacts, ...] = facts.groups
        self.layer_specs: Mapping[str, LayerSpec] = facts.specs
        described: dict[int, dict[str, Any]] = {}
        for n, e in body.layers.items():
            if e.spec not in described:
                spec = facts.specs[n]
                described[e.spec] = {**to_vllm(spec), "page_size_bytes": spec.page_size_bytes}
        self.layers = {n: dict(described[e.spec]) for n, e in body.layers.items()}
        self.group_of = {n: i for i, g in enumerate(self.groups) for n in g.layer_names}
        self.rules: tuple[Rule, ...] = applicable(facts)

    @classmethod
    def read(cls, path: str | Path, mode: str = "verify") -> Expectation:
        try:
            artifact = Artifact.read(path)
        except KvspecError as err:
            # the reader's position (file:line:column of a truncated or edited artifact)
            # goes with the refusal: the engine's log is the only place the user sees it
            where = err.location
            raise PluginError(f"KVSPEC_LAYOUT={path}: the artifact is refused: {err.message}",
                              file=where.file or str(path), line=where.line,
                              column=where.column, path=where.path,
                              expected=err.expected, found=err.found,
                              hint=err.hint or "recompile it with `kvspec compile`") from None
        return cls(artifact, str(path), mode)

    def facts(self) -> PlanFacts:
        """The plan as the by-design rules read it, from the frozen body."""
        return self._facts

    # -- reporting ---------------------------------------------------------------
    def fail(self, what: str, drifts: Iterable[Drift], hint: str | None = None) -> None:
        drifts = list(drifts)
        if not drifts:
            return
        lines = [(f"kvspec: {what} does not match the layout artifact {self.path} "
                  f"({self.fingerprint}, KVSPEC_MODE={self.mode}):")]
        lines += ["  " + d.line() for d in drifts[:12]]
        if len(drifts) > 12:
            lines.append(f"  ... and {len(drifts) - 12} more")
        lines.append("  hint: " + (hint or "serve with the flags `kvspec engine-args` prints "
                                   "for this artifact, or re-run `kvspec init --from-vllm` "
                                   "and review the change"))
        raise EngineDrift("\n".join(lines))

    def unservable(self) -> tuple[Rule, ...]:
        """The by-design rules that make the artifact's placement impossible upstream."""
        return tuple(r for r in self.rules if r.id in UNSERVABLE)

    def check_servable(self) -> None:
        rules = self.unservable()
        if rules:
            names = "; ".join(f"{r.id} ({r.title}: vLLM {r.upstream})" for r in rules)
            raise EngineDrift(f"kvspec: the layout artifact {self.path} ({self.fingerprint}) "
                              f"uses what upstream vLLM cannot serve, by design: {names}. "
                              "See docs/vllm.md, by-design differences.")

    # -- engine settings and layers ---------------------------------------------
    def settings(self) -> dict[str, Any]:
        """The engine settings the artifact was planned for (vLLM's names)."""
        planned = self.engine
        out = engine_settings(planned)
        out["max_in_flight_tokens"] = self.body.engine.max_in_flight_tokens
        if out["mamba_block_size"] is None and out["mamba_cache_mode"] != "none":
            out["mamba_block_size"] = planned.block_size
        return out

    def check_engine(self, engine: Mapping[str, Any]) -> None:
        want = self.settings()
        # A hybrid's block sizes are raised by each worker after it loads the model
        # (Platform.update_block_size_for_backend); the engine core's copy of the
        # config may not have them yet. Its layers' specs carry them and are checked.
        skip = RAISED_BY_WORKERS if self._hybrid() else ()
        drifts = [Drift("engine", k, engine.get(k), want[k]) for k in CHECKED_SETTINGS
                  if k in engine and k not in skip
                  and not _same_setting(k, engine.get(k), want[k])]
        mml = engine.get("max_model_len")
        planned = self.engine
        if mml is not None and mml != planned.max_model_len:
            drifts.append(Drift("engine", "max_model_len", mml, planned.max_model_len))
        auto = engine.get("original_max_model_len") == -1
        if auto != planned.auto_max_model_len:
            drifts.append(Drift("engine", "max_model_len auto-fit", auto,
                                planned.auto_max_model_len))
        self.fail("the engine's configuration", drifts)

    def _hybrid(self) -> bool:
        return any(isinstance(s, MambaState) for s in self.layer_specs.values())

    def check_layers(self, layers: Mapping[str, dict[str, Any]],
                     defaults: dict[str, dict[str, Any]] | None = None) -> None:
        """The engine's per-layer specs (all layers, or one stage's) against the artifact's."""
        drifts = self._layer_set(set(layers))
        for name, got in layers.items():
            want = self.layers.get(name)
            if want is None:
                continue
            for field, a, b in spec_differences(want, got, defaults):
                if field in PLAN_NEUTRAL_FIELDS or self._padded_as_planned(name, field, b):
                    continue
                drifts.append(Drift(f"layer {name}", field, b, a))
        self.fail("the model's KV-cache layers", drifts)

    def _layer_set(self, names: set[str]) -> list[Drift]:
        stages = [set(st.layers) for st in self.body.stages]
        if names == set(self.layers) or names in stages:
            return []
        extra = sorted(names - set(self.layers))
        missing = sorted(set(self.layers) - names) if len(names) > max(map(len, stages)) \
            else sorted(min(stages, key=lambda s: len(s ^ names)) - names)
        out = [Drift(f"layer {n}", "present", True, False) for n in extra[:6]]
        return out + [Drift(f"layer {n}", "present", False, True) for n in missing[:6]]

    def _padded_as_planned(self, name: str, field: str, engine_value: Any) -> bool:
        """The engine pads state pages before planning (vLLM's mamba_page_size_padded);
        that is fine when it pads to the page the artifact's group has."""
        if field not in ("page_size_padded", "page_size_bytes") or name not in self.group_of:
            return False
        group = self.groups[self.group_of[name]]
        return engine_value == group.layer_spec(name).page_size_bytes

    # -- planning results -----------------------------------------------------------
    def stage_of(self, names: Iterable[str]) -> int | None:
        names = set(names)
        for st in self.body.stages:
            if names == set(st.layers):
                return st.index
        return None

    def expected_groups(self, names: Iterable[str]) -> list[dict[str, Any]]:
        """The artifact's groups restricted to ``names`` (empty ones dropped), in the
        reference's field names (``kvspec plan --json``'s groups)."""
        names = set(names)
        out = []
        for g, group in zip(self.body.groups, self.groups):
            layers = [n for n in g.layers if n in names]
            if not layers:
                continue
            spec = group.spec
            out.append({
                "layer_names": layers, "kind": g.kind, "spec_class": g.class_,
                "block_size": g.block_size, "page_size_bytes": g.page_size_bytes,
                "page_size_padded": g.page_size_padded,
                "sliding_window": getattr(spec, "sliding_window", None),
                "attention_chunk_size": getattr(spec, "attention_chunk_size", None),
                "is_eagle_group": g.is_eagle, "padding_slots": g.padding_slots,
                "max_memory_usage_bytes": g.max_memory_usage_bytes,
                "max_num_blocks_per_req": g.max_num_blocks_per_req, "spec": to_vllm(spec)})
        return out

    def check_groups(self, got: list[dict[str, Any]], names: Iterable[str]) -> None:
        want = self.expected_groups(names)
        drifts = []
        if [g["layer_names"] for g in got] != [g["layer_names"] for g in want]:
            drifts.append(Drift("groups", "layer_names", [_brief(g) for g in got],
                                [_brief(g) for g in want]))
        for i, (a, b) in enumerate(zip(got, want)):
            drifts += [Drift(f"group {i}", f, a.get(f), b.get(f)) for f in GROUP_FIELDS
                       if a.get(f) != b.get(f)]
        self.fail("vLLM's KV-cache groups", drifts)

    def tensors(self, names: Iterable[str], num_blocks: int) -> list[dict[str, Any]]:
        """The artifact's tensors of the stage holding exactly ``names``."""
        names = list(names)
        stage = self.stage_of(names)
        if stage is None:
            raise EngineDrift(f"kvspec: layers {sorted(names)[:3]}... are no stage of the "
                              f"layout artifact {self.path}")
        return stage_tensors(self.body.stages[stage], num_blocks)

    def bytes_per_block(self, names: Iterable[str]) -> int | None:
        stage = self.stage_of(names)
        return None if stage is None else self.body.stages[stage].bytes_per_block

    def check_tensors(self, names: Iterable[str], num_blocks: int,
                      got: list[dict[str, Any]]) -> None:
        want = self.tensors(names, num_blocks)
        drifts = [Drift("tensors", "count", len(got), len(want))] if len(got) != len(want) \
            else []
        for i, (a, b) in enumerate(zip(got, want)):
            drifts += [Drift(f"tensor {i} at num_blocks={num_blocks}", f, a[f], b[f])
                       for f in b if a.get(f) != b[f]]
        self.fail("vLLM's KV-cache placement", drifts, self._why())

    def sized(self, memory: int) -> tuple[int, int]:
        """``(max_model_len, num_blocks)`` of the artifact for ``memory`` bytes per
        rank, as vLLM sizes it: ``max_model_len`` fitted first where the artifact
        says ``auto``, then every stage's block count (:mod:`kvspec.artifact.sizing`);
        a :class:`~kvspec.errors.PlanError` when one request does not fit."""
        body = self.body
        stages = [(st.bytes_per_block, st.fixed_bytes) for st in body.stages]
        need = max((st.min_num_blocks for st in body.stages), default=1)
        length = body.engine.max_model_len
        budget = body.budget.memory if body.budget is not None else None
        if self.engine.auto_max_model_len and memory != budget:
            length, need = fitted(self.engine, self.body, self.groups, memory)
        n = blocks_for(stages, need=need, override=body.engine.num_blocks,
                       max_model_len=length, memory=memory)
        return length, n

    def check_final(self, memory: int, workers: list[dict[str, Any]],
                    max_model_len: int) -> None:
        """vLLM's final per-worker configs against kvspec's plan for the engine's budget."""
        try:
            length, num_blocks = self.sized(memory)
        except KvspecError as err:
            raise EngineDrift(f"kvspec: the engine's KV-cache budget ({memory} bytes per "
                              f"rank) does not fit the layout artifact {self.path}: "
                              f"{err.message}") from None
        drifts = [Drift("engine", "max_model_len (after planning)", max_model_len, length)] \
            if max_model_len != length else []
        for i, w in enumerate(workers):
            stage = self.stage_of(n for g in w["groups"] for n in g)
            if stage is None:
                drifts.append(Drift(f"worker {i}", "layers", w["groups"], "a stage's layers"))
                continue
            if w["num_blocks"] != num_blocks:
                drifts.append(Drift(f"worker {i}", "num_blocks", w["num_blocks"], num_blocks))
            if w["kv_cache_tensors"] != stage_tensors(self.body.stages[stage], num_blocks):
                drifts.append(Drift(f"worker {i}", "kv_cache_tensors", "differ", "artifact's"))
        self.fail("vLLM's final KV-cache config", drifts, self._why())

    def check_block_sizes(self, scheduler: int, hashed: int) -> None:
        self.fail("vLLM's block sizes", [
            Drift("engine", f, a, b) for f, a, b in (
                ("scheduler_block_size", scheduler, self.body.scheduler_block_size),
                ("hash_block_size", hashed, self.body.hash_block_size)) if a != b],
            self._why())

    def _why(self) -> str | None:
        rules = [r for r in self.rules if r.fields]
        if not rules:
            return None
        return ("differs by design: " + "; ".join(f"{r.id} ({r.title})" for r in rules)
                + "; KVSPEC_MODE=enforce serves the artifact's placement (docs/vllm.md)")


def _same_setting(key: str, a: Any, b: Any) -> bool:
    if key == "kv_cache_layout" and a is None:
        return True  # not sized yet when a worker asks
    return same_value(key, a, b)


def _brief(group: dict[str, Any]) -> str:
    names = group["layer_names"]
    return f"{len(names)} x {names[0] if names else '-'}"

