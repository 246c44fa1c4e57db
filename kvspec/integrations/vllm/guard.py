"""What the plugin checks a running vLLM engine against: an artifact's promises.

:class:`Expectation` is read from a verified artifact once per process. It
holds, as plain data, what the engine must report (engine settings, every
layer's spec) and what its KV-cache planning must come to (groups, tensors
per stage for any block count, the block sizes). The adapter's builder hands
it the engine's own values, also as plain data; any difference is *drift* and
stops the engine with :class:`EngineDrift`, naming the layer, the field and
both values. Nothing here imports vLLM, so the checks are tested without it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvspec.compiled import CompiledArtifact, read
from kvspec.errors import KvspecError
from kvspec.integrations.vllm.by_design import Rule, applicable
from kvspec.integrations.vllm.pooling import SERVE_SEPARATE, refusal
from kvspec.integrations.vllm.specs import engine_settings, same_value, spec_differences, to_vllm
from kvspec.model.plan import Layout
from kvspec.model.specs import MambaState
from kvspec.planner import size_plan
from kvspec.reports.refview import group_view

#: Modes of ``KVSPEC_MODE``.
MODES = ("verify", "enforce")
#: Engine settings a plan depends on, compared with the running engine's.
CHECKED_SETTINGS = ("block_size", "kv_cache_dtype", "enable_prefix_caching",
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

    def __init__(self, artifact: CompiledArtifact, path: str, mode: str) -> None:
        if mode not in MODES:
            raise PluginError(f"KVSPEC_MODE={mode!r} is not a mode",
                              expected=" or ".join(MODES), found=mode,
                              hint="verify: vLLM plans and must match the artifact; "
                              "enforce: vLLM serves the artifact's placement (docs/vllm.md)")
        pools = refusal(artifact)
        if pools is not None:
            raise PluginError(f"KVSPEC_LAYOUT={path}: vLLM cannot serve this artifact in "
                              f"any KVSPEC_MODE: {pools[0]}", path=pools[1],
                              hint=SERVE_SEPARATE)
        self.path, self.mode = path, mode
        self.fingerprint = artifact.fingerprint
        self.layout: Layout = artifact.layout
        plan = self.layout.plan
        self.rules: tuple[Rule, ...] = applicable(plan)
        self.layers = {n: {**to_vllm(e.spec), "page_size_bytes": e.spec.page_size_bytes}
                       for n, e in self.layout.layers.items()}
        self.group_of = plan.group_of()

    @classmethod
    def read(cls, path: str | Path, mode: str = "verify") -> Expectation:
        try:
            artifact = read(path)
        except KvspecError as err:
            raise PluginError(f"KVSPEC_LAYOUT={path}: the artifact is refused: {err.message}",
                              hint=err.hint or "recompile it with `kvspec compile`") from None
        return cls(artifact, str(path), mode)

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
        planned, final = self.layout.plan.engine, self.layout.engine
        out = engine_settings(planned)
        out["max_in_flight_tokens"] = final.max_in_flight_tokens
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
        planned = self.layout.plan.engine
        if mml is not None and mml != planned.max_model_len:
            drifts.append(Drift("engine", "max_model_len", mml, planned.max_model_len))
        auto = engine.get("original_max_model_len") == -1
        if auto != planned.auto_max_model_len:
            drifts.append(Drift("engine", "max_model_len auto-fit", auto,
                                planned.auto_max_model_len))
        self.fail("the engine's configuration", drifts)

    def _hybrid(self) -> bool:
        return any(isinstance(e.spec, MambaState) for e in self.layout.layers.values())

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
        stages = [set(st.layer_names) for st in self.layout.stages]
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
        group = self.layout.groups[self.group_of[name]]
        return engine_value == group.layer_spec(name).page_size_bytes

    # -- planning results -----------------------------------------------------------
    def stage_of(self, names: Iterable[str]) -> int | None:
        names = set(names)
        for st in self.layout.stages:
            if names == set(st.layer_names):
                return st.index
        return None

    def expected_groups(self, names: Iterable[str]) -> list[dict[str, Any]]:
        """The artifact's groups restricted to ``names`` (empty ones dropped)."""
        names = set(names)
        out = []
        for g in self.layout.groups:
            view = group_view(g, self.layout.engine)
            view["layer_names"] = [n for n in g.layer_names if n in names]
            view["spec"] = to_vllm(g.spec)
            if view["layer_names"]:
                out.append(view)
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
        stage = self.stage_of(names)
        if stage is None:
            raise EngineDrift(f"kvspec: layers {sorted(names)[:3]}... are no stage of the "
                              f"layout artifact {self.path}")
        return [t.at(num_blocks) for t in self.layout.stage(stage).tensors]

    def bytes_per_block(self, names: Iterable[str]) -> int | None:
        stage = self.stage_of(names)
        return None if stage is None else self.layout.stage(stage).bytes_per_block

    def check_tensors(self, names: Iterable[str], num_blocks: int,
                      got: list[dict[str, Any]]) -> None:
        want = self.tensors(names, num_blocks)
        drifts = [Drift("tensors", "count", len(got), len(want))] if len(got) != len(want) \
            else []
        for i, (a, b) in enumerate(zip(got, want)):
            drifts += [Drift(f"tensor {i} at num_blocks={num_blocks}", f, a[f], b[f])
                       for f in b if a.get(f) != b[f]]
        self.fail("vLLM's KV-cache placement", drifts, self._why())

    def check_final(self, memory: int, workers: list[dict[str, Any]],
                    max_model_len: int) -> None:
        """vLLM's final per-worker configs against kvspec's plan for the engine's budget."""
        try:
            sizing = size_plan(self.layout.plan, memory=memory)
        except KvspecError as err:
            raise EngineDrift(f"kvspec: the engine's KV-cache budget ({memory} bytes per "
                              f"rank) does not fit the layout artifact {self.path}: "
                              f"{err.message}") from None
        drifts = [Drift("engine", "max_model_len (after planning)", max_model_len,
                        sizing.engine.max_model_len)] \
            if max_model_len != sizing.engine.max_model_len else []
        for i, w in enumerate(workers):
            stage = self.stage_of(n for g in w["groups"] for n in g)
            if stage is None:
                drifts.append(Drift(f"worker {i}", "layers", w["groups"], "a stage's layers"))
                continue
            want = sizing.stages[stage]
            if w["num_blocks"] != want.num_blocks:
                drifts.append(Drift(f"worker {i}", "num_blocks", w["num_blocks"],
                                    want.num_blocks))
            if w["kv_cache_tensors"] != list(want.tensors):
                drifts.append(Drift(f"worker {i}", "kv_cache_tensors", "differ", "artifact's"))
        self.fail("vLLM's final KV-cache config", drifts, self._why())

    def check_block_sizes(self, scheduler: int, hashed: int) -> None:
        self.fail("vLLM's block sizes", [
            Drift("engine", f, a, b) for f, a, b in (
                ("scheduler_block_size", scheduler, self.layout.scheduler_block_size),
                ("hash_block_size", hashed, self.layout.hash_block_size)) if a != b],
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

