"""Fitting a linear step-time model to measured steps (docs/latency.md#the-fit).

Each sample is one measured step: its four terms
(:data:`~kvspec.model.steptime.TERMS`) and the seconds it took. The fit is
non-negative least squares (Lawson and Hanson's active set) over the fixed cost and
the four per-unit costs:

* non-negative, because each term is work the engine does: an unconstrained fit
  trades two nearly collinear terms against each other (context tokens and
  prefill pairs both grow with the context) with opposite signs, which fits the
  grid and predicts negative costs outside it;
* in pure Python: five unknowns over a few hundred samples is a few milliseconds,
  and keeps numpy out of kvspec's core (the compiler and the simulator never need
  it). Columns are scaled to 1 before solving (the terms span twelve orders of
  magnitude); each subproblem is solved by modified Gram-Schmidt QR, not the normal
  equations, whose condition number is the square of the columns'.

>>> truth = LinearStepTime(0.005, 2e-5, 1e-4, 1e-8, 1e-11)
>>> shapes = [(0, d, d * c, 0) for d in (1, 8, 64) for c in (100, 2000)] + [
...     (p, 0, p + c, p * c + p * (p + 1) // 2) for p in (128, 2048) for c in (0, 4096)]
>>> fit = fit_linear([(*s, truth.seconds(*s)) for s in shapes])
>>> [round(a / b, 6) for a, b in zip(fit.model.coefficients, truth.coefficients)]
[1.0, 1.0, 1.0, 1.0, 1.0]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from kvspec.model.steptime import TERMS, LinearStepTime

__all__ = ["Fit", "Sample", "fit_linear", "nnls"]

#: One measured step: its four terms (:data:`TERMS`' order) and its seconds.
Sample = tuple[int, int, int, int, float]


@dataclass(frozen=True)
class Fit:
    """A fitted model, the range of each term it was fitted over, and its residuals
    (measured minus predicted, s)."""

    model: LinearStepTime
    bounds: tuple[tuple[int, int], ...]
    residuals: tuple[float, ...]
    samples: int

    @property
    def rms(self) -> float:
        return math.sqrt(math.fsum(r * r for r in self.residuals) / len(self.residuals))

    @property
    def max_abs(self) -> float:
        return max(abs(r) for r in self.residuals)

    def relative(self, measured: Sequence[float]) -> float:
        """The mean of |residual| / measured over the samples."""
        return math.fsum(abs(r) / m for r, m in zip(self.residuals, measured, strict=True)
                         if m > 0) / len(measured)


def fit_linear(samples: Sequence[Sample]) -> Fit:
    """The linear model of ``samples`` (at least as many as there are coefficients)."""
    if len(samples) < len(TERMS) + 1:
        raise ValueError(f"{len(samples)} samples fit no model of {len(TERMS) + 1} "
                         "coefficients")
    rows = [[1.0, *(float(x) for x in s[:4])] for s in samples]
    y = [float(s[4]) for s in samples]
    fixed, prefill, decode, context, pairs = nnls(rows, y)
    bounds = tuple((min(int(s[k]) for s in samples), max(int(s[k]) for s in samples))
                   for k in range(len(TERMS)))
    model = LinearStepTime(fixed, prefill, decode, context, pairs, bounds=bounds)
    residuals = tuple(yi - model.seconds(*(int(v) for v in s[:4])) if (s[0] or s[1])
                      else yi for s, yi in zip(samples, y, strict=True))
    return Fit(model, bounds, residuals, len(samples))


def nnls(rows: Sequence[Sequence[float]], y: Sequence[float], tol: float = 1e-12
         ) -> list[float]:
    """``x >= 0`` minimising ``|A x - y|`` (``A``'s rows ``rows``), by Lawson-Hanson."""
    n = len(rows[0])
    scale = [max((abs(r[j]) for r in rows), default=0.0) or 1.0 for j in range(n)]
    a = [[r[j] / scale[j] for j in range(n)] for r in rows]
    x = [0.0] * n
    passive: list[int] = []
    for _ in range(3 * n):
        w = _gradient(a, y, x)
        free = [j for j in range(n) if j not in passive and w[j] > tol]
        if not free:
            break
        passive.append(max(free, key=lambda j: w[j]))
        while True:
            z = [0.0] * n
            for j, v in zip(passive, _lstsq(a, y, passive), strict=True):
                z[j] = v
            if all(z[j] > 0 for j in passive):
                x = z
                break
            alpha = min(x[j] / (x[j] - z[j]) for j in passive if z[j] <= 0)
            x = [xi + alpha * (zi - xi) for xi, zi in zip(x, z, strict=True)]
            passive = [j for j in passive if x[j] > tol]
            for j in range(n):
                if j not in passive:
                    x[j] = 0.0
    return [xi / s for xi, s in zip(x, scale, strict=True)]


def _gradient(a: list[list[float]], y: Sequence[float], x: list[float]) -> list[float]:
    """``A^T (y - A x)``."""
    r = [yi - math.fsum(aij * xj for aij, xj in zip(row, x, strict=True))
         for row, yi in zip(a, y, strict=True)]
    return [math.fsum(row[j] * ri for row, ri in zip(a, r, strict=True))
            for j in range(len(x))]


def _lstsq(a: list[list[float]], y: Sequence[float], columns: list[int]) -> list[float]:
    """Least squares over ``columns`` of ``a``, by modified Gram-Schmidt QR."""
    q = [[row[j] for row in a] for j in columns]  # column vectors
    k = len(q)
    r = [[0.0] * k for _ in range(k)]
    for i in range(k):
        norm = math.sqrt(math.fsum(v * v for v in q[i]))
        r[i][i] = norm
        if norm == 0:
            continue
        q[i] = [v / norm for v in q[i]]
        for j in range(i + 1, k):
            r[i][j] = math.fsum(u * v for u, v in zip(q[i], q[j], strict=True))
            q[j] = [v - r[i][j] * u for u, v in zip(q[i], q[j], strict=True)]
    qty = [math.fsum(u * v for u, v in zip(q[i], y, strict=True)) for i in range(k)]
    z = [0.0] * k
    for i in reversed(range(k)):
        if r[i][i] == 0:
            continue  # a column of zeros (a term never measured): no cost
        z[i] = (qty[i] - math.fsum(r[i][j] * z[j] for j in range(i + 1, k))) / r[i][i]
    return z
