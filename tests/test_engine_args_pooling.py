"""``kvspec engine-args`` for pooling plans: vLLM serves what ``auto`` chose and refuses
separate pools; SGLang gets the pool sizes and ratios that give kvspec's split.

The printed commands of the three worked examples are goldens
(tests/golden/engine-args/; ``KVSPEC_REGEN=1`` rewrites them). Where SGLang 0.5.23
is installed in ``build/sglang`` (``python3 -m venv build/sglang &&
build/sglang/bin/pip install sglang==0.5.23``), the printed flags are parsed by
its own ``prepare_server_args`` and the sliding-window split is recomputed by its
own ``HybridSWAPoolConfigurator``.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from kvspec.compiled import read
from kvspec.integrations.sglang.server_args import server_args, swa_ratio, swa_tokens
from tests.conftest import ROOT, check_golden, invoke

EXAMPLES = ("pooling-auto", "pooling-separate", "pooling-vllm")
GOLDEN = ROOT / "tests" / "golden" / "engine-args"
SGLANG = ROOT / "build" / "sglang" / "bin" / "python"
LLAMA_AUTO = ROOT / "tests" / "data" / "pooling" / "llama-auto-vllm.yaml"


def _layout(name: str) -> str:
    return f"layouts/{name}.kvlayout.json"


@pytest.fixture(scope="module")
def llama_auto(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A serve_with: vllm artifact whose chosen plan differs from the source's settings."""
    out = tmp_path_factory.mktemp("pooling") / "llama-auto-vllm.kvlayout.json"
    code, _, err = invoke(["compile", str(LLAMA_AUTO), "-o", str(out)])
    assert code == 0, err
    return out


# -- goldens ------------------------------------------------------------------------

@pytest.mark.parametrize("engine, name", [
    ("vllm", "pooling-auto-refused"), ("vllm", "pooling-separate-refused"),
    ("vllm", "pooling-vllm"), ("sglang", "pooling-auto"),
    ("sglang", "pooling-separate"), ("sglang", "pooling-vllm-refused")])
def test_the_examples_print_exactly_the_golden(engine: str, name: str) -> None:
    refused = name.endswith("-refused")
    code, out, err = invoke(["engine-args", _layout(name.removesuffix("-refused")),
                             "--engine", engine])
    assert code == (1 if refused else 0), err
    assert (out == "") == refused
    check_golden(GOLDEN / f"{name}.{engine}.txt", err if refused else out)


# -- vLLM ---------------------------------------------------------------------------

def test_vllm_is_the_default_engine() -> None:
    path = _layout("pooling-vllm")
    assert invoke(["engine-args", path])[1] == invoke(["engine-args", path, "--engine",
                                                       "vllm"])[1]


@pytest.mark.parametrize("name", ["pooling-separate", "pooling-auto"])
def test_vllm_refuses_separate_pools_naming_why_and_what_serves_them(name: str) -> None:
    code, out, _err = invoke(["engine-args", _layout(name), "--format", "json"])
    assert code == 1
    error = json.loads(out)["errors"][0]
    assert "one shared pool" in error["message"] and error["path"] == "body.pooling.policy"
    for what in ("--engine sglang", "serve_with: kvspec", "policy: unified"):
        assert what in error["hint"]


def test_vllm_prints_the_chosen_plan_and_what_it_changed(llama_auto: Path) -> None:
    code, out, _ = invoke(["engine-args", str(llama_auto)])
    assert code == 0
    assert "# pooling: auto (serve_with vllm) chose 'unified, block 16'" in out
    assert "# pooling: block size 128 -> 16" in out
    assert "  --block-size 16 \\" in out and "--block-size 128" not in out
    assert f"KVSPEC_LAYOUT={llama_auto} KVSPEC_MODE=verify" in out


def test_vllm_mode_auto_enforces_what_vllm_plans_otherwise_by_design() -> None:
    data = json.loads(invoke(["engine-args", "layouts/example-stride-alignment.kvlayout.json",
                              "--format", "json"])[1])
    assert data["env"]["KVSPEC_MODE"] == "enforce"
    assert "block-stride-alignment" in data["mode_why"]
    asked = json.loads(invoke(["engine-args", "layouts/example-stride-alignment.kvlayout.json",
                               "--mode", "verify", "--format", "json"])[1])
    assert asked["env"]["KVSPEC_MODE"] == "verify" and asked["mode_why"] is None


def test_the_plugin_refuses_separate_pools_in_every_mode() -> None:
    from kvspec.integrations.vllm.guard import Expectation, PluginError

    for mode in ("verify", "enforce"):
        with pytest.raises(PluginError, match="one shared pool") as info:
            Expectation.read(_layout("pooling-separate"), mode)
        assert "--engine sglang" in info.value.hint


# -- SGLang -------------------------------------------------------------------------

def test_sglang_sizes_reproduce_kvspecs_pools() -> None:
    for name in ("pooling-auto", "pooling-separate"):
        art = read(_layout(name))
        args = server_args(art, "a")
        flags = {f.flag: f.value for f in args.flags}
        shares = {p.name: p.budget.num_blocks for p in art.body.pooling.pools}
        for pool in args.pools:
            assert pool.num_blocks == shares[pool.name]
            if pool.role == "full":
                assert flags["--max-total-tokens"] == str((pool.num_blocks - 1) * 16)
            elif pool.role == "state":
                assert flags["--max-mamba-cache-size"] == str(pool.num_blocks - 1)
            else:
                full = int(flags["--max-total-tokens"])
                ratio = float(flags["--swa-full-tokens-ratio"])
                assert swa_tokens(full, ratio, 16) == (pool.num_blocks - 1) * 16


@pytest.mark.parametrize("full, swa, page", [(608688, 84560, 16), (1000, 16, 16),
                                             (4096, 4096, 16), (123456, 77760, 64),
                                             (7, 7, 1)])
def test_the_printed_ratio_gives_the_pool_exactly(full: int, swa: int, page: int) -> None:
    assert swa_tokens(full, float(swa_ratio(full, swa, page)), page) == swa


def test_sglang_refuses_a_unified_hybrid_plan() -> None:
    code, out, err = invoke(["engine-args", "layouts/gemma-3-27b-it.kvlayout.json",
                             "--engine", "sglang"])
    assert code == 1 and out == ""
    assert "a unified hybrid plan" in err and "pooling.policy: separate" in err


def test_sglang_serves_a_plain_attention_plan() -> None:
    code, out, _ = invoke(["engine-args", "layouts/llama-3.1-8b.kvlayout.json",
                           "--engine", "sglang", "--format", "json"])
    data = json.loads(out)
    flags = {f["flag"]: f["value"] for f in data["flags"]}
    assert code == 0 and flags["--page-size"] == "16"
    assert flags["--max-total-tokens"] == str((20480 - 1) * 16)
    assert data["argv"][:3] == ["sglang", "serve", "--model-path"]


# -- against SGLang's own code ------------------------------------------------------

_CHECK = r"""
import json, sys
from sglang.srt.server_args import prepare_server_args
from sglang.srt.model_executor.pool_configurator import HybridSWAPoolConfigurator
out = []
for argv, want in json.loads(sys.stdin.read()):
    args = prepare_server_args(argv[2:])
    got = {k: getattr(args, k) for k in want}
    swa = None
    if args.swa_full_tokens_ratio is not None:
        c = object.__new__(HybridSWAPoolConfigurator)
        c._full_layers_num, c._swa_full_tokens_ratio = 1, args.swa_full_tokens_ratio
        c._enable_unified_memory, c._sliding_window_size = False, None
        c._page_size = args.page_size
        config = c.calculate_pool_sizes_from_max_tokens(args.max_total_tokens, args.page_size)
        swa = [config.full_max_total_num_tokens, config.swa_max_total_num_tokens]
    out.append({"got": got, "swa": swa})
print(json.dumps(out))
"""


@pytest.mark.skipif(not SGLANG.exists(), reason="SGLang 0.5.23 is not installed in "
                    "build/sglang (python3 -m venv build/sglang && build/sglang/bin/pip "
                    "install sglang==0.5.23)")
def test_sglangs_own_parser_and_pool_sizing_take_the_flags(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text((ROOT / "tests/data/hf/llama-3.1-8b.json").read_text())
    cases, pools = [], []
    for name in ("pooling-auto", "pooling-separate"):
        data = json.loads(invoke(["engine-args", _layout(name), "--engine", "sglang",
                                  "--model", str(model), "--format", "json"])[1])
        want = {f["flag"][2:].replace("-", "_"): f["value"] for f in data["flags"]}
        cases.append((data["argv"], sorted(want)))
        pools.append((want, {p["role"]: p["sglang"] for p in data["pools"]}))
    run = subprocess.run([str(SGLANG), "-c", _CHECK], input=json.dumps(cases), text=True,
                         capture_output=True, timeout=600, cwd=tmp_path, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads(run.stdout.strip().splitlines()[-1])
    for (want, sizes), result in zip(pools, results):
        for key, value in want.items():
            got = result["got"][key]
            assert got is True if value is None else str(got) == value, key
        if result["swa"] is not None:
            assert result["swa"] == [sizes["full"], sizes["swa"]]
