"""Layer names: folding many into a few readable ranges.

>>> compact_layers([f"model.layers.{i}.attn" for i in range(0, 42, 2)])
('model.layers.{0..40 step 2}.attn',)
>>> compact_layers(["a.1.k", "a.2.k", "b"])
('a.{1,2}.k', 'b')
"""

from __future__ import annotations

import re
from collections.abc import Sequence

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
    """Layer names with their first number folded into ranges."""
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
    for item in order:
        if isinstance(item, str):
            out.append(item)
            continue
        head, tail = item
        nums = sorted(set(families[item]))
        out.append(f"{head}{nums[0]}{tail}" if len(nums) == 1
                   else f"{head}{{{_runs(nums)}}}{tail}")
    return tuple(out)


def layers_brief(names: Sequence[str]) -> str:
    """``model.layers.{0..40 step 2}.self_attn.attn`` rather than 21 names."""
    return ", ".join(compact_layers(names))
