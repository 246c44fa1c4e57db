"""Error goldens: each ``tests/errors/<name>.yaml`` beside ``<name>.expected``,
which holds the exit code on its first line and then the exact message.
``KVSPEC_REGEN=1`` rewrites the expected files; review them before committing."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import ROOT, check_golden, invoke

ERRORS = ROOT / "tests" / "errors"
CASES = sorted(ERRORS.glob("*.yaml"))


@pytest.mark.parametrize("source", CASES, ids=lambda p: p.stem)
def test_error_golden(source: Path) -> None:
    rel = str(source.relative_to(ROOT))
    code, _, err = invoke(["validate", rel])
    got = f"{code}\n{err}"
    check_golden(source.with_suffix(".expected"), got)
    assert code == 1
    assert "Traceback" not in err
    # every error names the file first: the source's, or the trace's it names
    where = "tests/errors/traces/" if source.stem == "pooling-bad-trace" else rel
    assert err.startswith(f"{where}"), "every error names the file first"


def test_missing_file_is_a_clear_error() -> None:
    code, _, err = invoke(["validate", "no/such/file.yaml"])
    assert code == 1
    assert err.startswith("no/such/file.yaml: error: no such file")


def test_usage_error_exits_2() -> None:
    code, _, err = invoke(["compile"])
    assert code == 2
    assert "error: missing argument SOURCE" in err and "hint:" in err
    code, _, err = invoke(["plan", "layouts/llama-3.1-8b.yaml", "--memory", "lots"])
    assert code == 2
    assert "--memory: cannot read 'lots' as a size" in err
