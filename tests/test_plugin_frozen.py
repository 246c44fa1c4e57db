"""The vLLM plugin reads the frozen artifact (issue 37 item 2, issue 38 "Measured").

:class:`kvspec.integrations.vllm.guard.Expectation` is built from the artifact
as ``kvspec.load`` reads it, with no re-planning. Everything it expects of an
engine must still be what the plan says: here every committed artifact and
every conformance case is read both ways (the frozen body; the plan the
compiler re-makes) and each figure the plugin checks is compared. What the
plugin imports is tests/test_plugin_imports.py's.
"""

from __future__ import annotations

import pytest

from kvspec.artifact import Artifact
from kvspec.compiled import CompiledArtifact
from kvspec.compiled import read as read_compiled
from kvspec.compiler import compile_source
from kvspec.errors import KvspecError
from kvspec.integrations.dump.importer import dump_to_yaml
from kvspec.integrations.vllm import by_design, specs
from kvspec.integrations.vllm.guard import EngineDrift, Expectation, PluginError
from kvspec.planner import size_plan
from kvspec.reports.refview import group_view
from tests.conformance.harness import case_names, load
from tests.conftest import ROOT

LLAMA = ROOT / "layouts" / "llama-3.1-8b.kvlayout.json"
COMMITTED = sorted(p for d in ("layouts", "tests/golden") for p in (ROOT / d).glob(
    "*.kvlayout.json"))


def _plan_view(art: CompiledArtifact) -> dict:
    """What the plugin checked before it read the frozen body: the re-made plan's."""
    layout = art.layout
    layers = {n: {**specs.to_vllm(e.spec), "page_size_bytes": e.spec.page_size_bytes}
              for n, e in layout.layers.items()}
    groups = []
    for g in layout.groups:
        view = group_view(g, layout.engine)
        view["spec"] = specs.to_vllm(g.spec)
        groups.append(view)
    return {"layers": layers, "groups": groups,
            "rules": sorted(r.id for r in by_design.applicable(layout.plan)),
            "group_of": layout.plan.group_of()}


def _frozen_view(exp: Expectation) -> dict:
    names = list(exp.layers)
    return {"layers": exp.layers, "groups": exp.expected_groups(names),
            "rules": sorted(r.id for r in exp.rules), "group_of": exp.group_of}


def _compare(art: CompiledArtifact, where: str) -> None:
    try:
        exp = Expectation(Artifact(art.envelope), where, "verify")
    except PluginError:
        assert art.body.pooling is not None and art.body.pooling.policy == "separate"
        return
    old = _plan_view(art)
    new = _frozen_view(exp)
    for key in old:
        if key == "groups":  # the stage's groups: the layers-free ones are dropped
            assert new[key] == [g for g in old[key] if g["layer_names"]], where
        else:
            assert new[key] == old[key], (where, key)
    plan = art.layout.plan
    engine = art.layout.engine
    assert exp.settings()["max_in_flight_tokens"] == engine.max_in_flight_tokens
    for st in plan.stages:
        for n in (st.index + 1, 1000):
            assert exp.tensors(st.layer_names, n) == [t.at(n) for t in st.tensors], where
        assert exp.bytes_per_block(st.layer_names) == st.bytes_per_block
    budgets = [m for m in (art.body.budget.memory if art.body.budget else None,) if m]
    budgets += [b * max(st.bytes_per_block, 1) for st in plan.stages[:1]
                for b in (17, 1000, 123457)]
    for memory in budgets:
        try:
            sizing = size_plan(plan, memory=memory)
        except KvspecError:
            with pytest.raises(KvspecError):
                exp.sized(memory)
            continue
        assert exp.sized(memory) == (sizing.engine.max_model_len, sizing.num_blocks), (
            where, memory)
        workers = [{"num_blocks": r.num_blocks, "kv_cache_tensors": list(r.tensors),
                    "groups": [list(g.layer_names) for g in st.groups]}
                   for st, r in zip(plan.stages, sizing.stages)]
        exp.check_final(memory, workers, sizing.engine.max_model_len)


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.name)
def test_the_plugin_expects_of_a_committed_artifact_what_its_plan_says(path) -> None:
    _compare(read_compiled(path), path.name)


@pytest.mark.parametrize("name", case_names())
def test_the_plugin_expects_of_each_conformance_case_what_its_plan_says(name: str) -> None:
    case, _ = load(name)
    try:
        art = compile_source(dump_to_yaml(case), f"{name}.yaml")
    except KvspecError:
        pytest.skip("the case is a refusal: no artifact")
    _compare(art, name)


def test_an_auto_max_model_len_is_fitted_to_the_engine_budget_as_the_planner_fits_it() -> None:
    text = (ROOT / "layouts" / "llama-3.1-8b.yaml").read_text()
    assert "max_model_len: 131072" in text
    auto = text.replace("max_model_len: 131072", "max_model_len: auto\n  model_max_len: 131072")
    art = compile_source(auto, "a.yaml")
    exp = Expectation(art, "a", "verify")
    per_block = art.body.stages[0].bytes_per_block
    for blocks in (40, 300, 1025, 9000, 20000):
        sizing = size_plan(art.layout.plan, memory=blocks * per_block + 5)
        assert exp.sized(blocks * per_block + 5) == (sizing.engine.max_model_len,
                                                     sizing.num_blocks)
    with pytest.raises(KvspecError, match="not even one token"):
        exp.sized(per_block)


def test_a_budget_too_small_for_one_request_stops_the_engine() -> None:
    exp = Expectation.read(LLAMA)
    names = list(exp.layers)
    with pytest.raises(EngineDrift, match="does not fit the layout artifact"):
        exp.check_final(2**20, [{"num_blocks": 1, "kv_cache_tensors": [],
                                 "groups": [names]}], 131072)


def test_an_engine_that_schedules_otherwise_than_the_artifact_is_stopped() -> None:
    """vLLM's CPU platform turns async scheduling off; an artifact planned with it
    on predicts other steps (tests/serve/test_capacity.py) and, for sliding-window
    layers, other blocks per request."""
    exp = Expectation.read(LLAMA)
    assert exp.settings()["async_scheduling"] is True
    with pytest.raises(EngineDrift, match="engine: async_scheduling: engine False, "
                       "artifact True"):
        exp.check_engine({**exp.settings(), "async_scheduling": False})
