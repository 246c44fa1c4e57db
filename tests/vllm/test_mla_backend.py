"""kvspec's table of vLLM's MLA backends (kvspec/integrations/mla_backend.py) against
vLLM 0.33.0's own code: the priorities per GPU class, each backend's compute
capabilities, KV-cache dtypes and kernel block sizes.

vLLM's CUDA backends cannot be imported without an NVIDIA driver, so the tests read
their source: the class attributes and the ``return`` of each method, and
``platforms/cuda.py``'s ``_get_backend_priorities`` run with the backends as names.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvspec.integrations import mla_backend as m

pytestmark = pytest.mark.vllm
_SPEC = importlib.util.find_spec("vllm")
if _SPEC is None or _SPEC.origin is None:
    pytest.skip("vLLM is not installed", allow_module_level=True)
VLLM = Path(_SPEC.origin).parent
FILES = {"FLASH_ATTN_MLA": ("flashattn_mla.py", "FlashAttnMLABackend"),
         "FLASHMLA": ("flashmla.py", "FlashMLABackend"),
         "FLASHINFER_MLA": ("flashinfer_mla.py", "FlashInferMLABackend"),
         "CUTLASS_MLA": ("cutlass_mla.py", "CutlassMLABackend"),
         "TRITON_MLA": ("triton_mla.py", "TritonMLABackend")}
OURS = {b.name: b for b in (m.FLASH_ATTN_MLA, m.FLASHMLA, m.FLASHINFER_MLA, m.CUTLASS_MLA,
                            m.TRITON_MLA)}


def _class(name: str) -> ast.ClassDef:
    file, cls = FILES[name]
    tree = ast.parse((VLLM / "v1" / "attention" / "backends" / "mla" / file).read_text())
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)


def _returned(cls: ast.ClassDef, method: str) -> ast.expr:
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == method)
    ret = next(n for n in ast.walk(fn) if isinstance(n, ast.Return))
    assert ret.value is not None
    return ret.value


@pytest.mark.parametrize("name", sorted(OURS))
def test_each_backend_is_vllms(name: str) -> None:
    cls, ours = _class(name), OURS[name]
    dtypes = next(n.value for n in cls.body if isinstance(n, ast.AnnAssign)
                  and getattr(n.target, "id", "") == "supported_kv_cache_dtypes")
    assert tuple(ast.literal_eval(dtypes)) == ours.kv_cache_dtypes
    sizes = _returned(cls, "get_supported_kernel_block_sizes")
    assert isinstance(sizes, ast.List)
    bases = tuple(ast.literal_eval(e.args[0] if isinstance(e, ast.Call) else e)
                  for e in sizes.elts)
    assert bases == ours.kernel_blocks
    capability = _returned(cls, "supports_compute_capability")
    code = compile(ast.Expression(capability), name, "eval")
    for major in (7, 8, 9, 10, 12):
        runs = eval(code, {"capability": SimpleNamespace(major=major)})
        assert runs == (major in ours.majors), (name, major)


def _priorities():  # vLLM's function, the backends as their names
    source = (VLLM / "platforms" / "cuda.py").read_text()
    fn = next(n for n in ast.parse(source).body
              if isinstance(n, ast.FunctionDef) and n.name == "_get_backend_priorities")
    namespace = {"AttentionBackendEnum": SimpleNamespace(**{n: n for n in _names(fn)})}
    exec("from __future__ import annotations\n" + ast.get_source_segment(source, fn),
         namespace)
    return namespace["_get_backend_priorities"]


def _names(fn: ast.FunctionDef) -> set[str]:
    return {n.attr for n in ast.walk(fn) if isinstance(n, ast.Attribute)
            and getattr(n.value, "id", "") == "AttentionBackendEnum"}


@pytest.mark.parametrize("major", [7, 8, 9, 10, 12])
def test_the_priorities_are_vllms(major: int) -> None:
    theirs = _priorities()(True, SimpleNamespace(major=major, minor=0),
                           kv_cache_dtype="auto", head_size=576)
    dense = [n for n in theirs if "SPARSE" not in n and n != "TOKENSPEED_MLA"]
    assert dense == [b.name for b in m.PRIORITIES.get(major, m._OTHERS)]


def test_the_preferred_block_is_vllms_rule() -> None:
    source = (VLLM / "v1" / "attention" / "backend.py").read_text()
    assert ("if cls.supports_block_size(default_block_size):\n"
            "            return default_block_size") in source
    assert "return min(s.base if isinstance(s, MultipleOf) else s for s in supported_sizes)" \
        in source
