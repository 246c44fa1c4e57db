"""The one set of formatters every report uses: bytes, tables, layer names.

>>> human_bytes(2097152), short_bytes(16896), exact_size(42949672960)
('2.00 MiB', '16.5 KiB', '40GiB')
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

_UNITS = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


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


def exact_size(n: int) -> str | int:
    """A size as a source writes it: ``40GiB`` when exact in a unit, else bytes."""
    for unit, size in _UNITS:
        if n and n % size == 0:
            return f"{n // size}{unit}"
    return n


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


def md_table(rows: Sequence[Sequence[Any]], headers: Sequence[str], right: str = "") -> str:
    def esc(c: Any) -> str:
        return str(c).replace("|", "\\|")

    aligns = ["---:" if i < len(right) and right[i] == "r" else "---"
              for i in range(len(headers))]
    out = ["| " + " | ".join(map(esc, headers)) + " |", "| " + " | ".join(aligns) + " |"]
    out += ["| " + " | ".join(map(esc, r)) + " |" for r in rows]
    return "\n".join(out)


def wrap(text: str, width: int = 78, indent: str = "  ") -> str:
    return textwrap.fill(text, width=width, initial_indent=indent,
                         subsequent_indent=indent + "  ", break_on_hyphens=False)


_NUMBER = re.compile(r"^(.*?)(\d+)(.*)$")


def _runs(numbers: list[int]) -> str:
    """``[0, 2, 4, 6, 9]`` -> ``0..6 step 2,9``; ``[0..31]`` -> ``0..31``."""
    out, i = [], 0
    while i < len(numbers):
        j = i + 1
        if j < len(numbers):
            step = numbers[j] - numbers[i]
            while j + 1 < len(numbers) and numbers[j + 1] - numbers[j] == step:
                j += 1
            if j - i >= 2 and step > 0:
                out.append(f"{numbers[i]}..{numbers[j]}" + (f" step {step}" if step > 1 else ""))
                i = j + 1
                continue
        out.append(str(numbers[i]))
        i += 1
    return ",".join(out)


def compact_layers(names: Sequence[str]) -> tuple[str, ...]:
    """Layer names with their first number folded into ranges.

    >>> compact_layers(["a.1.k", "a.2.k", "b"])
    ('a.{1,2}.k', 'b')
    """
    families: dict[tuple[str, str], list[int]] = {}
    order: list[tuple[str, str] | str] = []
    for name in names:
        m = _NUMBER.match(name)
        if m is None:
            order.append(name)
            continue
        key = (m.group(1), m.group(3))
        if key not in families:
            families[key] = []
            order.append(key)
        families[key].append(int(m.group(2)))
    out = []
    for key in order:
        if isinstance(key, str):
            out.append(key)
            continue
        nums = sorted(set(families[key]))
        out.append(f"{key[0]}{nums[0]}{key[1]}" if len(nums) == 1
                   else f"{key[0]}{{{_runs(nums)}}}{key[1]}")
    return tuple(out)


def layers_brief(names: Sequence[str]) -> str:
    """``model.layers.{0..40 step 2}.self_attn.attn`` rather than 21 names."""
    return ", ".join(compact_layers(names))
