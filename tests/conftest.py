"""Shared fixtures: paths, the conformance data beside the repository, a CLI runner."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
#: The conformance cases, vendored in the repository (tests/conformance/README.md).
CONFORMANCE = ROOT / "tests" / "conformance"
#: The reference planner's spec text (beside the repository only; tests that read it skip).
REFERENCE = SHARED / "reference" / "kv_cache_interface.txt"

#: Set KVSPEC_REGEN=1 to rewrite golden files; review the diff before committing.
REGEN = os.environ.get("KVSPEC_REGEN") == "1"
# No plain progress lines on stderr (kvspec.cli.progress): the tests compare outputs
# whole, and a loaded machine must not add a line to them. Commands the tests run in
# subprocesses inherit it.
os.environ["KVSPEC_PROGRESS_NOTES"] = "off"


def check_golden(path: Path, text: str) -> None:
    """``text`` must equal the golden file at ``path``. ``KVSPEC_REGEN=1``
    rewrites it (review the diff); a missing golden is a failure, never a pass."""
    if REGEN:
        path.write_text(text, encoding="utf-8")
    elif not path.exists():
        pytest.fail(f"missing golden file {path.relative_to(ROOT)}: run the test with "
                    "KVSPEC_REGEN=1 to write it, then review and commit it")
    assert text == path.read_text(encoding="utf-8"), \
        f"{path.name} differs: KVSPEC_REGEN=1 to rewrite it, then review the diff"


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run every test from the repository root (sources use relative paths)."""
    monkeypatch.chdir(ROOT)


@pytest.fixture
def runner():
    from click.testing import CliRunner
    return CliRunner()


def invoke(args: list[str], stdin: str | bytes = b"") -> tuple[int, str, str]:
    """Run ``kvspec ARGS`` through ``kvspec.cli.main`` with ``stdin`` on its standard
    input (never the test process's own): (exit code, stdout, stderr)."""
    import contextlib
    import io
    import sys

    from kvspec.cli import main

    data = stdin.encode() if isinstance(stdin, str) else stdin
    out, err = io.StringIO(), io.StringIO()
    code, saved = 0, sys.stdin
    sys.stdin = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8")
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(args)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.stdin = saved
    return code, out.getvalue(), err.getvalue()


def signature_of(data: dict) -> str:
    """The sha256 an artifact's (edited) data would carry: over the canonical text
    of everything but ``sha256``, as an editor covering their tracks would compute it."""
    from kvspec.artifact.text import canonical, sha256_of

    return sha256_of(canonical({k: v for k, v in data.items() if k != "sha256"}))
