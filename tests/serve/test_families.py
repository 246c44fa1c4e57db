"""The record of tests/serve/families.py holds: every checkpoint family has a case, and
each refused case is still refused by the CPU engine with the error recorded (when
vLLM fixes one, this fails: move it to the served cases). The served cases are
exercised by the rest of the serving suite, one engine per family."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import families  # noqa: E402

from scripts import make_tiny_checkpoint as checkpoints  # noqa: E402


@pytest.mark.serve
def test_every_checkpoint_family_has_a_case() -> None:
    assert {c.checkpoint for c in families.CASES.values()} == set(checkpoints.FAMILIES)
    for case in families.CASES.values():
        assert case.serves == (case.error is None), case.name
        assert case.serves == (case.needs is None), case.name
        assert case.serves == (case.start_s is not None), case.name


@pytest.mark.serve
@pytest.mark.parametrize("name", families.REFUSED)
def test_the_refusal_still_holds(name: str) -> None:
    done = subprocess.run([sys.executable, str(HERE / "families.py"), name], check=False,
                          capture_output=True, text=True, timeout=900)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("FAMILY ")]
    if lines:
        assert json.loads(lines[-1].removeprefix("FAMILY "))["served"] is False
    else:  # the engine core died and took the probe with it before it could report
        assert done.returncode != 0, done.stdout[-3000:] + done.stderr[-3000:]
    error = families.CASES[name].error
    assert error is not None
    # the message without its exception class: a dying engine core reports it as
    # "Worker failed with error '<message>'"
    message = error.split(": ", 1)[-1]
    assert message in done.stdout + done.stderr, done.stdout[-3000:] + done.stderr[-3000:]
