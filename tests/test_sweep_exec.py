"""``kvspec sweep``'s executor held to the compiler's bar (issue 48): its options
fail clearly before any work, nothing of the user's is lost, a killed or
interrupted sweep resumes, and a best point measured on a workload too light to
saturate a replica says its figures are bounds (docs/sweep.md).

The process tests start the sweep in a subprocess of its own process group, as a
terminal would; each takes a few seconds. The Ray tests need ``kvspec[ray]`` and
skip, saying so, without it; none starts a Ray instance."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvspec.sweep.evaluate import ROW_KEYS
from kvspec.sweep.execute import ray_target
from kvspec.sweep.results import Results, is_results, results_file
from tests.conftest import ROOT, invoke
from tests.test_sweep import TINY

try:
    import ray
except ImportError:
    ray = None

needs_ray = pytest.mark.skipif(ray is None, reason="Ray is not installed (pip install "
                               "'kvspec[ray]', ray 2.60.0): the --ray path is not tested")
linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's /proc")

#: Two points of the tiny model, a second or so each.
GRID = """\
kvspec_sweep: 1
base: tiny.yaml
axes:
  memory: [512MiB, 1GiB]
  workload:
    - {name: a, context_tokens: 1024, output_tokens: 64, requests: 24, seed: 1}
target: {rate: 10, step_ms: 30}
"""
#: 16 points that take long enough to be killed mid-sweep (a quarter second each on the
#: compiled simulator, which finished 3,000 requests a point before the signal came).
SLOW = """\
kvspec_sweep: 1
base: tiny.yaml
axes:
  memory: [512MiB, 1GiB, 2GiB, 3GiB]
  block_size: [16, 32]
  workload:
    - {name: a, context_tokens: 1024, output_tokens: 64, requests: 20000, seed: 1}
    - {name: b, context_tokens: 512, output_tokens: 64, requests: 20000, seed: 2}
target: {rate: 10, step_ms: 30}
"""
#: The same model and memory, a light workload and a heavy one.
SATURATION = """\
kvspec_sweep: 1
base: tiny.yaml
axes:
  memory: [384MiB]
  workload:
    - {name: few, context_tokens: 1024, output_tokens: 64, requests: 50, seed: 1}
    - {name: many, context_tokens: 1024, output_tokens: 64, requests: 600, seed: 1}
target: {rate: 10, step_ms: 30}
"""
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "KVSPEC_PROGRESS_NOTES": "off"}


@pytest.fixture
def grid(tmp_path: Path) -> Path:
    (tmp_path / "tiny.yaml").write_text(TINY)
    (tmp_path / "grid.yaml").write_text(GRID)
    return tmp_path / "grid.yaml"


@pytest.fixture
def bad_grid(tmp_path: Path) -> Path:
    """A grid that fails when it is read: an option's error must come before it."""
    (tmp_path / "bad.yaml").write_text(GRID.replace("memory:", "memroy:"))
    return tmp_path / "bad.yaml"


# -- -o, --report and --csv: a clear error naming the option, before any work -------


@linux
@pytest.mark.parametrize("option", ["-o", "--report", "--csv"])
def test_an_output_that_cannot_be_written_is_named_before_any_work(
        bad_grid: Path, option: str) -> None:
    """/proc takes no new file, even for root: the error names the option and comes
    before the grid is read (the grid here is bad: its error would come first)."""
    suffix = {"-o": ".jsonl", "--report": ".html", "--csv": ".csv"}[option]
    code, _, err = invoke(["sweep", str(bad_grid), option, f"/proc/kvspec-sweep{suffix}"])
    assert code == 2, err
    assert "Traceback" not in err and "memroy" not in err
    name = "-o/--output" if option == "-o" else option
    assert f"{name} /proc/kvspec-sweep{suffix}: cannot write it" in err
    assert "hint: give" in err


def test_a_missing_directory_names_the_option(bad_grid: Path, tmp_path: Path) -> None:
    out = tmp_path / "nowhere" / "rows.jsonl"
    code, _, err = invoke(["sweep", str(bad_grid), "-o", str(out)])
    assert code == 2 and f"-o/--output {out}: the directory" in err, err
    assert "--parents" in err and not out.parent.exists()


# -- -o FILE that is not a sweep's rows, --force, -o - -------------------------------


@pytest.mark.parametrize("text", [b'{"prompt": "hello"}', b'{"prompt": "hello"}\n{"prompt": "x"}\n',
                                  b'{"prompt": "hel', b"id,model\n"],
                         ids=["one-json-line", "jsonl", "cut-json", "csv"])
def test_a_file_that_is_not_rows_is_never_overwritten(grid: Path, tmp_path: Path,
                                                      text: bytes) -> None:
    """A user's JSONL (one line without its newline was taken for a torn row and
    cut to 0 bytes): refused, untouched; --force starts it afresh, as it says."""
    out = tmp_path / "mine.jsonl"
    out.write_bytes(text)
    code, _, err = invoke(["sweep", str(grid), "-o", str(out)])
    assert code == 2, err
    assert f"-o/--output {out}: not a sweep's results file" in err and "--force" in err
    assert out.read_bytes() == text
    code, _, err = invoke(["sweep", str(grid), "-o", str(out), "--force"])
    assert code == 0, err
    assert "started afresh (--force)" in err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2 and all(r["ok"] for r in rows)


def test_force_help_says_what_it_does() -> None:
    code, out, _ = invoke(["sweep", "--help"])
    assert code == 0
    help_text = " ".join(out.split())
    assert "start an -o file afresh" in help_text and "--report or --csv" in help_text


def test_a_line_that_is_not_a_row_is_refused_at_its_line(grid: Path, tmp_path: Path
                                                         ) -> None:
    out = tmp_path / "rows.jsonl"
    assert invoke(["sweep", str(grid), "-o", str(out)])[0] == 0
    rows = out.read_bytes()
    # a last line that is whole JSON but not a row is not a torn write: refused, kept
    for extra in (b'{"note": "mine"}', b'{"note": "mine"}\n', b"[1, 2]\n"):
        out.write_bytes(rows + extra)
        code, _, err = invoke(["sweep", str(grid), "-o", str(out)])
        assert code == 1, err
        assert err.startswith(f"{out}:3: error: not a row of a sweep's results"), err
        assert out.read_bytes() == rows + extra


def test_rows_of_another_grid_are_refused_at_their_line(grid: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.yaml"
    other.write_text(GRID.replace("  memory: [512MiB, 1GiB]\n",
                                  "  memory: [1GiB]\n  block_size: [16, 32]\n"))
    out = tmp_path / "rows.jsonl"
    assert invoke(["sweep", str(other), "-o", str(out)])[0] == 0
    before = out.read_bytes()
    code, _, err = invoke(["sweep", str(grid), "-o", str(out)])
    assert code == 1, err
    assert err.startswith(f"{out}:1: error: a row of another grid"), err
    assert "axes block_size, memory, workload" in err and "--force" in err
    assert out.read_bytes() == before
    # an edited grid (another value of the same axes) is the same grid: it resumes
    edited = tmp_path / "grid2.yaml"
    edited.write_text(GRID.replace("[512MiB, 1GiB]", "[1GiB, 2GiB]"))
    mine = tmp_path / "mine.jsonl"
    assert invoke(["sweep", str(grid), "-o", str(mine)])[0] == 0
    code, _, err = invoke(["sweep", str(edited), "-o", str(mine)])
    assert code == 0 and "2 points: 1 run, 1 from" in err, err


def test_dash_writes_the_rows_to_stdout(grid: Path, tmp_path: Path) -> None:
    code, out, err = invoke(["sweep", str(grid), "-o", "-"])
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert len(rows) == 2 and {r["point"]["memory"] for r in rows} == {512 << 20, 1 << 30}
    assert "best point per workload" in err and "2 points: 2 run, 0 from -" in err
    assert not list(tmp_path.glob("*.jsonl")), "no results file"
    code, out, err = invoke(["sweep", str(grid), "-o", "-", "--format", "json"])
    assert code == 2 and "--format json has nowhere to go" in out


# -- the results file: its lock, torn lines, nothing left empty ---------------------


def test_a_forked_child_never_holds_the_lock(tmp_path: Path) -> None:
    """A process forked while the results are open (a pool's worker) closes its copy
    of the descriptor: once the sweep lets go, another sweep may take the file,
    however long the child lives."""
    path = tmp_path / "r.jsonl"
    res = Results(path).open()
    ready, told = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child: running (its fork hooks done)
        os.write(told, b"x")
        time.sleep(30)
        os._exit(0)
    try:
        assert os.read(ready, 1) == b"x"
        res.close()
        with results_file(path) as again:
            assert again.rows == {}
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        os.close(ready)
        os.close(told)


def test_the_row_keys_are_every_key_a_row_has(grid: Path, tmp_path: Path) -> None:
    """The torn-line check knows a row by its keys: they must be the rows' own."""
    out = tmp_path / "r.jsonl"
    assert invoke(["sweep", str(grid), "-o", str(out)])[0] == 0
    assert set().union(*(json.loads(line) for line in out.read_text().splitlines())) \
        <= ROW_KEYS
    for torn in (b"{", b'{"', b'{"bind', b'{"binding_pool', b'{"binding_pool": "dev',
                 b'{"id": "x", "point": {'):
        assert is_results(torn.decode()), torn
    for mine in ('{"prompt": "x', '{"a', '{"note": 1}', "[1", "hello"):
        assert not is_results(mine), mine


def test_a_worker_failure_leaves_no_empty_file(grid: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A point that fails outside kvspec's errors (here, OverflowError in every
    worker, as `rate: .inf` raised): the sweep stops with the point's id, no
    traceback, and leaves no 0-byte rows file."""
    from kvspec.sweep import execute

    def overflow(*_: object) -> dict:
        raise OverflowError("cannot convert float infinity to integer")

    monkeypatch.setattr(execute, "evaluate_point", overflow)  # the forked workers' too
    out = tmp_path / "r.jsonl"
    code, _, err = invoke(["sweep", str(grid), "-o", str(out), "-j", "1"])
    assert code == 1, err
    assert "failed: OverflowError: cannot convert float infinity" in err
    assert "Traceback" not in err and "--point" in err
    assert not out.exists()


# -- a killed sweep resumes; Ctrl-C exits 130 ---------------------------------------


def _slow(tmp_path: Path) -> Path:
    (tmp_path / "tiny.yaml").write_text(TINY)
    (tmp_path / "slow.yaml").write_text(SLOW)
    return tmp_path / "slow.yaml"


def _start(grid: Path, out: Path, *args: str) -> subprocess.Popen[str]:
    """The sweep in its own process group (as a shell runs a job), two workers."""
    return subprocess.Popen([sys.executable, "-m", "kvspec", "sweep", str(grid), "-o",
                             str(out), "-j", "2", *args], env=ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)


def _workers(pid: int, want: int = 2, wait_s: float = 60) -> list[int]:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        kids = [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
        if len(kids) >= want:
            return kids
        time.sleep(0.05)
    raise AssertionError(f"the sweep started {kids} workers, not {want}")


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


@linux
def test_a_sweep_whose_parent_is_killed_resumes_at_once(tmp_path: Path) -> None:
    """SIGKILL of the sweep alone (an OOM kill): its workers die with it, none keeps
    the rows' lock, and a rerun a moment later resumes and finishes."""
    grid, out = _slow(tmp_path), tmp_path / "rows.jsonl"
    proc = _start(grid, out, "-q")
    try:
        workers = _workers(proc.pid)
        deadline = time.monotonic() + 60
        while not (out.exists() and out.read_bytes().count(b"\n") >= 1):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        proc.kill()  # the parent only
    finally:
        proc.wait()
    deadline = time.monotonic() + 5
    while any(_alive(w) for w in workers):
        assert time.monotonic() < deadline, f"orphan workers {workers} outlive the sweep"
        time.sleep(0.05)
    partial = out.read_bytes().count(b"\n")
    assert 1 <= partial < 16
    code, _, err = invoke(["sweep", str(grid), "-o", str(out), "-j", "2"])
    assert code == 0, err
    assert f"16 points: {16 - partial} run, {partial} from" in err
    assert len({json.loads(line)["id"] for line in out.read_text().splitlines()}) == 16


@linux
def test_ctrl_c_stops_the_sweep_with_130(tmp_path: Path) -> None:
    """SIGINT to the process group, as a terminal sends it: the sweep says
    'interrupted' and exits 130 at once (not after the points in flight), its
    workers gone, the rows file whole lines only; a rerun resumes."""
    grid, out = _slow(tmp_path), tmp_path / "rows.jsonl"
    proc = _start(grid, out)
    try:
        workers = _workers(proc.pid)
        time.sleep(1.0)  # inside points
        os.killpg(proc.pid, signal.SIGINT)
        start = time.monotonic()
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err
    assert time.monotonic() - start < 5
    assert "kvspec: error: interrupted" in err and "Traceback" not in err
    assert not any(_alive(w) for w in workers)
    data = out.read_bytes() if out.exists() else b""
    assert data == b"" or data.endswith(b"\n")
    for line in data.splitlines():
        assert json.loads(line)["id"]


# -- --ray: a bad address is refused clearly, an unreachable one within seconds -----


@pytest.mark.parametrize(("address", "why"), [
    ("not-an-address", "no port"), ("host:99999", "port 99999 is not one of 1 to 65535"),
    ("http://head:6379", "Ray takes ray:// addresses, not http://"),
    ("under_score:6379", "'under_score' is not a host name"), ("ray://", "not an address"),
    ("head:port", "not an address")])
def test_a_bad_ray_address_is_refused(bad_grid: Path, address: str, why: str) -> None:
    code, _, err = invoke(["sweep", str(bad_grid), "--ray", address])
    assert code == 2, err
    assert err.startswith(f"kvspec: error: --ray {address!r}: {why}"), err
    assert "auto" in err and "HOST:PORT" in err and "ray://HOST:PORT" in err
    assert "Traceback" not in err


def test_good_ray_addresses() -> None:
    assert ray_target("local").address is None
    assert ray_target("auto").address == "auto"
    assert ray_target("10.0.0.5:6379").address == "10.0.0.5:6379"
    assert ray_target("ray://head:10001").address == "ray://head:10001"
    assert ray_target("ray://head").address == "ray://head:10001"
    assert ray_target("[::1]:6379").address == "[::1]:6379"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@needs_ray
def test_an_address_nothing_listens_at_fails_in_seconds(bad_grid: Path) -> None:
    port = _closed_port()
    start = time.monotonic()
    code, _, err = invoke(["sweep", str(bad_grid), "--ray", f"127.0.0.1:{port}"])
    assert code == 2, err
    assert time.monotonic() - start < 5
    assert f"--ray 127.0.0.1:{port}: cannot connect (Connection refused)" in err


@needs_ray
def test_ray_client_not_installed_says_what_to_install(
        bad_grid: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvspec.sweep import execute

    monkeypatch.setattr(execute, "_client_installed", lambda: False)
    (bad_grid.parent / "tiny.yaml").write_text(TINY)
    bad_grid.write_text(GRID)
    code, _, err = invoke(["sweep", str(bad_grid), "--ray", "ray://head:10001"])
    assert code == 2, err
    assert "needs Ray Client" in err and "pip install 'kvspec[ray]'" in err


@needs_ray
@linux
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_a_silent_address_gives_up_and_signals_end_it(grid: Path, sig: int) -> None:
    """An address that accepts and never answers (Ray alone would wait 20 s and
    more, deaf to SIGTERM): a signal ends it at once; left alone, the command
    gives up after CONNECT_S seconds. No rows file is left."""
    from kvspec.cli.sweep import CONNECT_S

    out = grid.parent / "rows.jsonl"
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        port = server.getsockname()[1]
        proc = _start(grid, out, "--ray", f"127.0.0.1:{port}")
        try:
            time.sleep(4)  # Python and Ray start, the probe connects, Ray waits
            start = time.monotonic()
            proc.send_signal(sig)
            _, err = proc.communicate(timeout=10)
            assert time.monotonic() - start < 2
            assert proc.returncode == (130 if sig == signal.SIGINT else 143), err
            assert ("interrupted" if sig == signal.SIGINT else "terminated") in err
            if sig == signal.SIGTERM:  # the deadline, once
                start = time.monotonic()
                proc = _start(grid, out, "--ray", f"127.0.0.1:{port}")
                _, err = proc.communicate(timeout=CONNECT_S + 30)
                assert proc.returncode == 2, err
                assert f"no Ray cluster answered within {CONNECT_S:g} s" in err
                assert time.monotonic() - start < CONNECT_S + 10
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert not out.exists()


# -- saturation ----------------------------------------------------------------------


def test_a_best_point_that_never_saturated_is_flagged(tmp_path: Path) -> None:
    """50 requests never keep a replica busy: its rate is a lower bound (3 GPUs where
    600 requests of the same traffic measure 2), flagged in the table and the
    report; the saturated one is not."""
    (tmp_path / "tiny.yaml").write_text(TINY)
    (tmp_path / "sat.yaml").write_text(SATURATION)
    out, page = tmp_path / "rows.jsonl", tmp_path / "sat.html"
    code, table, err = invoke(["sweep", str(tmp_path / "sat.yaml"), "-o", str(out),
                               "--report", str(page), "-j", "1"])
    assert code == 0, err
    rows = {json.loads(line)["point"]["workload"]: json.loads(line)
            for line in out.read_text().splitlines()}
    assert rows["few"]["saturated"] is False and rows["many"]["saturated"] is True
    assert rows["few"]["gpus"] > rows["many"]["gpus"]
    lines = {line.split()[0]: line for line in table.splitlines() if line[:4] in ("few ", "many")}
    assert lines["few"].split()[-2].endswith("*")
    assert not lines["many"].split()[-2].endswith("*")
    assert "* not saturated:" in table and "lower bound" in table
    html = page.read_text()
    assert html.count('class="unsat"') == 1 and "not saturated:" in html
