"""Rendering: the Jinja2 environment over ``kvspec/reports/templates`` and its
filters (every byte formatter and table from :mod:`kvspec.reports.format`).

>>> environment().from_string("{{ 16896 | sbytes }} {{ [[1, 2]] | md_table(['a', 'b']) }}").render()
'16.5 KiB | a | b |\\n| --- | --- |\\n| 1 | 2 |'
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from typing import Any

from kvspec._version import __version__
from kvspec.reports.explain.pictures import ascii_block, block_picture, capacity_chart
from kvspec.reports.explain.pooling import pooling_chart
from kvspec.reports.explain.report import GroupRow, Report
from kvspec.reports.format import (
    count,
    human_bytes,
    md_cell,
    md_code,
    md_html,
    md_table,
    md_text,
    pct,
    short_bytes,
    table,
    wrap,
)

__all__ = ["FORMATS", "arrow", "breakable", "environment", "group_padding", "pages_text",
           "render", "wrap_at"]

FORMATS = ("text", "md", "html")


def pages_text(pages: tuple[tuple[int, int], ...]) -> str:
    """``328 KiB/16.5 KiB``: a group's distinct pages."""
    return "/".join(short_bytes(p) for p, _ in pages) or "-"


def group_padding(g: GroupRow, per_page: str = "/page") -> str:
    """``1 slot, +240 KiB/page``: a group's padding slots and page padding."""
    parts = []
    if g.padding_slots:
        parts.append(f"{g.padding_slots} slot" + ("s" if g.padding_slots > 1 else ""))
    pads = sorted({p - u for p, u in g.pages if p != u}, reverse=True)
    if pads:
        parts.append("/".join(f"+{short_bytes(x)}" for x in pads) + per_page)
    return ", ".join(parts) or "-"


def breakable(name: str) -> Any:
    """A layer name as HTML that a browser may wrap only between its parts: after
    a dot outside braces and after a comma inside them, so a range such as
    ``{0..28 step 7}`` stays whole (its spaces do not break).

    >>> str(breakable("m.layers.{0..8 step 4,9}.attn"))
    'm.<wbr>layers.<wbr>{0..8&nbsp;step&nbsp;4,<wbr>9}.<wbr>attn'
    """
    # deferred: Jinja2 (markupsafe), only when a report is rendered
    from markupsafe import Markup, escape

    out, depth = [], 0
    for ch in name:
        depth += (ch == "{") - (ch == "}")
        if depth and ch == " ":
            out.append("&nbsp;")
            continue
        out.append(str(escape(ch)))
        if (ch == "." and not depth) or (ch == "," and depth):
            out.append("<wbr>")
    return Markup("".join(out))


def wrap_at(text: str, sep: str) -> Any:
    """``text`` as HTML that wraps only after each ``sep``, never inside a part.

    >>> str(wrap_at("328 KiB/16.5 KiB", "/"))
    '328&nbsp;KiB/<wbr>16.5&nbsp;KiB'
    """
    # deferred: Jinja2 (markupsafe), only when a report is rendered
    from markupsafe import Markup, escape

    joint = str(escape(sep)) + ("" if sep.endswith(" ") else "<wbr>")
    return Markup(joint.join(str(escape(p)).replace(" ", "&nbsp;") for p in text.split(sep)))


def arrow(change: Any) -> str:
    """``64 KiB -> 32 KiB (-50.0%)``: a diff's change, old to new."""
    ratio = getattr(change, "ratio", None)
    return f"{change.a} -> {change.b}" + (f" ({ratio:+.1%})" if ratio is not None else "")


@lru_cache(maxsize=1)
def environment():
    """The Jinja2 environment over ``kvspec/reports/templates``: HTML
    autoescaped, undefined variables are errors."""
    # deferred: Jinja2 (markupsafe), only when a report is rendered
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("kvspec.reports", "templates"),
        autoescape=jinja2.select_autoescape(enabled_extensions=("html.j2",),
                                            default_for_string=False, default=False),
        undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
        keep_trailing_newline=True, extensions=["jinja2.ext.do"])
    env.filters.update(bytes=human_bytes, sbytes=short_bytes, pct=pct, table=table,
                       md_table=md_table, code=md_code, md_text=md_text, md_cell=md_cell,
                       md_html=md_html,
                       wrap=wrap, pages=pages_text, padding=group_padding,
                       num=lambda n: f"{n:,}", count=count, arrow=arrow,
                       breakable=breakable, wrap_at=wrap_at)
    return env


#: The width (px) of the narrow pictures: a 390 px phone less the page's margins.
NARROW = 340


def render(report: Report, fmt: str = "text") -> str:
    """The report as ``text`` (for an 80-column terminal: only the title and layer
    names may run longer), ``md`` or self-contained ``html``."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}")
    if report.pool_reports:
        return _pooled(report, fmt)
    return _render_one(report, fmt)


#: The heading of one pool's report in a separate plan's, per format.
_POOL_HEAD = {"text": "POOL {name} ({share:.1%} of the budget)\n{rule}\n\n",
              "md": "### Pool `{name}` ({share:.1%} of the budget)\n\n",
              "html": '<h2 class="pool">Pool {name} ({share:.1%} of the budget)</h2>\n'}


def _pooled(report: Report, fmt: str) -> str:
    """A separate plan's report: one title, a section per pool (its engine, groups,
    block, capacity and waste), then the pooling section; HTML: one page, with one
    header and one footer."""
    env = environment()
    assert report.pooling is not None
    section = env.get_template(f"pooling.{fmt}.j2").render(
        p=report.pooling, pchart=pooling_chart(report.pooling),
        pchart_narrow=pooling_chart(report.pooling, NARROW, 250))
    parts = []
    for name, share, sub in report.pool_reports:
        head = _POOL_HEAD[fmt].format(name=name, share=share, rule="=" * 40)
        text = _render_one(sub, fmt, part=True)
        if fmt == "html":
            text = text.split("<main>", 1)[1].rsplit("</main>", 1)[0]
        parts.append(head + text)
    # the title (and in HTML the header and footer) once, from the whole report
    page = _render_one(dataclasses.replace(report, pool_reports=(), pooling=None), fmt)
    if fmt != "html":
        marker = {"text": "\nENGINE\n", "md": "\n"}[fmt]
        title = page.split(marker, 1)[0].rstrip("\n") if fmt == "text" else \
            "\n".join(page.split("\n")[:3])
        return title + "\n\n" + "\n".join(parts) + "\n" + section
    top, rest = page.split("<main>", 1)
    header = rest.split("</header>", 1)[0] + "</header>\n"
    footer = rest[rest.index("<footer>"):].rsplit("</main>", 1)[0]
    tail = rest.rsplit("</main>", 1)[1]
    return (top + "<main>" + header + "\n".join(parts) + section + footer + "</main>"
            + tail)


def _render_one(report: Report, fmt: str, part: bool = False) -> str:
    """One report; ``part``: a section of a larger one (no title, header or footer)."""
    ctx: dict[str, Any] = {"r": report, "version": __version__, "ascii": ascii_block(report),
                           "part": part}
    if report.pooling is not None:
        ctx["pchart"] = pooling_chart(report.pooling)
        ctx["pchart_narrow"] = pooling_chart(report.pooling, NARROW, 250)
    if fmt == "html":
        ctx["block"] = block_picture(report)
        ctx["chart"] = capacity_chart(report)
        # a phone's: drawn at its own width, not the laptop's scaled down (CSS picks one)
        ctx["block_narrow"] = block_picture(report, NARROW, narrow=True, prefix="n-")
        ctx["chart_narrow"] = capacity_chart(report, NARROW, 250)
    return environment().get_template(f"explain.{fmt}.j2").render(**ctx)
