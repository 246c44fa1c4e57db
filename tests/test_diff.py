"""``kvspec diff``: semantic diffs through the CLI, exit 0 identical / 1 differ /
2 error, and group matching."""

from __future__ import annotations

import json
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Run:
    exit_code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def diff(*args) -> Run:
    """``kvspec diff ARGS`` through ``kvspec.cli.main``, which turns the command's
    code (1: the plans differ) into the exit status, as CI runs it."""
    return Run(*invoke(["diff", *map(str, args)]))


def test_identical_source_and_artifact() -> None:
    res = diff(LLAMA, LLAMA_ART)
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines() == [
        "a: layouts/llama-3.1-8b.yaml (source, llama-3.1-8b)",
        "b: layouts/llama-3.1-8b.kvlayout.json (artifact, llama-3.1-8b)",
        "",
        "capacity at 40.00 GiB per rank: unchanged, 327,680 KV tokens",
        "",
        "the plans are identical",
    ]


def test_same_plan_other_budget_is_identical(tmp_path) -> None:
    """An artifact compiled for another budget is the same plan."""
    other = _variant(tmp_path, LLAMA, "memory: 40GiB", "memory: 80GiB", "llama-80.yaml")
    res = diff(LLAMA, other)
    assert res.exit_code == 0
    assert res.stdout.splitlines()[-1] == "the plans are identical"


def test_quantized_kv_cache(tmp_path) -> None:
    fp8 = _variant(tmp_path, LLAMA, "defaults:", "quantization: {kv_cache_dtype: fp8}\ndefaults:",
                   "llama-fp8.yaml")
    res = diff(LLAMA, fp8)
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


def test_memory_option_sets_the_budget(tmp_path) -> None:
    fp8 = _variant(tmp_path, LLAMA, "defaults:", "quantization: {kv_cache_dtype: fp8}\ndefaults:",
                   "llama-fp8.yaml")
    res = diff(LLAMA_ART, fp8, "--memory", "80GiB")
    assert res.exit_code == 1
    lines = res.stdout.splitlines()
    assert "capacity at 80.00 GiB per rank" in lines
    assert "  KV tokens: 655,360 -> 1,310,720 (+100.0%)" in lines


def test_hybrid_off_merges_groups(gemma, tmp_path) -> None:
    off = _variant(tmp_path, gemma, "  memory: 40GiB", "  memory: 40GiB\n  hybrid: false",
                   "gemma-off.yaml")
    res = diff(gemma, off)
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


def test_block_size_change(gemma, tmp_path) -> None:
    b32 = _variant(tmp_path, gemma, "block_size: 16", "block_size: 32", "gemma-b32.yaml")
    res = diff(gemma, b32, "--format", "json")
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


def test_groups_added_and_removed(gemma, tmp_path) -> None:
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
    res = diff(gemma, hybrid, "--format", "json")
    assert res.exit_code == 1, res.output
    data = json.loads(res.stdout)
    assert data["layers"]["added"] == ["model.layers.{42,43}.self_attn.attn"]
    assert "added" in {g["status"] for g in data["groups"]}


def test_markdown(gemma, tmp_path) -> None:
    off = _variant(tmp_path, gemma, "  memory: 40GiB", "  memory: 40GiB\n  hybrid: false",
                   "gemma-off.yaml")
    res = diff(gemma, off, "--format", "md")
    assert res.exit_code == 1
    lines = res.stdout.splitlines()
    assert lines[0] == "### kvspec diff: the plans differ (7 changes)"
    assert "| engine | `hybrid` | true | false |  |" in lines
    assert "| blocks | bytes per block | 2.62 MiB | 5.25 MiB | +100.0% |" in lines
    same = diff(LLAMA, LLAMA_ART, "--format", "md")
    assert same.exit_code == 0
    assert same.stdout.splitlines()[0] == "### kvspec diff: identical plans"


def test_errors_exit_2() -> None:
    code, out, err = invoke(["diff", "no/such/file.yaml", LLAMA])
    assert (code, out) == (2, "")
    assert err.startswith("no/such/file.yaml: error: no such file")
    code, _, err = invoke(["diff", LLAMA])
    assert code == 2 and "error: missing argument B" in err
    code, _, err = invoke(["diff", LLAMA, LLAMA_ART, "--memory", "lots"])
    assert code == 2 and "cannot read 'lots' as a size" in err
    code, _, _ = invoke(["diff", LLAMA, LLAMA_ART, "--format", "xml"])
    assert code == 2


def test_corrupt_artifact_exits_2(tmp_path) -> None:
    """An artifact that fails verification on reading is an error (2), not a change (1)."""
    from tests.conftest import signature_of as envelope_hash

    data = json.loads((ROOT / LLAMA_ART).read_text())
    data["body"]["name"] = "edited"
    bad = tmp_path / "bad.kvlayout.json"
    bad.write_text(json.dumps(data))
    code, out, err = invoke(["diff", LLAMA, str(bad)])
    assert (code, out) == (2, "")
    assert err.startswith(f"{bad}: error: ") and "does not match its sha256" in err
    data["body"]["groups"][0]["padding_slots"] = 1
    data["sha256"] = envelope_hash(data)
    bad.write_text(json.dumps(data))
    code, out, err = invoke(["diff", str(bad), LLAMA])
    assert (code, out) == (2, "")
    assert "not what kvspec plans from its own layers" in err


def test_invalid_source_exits_2(tmp_path) -> None:
    bad = _variant(tmp_path, LLAMA, "block_size: 16", "block_size: sixteen", "bad.yaml")
    code, out, err = invoke(["diff", LLAMA, str(bad)])
    assert (code, out) == (2, "")
    assert "bad.yaml:" in err and "error:" in err


def test_match_groups() -> None:
    from kvspec.model.plan import Group
    from kvspec.model.specs import FullAttention, MambaState, SlidingWindow
    from kvspec.reports.diff import match_groups

    attn = {"block_size": 16, "num_kv_heads": 8, "head_size": 128, "dtype": "bfloat16"}
    full = FullAttention(**attn)
    sliding = SlidingWindow(**attn, sliding_window=1024)
    mamba = MambaState(block_size=16, shapes=((3, 4096),), dtypes=("bfloat16",))

    def groups(*pairs):
        return [Group(tuple(layers), spec) for spec, layers in pairs]

    a = groups((sliding, ["l0", "l2"]), (full, ["l1", "l3"]), (mamba, ["l4"]))
    b = groups((full, ["l1", "l3", "l5"]), (sliding, ["l0", "l2"]), (full, ["l9"]))
    # l0/l2 identical; l1/l3 overlap within a kind; mamba gone; l9 new
    assert match_groups(a, b) == ([(0, 1), (1, 0)], [2], [2])
    # the same layers pair whatever their kind (a kind change); a partial
    # overlap across kinds does not pair
    assert match_groups(groups((mamba, ["x"])), groups((full, ["x"]))) == ([(0, 0)], [], [])
    assert match_groups(groups((mamba, ["x", "y"])), groups((full, ["x"]))) == ([], [0], [0])
