"""``kvspec diff``: semantic diffs through the CLI, exit 0 identical / 1 differ /
2 error, and group matching."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvspec.cli import cli
from tests.conftest import CONFORMANCE, ROOT, invoke

LLAMA = "layouts/llama-3.1-8b.yaml"
LLAMA_ART = "layouts/llama-3.1-8b.kvlayout.json"


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """gemma-2 imported from its conformance dump: 21 sliding + 21 full layers."""
    from click.testing import CliRunner

    out = tmp_path_factory.mktemp("gemma") / "gemma-2.yaml"
    res = CliRunner().invoke(cli, ["import", str(CONFORMANCE / "cases" / "gemma-2-9b-tp1.json"),
                                   "-o", str(out)])
    assert res.exit_code == 0, res.output
    return out


def _variant(tmp_path: Path, source: Path | str, old: str, new: str, name: str) -> Path:
    text = (ROOT / source).read_text() if isinstance(source, str) else source.read_text()
    assert old in text
    out = tmp_path / name
    out.write_text(text.replace(old, new, 1))
    return out


def diff(runner, *args):
    return runner.invoke(cli, ["diff", *map(str, args)])


def test_identical_source_and_artifact(runner) -> None:
    res = diff(runner, LLAMA, LLAMA_ART)
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines() == [
        "a: layouts/llama-3.1-8b.yaml (source, llama-3.1-8b)",
        "b: layouts/llama-3.1-8b.kvlayout.json (artifact, llama-3.1-8b)",
        "",
        "capacity at 40.00 GiB per rank: unchanged, 327,680 KV tokens",
        "",
        "the plans are identical",
    ]


def test_same_plan_other_budget_is_identical(runner, tmp_path) -> None:
    """An artifact compiled for another budget is the same plan."""
    other = _variant(tmp_path, LLAMA, "memory: 40GiB", "memory: 80GiB", "llama-80.yaml")
    res = diff(runner, LLAMA, other)
    assert res.exit_code == 0
    assert res.stdout.splitlines()[-1] == "the plans are identical"


def test_quantized_kv_cache(runner, tmp_path) -> None:
    fp8 = _variant(tmp_path, LLAMA, "defaults:", "quantization: {kv_cache_dtype: fp8}\ndefaults:",
                   "llama-fp8.yaml")
    res = diff(runner, LLAMA, fp8)
    assert res.exit_code == 1
    assert res.stdout.splitlines()[2:] == [
        "",
        "engine",
        "  kv_cache_dtype: auto -> fp8",
        "",
        "groups (1 of 1 differ; ~ changed, + added, - removed)",
        "  ~ group 0 full_attention: model.layers.{0..31}.self_attn.attn",
        "      page: 64 KiB -> 32 KiB (-50.0%)",
        "      state per block: 2.00 MiB -> 1.00 MiB (-50.0%)",
        "      dtype (32 layers): bfloat16 -> float8_e4m3fn",
        "      kv_quant_mode (32 layers): 0 -> 1",
        "",
        "blocks and placement",
        "  bytes per block: 2.00 MiB -> 1.00 MiB (-50.0%)",
        "  one request at max_model_len: 16.00 GiB -> 8.00 GiB (-50.0%)",
        "  placement: 1 tensor -> 1 tensor, offsets or strides differ",
        "",
        "capacity at 40.00 GiB per rank",
        "  blocks: 20,480 -> 40,960 (+100.0%)",
        "  KV tokens: 327,680 -> 655,360 (+100.0%)",
        "  max concurrency: 2.50x -> 5.00x (+100.0%)",
        "",
        "the plans differ (5 changes)",
    ]


def test_differ_exits_1_without_an_error_message(tmp_path) -> None:
    """Through kvspec.cli.main, as CI runs it: exit 1, the diff on stdout, nothing on stderr."""
    fp8 = _variant(tmp_path, LLAMA, "defaults:", "quantization: {kv_cache_dtype: fp8}\ndefaults:",
                   "llama-fp8.yaml")
    code, out, err = invoke(["diff", LLAMA, str(fp8)])
    assert (code, err) == (1, "")
    assert out.endswith("the plans differ (5 changes)\n")
    code, out, err = invoke(["diff", LLAMA, LLAMA_ART])
    assert (code, err) == (0, "")


def test_memory_option_sets_the_budget(runner, tmp_path) -> None:
    fp8 = _variant(tmp_path, LLAMA, "defaults:", "quantization: {kv_cache_dtype: fp8}\ndefaults:",
                   "llama-fp8.yaml")
    res = diff(runner, LLAMA_ART, fp8, "--memory", "80GiB")
    assert res.exit_code == 1
    lines = res.stdout.splitlines()
    assert "capacity at 80.00 GiB per rank" in lines
    assert "  KV tokens: 655,360 -> 1,310,720 (+100.0%)" in lines


def test_hybrid_off_merges_groups(runner, gemma, tmp_path) -> None:
    off = _variant(tmp_path, gemma, "  memory: 40GiB", "  memory: 40GiB\n  hybrid: false",
                   "gemma-off.yaml")
    res = diff(runner, gemma, off)
    assert res.exit_code == 1
    lines = res.stdout.splitlines()
    for line in (
        "  hybrid: true -> false",
        "groups (2 of 2 differ; ~ changed, + added, - removed)",
        "  ~ group 1 -> 0 full_attention: model.layers.{0..41}.self_attn.attn",
        "      + model.layers.{0..40 step 2}.self_attn.attn",
        "  - group 0 sliding_window model.layers.{0..40 step 2}.self_attn.attn",
        "  bytes per block: 2.62 MiB -> 5.25 MiB (+100.0%)",
        "  blocks: 15,603 -> 7,801 (-50.0%)",
        "  KV tokens: 124,702 -> 124,816 (+0.1%)",
    ):
        assert line in lines, line


def test_block_size_change(runner, gemma, tmp_path) -> None:
    b32 = _variant(tmp_path, gemma, "block_size: 16", "block_size: 32", "gemma-b32.yaml")
    res = diff(runner, gemma, b32, "--format", "json")
    assert res.exit_code == 1
    data = json.loads(res.stdout)
    assert data["identical"] is False
    assert data["engine"] == [{"what": "block_size", "a": "16", "b": "32", "ratio": 1.0}]
    assert [g["status"] for g in data["groups"]] == ["changed", "changed"]
    changes = {c["what"]: (c["a"], c["b"]) for c in data["groups"][0]["changes"]}
    assert changes["block_size"] == ("16", "32")
    assert changes["page"] == ("128 KiB", "256 KiB")
    assert data["capacity"]["a"]["num_blocks"] == 15603
    assert data["capacity"]["b"]["num_blocks"] == 7801


def test_groups_added_and_removed(runner, gemma, tmp_path) -> None:
    """Adding state layers adds groups; the artifact side can be mixed with a source."""
    text = gemma.read_text()
    text = text.replace("  full: {kind: full_attention}",
                        "  full: {kind: full_attention}\n"
                        "  ssm: {kind: mamba, shapes: [[3, 4096], [8, 64, 64]], "
                        "dtypes: [bfloat16, float32]}")
    text = text.replace("- {repeat: 21, pattern: [sliding, full]}",
                        "- {repeat: 21, pattern: [sliding, full]}\n- {pattern: [ssm, ssm]}")
    hybrid = tmp_path / "gemma-ssm.yaml"
    hybrid.write_text(text)
    res = diff(runner, gemma, hybrid, "--format", "json")
    assert res.exit_code == 1, res.output
    data = json.loads(res.stdout)
    assert data["layers"]["added"] == ["model.layers.{42,43}.self_attn.attn"]
    assert "added" in {g["status"] for g in data["groups"]}


def test_markdown(runner, gemma, tmp_path) -> None:
    off = _variant(tmp_path, gemma, "  memory: 40GiB", "  memory: 40GiB\n  hybrid: false",
                   "gemma-off.yaml")
    res = diff(runner, gemma, off, "--format", "md")
    assert res.exit_code == 1
    lines = res.stdout.splitlines()
    assert lines[0] == "### kvspec diff: the plans differ (7 changes)"
    assert "| engine | `hybrid` | true | false |  |" in lines
    assert "| blocks | bytes per block | 2.62 MiB | 5.25 MiB | +100.0% |" in lines
    same = diff(runner, LLAMA, LLAMA_ART, "--format", "md")
    assert same.exit_code == 0
    assert same.stdout.splitlines()[0] == "### kvspec diff: identical plans"


def test_errors_exit_2() -> None:
    code, out, err = invoke(["diff", "no/such/file.yaml", LLAMA])
    assert (code, out) == (2, "")
    assert err.startswith("no/such/file.yaml: error: no such file")
    code, _, err = invoke(["diff", LLAMA])
    assert code == 2 and "Missing argument 'B'" in err
    code, _, err = invoke(["diff", LLAMA, LLAMA_ART, "--memory", "lots"])
    assert code == 2 and "cannot read 'lots' as a size" in err
    code, _, _ = invoke(["diff", LLAMA, LLAMA_ART, "--format", "xml"])
    assert code == 2


def test_invalid_source_exits_2(tmp_path) -> None:
    bad = _variant(tmp_path, LLAMA, "block_size: 16", "block_size: sixteen", "bad.yaml")
    code, out, err = invoke(["diff", LLAMA, str(bad)])
    assert (code, out) == (2, "")
    assert "bad.yaml:" in err and "error:" in err


def test_match_groups() -> None:
    from kvspec.diff import match_groups

    a = [{"kind": "sliding_window", "layers": ["l0", "l2"]},
         {"kind": "full_attention", "layers": ["l1", "l3"]},
         {"kind": "mamba", "layers": ["l4"]}]
    b = [{"kind": "full_attention", "layers": ["l1", "l3", "l5"]},
         {"kind": "sliding_window", "layers": ["l0", "l2"]},
         {"kind": "full_attention", "layers": ["l9"]}]
    # l0/l2 identical; l1/l3 overlap within a kind; mamba gone; l9 new
    assert match_groups(a, b) == ([(0, 1), (1, 0)], [2], [2])
    # the same layers pair whatever their kind (a kind change); a partial
    # overlap across kinds does not pair
    assert match_groups([{"kind": "mamba", "layers": ["x"]}],
                        [{"kind": "full_attention", "layers": ["x"]}]) == ([(0, 0)], [], [])
    assert match_groups([{"kind": "mamba", "layers": ["x", "y"]}],
                        [{"kind": "full_attention", "layers": ["x"]}]) == ([], [0], [0])
