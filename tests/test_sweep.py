"""``kvspec sweep`` (docs/sweep.md): a 200-point grid run on a local process pool and
on a local Ray instance gives the same rows; a sweep killed with SIGKILL mid-run
resumes to the same rows, none lost or doubled; a torn last line is dropped and its
point run again; bad grids fail before anything runs, each error at its line and
column (goldens in ``tests/errors/sweep/``); the report holds at 1280, 800 and 390
px in headless Chromium.

The Ray test needs ``kvspec[ray]`` (ray 2.60.0) and skips, saying so, without it;
it starts a local instance of two CPUs (about 10 s of start-up)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvspec.sweep import parse_grid, plan_sweep
from kvspec.sweep.constraints import ConstraintError, parse_constraint
from kvspec.sweep.execute import Results, results_file, run_sweep
from kvspec.sweep.report import best_rows, csv_text, pareto
from tests.conftest import ROOT, check_golden, invoke

try:
    import ray
except ImportError:
    ray = None

needs_ray = pytest.mark.skipif(ray is None, reason="Ray is not installed (pip install "
                               "'kvspec[ray]', ray 2.60.0): the --ray path is not tested")

#: A small model: eight full-attention layers, 8K context (a point compiles and
#: simulates in tens of milliseconds).
TINY = """\
kvspec: 1
name: tiny
layer_name: "model.layers.{index}.self_attn.attn"
engine: {block_size: 16, max_model_len: 8192, memory: 1GiB}
parallel: {tensor: 1}
defaults: {num_kv_heads: 8, head_size: 128, dtype: bfloat16}
layer_types:
  attn: {kind: full_attention}
layers:
  - {repeat: 8, pattern: [attn]}
"""

#: 5 x 2 x 2 x 2 values x 5 workloads = 200 points; 128MiB cannot hold one request at
#: max_model_len (error rows), workload d has prompts past it (refused: no GPUs).
GRID = """\
kvspec_sweep: 1
base: tiny.yaml
axes:
  memory: [128MiB, 256MiB, 512MiB, 1GiB, 2GiB]
  tensor: [1, 2]
  kv_cache_dtype: [auto, fp8]
  block_size: [16, 32]
  workload:
    - {name: a, context_tokens: 1024, output_tokens: 64, requests: 24, seed: 1}
    - {name: b, context_tokens: 2048, output_tokens: 32, requests: 24, seed: 2}
    - {name: c, context_tokens: 256, output_tokens: 128, requests: 24, seed: 3}
    - {name: d, context_tokens: 4096, output_tokens: 16, requests: 16, seed: 4}
    - {name: e, trace: e.jsonl}
constraints: ["tensor * 2 <= 4"]
target: {rate: 10, step_ms: {1: 30, 2: 20}}
"""


@pytest.fixture(scope="module")
def grid_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from kvspec.sim import generate_trace, write_trace

    d = tmp_path_factory.mktemp("sweep")
    (d / "tiny.yaml").write_text(TINY)
    (d / "grid.yaml").write_text(GRID)
    write_trace(generate_trace(16, seed=5, prompt_mean=512, output_mean=256), d / "e.jsonl")
    return d


def _rows(path: Path) -> list[str]:
    return sorted(path.read_text().splitlines())


@pytest.fixture(scope="module")
def local_rows(grid_dir: Path) -> list[str]:
    """The 200-point grid on a local pool of two workers."""
    out = grid_dir / "local.jsonl"
    code, _, err = invoke(["sweep", str(grid_dir / "grid.yaml"), "-o", str(out), "-j", "2"])
    assert code == 0, err
    return _rows(out)


def test_the_grid_has_200_points_each_a_row(grid_dir: Path, local_rows: list[str]) -> None:
    rows = [json.loads(r) for r in local_rows]
    assert len(rows) == 200 == len({r["id"] for r in rows})
    errors = [r for r in rows if not r["ok"]]
    # one request at 8K takes 256MiB per rank in bf16 on one rank: 128MiB and 256MiB
    # (less the null block) fail there, each point a row with its error, placed at
    # the memory value in the grid file
    assert errors and all(r["point"]["memory"] <= 256 * 2**20 for r in errors)
    assert {r["point"]["memory"] for r in errors} == {128 * 2**20, 256 * 2**20}
    for r in errors:
        e = r["error"]
        assert e["type"] == "NotEnoughMemoryError" and e["file"].endswith("grid.yaml")
        first = r["point"]["memory"] == 128 * 2**20
        assert (e["line"], e["column"], e["path"]) == \
            (4, 12 if first else 20, f"axes.memory[{0 if first else 1}]")
    ok = [r for r in rows if r["ok"]]
    assert all(len(r["sha256"]) == 64 and r["simulated"]["steps"] > 0 for r in ok)
    # fp8 halves the bytes of a block: twice the blocks at the same memory
    by = {(r["point"]["memory"], r["point"]["tensor"], r["point"]["block_size"],
           r["point"]["workload"], r["point"]["kv_cache_dtype"]): r for r in ok}
    for (mem, tp, bs, w, dt), r in by.items():
        if dt == "auto" and (mem, tp, bs, w, "fp8") in by:
            fp8 = by[mem, tp, bs, w, "fp8"]
            assert fp8["blocks"]["device"] > r["blocks"]["device"]
    # workload d has prompts of max_model_len or more: refused, so no GPU count serves it
    assert all(r["gpus"] is None for r in ok if r["point"]["workload"] == "d")
    assert all(r["simulated"]["refused"] > 0 for r in ok if r["point"]["workload"] == "d")
    # GPUs = replicas x ranks, replicas = ceil(rate / throughput)
    for r in ok:
        if r["gpus"] is not None:
            assert r["gpus"] == r["replicas"] * r["point"]["tensor"]
            assert (r["replicas"] - 1) * r["throughput"] < 10 <= r["replicas"] * r["throughput"]


def test_a_point_reproduces_its_row(grid_dir: Path, local_rows: list[str]) -> None:
    row = json.loads(next(r for r in local_rows if '"ok": true' in r))
    code, out, err = invoke(["sweep", str(grid_dir / "grid.yaml"), "--point", row["id"]])
    assert code == 0, err
    assert json.loads(out) == row


def test_a_rerun_runs_nothing(grid_dir: Path, local_rows: list[str]) -> None:
    out = grid_dir / "local.jsonl"
    code, _, err = invoke(["sweep", str(grid_dir / "grid.yaml"), "-o", str(out)])
    assert code == 0 and "200 points: 0 run, 200 from" in err
    assert _rows(out) == local_rows


@needs_ray
def test_ray_gives_the_same_rows(grid_dir: Path, local_rows: list[str]) -> None:
    assert ray is not None
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    try:
        out = grid_dir / "ray.jsonl"
        code, _, err = invoke(["sweep", str(grid_dir / "grid.yaml"), "-o", str(out), "--ray"])
        assert code == 0, err
        assert _rows(out) == local_rows
    finally:
        ray.shutdown()


def test_a_killed_sweep_resumes_to_the_same_rows(grid_dir: Path, local_rows: list[str]
                                                 ) -> None:
    out = grid_dir / "killed.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "kvspec", "sweep", str(grid_dir / "grid.yaml"), "-o",
           str(out), "-j", "1", "-q"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if out.exists() and out.read_bytes().count(b"\n") >= 30:
                break
            time.sleep(0.005)
        assert proc.poll() is None, "the sweep finished before it could be killed"
        os.killpg(proc.pid, signal.SIGKILL)  # the pool's workers too
    finally:
        proc.wait()
    partial = out.read_bytes()
    assert 30 <= partial.count(b"\n") < 200
    # a torn last line, as a kill mid-write leaves: dropped, and its point run again
    out.write_bytes(partial + b'{"id": "torn", "point": {')
    code, _, err = invoke(["sweep", str(grid_dir / "grid.yaml"), "-o", str(out), "-j", "1"])
    assert code == 0, err
    assert "dropped a torn last line" in err
    assert _rows(out) == local_rows


def test_results_file_drops_a_torn_line_and_never_doubles(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_bytes(b'{"id": "a", "ok": true, "point": {}}\n{"id": "b", "ok": tr')
    with results_file(path) as res:
        assert set(res.rows) == {"a"} and res.dropped == 1
        res.append({"id": "a", "ok": True, "point": {}})  # already there: not written
        res.append({"id": "c", "ok": True, "point": {}})
    assert path.read_text().splitlines() == ['{"id": "a", "ok": true, "point": {}}',
                                             '{"id": "c", "ok": true, "point": {}}']
    with results_file(path), pytest.raises(Exception, match="another sweep"):
        Results(path).open()
    # a bad line before the last is not a torn write: refused, nothing cut
    path.write_bytes(b'{"id": "a", "ok": true, "point": {}}\nnot json\n'
                     b'{"id": "c", "ok": true, "point": {}}\n')
    with pytest.raises(Exception, match=r"r\.jsonl:2: error: not a row"):
        Results(path).open()
    assert path.read_bytes().count(b"\n") == 3


def test_constraints_are_parsed_not_evaluated() -> None:
    c = parse_constraint("1 < tensor * pipeline <= 8 and memory >= 80GiB",
                         {"tensor", "pipeline", "memory"})
    assert c.names == {"tensor", "pipeline", "memory"}
    assert c.holds({"tensor": 2, "pipeline": 2, "memory": 80 * 2**30})
    assert not c.holds({"tensor": 1, "pipeline": 1, "memory": 80 * 2**30})
    assert not c.holds({"tensor": 8, "pipeline": 2, "memory": 80 * 2**30})
    for bad in ("__import__('os')", "tensor <= 8; pipeline", "tensor", "tensor <= (8"):
        with pytest.raises(ConstraintError):
            parse_constraint(bad, {"tensor", "pipeline"})


def test_best_and_front_do_not_depend_on_row_order(local_rows: list[str]) -> None:
    rows = [json.loads(r) for r in local_rows]
    def ids(found: list[dict]) -> list[str]:
        return sorted(r["id"] for r in found)

    assert ids(best_rows(rows)) == ids(best_rows(rows[::-1]))
    assert ids(pareto(rows)) == ids(pareto(rows[::-1]))
    best = best_rows(rows)
    assert [b["point"]["workload"] for b in best] and all(
        b["gpus"] <= r["gpus"] for b in best for r in rows
        if r.get("gpus") is not None and r["point"]["workload"] == b["point"]["workload"])
    text = csv_text(rows)
    assert text.count("\n") == 201 and text.startswith("id,model,memory,tensor")


def test_a_config_json_model_gets_each_tensor_size_from_init(tmp_path: Path) -> None:
    """An HF config: each tensor size's source is the one ``kvspec init`` writes,
    and gpu_memory leaves the KV cache what the weights do not take."""
    (tmp_path / "g.yaml").write_text(f"""\
kvspec_sweep: 1
base: {{hf: {ROOT}/tests/data/hf/llama-3.1-8b.json, weights: 16GB, max_model_len: 8192}}
axes:
  gpu_memory: [24GiB, 80GiB]
  tensor: [1, 2]
  workload: [{{name: w, context_tokens: 512, output_tokens: 32, requests: 8}}]
target: {{rate: 5, step_ms: 25}}
""")
    sweep = plan_sweep(parse_grid((tmp_path / "g.yaml").read_text(), str(tmp_path / "g.yaml")))
    assert len(sweep.points) == 4
    p = next(p for p in sweep.points if p.params["tensor"] == 2
             and p.params["gpu_memory"] == 80 * 2**30)
    assert p.source is not None and "tensor: 2" in p.source
    # 80GiB x 0.9 - 8GB of weights per rank
    assert f"memory: {int(80 * 2**30 * 0.9) - 8 * 10**9}" in p.source
    with results_file(tmp_path / "r.jsonl") as res:
        run_sweep(sweep, res, jobs=1)
        assert all(r["ok"] for r in res.rows.values())


ERRORS = sorted((ROOT / "tests" / "errors" / "sweep").glob("*.yaml"))


@pytest.mark.parametrize("grid", ERRORS, ids=lambda p: p.stem)
def test_bad_grids_fail_before_anything_runs(grid: Path, tmp_path: Path) -> None:
    rel = str(grid.relative_to(ROOT))
    out = tmp_path / "never.jsonl"
    code, _, err = invoke(["sweep", rel, "-o", str(out)])
    check_golden(grid.with_suffix(".expected"), f"{code}\n{err}")
    assert code == 1 and err.startswith(rel) and "Traceback" not in err
    assert not out.exists(), "nothing ran: no results file"


@pytest.fixture(scope="module")
def report_page(grid_dir: Path, local_rows: list[str]) -> Path:
    page = grid_dir / "sweep.html"
    code, _, err = invoke(["sweep", str(grid_dir / "grid.yaml"), "-o",
                           str(grid_dir / "local.jsonl"), "--report", str(page)])
    assert code == 0, err
    return page


def test_the_report_links_each_front_point_to_its_command(report_page: Path,
                                                          local_rows: list[str]) -> None:
    html = report_page.read_text()
    rows = [json.loads(r) for r in local_rows]
    for r in pareto(rows):
        assert f'id="p-{r["id"]}"' in html and f'href="#p-{r["id"]}"' in html
        assert f"--point&nbsp;{r['id']}" in html or f"--point {r['id']}" in html
    for b in best_rows(rows):
        assert f'href="#p-{b["id"]}"' in html


def _measure_script() -> str:
    """explain's measuring script (tests/test_html_report.py) without the block
    picture's parts, which a sweep report has none of."""
    from tests.test_html_report import MEASURE

    return MEASURE.split("  const block = shown")[0] + "  return out;\n})()\n"


def test_the_report_at_every_width(report_page: Path, tmp_path: Path) -> None:
    """At 1280, 800 and 390 px: the page never scrolls sideways, every box holds its
    content, no SVG text leaves its picture; at 1280 and 390 nothing scrolls at all,
    and a phone gets the narrow chart at its own size. Screenshots are taken at each
    width (``KVSPEC_SCREENSHOTS=DIR`` keeps them)."""
    import base64

    from tests.test_html_report import CHROMIUM, NO_SCROLL, PHONE, WIDTHS, DevTools

    if CHROMIUM is None:
        pytest.skip("headless Chromium is not installed (apt-get install -y chromium; "
                    "CI's .ci/run installs it)")
    keep = Path(os.environ.get("KVSPEC_SCREENSHOTS") or tmp_path)
    keep.mkdir(parents=True, exist_ok=True)
    browser = DevTools(CHROMIUM, tmp_path / "profile", tmp_path / "chromium.log")
    try:
        target = browser.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        sid = browser.call("Target.attachToTarget", {"targetId": target, "flatten": True}
                           )["sessionId"]
        browser.call("Page.enable", session=sid)
        for width in WIDTHS:
            browser.call("Emulation.setDeviceMetricsOverride", {
                "width": width, "height": 900, "deviceScaleFactor": 1,
                "mobile": width == PHONE}, session=sid)
            browser.call("Page.navigate", {"url": report_page.as_uri()}, session=sid)
            browser.wait("Page.loadEventFired", sid)
            res = browser.call("Runtime.evaluate", {"expression": _measure_script(),
                               "awaitPromise": True, "returnByValue": True}, session=sid)
            assert "exceptionDetails" not in res, res
            m = res["result"]["value"]
            assert m["doc"][0] <= m["doc"][1], (width, "the page scrolls sideways")
            assert not m["over"], (width, m["over"][:5])
            assert not m["clipped"], (width, m["clipped"][:5])
            assert not m["svg"], (width, m["svg"][:5])
            if width in NO_SCROLL:
                assert not m["scrolled"], (width, m["scrolled"][:5])
            charts = [p for p in m["pictures"] if "chart" in (p["cls"] or "")]
            assert charts and all(("narrow" in p["cls"]) == (width == PHONE) for p in charts)
            if width == PHONE:
                assert all(abs(p["scale"] - 1) < 0.01 for p in charts)
            size = browser.call("Page.getLayoutMetrics", session=sid)["cssContentSize"]
            shot = browser.call("Page.captureScreenshot", {
                "format": "png", "captureBeyondViewport": True, "clip": {
                    "x": 0, "y": 0, "width": width, "height": size["height"], "scale": 1}},
                session=sid)
            png = base64.b64decode(shot["data"])
            assert png[:8] == b"\x89PNG\r\n\x1a\n"
            (keep / f"sweep-{width}.png").write_bytes(png)
    finally:
        browser.close()


def test_the_committed_grid_schema_is_generated() -> None:
    from kvspec.reports.schemas import render
    from kvspec.sweep.grid import grid_schema

    assert (ROOT / "schemas" / "sweep.schema.json").read_text() == render(grid_schema()), \
        "regenerate schemas/sweep.schema.json from kvspec.sweep.grid.grid_schema"


def test_an_editor_checks_a_grid_as_kvspec_does(grid_dir: Path) -> None:
    """The schema takes the grids kvspec takes, and refuses an unknown axis."""
    jsonschema = pytest.importorskip("jsonschema")
    import yaml

    schema = json.loads((ROOT / "schemas" / "sweep.schema.json").read_text())
    jsonschema.validate(yaml.safe_load((grid_dir / "grid.yaml").read_text()), schema)
    bad = yaml.safe_load((ROOT / "tests/errors/sweep/unknown-axis.yaml").read_text())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


def test_the_benchmark_runs() -> None:
    """A smoke run of benchmarks/bench_sweep.py at a tiny size: its report is whole
    and the rows are the same every way (no timing is compared)."""
    out = subprocess.run([sys.executable, "benchmarks/bench_sweep.py", "--points", "4",
                          "--requests", "20", "--ray", "off"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, check=True).stdout
    assert "4 points of 20 requests each" in out
    assert "local pool, 2 workers" in out and "rows identical every way: True" in out


def test_a_policy_that_chooses_by_a_workload_gets_the_points(grid_dir: Path) -> None:
    """``pooling.policy: auto`` over a source that declares no workload: each point's
    source carries its own workload (a summary as such, a trace by its path)."""
    text = GRID.replace("  block_size: [16, 32]\n", "  pooling.policy: [unified, auto]\n")
    sweep = plan_sweep(parse_grid(text, str(grid_dir / "grid.yaml")))
    auto = [p for p in sweep.points if p.params["pooling.policy"] == "auto"]
    assert auto and all(p.source is not None and "workload:" in p.source for p in auto)
    a = next(p for p in auto if p.params["workload"] == "a")
    e = next(p for p in auto if p.params["workload"] == "e")
    assert "mean: 1024" in a.source or "context_tokens: 1024" in a.source  # type: ignore[operator]
    assert str((grid_dir / "e.jsonl").resolve()) in e.source  # type: ignore[operator]
    unified = [p for p in sweep.points if p.params["pooling.policy"] == "unified"]
    assert all("workload:" not in (p.source or "") for p in unified)


@pytest.mark.parametrize("left", [b"", b'{"binding_pool": "dev'], ids=["empty", "torn-first"])
def test_a_sweep_stopped_before_its_first_row_resumes(tmp_path: Path, left: bytes) -> None:
    (tmp_path / "tiny.yaml").write_text(TINY)
    text = GRID.replace("  memory: [128MiB, 256MiB, 512MiB, 1GiB, 2GiB]\n", "").replace(
        "    - {name: e, trace: e.jsonl}\n", "")
    (tmp_path / "grid.yaml").write_text(text)
    out = tmp_path / "r.jsonl"
    out.write_bytes(left)
    code, _, err = invoke(["sweep", str(tmp_path / "grid.yaml"), "-o", str(out), "-j", "1"])
    assert code == 0, err
    assert len(out.read_text().splitlines()) == 32

