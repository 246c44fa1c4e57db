"""``kvspec sweep``: which deployment serves a workload with the fewest GPUs
(docs/sweep.md).

* :mod:`.grid` -- the grid file: its schema, reading it with positioned errors;
* :mod:`.constraints` -- the constraints' expression language (no ``eval``);
* :mod:`.points` -- from a grid to its points, each with its source, checked by
  the compiler before anything runs;
* :mod:`.evaluate` -- one point compiled and simulated: its row;
* :mod:`.execute` -- a local process pool or Ray, and ``--ray``'s addresses;
* :mod:`.results` -- the results file: rows read, checked, appended, resumable;
* :mod:`.report` -- the best point per workload, the Pareto front, CSV and HTML.
"""

from kvspec.sweep.grid import GridFile, parse_grid, read_grid
from kvspec.sweep.points import Point, Sweep, plan_sweep

__all__ = ["GridFile", "Point", "Sweep", "parse_grid", "plan_sweep", "read_grid"]
