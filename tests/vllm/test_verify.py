"""``kvspec verify --against vllm`` on every conformance case, with the real vLLM."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import invoke
from tests.vllm.cases import BY_DESIGN, CASES, source

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm


def _verify(path: Path, *extra: str) -> tuple[int, dict]:
    code, out, err = invoke(["verify", str(path), "--against", "vllm", "--format", "json",
                             *extra])
    assert out, err
    return code, json.loads(out)


@pytest.mark.parametrize("name", CASES)
def test_every_case_agrees_or_differs_only_by_design(name: str, tmp_path: Path) -> None:
    path = tmp_path / f"{name}.yaml"
    path.write_text(source(name))
    code, result = _verify(path)
    rules = {d["rule"] for d in result["differences"]}
    if name in BY_DESIGN:
        assert code == 1 and result["by_design_only"], result["differences"][:5]
        assert rules <= BY_DESIGN[name] and rules
        assert _verify(path, "--allow-by-design")[0] == 0
    else:
        assert code == 0 and result["agrees"], result["differences"][:5]


def test_an_artifact_is_verified_as_its_source_is(tmp_path: Path) -> None:
    code, result = _verify(Path("layouts/llama-3.1-8b.kvlayout.json"))
    assert code == 0 and result["agrees"] and result["memory_origin"] == "the layout's budget"


def test_a_layout_without_a_budget_is_compared_at_one_it_can_serve(tmp_path: Path) -> None:
    path = tmp_path / "gemma.yaml"
    path.write_text(source("gemma-2-9b-tp1", budget=False))
    code, result = _verify(path)
    assert code == 0 and "twice" in result["memory_origin"]


def test_text_output_is_a_table_naming_the_rule(tmp_path: Path) -> None:
    path = tmp_path / "stride.yaml"
    path.write_text(source("syn-stride-alignment"))
    code, out, _ = invoke(["verify", str(path), "--against", "vllm"])
    assert code == 1
    assert "differs by design: block-stride-alignment" in out
    assert out.splitlines()[-1].startswith(f"differs from vLLM {_version()} by design only")


def _version() -> str:
    import vllm

    return vllm.__version__.split("+")[0]


_PLATFORM_CHOSEN_EARLY = """
import vllm.v1.core.kv_cache_planning  # chooses vLLM's platform: none, without a GPU
from kvspec.errors import KvspecError
from kvspec.integrations.vllm.verify import verify_path
from kvspec.integrations import vllm as bridge
try:
    verify_path("layouts/llama-3.1-8b.yaml", memory=None, adapter=bridge.adapter())
except KvspecError as err:
    print(err.message, "|", err.hint)
"""


def test_vllm_imported_before_the_cpu_platform_is_set_is_a_clear_error() -> None:
    """In a process that imported vLLM before ``VLLM_TARGET_DEVICE=cpu`` was set
    (and has no GPU), vLLM's platform is none: an in-process verify says so and
    how to fix it, where vLLM's config code would fail on an empty device string."""
    env = {k: v for k, v in os.environ.items() if k != "VLLM_TARGET_DEVICE"}
    out = subprocess.run([sys.executable, "-c", _PLATFORM_CHOSEN_EARLY], env=env,
                         capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == (
        "vLLM chose no platform in this process: it was imported and asked for one before "
        "VLLM_TARGET_DEVICE=cpu was set, and found no GPU | set VLLM_TARGET_DEVICE=cpu "
        "before anything imports vLLM (the kvspec command does it for you)"), out.stdout


def test_a_layout_that_does_not_load_cannot_be_verified(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("kvspec: 1\nname: x\n")
    code, out, err = invoke(["verify", str(bad), "--against", "vllm"])
    assert code == 2 and out == "" and "error" in err


# -- beyond the conformance cases --------------------------------------------------

#: Sources that once differed from vLLM where no rule said why (each minimised from
#: a differential-fuzzer finding; tests/data/vllm/README.md), and the rules their
#: differences now come from.
REGRESSIONS = {
    "split-stages": set(),
    "auto-fit": set(),
    "uneven-override": set(),
    "ring": {"engine-block-size"},
    "encoder-only": {"encoder-only-layers"},
    "packed-pp": {"pp-packed-group"},
    "async-pp": {"async-pipeline"},
    "lookahead": {"prefill-lookahead"},
    "swa-mla-hybrid-off": {"swa-mla-hybrid-off"},
    "sink-half": {"sink-tokens-per-state"},
    "encoder-unit": {"encoder-only-layers"},
    "packed-pp-unit": {"pp-packed-group"},
    "encoder-all": {"encoder-only-layers"},
}
SOURCES = Path(__file__).resolve().parents[1] / "data" / "vllm"


def _agrees_or_by_design(path: Path, rules: set[str]) -> None:
    code, result = _verify(path)
    differs = [d for d in result["differences"] if d["status"] != "by design"]
    assert not differs, differs[:5]
    assert {d["rule"] for d in result["differences"]} == rules
    assert code == (0 if not rules else 1)


@pytest.mark.parametrize("name", REGRESSIONS)
def test_sources_beyond_the_cases_agree_or_differ_by_design(name: str) -> None:
    _agrees_or_by_design(SOURCES / f"{name}.yaml", REGRESSIONS[name])


def test_an_attention_free_model_is_planned_as_the_engine_core_plans_it() -> None:
    """No layer left to plan (encoder-only layers only): the engine core gives such a
    model no memory and asks no capacity of it, so vLLM plans it, without groups."""
    code, result = _verify(SOURCES / "encoder-all.yaml")
    fields = {d["field"] for d in result["differences"]}
    assert "outcome" not in fields and "num_groups" in fields, result["differences"][:3]
    assert result["by_design_only"] and code == 1


def _generated(count: int, seed: int = 20261201) -> list[tuple[int, str]]:
    """The first ``count`` generated sources that compile (tests/fuzz/generators.py)."""
    import random

    from kvspec.compiler import compile_source
    from kvspec.errors import KvspecError
    from tests.fuzz.generators import valid_source

    rng, out, i = random.Random(seed), [], 0
    while len(out) < count:
        text, _ = valid_source(rng)
        i += 1
        try:
            compile_source(text, "g.yaml")
        except KvspecError:
            continue
        out.append((i, text))
    return out


@pytest.mark.parametrize("index,text", _generated(40), ids=lambda v: str(v)
                         if isinstance(v, int) else "")
def test_generated_sources_agree_or_differ_only_by_design(index: int, text: str,
                                                          tmp_path: Path) -> None:
    """A differential test over generated sources of every family (the oracle of
    ``benchmarks/fuzz.py --against-vllm``): each plan agrees with vLLM's, or differs
    only where a by-design rule says why."""
    from tests.fuzz.generators import check_against_vllm

    out = check_against_vllm(text, str(tmp_path))
    assert out.status == "ok", (out.details, text)
