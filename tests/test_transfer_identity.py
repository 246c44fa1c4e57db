"""Model identity and transfer by geometry (issue 36, item 11): ``kvspec init`` records
the model's identity (the config's ``_name_or_path``, else the directory it came from),
and ``kvspec transfer`` decides on the geometry (layers, global heads, head sizes,
dtypes), never on names: one config at ``--tp 4`` and ``--tp 2`` is re-mappable, two
names of one geometry are compatible, and bf16 -> fp8 is refused naming
``kv_cache_dtype``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from kvspec.connectors.transfer import plan_transfer
from tests.conftest import ROOT, invoke
from tests.connectors.caches import compiled

CONFIG = ROOT / "tests" / "data" / "hf" / "llama-3.1-8b.json"


def _init(tmp_path: Path, out: str, *args: str, config: Path | None = None) -> Path:
    """``kvspec init`` of the Llama config as a model directory's config.json, compiled."""
    if config is None:
        config = tmp_path / "Llama-3.1-8B" / "config.json"
        config.parent.mkdir(exist_ok=True)
        shutil.copy(CONFIG, config)
    source = tmp_path / f"{out}.yaml"
    code, _, err = invoke(["init", "--from-hf", str(config), "--memory", "20GiB",
                           "--max-model-len", "8192", "-o", str(source), "-q", *args])
    assert code == 0, err
    code, _, err = invoke(["compile", "-q", str(source)])
    assert code == 0, err
    return tmp_path / f"{out}.kvlayout.json"


def test_init_records_the_directory_a_config_came_from(tmp_path: Path) -> None:
    art = _init(tmp_path, "l4", "--tp", "4")
    source = yaml.safe_load((tmp_path / "l4.yaml").read_text())
    assert (source["model"], source["architecture"]) == ("Llama-3.1-8B", "LlamaForCausalLM")
    body = json.loads(art.read_text())["body"]
    assert (body["model"], body["architecture"]) == ("Llama-3.1-8B", "LlamaForCausalLM")
    code, _, err = invoke(["check", str(art)])  # re-planned: the identity is carried
    assert code == 0, err


def test_init_records_the_configs_name_or_path_and_model_wins(tmp_path: Path) -> None:
    config = tmp_path / "c.json"
    config.write_text(json.dumps({**json.loads(CONFIG.read_text()),
                                  "_name_or_path": "meta-llama/Llama-3.1-8B"}))
    _init(tmp_path, "named", config=config)
    assert yaml.safe_load((tmp_path / "named.yaml").read_text())["model"] == \
        "meta-llama/Llama-3.1-8B"
    _init(tmp_path, "given", "--model", "org/other", config=config)
    text = (tmp_path / "given.yaml").read_text()
    assert yaml.safe_load(text)["model"] == "org/other" and "--model org/other" in text
    plain = tmp_path / "plain.json"
    shutil.copy(CONFIG, plain)  # a file not named config.json, no _name_or_path: none
    _init(tmp_path, "plain", config=plain)
    assert "model" not in yaml.safe_load((tmp_path / "plain.yaml").read_text())
    assert "--model" not in (tmp_path / "named.yaml").read_text()


def test_one_config_at_two_tensor_parallel_sizes_is_re_mappable(tmp_path: Path) -> None:
    """The issue's example: refused before as "different models: l4 and l2"."""
    l4 = _init(tmp_path, "l4", "--tp", "4")
    l2 = _init(tmp_path, "l2", "--tp", "2")
    code, out, err = invoke(["transfer", str(l4), str(l2)])
    assert code == 0, err
    assert out.splitlines()[2].startswith("re-mappable: tensor_parallel_size 4 -> 2")


def test_files_named_apart_from_their_model_transfer_on_geometry(tmp_path: Path) -> None:
    """Without any model name (a config file not named config.json), the artifacts'
    names differ and the geometry still decides."""
    plain = tmp_path / "llama.json"
    shutil.copy(CONFIG, plain)
    a = _init(tmp_path, "a", "--tp", "2", config=plain)
    b = _init(tmp_path, "b", "--tp", "2", config=plain)
    code, out, err = invoke(["transfer", str(a), str(b), "--format", "json"])
    assert code == 0, err
    assert json.loads(out)["verdict"] == "compatible"


def test_bf16_to_fp8_is_refused_naming_kv_cache_dtype(tmp_path: Path) -> None:
    bf16 = _init(tmp_path, "l2", "--tp", "2")
    fp8 = _init(tmp_path, "l8", "--tp", "2", "--kv-cache-dtype", "fp8")
    code, out, err = invoke(["transfer", str(bf16), str(fp8)])
    assert (code, out) == (1, "")
    first = err.splitlines()[0]
    assert first.startswith(f"{fp8}:") and "kv_cache_dtype differs: auto in" in first
    assert "  at: body.engine.kv_cache_dtype" in err


@pytest.mark.parametrize("changes", [dict(model="other")])
def test_names_alone_do_not_decide(changes: dict) -> None:
    t = plan_transfer(compiled("dense"), compiled("dense", **changes), src_blocks=32,
                      dst_blocks=32)
    assert (t.verdict, t.reasons) == ("compatible", ())
