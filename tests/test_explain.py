"""``kvspec explain``: the report through the CLI (exit codes, key lines), the
waste breakdown on hybrid layouts, the HTML page in headless Chromium."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from kvspec.cli import cli
from tests.conftest import CONFORMANCE, REGEN, ROOT, invoke

LLAMA = "layouts/llama-3.1-8b.yaml"
LLAMA_ART = "layouts/llama-3.1-8b.kvlayout.json"
SCREENSHOT = ROOT / "docs" / "screenshots" / "explain-gemma-2.png"
#: Conformance cases imported as sources for these tests (hybrid ones mostly).
CASES = ("gemma-2-9b-tp1", "jamba-v0.1-tp1", "syn-glm5-next", "syn-packed-blhnc",
         "syn-stride-alignment", "syn-pp2", "synthetic-mamba-hybrid", "syn-hidden-state",
         "deepseek-v3-tp8")

PADDING_SLOTS = """\
kvspec: 1
name: padslots
layer_name: "model.layers.{index}.self_attn.attn"
engine: {block_size: 16, max_model_len: 32768, memory: 16GiB}
defaults: {num_kv_heads: 8, head_size: 128, dtype: bfloat16}
layer_types:
  local: {kind: sliding_window, sliding_window: 1024}
  global: {kind: full_attention}
layers:
  - {repeat: 2, pattern: [local, local, local, global, global]}
"""


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Sources imported from the conformance dumps (``kvspec import``), with their
    compiled artifacts beside them."""
    from click.testing import CliRunner

    out = tmp_path_factory.mktemp("cases")
    runner = CliRunner()
    paths = {}
    for case in CASES:
        src = out / f"{case}.yaml"
        res = runner.invoke(cli, ["import", str(CONFORMANCE / "cases" / f"{case}.json"),
                                  "-o", str(src)])
        assert res.exit_code == 0, res.output
        res = runner.invoke(cli, ["compile", str(src), "-q"])
        assert res.exit_code == 0, res.output
        paths[case] = src
    pad = out / "padslots.yaml"
    pad.write_text(PADDING_SLOTS)
    paths["padslots"] = pad
    return paths


def _art(src: Path) -> Path:
    return src.with_name(src.name.removesuffix(".yaml") + ".kvlayout.json")


def explain(runner, *args: str):
    return runner.invoke(cli, ["explain", *map(str, args)])


# ---------------------------------------------------------------------------
# text
# ---------------------------------------------------------------------------


def test_llama_text_report(runner) -> None:
    res = explain(runner, LLAMA)
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0] == "llama-3.1-8b (meta-llama/Llama-3.1-8B-Instruct): KV-cache layout report"
    assert lines[1].startswith("source layouts/llama-3.1-8b.yaml, kvspec ")
    for line in (
        "GROUPS (1; a group shares one block table)",
        "   0  full_attention      32     16  64 KiB  -             8,192",
        "    0  model.layers.{0..31}.self_attn.attn",
        "  device      32   2.00 MiB  20,480  40.00 GiB",
        "    = 32 slots x 64.00 KiB",
        "  for 40.00 GiB per rank: 20,480 blocks, 327,680 KV tokens,",
        "  max concurrency 2.50x at 131,072 tokens",
        "  one request at max_model_len: 16.00 GiB, at least 8,193 blocks",
        "  16.00 GiB      8,193       131,088       1.00x        131,072",
        "  160.00 GiB    81,920     1,310,720      10.00x        131,072",
        "  total                0 B   0.0%",
        "WARNINGS",
        "  none",
    ):
        assert line in lines, line
    assert max(len(line) for line in lines) <= 80


def test_artifact_and_source_agree(runner) -> None:
    src = explain(runner, LLAMA, "--memory", "80GiB")
    art = explain(runner, LLAMA_ART, "--memory", "80GiB")
    assert src.exit_code == art.exit_code == 0
    line = "  for 80.00 GiB per rank: 40,960 blocks, 655,360 KV tokens,"
    assert line in src.stdout.splitlines() and line in art.stdout.splitlines()
    # Everything but the header (which names the file) is the same.
    assert src.stdout.split("\n", 2)[2] == art.stdout.split("\n", 2)[2]


@pytest.mark.parametrize("case", CASES + ("padslots",))
def test_text_fits_a_terminal(runner, cases, case, monkeypatch) -> None:
    monkeypatch.chdir(cases[case].parent)
    res = explain(runner, cases[case].name)
    assert res.exit_code == 0, res.output
    wide = [line for line in res.stdout.splitlines() if len(line) > 80]
    assert wide == []


def test_budget_that_does_not_fit_still_reports(runner) -> None:
    res = explain(runner, LLAMA, "--memory", "8GiB")
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert "  8.00 GiB does not serve one request at max_model_len 131,072" in out
    assert "  - budget 8.00 GiB: To serve at least one request with the model's max seq" in out
    assert "  device      32   2.00 MiB       -      -" in out


def test_hybrid_groups_and_layer_ranges(runner, cases) -> None:
    res = explain(runner, cases["gemma-2-9b-tp1"])
    assert res.exit_code == 0
    lines = res.stdout.splitlines()
    assert "    0  model.layers.{0..40 step 2}.self_attn.attn" in lines
    assert "    1  model.layers.{1..41 step 2}.self_attn.attn" in lines
    assert "  slot i of every group is the same bytes; one group holds a block at a time" \
        in lines
    assert "  group 1  |" + "#" * 56 + "|" in lines


# ---------------------------------------------------------------------------
# waste, by cause
# ---------------------------------------------------------------------------


def _waste(report) -> dict[str, str]:
    return {w.cause: f"{w.share:.1%}" for w in report.waste_weighted}


def test_waste_padding_slots(cases) -> None:
    from kvspec.reports.explain import explain

    rep = explain(cases["padslots"])
    assert [g.padding_slots for g in rep.groups] == [1, 1, 0]
    assert _waste(rep) == {"padding slots": "12.9%", "padded pages": "0.0%", "alignment": "0.0%"}
    g0 = rep.groups[0]
    assert (g0.useful_bytes, g0.waste.padding_slots, g0.waste.total) == (196608, 65536, 65536)
    assert [w.message for w in rep.warnings] == [
        "Add 2 padding layers, may waste at most 33.33% KV cache memory",
        "padding wastes 12.9% of the blocks a full-length request holds"]


def test_waste_padded_pages(runner, cases) -> None:
    from kvspec.reports.explain import explain as build

    rep = build(cases["jamba-v0.1-tp1"])
    assert _waste(rep) == {"padding slots": "0.0%", "padded pages": "78.9%", "alignment": "0.0%"}
    attn = rep.groups[7]
    assert attn.pages == ((311296, 65536),)
    assert attn.waste.padded_pages == 4 * (311296 - 65536)
    res = explain(runner, cases["jamba-v0.1-tp1"])
    assert res.exit_code == 0
    assert "   7  full_attention       4       16  304 KiB  +240 KiB       8,192" \
        in res.stdout.splitlines()
    # the compiler's early check, as the artifact carries it
    assert "  - group 7 (FullAttentionSpec, 4 layers) leaves 79% of each block it holds" \
        in res.stdout.splitlines()


def test_waste_alignment(cases) -> None:
    from kvspec.reports.explain import explain

    rep = explain(cases["syn-stride-alignment"])
    assert rep.waste.alignment == 3072
    assert _waste(rep) == {"padding slots": "0.0%", "padded pages": "0.0%", "alignment": "1.5%"}
    assert rep.slot_summary == "8 slots of 2 sizes (8.25 KiB, 41.00 KiB) + 3.00 KiB alignment"


def test_packed_groups_leave_slots_empty(cases) -> None:
    from kvspec.reports.explain import explain

    rep = explain(cases["syn-packed-blhnc"])
    assert rep.engine.axis_order.name == "BLHNC"
    assert [g.waste.padding_slots for g in rep.groups] == [131072, 131072, 131072, 0]
    assert rep.groups[3].pages == ((65536, 65536), (32768, 32768))


def test_aliasing_layout_with_a_drafter_pool(runner, cases) -> None:
    res = explain(runner, cases["syn-glm5-next"])
    assert res.exit_code == 0
    lines = res.stdout.splitlines()
    for line in ("   0  mla_attention        12    512  328 KiB/16.5 KiB  -                 256",
                 "   2  mamba                 6    512           328 KiB  +176 KiB            2",
                 "   5  sliding_window*       1    256             1 MiB  -                  73",
                 "  * a pool of its own, outside the main pool's blocks",
                 "  device      36   2.02 MiB   2,773  5.47 GiB",
                 "  draft        1   1.00 MiB   2,593  2.53 GiB",
                 "       model.layers.{3..23 step 4}.self_attn.indexer.k_cache"):
        assert line in lines, line


@pytest.mark.parametrize("case", CASES + ("padslots",))
def test_block_accounting(cases, case) -> None:
    """useful + padded pages + padding slots + alignment = bytes per block, per
    group; the per-layer pages agree with the compiler's useful bytes."""
    from kvspec.reports.explain import block_map, read_subject

    layout = read_subject(cases[case]).view
    bm = block_map(layout, 0)
    assert bm.used <= bm.bytes_per_block
    single_stage = len(layout.stages) == 1
    for gid, g in enumerate(layout.groups):
        segs = bm.of(gid)
        if g.own_pool:
            assert segs == ()
            continue
        useful = sum(s.useful for s in segs)
        w = bm.waste(gid)
        assert useful + w.total == bm.bytes_per_block
        assert min(w.padding_slots, w.padded_pages, w.alignment) >= 0
        if single_stage:
            assert useful == layout.body.groups[gid].useful_bytes_per_block
        # no two layers of one group share bytes
        spans = sorted((s.start, s.end) for s in segs)
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))


@pytest.mark.parametrize("case", CASES)
def test_artifact_capacity_matches_the_planner(cases, case) -> None:
    """Re-sizing an artifact gives what re-planning its source gives."""
    from kvspec.reports.explain import capacity, read_subject

    src = read_subject(cases[case])
    art = read_subject(_art(cases[case]), replanned=False)
    for memory in (src.memory, 3 * src.memory, src.memory // 3):
        a, b = capacity(src, memory), capacity(art, memory)
        assert (a.fits, a.num_blocks, a.kv_tokens, a.max_model_len) == \
            (b.fits, b.num_blocks, b.kv_tokens, b.max_model_len)


def test_state_slots_below_max_num_seqs(runner, cases, tmp_path) -> None:
    text = cases["synthetic-mamba-hybrid"].read_text().replace("max_num_seqs: 256",
                                                               "max_num_seqs: 2048")
    src = tmp_path / "mamba.yaml"
    src.write_text(text)
    res = explain(runner, src)
    assert res.exit_code == 0
    # the planner's early check, made for the report's budget
    assert "  - state layers hold 1333 requests' states at once in 4002 blocks (3 state" \
        in res.stdout.splitlines()
    assert res.stdout.count("state layers hold") == 1
    # a larger budget has the slots
    res = explain(runner, src, "--memory", "32GiB")
    assert "state layers hold" not in res.stdout
    # more sequences than blocks: vLLM refuses to start (its CUDA-graph check)
    src.write_text(text.replace("max_num_seqs: 2048", "max_num_seqs: 5000"))
    res = explain(runner, src)
    assert "max_num_seqs 5000 is more than the pool's 4002 blocks: vLLM 0.33.0 refuses" \
        in res.stdout.replace("\n    ", " ")
    assert "state layers hold" not in res.stdout


def test_pipeline_stages_are_noted(runner, cases) -> None:
    res = explain(runner, cases["syn-pp2"])
    assert res.exit_code == 0
    assert "  stage 1: 9 layers, 384.00 KiB per block" in res.stdout.splitlines()
    assert "  - 2 pipeline stages: the block picture and the waste are stage 0's; the" \
        in res.stdout.splitlines()


def test_compact_layers() -> None:
    from kvspec.reports.explain import compact_layers

    assert compact_layers([f"l.{i}.a" for i in (0, 1, 2, 3, 5, 7, 9, 12)]) == \
        ("l.{0..3,5..9 step 2,12}.a",)
    assert compact_layers(["x.3.k", "x.3.v", "y"]) == ("x.3.k", "x.3.v", "y")


# ---------------------------------------------------------------------------
# markdown, html, output files, errors
# ---------------------------------------------------------------------------


def test_markdown(runner, cases) -> None:
    res = explain(runner, cases["padslots"], "--format", "md")
    assert res.exit_code == 0
    lines = res.stdout.splitlines()
    assert lines[0] == "### KV-cache layout: `padslots`"
    assert ("| 0 | `sliding_window` | 3 | 16 | 64 KiB | 1 slot | 1,089 | "
            "`model.layers.{0,2,6}.self_attn.attn` |") in lines
    assert "> [!WARNING]" in lines
    assert "| **total** | **32.98 KiB** | **12.9%** |  |" in lines


def test_html_is_self_contained_and_escaped(runner, tmp_path) -> None:
    out = tmp_path / "report.html"
    res = explain(runner, LLAMA, "-o", out)  # format from the suffix
    assert res.exit_code == 0
    assert res.stdout == ""
    html = out.read_text()
    assert html.startswith("<!DOCTYPE html>")
    assert html.count("<svg") == 4   # the block and the chart, each for a laptop and a phone
    # nothing is fetched: the only URL is the SVG namespace
    assert set(re.findall(r"https?://[^\s\"')]+", html)) == {"http://www.w3.org/2000/svg"}
    assert not re.search(r"<(script|link|img|iframe)\b|@import|src=", html)

    from kvspec.reports.explain import explain as build
    from kvspec.reports.explain import render

    rep = dataclasses.replace(build(LLAMA), name="<script>alert(1)</script>")
    page = render(rep, "html")
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_templates_reject_undefined_names() -> None:
    import jinja2

    from kvspec.reports.explain import environment

    with pytest.raises(jinja2.UndefinedError):
        environment().from_string("{{ nope }}").render()


def test_output_file_is_written_atomically(runner, tmp_path) -> None:
    out = tmp_path / "r" / "report.md"
    res = explain(runner, LLAMA, "-o", out, "--parents")
    assert res.exit_code == 0
    assert out.read_text().startswith("### KV-cache layout: `llama-3.1-8b`")
    assert [p.name for p in out.parent.iterdir()] == ["report.md"]  # no temporary left


def test_errors_exit_codes() -> None:
    code, out, err = invoke(["explain", "no/such/file.yaml"])
    assert (code, out) == (1, "")
    assert err.startswith("no/such/file.yaml: error: no such file")
    code, out, err = invoke(["explain", LLAMA, "--memory", "lots"])
    assert code == 2 and "--memory: cannot read 'lots' as a size" in err
    code, _, err = invoke(["explain", LLAMA, "--format", "pdf"])
    assert code == 2 and "invalid value for --format: 'pdf' is not a choice" in err
    code, out, err = invoke(["explain", LLAMA])
    assert (code, err) == (0, "") and "GROUPS (1" in out


#: What ``explain ARTIFACT`` never loads: it reads the frozen body (issue 37).
_NOT_LOADED = ("kvspec.planner", "kvspec.passes", "kvspec.compiled", "kvspec.compiler",
               "kvspec.model.plan", "yaml", "pydantic")


@pytest.mark.parametrize("art", [LLAMA_ART, "layouts/pooling-auto.kvlayout.json"])
def test_an_artifact_is_explained_from_its_frozen_body(art) -> None:
    """No re-planning: the report's modules and the early checks read the body."""
    code = ("import sys; from kvspec.cli import main\n"
            f"sys.argv = ['kvspec', 'explain', {art!r}, '--memory', '80GiB', '--format', 'html']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            f"print(sorted(m for m in sys.modules if m.startswith({_NOT_LOADED!r})), "
            "file=sys.stderr)")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)
    assert run.stderr.strip().splitlines()[-1] == "[]", run.stderr
    assert "KV-cache layout report</title>" in run.stdout


def test_corrupt_artifact(tmp_path) -> None:
    """An edited artifact fails the checks ``load`` makes when it is read: a clean
    error, exit 1. Proving the body by re-planning it is ``check``'s (explain reads
    the frozen body, as every consumer downstream of the compiler does)."""
    from kvspec.compiled import read
    from kvspec.errors import ArtifactError
    from tests.conftest import signature_of as envelope_hash

    data = json.loads((ROOT / LLAMA_ART).read_text())
    data["body"]["name"] = "edited"
    bad = tmp_path / "bad.kvlayout.json"
    bad.write_text(json.dumps(data))
    code, out, err = invoke(["explain", str(bad)])
    assert (code, out) == (1, "")
    assert err.startswith(f"{bad}: error: ") and "does not match its sha256" in err
    assert "Traceback" not in err
    # the hash recomputed: the body is not what its own layers plan to
    data["body"]["groups"][0]["padding_slots"] = 1
    data["sha256"] = envelope_hash(data)
    bad.write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match="not what kvspec plans from its own layers"):
        read(bad)


# ---------------------------------------------------------------------------
# the HTML report in a browser
# ---------------------------------------------------------------------------

CHROMIUM = next((p for p in (os.environ.get("CHROMIUM"), shutil.which("chromium"),
                             shutil.which("chromium-browser"), "/usr/bin/chromium")
                 if p and Path(p).exists()), None)


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", data[16:24])


def screenshot(html: Path, png: Path, profile: Path, size: str = "1280,2200") -> bytes:
    subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--hide-scrollbars", f"--user-data-dir={profile}",
         f"--screenshot={png}", f"--window-size={size}", html.as_uri()],
        check=True, capture_output=True, timeout=120)
    return png.read_bytes()


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed "
                    "(apt-get install -y chromium; CI's .ci/run installs it)")
def test_html_renders_in_headless_chromium(runner, cases, tmp_path, monkeypatch) -> None:
    """The gemma-2 report renders to a non-trivial PNG. ``KVSPEC_REGEN=1`` also
    rewrites the committed screenshot ``docs/screenshots/explain-gemma-2.png``."""
    src = tmp_path / "gemma-2-9b.yaml"
    src.write_text(cases["gemma-2-9b-tp1"].read_text())
    monkeypatch.chdir(tmp_path)  # the report names the source as given
    res = explain(runner, "gemma-2-9b.yaml", "-o", "gemma-2.html")
    assert res.exit_code == 0, res.output
    png = tmp_path / "gemma-2.png"
    data = screenshot(tmp_path / "gemma-2.html", png, tmp_path / "profile")
    assert _png_size(data) == (1280, 2200)
    assert len(data) > 50_000  # text, tables and pictures, not a blank page
    if REGEN:
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(png, SCREENSHOT)


def test_committed_screenshot_exists() -> None:
    data = SCREENSHOT.read_bytes()
    assert _png_size(data)[0] == 1280 and len(data) > 50_000


_HOSTILE = """kvspec: 1
name: "<script>x</script>"
model: "<img src=x onerror=y> *b*"
layer_name: "model.layers.{index}.<i>a`t|n</i>"
engine: {max_model_len: 64}
defaults: {num_kv_heads: 1, head_size: 64, dtype: bfloat16}
layer_types:
  full: {kind: full_attention}
layers:
  - {pattern: [full]}
"""


def test_markdown_shows_names_as_written_never_as_markup(tmp_path: Path) -> None:
    """A name, model or layer name holding HTML, backticks or a pipe is one code
    span (or escaped text) in the Markdown reports: no markup from the source."""
    src = tmp_path / "x.yaml"
    src.write_text(_HOSTILE)
    code, md, err = invoke(["explain", str(src), "--format", "md", "-q"])
    assert code == 0, err
    assert md.startswith("### KV-cache layout: `<script>x</script>` "
                         "(&lt;img src=x onerror=y&gt; \\*b\\*)\n")
    assert "| ``model.layers.0.<i>a`t\\|n</i>`` |" in md
    code, diff, err = invoke(["diff", str(src), str(src), "--format", "md"])
    assert code == 0, err
    assert "| source | `<script>x</script>` |" in diff
    outside = re.sub(r"(`+) ?.*? ?\1", "", md + diff)  # what is not in a code span
    assert "<script" not in outside and "<img" not in outside and "<i>" not in outside
