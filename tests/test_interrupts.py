"""Ctrl-C while the simulator runs: exit 130, ``interrupted``, no traceback, nothing
half-written -- on the compiled build (mypyc) as on the source (kvspec/interrupts.py
says why the compiled build needs its help: a ``KeyboardInterrupt`` raised inside a
compiled integer product aborted the process with "fatal: out of memory").

Each test starts ``kvspec`` in a subprocess, waits until it is simulating, sends it
SIGINT, as a terminal does on Ctrl-C, and reads how it ended. The compiled build is
required wherever it can be built: these tests skip only without a C compiler or
mypyc (kvspec then installs as pure Python), or with ``KVSPEC_PURE_PYTHON`` set.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT

#: ``python -m kvspec``, telling on stderr which build runs and when each simulation
#: starts (kvspec.sim.run calls the step loop through this module's ``drive``).
DRIVER = """
import sys
from kvspec import _native
import kvspec.sim as sim
sys.stderr.write(f"test: build {_native.STATE}\\n"); sys.stderr.flush()
loop = sim.drive
def drive(*args, **kwargs):
    sys.stderr.write("test: simulating\\n"); sys.stderr.flush()
    return loop(*args, **kwargs)
sim.drive = drive
sys.argv[0] = "kvspec"
from kvspec.cli import main
main()
"""

#: Requests in the traces: a simulation runs for seconds, so the signal finds it
#: running (0.3 s after it starts).
REQUESTS = 20_000
#: A pooling section that simulates each candidate on a trace of :data:`REQUESTS`.
AUTO = f"""
pooling:
  policy: auto
  serve_with: kvspec
  workload:
    context_tokens: {{mean: 2048, spread: 0.6}}
    output_tokens: {{mean: 256, spread: 0.5}}
    requests: {REQUESTS}
"""


def _compiler() -> str | None:
    """Why the compiled build cannot be built here, or None."""
    if importlib.util.find_spec("mypyc") is None:
        return "mypyc is not installed"
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        return f"no C compiler ({cc})"
    return None


def _env(build: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KVSPEC_PROGRESS_NOTES": "off"}
    env.pop("KVSPEC_PURE_PYTHON", None)
    if build == "source":
        env["KVSPEC_PURE_PYTHON"] = "1"
    return env


@pytest.fixture(params=["compiled", "source"])
def build(request: pytest.FixtureRequest) -> str:
    """The build a test runs: the compiled one must be in use where it can be built."""
    if request.param == "compiled":
        if os.environ.get("KVSPEC_PURE_PYTHON", "") not in ("", "0"):
            pytest.skip("KVSPEC_PURE_PYTHON is set: the compiled build is not used")
        version = subprocess.run([sys.executable, "-m", "kvspec", "--version"], cwd=ROOT,
                                 env=_env("compiled"), capture_output=True, text=True,
                                 check=True).stdout
        state = version.split("simulator: ", 1)[1].strip()
        if state != "compiled":
            why = _compiler()
            if why is not None:
                pytest.skip(f"the compiled build cannot be built here: {why}")
            pytest.fail(f"the compiled simulator is not in use ({state}); build it with "
                        "`pip install -e .` or `python setup.py build_ext --inplace`")
    return str(request.param)


def _interrupt(args: list[str], build: str) -> tuple[int, str, str]:
    """``kvspec ARGS`` sent SIGINT 0.3 s into its first simulation: (exit code, stdout,
    stderr)."""
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, *args], cwd=ROOT, env=_env(build),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    simulating = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if line == "test: simulating\n":
                simulating.set()
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert simulating.wait(120), f"the simulation never started:\n{''.join(lines)}"
        time.sleep(0.3)
        assert proc.poll() is None, f"finished before the signal:\n{''.join(lines)}"
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
        out = proc.stdout.read() if proc.stdout is not None else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(10)
    err = "".join(lines)
    assert err.startswith(f"test: build {'compiled' if build == 'compiled' else 'source'}")
    return proc.returncode, out, err


def _assert_interrupted(code: int, out: str, err: str) -> None:
    assert code == 130, f"exit {code}:\n{err}"
    assert "kvspec: error: interrupted\n" in err, err
    assert "Traceback" not in err and "fatal" not in err, err
    assert out == ""


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("trace") / "big.jsonl"
    subprocess.run([sys.executable, "-m", "kvspec", "trace", "-n", str(REQUESTS),
                    "-o", str(path), "-q"], cwd=ROOT, check=True, env=_env("source"))
    return path


def test_ctrl_c_during_simulate(build: str, trace: Path, tmp_path: Path) -> None:
    output = tmp_path / "result.txt"
    code, out, err = _interrupt(["simulate", "layouts/llama-3.1-8b.kvlayout.json",
                                 "--workload", str(trace), "-o", str(output)], build)
    _assert_interrupted(code, out, err)
    assert list(tmp_path.iterdir()) == []   # no result, and no temporary file


def test_ctrl_c_during_auto_pooling(build: str, tmp_path: Path) -> None:
    """``compile`` of a ``pooling: auto`` source simulates its candidates."""
    source = tmp_path / "auto.yaml"
    source.write_text((ROOT / "layouts" / "llama-3.1-8b.yaml").read_text() + AUTO)
    output = tmp_path / "auto.kvlayout.json"
    code, out, err = _interrupt(["compile", str(source), "-o", str(output)], build)
    _assert_interrupted(code, out, err)
    assert [p.name for p in tmp_path.iterdir()] == ["auto.yaml"]
