"""Affine forms ``a * num_blocks + b``: byte quantities that scale with the pool.

An artifact is compiled once and loaded under any memory budget, so every
offset, stride and size that depends on the number of blocks is kept as an
affine form and evaluated at load time.

>>> page = 65536
>>> stride = Affine(page)          # a layer region of num_blocks pages
>>> (stride * 3 + 128).at(10)
1966208
>>> str(stride * 3 + 128)
'196608*N + 128'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Affine:
    """``a * N + b`` for the pool's block count ``N >= 1``."""

    a: int = 0
    b: int = 0

    @staticmethod
    def of(value: int | Affine) -> Affine:
        return value if isinstance(value, Affine) else Affine(0, int(value))

    def at(self, num_blocks: int) -> int:
        return self.a * num_blocks + self.b

    @property
    def is_constant(self) -> bool:
        return self.a == 0

    def __add__(self, other: int | Affine) -> Affine:
        o = Affine.of(other)
        return Affine(self.a + o.a, self.b + o.b)

    __radd__ = __add__

    def __sub__(self, other: int | Affine) -> Affine:
        o = Affine.of(other)
        return Affine(self.a - o.a, self.b - o.b)

    def __mul__(self, k: int | Affine) -> Affine:
        if isinstance(k, Affine):
            if k.a and self.a:
                raise ValueError("a product of two block-dependent quantities is not affine")
            if k.a:
                return k * self.b
            k = k.b
        return Affine(self.a * k, self.b * k)

    __rmul__ = __mul__

    def exact_div(self, k: int) -> Affine:
        """Divide by ``k``; both coefficients must divide exactly."""
        if self.a % k or self.b % k:
            raise ValueError(f"{self} is not divisible by {k} for every block count")
        return Affine(self.a // k, self.b // k)

    def dominates(self, other: Affine) -> bool:
        """``self >= other`` for every ``N >= 1``."""
        return self.a >= other.a and self.a + self.b >= other.a + other.b

    @staticmethod
    def max(x: int | Affine, y: int | Affine) -> Affine:
        ax, ay = Affine.of(x), Affine.of(y)
        if ax.dominates(ay):
            return ax
        if ay.dominates(ax):
            return ay
        raise ValueError(f"neither {ax} nor {ay} is the larger for every block count")

    def to_json(self) -> Any:
        """A plain int when constant, else ``{"per_block": a, "fixed": b}``."""
        if self.a == 0:
            return self.b
        return {"per_block": self.a, "fixed": self.b}

    @staticmethod
    def from_json(value: Any) -> Affine:
        if isinstance(value, dict):
            return Affine(int(value["per_block"]), int(value["fixed"]))
        return Affine(0, int(value))

    def __str__(self) -> str:
        if self.a == 0:
            return str(self.b)
        head = "N" if self.a == 1 else f"{self.a}*N"
        if self.b == 0:
            return head
        return f"{head} + {self.b}" if self.b > 0 else f"{head} - {-self.b}"
