"""``kvspec descriptor --as lmcache`` against LMCache 0.5.6 itself, where its virtual
environment exists (/work/scratch/lmcache-venv, or $KVSPEC_LMCACHE_PYTHON): the
tensors the export describes are built there and LMCache detects their formats and
groups them with the export's ``EngineGroupInfo`` list (tests/connectors/lmcache_probe.py);
what it derives must be what the export says. Without that environment, the export is
checked against the field lists of LMCache 0.5.6's sources (docs/connectors.md)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from kvspec.artifact import Artifact
from kvspec.connectors.describe import describe
from kvspec.connectors.descriptor import ExportError
from kvspec.connectors.exporters import lmcache
from tests.conftest import ROOT
from tests.connectors.caches import compiled

PYTHON = Path(os.environ.get("KVSPEC_LMCACHE_PYTHON", "/work/scratch/lmcache-venv/bin/python"))
PROBE = ROOT / "tests" / "connectors" / "lmcache_probe.py"

#: LMCache 0.5.6's ``EngineGroupInfo`` fields (lmcache/v1/multiprocess/group_view.py) and
#: ``PageBufferShapeDesc`` fields (lmcache/v1/kv_layer_groups.py, ``KernelGroupInfo``).
ENGINE_GROUP_INFO = ("engine_group_id", "layer_indices", "tokens_per_block", "sw_size_tokens",
                     "extra_object_group_tag", "recurrent_state")
SHAPE_DESC = ("kv_size", "nl", "nb", "bs", "nh", "hs", "element_size", "block_stride_elems")
#: ``EngineKVFormat`` members the export may name (lmcache_native, 0.5.6).
FORMATS = ("NL_X_NB_BS_NH_CS", "NL_X_NB_NH_BS_CS", "NL_X_NB_BS_HS", "NL_X_NB_BSV_BSS")


def _small(path: str) -> object:
    """A committed layout's descriptor for 16 blocks of its main pool (fewer than a
    request needs, which a descriptor given counts per pool allows: the probe allocates
    the tensors)."""
    return describe(Artifact.read(path), num_blocks={"device": 16})


def _cases():
    for name in ("llama-3.1-8b", "gpt-oss-120b", "gemma-3-27b-it", "deepseek-v3",
                 "llama-4-scout-17b-16e-instruct", "example-packed-blhnc"):
        yield name, _small(f"layouts/{name}.kvlayout.json")
    for layout in ("LBHNC", "BLHNC", "BLNHC"):
        yield f"dense-{layout}", describe(compiled("dense", layout=layout), num_blocks=8)


CASES = dict(_cases())


@pytest.mark.parametrize("name", CASES)
def test_the_export_has_lmcache_0_5_6s_fields(name: str) -> None:
    desc = CASES[name]
    out = lmcache.export(desc)
    for info in out["engine_group_infos"]:
        assert tuple(info) == ENGINE_GROUP_INFO
    for group in out["kernel_groups"]:
        assert tuple(group["shape_desc"]) == SHAPE_DESC
        assert group["engine_kv_format"] in FORMATS
    assert out["layout_hints"]["kv_layout"] in ("NHD", "HND", "BLHNC", "BLNHC")
    cacheable = {g.id for g in desc.groups if g.prefix_cacheable}
    covered = sorted(i for g in out["kernel_groups"] for i in g["layer_indices"])
    assert covered == [x["index"] for x in out["layers"] if x["group"] in cacheable]


@pytest.fixture(scope="module")
def derived() -> dict:
    """LMCache 0.5.6's view of every case's tensors, probed in one process."""
    if not PYTHON.exists():
        pytest.skip(f"no LMCache 0.5.6 environment at {PYTHON}: the export is checked "
                    "against the documented field lists only")
    request = {name: {"export": lmcache.export(desc),
                      "region_bytes": [r.length for r in desc.regions]}
               for name, desc in CASES.items()}
    proc = subprocess.run([str(PYTHON), str(PROBE)], input=json.dumps(request), text=True,
                          capture_output=True, timeout=600, cwd=ROOT, check=False,
                          env={**os.environ, "PYTHONPATH": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", CASES)
def test_lmcache_derives_what_the_export_says(name: str, derived: dict) -> None:
    out, got = lmcache.export(CASES[name]), derived[name]
    assert "error" not in got, got
    assert got["formats"] == [x["engine_kv_format"] for x in out["layers"]]
    ours = [{k: g[k] for k in ("layer_indices", "engine_kv_format", "dtype",
                               "engine_group_id", "tokens_per_block", "sw_size_tokens",
                               "shape_desc")} for g in out["kernel_groups"]]
    assert got["kernel_groups"] == ours
    assert got["attn_window"] == {k: out["attn_window"][k]
                                  for k in ("num_chunks_in_sw", "group_kinds")}


@pytest.mark.parametrize("layout, message", [
    ("jamba-v0.1", "is a state layer .mamba.: 0.5.6's EngineKVFormat has no format"),
])
def test_what_lmcache_0_5_6_cannot_express_is_refused(layout: str, message: str) -> None:
    with pytest.raises(ExportError, match=message) as err:
        lmcache.export(describe(Artifact.read(f"layouts/{layout}.kvlayout.json")))
    assert err.value.hint
    with pytest.raises(ExportError, match="splits a layer's page in one run per head"):
        lmcache.export(describe(compiled("dense", layout="LHBNC"), num_blocks=8))
