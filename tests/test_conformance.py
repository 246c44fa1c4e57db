"""Every case in tests/conformance matches the reference planner's expected file.

Each case is planned twice: straight from its per-layer dump, and through the
YAML source ``kvspec import`` makes of it (dump -> source -> compile), so the
source format and its expansion are held to the same standard. Each compiled
artifact also passes the invariant checker.
"""

from __future__ import annotations

import pytest

from kvspec.compiler import Planned, SourceText, compile_source, run_until
from kvspec.errors import KvspecError
from kvspec.integrations.dump.importer import dump_to_yaml
from kvspec.planner import size_plan
from tests.conformance.harness import case_names, compare
from tests.conformance.harness import load as load_case
from tests.invariants import check_artifact

CASES = case_names()


def test_cases_are_present() -> None:
    assert len(CASES) >= 24, "the conformance cases beside the repository are missing"


@pytest.mark.parametrize("name", CASES)
def test_dump_plan_matches_reference(name: str) -> None:
    case, expected = load_case(name)
    assert compare(case, expected) == []


def _plan_via_source(case):
    text = dump_to_yaml(case)
    planned = run_until(SourceText(text=text, file=case["name"] + ".yaml"), Planned)
    return planned.plan, size_plan(planned.plan,
                                   memory=case["config"]["available_memory_bytes"])


@pytest.mark.parametrize("name", CASES)
def test_imported_source_plan_matches_reference(name: str) -> None:
    case, expected = load_case(name)
    assert compare(case, expected, planner=_plan_via_source) == []


@pytest.mark.parametrize("name", CASES)
def test_compiled_artifact_satisfies_invariants(name: str) -> None:
    case, expected = load_case(name)
    text = dump_to_yaml(case)
    if not expected["ok"]:
        with pytest.raises(KvspecError) as info:
            compile_source(text, name + ".yaml")
        assert info.value.line is not None, "a rejection must carry a position"
        return
    assert check_artifact(compile_source(text, name + ".yaml")) == []
