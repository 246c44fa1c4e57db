"""Golden files: ``tests/golden/<case>.yaml`` compiles to ``<case>.kvlayout.json``
byte for byte. ``KVSPEC_REGEN=1 pytest tests/test_golden.py`` rewrites them;
review the diff before committing."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvspec.compiler import compile
from tests.conftest import ROOT, check_golden
from tests.invariants import check_artifact

GOLDEN = ROOT / "tests" / "golden"
SOURCES = sorted(GOLDEN.glob("*.yaml"))


def _artifact_path(source: Path) -> Path:
    return source.with_name(source.name.removesuffix(".yaml") + ".kvlayout.json")


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_golden(source: Path) -> None:
    artifact = compile(source.relative_to(ROOT))
    text = artifact.text()
    check_golden(_artifact_path(source), text)
    assert check_artifact(artifact) == []


def test_every_golden_has_an_artifact() -> None:
    assert SOURCES
    for source in SOURCES:
        assert _artifact_path(source).exists()


@pytest.mark.parametrize("source", SOURCES[:3], ids=lambda p: p.stem)
def test_compile_is_deterministic_across_processes(source: Path) -> None:
    import subprocess
    import sys

    code = ("import sys, kvspec.compiler as c; "
            f"sys.stdout.write(c.compile({str(source.relative_to(ROOT))!r}).text())")
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, cwd=ROOT,
                           env={"PYTHONHASHSEED": seed, "PATH": ""}).stdout
            for seed in ("0", "12345")}
    assert len(runs) == 1
