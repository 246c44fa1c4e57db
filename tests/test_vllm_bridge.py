"""The vLLM bridge without vLLM: spec conversion, comparison, the by-design table,
the plugin's checks, engine-args, and clean refusals when vLLM is missing.

The same code runs against the real vLLM in tests/vllm/ (tests/vllm/run.sh)."""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import json
import re
from pathlib import Path

import pytest

from kvspec.compiled import CompiledArtifact as Artifact
from kvspec.compiled import read as read_artifact
from kvspec.compiler import compile_source
from kvspec.integrations.dump.importer import dump_to_yaml
from kvspec.integrations.dump.read import read_dump
from kvspec.integrations.vllm import by_design, specs
from kvspec.integrations.vllm.compare import compare
from kvspec.integrations.vllm.guard import EngineDrift, Expectation, PluginError
from kvspec.integrations.vllm.verify import kvspec_inputs, kvspec_view, verify_plan
from kvspec.model import kinds
from kvspec.model.specs import FullAttention, MambaState
from kvspec.planner import plan_layers
from tests.conformance.harness import case_names, load, plan_case
from tests.conftest import ROOT, invoke

HAS_VLLM = importlib.util.find_spec("vllm") is not None
LLAMA = "layouts/llama-3.1-8b.kvlayout.json"

#: The by-design rules each conformance case needs (the others need none).
EXPECTED_RULES = {
    "syn-glm5-next": {"state-slot-layout", "kpool-tail", "drafter-pool"},
    "syn-mamba-all": {"mamba-cache-all"},
    "syn-stride-alignment": {"block-stride-alignment"},
}


def _artifact(name: str) -> Artifact:
    case, _ = load(name)
    return compile_source(dump_to_yaml(case), f"{name}.yaml")


# -- spec conversion ------------------------------------------------------------

def test_every_kind_converts_to_its_reference_class_with_vllm_field_names() -> None:
    for name in KIND_CASES:
        case, _ = load(name)
        plan, _ = plan_case(case)
        for spec in plan.specs.values():
            desc = specs.to_vllm(spec)
            assert desc["class"] == kinds.of(spec).ref_class
            assert "num_heads_" not in desc
            assert specs.kind_of_class(desc["class"]) is kinds.of(spec)


#: Conformance cases with layers of many kinds between them.
KIND_CASES = ("synthetic-mamba-hybrid", "synthetic-mla", "syn-glm5-next", "gemma-2-9b-tp1",
              "synthetic-chunked-local", "syn-hidden-state")


def test_state_layers_convert_like_vllm_mamba_specs() -> None:
    spec = MambaState(block_size=544, shapes=((3, 8192), (32, 128, 128)),
                      dtypes=("bfloat16", "float32"), mamba_type="gdn_attention",
                      mamba_cache_mode="align")
    desc = specs.to_vllm(spec)
    assert desc["mamba_type"] == "GDN_ATTN" and desc["num_heads"] == 1
    assert desc["tokens_per_state"] == -1 and desc["shapes"] == [[3, 8192], [32, 128, 128]]


def test_spec_differences_name_each_field() -> None:
    f = FullAttention(block_size=16, num_kv_heads=8, head_size=128, dtype="float8_e4m3fn",
                      kv_quant_mode=1)
    want = specs.to_vllm(f)
    got = {**want, "dtype": "uint8", "is_draft": True, "topk_buffer_width": None}
    assert specs.spec_differences(want, got) == []  # fp8 kept as uint8, draft flag ignored
    got = {**got, "num_kv_heads": 4}
    assert specs.spec_differences(want, got) == [("num_kv_heads", 8, 4)]
    assert specs.spec_differences(want, {**want, "class": "SlidingWindowSpec"}) == [
        ("class", "FullAttentionSpec", "SlidingWindowSpec")]


def test_engine_settings_use_vllm_config_names() -> None:
    art = read_artifact(LLAMA)
    s = specs.engine_settings(art.layout.plan.engine)
    assert s["block_size"] == 16 and s["kv_cache_layout"] == "LBNHC"
    assert s["disable_hybrid_kv_cache_manager"] is False and s["async_scheduling"] is True


# -- the by-design table ----------------------------------------------------------

def test_rules_are_one_table_with_unique_ids_shown_in_the_docs() -> None:
    ids = [r.id for r in by_design.RULES]
    assert len(ids) == len(set(ids))
    page = (ROOT / "docs" / "vllm.md").read_text()
    assert by_design.markdown_table() in page, "docs/vllm.md must show by_design.markdown_table()"


@pytest.mark.parametrize("name", case_names())
def test_rules_apply_to_the_cases_that_need_them(name: str) -> None:
    case, _ = load(name)
    plan = plan_layers(*read_dump(case))
    assert {r.id for r in by_design.applicable(plan)} == EXPECTED_RULES.get(name, set())


def test_field_patterns_match_indices_only_where_they_say_so() -> None:
    rule = by_design.by_id("block-stride-alignment")
    assert rule.explains("stage[0].tensor[3].block_stride") and rule.explains("num_blocks")
    assert not rule.explains("group[0].layer_names")
    assert by_design.by_id("mamba-cache-all").explains("group[12].max_num_blocks_per_req")


# -- comparing plans --------------------------------------------------------------

class FakeAdapter:
    """Plans as kvspec does, with ``edit`` applied: verify's logic without vLLM."""

    VERSION = "0.33.0"

    def __init__(self, plan, edit=None) -> None:
        self._plan, self._edit = plan, edit

    def plan(self, settings, stages, memory):
        view = copy.deepcopy(kvspec_view(self._plan, memory))
        view["input_specs"] = kvspec_inputs(self._plan)
        if self._edit:
            self._edit(view)
        return view

    def class_defaults(self):
        return {}


def test_verify_agrees_with_an_engine_that_plans_the_same() -> None:
    plan, _ = plan_case(load("gemma-2-9b-tp1")[0])
    verdict = verify_plan(plan, 16 * 2**30, adapter=FakeAdapter(plan))
    assert verdict.agrees and not verdict.rows


def test_verify_names_each_field_that_differs() -> None:
    plan, _ = plan_case(load("gemma-2-9b-tp1")[0])

    def edit(view):
        view["num_blocks"] += 1
        view["groups"][1]["page_size_bytes"] *= 2
        view["workers"][0]["kv_cache_tensors"][0]["block_stride"] = 7
        view["input_specs"]["model.layers.0.self_attn.attn"]["num_kv_heads"] = 3

    rows = verify_plan(plan, 16 * 2**30, adapter=FakeAdapter(plan, edit)).rows
    fields = {r.field for r in rows}
    assert {"num_blocks", "group[1].page_size_bytes", "stage[0].tensor[0].block_stride",
            "input[model.layers.0.self_attn.attn].num_kv_heads"} <= fields
    assert all(r.status == "differs" for r in rows)


def test_differences_a_rule_explains_are_marked_by_design() -> None:
    plan, _ = plan_case(load("syn-mamba-all")[0])

    def edit(view):
        view["max_concurrency"] += 0.5

    verdict = verify_plan(plan, 16 * 2**30, adapter=FakeAdapter(plan, edit))
    assert verdict.by_design_only and verdict.rules_used[0].id == "mamba-cache-all"
    rows = compare({"ok": True, "num_blocks": 1}, {"ok": True, "num_blocks": 2},
                   verdict.rules)
    assert rows[0].status == "differs"  # num_blocks is not what mode 'all' changes


def test_a_rule_upstream_refuses_by_explains_only_that_refusal() -> None:
    """prefix-match-unit is upstream refusing (ValueError): where upstream plans, a
    difference is not its to explain; a refusal of another type is not either."""
    plan = compile_source((SOURCES / "encoder-unit.yaml").read_text()
                          .replace("  enc: {kind: encoder_only}\n", "")
                          .replace("  - {pattern: [enc], repeat: 2}\n", ""), "u.yaml").layout.plan
    assert {r.id for r in by_design.applicable(plan)} == {"prefix-match-unit"}

    def more_blocks(view):
        view["num_blocks"] += 1

    rows = verify_plan(plan, 2**30, adapter=FakeAdapter(plan, more_blocks)).rows
    assert [(r.field, r.status) for r in rows] == [("num_blocks", "differs")]

    def refuse(kind, message):
        def edit(view):
            view.clear()
            view.update(ok=False, error={"type": kind, "message": message})
        return edit

    verdict = verify_plan(plan, 2**30, adapter=FakeAdapter(
        plan, refuse("ValueError", "Invalid prefix_match_unit=8; with a single group ...")))
    assert verdict.by_design_only and verdict.rules_used[0].id == "prefix-match-unit"
    for kind, message in (("ZeroDivisionError", "division by zero"),
                          ("ValueError", "KV cache layout BHLNC cannot express ...")):
        rows = verify_plan(plan, 2**30, adapter=FakeAdapter(plan, refuse(kind, message))).rows
        assert [(r.field, r.status) for r in rows] == [("outcome", "differs")]


def test_a_difference_is_credited_to_the_rule_that_names_its_field() -> None:
    """A rule that explains every field (encoder-only-layers) credits only what no
    rule naming the field explains; a refusal rule credits no planned field."""
    rules = tuple(by_design.by_id(i) for i in ("prefix-match-unit", "encoder-only-layers",
                                                 "pp-packed-group"))
    assert by_design.explaining("stage[1].tensor[0].layers", rules).id == "pp-packed-group"
    assert by_design.explaining("num_groups", rules).id == "encoder-only-layers"
    refusal = "ValueError: Invalid prefix_match_unit=8; ..."
    assert by_design.explaining("outcome", rules, refusal).id == "prefix-match-unit"
    assert by_design.explaining("outcome", rules, "TypeError: x").id == "encoder-only-layers"
    assert by_design.explaining("num_groups", rules[:1]) is None


def test_one_side_refusing_is_an_outcome_difference() -> None:
    rows = compare({"ok": True}, {"ok": False, "error": {"type": "ValueError",
                                                           "message": "too small"}})
    assert rows[0].field == "outcome" and "too small" in rows[0].vllm


# -- the plugin's checks -------------------------------------------------------------

def _engine_layers(art: Artifact) -> dict[str, dict]:
    return {n: {**specs.to_vllm(e.spec), "page_size_bytes": e.spec.page_size_bytes}
            for n, e in art.layout.layers.items()}


def test_the_engine_of_the_artifact_passes_every_check() -> None:
    art = read_artifact(LLAMA)
    exp = Expectation(art, LLAMA, "verify")
    exp.check_engine(exp.settings())
    exp.check_layers(_engine_layers(art))
    names = list(art.layout.layers)
    exp.check_tensors(names, 100, exp.tensors(names, 100))
    exp.check_block_sizes(art.layout.scheduler_block_size, art.layout.hash_block_size)


def test_drift_names_the_layer_the_field_and_both_values() -> None:
    art = read_artifact(LLAMA)
    exp = Expectation(art, LLAMA, "verify")
    layers = _engine_layers(art)
    layers["model.layers.7.self_attn.attn"]["num_kv_heads"] = 4
    with pytest.raises(EngineDrift) as err:
        exp.check_layers(layers)
    assert "layer model.layers.7.self_attn.attn: num_kv_heads: engine 4, artifact 8" in str(
        err.value
    )
    with pytest.raises(EngineDrift, match="engine: block_size: engine 32, artifact 16"):
        exp.check_engine({**exp.settings(), "block_size": 32})
    del layers["model.layers.0.self_attn.attn"]
    with pytest.raises(EngineDrift, match=re.escape("model.layers.0.self_attn.attn: present")):
        exp.check_layers(layers)


def test_a_tampered_artifact_or_a_bad_mode_is_refused(tmp_path: Path) -> None:
    data = json.loads(Path(LLAMA).read_text())
    data["body"]["stages"][0]["bytes_per_block"] += 1
    bad = tmp_path / "bad.kvlayout.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(PluginError, match="the artifact is refused"):
        Expectation.read(bad)
    with pytest.raises(PluginError, match="KVSPEC_MODE"):
        Expectation.read(LLAMA, "strict")


def test_a_truncated_artifact_is_refused_at_its_position(tmp_path: Path) -> None:
    # the engine's log is where the user reads the refusal: it names file:line:column,
    # as `kvspec explain` does for the same file (it said only "not valid JSON")
    text = Path(LLAMA).read_text()
    cut = tmp_path / "cut.kvlayout.json"
    cut.write_text(text[: len(text) // 2])
    with pytest.raises(PluginError) as err:
        Expectation.read(cut)
    line = text[: len(text) // 2].count("\n") + 1
    rendered = err.value.render()
    assert rendered.startswith(f"{cut}:{line}:"), rendered
    assert "KVSPEC_LAYOUT=" in rendered and "not valid JSON" in rendered


def test_layouts_upstream_cannot_hold_are_refused_in_enforce_mode() -> None:
    exp = Expectation(_artifact("syn-glm5-next"), "glm5", "enforce")
    with pytest.raises(EngineDrift, match="state-slot-layout"):
        exp.check_servable()
    Expectation(_artifact("syn-stride-alignment"), "s", "enforce").check_servable()
    encoder = compile_source(ENCODER_ONLY, "enc.yaml")
    with pytest.raises(EngineDrift, match="encoder-only-layers"):
        Expectation(encoder, "enc", "enforce").check_servable()


#: Sources of tests/data/vllm (tests/data/vllm/README.md).
SOURCES = ROOT / "tests" / "data" / "vllm"
ENCODER_ONLY = (SOURCES / "encoder-only.yaml").read_text()


#: A hybrid over two pipeline stages in a block-outer layout: the Mamba layers are packed
#: into groups, and each stage holds none of some group's layers.
PACKED_PP = (SOURCES / "packed-pp.yaml").read_text()


@pytest.mark.parametrize("source,rules", [
    (ENCODER_ONLY, {"encoder-only-layers"}),
    (ENCODER_ONLY.replace("engine: {", "engine: {async_scheduling: true, ")
     .replace("defaults:", "parallel: {pipeline: 2}\ndefaults:"), {"encoder-only-layers",
                                                                  "async-pipeline"}),
    ((SOURCES / "ring-unit.yaml").read_text(), {"engine-block-size", "prefix-match-unit"}),
    (PACKED_PP.replace("BLNHC", "LBNHC"), set()),  # layer-outer: no packed group
    (PACKED_PP, {"pp-packed-group"}),
])
def test_rules_apply_to_the_plans_they_describe(source: str, rules: set[str]) -> None:
    plan = compile_source(source, "r.yaml").layout.plan
    assert {r.id for r in by_design.applicable(plan)} == rules


def test_final_configs_are_checked_against_kvspec_for_the_engine_budget() -> None:
    art = read_artifact(LLAMA)
    exp = Expectation(art, LLAMA, "verify")
    memory = 20 * 2**30
    n = art.num_blocks_for(memory=memory)
    names = list(art.layout.layers)
    worker = {"num_blocks": n, "kv_cache_tensors": exp.tensors(names, n), "groups": [names]}
    exp.check_final(memory, [worker], art.layout.engine.max_model_len)
    with pytest.raises(EngineDrift, match="num_blocks"):
        exp.check_final(memory, [{**worker, "num_blocks": n - 1}],
                        art.layout.engine.max_model_len)


def test_register_does_nothing_without_kvspec_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvspec.integrations.vllm import plugin

    monkeypatch.delenv("KVSPEC_LAYOUT", raising=False)
    assert plugin.register() is None


# -- engine-args ---------------------------------------------------------------------

def test_engine_args_prints_the_flags_of_the_plan() -> None:
    code, out, _ = invoke(["engine-args", LLAMA, "--engine", "vllm"])
    assert code == 0
    assert out.splitlines()[1].startswith(f"KVSPEC_LAYOUT={LLAMA} KVSPEC_MODE=verify")
    for flag in ("--block-size 16", "--max-model-len 131072", "--kv-cache-dtype auto",
                 "--tensor-parallel-size 1", "--enable-prefix-caching",
                 "--enable-hybrid-kv-cache-manager", "--kv-cache-memory-bytes"):
        assert flag in out


def test_engine_args_for_hybrids_blocks_and_json() -> None:
    _, out, _ = invoke(["engine-args", "layouts/nemotron-h-56b-base-8k.kvlayout.json",
                           "--engine", "vllm", "--pin-blocks", "--format", "json"])
    data = json.loads(out)
    flags = {f["flag"]: f["value"] for f in data["flags"]}
    art = read_artifact("layouts/nemotron-h-56b-base-8k.kvlayout.json")
    assert flags["--num-gpu-blocks-override"] == str(art.layout.budget.num_blocks)
    assert flags["--mamba-ssm-cache-dtype"] == "float32"
    assert any("mamba_cache_mode" in n["setting"] for n in data["no_flag"])
    assert data["argv"][:2] == ["vllm", "serve"]


def test_engine_args_says_what_has_no_flag_upstream() -> None:
    code, out, _ = invoke(["engine-args", "layouts/example-glm5-next-drafter.kvlayout.json",
                           "--engine", "vllm", "--mode", "enforce"])
    assert code == 0 and "KVSPEC_MODE=enforce" in out
    assert re.search(r"# no flag: by design: drafter-pool", out)


def test_engine_args_refuses_a_source() -> None:
    code, _, err = invoke(["engine-args", "layouts/llama-3.1-8b.yaml", "--engine", "vllm"])
    assert code == 1 and "error" in err


# -- without vLLM -----------------------------------------------------------------------

@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed")
@pytest.mark.parametrize("args", [
    ["verify", LLAMA, "--against", "vllm"],
    ["init", "--from-vllm", "tests/data/hf/llama-3.1-8b.json"],
])
def test_commands_needing_vllm_exit_2_naming_the_extra(args: list[str]) -> None:
    code, out, err = invoke(args)
    assert code == 2 and out == ""
    assert "pip install 'kvspec[vllm]'" in err


def test_progress_is_quiet_when_stderr_is_not_a_terminal() -> None:
    import io

    from kvspec.integrations.vllm.init import Progress

    stream = io.StringIO()
    Progress(stream)("building")
    assert stream.getvalue() == ""


def test_dump_layers_keep_only_what_expansion_does_not_derive() -> None:
    from kvspec.integrations.vllm.init import dump_layer

    engine = {"block_size": 544, "mamba_cache_mode": "align", "mamba_block_size": 544,
              "max_model_len": 32768, "kv_cache_dtype": "auto"}
    state = specs.to_vllm(MambaState(block_size=544, shapes=((3, 4096), (16, 128, 128)),
                                     dtypes=("bfloat16", "bfloat16"), page_size_padded=557056,
                                     mamba_type="gdn_attention", mamba_cache_mode="align"))
    layer = dump_layer("model.layers.0.linear_attn", state, engine, "bfloat16")
    assert layer == {"name": "model.layers.0.linear_attn", "kind": "mamba",
                     "page_size_padded": 557056, "shapes": [[3, 4096], [16, 128, 128]],
                     "dtypes": ["bfloat16", "bfloat16"], "mamba_type": "gdn_attention"}
    fp8 = dataclasses.replace(FullAttention(block_size=544, num_kv_heads=1, head_size=256,
                                            dtype="uint8"), kv_quant_mode=1)
    layer = dump_layer("model.layers.3.self_attn.attn", specs.to_vllm(fp8),
                       {**engine, "kv_cache_dtype": "fp8"}, "bfloat16")
    assert layer["cache_dtype_str"] == "fp8" and layer["dtype"] == "bfloat16"


def test_verify_notes_what_vllm_would_change_before_planning() -> None:
    layout = read_artifact("layouts/qwen3-next-80b-a3b-thinking.kvlayout.json").layout
    if layout.plan.engine.mamba_cache_mode == "align":
        pytest.skip("the layout already has what vLLM sets")
    verdict = verify_plan(layout.plan, 40 * 2**30, adapter=FakeAdapter(layout.plan))
    assert verdict.agrees and "mamba_cache_mode is none" in verdict.notes[0]


def test_engine_args_lists_layers_kept_unquantized() -> None:
    data = json.loads(invoke(["engine-args", "layouts/example-mixed-precision.kvlayout.json",
                              "--engine", "vllm", "--format", "json"])[1])
    argv = data["argv"]
    i = argv.index("--kv-cache-dtype-skip-layers")
    assert argv[i + 1:i + 7] == ["3", "7", "11", "15", "19", "23"]
