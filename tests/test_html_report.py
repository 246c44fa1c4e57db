"""The reports at real widths. The HTML report: every layout's report (every ``layouts/*.yaml``)
rendered in headless Chromium at 1280, 800 and 390 px (a phone), checked by measuring
the boxes the browser laid out (``getBoundingClientRect``, ``scrollWidth``), never
pixels; screenshots at each width are taken too (``KVSPEC_SCREENSHOTS=DIR`` keeps them).

What a good report does, and what is tested:

* the page never scrolls sideways (the document is no wider than the viewport);
* every box holds its content: each element and each run of text lies inside its
  parent's box, except directly inside a box made to scroll (``overflow-x: auto``,
  the ``.scroll`` box around each table), and nothing is clipped by ``overflow: hidden``;
* at 1280 px (a laptop window) nothing scrolls at all; at 800 px a wide table may
  scroll inside its own box, never the page; at 390 px (a phone) nothing scrolls: the
  tables are one card per row, every layer name on screen, and the block picture and
  the chart are the ones drawn for a phone, at their own size;
* the block picture's ruler labels do not overlap, its legend entries do not
  overlap, its row labels stay left of the bar, a layer's number fits its page,
  and every SVG text lies inside its picture.

One Chromium runs for the whole module, driven over the DevTools protocol on a pipe
(``--remote-debugging-pipe``: NUL-terminated JSON on file descriptors 3 and 4), so no
Python package beyond the standard library is needed; the viewport is set per width
with ``Emulation.setDeviceMetricsOverride``. Without Chromium the browser tests skip
with the reason; the ruler geometry is also checked without a browser.

The text report: every line of every layout's report fits 80 columns but the title
and the groups' layer names, which are as long as the names (docs/reports.md).
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REGEN, ROOT

CHROMIUM = next((p for p in (os.environ.get("CHROMIUM"), shutil.which("chromium"),
                             shutil.which("chromium-browser"), "/usr/bin/chromium")
                 if p and Path(p).exists()), None)
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="headless Chromium is not installed "
    "(apt-get install -y chromium; CI's .ci/run installs it)")

#: The phone-width screenshot docs/reports.md shows.
PHONE_SHOT = ROOT / "docs" / "screenshots" / "explain-gemma-2-9b-it-390.png"
LAYOUTS = sorted(p.name.removesuffix(".yaml") for p in (ROOT / "layouts").glob("*.yaml"))
WIDTHS = (1280, 800, 390)
#: The widths at which nothing may scroll, not even a table inside its own box: a
#: laptop's window, and a phone's, where tables become one card per row.
NO_SCROLL = (1280, 390)
#: A phone's width (an iPhone's 390 CSS px): the narrow pictures, at their own size.
PHONE = 390
#: Sub-pixel slack for box comparisons.
EPS = 0.5

#: Run in the page after load; returns what the tests compare (boxes as
#: ``[left, right, top, bottom]`` in CSS px).
MEASURE = r"""
(async () => {
  await document.fonts.ready;
  const box = (b) => [b.left, b.right, b.top, b.bottom].map((v) => Math.round(v * 10) / 10);
  const name = (e) => {
    const s = e.closest && e.closest("section, .card, .warn, header, footer");
    const h = s && s.querySelector("h2, .k");
    return e.tagName.toLowerCase() + (e.classList.length ? "." + [...e.classList].join(".") : "")
      + (h ? " in '" + h.textContent.trim() + "'" : "");
  };
  const ox = (e) => getComputedStyle(e).overflowX;
  const scrolls = (e) => ["auto", "scroll"].includes(ox(e));
  const out = {doc: [document.documentElement.scrollWidth, document.documentElement.clientWidth],
               over: [], clipped: [], scrolled: [], svg: []};
  const inside = (what, b, parent) => {
    if (b.width === 0 && b.height === 0) return;
    if (parent === document.body || scrolls(parent)) return;
    const p = parent.getBoundingClientRect();
    if (b.left < p.left - 0.5 || b.right > p.right + 0.5)
      out.over.push({what, box: box(b), parent: name(parent), parent_box: box(p)});
  };
  for (const e of document.body.querySelectorAll("*")) {
    if (e.closest("svg") !== null) continue;
    inside(name(e), e.getBoundingClientRect(), e.parentElement);
    if (e.scrollWidth > e.clientWidth + 0.5) {
      if (scrolls(e))
        out.scrolled.push({what: name(e), scroll: e.scrollWidth, client: e.clientWidth});
      else if (["hidden", "clip"].includes(ox(e)))
        out.clipped.push({what: name(e), scroll: e.scrollWidth, client: e.clientWidth});
    }
  }
  const texts = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let t; (t = texts.nextNode());) {
    if (!t.textContent.trim() || t.parentElement.closest("svg")) continue;
    const r = document.createRange();
    r.selectNodeContents(t);
    inside(JSON.stringify(t.textContent.trim().slice(0, 48)), r.getBoundingClientRect(),
           t.parentElement);
  }
  const texts_of = (svg, sel) => [...svg.querySelectorAll(sel)].map(
    (t) => ({text: t.textContent, box: box(t.getBoundingClientRect())}));
  for (const svg of document.querySelectorAll("svg")) {
    const s = svg.getBoundingClientRect();
    for (const t of svg.querySelectorAll("text")) {
      const b = t.getBoundingClientRect();
      if (b.left < s.left - 0.5 || b.right > s.right + 0.5
          || b.top < s.top - 0.5 || b.bottom > s.bottom + 0.5)
        out.svg.push({text: t.textContent, box: box(b), svg: box(s)});
    }
  }
  const shown = (sel) => [...document.querySelectorAll(sel)].filter(
    (s) => s.getBoundingClientRect().width > 0);
  out.pictures = shown("svg").map((s) => ({cls: s.getAttribute("class"),
    scale: s.getBoundingClientRect().width / s.viewBox.baseVal.width}));
  const block = shown("svg.block")[0];
  const bar = block.querySelector("rect.bar").getBoundingClientRect();
  out.bar = box(bar);
  out.ruler = texts_of(block, ".ruler text");
  out.legend = texts_of(block, ".legend text");
  out.rows = texts_of(block, ".rows text");
  out.pages = [...block.querySelectorAll("rect.pg")].map((r) => box(r.getBoundingClientRect()));
  out.members = [...document.querySelectorAll("td.members div")].filter(
    (d) => d.getBoundingClientRect().width > 0).map((d) => box(d.getBoundingClientRect()));
  out.nums = [...block.querySelectorAll("text.num")].map((t) => ({text: t.textContent,
    box: box(t.getBoundingClientRect()),
    page: box(t.previousElementSibling.getBoundingClientRect())}));
  return out;
})()
"""


class DevTools:
    """One headless Chromium and its DevTools protocol over a pipe."""

    def __init__(self, exe: str, profile: Path, log: Path) -> None:
        cmd_r, self._cmd = os.pipe()   # we write commands, Chromium reads fd 3
        self._events, out_w = os.pipe()  # Chromium writes fd 4, we read
        # above 10, so placing them at 3 and 4 in the child cannot clobber them
        hi_r, hi_w = (fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (cmd_r, out_w))
        os.close(cmd_r)
        os.close(out_w)

        def to_3_and_4() -> None:  # dup2 leaves the copies open across exec
            os.dup2(hi_r, 3)
            os.dup2(hi_w, 4)

        self.log = log
        with log.open("wb") as err:
            self.proc = subprocess.Popen(
                [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync",
                 "--remote-debugging-pipe", f"--user-data-dir={profile}", "about:blank"],
                preexec_fn=to_3_and_4, close_fds=False,  # noqa: PLW1509 - no threads yet stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=err)
        os.close(hi_r)
        os.close(hi_w)
        self._buf, self._id, self._queue = b"", 0, []  # type: ignore[var-annotated]

    def _fail(self, why: str) -> RuntimeError:
        tail = self.log.read_text(errors="replace").strip().splitlines()[-8:]
        return RuntimeError(f"Chromium: {why}; its stderr ends:\n" + "\n".join(tail))

    def _message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._fail("no answer in time")
            if select.select([self._events], [], [], left)[0]:
                chunk = os.read(self._events, 1 << 16)
                if not chunk:
                    raise self._fail("it closed the pipe (crashed or exited)")
                self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 60) -> dict[str, Any]:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._cmd, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            m = self._message(deadline)
            if m.get("id") == self._id:
                if "error" in m:
                    raise self._fail(f"{method}: {m['error']}")
                return m["result"]
            self._queue.append(m)

    def wait(self, event: str, session: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while True:
            while self._queue:
                m = self._queue.pop(0)
                if m.get("method") == event and m.get("sessionId") == session:
                    return
            self._queue.append(self._message(deadline))

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):
            self.call("Browser.close", timeout=10)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._cmd)
        os.close(self._events)


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[int, str], dict]:
    """Every layout's report, measured at every width: ``{(width, layout): boxes}``."""
    from kvspec.reports.explain import explain, render

    if CHROMIUM is None:  # the tests are marked; this guards a direct use
        pytest.skip("headless Chromium is not installed")
    out = tmp_path_factory.mktemp("html")
    pages = {}
    for name in LAYOUTS:
        pages[name] = out / f"{name}.html"
        pages[name].write_text(render(explain(f"layouts/{name}.yaml"), "html"), "utf-8")
    browser = DevTools(CHROMIUM, out / "profile", out / "chromium.log")
    try:
        target = browser.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        sid = browser.call("Target.attachToTarget", {"targetId": target, "flatten": True}
                           )["sessionId"]
        browser.call("Page.enable", session=sid)
        boxes = {}
        for width in WIDTHS:
            browser.call("Emulation.setDeviceMetricsOverride", {
                "width": width, "height": 900, "deviceScaleFactor": 1,
                "mobile": width == PHONE}, session=sid)
            for name, page in pages.items():
                browser.call("Page.navigate", {"url": page.as_uri()}, session=sid)
                browser.wait("Page.loadEventFired", sid)
                res = browser.call("Runtime.evaluate", {
                    "expression": MEASURE, "awaitPromise": True, "returnByValue": True},
                    session=sid)
                if "exceptionDetails" in res:
                    raise AssertionError(f"{name}: the measuring script failed: "
                                         f"{res['exceptionDetails']}")
                boxes[width, name] = res["result"]["value"]
    finally:
        browser.close()
    return boxes


def overlaps(a: list[float], b: list[float]) -> bool:
    """Two ``[left, right, top, bottom]`` boxes share area."""
    return a[0] < b[1] - EPS and b[0] < a[1] - EPS and a[2] < b[3] - EPS and b[2] < a[3] - EPS


def _show(items: list[dict]) -> str:
    return "\n  ".join(json.dumps(i) for i in items[:12])


params = pytest.mark.parametrize("layout", LAYOUTS)
widths = pytest.mark.parametrize("width", WIDTHS)


@needs_chromium
@widths
@params
def test_nothing_overflows(measured, layout: str, width: int) -> None:
    m = measured[width, layout]
    doc_width, viewport = m["doc"]
    assert doc_width <= viewport, f"the page scrolls sideways: {doc_width} px in {viewport} px"
    assert not m["over"], f"boxes overflow their parent:\n  {_show(m['over'])}"
    assert not m["clipped"], f"content is clipped:\n  {_show(m['clipped'])}"
    if width in NO_SCROLL:
        assert not m["scrolled"], f"at {width} px nothing should scroll:\n  {_show(m['scrolled'])}"
    assert all(s["what"].startswith("div.scroll") for s in m["scrolled"]), m["scrolled"]


@needs_chromium
@widths
@params
def test_ruler_labels_do_not_overlap(measured, layout: str, width: int) -> None:
    ruler = measured[width, layout]["ruler"]
    assert len(ruler) >= 2 and ruler[0]["text"] == "0"
    clashes = [(a["text"], a["box"], b["text"], b["box"])
               for i, a in enumerate(ruler) for b in ruler[i + 1:] if overlaps(a["box"], b["box"])]
    assert not clashes, f"ruler labels overlap: {clashes}"
    lefts = [t["box"][0] for t in ruler]
    assert lefts == sorted(lefts)


@needs_chromium
@widths
@params
def test_block_picture_text_stays_in_place(measured, layout: str, width: int) -> None:
    m = measured[width, layout]
    assert not m["svg"], f"SVG text outside its picture:\n  {_show(m['svg'])}"
    legend = m["legend"]
    clashes = [(a["text"], b["text"]) for i, a in enumerate(legend) for b in legend[i + 1:]
               if overlaps(a["box"], b["box"])]
    assert not clashes, f"legend entries overlap: {clashes}"
    into_bar = [r for r in m["rows"] if any(overlaps(r["box"], p) for p in m["pages"])]
    assert not into_bar, f"row labels run into the pages: {into_bar}"
    wide = [n for n in m["nums"] if n["box"][0] < n["page"][0] - EPS
            or n["box"][1] > n["page"][1] + EPS]
    assert not wide, f"layer numbers wider than their page: {wide}"


@needs_chromium
@params
def test_a_phone_gets_the_narrow_pictures_at_their_own_size(measured, layout: str) -> None:
    """At 390 px the block and the chart are the ones drawn for a phone, shown at (at
    least nearly) their own size, so their 11-12 px text reads as such; a laptop gets
    the wide ones."""
    phone = measured[PHONE, layout]["pictures"]
    # (a separate plan's report has a block picture per pool, a pooled one a second chart)
    assert {p["cls"] for p in phone} == {"block narrow", "chart narrow"}
    assert all(p["scale"] >= 0.9 for p in phone), phone
    laptop = measured[1280, layout]["pictures"]
    assert {p["cls"] for p in laptop} == {"block wide", "chart wide"}
    assert len(phone) == len(laptop)


@needs_chromium
@params
def test_layer_names_are_on_screen_at_phone_width(measured, layout: str) -> None:
    """The groups table is one card per group at 390 px: every layer name is inside
    the viewport (nothing scrolls, no box leaves its parent: test_nothing_overflows)."""
    m = measured[PHONE, layout]
    assert m["members"] and all(b[0] >= 0 and b[1] <= PHONE for b in m["members"]), \
        m["members"]


@needs_chromium
def test_screenshots_at_every_width(tmp_path: Path) -> None:
    """Full-page screenshots of the hybrid reports at 390, 800 and 1280 px: each as
    wide as its viewport (the page never scrolls sideways). ``KVSPEC_SCREENSHOTS=DIR``
    keeps them there to look at; ``KVSPEC_REGEN=1`` rewrites the phone screenshot in
    docs/screenshots."""
    import base64

    from kvspec.reports.explain import explain, render

    keep = Path(os.environ["KVSPEC_SCREENSHOTS"]) if os.environ.get("KVSPEC_SCREENSHOTS") \
        else tmp_path
    keep.mkdir(parents=True, exist_ok=True)
    browser = DevTools(CHROMIUM, tmp_path / "profile", tmp_path / "chromium.log")  # type: ignore[arg-type]
    try:
        target = browser.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        sid = browser.call("Target.attachToTarget", {"targetId": target, "flatten": True}
                           )["sessionId"]
        browser.call("Page.enable", session=sid)
        for name in ("gemma-2-9b-it", "example-glm5-next-drafter"):
            page = tmp_path / f"{name}.html"
            page.write_text(render(explain(f"layouts/{name}.yaml"), "html"), "utf-8")
            for width in WIDTHS:
                browser.call("Emulation.setDeviceMetricsOverride", {
                    "width": width, "height": 900, "deviceScaleFactor": 1,
                    "mobile": width == PHONE}, session=sid)
                browser.call("Page.navigate", {"url": page.as_uri()}, session=sid)
                browser.wait("Page.loadEventFired", sid)
                size = browser.call("Page.getLayoutMetrics", session=sid)["cssContentSize"]
                assert size["width"] <= width, (name, width, size)
                shot = browser.call("Page.captureScreenshot", {
                    "format": "png", "captureBeyondViewport": True, "clip": {
                        "x": 0, "y": 0, "width": width, "height": size["height"], "scale": 1}},
                    session=sid)
                png = base64.b64decode(shot["data"])
                assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
                (keep / f"{name}-{width}.png").write_bytes(png)
                if REGEN and name == "gemma-2-9b-it" and width == PHONE:
                    PHONE_SHOT.write_bytes(png)
    finally:
        browser.close()


def test_the_committed_phone_screenshot_exists() -> None:
    data = PHONE_SHOT.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(data[16:20], "big") == PHONE


# ---------------------------------------------------------------------------
# the ruler's geometry, without a browser
# ---------------------------------------------------------------------------


@params
def test_ruler_ticks_keep_their_gap(layout: str) -> None:
    """Each ruler label, as wide as :func:`text_width` says (rounded up over the
    usual sans-serif fonts), keeps ``TICK_GAP`` from the next; 0 and the block's
    size are always labelled."""
    from kvspec.reports.explain import explain
    from kvspec.reports.explain.pictures import TICK_GAP, block_picture
    from kvspec.reports.format import short_bytes

    rep = explain(f"layouts/{layout}.yaml")
    ticks = block_picture(rep)["ticks"]
    assert ticks[0]["text"] == "0" and ticks[-1]["text"] == short_bytes(rep.block.bytes_per_block)
    for a, b in itertools.pairwise(ticks):
        assert b["left"] - a["right"] >= TICK_GAP, (a, b)


def test_qwen3_ruler_drops_the_label_that_crowds_the_end() -> None:
    """The qwen3-8b ruler once drew 2.06 MiB and 2.25 MiB on top of each other."""
    from kvspec.reports.explain import explain
    from kvspec.reports.explain.pictures import block_picture

    texts = [t["text"] for t in block_picture(explain("layouts/qwen3-8b.yaml"))["ticks"]]
    assert texts[-1] == "2.25 MiB" and "2.06 MiB" not in texts


# ---------------------------------------------------------------------------
# the text report's 80 columns
# ---------------------------------------------------------------------------


@params
def test_text_report_fits_80_columns_but_names(layout: str) -> None:
    from kvspec.reports.explain import explain, render

    rep = explain(f"layouts/{layout}.yaml")
    lines = render(rep, "text").splitlines()
    # the `layers:` list: the group's id (on its first name), then the name
    names = {f"    {gid:<3}{n}" for g in rep.groups
             for i, n in enumerate(g.layers) for gid in [g.id if i == 0 else ""]}
    wide = [line for line in lines[1:] if len(line) > 80 and line not in names]
    assert wide == [], f"lines over 80 columns that carry no name: {wide}"
