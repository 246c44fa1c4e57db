"""The one set of formatters every report uses: bytes, tables, layer names.

>>> human_bytes(2097152), short_bytes(16896)
('2.00 MiB', '16.5 KiB')
>>> print(table([["0", "full", "32"]], ["group", "kind", "layers"]))
group  kind  layers
-----  ----  ------
0      full      32
>>> compact_layers([f"model.layers.{i}.attn" for i in range(0, 42, 2)])
('model.layers.{0..40 step 2}.attn',)
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Sequence
from typing import Any

from kvspec.model.names import compact_layers, layers_brief

__all__ = ["compact_layers", "count", "human_bytes", "layers_brief", "md_table", "pct",
           "short_bytes", "table", "wrap"]

_UNITS = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def count(n: int, noun: str) -> str:
    """``n`` (with thousands separators) and ``noun``, plural unless ``n`` is 1.

    >>> count(1, "block"), count(2048, "request")
    ('1 block', '2,048 requests')
    """
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def human_bytes(n: float) -> str:
    """Bytes in the largest binary unit that keeps a value >= 1, two decimals."""
    for unit, size in _UNITS:
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def short_bytes(n: float) -> str:
    """:func:`human_bytes` without trailing zeros: ``328 KiB``, ``16.5 KiB``."""
    text = human_bytes(n)
    value, _, unit = text.partition(" ")
    if "." in value:
        value = value.rstrip("0").rstrip(".")
    return f"{value} {unit}"


def pct(x: float) -> str:
    return f"{x:.1%}"


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str], right: str | None = None
          ) -> str:
    """Aligned text columns under a dashed rule.

    ``right`` holds ``r`` for each right-aligned column; without it the first
    column and a trailing text column read left to right, numbers align right.
    """
    cells = [[str(c) for c in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    last = len(headers) - 1

    def cell(i: int, c: str, w: int) -> str:
        if right is not None:
            return c.rjust(w) if i < len(right) and right[i] == "r" else c.ljust(w)
        left = i == 0 or (i == last and not c[:1].isdigit())
        return c.ljust(w) if left else c.rjust(w)

    def line(r: list[str]) -> str:
        return "  ".join(cell(i, c, w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()

    out = [line(cells[0]), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in cells[1:]]
    return "\n".join(out)


def md_code(text: Any) -> str:
    """``text`` as one Markdown code span, whatever backticks it holds (its fence
    is one backtick longer than its longest run).

    >>> md_code("model.layers.0.attn"), md_code("a`b"), md_code("`x")
    ('`model.layers.0.attn`', '``a`b``', '`` `x ``')
    """
    s = str(text).replace("\n", " ")
    fence = "`" * (max(map(len, re.findall("`+", s)), default=0) + 1)
    pad = " " if s[:1] == "`" or s[-1:] == "`" else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def md_html(text: Any) -> str:
    """``text`` with HTML escaped, on one line: kvspec's own prose (a warning,
    whose names come quoted), where Markdown markup may stay.

    >>> print(md_html("layer '<b>' pads"))
    layer '&lt;b&gt;' pads
    """
    s = str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return s.replace("\n", " ")


def md_text(text: Any) -> str:
    """``text`` as Markdown that shows it as written: HTML and the characters
    Markdown reads as markup escaped.

    >>> print(md_text("<img src=x> *a* [b](c)"))
    &lt;img src=x&gt; \\*a\\* \\[b\\](c)
    """
    return re.sub(r"([\\`*_\[\]|#])", r"\\\1", md_html(text))


def md_cell(text: Any) -> str:
    """``text`` in a Markdown table cell: a ``|`` would end the cell."""
    return str(text).replace("|", "\\|")


def md_table(rows: Sequence[Sequence[Any]], headers: Sequence[str], right: str = "") -> str:
    esc = md_cell

    aligns = ["---:" if i < len(right) and right[i] == "r" else "---"
              for i in range(len(headers))]
    out = ["| " + " | ".join(map(esc, headers)) + " |", "| " + " | ".join(aligns) + " |"]
    out += ["| " + " | ".join(map(esc, r)) + " |" for r in rows]
    return "\n".join(out)


def wrap(text: str, width: int = 78, indent: str = "  ") -> str:
    return textwrap.fill(text, width=width, initial_indent=indent,
                         subsequent_indent=indent + "  ", break_on_hyphens=False)
