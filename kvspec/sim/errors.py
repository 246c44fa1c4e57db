"""The simulator's error, apart from :mod:`kvspec.sim.engine`, which may be compiled
(mypyc, ``kvspec/_native.py``): an exception class stays an ordinary Python class
here, with the fields every :class:`~kvspec.errors.KvspecError` carries."""

from __future__ import annotations

from kvspec.errors import KvspecError

__all__ = ["SimulationError"]


class SimulationError(KvspecError):
    """A trace the pools cannot serve."""
