"""Lint is part of the suite: ``ruff check`` and ``mypy``, configured in
pyproject.toml (rule set; strict for the model, planner and artifact), find
nothing. Both are pinned in the ``test`` extra, so CI runs the versions the code
was made clean with; a finding fails here with the tool's own report."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True,
                          text=True, check=False)


def test_ruff_finds_nothing() -> None:
    run = _run("ruff", "check", "--output-format", "concise", "kvspec", "tests", "benchmarks")
    assert run.returncode == 0, f"ruff check found problems:\n{run.stdout}{run.stderr}"


def test_mypy_finds_nothing() -> None:
    run = _run("mypy")  # what it checks, and how strictly: [tool.mypy] in pyproject.toml
    assert run.returncode == 0, f"mypy found problems:\n{run.stdout}{run.stderr}"
